// The TCP store's server survives broken, hostile and slow clients, and keeps serving a good
// client through each; secrets, hosting and URLs.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "test_util.h"

extern char** environ;

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

// Protocol version 2's server hello: magic, version, server id, idle timeout, largest message,
// nonce.
constexpr size_t kServerHelloBytes = 4 + 2 + 8 + 4 + 4 + 16;

// A raw socket to the server, for sending what no real client would.
class RawClient {
 public:
  explicit RawClient(uint16_t port) : RawClient(::socket(AF_INET, SOCK_STREAM, 0), port) {}
  // Connects a socket made earlier.
  RawClient(int fd, uint16_t port) {
    fd_ = fd;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      throw std::runtime_error("connect failed");
    }
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawClient() { ::close(fd_); }
  // Never raises SIGPIPE: the server may close the connection while bytes are still going.
  void send(const std::string& bytes) {
    (void)!::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // True when the server closes the connection before sending anything (within 5 s).
  bool closed_at_once() {
    char c;
    return ::read(fd_, &c, 1) == 0;
  }
  // Reads until the server closes (returns true) or 5 s pass (false).
  bool closed_by_server() {
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n == 0) return true;
      if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
    }
  }
  // The server's hello followed by a well-formed client hello without a secret.
  void handshake() {
    char hello[kServerHelloBytes];
    ASSERT_TRUE(read_exactly(hello, sizeof(hello)));
    std::string mine(4 + 2 + 32, '\0');
    std::memcpy(mine.data(), hello, 6);  // echo magic and version
    send(mine);
    char status = 1;
    ASSERT_EQ(::read(fd_, &status, 1), 1);
    ASSERT_EQ(status, 0);
  }
  // Reads exactly n bytes; false on end of file, error or the 5 s receive timeout.
  bool read_exactly(char* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd_, out + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

class TCPStoreRobustness : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TCPStoreServer>("127.0.0.1", 0);
    good_ = std::make_unique<TCPStore>("127.0.0.1", server_->port());
    good_->set("before", "1");
  }
  // A good client is still served, including a wait that another client completes.
  void ExpectStillServing() {
    EXPECT_EQ(good_->get("before"), "1");
    TCPStore other("127.0.0.1", server_->port());
    std::thread t([&] { other.set("after", "2"); });
    good_->wait({"after"}, milliseconds(5000));
    t.join();
    EXPECT_EQ(good_->add("n", 3), 3);
  }
  std::unique_ptr<TCPStoreServer> server_;
  std::unique_ptr<TCPStore> good_;
};

TEST_F(TCPStoreRobustness, RandomBytes) {
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    RawClient c(server_->port());
    std::string junk(1 + rng() % 300, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    c.send(junk);
  }
  ExpectStillServing();
}

TEST_F(TCPStoreRobustness, WrongMagicIsRefused) {
  RawClient c(server_->port());
  c.send(std::string(38, 'x'));
  EXPECT_TRUE(c.closed_by_server());
  ExpectStillServing();
}

TEST_F(TCPStoreRobustness, HugeLengthFieldClosesOnlyThatConnection) {
  RawClient c(server_->port());
  c.handshake();
  const uint32_t huge = 0xfffffff0u;
  c.send(std::string(reinterpret_cast<const char*>(&huge), 4));
  EXPECT_TRUE(c.closed_by_server());
  ExpectStillServing();
}

TEST_F(TCPStoreRobustness, HugeStringLengthInsideAMessage) {
  RawClient c(server_->port());
  c.handshake();
  // A set whose key claims 2^31 bytes inside a 9-byte body.
  std::string body;
  body.push_back(1);
  const uint32_t claimed = 0x80000000u;
  body.append(reinterpret_cast<const char*>(&claimed), 4);
  body.append("abcd");
  const uint32_t n = static_cast<uint32_t>(body.size());
  c.send(std::string(reinterpret_cast<const char*>(&n), 4) + body);
  EXPECT_TRUE(c.closed_by_server());
  ExpectStillServing();
}

TEST_F(TCPStoreRobustness, HalfSentMessageDoesNotBlockOthers) {
  RawClient c(server_->port());
  c.handshake();
  const uint32_t n = 100;
  c.send(std::string(reinterpret_cast<const char*>(&n), 4) + "only-part");
  ExpectStillServing();  // served while the half message is pending
}

