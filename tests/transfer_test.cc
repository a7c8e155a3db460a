// The direct transport in one process: two agents (an owner and a consumer) that reach each
// other the way agents in two processes do (a Unix socket, shared memory, cross-memory reads).
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "../backends/cuda_ipc/cuda_ipc_places.h"
#include "../backends/shm/shm_messages.h"
#include "sanitizers.h"
#include "test_util.h"
#include "tutti/tensor_ref.h"
#include "tutti/tensor_transport.h"
#include "tutti/transfer_agent.h"

namespace tutti {
namespace {

// The first byte of a target that a get is copying into, meanwhile: the test's probe of whether
// the copy has begun, a read that races with the copy by design (volatile: read each time; not
// seen by ThreadSanitizer, as the race is the point).
__attribute__((no_sanitize("thread"))) uint8_t first_byte(const void* target) {
  return *static_cast<const volatile uint8_t*>(target);
}

using namespace std::chrono_literals;

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

std::vector<float> as_floats(const TensorView& t) {
  const float* p = static_cast<const float*>(t.data());
  return std::vector<float>(p, p + t.numel());
}

// Mappings of files and memfds (what a leaked block or slot page would add; malloc's arenas come
// and go with threads and are not counted).
std::vector<std::string> mappings() {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> out;
  for (std::string line; std::getline(maps, line);) {
    if (line.find('/') != std::string::npos) out.push_back(line);
  }
  return out;
}

std::string added(const std::vector<std::string>& before, const std::vector<std::string>& after) {
  std::string out;
  for (const auto& line : after) {
    if (std::find(before.begin(), before.end(), line) == before.end()) out += line + "\n";
  }
  return out;
}

size_t open_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

using tutti::testing::expect_error;
using tutti::testing::rss_bytes;

// A child's exit status, or -1 if it has not exited within `limit` (then it is killed).
int exit_status_within(pid_t child, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(5ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class Transfer : public ::testing::Test {
 protected:
  void SetUp() override {
    TransferAgentOptions o;
    o.name = "owner";
    owner = TransferAgent::create(o);
    o.name = "consumer";
    consumer = TransferAgent::create(o);
  }
  std::shared_ptr<TransferAgent> owner, consumer;
};

// ---- references ----

TensorRef sample_ref() {
  AgentIdentity id;
  for (int i = 0; i < 16; ++i) {
    id.uuid[i] = static_cast<uint8_t>(i + 1);
    id.host_key[i] = static_cast<uint8_t>(100 + i);
  }
  id.pid = 4242;
  id.start_time = 987654321;
  id.name = "trainer-0";
  id.tcp_endpoint = "10.0.0.7:31337";
  std::vector<TensorMeta> metas = {{DType::kFloat32, {2, 3}, Device::cpu()},
                                   {DType::kInt64, {}, Device::cpu()},
                                   {DType::kBFloat16, {7}, Device::cuda(1)}};
  return TensorRef(id, ObjectId{77, 5, 9}, "shm", metas, {{1, 64}, {2, 0x7fff0000}, {1, 0}},
                   std::string("\x01\x02\x03", 3), false);
}

TEST(TensorRefFormat, RoundTripsEveryField) {
  const TensorRef a = sample_ref();
  for (const TensorRef& b : {TensorRef::parse(a.serialize()), TensorRef::from_text(a.to_text())}) {
    EXPECT_EQ(b.owner().uuid, a.owner().uuid);
    EXPECT_EQ(b.owner().host_key, a.owner().host_key);
    EXPECT_EQ(b.owner().pid, 4242u);
    EXPECT_EQ(b.owner().start_time, 987654321u);
    EXPECT_EQ(b.owner().name, "trainer-0");
    EXPECT_EQ(b.owner().tcp_endpoint, "10.0.0.7:31337");
    EXPECT_EQ(b.object().id, 77u);
    EXPECT_EQ(b.object().generation, 5u);
    EXPECT_EQ(b.object().slot, 9u);
    EXPECT_EQ(b.transport(), "shm");
    ASSERT_EQ(b.tensors().size(), 3u);
    EXPECT_EQ(b.tensors()[0].shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(b.tensors()[1].dtype, DType::kInt64);
    EXPECT_TRUE(b.tensors()[1].shape.empty());
    EXPECT_EQ(b.tensors()[2].device, Device::cuda(1));
    EXPECT_EQ(b.places()[1], (std::pair<uint16_t, uint64_t>{2, 0x7fff0000}));
    EXPECT_EQ(b.blob(), std::string("\x01\x02\x03", 3));
    EXPECT_FALSE(b.is_signed());
    EXPECT_EQ(b.serialize(), a.serialize());
  }
  EXPECT_EQ(a.to_text().rfind("tutti-ref:1:", 0), 0u);
}

TEST(TensorRefFormat, EveryFlippedBitAndEveryTruncationIsRejected) {
  const std::string bytes = sample_ref().serialize();
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string damaged = bytes;
      damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
      expect_error([&] { TensorRef::parse(damaged); }, ErrorCode::kInvalidArgument);
    }
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    expect_error([&] { TensorRef::parse(bytes.substr(0, n)); }, ErrorCode::kInvalidArgument);
  }
}

TEST(TensorRefFormat, AFutureVersionIsNamed) {
  std::string bytes = sample_ref().serialize();
  bytes[4] = 2;  // the version byte follows the magic
  const Error e = expect_error([&] { TensorRef::parse(bytes); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("version 2"), std::string::npos) << e.what();
}

TEST(TensorRefFormat, RandomBytesNeverCrashTheParser) {
  std::mt19937 rng(12345);
  const std::string good = sample_ref().serialize();
  for (int i = 0; i < 20000; ++i) {
    std::string s = good;
    // Random edits, then a recomputed-looking length so deeper fields get exercised too.
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < edits; ++k) s[rng() % s.size()] = static_cast<char>(rng());
    if (rng() % 2) s.resize(rng() % (s.size() + 16), '\0');
    try {
      TensorRef::parse(s);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
  expect_error([] { TensorRef::from_text("tutti-ref:1:!!!"); }, ErrorCode::kInvalidArgument);
  expect_error([] { TensorRef::from_text("nonsense"); }, ErrorCode::kInvalidArgument);
}

// A zero dimension makes a tensor empty whatever its other dimensions, as for a TensorView,
// though their product does not fit an int64 (fuzz_ref_places found numel() overflowing on it).
TEST(TensorRefFormat, AZeroDimensionMakesAnEmptyTensorWhateverTheOthers) {
  const std::vector<int64_t> shape = {int64_t{1} << 56, 255, 0};
  const TensorRef made(AgentIdentity{}, ObjectId{1, 1, 0}, "shm",
                       {{DType::kInt8, shape, Device::cpu()}}, {{2, 0}}, std::string(16, '\0'),
                       false);
  const TensorRef ref = TensorRef::parse(made.serialize());
  EXPECT_EQ(ref.tensors()[0].numel(), 0);
  EXPECT_EQ(ref.tensors()[0].nbytes(), 0u);
  EXPECT_EQ(TensorView(nullptr, DType::kInt8, shape).numel(), 0);
  const TensorMeta big{DType::kInt8, {int64_t{1} << 31, int64_t{1} << 31}, Device::cpu()};
  EXPECT_EQ(big.numel(), int64_t{1} << 62);
}

TEST(TensorRefFormat, SignaturesNeedTheKey) {
  TensorRef r = sample_ref();
  EXPECT_FALSE(r.verify("k1"));
  r.sign("k1");
  const TensorRef back = TensorRef::parse(r.serialize());
  EXPECT_TRUE(back.is_signed());
  EXPECT_TRUE(back.verify("k1"));
  EXPECT_FALSE(back.verify("k2"));
}

// ---- the transports' bytes in a ref (fuzzed: tests/fuzz/fuzz_ref_places.cc) ----

TensorRef with_parts(const TensorRef& ref, std::vector<std::pair<uint16_t, uint64_t>> places,
                     std::string blob) {
  return TensorRef(ref.owner(), ref.object(), ref.transport(), ref.tensors(), std::move(places),
                   std::move(blob), ref.is_two_sided());
}

TEST_F(Transfer, ShmRefPlacesReadWhatThePutWroteAndRefuseTheRest) {
  using namespace shm_backend;
  std::vector<float> heap = iota_floats(10, 0.0f);
  TensorView shared = owner->allocate(4096, DType::kFloat32);
  TensorView part(static_cast<float*>(shared.data()) + 256, DType::kFloat32, {512}, Device::cpu());
  ObjectHandle h = owner->put({TensorView(heap), part});
  const TensorRef ref = TensorRef::from_text(h.ref().to_text());
  const std::vector<RefPlace> places = read_ref_places(ref);
  ASSERT_EQ(places.size(), 2u);
  EXPECT_FALSE(places[0].in_block);
  EXPECT_EQ(places[0].at, reinterpret_cast<uint64_t>(heap.data()));
  EXPECT_EQ(places[0].bytes, 40u);
  EXPECT_TRUE(places[1].in_block);
  EXPECT_EQ(places[1].at, 1024u);
  EXPECT_EQ(places[1].bytes, 2048u);
  check_in_block(1, places[1], 3072);  // ends at the block's end
  EXPECT_TUTTI_ERROR(check_in_block(1, places[1], 3071), ErrorCode::kInvalidArgument, "tensor 1",
                     "2048 bytes at offset 1024", "3071 bytes");

  const std::string blob = ref.blob();
  ASSERT_EQ(blob.size(), 32u);
  const auto kept = ref.places();
  EXPECT_TUTTI_ERROR(read_ref_places(with_parts(ref, kept, blob + "x")),
                     ErrorCode::kInvalidArgument, "1 bytes left over");
  EXPECT_TUTTI_ERROR(read_ref_places(with_parts(ref, kept, blob.substr(0, 31))),
                     ErrorCode::kInvalidArgument, "truncated");
  EXPECT_TUTTI_ERROR(read_ref_places(with_parts(ref, {kept[0], {3, 1024}}, blob)),
                     ErrorCode::kInvalidArgument, "tensor 1 has an unknown place 3");
  EXPECT_TUTTI_ERROR(
      read_ref_places(with_parts(ref, {{kInProcess, UINT64_MAX - 39}, kept[1]}, blob)),
      ErrorCode::kInvalidArgument, "tensor 0", "wraps the address space");
  read_ref_places(with_parts(ref, {{kInProcess, UINT64_MAX - 40}, kept[1]}, blob));

  // A consumer's get maps the block, then refuses a tensor the ref puts past its end (wrapping,
  // so whatever the block's real size).
  EXPECT_TUTTI_ERROR(consumer->get(with_parts(ref, {kept[0], {kInBlock, UINT64_MAX - 1000}}, blob)),
                     ErrorCode::kInvalidArgument, "tensor 1", "lies past the end of block");
  Received got = consumer->get(ref);
  EXPECT_EQ(as_floats(got.tensors()[0]), iota_floats(10, 0.0f));
  h.release();
  owner->wait_tensor_freed(shared, 5s);
  owner->deallocate(shared);
}

TEST(RefPlaces, CudaIpcReadsEachTensorsPlaceAndRefusesOnePastItsAllocation) {
  using namespace cuda_ipc;
  auto blob_with = [](uint64_t offset, uint64_t size) {
    const std::string uuid(16, '\x07'), event(64, '\x01'), handle(64, '\x02'), none(64, '\0');
    WireWriter w;
    w.bytes(uuid.data(), uuid.size()).bytes(event.data(), event.size());
    w.bytes(handle.data(), handle.size()).u64(offset).u64(size).u64(9).u64(0x10000);
    w.bytes(none.data(), none.size()).u64(0).u64(0).u64(0).u64(0);  // the empty tensor
    return std::move(w.out());
  };
  std::vector<TensorMeta> metas = {{DType::kFloat32, {16}, Device::cuda(0)},
                                   {DType::kFloat32, {0}, Device::cuda(0)}};
  auto ref_with = [&](std::string blob) {
    return TensorRef::parse(TensorRef(AgentIdentity{}, ObjectId{1, 1, 0}, "cuda_ipc", metas,
                                      {{0, 0}, {0, 0}}, std::move(blob), false)
                                .serialize());
  };
  const Places p = read_places(ref_with(blob_with(4096 - 64, 4096)));  // ends at the end
  EXPECT_TRUE(p.any);
  EXPECT_EQ(p.uuid[15], 7);
  EXPECT_EQ(p.event[63], 1);
  ASSERT_EQ(p.places.size(), 2u);
  EXPECT_EQ(p.places[0].handle[0], 2);
  EXPECT_EQ(p.places[0].offset, 4096u - 64);
  EXPECT_EQ(p.places[0].size, 4096u);
  EXPECT_EQ(p.places[0].buffer_id, 9u);
  EXPECT_EQ(p.places[0].base, 0x10000u);
  EXPECT_TUTTI_ERROR(read_places(ref_with(blob_with(4096 - 63, 4096))), ErrorCode::kInvalidArgument,
                     "tensor 0 (64 bytes at offset 4033)",
                     "past its allocation's end (4096 bytes)");
  EXPECT_TUTTI_ERROR(read_places(ref_with(blob_with(UINT64_MAX - 10, 4096))),
                     ErrorCode::kInvalidArgument, "tensor 0");
  EXPECT_TUTTI_ERROR(read_places(ref_with(blob_with(0, 4096) + "x")), ErrorCode::kInvalidArgument,
                     "1 bytes left over");
  const std::string whole = blob_with(0, 4096);
  EXPECT_TUTTI_ERROR(read_places(ref_with(whole.substr(0, whole.size() - 1))),
                     ErrorCode::kInvalidArgument, "truncated at an owner's address");
}

// ---- put and get ----

TEST_F(Transfer, GetCopiesHeapAndSharedTensorsThroughShm) {
  std::vector<float> heap = iota_floats(1000, 1.0f);
  TensorView shared = owner->allocate(4096 * sizeof(int32_t), DType::kInt32);
  for (int i = 0; i < 4096; ++i) static_cast<int32_t*>(shared.data())[i] = 3 * i - 7;
  ObjectHandle h = owner->put({TensorView(heap), shared});
  EXPECT_EQ(h.ref().transport(), "shm");
  const TensorRef ref = TensorRef::from_text(h.ref().to_text());  // as a peer would see it

  Received got = consumer->get(ref);
  ASSERT_EQ(got.tensors().size(), 2u);
  EXPECT_EQ(as_floats(got.tensors()[0]), iota_floats(1000, 1.0f));
  EXPECT_NE(got.tensors()[0].data(), heap.data());
  const int32_t* s = static_cast<const int32_t*>(got.tensors()[1].data());
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(s[i], 3 * i - 7) << i;
  EXPECT_EQ(got.tensors()[1].shape(), (std::vector<int64_t>{4096}));

  // Into the caller's own buffers.
  std::vector<float> t0(1000, 0.0f);
  std::vector<int32_t> t1(4096, 0);
  GetOptions g;
  g.targets = {TensorView(t0), TensorView(t1)};
  Received into = consumer->get(ref, g);
  EXPECT_EQ(into.tensors()[0].data(), t0.data());
  EXPECT_EQ(t0, iota_floats(1000, 1.0f));
  EXPECT_EQ(t1[4095], 3 * 4095 - 7);
  h.release();
  owner->wait_tensor_freed(shared, 5s);
  owner->deallocate(shared);
}

// Copies from 4 MiB are shared between threads (as many as this process's CPUs, up to 4), slice
// by slice: every byte arrives, the last slice's odd length included, from ordinary memory
// (cross-memory reads) and from the owner's shareable memory (memcpy), into targets and into
// buffers of the get's own; and a borrow of ordinary memory (a copy too).
TEST_F(Transfer, LargeCopiesSharedBetweenThreadsHaveEveryByte) {
  const size_t bytes = (size_t{21} << 20) + 4096 * 3 + 5;  // 21 MiB and an odd tail
  auto pattern = [](size_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); };
  std::vector<uint8_t> heap(bytes);
  for (size_t i = 0; i < bytes; ++i) heap[i] = pattern(i);
  TensorView shared = owner->allocate(bytes);
  std::memcpy(shared.data(), heap.data(), bytes);
  ObjectHandle h = owner->put({TensorView(heap), shared});
  auto first_wrong = [&](const TensorView& t) {
    const uint8_t* p = static_cast<const uint8_t*>(t.data());
    for (size_t i = 0; i < bytes; ++i) {
      if (p[i] != pattern(i)) return i;
    }
    return bytes;
  };
  Received got = consumer->get(h.ref());
  EXPECT_EQ(first_wrong(got.tensors()[0]), bytes);
  EXPECT_EQ(first_wrong(got.tensors()[1]), bytes);
  std::vector<uint8_t> t0(bytes, 0), t1(bytes, 0);
  GetOptions g;
  g.targets = {TensorView(t0), TensorView(t1)};
  consumer->get(h.ref(), g);
  EXPECT_EQ(first_wrong(TensorView(t0)), bytes);
  EXPECT_EQ(first_wrong(TensorView(t1)), bytes);
  {
    Borrowed b = consumer->borrow(h.ref());
    EXPECT_EQ(first_wrong(b.tensors()[0]), bytes);
    EXPECT_NE(b.tensors()[0].data(), heap.data());
  }
  h.release();
  owner->wait_tensor_freed(shared, 5s);
  owner->deallocate(shared);
}

// Many tensors of ordinary memory in one object are read as one copy (slices that cover several
// tensors, shared between threads from 8 MiB in all), and a get's own buffers for them are one
// allocation: every byte arrives in its own tensor, empty and odd-sized ones included, with no
// two tensors sharing bytes, into buffers of the get's own, into targets, by copy-on-write and
// by borrow.
TEST_F(Transfer, ManySmallTensorsArriveWholeAndApart) {
  std::vector<std::vector<uint8_t>> heap;
  std::vector<TensorView> put;
  size_t total = 0;
  for (int i = 0; i < 300; ++i) {
    const size_t n = i % 7 == 3 ? 0 : 20000 + static_cast<size_t>(i) * 331 % 40000 + i % 5;
    heap.emplace_back(n);
    for (size_t k = 0; k < n; ++k) heap.back()[k] = static_cast<uint8_t>(i * 31 + k * 7);
    put.emplace_back(heap.back());
    total += n;
  }
  ASSERT_GT(total, size_t{8} << 20) << "enough for the copy's threads";
  ObjectHandle h = owner->put(put);
  auto check = [&](const std::vector<TensorView>& got, const char* how) {
    ASSERT_EQ(got.size(), heap.size()) << how;
    for (size_t i = 0; i < heap.size(); ++i) {
      ASSERT_EQ(got[i].nbytes(), heap[i].size()) << how << ", tensor " << i;
      if (heap[i].empty()) continue;
      EXPECT_NE(got[i].data(), heap[i].data()) << how << ", tensor " << i;
      EXPECT_EQ(std::memcmp(got[i].data(), heap[i].data(), heap[i].size()), 0)
          << how << ", tensor " << i;
    }
    // Apart: each tensor filled with a value of its own keeps it after all the others were.
    auto mark = [](size_t i) { return static_cast<uint8_t>(i * 37 + 1); };
    for (size_t i = 0; i < heap.size(); ++i) {
      if (!heap[i].empty()) std::memset(got[i].data(), mark(i), heap[i].size());
    }
    for (size_t i = 0; i < heap.size(); ++i) {
      const auto* p = static_cast<const uint8_t*>(got[i].data());
      for (size_t k = 0; k < heap[i].size(); ++k) {
        ASSERT_EQ(p[k], mark(i)) << how << ", tensor " << i << " byte " << k;
      }
    }
  };
  {
    Received r = consumer->get(h.ref());
    check(r.tensors(), "own buffers");
  }
  {
    GetOptions cow;
    cow.copy_on_write = true;
    Received r = consumer->get(h.ref(), cow);
    check(r.tensors(), "copy-on-write");
  }
  {
    std::vector<std::vector<uint8_t>> into;
    GetOptions g;
    for (const auto& b : heap) {
      into.emplace_back(b.size(), 0);
      g.targets.emplace_back(into.back());
    }
    Received r = consumer->get(h.ref(), g);
    check(r.tensors(), "targets");
  }
  {
    Borrowed b = consumer->borrow(h.ref());
    std::vector<TensorView> views = b.tensors();
    check(views, "borrow");
  }
  h.release();
}

// A copy-on-write get of several views of one block maps the block once for the views that do
// not overlap (they keep their places relative to each other), and privately again for one that
// overlaps them: a write to one tensor shows in no other, as with copies.
TEST_F(Transfer, CopyOnWriteViewsOfOneBlockAreMappedOnceUnlessTheyOverlap) {
  const int64_t n = 4096;  // floats per view: 4 pages
  TensorView block = owner->allocate(3 * n * sizeof(float), DType::kFloat32);
  float* b = static_cast<float*>(block.data());
  for (int64_t i = 0; i < 3 * n; ++i) b[i] = static_cast<float>(i);
  auto view = [&](int64_t first, int64_t count) {
    return TensorView(b + first, DType::kFloat32, {count}, Device::cpu());
  };
  // Two apart, then one across their boundary.
  ObjectHandle h = owner->put({view(0, n), view(2 * n, n), view(n / 2, n)});
  GetOptions cow;
  cow.copy_on_write = true;
  {
    Received r = consumer->get(h.ref(), cow);
    ASSERT_EQ(r.tensors().size(), 3u);
    auto* t0 = static_cast<float*>(r.tensors()[0].data());
    auto* t1 = static_cast<float*>(r.tensors()[1].data());
    auto* t2 = static_cast<float*>(r.tensors()[2].data());
    EXPECT_EQ(t0[5], 5.0f);
    EXPECT_EQ(t1[5], static_cast<float>(2 * n + 5));
    EXPECT_EQ(t2[5], static_cast<float>(n / 2 + 5));
    EXPECT_EQ(t1 - t0, 2 * n) << "the two apart share one mapping";
    EXPECT_NE(t2, t0 + n / 2) << "the overlapping one has its own";
    t0[n / 2 + 1] = -1.0f;  // also tensor 2's element 1, in the owner's block
    EXPECT_EQ(t2[1], static_cast<float>(n / 2 + 1));
    t2[n - 1] = -2.0f;  // the owner's element 3n/2 - 1: tensor 0 does not reach it
    EXPECT_EQ(b[n / 2 + 1], static_cast<float>(n / 2 + 1)) << "the owner's stays";
    EXPECT_EQ(b[n + n / 2 - 1], static_cast<float>(n + n / 2 - 1));
  }
  h.release();
  // The overlapping one first: the one it overlaps on its right gets the second mapping.
  ObjectHandle h2 = owner->put({view(n / 2, n), view(0, n)});
  {
    Received r = consumer->get(h2.ref(), cow);
    auto* t0 = static_cast<float*>(r.tensors()[0].data());
    auto* t1 = static_cast<float*>(r.tensors()[1].data());
    EXPECT_EQ(t0[0], static_cast<float>(n / 2));
    EXPECT_EQ(t1[n - 1], static_cast<float>(n - 1));
    EXPECT_NE(t1 + n / 2, t0) << "the overlapping one has its own";
    t1[n / 2] = -4.0f;  // tensor 0's element 0 in the owner's block
    EXPECT_EQ(t0[0], static_cast<float>(n / 2));
  }
  h2.release();
  owner->wait_tensor_freed(block, 5s);
  owner->deallocate(block);
}

TEST_F(Transfer, TargetsAreCheckedBeforeAnyIo) {
  std::vector<float> x = iota_floats(8, 0.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  std::vector<double> wrong_dtype(8);
  std::vector<float> wrong_size(9);
  for (auto targets : {std::vector<TensorView>{TensorView(wrong_dtype)},
                       std::vector<TensorView>{TensorView(wrong_size)},
                       std::vector<TensorView>{TensorView(x), TensorView(x)}}) {
    GetOptions g;
    g.targets = targets;
    const Error e = expect_error([&] { consumer->get(h.ref(), g); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("get of object"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'consumer'"), std::string::npos) << e.what();
  }
}

TEST_F(Transfer, SocketTransportStreamsTheBytes) {
  std::vector<int64_t> x(100000);
  std::iota(x.begin(), x.end(), int64_t{-50});
  PutOptions p;
  p.transport = "socket";
  ObjectHandle h = owner->put({TensorView(x)}, p);
  EXPECT_EQ(h.ref().transport(), "socket");
  Received got = consumer->get(h.ref());
  const int64_t* g = static_cast<const int64_t*>(got.tensors()[0].data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(g[i], static_cast<int64_t>(i) - 50);
  // The tensor is the owner's to keep until the object is freed: the get can have every byte
  // while the owner's thread is still returning from its last send (AddressSanitizer's check of
  // that send once read `x` after the test had freed it).
  h.release();
  owner->wait_tensor_freed(TensorView(x), 5s);
}

TEST_F(Transfer, BorrowOfSharedMemoryIsZeroCopyAndOfHeapIsACopy) {
  TensorView shared = owner->allocate(256 * sizeof(float), DType::kFloat32);
  float* sp = static_cast<float*>(shared.data());
  for (int i = 0; i < 256; ++i) sp[i] = static_cast<float>(i);
  std::vector<float> heap = iota_floats(16, 100.0f);
  ObjectHandle h = owner->put({shared, TensorView(heap)});
  {
    Borrowed b = consumer->borrow(h.ref());
    ASSERT_EQ(b.tensors().size(), 2u);
    EXPECT_EQ(static_cast<const float*>(b.tensors()[0].data())[255], 255.0f);
    // The owner writes after the borrow: a view of the same pages sees it.
    sp[255] = -1.0f;
    EXPECT_EQ(static_cast<const float*>(b.tensors()[0].data())[255], -1.0f);
    // The heap tensor was copied at borrow.
    heap[0] = -5.0f;
    EXPECT_EQ(static_cast<const float*>(b.tensors()[1].data())[0], 100.0f);

    // While borrowed, the object outlives its handle and wait_tensor_freed names the borrower.
    h.release();
    const Error e =
        expect_error([&] { owner->wait_tensor_freed(shared, 200ms); }, ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("leased by agent 'consumer'"), std::string::npos)
        << e.what();
  }
  owner->wait_tensor_freed(shared, 5s);  // the borrow went: freed
  owner->deallocate(shared);
}

// GetOptions::copy_on_write: tensors in shareable memory come as private mappings of the owner's
// pages (no copy; the consumer's writes stay its own, the owner's untouched pages show through),
// others as copies; the Received holds the object only while it maps the owner's memory.
TEST_F(Transfer, CopyOnWriteGetsMapSharedMemoryPrivately) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const int64_t n = static_cast<int64_t>(4 * page / sizeof(float));
  TensorView shared = owner->allocate(n * sizeof(float), DType::kFloat32);
  float* sp = static_cast<float*>(shared.data());
  for (int64_t i = 0; i < n; ++i) sp[i] = static_cast<float>(i);
  std::vector<float> heap = iota_floats(16, 100.0f);
  ObjectHandle h = owner->put({shared, TensorView(heap)});
  GetOptions cow;
  cow.copy_on_write = true;
  {
    Received r = consumer->get(h.ref(), cow);
    ASSERT_EQ(r.tensors().size(), 2u);
    float* mine = static_cast<float*>(r.tensors()[0].data());
    EXPECT_NE(mine, sp);
    EXPECT_EQ(mine[n - 1], static_cast<float>(n - 1));
    // The consumer writes its first page: its own copy; the owner never sees it.
    mine[0] = -7.0f;
    EXPECT_EQ(sp[0], 0.0f);
    EXPECT_EQ(mine[0], -7.0f);
    // A second consumer's mapping is its own too.
    Received other = consumer->get(h.ref(), cow);
    EXPECT_EQ(static_cast<const float*>(other.tensors()[0].data())[0], 0.0f);
    // The heap tensor was copied.
    EXPECT_EQ(static_cast<const float*>(r.tensors()[1].data())[15], 115.0f);
    heap[15] = -1.0f;
    EXPECT_EQ(static_cast<const float*>(r.tensors()[1].data())[15], 115.0f);
    // While mapped, the object outlives its handle: the Received holds it.
    h.release();
    const Error e =
        expect_error([&] { owner->wait_tensor_freed(shared, 200ms); }, ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("leased by agent 'consumer'"), std::string::npos)
        << e.what();
  }
  owner->wait_tensor_freed(shared, 5s);  // both Receiveds went: freed
  // Only heap tensors: copies, and the object may go at once.
  ObjectHandle plain = owner->put({TensorView(heap)});
  Received copy = consumer->get(plain.ref(), cow);
  EXPECT_EQ(static_cast<const float*>(copy.tensors()[0].data())[15], -1.0f);
  plain.release();
  owner->wait_tensor_freed(TensorView(heap), 5s);
  // The owner's own ref: a copy, never its tensors.
  ObjectHandle again = owner->put({shared});
  Received own = owner->get(again.ref(), cow);
  EXPECT_NE(own.tensors()[0].data(), shared.data());
  static_cast<float*>(own.tensors()[0].data())[1] = -3.0f;
  EXPECT_EQ(sp[1], 1.0f);
  again.release();
  owner->wait_tensor_freed(shared, 5s);
  owner->deallocate(shared);
}

// A Borrowed declared first and assigned later (a member, a loop variable): its default
// constructor must compile in code that sees only the public headers, as this file does.
TEST_F(Transfer, BorrowedIsDefaultConstructibleAndAssignedLater) {
  Borrowed b;
  EXPECT_TRUE(b.tensors().empty());
  std::vector<float> x = iota_floats(8, 1.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  b = consumer->borrow(h.ref());
  EXPECT_EQ(as_floats(b.tensors()[0]), iota_floats(8, 1.0f));
  b.release();
  EXPECT_TRUE(b.tensors().empty());
}

TEST_F(Transfer, SnapshotIsNotChangedByLaterWrites) {
  std::vector<float> x = iota_floats(64, 0.0f);
  PutOptions p;
  p.snapshot = true;
  ObjectHandle h = owner->put({TensorView(x)}, p);
  x.assign(64, 9.0f);
  EXPECT_EQ(as_floats(consumer->get(h.ref()).tensors()[0]), iota_floats(64, 0.0f));
  // The snapshot lives in shareable memory: borrowing it is zero-copy and still unchanged.
  Borrowed b = consumer->borrow(h.ref());
  EXPECT_EQ(as_floats(b.tensors()[0]), iota_floats(64, 0.0f));
  // And the caller's tensor was never published: nothing to wait for.
  owner->wait_tensor_freed(TensorView(x), 1ms);
}

TEST_F(Transfer, OwnRefsNeedNoCopy) {
  std::vector<float> x = iota_floats(4, 0.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  Received got = owner->get(h.ref());
  EXPECT_EQ(got.tensors()[0].data(), x.data());
  std::vector<float> y(4);
  GetOptions g;
  g.targets = {TensorView(y)};
  owner->get(h.ref(), g);
  EXPECT_EQ(y, x);
}

// ---- reserve, fulfil, fail ----

TEST_F(Transfer, GetsOfAReservedObjectWaitForFulfil) {
  for (const char* transport : {"shm", "socket"}) {
    PutOptions p;
    p.transport = transport;
    ObjectHandle h = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}}, p);
    EXPECT_TRUE(h.ref().is_pending());
    Fetch f = consumer->get_async(h.ref());
    std::this_thread::sleep_for(50ms);  // not a synchronisation: the get must wait either way
    EXPECT_FALSE(f.done()) << transport;
    std::vector<float> data = {1.5f, 2.5f, 3.5f};
    owner->fulfil(h, {TensorView(data)});
    EXPECT_EQ(as_floats(f.wait().tensors()[0]), data) << transport;
    // A get after fulfil finds it at once.
    EXPECT_EQ(as_floats(consumer->get(h.ref()).tensors()[0]), data) << transport;
    // The data is the caller's again once the owner says so (a socket get's stream may still
    // be leaving it when the consumer has its bytes).
    h.release();
    owner->wait_tensor_freed(TensorView(data), 10s);
  }
}

// A Fetch has Work's verbs: wait with a timeout that leaves the get running, is_completed and
// exception.
TEST_F(Transfer, AFetchWaitsWithATimeoutAndTellsItsError) {
  ObjectHandle h = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}});
  Fetch f = consumer->get_async(h.ref());
  const Error e = expect_error([&] { f.wait(50ms); }, ErrorCode::kTimeout);
  EXPECT_NE(std::string(e.what()).find("still runs after 50 ms"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("on agent 'consumer'"), std::string::npos) << e.what();
  EXPECT_FALSE(f.is_completed());
  EXPECT_EQ(f.exception(), nullptr);
  std::vector<float> data = {1.5f, 2.5f, 3.5f};
  owner->fulfil(h, {TensorView(data)});
  EXPECT_EQ(as_floats(f.wait(10s).tensors()[0]), data) << "the get went on after the timeout";
  EXPECT_TRUE(f.is_completed());
  EXPECT_EQ(f.exception(), nullptr);
  // A failed get: exception() is its error, and wait() rethrows it, as often as it is called.
  ObjectHandle failed = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}});
  Fetch g = consumer->get_async(failed.ref());
  owner->fail(failed, "the producer crashed");
  expect_error([&] { g.wait(); }, ErrorCode::kRemoteError);
  ASSERT_NE(g.exception(), nullptr);
  try {
    std::rethrow_exception(g.exception());
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("the producer crashed"), std::string::npos)
        << err.what();
  }
  expect_error([&] { g.wait(); }, ErrorCode::kRemoteError);
  EXPECT_TRUE(Fetch().is_completed());
}

// The thread ids of this process.
std::set<long> thread_ids() {
  std::set<long> out;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') out.insert(std::strtol(e->d_name, nullptr, 10));
    }
    ::closedir(d);
  }
  return out;
}

