// Which sanitizer the tests were built with (scripts/sanitize.sh), for the few checks that
// measure what a sanitizer itself changes.
#pragma once

namespace tutti::testing {

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
