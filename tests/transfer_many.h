// ref.many of tests/transfer_worker.cc's owner, as both sides compute it: an object of many
// small tensors, most in ordinary memory (read across processes) and some views of the owner's
// arena (floats of value i * 0.5, kArena of them), one overlapping the one before it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::many {

constexpr int kManyHeap = 400;
constexpr int kManyViews = 200;
constexpr int64_t kManyView = 1000;  // floats per view

// Bytes of ordinary tensor i: 0 for every 7th, else 14-38 KB (8.3 MiB in all: the copy's
// threads share them).
inline size_t many_heap_size(int i) {
  return i % 7 == 3 ? 0 : 14000 + static_cast<size_t>(i) * 331 % 24000 + i % 5;
}
// Not periodic within a tensor (a piece copied to another place in its tensor shows), and unlike
// from tensor to tensor.
inline uint8_t many_byte(int i, size_t k) {
  return static_cast<uint8_t>(
      (static_cast<uint32_t>(k) * 0x9E3779B1u + static_cast<uint32_t>(i) * 0x85EBCA77u) >> 24);
}
// The first float of view j: 3000 apart, the last view half over the one before it.
inline int64_t many_view_first(int j) {
  return j == kManyViews - 1 ? (j - 1) * 3000 + kManyView / 2 : j * 3000;
}

}  // namespace tutti::many