// get_async runs its gets on workers it reuses (it started a thread per call until 2026-12-02),
// and as many as run at once: a get never waits for another to end.
TEST_F(Transfer, GetAsyncReusesItsWorkersAndNeverQueuesAGetBehindAnother) {
  std::vector<float> x = iota_floats(64, 0.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  consumer->get_async(h.ref()).wait();  // the first worker, the connection, the mapping
  const std::set<long> before = thread_ids();
  for (int i = 0; i < 50; ++i) {
    Fetch f = consumer->get_async(h.ref());
    ASSERT_EQ(as_floats(f.wait().tensors()[0]), x);
  }
  std::vector<long> born;
  for (long t : thread_ids()) {
    if (before.count(t) == 0) born.push_back(t);
  }
  // (A regression guard: threads started per get and ended at once could pass it too.)
  EXPECT_TRUE(born.empty()) << "50 gets one after the other started " << born.size()
                            << " new thread(s)";
  // A get that waits (for a reserved object) waits on the idle worker: no thread is born for it.
  ObjectHandle pending = owner->reserve({{DType::kFloat32, {64}, Device::cpu()}});
  std::vector<Fetch> waiting;
  waiting.push_back(consumer->get_async(pending.ref()));
  for (long t : thread_ids()) {
    EXPECT_EQ(before.count(t), 1u) << "a get started thread " << t << " while a worker was idle";
  }
  // Four gets waiting hold four workers; a fifth get still runs at once.
  for (int i = 0; i < 3; ++i) waiting.push_back(consumer->get_async(pending.ref()));
  EXPECT_EQ(as_floats(consumer->get_async(h.ref()).wait(10s).tensors()[0]), x);
  for (const Fetch& f : waiting) EXPECT_FALSE(f.is_completed());
  owner->fulfil(pending, {TensorView(x)});
  for (Fetch& f : waiting) EXPECT_EQ(as_floats(f.wait(10s).tensors()[0]), x);
}

// An agent destroyed while get_async's gets wait ends them (kAborted) and does not wait for
// their timeouts.
TEST_F(Transfer, DestroyingTheConsumerEndsItsAsyncGets) {
  ObjectHandle pending = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}});
  std::vector<Fetch> waiting;
  GetOptions g;
  g.timeout = 60s;
  for (int i = 0; i < 3; ++i) waiting.push_back(consumer->get_async(pending.ref(), g));
  const auto start = std::chrono::steady_clock::now();
  consumer.reset();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(ms, 5000.0) << "the agent's destruction waited for its gets";
  for (Fetch& f : waiting) {
    ASSERT_TRUE(f.is_completed());
    expect_error([&] { f.wait(); }, ErrorCode::kAborted);
  }
}