TEST_F(TCPStoreRobustness, ClientThatStopsReading) {
  RawClient c(server_->port());
  c.handshake();
  // Many gets of a large value, never reading the answers.
  good_->set("big", std::string(1 << 20, 'b'));
  std::string get;
  get.push_back(2);
  const uint32_t klen = 3;
  get.append(reinterpret_cast<const char*>(&klen), 4);
  get.append("big");
  const uint32_t n = static_cast<uint32_t>(get.size());
  const std::string framed = std::string(reinterpret_cast<const char*>(&n), 4) + get;
  for (int i = 0; i < 64; ++i) c.send(framed);
  ExpectStillServing();
}

TEST_F(TCPStoreRobustness, IdleClientInALongWaitIsLegitimate) {
  TCPStore waiter("127.0.0.1", server_->port());
  std::thread t([&] { waiter.wait({"eventually"}, milliseconds(20000)); });
  ExpectStillServing();
  good_->set("eventually", "now");
  t.join();
}

// --- The server's limits: descriptors, connections, idleness, memory. ---

// A framed request: length, then body.
std::string framed(const std::string& body) {
  const uint32_t n = static_cast<uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + body;
}

// A wait request for one key, as the protocol spells it.
std::string wait_request(const std::string& key, int64_t timeout_ms) {
  std::string body(1, '\x05');
  body.append(reinterpret_cast<const char*>(&timeout_ms), 8);
  const uint32_t count = 1, klen = static_cast<uint32_t>(key.size());
  body.append(reinterpret_cast<const char*>(&count), 4);
  body.append(reinterpret_cast<const char*>(&klen), 4);
  return framed(body + key);
}

// A wait request for several keys.
std::string wait_request(const std::vector<std::string>& keys, int64_t timeout_ms) {
  std::string body(1, '\x05');
  body.append(reinterpret_cast<const char*>(&timeout_ms), 8);
  const uint32_t count = static_cast<uint32_t>(keys.size());
  body.append(reinterpret_cast<const char*>(&count), 4);
  for (const auto& key : keys) {
    const uint32_t klen = static_cast<uint32_t>(key.size());
    body.append(reinterpret_cast<const char*>(&klen), 4);
    body += key;
  }
  return framed(body);
}

long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

int open_fds() {
  int n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
  ::closedir(dir);
  return n - 1;  // the directory's own descriptor
}

// Polls pred for up to 10 s; true once it holds.
bool eventually(const std::function<bool()>& pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// Sends this process's stderr to a file while it lives.
class CapturedStderr {
 public:
  explicit CapturedStderr(std::string path) : path_(std::move(path)) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CapturedStderr() { restore(); }
  // Restores stderr and returns what was written meanwhile.
  std::string restore() {
    if (saved_ >= 0) {
      std::fflush(stderr);
      ::dup2(saved_, 2);
      ::close(saved_);
      saved_ = -1;
    }
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string path_;
  int saved_ = -1;
};

size_t count_lines_with(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

TEST(TCPStoreServerLimits, OutOfDescriptorsPausesAcceptingAndWarnsOnce) {
  TCPStoreServer server("127.0.0.1", 0);
  TempDir dir;
  CapturedStderr captured(dir.path() + "/stderr");
  // Sockets made while descriptors are plenty; connected once the server has but 5 left, so
  // that connections wait in its queue while accept() fails with EMFILE.
  std::vector<int> sockets(40);
  for (auto& fd : sockets) fd = ::socket(AF_INET, SOCK_STREAM, 0);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(open_fds() + 5);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int fd : sockets) clients.push_back(std::make_unique<RawClient>(fd, server.port()));
  const bool failed = eventually([&] { return server.stats().accept_errors > 0; });
  // One second of it: a server that retried at once would fail hundreds of thousands of times
  // and use a whole core.
  const uint64_t errors_before = server.stats().accept_errors;
  const double cpu_before = cpu_seconds();
  std::this_thread::sleep_for(milliseconds(1000));
  const uint64_t errors_in_a_second = server.stats().accept_errors - errors_before;
  const double cpu_in_a_second = cpu_seconds() - cpu_before;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  const std::string log = captured.restore();
  ASSERT_TRUE(failed) << "accept() never failed";
  EXPECT_LE(errors_in_a_second, 20u);
  EXPECT_LT(cpu_in_a_second, 0.5);
  EXPECT_EQ(count_lines_with(log, "accept failed"), 1u) << log;
  EXPECT_NE(log.find("Too many open files"), std::string::npos) << log;
  // Descriptors back: the queued connections are served, and so is a new client.
  clients.clear();
  TCPStoreOptions o;
  o.timeout = milliseconds(10000);
  TCPStore good("127.0.0.1", server.port(), o);
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
}

TEST(TCPStoreServerLimits, ConnectionCapClosesTheExtraConnectionAtOnce) {
  TCPStoreServerOptions options;
  options.max_connections = 3;
  TCPStoreServer server("127.0.0.1", 0, options);
  std::vector<std::unique_ptr<TCPStore>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<TCPStore>("127.0.0.1", server.port()));
    clients.back()->set("k" + std::to_string(i), "v");
  }
  RawClient extra(server.port());
  EXPECT_TRUE(extra.closed_at_once());
  EXPECT_GE(server.stats().refused_connections, 1u);
  EXPECT_EQ(server.stats().connections, 3u);
  TCPStoreOptions quick;
  quick.timeout = milliseconds(500);
  EXPECT_TUTTI_ERROR(TCPStore("127.0.0.1", server.port(), quick).get("k0"), ErrorCode::kTimeout,
                     "could not connect");
  clients.pop_back();  // a place frees; a client retrying gets it
  TCPStore late("127.0.0.1", server.port());
  EXPECT_EQ(late.get("k0"), "v");
}

