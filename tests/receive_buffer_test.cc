// The direct transport's receive buffers (src/util/shared_memory.cc): a large one given back is
// kept for the next of its length, with its pages already touched, and what is kept stays under
// its cap (the oldest unmapped first).
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "util/shared_memory.h"

namespace tutti::testing {
namespace {

using detail::receive_buffer;

// Whether [p, p + bytes) is mapped in this process (mincore fails with ENOMEM where it is not).
bool mapped(void* p, size_t bytes) {
  std::vector<unsigned char> pages((bytes + 4095) / 4096);
  return ::mincore(p, bytes, pages.data()) == 0 || errno != ENOMEM;
}

// Each test uses a length of its own: buffers another test kept (--gtest_repeat, shuffle) never
// answer its takes.
TEST(ReceiveBuffers, ALargeOneGivenBackIsReusedForTheSameLength) {
  constexpr size_t kBytes = size_t{10} << 20;
  void* first = nullptr;
  {
    auto b = receive_buffer(kBytes);
    first = b.get();
    std::memset(first, 7, kBytes);
  }
  EXPECT_TRUE(mapped(first, kBytes)) << "given back, it is kept mapped";
  auto again = receive_buffer(kBytes - 100);  // the same length once rounded to 2 MiB
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(static_cast<unsigned char*>(again.get())[kBytes - 1], 7) << "its pages, as left";
  auto other = receive_buffer(kBytes);  // none of that length is kept now: a new one
  EXPECT_NE(other.get(), first);
  // Small buffers come from the heap and are not kept.
  auto small = receive_buffer(1 << 20);
  EXPECT_NE(small.get(), nullptr);
}

TEST(ReceiveBuffers, WhatIsKeptStaysUnderItsCapOldestFirst) {
  constexpr size_t kBytes = size_t{8} << 20;
  constexpr int kCount = 40;  // 320 MiB given back against a 256 MiB cap
  ASSERT_EQ(std::getenv("TUTTI_TRANSFER_KEEP_MB"), nullptr) << "the cap below is the default";
  std::vector<void*> at;
  {
    std::vector<std::shared_ptr<void>> held;
    for (int i = 0; i < kCount; ++i) {
      held.push_back(receive_buffer(kBytes));
      at.push_back(held.back().get());
    }
    for (auto& b : held) b.reset();  // given back in order: the first ones given go first
  }
  const size_t kept = (size_t{256} << 20) / kBytes;  // 32
  for (int i = 0; i < kCount; ++i) {
    const bool expect_kept = i >= kCount - static_cast<int>(kept);
    EXPECT_EQ(mapped(at[i], kBytes), expect_kept) << "buffer " << i << " of " << kCount;
  }
}

// One get's buffers (receive_buffers): those under 4 MiB in one allocation, each 64-byte aligned
// and apart from the others, each keeping it alive; larger ones their own, as receive_buffer's.
TEST(ReceiveBuffers, OneGetsSmallBuffersShareOneAllocation) {
  constexpr size_t kLarge = size_t{6} << 20;
  const std::vector<size_t> sizes{200000, 0, kLarge, 1, 4096, 64, 65, (size_t{4} << 20) - 1};
  std::vector<std::shared_ptr<void>> got = detail::receive_buffers(sizes);
  ASSERT_EQ(got.size(), sizes.size());
  uintptr_t lowest = UINTPTR_MAX, highest = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto at = reinterpret_cast<uintptr_t>(got[i].get());
    ASSERT_NE(at, 0u) << "buffer " << i;
    EXPECT_EQ(at % 64, 0u) << "buffer " << i;
    if (sizes[i] == kLarge) {
      EXPECT_EQ(at % (size_t{2} << 20), 0u) << "a large one is receive_buffer's own";
      continue;
    }
    lowest = std::min(lowest, at);
    highest = std::max(highest, at + sizes[i]);
    for (size_t j = 0; j < i; ++j) {
      if (sizes[j] == kLarge) continue;
      const auto other = reinterpret_cast<uintptr_t>(got[j].get());
      EXPECT_TRUE(at + std::max<size_t>(sizes[i], 1) <= other ||
                  other + std::max<size_t>(sizes[j], 1) <= at)
          << "buffers " << j << " and " << i << " overlap";
    }
  }
  // The small ones lie in one span no longer than their sizes rounded up to 64 bytes each.
  size_t rounded = 0;
  for (size_t b : sizes) rounded += b == kLarge ? 0 : (std::max<size_t>(b, 1) + 63) / 64 * 64;
  EXPECT_LE(highest - lowest, rounded);
  // Each keeps the allocation: the seven small ones share one owner, and once the others went the
  // last one is its only holder, still whole.
  EXPECT_EQ(got.back().use_count(), 7);
  auto* last = static_cast<unsigned char*>(got.back().get());
  for (size_t i = 0; i + 1 < got.size(); ++i) got[i].reset();
  EXPECT_EQ(got.back().use_count(), 1);
  std::memset(last, 5, sizes.back());
  EXPECT_EQ(last[sizes.back() - 1], 5);
  // A single small one is receive_buffer's own (no allocation to share).
  auto one = detail::receive_buffers({100});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_NE(one[0].get(), nullptr);
}

}  // namespace
}  // namespace tutti::testing
