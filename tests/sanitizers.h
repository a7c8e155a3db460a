// Which sanitizer the tests were built with (scripts/sanitize.sh), for the few checks that
// measure what a sanitizer itself changes.
#pragma once

#include <cstdlib>
#include <cstring>

namespace tutti::testing {

// The sanitizer run (scripts/sanitize.sh sets TUTTI_TEST_LIGHT=1): the few tests that repeat one
// path many times (the 1000-cycle store tests, the collective matrix's large case per dtype) take
// fewer repetitions there; the plain run takes them all. Nothing is skipped outright.
inline bool light_test_run() {
  const char* v = std::getenv("TUTTI_TEST_LIGHT");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// AddressSanitizer keeps freed memory in quarantine, so resident memory grows whether or not
// anything leaks. Tests that bound RSS growth leave the bound to LeakSanitizer there, which
// fails the process at exit for any leak at all.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

}  // namespace tutti::testing