TEST(TCPStoreServerLimits, IdleConnectionsAreClosedWaitingOnesAreNot) {
  TCPStoreServerOptions options;
  options.idle_timeout = milliseconds(300);
  TCPStoreServer server("127.0.0.1", 0, options);
  RawClient idle(server.port());
  idle.handshake();
  RawClient waiter(server.port());
  waiter.handshake();
  waiter.send(wait_request("late", 20000));
  ASSERT_TRUE(eventually([&] { return server.stats().waiting == 1; }));
  EXPECT_TRUE(idle.closed_by_server());
  EXPECT_GE(server.stats().idle_closed, 1u);
  std::this_thread::sleep_for(milliseconds(900));  // three idle timeouts: a wait is not idle
  TCPStore setter("127.0.0.1", server.port());
  setter.set("late", "now");
  char response[5];
  ASSERT_TRUE(waiter.read_exactly(response, 5));  // length 1, status kOk
  EXPECT_EQ(response[4], 0);
}

// A wait keeps only the keys it still misses, each once, and their bytes count against
// max_buffered_bytes as a message's do: a present key listed 10,000 times costs nothing, and
// waits whose keys would pass the cap are refused (their connections closed) rather than held.
TEST(TCPStoreServerLimits, AWaitsKeysAreCountedOnceAndAgainstTheBufferCap) {
  TCPStoreServerOptions options;
  options.max_buffered_bytes = 1000000;
  TCPStoreServer server("127.0.0.1", 0, options);
  TCPStore setter("127.0.0.1", server.port());
  setter.set("here", "1");
  RawClient repeats(server.port());
  repeats.handshake();
  std::vector<std::string> keys(10000, "here");
  keys.push_back("missing");
  repeats.send(wait_request(keys, 20000));
  ASSERT_TRUE(eventually([&] { return server.stats().waiting == 1; }));
  EXPECT_EQ(server.stats().buffered_bytes, std::string("missing").size());
  // Waits of 300,000 bytes of keys each: three fit the cap with the first, a fourth does not.
  std::vector<std::unique_ptr<RawClient>> big;
  for (int c = 0; c < 4; ++c) {
    big.push_back(std::make_unique<RawClient>(server.port()));
    big.back()->handshake();
    std::vector<std::string> mine;
    for (int k = 0; k < 5; ++k) mine.push_back(std::string(60000 - 1, 'a' + c) + char('0' + k));
    big.back()->send(wait_request(mine, 20000));
    if (c < 3) ASSERT_TRUE(eventually([&] { return server.stats().waiting == size_t(c) + 2; }));
  }
  EXPECT_TRUE(big[3]->closed_by_server());
  EXPECT_EQ(server.stats().waiting, 4u);
  // (The refused message's bytes go back just after its connection closes.)
  const size_t held = 3 * 300000 + std::string("missing").size();
  EXPECT_TRUE(eventually([&] { return server.stats().buffered_bytes == held; }))
      << server.stats().buffered_bytes << " bytes held, not " << held;
  big.clear();  // their connections close: their keys' bytes go back
  ASSERT_TRUE(eventually([&] { return server.stats().waiting == 1; }));
  EXPECT_EQ(server.stats().buffered_bytes, std::string("missing").size());
  setter.set("missing", "now");
  char response[5];
  ASSERT_TRUE(repeats.read_exactly(response, 5));  // length 1, status kOk
  EXPECT_EQ(response[4], 0);
  EXPECT_TRUE(eventually([&] { return server.stats().buffered_bytes == 0; }));
}