TEST_F(Transfer, FailReachesWaitingAndLaterGets) {
  for (const char* transport : {"shm", "socket"}) {
    PutOptions p;
    p.transport = transport;
    ObjectHandle h = owner->reserve({{DType::kUInt8, {10}, Device::cpu()}}, p);
    Fetch f = consumer->get_async(h.ref());
    owner->fail(h, "the producer ran out of memory");
    for (auto get :
         std::vector<std::function<void()>>{[&] { f.wait(); }, [&] { consumer->get(h.ref()); }}) {
      const Error e = expect_error(get, ErrorCode::kRemoteError);
      EXPECT_NE(std::string(e.what()).find("the producer ran out of memory"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(Transfer, FulfilChecksTheTensorsAgainstTheReservation) {
  ObjectHandle h = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}});
  std::vector<float> wrong(4);
  expect_error([&] { owner->fulfil(h, {TensorView(wrong)}); }, ErrorCode::kInvalidArgument);
  std::vector<float> right(3);
  owner->fulfil(h, {TensorView(right)});
  expect_error([&] { owner->fulfil(h, {TensorView(right)}); }, ErrorCode::kInvalidUsage);
}

TEST_F(Transfer, AnUnfulfilledGetTimesOutNamingTheOwner) {
  ObjectHandle h = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}});
  GetOptions g;
  g.timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  const Error e = expect_error([&] { consumer->get(h.ref(), g); }, ErrorCode::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_NE(std::string(e.what()).find("agent 'owner'"), std::string::npos) << e.what();
}

