// A process on one side of a direct-transport test (tests/transfer_process_test.cc and
// tests/netns_test.cc start it): the owner that publishes, or a consumer that borrows, gets in a
// loop, or fetches from another "host". Refs travel as text files in a shared directory.
//
//   transfer_worker owner <dir> [tcp-host]   publish, write <dir>/ref.*, wait for <dir>/done
//                                            (ref.many: the object transfer_many.h describes)
//   transfer_worker borrow <dir>             borrow ref.arena, write <dir>/borrowed, sleep
//   transfer_worker getloop <dir>            get ref.heap forever, write <dir>/getting
//   transfer_worker gloo-getloop <dir>       rank 1 of a gloo group (store <dir>/store): get
//                                            ref.gloo (floats, value i * 0.5) forever, write
//                                            <dir>/getting
//   transfer_worker fetch <dir> [ms]         from another host: shm refused, fallback (says
//                                            over which transport, and how long the first
//                                            took), socket; gets with timeout <ms> if given
//   transfer_worker threads <dir>           8 threads getting and borrowing ref.* at once
//   transfer_worker gloo-owner <dir>         rank 0 of a gloo group (store <dir>/store): put,
//                                            reset_transport when <dir>/reset appears
//   transfer_worker owner-exits <dir>        publish ref.heap for one get, exit once it is freed
//   transfer_worker ucx-threads <dir>        4 threads getting ref.ucx at once: their latency
//   transfer_worker ucx-loop <dir> <ms>      get ref.ucx_big over and over (timeout <ms> each)
//                                            until one fails; print how, and how long after
//                                            the last good one
//   transfer_worker socket-loop <dir> <ms>   the same with ref.big (16 MiB over "socket")
// With TUTTI_RDT_GROUP_STORE set, owner (rank 0) and fetch (rank 1) also join a gloo group
// through that store and move ref.gloo over it. Where the ucx plugin is loaded (TUTTI_PLUGINS),
// the owner also publishes over "ucx": ref.ucx (the heap), ref.ucx_views (1000 views of the
// arena, one registration) and ref.ucx_big (64 MiB); fetch gets the first two.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "transfer_many.h"
#include "tutti/tensor_transport.h"
#include "tutti/transfer_agent.h"

using namespace tutti;
using namespace std::chrono_literals;