// An idle timeout of milliseconds::max() means "never" (its nanoseconds do not wrap into an
// expiry in the past that closed every session after each answer).
TEST(TCPStoreServerLimits, AnInfiniteIdleTimeoutClosesNothing) {
  TCPStoreServerOptions options;
  options.idle_timeout = milliseconds::max();
  TCPStoreServer server("127.0.0.1", 0, options);
  TCPStore client("127.0.0.1", server.port());
  for (int i = 0; i < 3; ++i) client.set("k" + std::to_string(i), "v");
  EXPECT_EQ(client.get("k2"), "v");
  EXPECT_EQ(server.stats().idle_closed, 0u);
}

// A client that closes its connection in a wait is gone at once, not when its wait ends: its
// descriptor is freed and its on-close key written (the fuzzer's server ran out of connections
// when 4,096 closed waiters each held theirs for the wait's timeout).
TEST(TCPStoreServerLimits, AClientThatClosesInAWaitIsGoneAtOnce) {
  TCPStoreServer server("127.0.0.1", 0);
  {
    std::vector<std::unique_ptr<RawClient>> waiters;
    for (int i = 0; i < 8; ++i) {
      waiters.push_back(std::make_unique<RawClient>(server.port()));
      waiters.back()->handshake();
      waiters.back()->send(wait_request("never", 600000));
    }
    ASSERT_TRUE(eventually([&] { return server.stats().waiting == 8; }));
    RawClient member(server.port());
    member.handshake();
    std::string body(1, '\x0a');  // set_on_close("gone/member", "closed")
    for (const std::string part : {"gone/member", "closed"}) {
      const uint32_t n = static_cast<uint32_t>(part.size());
      body.append(reinterpret_cast<const char*>(&n), 4).append(part);
    }
    member.send(framed(body));
    char reply[5];
    ASSERT_TRUE(member.read_exactly(reply, 5));
    ASSERT_EQ(reply[4], 0);
    member.send(wait_request("never", 600000));
    ASSERT_TRUE(eventually([&] { return server.stats().waiting == 9; }));
  }  // every waiter closes its connection
  const auto closed = std::chrono::steady_clock::now();
  TCPStore reader("127.0.0.1", server.port());
  reader.wait({"gone/member"}, milliseconds(5000));
  EXPECT_EQ(reader.get("gone/member"), "closed");
  EXPECT_LT(std::chrono::steady_clock::now() - closed, std::chrono::seconds(2));
  EXPECT_TRUE(eventually([&] { return server.stats().connections == 1; }))
      << server.stats().connections << " connections open";
  EXPECT_EQ(server.stats().waiting, 0u);
}

// A request sent before a wait was answered is served after that answer, in order.
TEST(TCPStoreServerLimits, ARequestSentDuringAWaitIsAnsweredAfterIt) {
  TCPStoreServer server("127.0.0.1", 0);
  RawClient client(server.port());
  client.handshake();
  std::string ping(1, '\x09');
  client.send(wait_request("soon", 20000) + framed(ping));
  ASSERT_TRUE(eventually([&] { return server.stats().waiting == 1; }));
  TCPStore("127.0.0.1", server.port()).set("soon", "now");
  char replies[10];
  ASSERT_TRUE(client.read_exactly(replies, 10));  // the wait's kOk, then the ping's
  EXPECT_EQ(replies[4], 0);
  EXPECT_EQ(replies[9], 0);
}

