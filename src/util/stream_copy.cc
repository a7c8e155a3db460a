#include "util/stream_copy.h"

#include <cstdint>
#include <cstring>

// Not under the sanitizers: they see memcpy's accesses, not those of these intrinsics.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TUTTI_STREAM_STORES 1
#include <immintrin.h>
#endif

namespace tutti::detail {

void stream_copy(void* dst, const void* src, size_t n) noexcept {
#if defined(TUTTI_STREAM_STORES)
  if (n >= kStreamCopyMin) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    // Ordinary stores up to dst's next cache line, then whole lines of 16-byte streaming stores
    // (movntdq needs them aligned; the loads need not be), then the tail.
    const size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (size_t lines = n / 64; lines > 0; --lines, d += 64, s += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    }
    std::memcpy(d, s, n % 64);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace tutti::detail
