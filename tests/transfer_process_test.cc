// The direct transport across real processes where one of them dies: a consumer killed while it
// borrows or copies (the owner reclaims at once), the owner killed while a consumer borrows or
// waits (the consumer hears of it at once, its views stay readable). The other side is
// tests/transfer_worker.cc.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include <sys/socket.h>
#include <sys/un.h>
#include <cstddef>
#include <cstring>
#include "test_util.h"
#include "transfer_many.h"
#include "tutti/transfer_agent.h"

extern char** environ;

namespace tutti {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A worker process; killed (SIGKILL) and reaped when the object goes.
class Worker {
 public:
  Worker(const std::string& mode, const std::string& dir) {
    std::vector<std::string> args = {TUTTI_TRANSFER_WORKER, mode, dir};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, TUTTI_TRANSFER_WORKER, nullptr, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
    }
  }
  ~Worker() { kill(); }
  pid_t pid() const { return pid_; }
  // Its exit status once it exited (within `limit`, else it is killed: -1).
  int wait(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    int status = 0;
    while (pid_ > 0 && Clock::now() < deadline) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill();
    return -1;
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

bool wait_file(const std::string& path, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

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

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// ---- the test process owns; a worker consumes and dies ----

class OwnerHere : public ::testing::Test {
 protected:
  void SetUp() override {
    TransferAgentOptions o;
    o.name = "owner";
    agent = TransferAgent::create(o);
    arena = agent->allocate((1 << 20) * sizeof(float), DType::kFloat32);
    float* p = static_cast<float*>(arena.data());
    for (int i = 0; i < (1 << 20); ++i) p[i] = static_cast<float>(i) * 0.5f;
    heap.resize(1 << 16);
    for (int i = 0; i < (1 << 16); ++i) heap[i] = 3 * i;
  }
  void publish(ObjectHandle& a, ObjectHandle& h) {
    a = agent->put({arena});
    h = agent->put({TensorView(heap)});
    write_file(dir.path() + "/ref.arena", a.ref().to_text());
    write_file(dir.path() + "/ref.heap", h.ref().to_text());
    write_file(dir.path() + "/ref.socket", h.ref().to_text());
    write_file(dir.path() + "/ref.reserved", h.ref().to_text());
    write_file(dir.path() + "/ready", "1");
  }
  // A worker that gets `t` over the agents' gloo group (rank 1; this agent owns, rank 0) until it
  // is killed, once it has got it once; `h` holds the object.
  std::unique_ptr<Worker> gloo_getter(const TensorView& t, ObjectHandle& h) {
    auto w = std::make_unique<Worker>("gloo-getloop", dir.path());
    if (w->pid() <= 0) return nullptr;
    GroupOptions go;
    go.store_url = "file://" + dir.path() + "/store";
    go.timeout = 30s;
    go.job_id = "rdt-worker";  // as the worker's
    agent->join_group("gloo", 2, 0, go);
    PutOptions gloo;
    gloo.transport = "gloo";
    h = agent->put({t}, gloo);
    write_file(dir.path() + "/ref.gloo", h.ref().to_text());
    write_file(dir.path() + "/ready", "1");
    if (!wait_file(dir.path() + "/getting", 30s)) return nullptr;
    return w;
  }
  testing::TempDir dir;
  std::shared_ptr<TransferAgent> agent;
  TensorView arena;
  std::vector<int32_t> heap;
};

TEST_F(OwnerHere, AConsumerKilledWhileBorrowingLeaksNothing) {
  ObjectHandle a, h;
  publish(a, h);
  Worker w("borrow", dir.path());
  ASSERT_GT(w.pid(), 0);
  ASSERT_TRUE(wait_file(dir.path() + "/borrowed", 30s)) << "the borrower never borrowed";
  a.release();
  // The borrow holds the object, and the owner says who holds it.
  try {
    agent->wait_tensor_freed(arena, 50ms);
    FAIL() << "freed under a borrow";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("leased by agent 'borrower' (pid " +
                                         std::to_string(w.pid()) + ")"),
              std::string::npos)
        << e.what();
  }
  const auto killed = Clock::now();
  w.kill();
  agent->wait_tensor_freed(arena, 5s);  // well before this: the death closes its connection
  std::printf("freed %.1f ms after the borrower's death\n", ms_since(killed));
  agent->deallocate(arena);
}

// 8 threads in each of 2 processes get and borrow the same objects at once (run under TSan in a
// sanitizer build); every byte is checked, and every hold is let go at the end.
TEST_F(OwnerHere, EightThreadsInTwoProcessesOverlapTheirGets) {
  ObjectHandle a, h;
  publish(a, h);
  Worker w1("threads", dir.path());
  Worker w2("threads", dir.path());
  EXPECT_EQ(w1.wait(std::chrono::seconds(240)), 0);
  EXPECT_EQ(w2.wait(std::chrono::seconds(240)), 0);
  a.release();
  h.release();
  agent->wait_tensor_freed(arena, 10s);
  agent->wait_tensor_freed(TensorView(heap), 10s);
}

TEST_F(OwnerHere, AConsumerKilledMidCopyLeaksNothing) {
  ObjectHandle a, h;
  publish(a, h);
  Worker w("getloop", dir.path());
  ASSERT_TRUE(wait_file(dir.path() + "/getting", 30s)) << "the getter never got";
  std::this_thread::sleep_for(20ms);  // kill it somewhere in the middle of its gets
  const auto killed = Clock::now();
  w.kill();
  h.release();
  agent->wait_tensor_freed(TensorView(heap), 5s);
  std::printf("freed %.1f ms after the getter's death\n", ms_since(killed));
}

// The worker gets the arena over the agents' gloo group (rank 1; this process owns, rank 0, and
// sends: on its serving thread, after its reply, once the pair has its group) and is killed
// amid its gets, at any point of one: before its request, between the owner's reply and its
// send, or while the bytes move. The owner's hold ends however (a send to a process that died
// fails as its connection goes), so the object is freed within seconds, not at the get's
// timeout, and the agent then ends at once.
TEST_F(OwnerHere, AConsumerKilledMidTwoSidedGetLetsTheObjectGo) {
  ObjectHandle g;
  auto w = gloo_getter(arena, g);
  ASSERT_TRUE(w) << "the getter did not start or never got";
  std::this_thread::sleep_for(20ms);  // some 10 gets of 4 MiB later
  const auto killed = Clock::now();
  w->kill();
  g.release();
  agent->wait_tensor_freed(arena, 10s);  // kTimeout while the owner's send still holds it
  std::printf("freed %.1f ms after the getter's death\n", ms_since(killed));
  const auto ending = Clock::now();
  agent.reset();
  EXPECT_LT(ms_since(ending), 5000.0);  // its serving threads were joined, none stuck in a send
}

// The worker, getting 256 MiB over the agents' gloo group (in the sanitizer runs too: with 128 a
// stop could come once the rest fitted the sockets' buffers), is stopped (SIGSTOP) in a get: the
// owner's send, on its serving thread, waits for a receiver that reads nothing (the sockets'
// buffers take some 36 MiB here: the object is larger by far). The worker checks each get's
// values between gets (long under ASan), so it is stopped, and let go again, until the owner says
// a transfer holds the object. That the send still holds it is then checked (the object, let go,
// is not freed within 100 ms). The owner's agent still ends at once: its stop ends the
// transports' transfers before it waits for its serving threads (it waited 5 s for them, then
// left the sending one running past its end: checked).
TEST_F(OwnerHere, AConsumerStoppedMidTwoSidedGetDoesNotHoldUpTheOwnersEnd) {
  std::vector<float> big(size_t{64} << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  ObjectHandle g;
  auto w = gloo_getter(TensorView(big), g);
  ASSERT_TRUE(w) << "the getter did not start or never got";
  auto in_transfer = [&] {  // what holds the object besides the handle, in the owner's words
    try {
      agent->wait_tensor_freed(TensorView(big), 1ms);
    } catch (const Error& e) {
      return std::string(e.what()).find("transfer(s)") != std::string::npos;
    }
    return false;
  };
  bool stopped_mid_get = false;
  int attempt = 0;
  for (; attempt < 50 && !stopped_mid_get; ++attempt) {
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(testing::stop_process(w->pid())) << "the getter did not stop";
    stopped_mid_get = in_transfer();
    if (!stopped_mid_get) ASSERT_EQ(::kill(w->pid(), SIGCONT), 0);
  }
  ASSERT_TRUE(stopped_mid_get) << "in 50 tries the getter was never stopped amid a get";
  std::printf("stopped amid a get at try %d\n", attempt);
  g.release();
  bool held = false;
  try {
    agent->wait_tensor_freed(TensorView(big), 100ms);
  } catch (const Error& e) {
    held = e.code() == ErrorCode::kTimeout;
  }
  EXPECT_TRUE(held) << "the getter stopped between sends: nothing held the owner's end";
  const auto ending = Clock::now();
  agent.reset();
  const double ms = ms_since(ending);
  std::printf("the owner's agent ended %.1f ms after its destruction began\n", ms);
  EXPECT_LT(ms, 2500.0);
}

// ---- a worker owns and dies; the test process consumes ----

class OwnerThere : public ::testing::Test {
 protected:
  void SetUp() override {
    TransferAgentOptions o;
    o.name = "consumer";
    agent = TransferAgent::create(o);
    owner = std::make_unique<Worker>("owner", dir.path());
    ASSERT_TRUE(wait_file(dir.path() + "/ready", 30s)) << "the owner never published";
  }
  TensorRef ref(const std::string& which) {
    return TensorRef::from_text(read_file(dir.path() + "/ref." + which));
  }
  testing::TempDir dir;
  std::shared_ptr<TransferAgent> agent;
  std::unique_ptr<Worker> owner;
};

TEST_F(OwnerThere, TheOwnersDeathFailsWaitingAndLaterGetsFastAndBorrowsStayReadable) {
  Borrowed b = agent->borrow(ref("arena"));
  Received before = agent->get(ref("heap"));
  EXPECT_EQ(static_cast<const int32_t*>(before.tensors()[0].data())[1000], 3000);
  // A get waiting for a reserved object the owner will never fulfil (60 s timeout).
  GetOptions patient;
  patient.timeout = 60s;
  Fetch waiting = agent->get_async(ref("reserved"), patient);
  std::this_thread::sleep_for(50ms);  // let it reach the owner (it fails either way)

  const auto killed = Clock::now();
  owner->kill();
  try {
    waiting.wait();
    FAIL() << "a get of a dead owner's object succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIoError) << e.what();
    EXPECT_NE(std::string(e.what()).find("owner-proc"), std::string::npos) << e.what();
  }
  std::printf("the waiting get failed %.1f ms after the owner's death\n", ms_since(killed));
  EXPECT_LT(ms_since(killed), 30000.0);  // not the 60 s timeout

  // Views of the dead owner's shared block stay readable.
  const float* p = static_cast<const float*>(b.tensors()[0].data());
  EXPECT_EQ(p[12345], 12345 * 0.5f);
  EXPECT_EQ(p[(1 << 20) - 1], ((1 << 20) - 1) * 0.5f);

  // New gets fail at once, saying the owner is gone.
  for (const char* which : {"heap", "arena", "socket"}) {
    try {
      agent->get(ref(which), patient);
      FAIL() << which;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIoError) << e.what();
      EXPECT_NE(std::string(e.what()).find("is gone"), std::string::npos) << e.what();
    }
  }
  b.release();
}

// An object of many small tensors from another process (ref.many, tests/transfer_many.h):
// ordinary memory read across processes, in slices the copy's threads share, and views of the
// owner's arena mapped, one overlapping another. Every tensor arrives whole and apart (a value
// written to each stays), with own buffers, copy-on-write, the caller's targets and a borrow.
TEST_F(OwnerThere, AnObjectOfManyTensorsArrivesWholeAndApart) {
  using namespace many;
  const TensorRef many = ref("many");
  ASSERT_EQ(many.tensors().size(), size_t{kManyHeap + kManyViews});
  // Each tensor's bytes as the owner wrote them, computed here.
  std::vector<std::vector<uint8_t>> expected;
  for (int i = 0; i < kManyHeap; ++i) {
    expected.emplace_back(many_heap_size(i));
    for (size_t k = 0; k < expected.back().size(); ++k) expected.back()[k] = many_byte(i, k);
  }
  for (int j = 0; j < kManyViews; ++j) {
    std::vector<float> v(kManyView);
    for (int64_t m = 0; m < kManyView; ++m)
      v[m] = static_cast<float>(many_view_first(j) + m) * 0.5f;
    const auto* bytes = reinterpret_cast<const uint8_t*>(v.data());
    expected.emplace_back(bytes, bytes + v.size() * sizeof(float));
  }
  // The first byte of `got` unlike `want`, or -1.
  auto first_unlike = [](const TensorView& got, const std::vector<uint8_t>& want) -> int64_t {
    const auto* p = static_cast<const uint8_t*>(got.data());
    if (want.empty() || std::memcmp(p, want.data(), want.size()) == 0) return -1;
    return std::mismatch(want.begin(), want.end(), p).first - want.begin();
  };
  auto check = [&](const std::vector<TensorView>& got, const char* how, bool apart) {
    ASSERT_EQ(got.size(), expected.size()) << how;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].nbytes(), expected[i].size()) << how << ", tensor " << i;
      ASSERT_EQ(first_unlike(got[i], expected[i]), -1) << how << ", tensor " << i;
    }
    if (!apart) return;
    // Apart: each tensor filled with a value of its own keeps it after all the others were.
    auto mark = [](size_t i) { return static_cast<uint8_t>(i * 37 + 1); };
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i].nbytes() > 0) std::memset(got[i].data(), mark(i), got[i].nbytes());
    }
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(first_unlike(got[i], std::vector<uint8_t>(got[i].nbytes(), mark(i))), -1)
          << how << ", tensor " << i;
    }
  };
  {
    const Received r = agent->get(many);
    check(r.tensors(), "own buffers", true);
  }
  {
    GetOptions cow;
    cow.copy_on_write = true;
    const Received r = agent->get(many, cow);
    check(r.tensors(), "copy-on-write", true);
  }
  {
    std::vector<std::vector<uint8_t>> into;
    GetOptions g;
    for (const TensorMeta& m : many.tensors()) {
      into.emplace_back(m.nbytes(), 0);
      g.targets.emplace_back(into.back().data(), m.dtype, m.shape, Device::cpu());
    }
    const Received r = agent->get(many, g);
    check(r.tensors(), "targets", true);
  }
  {
    // A borrow's views of the arena are the owner's memory, read-only: checked, not written.
    const Borrowed b = agent->borrow(many);
    check(b.tensors(), "borrow", false);
  }
  // The owner's memory is as it was.
  const Received again = agent->get(many);
  check(again.tensors(), "again", false);
}