TEST(TCPStoreServerLimits, AnIdleClientReconnectsByItself) {
  TCPStoreServerOptions options;
  options.idle_timeout = milliseconds(200);
  TCPStoreServer server("127.0.0.1", 0, options);
  TCPStore client("127.0.0.1", server.port());
  client.set("a", "1");
  ASSERT_TRUE(eventually([&] { return server.stats().idle_closed >= 1; }));
  EXPECT_EQ(client.get("a"), "1");
  EXPECT_EQ(client.add("n", 1), 1);  // not repeatable, so sent only on a fresh connection
}

TEST(TCPStoreServerLimits, HeaderOnlyConnectionsHoldNoMemory) {
  TCPStoreServer server("127.0.0.1", 0);
  const long rss_before = rss_kib();
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 12; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    clients.back()->handshake();
    const uint32_t claimed = 64 * 1024 * 1024;
    clients.back()->send(std::string(reinterpret_cast<const char*>(&claimed), 4) + "partial");
  }
  // Each connection has its 7 bytes and room for the next piece, no more.
  constexpr size_t kPiece = 64 * 1024;
  ASSERT_TRUE(eventually([&] { return server.stats().buffered_bytes >= 12 * kPiece; }))
      << server.stats().buffered_bytes;
  EXPECT_LE(server.stats().buffered_bytes, 12 * (kPiece + 7));
  EXPECT_LT(rss_kib() - rss_before, 64 * 1024) << "KiB more resident memory";
  TCPStore good("127.0.0.1", server.port());
  good.set("still", "served");
  EXPECT_EQ(good.get("still"), "served");
  clients.clear();
  EXPECT_TRUE(eventually([&] { return server.stats().buffered_bytes == 0; }));
}

TEST(TCPStoreServerLimits, TotalCapClosesTheConnectionThatWouldPassIt) {
  TCPStoreServerOptions options;
  options.max_buffered_bytes = 1024 * 1024;
  TCPStoreServer server("127.0.0.1", 0, options);
  const uint32_t claimed = 4 * 1024 * 1024;
  const std::string header(reinterpret_cast<const char*>(&claimed), 4);
  RawClient a(server.port()), b(server.port());
  a.handshake();
  b.handshake();
  a.send(header + std::string(600 * 1024, 'a'));
  ASSERT_TRUE(eventually([&] { return server.stats().buffered_bytes >= 600 * 1024; }));
  b.send(header + std::string(600 * 1024, 'b'));
  EXPECT_TRUE(b.closed_by_server());
  EXPECT_LE(server.stats().buffered_bytes, options.max_buffered_bytes);
  TCPStore good("127.0.0.1", server.port());
  good.set("small", "fits");
  EXPECT_EQ(good.get("small"), "fits");
}

TEST(TCPStoreServerLimits, ClientRefusesWhatTheServerWouldNotTake) {
  TCPStoreServerOptions options;
  options.max_message_bytes = 1024;
  TCPStoreServer server("127.0.0.1", 0, options);
  TCPStore client("127.0.0.1", server.port());
  EXPECT_TUTTI_ERROR(client.set("big", std::string(4096, 'x')), ErrorCode::kInvalidArgument,
                     "set 'big'", "more than the server takes", "1024");
  client.set("small", "ok");  // the connection is still good
  EXPECT_EQ(client.get("small"), "ok");
  EXPECT_TUTTI_ERROR(client.set(std::string(70000, 'k'), "v"), ErrorCode::kInvalidArgument,
                     "key of 70000 bytes");
}

TEST(TCPStoreSecret, WrongOrMissingSecretIsRefusedRightOneServed) {
  TCPStoreServer server("127.0.0.1", 0, "s3cret");
  TCPStoreOptions right;
  right.secret = "s3cret";
  TCPStore good("127.0.0.1", server.port(), right);
  good.set("k", "v");
  TCPStoreOptions wrong;
  wrong.secret = "guess";
  wrong.timeout = milliseconds(2000);
  EXPECT_TUTTI_ERROR(TCPStore("127.0.0.1", server.port(), wrong).get("k"),
                     ErrorCode::kInvalidArgument, "refused", "secret");
  TCPStoreOptions none;
  none.timeout = milliseconds(2000);
  EXPECT_TUTTI_ERROR(TCPStore("127.0.0.1", server.port(), none).set("x", "y"),
                     ErrorCode::kInvalidArgument, "refused");
  EXPECT_EQ(good.get("k"), "v");
  EXPECT_FALSE(good.check({"x"}));
}