// ---- lifetime ----

TEST_F(Transfer, AReleasedObjectIsGone) {
  std::vector<float> x = iota_floats(4, 0.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  const TensorRef ref = h.ref();
  h.release();
  owner->wait_tensor_freed(TensorView(x), 5s);
  const Error e = expect_error([&] { consumer->get(ref); }, ErrorCode::kInvalidUsage);
  EXPECT_NE(std::string(e.what()).find("freed"), std::string::npos) << e.what();
}

TEST_F(Transfer, ExpectedGetsKeepTheObjectUntilDone) {
  for (const char* transport : {"shm", "socket"}) {
    std::vector<float> x = iota_floats(4, 0.0f);
    PutOptions p;
    p.transport = transport;
    p.expected_gets = 2;
    ObjectHandle h = owner->put({TensorView(x)}, p);
    const TensorRef ref = h.ref();
    h.release();  // the owner lets go at once: the two gets still find it
    const Error e1 =
        expect_error([&] { owner->wait_tensor_freed(TensorView(x), 100ms); }, ErrorCode::kTimeout);
    EXPECT_NE(std::string(e1.what()).find("2 expected get(s) left"), std::string::npos)
        << e1.what();
    EXPECT_EQ(as_floats(consumer->get(ref).tensors()[0]), x) << transport;
    EXPECT_EQ(as_floats(consumer->get(ref).tensors()[0]), x) << transport;
    owner->wait_tensor_freed(TensorView(x), 5s);
    expect_error([&] { consumer->get(ref); }, ErrorCode::kInvalidUsage);
  }
}

TEST_F(Transfer, KeepForHoldsAReleasedObject) {
  std::vector<float> x = iota_floats(4, 0.0f);
  PutOptions p;
  p.keep_for = 400ms;
  ObjectHandle h = owner->put({TensorView(x)}, p);
  const TensorRef ref = h.ref();
  h.release();
  EXPECT_EQ(as_floats(consumer->get(ref).tensors()[0]), x);
  const Error e =
      expect_error([&] { owner->wait_tensor_freed(TensorView(x), 1ms); }, ErrorCode::kTimeout);
  EXPECT_NE(std::string(e.what()).find("kept for"), std::string::npos) << e.what();
  owner->wait_tensor_freed(TensorView(x), 5s);
}

TEST_F(Transfer, DeallocateRefusesPublishedMemory) {
  TensorView shared = owner->allocate(64);
  ObjectHandle h = owner->put({shared});
  const Error e = expect_error([&] { owner->deallocate(shared); }, ErrorCode::kInvalidUsage);
  EXPECT_NE(std::string(e.what()).find("1 owner handle(s) alive"), std::string::npos) << e.what();
  h.release();
  owner->wait_tensor_freed(shared, 5s);
  owner->deallocate(shared);
  std::vector<uint8_t> heap(64);
  expect_error([&] { owner->deallocate(TensorView(heap)); }, ErrorCode::kInvalidArgument);
}

// ---- cancel, abort, errors ----

TEST_F(Transfer, CancelAndAbortEndGetsAndTheAgentStaysUsable) {
  ObjectHandle h = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}});
  Fetch f = consumer->get_async(h.ref());
  f.cancel();
  expect_error([&] { f.wait(); }, ErrorCode::kAborted);

  // abort() ends every get in progress: one of get_async's still queued for a thread too (the
  // test once waited 50 ms for it to start, and a loaded machine could take longer: the get then
  // waited out the fetch timeout).
  Fetch f2 = consumer->get_async(h.ref());
  consumer->abort();
  expect_error([&] { f2.wait(); }, ErrorCode::kAborted);
  // Then one that is waiting for the owner, as before.
  Fetch f3 = consumer->get_async(h.ref());
  expect_error([&] { f3.wait(200ms); }, ErrorCode::kTimeout);  // still running
  consumer->abort();
  expect_error([&] { f3.wait(); }, ErrorCode::kAborted);

  std::vector<float> data = {1, 2, 3};
  owner->fulfil(h, {TensorView(data)});
  EXPECT_EQ(as_floats(consumer->get(h.ref()).tensors()[0]), data);
}

// Cancel and abort in the middle of a 1 GiB copy: the get ends with kAborted after the slices in
// progress (an shm copy runs in 256 MiB slices, 128 MiB where 3 or 4 threads share it; each
// thread takes the next), and the target holds a slice-aligned prefix of the object and its old
// bytes after it (the documented partial state). The real latency is printed; the bound asserted
// is only a guard against a hang.
TEST_F(Transfer, CancelAndAbortEndA1GiBCopyMidway) {
  constexpr size_t kBytes = size_t{1} << 30;
  constexpr size_t kSlice = size_t{128} << 20;
  TensorView source = owner->allocate(kBytes);
  uint8_t* src = static_cast<uint8_t*>(source.data());
  for (size_t i = 0; i < kBytes; i += 4096)
    std::memset(src + i, static_cast<int>((i >> 12) % 251 + 1), 4096);
  PutOptions sock;
  sock.transport = "socket";
  ObjectHandle shm_obj = owner->put({source});
  ObjectHandle sock_obj = owner->put({source}, sock);
  std::vector<uint8_t> target(kBytes, 0);
  for (int how = 0; how < 2; ++how) {  // 0: shm copy + Fetch::cancel, 1: socket + abort()
    std::fill(target.begin(), target.end(), 0);
    GetOptions g;
    g.targets = {TensorView(target)};
    g.timeout = 120s;
    Fetch f = consumer->get_async(how == 0 ? shm_obj.ref() : sock_obj.ref(), g);
    // The copy has begun once the target's first byte is the object's.
    const auto begun = std::chrono::steady_clock::now();
    while (first_byte(target.data()) == 0 && !f.done() &&
           std::chrono::steady_clock::now() - begun < 60s) {
      std::this_thread::yield();
    }
    ASSERT_FALSE(f.done()) << "the copy ended before it could be cancelled";
    const auto asked = std::chrono::steady_clock::now();
    if (how == 0) {
      f.cancel();
    } else {
      consumer->abort();
    }
    const Error e = expect_error([&] { f.wait(); }, ErrorCode::kAborted);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - asked).count();
    std::printf("%s of a 1 GiB %s get: ended %.1f ms after the request\n",
                how == 0 ? "cancel" : "abort", how == 0 ? "shm" : "socket", ms);
    EXPECT_LT(ms, 5000.0);  // a hang guard; the latency is what the line above reports
    EXPECT_NE(std::string(e.what()).find("agent 'consumer'"), std::string::npos) << e.what();
    // A prefix of the object, then untouched bytes.
    size_t copied = 0;
    while (copied < kBytes && target[copied] == src[copied]) ++copied;
    for (size_t i = copied; i < kBytes; i += 4096) ASSERT_EQ(target[i], 0) << "at " << i;
    if (how == 0) EXPECT_EQ(copied % kSlice, 0u) << copied;
    EXPECT_LT(copied, kBytes);
  }
  // The agent stays usable, and a full get still works.
  GetOptions g;
  g.targets = {TensorView(target)};
  consumer->get(shm_obj.ref(), g);
  EXPECT_EQ(std::memcmp(target.data(), src, kBytes), 0);
  shm_obj.release();
  sock_obj.release();
  owner->wait_tensor_freed(source, 30s);
  owner->deallocate(source);
}

