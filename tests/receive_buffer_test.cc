// The direct transport's receive buffers (src/util/shared_memory.cc): a large one given back is
// kept for the next of its length, with its pages already touched, and what is kept stays under
// its cap (the oldest unmapped first).
#include <sys/mman.h>

#include <cerrno>
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

}  // namespace
}  // namespace tutti::testing