// An owner whose listening socket's backlog is full (it is stopped, and raw connections fill
// it): a get keeps trying to connect until its timeout and says so (kTimeout). Before, the
// connect's EAGAIN was taken for "in progress", the unconnected socket returned, and the get
// failed at once with kIoError (ENOTCONN). After SIGCONT, with the backlog drained, gets work.
TEST_F(OwnerThere, AGetFacingAFullBacklogWaitsItsTimeoutNotFailsAtOnce) {
  const TensorRef heap = ref("heap");
  ASSERT_TRUE(testing::stop_process(owner->pid())) << "the owner did not stop";
  const std::string name = "tutti-agent/" + heap.owner().uuid_text();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: a leading NUL
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  std::vector<int> fillers;
  bool full = false;
  for (int i = 0; i < 4096 && !full; ++i) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      full = errno == EAGAIN;
      ::close(fd);
      ASSERT_TRUE(full) << std::strerror(errno);
    } else {
      fillers.push_back(fd);
    }
  }
  ASSERT_TRUE(full) << "the backlog never filled";
  GetOptions quick;
  quick.timeout = 300ms;
  const auto start = Clock::now();
  try {
    agent->get(heap, quick);
    FAIL() << "a get from a stopped owner succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  }
  EXPECT_GE(ms_since(start), 250.0);
  for (int fd : fillers) ::close(fd);
  ASSERT_EQ(::kill(owner->pid(), SIGCONT), 0);
  GetOptions patient;
  patient.timeout = 20s;
  Received after = agent->get(heap, patient);
  EXPECT_EQ(static_cast<const int32_t*>(after.tensors()[0].data())[1000], 3000);
}