// A copy of many tensors from ordinary memory is one copy over all of them (a slice per thread),
// which looks at its cancel every 64 tensors, not only between slices: a cancel midway leaves the
// tensors after that point untouched, the last of each slice included (a slice is 150 MiB here,
// 75 with four threads).
TEST_F(Transfer, CancelEndsACopyOfManyTensorsMidway) {
  constexpr size_t kCount = 1200;
  constexpr size_t kEach = size_t{256} << 10;  // 300 MiB in all
  std::vector<std::vector<uint8_t>> heap(kCount);
  std::vector<TensorView> put;
  for (size_t i = 0; i < kCount; ++i) {
    heap[i].assign(kEach, static_cast<uint8_t>(i % 251 + 1));
    put.emplace_back(heap[i]);
  }
  ObjectHandle h = owner->put(put);
  std::vector<std::vector<uint8_t>> into(kCount, std::vector<uint8_t>(kEach, 0));
  GetOptions g;
  for (auto& t : into) g.targets.emplace_back(t);
  g.timeout = 120s;
  Fetch f = consumer->get_async(h.ref(), g);
  const auto begun = std::chrono::steady_clock::now();
  while (first_byte(into[0].data()) == 0 && !f.done() &&
         std::chrono::steady_clock::now() - begun < 60s) {
    std::this_thread::yield();
  }
  ASSERT_FALSE(f.done()) << "the copy ended before it could be cancelled";
  f.cancel();
  expect_error([&] { f.wait(); }, ErrorCode::kAborted);
  size_t untouched = 0;
  for (size_t i = 0; i < kCount; ++i) untouched += into[i][kEach - 1] == 0 ? 1 : 0;
  std::printf("cancelled with %zu of %zu tensors not yet copied\n", untouched, kCount);
  // The last tensor of each slice (one, two or four threads: the slices end at these).
  for (size_t last : {kCount / 2 - 1, kCount - 1}) {
    EXPECT_EQ(into[last][0], 0) << "tensor " << last << " was copied: the cancel came too late";
  }
  EXPECT_GT(untouched, 0u);
  // The agent stays usable, and the whole object still arrives.
  Fetch again = consumer->get_async(h.ref(), g);
  again.wait();
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(into[i], heap[i]) << "tensor " << i;
  h.release();
}

// Memory of the application's, registered once with the file it is mapped from: puts are cheap,
// borrows map it read-only and see the owner's bytes in place (a live view, no copy).
TEST_F(Transfer, RegisteredMemoryIsBorrowedInPlace) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = 1000 * 4096;
  const int fd = ::memfd_create("app-memory", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(page + bytes)), 0);
  // The region is the file's bytes from one page on.
  void* p =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(page));
  ASSERT_NE(p, MAP_FAILED);
  uint8_t* mem = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < bytes; ++i) mem[i] = static_cast<uint8_t>(i * 13 + 5);
  TensorView region(mem, DType::kUInt8, {static_cast<int64_t>(bytes)});
  owner->register_memory(region, fd, page);
  ::close(fd);  // the agent keeps its own descriptor
  std::vector<TensorView> slices;
  for (int i = 0; i < 1000; ++i) slices.push_back(region.slice(i * 4096, 4096));
  ObjectHandle h = owner->put(slices);
  {
    Borrowed b = consumer->borrow(h.ref());
    ASSERT_EQ(b.tensors().size(), 1000u);
    const uint8_t* seen = static_cast<const uint8_t*>(b.tensors()[999].data());
    EXPECT_NE(seen, mem + 999 * 4096);  // the consumer's own (read-only) mapping
    EXPECT_EQ(seen[7], static_cast<uint8_t>((999 * 4096 + 7) * 13 + 5));
    mem[999 * 4096 + 7] = 0xAB;  // the owner writes: a borrow is a live view of its memory
    EXPECT_EQ(seen[7], 0xAB);
  }
  expect_error([&] { owner->unregister_memory(region); }, ErrorCode::kInvalidUsage);
  // Registering again, or overlapping, is refused.
  expect_error([&] { owner->register_memory(region.slice(4096, 4096), -1); },
               ErrorCode::kInvalidArgument);
  h.release();
  owner->wait_tensor_freed(region, 10s);
  owner->unregister_memory(region);
  // Without a file: gets copy it across processes.
  owner->register_memory(region);
  ObjectHandle plain = owner->put({region.slice(4096, 4096)});
  EXPECT_EQ(static_cast<const uint8_t*>(consumer->get(plain.ref()).tensors()[0].data())[1],
            static_cast<uint8_t>((4097) * 13 + 5));
  plain.release();
  owner->wait_tensor_freed(region, 10s);
  owner->unregister_memory(region);
  // Bad registrations.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  expect_error([&] { owner->register_memory(region, pipe_fds[0]); }, ErrorCode::kInvalidArgument);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  expect_error([&] { owner->register_memory(region.slice(1, 64), 3); },
               ErrorCode::kInvalidArgument);
  std::vector<float> empty;
  expect_error([&] { owner->register_memory(TensorView(empty)); }, ErrorCode::kInvalidArgument);
  ::munmap(p, bytes);
}