namespace {

using namespace tutti::many;

constexpr int64_t kArena = 1 << 20;      // floats: value i * 0.5
constexpr int64_t kHeap = 1 << 16;       // int32: value 3 * i
constexpr int64_t kBigSocket = 4 << 20;  // floats: 2.5 (ref.big)
constexpr int64_t kBigUcx = 16 << 20;    // floats: 2.5 (ref.ucx_big)

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::rename(tmp.c_str(), path.c_str());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The test that started this worker (posix_spawn, or `ip netns exec` and `env`, which exec):
// once it is gone (it crashed or was killed, and this process was handed to another parent)
// nobody will write the files the worker waits for. A worker orphaned before it read its parent
// is taken as gone where orphans go to pid 1; under a subreaper it waits out its limits.
const pid_t test_process = ::getppid();

bool test_alive() {
  return ::getppid() == test_process && test_process != 1;
}

// False at the limit, or at once when the test is gone.
bool wait_file(const std::string& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline && test_alive()) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

bool arena_ok(const TensorView& t) {
  const float* p = static_cast<const float*>(t.data());
  if (t.numel() != kArena) return false;
  for (int64_t i = 0; i < kArena; i += 997) {
    if (p[i] != static_cast<float>(i) * 0.5f) return false;
  }
  return p[kArena - 1] == static_cast<float>(kArena - 1) * 0.5f;
}

// Floats of value i * 0.5, of any length (past 2^24 of them rounded, the same way on both sides).
bool halves_ok(const TensorView& t) {
  const float* p = static_cast<const float*>(t.data());
  for (int64_t i = 0; i < t.numel(); i += 997) {
    if (p[i] != static_cast<float>(i) * 0.5f) return false;
  }
  return t.numel() > 0 && p[t.numel() - 1] == static_cast<float>(t.numel() - 1) * 0.5f;
}

bool heap_ok(const TensorView& t) {
  const int32_t* p = static_cast<const int32_t*>(t.data());
  if (t.numel() != kHeap) return false;
  for (int64_t i = 0; i < kHeap; ++i) {
    if (p[i] != 3 * i) return false;
  }
  return true;
}

std::shared_ptr<TransferAgent> agent(const std::string& name, const std::string& tcp = "") {
  TransferAgentOptions o;
  o.name = name;
  o.listen_tcp = !tcp.empty();
  o.tcp_host = tcp;
  return TransferAgent::create(o);
}

GroupOptions group_options(const std::string& url) {
  GroupOptions go;
  go.store_url = url;
  go.timeout = 30s;
  go.job_id = "rdt-worker";
  return go;
}

int owner(const std::string& dir, const std::string& tcp) {
  // The memory the objects publish outlives the agent (declared first, destroyed last): a get
  // still being answered when the consumer says done (one it gave up on) reads it until the
  // agent's destructor has joined its serving threads. Declared after the agent, the vectors went
  // first, and ASan caught a serving thread's send reading freed memory.
  std::vector<int32_t> heap(kHeap);
  std::vector<float> tiny = {1.5f, 2.5f};  // 8 bytes: the answer's payload is one small write
  std::vector<float> big_socket(kBigSocket, 2.5f);
  std::vector<float> big;
  std::vector<std::vector<uint8_t>> many_heap;  // ref.many's ordinary tensors
  auto a = agent("owner-proc", tcp);
  const char* group_store = std::getenv("TUTTI_RDT_GROUP_STORE");
  if (group_store != nullptr) a->join_group("gloo", 2, 0, group_options(group_store));
  TensorView arena = a->allocate(kArena * sizeof(float), DType::kFloat32);
  float* ap = static_cast<float*>(arena.data());
  for (int64_t i = 0; i < kArena; ++i) ap[i] = static_cast<float>(i) * 0.5f;
  for (int64_t i = 0; i < kHeap; ++i) heap[i] = static_cast<int32_t>(3 * i);
  ObjectHandle h_arena = a->put({arena});
  ObjectHandle h_heap = a->put({TensorView(heap)});
  PutOptions socket;
  socket.transport = "socket";
  ObjectHandle h_socket = a->put({TensorView(heap)}, socket);
  ObjectHandle h_tiny = a->put({TensorView(tiny)}, socket);
  ObjectHandle h_big = a->put({TensorView(big_socket)}, socket);
  ObjectHandle h_reserved = a->reserve({{DType::kFloat32, {4}, Device::cpu()}});
  // ref.many: kManyHeap ordinary tensors (many_byte; every 7th empty) and kManyViews views of the
  // arena, the last overlapping the one before it (many_view_first).
  std::vector<TensorView> many;
  for (int i = 0; i < kManyHeap; ++i) {
    many_heap.emplace_back(many_heap_size(i));
    for (size_t k = 0; k < many_heap.back().size(); ++k) many_heap.back()[k] = many_byte(i, k);
    many.emplace_back(many_heap.back());
  }
  for (int j = 0; j < kManyViews; ++j) many.push_back(arena.slice(many_view_first(j), kManyView));
  ObjectHandle h_many = a->put(many);
  ObjectHandle h_gloo;
  if (group_store != nullptr) {
    PutOptions gloo;
    gloo.transport = "gloo";
    h_gloo = a->put({TensorView(heap)}, gloo);
    write_file(dir + "/ref.gloo", h_gloo.ref().to_text());
  }
  ObjectHandle h_ucx, h_ucx_views, h_ucx_big;
  if (is_registered_tensor_transport("ucx")) {
    PutOptions ucx;
    ucx.transport = "ucx";
    h_ucx = a->put({TensorView(heap)}, ucx);
    std::vector<TensorView> views;
    for (int64_t i = 0; i < 1000; ++i) views.push_back(arena.slice(i * 1000, 1000));
    h_ucx_views = a->put(views, ucx);
    big.assign(kBigUcx, 2.5f);
    h_ucx_big = a->put({TensorView(big)}, ucx);
    write_file(dir + "/ref.ucx", h_ucx.ref().to_text());
    write_file(dir + "/ref.ucx_views", h_ucx_views.ref().to_text());
    write_file(dir + "/ref.ucx_big", h_ucx_big.ref().to_text());
  }
  write_file(dir + "/ref.arena", h_arena.ref().to_text());
  write_file(dir + "/ref.heap", h_heap.ref().to_text());
  write_file(dir + "/ref.socket", h_socket.ref().to_text());
  write_file(dir + "/ref.tiny", h_tiny.ref().to_text());
  write_file(dir + "/ref.big", h_big.ref().to_text());
  write_file(dir + "/ref.reserved", h_reserved.ref().to_text());
  write_file(dir + "/ref.many", h_many.ref().to_text());
  write_file(dir + "/ready", std::to_string(::getpid()));
  return wait_file(dir + "/done", 120s) ? 0 : 2;
}

TensorRef ref_from(const std::string& dir, const std::string& which) {
  if (!wait_file(dir + "/ready", 60s)) {
    std::fprintf(stderr, "no owner appeared in %s\n", dir.c_str());
    std::exit(2);
  }
  return TensorRef::from_text(read_file(dir + "/ref." + which));
}

int borrow(const std::string& dir) {
  auto a = agent("borrower");
  Borrowed b = a->borrow(ref_from(dir, "arena"));
  if (!arena_ok(b.tensors()[0])) return 3;
  write_file(dir + "/borrowed", "1");
  wait_file(dir + "/never", 120s);  // until killed, or the test is gone
  return 0;
}

int getloop(const std::string& dir) {
  auto a = agent("getter");
  const TensorRef ref = ref_from(dir, "heap");
  for (long i = 0;; ++i) {
    Received r = a->get(ref);
    if (!heap_ok(r.tensors()[0])) return 3;
    if (i == 0) write_file(dir + "/getting", "1");
  }
}

int gloo_getloop(const std::string& dir) {
  auto a = agent("gloo-getter");
  a->join_group("gloo", 2, 1, group_options("file://" + dir + "/store"));
  const TensorRef ref = ref_from(dir, "gloo");
  for (long i = 0;; ++i) {
    Received r = a->get(ref);
    if (!halves_ok(r.tensors()[0])) return 3;
    if (i == 0) write_file(dir + "/getting", "1");
  }
}

// Puts the heap expecting one get, lets go of the handle, and exits the moment the object is
// freed, as a program whose last step that was.
int owner_exits(const std::string& dir) {
  auto a = agent("owner-exits");
  std::vector<int32_t> heap(kHeap);
  for (int64_t i = 0; i < kHeap; ++i) heap[i] = static_cast<int32_t>(3 * i);
  PutOptions once;
  once.expected_gets = 1;
  ObjectHandle h = a->put({TensorView(heap)}, once);
  write_file(dir + "/ref.heap", h.ref().to_text());
  h.release();
  a->wait_tensor_freed(TensorView(heap), 30s);
  std::_Exit(0);
}

int gloo_owner(const std::string& dir) {
  std::vector<int32_t> heap(kHeap);  // outlives the agent, as in owner()
  auto a = agent("gloo-owner");
  a->join_group("gloo", 2, 0, group_options("file://" + dir + "/store"));
  TensorView arena = a->allocate(kArena * sizeof(float), DType::kFloat32);
  float* ap = static_cast<float*>(arena.data());
  for (int64_t i = 0; i < kArena; ++i) ap[i] = static_cast<float>(i) * 0.5f;
  for (int64_t i = 0; i < kHeap; ++i) heap[i] = static_cast<int32_t>(3 * i);
  PutOptions gloo;
  gloo.transport = "gloo";
  ObjectHandle h_arena = a->put({arena});
  ObjectHandle h_gloo = a->put({TensorView(heap)}, gloo);
  write_file(dir + "/ref.arena", h_arena.ref().to_text());
  write_file(dir + "/ref.gloo", h_gloo.ref().to_text());
  write_file(dir + "/ready", std::to_string(::getpid()));
  if (!wait_file(dir + "/reset", 120s)) return 2;
  a->reset_transport("gloo");
  return wait_file(dir + "/done", 120s) ? 0 : 2;
}

// 8 threads, each getting and borrowing the owner's objects (the same ones at once), checking
// every byte read; exit status 0 when all were right.
int threads(const std::string& dir) {
  auto a = agent("threads-" + std::to_string(::getpid()));
  const TensorRef arena = ref_from(dir, "arena");
  const TensorRef heap = ref_from(dir, "heap");
  const TensorRef socket = ref_from(dir, "socket");
  std::atomic<int> wrong{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) {
    pool.emplace_back([&, t] {
      std::vector<float> into(kArena);
      GetOptions g;
      g.targets = {TensorView(into)};
      for (int i = 0; i < 60; ++i) {
        switch ((i + t) % 4) {
          case 0: {
            Borrowed b = a->borrow(arena);
            if (!arena_ok(b.tensors()[0])) ++wrong;
            break;
          }
          case 1:
            a->get(arena, g);
            if (!arena_ok(g.targets[0])) ++wrong;
            break;
          case 2:
            if (!heap_ok(a->get(heap).tensors()[0])) ++wrong;
            break;
          default:
            if (!heap_ok(a->get(socket).tensors()[0])) ++wrong;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  std::printf("threads: %d wrong\n", wrong.load());
  return wrong.load() == 0 ? 0 : 3;
}

int fetch(const std::string& dir, std::chrono::milliseconds timeout) {
  auto a = agent("remote");
  GetOptions timed;
  timed.timeout = timeout;
  const char* group_store = std::getenv("TUTTI_RDT_GROUP_STORE");
  if (group_store != nullptr) a->join_group("gloo", 2, 1, group_options(group_store));
  const TensorRef arena = ref_from(dir, "arena");
  int rc = 0;
  try {
    a->get(arena);
    std::printf("shm: unexpectedly worked\n");
    rc = 4;
  } catch (const Error& e) {
    std::printf("shm: code %d: %s\n", static_cast<int>(e.code()), e.what());
  }
  GetOptions fallback = timed;
  fallback.allow_fallback = true;
  {
    // The owner's stream, or (both agents with ucx) the owner publishing it on ucx when asked;
    // the second get takes the same publication, the borrow a copy of it.
    const auto start = std::chrono::steady_clock::now();
    const Received first = a->get(arena, fallback);
    std::printf("fallback first get: %lld ms\n",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - start)
                                           .count()));
    const Received again = a->get(arena, fallback);
    const bool ok = arena_ok(first.tensors()[0]) && arena_ok(again.tensors()[0]) &&
                    arena_ok(a->borrow(arena, fallback).tensors()[0]);
    std::printf("fallback: %s (%s, then %s)\n", ok ? "ok" : "WRONG", first.transport().c_str(),
                again.transport().c_str());
  }
  std::printf("socket: %s\n",
              heap_ok(a->get(ref_from(dir, "socket")).tensors()[0]) ? "ok" : "WRONG");
  {
    // Warm gets of an 8-byte object over TCP: each must take network time, not a delayed ACK's
    // 40 ms (an owner's answer in two writes without TCP_NODELAY waited for one every time).
    const TensorRef tiny = ref_from(dir, "tiny");
    std::vector<double> us;
    for (int i = 0; i < 15; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const Received got = a->get(tiny);
      if (static_cast<const float*>(got.tensors()[0].data())[1] != 2.5f) return 5;
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::sort(us.begin(), us.end());
    std::printf("socket warm get median: %.0f us\n", us[us.size() / 2]);
  }
  if (group_store != nullptr) {
    std::printf("gloo: %s\n", heap_ok(a->get(ref_from(dir, "gloo")).tensors()[0]) ? "ok" : "WRONG");
  }
  if (::access((dir + "/ref.ucx").c_str(), F_OK) == 0) {
    try {
      std::printf("ucx: %s\n",
                  heap_ok(a->get(ref_from(dir, "ucx"), timed).tensors()[0]) ? "ok" : "WRONG");
      const Received views = a->get(ref_from(dir, "ucx_views"), timed);
      bool ok = views.tensors().size() == 1000;
      for (size_t i = 0; ok && i < views.tensors().size(); ++i) {
        const float* p = static_cast<const float*>(views.tensors()[i].data());
        ok = p[0] == static_cast<float>(i * 1000) * 0.5f &&
             p[999] == static_cast<float>(i * 1000 + 999) * 0.5f;
      }
      std::printf("ucx views: %s\n", ok ? "ok" : "WRONG");
    } catch (const Error& e) {
      std::printf("ucx: failed, code %d: %s\n", static_cast<int>(e.code()), e.what());
    }
  }
  std::fflush(stdout);
  write_file(dir + "/done", "1");
  return rc;
}

// Gets a big object (ref.<which>, `count` floats of 2.5) until a get fails: prints the error's
// code and words, and how long after the start of the failed get it came.
int get_loop(const std::string& dir, long timeout_ms, const std::string& which, int64_t count) {
  auto a = agent(which + "-loop");
  const TensorRef ref = ref_from(dir, which);
  std::vector<float> into(count);
  GetOptions g;
  g.targets = {TensorView(into)};
  g.timeout = std::chrono::milliseconds(timeout_ms);
  for (long i = 0;; ++i) {
    const auto start = std::chrono::steady_clock::now();
    try {
      a->get(ref, g);
      if (into[0] != 2.5f || into[count - 1] != 2.5f) return 3;
      if (i == 0) write_file(dir + "/getting", "1");
    } catch (const Error& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      std::printf("%s loop: get %ld failed after %lld ms, code %d (%s): %s\n", which.c_str(), i,
                  static_cast<long long>(ms), static_cast<int>(e.code()), to_string(e.code()),
                  e.what());
      std::fflush(stdout);
      return 0;
    }
  }
}

// 4 threads, each getting ref.ucx (256 KiB) 100 times into its own buffer, at once: the
// latency of a get beside others (the ucx plugin's fetches share one worker: one asleep on its
// events must not wait out its sleep while another's progress completes its gets).
int ucx_threads(const std::string& dir) {
  auto a = agent("ucx-threads");
  const TensorRef ref = ref_from(dir, "ucx");
  a->get(ref);  // the endpoint, the remote key
  constexpr int kThreads = 4, kGets = 100;
  std::vector<std::vector<double>> us(kThreads);
  std::atomic<int> wrong{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<int32_t> into(kHeap);
      GetOptions g;
      g.targets = {TensorView(into)};
      for (int i = 0; i < kGets; ++i) {
        const auto start = std::chrono::steady_clock::now();
        a->get(ref, g);
        us[t].push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
        if (!heap_ok(g.targets[0])) ++wrong;
      }
    });
  }
  for (auto& th : pool) th.join();
  std::vector<double> all;
  for (const auto& v : us) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  std::printf("ucx threads: %zu gets, median %.0f us, p90 %.0f us, max %.0f us, %d wrong\n",
              all.size(), all[all.size() / 2], all[all.size() * 9 / 10], all.back(), wrong.load());
  std::fflush(stdout);
  write_file(dir + "/done", "1");
  return wrong.load() == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: transfer_worker owner|borrow|getloop|gloo-getloop|fetch <dir> [tcp-host]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const std::string dir = argv[2];
  try {
    if (mode == "owner") return owner(dir, argc > 3 ? argv[3] : "");
    if (mode == "borrow") return borrow(dir);
    if (mode == "getloop") return getloop(dir);
    if (mode == "gloo-getloop") return gloo_getloop(dir);
    if (mode == "fetch") {
      return fetch(dir, std::chrono::milliseconds(argc > 3 ? std::atol(argv[3]) : 0));
    }
    if (mode == "gloo-owner") return gloo_owner(dir);
    if (mode == "owner-exits") return owner_exits(dir);
    if (mode == "threads") return threads(dir);
    if (mode == "ucx-threads") return ucx_threads(dir);
    if (mode == "ucx-loop") {
      return get_loop(dir, argc > 3 ? std::atol(argv[3]) : 10000, "ucx_big", kBigUcx);
    }
    if (mode == "socket-loop") {
      return get_loop(dir, argc > 3 ? std::atol(argv[3]) : 10000, "big", kBigSocket);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transfer_worker %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
