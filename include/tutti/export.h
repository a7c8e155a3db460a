// Symbol visibility for tutti's shared libraries.
//
// The libraries are built with hidden visibility; everything a user or a backend plugin may
// name is marked TUTTI_API so that it is exported, and so that exceptions such as tutti::Error
// keep one type identity across shared-library boundaries.
#pragma once

#if defined(_WIN32)
#define TUTTI_API
#else
#define TUTTI_API __attribute__((visibility("default")))
#endif