// PutOptions::check_writes: the owner writing a published tensor is caught when the object is
// freed, and reported by the wait_tensor_freed that covers it (a slice of it is enough).
TEST_F(Transfer, CheckWritesCatchesTheOwnerWritingAPublishedTensor) {
  std::vector<float> data(1000, 1.0f);
  PutOptions p;
  p.check_writes = true;
  ObjectHandle h = owner->put({TensorView(data)}, p);
  EXPECT_EQ(as_floats(consumer->get(h.ref()).tensors()[0])[5], 1.0f);
  data[5] = 2.0f;  // the mistake: written while published
  h.release();
  const Error e = expect_error([&] { owner->wait_tensor_freed(TensorView(data).slice(4, 2), 10s); },
                               ErrorCode::kRemoteError);
  EXPECT_NE(std::string(e.what()).find("changed after put"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("tensor(s) 0"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("agent 'owner'"), std::string::npos) << e.what();
  owner->wait_tensor_freed(TensorView(data), 1s);  // reported once
  // Written only after it was freed: nothing to report.
  ObjectHandle h2 = owner->put({TensorView(data)}, p);
  h2.release();
  owner->wait_tensor_freed(TensorView(data), 10s);
  data[7] = 3.0f;
  owner->wait_tensor_freed(TensorView(data), 1s);
  // Without the check, the same mistake goes unseen.
  ObjectHandle h3 = owner->put({TensorView(data)});
  data[9] = 4.0f;
  h3.release();
  owner->wait_tensor_freed(TensorView(data), 10s);
}

TEST_F(Transfer, AnUnknownTransportIsNamed) {
  std::vector<float> x(4);
  PutOptions p;
  p.transport = "rdma-nope";
  const Error e = expect_error([&] { owner->put({TensorView(x)}, p); }, ErrorCode::kUnavailable);
  EXPECT_NE(std::string(e.what()).find("rdma-nope"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("socket"), std::string::npos) << e.what();  // listed
}

// Here no transport carries CUDA tensors (no cuda_ipc, no GPU): "auto" says so, and a CPU
// transport asked by name refuses them; both before any I/O.
TEST_F(Transfer, CudaTensorsAreRefusedBeforeAnyIo) {
  float fake = 0;
  TensorView gpu(&fake, DType::kFloat32, {1}, Device::cuda(0));
  Error e = expect_error([&] { owner->put({gpu}); }, ErrorCode::kUnavailable);
  EXPECT_NE(std::string(e.what()).find("put on agent 'owner': tensor 0 is on cuda:0; transport "
                                       "'auto': no available transport carries CUDA tensors"),
            std::string::npos)
      << e.what();
  PutOptions shm;
  shm.transport = "shm";
  e = expect_error([&] { owner->put({gpu}, shm); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("tensor 0 is on cuda:0; transport 'shm' carries CPU"),
            std::string::npos)
      << e.what();
}

std::shared_ptr<TransferAgent> agent_with(const std::string& name, const std::string& secret) {
  TransferAgentOptions o;
  o.name = name;
  o.secret = secret;
  return TransferAgent::create(o);
}

TEST(TransferSecret, RefsSignedWithAnotherSecretAreRefused) {
  auto owner = agent_with("owner", "s3cret");
  auto consumer = agent_with("consumer", "other");
  auto friendly = agent_with("friend", "s3cret");
  std::vector<float> x = iota_floats(4, 0.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  EXPECT_TRUE(h.ref().is_signed());
  const Error e = expect_error([&] { consumer->get(h.ref()); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("signed with another secret"), std::string::npos)
      << e.what();
  EXPECT_EQ(as_floats(friendly->get(h.ref()).tensors()[0]), x);
}

// The agents' wire, written by hand (channel.h): a frame is its length (u32, type included), its
// type (u8) and its payload; strings are a length (u8 or u32) and their bytes.
namespace raw {
constexpr uint8_t kHello = 1, kReply = 9, kError = 10, kChallenge = 12, kProof = 13;

void u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

int connect_abstract(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: a leading NUL
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int listen_abstract(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 4) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_frame(int fd, uint8_t type, const std::string& payload) {
  std::string frame;
  u32(frame, static_cast<uint32_t>(payload.size() + 1));
  frame.push_back(static_cast<char>(type));
  frame += payload;
  ASSERT_EQ(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size()));
}

bool read_exactly(int fd, char* out, size_t n) {
  for (size_t got = 0; got < n;) {
    const ssize_t k = ::recv(fd, out + got, n - got, 0);
    if (k <= 0) return false;
    got += static_cast<size_t>(k);
  }
  return true;
}

// (type, payload); type 0 when the peer hung up.
std::pair<uint8_t, std::string> read_frame(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  unsigned char head[5];
  if (!read_exactly(fd, reinterpret_cast<char*>(head), 5)) return {0, ""};
  const uint32_t len =
      head[0] | head[1] << 8 | head[2] << 16 | static_cast<uint32_t>(head[3]) << 24;
  std::string payload(len - 1, '\0');
  if (!read_exactly(fd, payload.data(), payload.size())) return {0, ""};
  return {head[4], payload};
}

// An agent's identity as the wire carries it.
std::string identity(const std::array<uint8_t, 16>& uuid, const std::string& name) {
  std::string id(reinterpret_cast<const char*>(uuid.data()), 16);
  id += std::string(16, '\x09');  // host key
  u32(id, static_cast<uint32_t>(::getpid()));
  id += std::string(8, '\0');  // start time
  id += std::string(1, '\0');  // no TCP endpoint
  id += std::string(1, static_cast<char>(name.size())) + name;
  return id;
}

std::string hello(const std::string& nonce) {
  std::array<uint8_t, 16> uuid;
  uuid.fill(7);
  const std::string id = identity(uuid, "raw");
  std::string p;
  u32(p, static_cast<uint32_t>(id.size()));
  p += id;
  u32(p, 0);  // protocol 1's proof: empty
  u32(p, 3);  // protocol 3
  p += std::string(1, static_cast<char>(nonce.size())) + nonce;
  return p;
}
}  // namespace raw

// With a secret, an owner challenges each hello with a nonce of its own (a fresh one per
// connection, so a proof read off one connection is worth nothing on another), and refuses a
// proof that does not answer it, naming the secret. A consumer without the secret is refused the
// same way; one with it gets through.
TEST(TransferSecret, EachHelloIsChallengedAfreshAndAWrongProofIsRefused) {
  auto owner = agent_with("owner", "s3cret");
  const std::string address = "tutti-agent/" + owner->identity().uuid_text();
  std::string nonces[2];
  for (int c = 0; c < 2; ++c) {
    const int fd = raw::connect_abstract(address);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    raw::send_frame(fd, raw::kHello, raw::hello(std::string(16, static_cast<char>('a' + c))));
    const auto [type, payload] = raw::read_frame(fd);
    ASSERT_EQ(type, raw::kChallenge) << payload;
    ASSERT_EQ(payload.size(), 17u) << "a 16-byte nonce";
    nonces[c] = payload.substr(1);
    // A proof of the right size that is not the HMAC over this connection's nonces.
    raw::send_frame(fd, raw::kProof, std::string(1, '\x20') + std::string(32, '\x5a'));
    const auto [answer, message] = raw::read_frame(fd);
    EXPECT_EQ(answer, raw::kError);
    EXPECT_NE(message.find("agent 'raw' does not know the shared secret"), std::string::npos)
        << message;
    EXPECT_EQ(raw::read_frame(fd).first, 0) << "the owner hangs up";
    ::close(fd);
  }
  EXPECT_NE(nonces[0], nonces[1]);
  std::vector<float> x = iota_floats(4, 0.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  const Error e =
      expect_error([&] { agent_with("stranger", "")->get(h.ref()); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("'stranger' does not know the shared secret"),
            std::string::npos)
      << e.what();
  // The consumer knows why: it has none.
  EXPECT_NE(std::string(e.what()).find("this agent has no secret"), std::string::npos) << e.what();
  EXPECT_EQ(as_floats(agent_with("friend", "s3cret")->get(h.ref()).tensors()[0]), x);
}

// The owner proves the secret too: whoever answers at the owner's address (here a listener that
// took it over once the owner's agent went) without the proof is refused, before any request.
TEST(TransferSecret, AnImpostorAtTheOwnersAddressIsRefused) {
  auto owner = agent_with("owner", "s3cret");
  std::vector<float> x = iota_floats(4, 0.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  const TensorRef ref = h.ref();
  const auto uuid = owner->identity().uuid;
  const std::string address = "tutti-agent/" + owner->identity().uuid_text();
  h.release();
  owner.reset();
  int listener = -1;
  for (int i = 0; i < 100 && listener < 0; ++i) {
    listener = raw::listen_abstract(address);
    if (listener < 0) std::this_thread::sleep_for(10ms);  // the agent's socket is closing
  }
  ASSERT_GE(listener, 0) << std::strerror(errno);
  std::thread impostor([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    const auto [type, payload] = raw::read_frame(fd);
    EXPECT_EQ(type, raw::kHello);
    std::string reply;
    const std::string id = raw::identity(uuid, "owner");
    raw::u32(reply, static_cast<uint32_t>(id.size()));
    reply += id;
    raw::u32(reply, 3);                                         // protocol 3
    reply += std::string(1, '\x20') + std::string(32, '\x11');  // not the owner's proof
    raw::send_frame(fd, raw::kReply, reply);
    raw::read_frame(fd);  // until the consumer hangs up
    ::close(fd);
  });
  GetOptions g;
  g.timeout = 5s;
  const Error e = expect_error([&] { agent_with("consumer", "s3cret")->get(ref, g); },
                               ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("does not prove the shared secret"), std::string::npos)
      << e.what();
  ::shutdown(listener, SHUT_RDWR);
  impostor.join();
  ::close(listener);
}

// ---- many objects, no leaks ----

TEST_F(Transfer, TenThousandCyclesLeakNothing) {
  std::vector<float> x = iota_floats(256, 0.0f);
  TensorView shared = owner->allocate(1024, DType::kFloat32);
  auto cycle = [&](int i) {
    ObjectHandle h = owner->put({TensorView(x), shared});
    if (i % 3 == 0) {
      Borrowed b = consumer->borrow(h.ref());
      ASSERT_EQ(static_cast<const float*>(b.tensors()[0].data())[7], 7.0f);
    } else {
      Received r = consumer->get(h.ref());
      ASSERT_EQ(static_cast<const float*>(r.tensors()[0].data())[255], 255.0f);
    }
  };
  // Warm up the same paths (connections, mappings, the threads' malloc arenas), then count.
  for (int i = 0; i < 300; ++i) cycle(i);
  owner->wait_tensor_freed(TensorView(x), 5s);
  // Other tests' agents may still be closing their last connections: counts may only drop.
  const size_t fds = open_fds();
  const auto maps = mappings();
  const size_t rss = rss_bytes();
  for (int i = 0; i < 10000; ++i) cycle(i);
  owner->wait_tensor_freed(TensorView(x), 5s);
  owner->wait_tensor_freed(shared, 5s);
  EXPECT_LE(open_fds(), fds);
  const auto maps_after = mappings();
  EXPECT_LE(maps_after.size(), maps.size()) << added(maps, maps_after);
  // A leak of even 1 KiB a cycle would add 10 MiB (under AddressSanitizer, LeakSanitizer checks
  // at exit instead: its quarantine grows RSS).
  if (!tutti::testing::kAddressSanitizer) {
    EXPECT_LT(rss_bytes(), rss + (4u << 20)) << "RSS grew from " << rss << " to " << rss_bytes();
  }
  owner->deallocate(shared);
}

// A snapshot puts each tensor in a block of its own, deallocated when the object is freed. The
// consumer's cached mappings of such blocks go at its next get (it sees them gone from the
// owner's table of live blocks), so their memory goes back; before, up to 64 stayed mapped.
TEST_F(Transfer, AConsumerUnmapsBlocksItsOwnerDeallocated) {
  auto blocks_mapped = [] {
    size_t n = 0;
    for (const auto& line : mappings()) n += line.find("memfd:tutti-rdt ") != std::string::npos;
    return n;
  };
  std::vector<float> x = iota_floats(1 << 18, 0.0f);  // 1 MiB
  TensorView live = owner->allocate(4096, DType::kFloat32);
  ObjectHandle keep = owner->put({live});
  consumer->get(keep.ref());
  const size_t before = blocks_mapped();  // the live block, by the owner and the consumer
  PutOptions p;
  p.transport = "shm";
  p.snapshot = true;
  for (int i = 0; i < 5; ++i) {
    ObjectHandle h = owner->put({TensorView(x)}, p);
    EXPECT_EQ(as_floats(consumer->get(h.ref()).tensors()[0])[1000], 1000.0f);
    EXPECT_GE(blocks_mapped(), before + 2) << "the snapshot, by the owner and the consumer";
  }
  // Every snapshot's object is freed (its handle went, its get completed): the owner has
  // deallocated the blocks, and the consumer drops its mappings at its next get.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  size_t now = 0;
  do {
    consumer->get(keep.ref());
    now = blocks_mapped();
  } while (now != before && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(now, before) << added({}, mappings());
  keep.release();
  owner->wait_tensor_freed(live, 5s);
  owner->deallocate(live);
}

// ---- what a failed, forged or misused get must not do (review of the first step) ----

// A transport whose fetch always fails, after the agent took its lease.
class FailingTransport final : public TensorTransport {
 public:
  explicit FailingTransport(bool one_sided) : one_sided_(one_sided) {}
  const char* name() const override { return one_sided_ ? "fail-1-test" : "fail-2-test"; }
  TransportTraits traits() const override { return {one_sided_, false, false}; }
  Publication publish(const PublishRequest&) override { return {}; }
  FetchResult fetch(const FetchRequest&) override {
    throw Error(ErrorCode::kIoError, "the test's transport fails every fetch");
  }

 private:
  bool one_sided_;
};

TEST_F(Transfer, AFailedGetGivesItsLeaseBack) {
  for (bool one_sided : {true, false}) {
    const std::string name = one_sided ? "fail-1-test" : "fail-2-test";
    if (!is_registered_tensor_transport(name)) {
      register_tensor_transport(name, [one_sided](const TransportContext&) {
        return std::make_unique<FailingTransport>(one_sided);
      });
    }
    std::vector<float> x = iota_floats(16, 0.0f);
    PutOptions p;
    p.transport = name;
    ObjectHandle h = owner->put({TensorView(x)}, p);
    for (int i = 0; i < 3; ++i) expect_error([&] { consumer->get(h.ref()); }, ErrorCode::kIoError);
    h.release();
    // Nothing holds it any more: freed without waiting out a lease the failed gets kept.
    owner->wait_tensor_freed(TensorView(x), 2s);
  }
}

TEST_F(Transfer, ABorrowOutlivesItsConsumersDroppedConnection) {
  TensorView shared = owner->allocate(64 * sizeof(float));
  std::iota(static_cast<float*>(shared.data()), static_cast<float*>(shared.data()) + 64, 1.0f);
  ObjectHandle h = owner->put({shared});
  Borrowed b = consumer->borrow(h.ref());
  // A get that times out drops the consumer's (only) connection to the owner: the consumer's
  // process is alive, so its borrow must still hold the object.
  ObjectHandle pending = owner->reserve({{DType::kFloat32, {1}, Device::cpu()}});
  GetOptions quick;
  quick.timeout = 50ms;
  expect_error([&] { consumer->get(pending.ref(), quick); }, ErrorCode::kTimeout);
  h.release();
  const Error e =
      expect_error([&] { owner->wait_tensor_freed(shared, 300ms); }, ErrorCode::kTimeout);
  EXPECT_NE(std::string(e.what()).find("leased by agent 'consumer'"), std::string::npos)
      << e.what();
  EXPECT_EQ(static_cast<const float*>(b.tensors()[0].data())[63], 64.0f);
  b.release();
  owner->wait_tensor_freed(shared, 2s);
}

TEST_F(Transfer, ForgedRefsAreRefusedNotFollowed) {
  TensorView shared = owner->allocate(64);
  ObjectHandle h = owner->put({shared});
  const TensorRef real = h.ref();
  auto forged = [&](AgentIdentity who, std::vector<TensorMeta> metas,
                    std::vector<std::pair<uint16_t, uint64_t>> places) {
    return TensorRef(who, real.object(), real.transport(), metas, places, real.blob(), false);
  };
  // A tensor placed past its block's end (the offset wraps a 64-bit sum).
  const Error past = expect_error(
      [&] {
        consumer->get(forged(real.owner(), real.tensors(), {{1, ~uint64_t{0} - 7}}));
      },
      ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(past.what()).find("past the end of block"), std::string::npos)
      << past.what();
  // More bytes than the block has.
  expect_error(
      [&] {
        consumer->get(
            forged(real.owner(), {{DType::kUInt8, {1 << 20}, Device::cpu()}}, real.places()));
      },
      ErrorCode::kInvalidArgument);
  // The owner's id with another process's pid.
  AgentIdentity other_pid = real.owner();
  other_pid.pid = 1;
  const Error pid =
      expect_error([&] { consumer->get(forged(other_pid, real.tensors(), real.places())); },
                   ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(pid.what()).find("names pid 1"), std::string::npos) << pid.what();
  // The owner's own ref, altered to describe more than the object holds.
  std::vector<uint8_t> big(1 << 20);
  GetOptions into;
  into.targets = {TensorView(big)};
  expect_error(
      [&] {
        owner->get(forged(real.owner(), {{DType::kUInt8, {1 << 20}, Device::cpu()}}, real.places()),
                   into);
      },
      ErrorCode::kInvalidArgument);
  // Still served as it should be.
  EXPECT_EQ(consumer->get(real).tensors()[0].nbytes(), 64u);
}

// The owner's fetch timeout bounds what it waits for inside a request, not how long a consumer's
// connection may stay idle: one below the serving thread's 1 s idle wake-up still leaves the
// pooled connection open for the next get. And a timeout of milliseconds::max() ("never", as
// Python's math.inf arrives) is no deadline in the past: the hello's challenge and its answer
// are waited for.
TEST(TransferTimeouts, AnOwnersShortOrInfiniteFetchTimeoutKeepsItsConnectionsServing) {
  for (const auto timeout : {std::chrono::milliseconds(800), std::chrono::milliseconds::max()}) {
    SCOPED_TRACE("fetch_timeout " + std::to_string(timeout.count()) + " ms");
    TransferAgentOptions o;
    o.name = "owner";
    o.secret = "s3cret";
    o.fetch_timeout = timeout;
    auto owner = TransferAgent::create(o);
    auto consumer = agent_with("consumer", "s3cret");
    std::vector<float> x = iota_floats(16, 1.0f);
    PutOptions p;
    p.transport = "socket";  // a request and its answer on the pooled connection for each get
    ObjectHandle h = owner->put({TensorView(x)}, p);
    EXPECT_EQ(as_floats(consumer->get(h.ref()).tensors()[0]), x);
    if (timeout.count() < 1000) {
      std::this_thread::sleep_for(1300ms);  // idle past the fetch timeout and one wake-up
    }
    EXPECT_EQ(as_floats(consumer->get(h.ref()).tensors()[0]), x);
    // The owner's serving thread may still be returning from its send of x (the consumer has
    // the bytes): x lives until the owner lets go of it.
    h.release();
    owner->wait_tensor_freed(TensorView(x), 10s);
  }
}

// A TCP client that sends fewer bytes than the owner looks at to tell TLS apart (here 1 of 3: a
// port probe) costs the owner's serving thread no CPU while it waits for more (it spun for its
// 10 s before), and the owner lets go of it once it closes.
TEST(TransferTimeouts, AProbeOfOneByteCostsTheOwnerNoCpu) {
  TransferAgentOptions o;
  o.name = "owner";
  o.listen_tcp = true;
  o.tcp_host = "127.0.0.1";  // not the host's name, which may resolve elsewhere
  auto owner = TransferAgent::create(o);
  const std::string endpoint = owner->identity().tcp_endpoint;
  const size_t colon = endpoint.rfind(':');
  ASSERT_NE(colon, std::string::npos) << endpoint;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  ASSERT_EQ(::inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &addr.sin_addr), 1) << endpoint;
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  ASSERT_EQ(::send(fd, "\x16", 1, MSG_NOSIGNAL), 1);
  auto cpu_ms = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000.0 +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000.0;
  };
  std::this_thread::sleep_for(100ms);  // the owner has accepted it and is looking
  const double before = cpu_ms();
  std::this_thread::sleep_for(700ms);
  EXPECT_LT(cpu_ms() - before, 200.0) << "the process used the CPU while the probe waited";
  ::close(fd);
  const auto start = std::chrono::steady_clock::now();
  owner.reset();  // waits for its serving threads
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// A pooled connection whose owner's end went while it was idle (here the owner's socket is shut
// down under it, as a reset from a NAT or firewall between hosts would do): the consumer's
// housekeeping closes it, and the next get takes a fresh connection and succeeds. Before, the
// pooled connection was used as it was and the get failed with kIoError, naming a live owner as
// gone.
TEST(TransferTimeouts, APooledConnectionThatWentBadWhileIdleIsNotUsed) {
  TransferAgentOptions o;
  o.name = "owner";
  o.listen_tcp = true;
  o.tcp_host = "127.0.0.1";
  auto owner = TransferAgent::create(o);
  o.name = "consumer";
  o.listen_tcp = false;
  auto consumer = TransferAgent::create(o);
  const std::string endpoint = owner->identity().tcp_endpoint;
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  std::vector<float> x = {1, 2, 3, 4};
  PutOptions p;
  p.transport = "socket";
  ObjectHandle h = owner->put({TensorView(x)}, p);
  // The owner as if on another host: the consumer goes to it by TCP.
  AgentIdentity far = owner->identity();
  for (auto& b : far.host_key) b ^= 0x5a;
  const TensorRef good = h.ref();
  const TensorRef ref(far, good.object(), good.transport(), good.tensors(), good.places(),
                      good.blob(), false);
  EXPECT_EQ(as_floats(consumer->get(ref).tensors()[0]), x);
  // The owner's end of the connection the consumer pooled: this process's socket whose own port
  // is the owner's and that has a peer.
  int shut = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      const int fd = std::atoi(e->d_name);
      sockaddr_in mine{}, peer{};
      socklen_t len = sizeof(mine), plen = sizeof(peer);
      if (fd <= 2 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &len) != 0 ||
          mine.sin_family != AF_INET || ntohs(mine.sin_port) != port ||
          ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) {
        continue;
      }
      ::shutdown(fd, SHUT_RDWR);
      ++shut;
    }
    ::closedir(d);
  }
  ASSERT_EQ(shut, 1) << "the owner's end of the pooled connection was not found";
  // The consumer's housekeeping (every 100-200 ms) closes its end: its socket whose peer's port is
  // the owner's goes.
  auto consumer_ends = [&] {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
      while (dirent* e = ::readdir(d)) {
        const int fd = std::atoi(e->d_name);
        sockaddr_in peer{};
        socklen_t plen = sizeof(peer);
        n += fd > 2 && ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0 &&
             peer.sin_family == AF_INET && ntohs(peer.sin_port) == port;
      }
      ::closedir(d);
    }
    return n;
  };
  const auto shut_at = std::chrono::steady_clock::now();
  while (consumer_ends() > 0 && std::chrono::steady_clock::now() - shut_at < 5s) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(consumer_ends(), 0) << "the pooled connection was kept after its owner's end went";
  EXPECT_EQ(as_floats(consumer->get(ref).tensors()[0]), x);
  h.release();
  owner->wait_tensor_freed(TensorView(x), 10s);
}

// A get whose connect to an owner on another host gets no answer (here the owner's listening
// socket's queue is full, so its SYNs are dropped) ends when cancelled, within a poll's slice,
// not at the get's 20 s timeout: before, the TCP connect looked only at its deadline. (Ray's
// dropped fetches are cancelled so, from its finaliser thread.)
TEST(TransferTimeouts, ACancelledGetStopsWaitingForATcpConnect) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  // Connections nobody accepts, until one stays unanswered.
  std::vector<int> fillers;
  bool unanswered = false;
  for (int i = 0; i < 16 && !unanswered; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    fillers.push_back(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) continue;
    ASSERT_EQ(errno, EINPROGRESS) << std::strerror(errno);
    pollfd p{fd, POLLOUT, 0};
    unanswered = ::poll(&p, 1, 200) == 0;
  }
  ASSERT_TRUE(unanswered) << "every connect was answered";

  AgentIdentity owner;
  for (int i = 0; i < 16; ++i) {
    owner.uuid[i] = static_cast<uint8_t>(0xa0 + i);
    owner.host_key[i] = static_cast<uint8_t>(0x50 + i);  // another host: the get goes by TCP
  }
  owner.pid = 1;
  owner.start_time = 1;
  owner.name = "unanswering";
  owner.tcp_endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const TensorRef ref(owner, ObjectId{1, 1, 0}, "socket", {{DType::kFloat32, {4}, Device::cpu()}},
                      {{0, 0}}, "", false);
  TransferAgentOptions o;
  o.name = "consumer";
  auto consumer = TransferAgent::create(o);
  GetOptions patient;
  patient.timeout = 20s;
  Fetch f = consumer->get_async(ref, patient);
  std::this_thread::sleep_for(300ms);
  ASSERT_FALSE(f.done()) << "the get ended before it was cancelled";
  const auto cancelled = std::chrono::steady_clock::now();
  f.cancel();
  const Error e = expect_error([&] { f.wait(); }, ErrorCode::kAborted);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cancelled)
          .count();
  std::printf("the cancelled get ended %.1f ms after cancel(): %s\n", ms, e.what());
  EXPECT_LT(ms, 1000.0);
  for (int fd : fillers) ::close(fd);
  ::close(listener);
}

// A get of a reserved object that is never fulfilled fails at the consumer's timeout with the
// owner's reason, which the owner sends before the consumer gives up.
// A connect that fails on this side (out of descriptors) while the owner lives keeps the peer
// and its lease lane: a borrow after it is in the lane the owner reads, so the object outlives
// its handle while borrowed. Before, the peer was forgotten and made again with a second lane
// that the owner closed unread: the borrow's lease held nothing, and the owner freed the object
// under the borrower (wait_tensor_freed returned).
TEST_F(Transfer, AConnectFailingOnThisSideKeepsTheLeaseLane) {
  if (testing::light_test_run()) {
    // Out of descriptors, the sanitizers' runtime cannot check memory (it does so through a
    // pipe) and reports objects that are there as invalid: the plain run checks this.
    GTEST_SKIP() << "needs a process out of descriptors, which the sanitizers' runtime is not "
                    "made for";
  }
  TensorView shared = owner->allocate(256 * sizeof(float), DType::kFloat32);
  ObjectHandle h = owner->put({shared});
  // The peer, its lane and a connection, held by a get that waits (a reservation never
  // fulfilled): the next request needs a connection of its own.
  ObjectHandle pending = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}});
  GetOptions waiting;
  waiting.timeout = 3s;
  Fetch busy = consumer->get_async(pending.ref(), waiting);
  std::this_thread::sleep_for(100ms);  // its request reaches the owner (it fails either way)
  int open_fds = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++open_fds;
    ::closedir(d);
  }
  rlimit was{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
  rlimit tight = was;
  // "." and "..", and the directory's own descriptor (closed since), were counted: none is free.
  tight.rlim_cur = static_cast<rlim_t>(open_fds - 3);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  const Error e = expect_error([&] { consumer->get(pending.ref(), waiting); }, ErrorCode::kIoError);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &was), 0);
  EXPECT_NE(std::string(e.what()).find("Too many open files"), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find("is gone"), std::string::npos)
      << "a live owner taken for dead: " << e.what();
  {
    Borrowed b = consumer->borrow(h.ref());
    h.release();
    expect_error([&] { owner->wait_tensor_freed(shared, 300ms); }, ErrorCode::kTimeout);
  }
  owner->wait_tensor_freed(shared, 5s);
  busy.cancel();
  expect_error([&] { busy.wait(); }, ErrorCode::kAborted);
  owner->deallocate(shared);
}