TEST_F(OwnerThere, ARefNamingAReusedPidOrAStaleGenerationIsRefused) {
  const TensorRef good = ref("heap");
  // The same pid, another process start time: as if the owner died and its pid was reused.
  AgentIdentity reused = good.owner();
  reused.start_time += 1;
  reused.uuid[0] ^= 0xff;  // the dead agent's socket is gone too
  const TensorRef stale_pid(reused, good.object(), good.transport(), good.tensors(), good.places(),
                            good.blob(), false);
  try {
    agent->get(stale_pid);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIoError) << e.what();
    EXPECT_NE(std::string(e.what()).find("exited or died"), std::string::npos) << e.what();
  }
  ObjectId old = good.object();
  old.generation += 1;
  const TensorRef stale(good.owner(), old, good.transport(), good.tensors(), good.places(),
                        good.blob(), false);
  try {
    agent->get(stale);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage) << e.what();
  }
  // The real one still works.
  EXPECT_EQ(static_cast<const int32_t*>(agent->get(good).tensors()[0].data())[7], 21);
  write_file(dir.path() + "/done", "1");
}

// ---- an owner that exits as soon as its object is freed ----

// The owner expects one get, lets go of its handle, and exits the moment the object is freed:
// the get that freed it has its bytes and must succeed. The owner used to count the get, free
// the object and only then answer the count, so the get failed ("closed the connection") when
// the owner's exit won that race (seen in Examples.weight_sync under load). Twenty owners in a
// row.
TEST(OwnerExits, TheGetThatFreesTheObjectSucceeds) {
  TransferAgentOptions o;
  o.name = "last-consumer";
  auto agent = TransferAgent::create(o);
  for (int round = 0; round < 20; ++round) {
    testing::TempDir dir;
    Worker owner("owner-exits", dir.path());
    ASSERT_GT(owner.pid(), 0);
    ASSERT_TRUE(wait_file(dir.path() + "/ref.heap", 30s)) << "the owner never published";
    const TensorRef ref = TensorRef::from_text(read_file(dir.path() + "/ref.heap"));
    Received r = agent->get(ref);
    EXPECT_EQ(static_cast<const int32_t*>(r.tensors()[0].data())[1000], 3000) << "round " << round;
    EXPECT_EQ(owner.wait(30s), 0) << "round " << round;
  }
}

