// A copy whose stores bypass the cache (internal): for memory another core reads next.
#pragma once

#include <cstddef>

namespace tutti::detail {

// Copies n bytes from src to dst (not overlapping) as memcpy does, but with non-temporal stores
// where the CPU has them (x86-64), and orders them before every later store (sfence): a flag
// stored after it publishes the bytes. Such stores do not wait for each line's ownership, which
// a core writing lines that a peer core has read must otherwise wait for, for every line, and
// for ~270 ns where the two cores lie far apart. The bytes go to memory rather than staying in
// this core's cache, so the reader takes them from there: faster where the cores are far apart,
// slower where they share a cache (shm_publish.h measures which). Under sanitizers, under
// kStreamCopyMin bytes, and on other CPUs: memcpy.
void stream_copy(void* dst, const void* src, size_t n) noexcept;

constexpr size_t kStreamCopyMin = 4096;

}  // namespace tutti::detail