TEST(TCPStoreClient, RetriesUntilTheHostComesUp) {
  // A free port (below the ephemeral range: no other socket, nor the client's own connect, is
  // handed it meanwhile); the server starts a little after the client starts trying.
  const uint16_t port = free_port();
  std::unique_ptr<TCPStoreServer> server;
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(300));
    server = std::make_unique<TCPStoreServer>("127.0.0.1", port);
  });
  TCPStoreOptions o;
  o.timeout = milliseconds(10000);
  TCPStore client("127.0.0.1", port, o);
  client.set("k", "v");
  late.join();
  EXPECT_EQ(client.get("k"), "v");
}

TEST(TCPStoreClient, NoServerTimesOutNamingTheAddress) {
  const uint16_t port = free_port();
  TCPStoreOptions o;
  o.timeout = milliseconds(300);
  EXPECT_TUTTI_ERROR(TCPStore("127.0.0.1", port, o).set("k", "v"), ErrorCode::kTimeout,
                     "127.0.0.1:" + std::to_string(port), "could not connect");
}

TEST(TCPStoreHosting, StoresHostingOneAddressShareTheServer) {
  TCPStoreOptions host;
  host.host = true;
  auto first = std::make_shared<TCPStore>("127.0.0.1", 0, host);
  ASSERT_TRUE(first->is_hosting());
  const uint16_t port = first->port();
  auto second = std::make_shared<TCPStore>("127.0.0.1", port, host);
  EXPECT_TRUE(second->is_hosting());
  first->set("shared", "yes");
  first.reset();  // the server lives on for the second
  EXPECT_EQ(second->get("shared"), "yes");
}

TEST(TCPStoreUrl, OpenStoreParses) {
  auto hosted = open_store("tcp://127.0.0.1:0", milliseconds(5000), /*host=*/true);
  auto tcp = std::dynamic_pointer_cast<TCPStore>(hosted);
  ASSERT_NE(tcp, nullptr);
  auto client = open_store("tcp://localhost:" + std::to_string(tcp->port()));
  hosted->set("a", "b");
  EXPECT_EQ(client->get("a"), "b");
  EXPECT_TUTTI_ERROR(open_store("tcp://127.0.0.1"), ErrorCode::kInvalidArgument, "host and a port");
  EXPECT_TUTTI_ERROR(open_store("tcp://127.0.0.1:99999"), ErrorCode::kInvalidArgument, "99999");
  EXPECT_TUTTI_ERROR(open_store("tcp://h:1?colour=blue"), ErrorCode::kInvalidArgument, "colour");
  EXPECT_TUTTI_ERROR(open_store("tcp://127.0.0.1:0"), ErrorCode::kInvalidArgument, "port 0");
}

}  // namespace
}  // namespace tutti::testing

namespace tutti::testing {
namespace {

TEST(TuttiStoreProgram, ServesUntilSignalled) {
  TuttiStoreProcess store;
  {
    TCPStore a("127.0.0.1", store.port()), b("127.0.0.1", store.port());
    a.set("k", "v");
    EXPECT_EQ(b.get("k"), "v");
    EXPECT_EQ(b.add("n", 2), 2);
  }
  const int status = store.stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(TuttiStoreProgram, FlagsSetTheConnectionCapAndIdleTimeout) {
  TuttiStoreProcess store({"--max-connections", "1", "--idle-timeout", "1"});
  TCPStore first("127.0.0.1", store.port());
  first.set("k", "v");  // holds the one connection allowed
  RawClient extra(store.port());
  EXPECT_TRUE(extra.closed_at_once());
  // The second gets in once the first's connection has been idle for a second.
  TCPStoreOptions o;
  o.timeout = milliseconds(20000);
  TCPStore second("127.0.0.1", store.port(), o);
  EXPECT_EQ(second.get("k"), "v");
  const int status = store.stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(TuttiStoreProgram, RejectsBadLimits) {
  for (const char* flag : {"--max-connections", "--idle-timeout"}) {
    const WorkerResult r =
        run_command({TUTTI_STORE_PROGRAM, flag, "-1"}, std::chrono::milliseconds(10000));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(flag), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace tutti::testing