// ---- two-sided: the owner is stopped in the middle of a gloo get ----

// A "gloo-owner" worker (rank 0 of the agents' gloo group, working in `dir`) and this process's
// agent "gloo-consumer" as rank 1, once the worker has published its refs (`gloo`: on gloo).
class TwoSided : public ::testing::Test {
 protected:
  void SetUp() override {
    owner = std::make_unique<Worker>("gloo-owner", dir.path());
    ASSERT_GT(owner->pid(), 0);
    TransferAgentOptions o;
    o.name = "gloo-consumer";
    agent = TransferAgent::create(o);
    GroupOptions go;
    go.store_url = "file://" + dir.path() + "/store";
    go.timeout = 30s;
    go.job_id = "rdt-worker";  // as the worker's
    agent->join_group("gloo", 2, 1, go);
    ASSERT_TRUE(wait_file(dir.path() + "/ready", 30s)) << "the owner never published";
    gloo = TensorRef::from_text(read_file(dir.path() + "/ref.gloo"));
  }

  testing::TempDir dir;
  std::unique_ptr<Worker> owner;
  std::shared_ptr<TransferAgent> agent;
  TensorRef gloo;
};

// The worker owns (rank 0 of the agents' gloo group), this process consumes (rank 1). SIGSTOP
// the owner: a gloo get times out (kTimeout, not a hang), the group is aborted (later gloo gets
// fail with kAborted quoting the first failure), the shm transport keeps working (it needs
// nothing from the stopped owner), and after SIGCONT a reset of both sides heals the gloo group
// for the same refs.
TEST_F(TwoSided, TheOwnerStoppedDuringAGetAbortsOnlyItsGroupAndResetHeals) {
  const TensorRef arena = TensorRef::from_text(read_file(dir.path() + "/ref.arena"));
  auto heap_at = [](const Received& r, int i) {
    return static_cast<const int32_t*>(r.tensors()[0].data())[i];
  };
  auto arena_at = [](const Received& r, int i) {
    return static_cast<const float*>(r.tensors()[0].data())[i];
  };
  EXPECT_EQ(heap_at(agent->get(gloo), 1000), 3000);
  EXPECT_EQ(arena_at(agent->get(arena), 4321), 4321 * 0.5f);

  ASSERT_TRUE(testing::stop_process(owner->pid())) << "the owner did not stop";
  GetOptions quick;
  quick.timeout = 1500ms;
  const auto start = Clock::now();
  try {
    agent->get(gloo, quick);
    FAIL() << "a get from a stopped owner succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("gloo-owner"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gloo-consumer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(gloo)"), std::string::npos) << e.what();
  }
  EXPECT_LT(ms_since(start), 30000.0);  // a hang guard, not a timing
  try {
    agent->get(gloo, quick);
    FAIL() << "a get over an aborted group succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
    EXPECT_NE(std::string(e.what()).find("reset_transport('gloo')"), std::string::npos) << e.what();
  }
  // shm goes on while the owner is still stopped: the mapping and the lease need nothing of it.
  EXPECT_EQ(arena_at(agent->get(arena), 77777), 77777 * 0.5f);

  ASSERT_EQ(::kill(owner->pid(), SIGCONT), 0);
  write_file(dir.path() + "/reset", "1");
  agent->reset_transport("gloo");  // collective: the owner resets too
  EXPECT_EQ(heap_at(agent->get(gloo), 65535), 3 * 65535);
  EXPECT_EQ(agent->transport_group("gloo")->name(), "rdt.gloo#2");
  write_file(dir.path() + "/done", "1");
}

// The owner killed after its pair's group with the consumer exists: the next get fails with
// kIoError naming the owner (the agents' connection tells), not kTimeout at the get's 60 s.
TEST_F(TwoSided, TheOwnersDeathFailsTheNextGetAtOnce) {
  EXPECT_EQ(static_cast<const int32_t*>(agent->get(gloo).tensors()[0].data())[7], 21);
  owner->kill();
  GetOptions patient;
  patient.timeout = 60s;
  try {
    agent->get(gloo, patient);
    FAIL() << "a get from a dead owner succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIoError) << e.what();
    EXPECT_NE(std::string(e.what()).find("gloo-owner"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tutti