TEST_F(Transfer, AGetOfAReservationNeverFulfilledSaysSo) {
  ObjectHandle pending = owner->reserve({{DType::kFloat32, {3}, Device::cpu()}});
  GetOptions g;
  g.timeout = 2s;  // the owner refuses 500 ms before
  const Error e = expect_error([&] { consumer->get(pending.ref(), g); }, ErrorCode::kTimeout);
  EXPECT_NE(std::string(e.what()).find("still reserved (never fulfilled)"), std::string::npos)
      << e.what();
}

// An agent of another tutti build is refused by name, not misread: here a hello as it was before
// the protocol had a version (0), and one of protocol 2 (the last before two-sided fetches became
// their transport's own calls). The hello is written by hand: a frame is a little-endian u32
// length (payload + 1), a type byte (1: hello) and the payload (identity, proof, version, nonce).
TEST_F(Transfer, AnAgentSpeakingAnotherProtocolIsRefusedByName) {
  for (const uint32_t version : {0u, 2u}) {
    SCOPED_TRACE("protocol " + std::to_string(version));
    const int fd = raw::connect_abstract("tutti-agent/" + owner->identity().uuid_text());
    ASSERT_GE(fd, 0) << std::strerror(errno);
    std::array<uint8_t, 16> uuid;
    uuid.fill(7);
    const std::string id = raw::identity(uuid, "old");
    std::string payload;
    raw::u32(payload, static_cast<uint32_t>(id.size()));
    payload += id;
    raw::u32(payload, 0);  // no proof (and for protocol 0 no version either)
    if (version > 0) {
      raw::u32(payload, version);
      payload += std::string(1, '\x10') + std::string(16, 'n');  // its nonce
    }
    raw::send_frame(fd, raw::kHello, payload);
    // The answer: an error frame naming both protocols, then the owner hangs up.
    const auto [type, message] = raw::read_frame(fd);
    EXPECT_EQ(type, raw::kError);
    EXPECT_NE(message.find("agent 'old' speaks the direct transport's protocol " +
                           std::to_string(version) + ", this agent 3"),
              std::string::npos)
        << message;
    EXPECT_EQ(raw::read_frame(fd).first, 0) << "the owner hangs up";
    ::close(fd);
  }
  // The owner goes on serving agents of its own build.
  TensorView shared = owner->allocate(16);
  EXPECT_EQ(consumer->get(owner->put({shared}).ref()).tensors()[0].nbytes(), 16u);
}

// The owner's serving thread wakes once a second between requests to look at its agent's stop.
// A request whose first bytes came before such a wake-up and the rest after it (a consumer
// descheduled mid-send, a slow link) is read whole: the half read before is not dropped, which
// would read the rest as a message of its own (here a length of ~3 GB, and the connection
// gone). The request itself is one the owner refuses with a named error: nothing is served
// before a hello.
TEST_F(Transfer, ARequestSplitAcrossTheOwnersIdleWakeUpIsReadWhole) {
  const int fd = raw::connect_abstract("tutti-agent/" + owner->identity().uuid_text());
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::string frame;
  raw::u32(frame, 6);               // a type byte and 5 bytes of payload
  frame.push_back('\x02');          // kCall
  frame += std::string(5, '\xb3');  // read from byte 2 on, 00 00 02 b3 is a length of ~3 GB
  ASSERT_EQ(::send(fd, frame.data(), 2, MSG_NOSIGNAL), 2);
  std::this_thread::sleep_for(1300ms);  // past the owner's idle wake-up (1 s)
  ASSERT_EQ(::send(fd, frame.data() + 2, frame.size() - 2, MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size() - 2));
  const auto [type, message] = raw::read_frame(fd);
  EXPECT_EQ(type, raw::kError) << "the owner hung up: it lost the request's first bytes";
  EXPECT_NE(message.find("serves nothing to a connection that has not said hello"),
            std::string::npos)
      << message;
  ::close(fd);
}

TEST_F(Transfer, MisusedTargetsHandlesAndTimeouts) {
  std::vector<float> x = iota_floats(8, 0.0f);
  ObjectHandle h = owner->put({TensorView(x), TensorView(x.data(), 4)});
  std::vector<float> out(12);
  GetOptions overlapping;
  overlapping.targets = {TensorView(out.data(), 8), TensorView(out.data() + 6, 4)};
  const Error e =
      expect_error([&] { consumer->get(h.ref(), overlapping); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("targets 0 and 1 overlap"), std::string::npos) << e.what();
  // Another agent's handle.
  const Error other = expect_error([&] { consumer->fail(h, "no"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(other.what()).find("another agent's object"), std::string::npos)
      << other.what();
  // "No timeout" is a timeout too: it must not overflow into an immediate one.
  GetOptions forever;
  forever.timeout = std::chrono::milliseconds::max();
  EXPECT_EQ(as_floats(consumer->get(h.ref(), forever).tensors()[0]), x);
}

// A ref carries at most 1 MiB of its transport's bytes: 65536 tensors of shm's 16 bytes each
// (a model's weights in one object: a 30B MoE has ~19,000 tensors).
TEST_F(Transfer, MoreTensorsThanARefDescribesAreRefusedAtPut) {
  std::vector<float> x(66000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  std::vector<TensorView> many;
  for (float& f : x) many.emplace_back(&f, 1);
  const auto t0 = std::chrono::steady_clock::now();
  const Error e = expect_error([&] { owner->put(many); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("at most 1048576"), std::string::npos) << e.what();
  many.resize(65000);
  ObjectHandle h = owner->put(many);
  const auto t1 = std::chrono::steady_clock::now();
  Received r = consumer->get(h.ref());
  const auto t2 = std::chrono::steady_clock::now();
  ASSERT_EQ(r.tensors().size(), 65000u);
  for (size_t i = 0; i < 65000; i += 997) {
    ASSERT_EQ(*static_cast<const float*>(r.tensors()[i].data()), static_cast<float>(i)) << i;
  }
  std::printf("65000 tensors: two puts %.1f ms, the get %.1f ms\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count());
}

TEST_F(Transfer, AForkedChildCannotUseItsParentsAgent) {
  std::vector<float> x = iota_floats(4, 0.0f);
  ObjectHandle h = owner->put({TensorView(x)});
  const pid_t child = ::fork();
  if (child == 0) {
    int code = 0;
    try {
      owner->put({TensorView(x)});
      code = 1;
    } catch (const Error& e) {
      code = e.code() == ErrorCode::kInvalidUsage ? 0 : 2;
    }
    h.release();    // must not touch the parent's slot page
    owner.reset();  // nor join the parent's threads
    consumer.reset();
    ::_exit(code);
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(exit_status_within(child, 10s), 0) << "0: refused; 1: the child's put worked; 2: "
                                                  "another error; -1: it hung (killed)";
  // The parent's object is untouched by the child's release.
  EXPECT_EQ(as_floats(consumer->get(h.ref()).tensors()[0]), x);
}

// ---- custom transports ----

// A two-sided transport that sends each tensor in one call (the owner answers with the bytes).
class EchoTransport final : public TensorTransport {
 public:
  EchoTransport() = default;
  explicit EchoTransport(std::function<void()> on_destroy) : on_destroy_(std::move(on_destroy)) {}
  ~EchoTransport() override {
    if (on_destroy_) on_destroy_();
  }
  const char* name() const override { return "echo-test"; }
  TransportTraits traits() const override { return {false, false, false}; }
  Publication publish(const PublishRequest& request) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& v = published_[request.object.id];
    for (const TensorView& t : request.tensors) {
      v.emplace_back(static_cast<const char*>(t.data()), t.nbytes());
    }
    return {};
  }
  void unpublish(ObjectId object) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    published_.erase(object.id);
  }
  std::string answer(const std::string& request, const AgentIdentity&, std::vector<int>*) override {
    const auto space = request.find(' ');
    const uint64_t id = std::stoull(request.substr(0, space));
    const size_t index = std::stoul(request.substr(space + 1));
    std::lock_guard<std::mutex> lock(mutex_);
    return published_.at(id).at(index);
  }
  FetchResult fetch(const FetchRequest& request) override {
    for (size_t i = 0; i < request.targets.size(); ++i) {
      const std::string bytes =
          request.owner.call(std::to_string(request.ref.object().id) + " " + std::to_string(i));
      if (bytes.size() != request.targets[i].nbytes()) throw Error(ErrorCode::kInternal, "size");
      std::memcpy(request.targets[i].data(), bytes.data(), bytes.size());
    }
    return {};
  }

 private:
  std::function<void()> on_destroy_;
  std::mutex mutex_;
  std::map<uint64_t, std::vector<std::string>> published_;
};

TEST(TransferCustom, ARegisteredTransportCarriesObjects) {
  if (!is_registered_tensor_transport("echo-test")) {
    register_tensor_transport(
        "echo-test", [](const TransportContext&) { return std::make_unique<EchoTransport>(); });
  }
  expect_error(
      [] {
        register_tensor_transport(
            "ECHO-test", [](const TransportContext&) { return std::make_unique<EchoTransport>(); });
      },
      ErrorCode::kInvalidUsage);
  const auto names = registered_tensor_transports();
  EXPECT_NE(std::find(names.begin(), names.end(), "echo-test"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "shm"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "socket"), names.end());

  auto owner = TransferAgent::create({"owner"});
  auto consumer = TransferAgent::create({"consumer"});
  std::vector<int32_t> a = {1, 2, 3};
  std::vector<int32_t> b = {4, 5};
  PutOptions p;
  p.transport = "Echo-Test";
  p.expected_gets = 1;
  ObjectHandle h = owner->put({TensorView(a), TensorView(b)}, p);
  EXPECT_TRUE(h.ref().is_two_sided());
  const TensorRef ref = h.ref();
  h.release();
  Received r = consumer->get(ref);
  EXPECT_EQ(static_cast<const int32_t*>(r.tensors()[1].data())[1], 5);
  owner->wait_tensor_freed(TensorView(a), 5s);  // the expected get was counted
}

// An agent's end is over when its destructor returns: the threads that served its connections
// are joined, and its transports are destroyed on the caller's thread, not a moment later on a
// serving thread holding the agent's last reference, racing the process's exit (the ucx plugin's
// UCX cleaned up there is the likeliest cause of LeakSanitizer's exit check crashing in 1 CI run).
// That race is rare: before the joins this test passed 50 rounds of 50 here; it states the
// contract the joins now keep every time.
TEST(TransferCustom, AnAgentsTransportsGoWithItsDestructor) {
  static std::mutex mutex;
  static int destroyed = 0;
  static std::vector<std::thread::id> destroyed_on;
  if (!is_registered_tensor_transport("echo-end")) {
    register_tensor_transport("echo-end", [](const TransportContext&) {
      return std::make_unique<EchoTransport>([] {
        std::lock_guard<std::mutex> lock(mutex);
        ++destroyed;
        destroyed_on.push_back(std::this_thread::get_id());
      });
    });
  }
  {
    std::lock_guard<std::mutex> lock(mutex);  // a second run in this process counts from 0
    destroyed = 0;
    destroyed_on.clear();
  }
  std::vector<int32_t> a = {7, 8, 9};
  for (int round = 0; round < 10; ++round) {
    auto owner = TransferAgent::create({"owner"});
    auto consumer = TransferAgent::create({"consumer"});
    PutOptions p;
    p.transport = "echo-end";
    ObjectHandle h = owner->put({TensorView(a)}, p);
    {
      Received r = consumer->get(h.ref());  // answered on one of the owner's serving threads
      ASSERT_EQ(static_cast<const int32_t*>(r.tensors()[0].data())[2], 9);
    }
    h.release();
    consumer.reset();  // its connection's serving thread is ending now
    owner.reset();
    std::lock_guard<std::mutex> lock(mutex);
    ASSERT_EQ(destroyed, 2 * (round + 1))
        << "round " << round << ": a transport outlived its agent";
    for (const std::thread::id& id : destroyed_on) {
      ASSERT_EQ(id, std::this_thread::get_id()) << "round " << round;
    }
  }
}

// A transport registered with its TransportInfo: "auto" takes the available transport of highest
// priority that carries the tensors' device, and one that is not available (or carries another
// device, or has a negative priority) is passed over.
TEST(TransferCustom, AutoTakesTheAvailableTransportOfHighestPriorityForTheDevice) {
  static std::atomic<bool> up{false};
  TransportInfo info;
  info.name = "echo-auto";
  info.factory = [](const TransportContext&) { return std::make_unique<EchoTransport>(); };
  info.available = [] { return up.load(); };
  info.priority = 30;  // above shm's 20
  register_tensor_transport(info);
  TransportInfo never = info;  // a higher priority, but never "auto"
  never.name = "echo-never-auto";
  never.available = nullptr;
  never.priority = -1;
  register_tensor_transport(never);
  auto owner = TransferAgent::create({"owner"});
  std::vector<float> x = {1.0f, 2.0f};
  EXPECT_EQ(owner->put({TensorView(x)}).ref().transport(), "shm") << "echo-auto is not available";
  up = true;
  EXPECT_EQ(owner->put({TensorView(x)}).ref().transport(), "echo-auto");
  up = false;
  EXPECT_EQ(owner->put({TensorView(x)}).ref().transport(), "shm");
  // No transport carries CUDA tensors in this process (no GPU, no cuda_ipc): named, before I/O.
  const Error e = expect_error(
      [&] {
        owner->reserve({{DType::kFloat32, {4}, Device::cuda(0)}});
      },
      ErrorCode::kUnavailable);
  EXPECT_NE(std::string(e.what()).find("no available transport carries CUDA tensors"),
            std::string::npos)
      << e.what();
  // "auto" is reserved; a transport needs a name, a factory and devices.
  TransportInfo bad = info;
  bad.name = "AUTO";
  expect_error([&] { register_tensor_transport(bad); }, ErrorCode::kInvalidUsage);
  bad.name = "echo-no-devices";
  bad.devices.clear();
  expect_error([&] { register_tensor_transport(bad); }, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti
