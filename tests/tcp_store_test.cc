// The TCP store's server survives broken, hostile and slow clients, and keeps serving a good
// client through each; secrets, hosting and URLs.
#include <arpa/inet.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "test_util.h"

extern char** environ;

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

// A raw socket to the server, for sending what no real client would.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
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
  void send(const std::string& bytes) { (void)!::write(fd_, bytes.data(), bytes.size()); }
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
    char hello[22];
    ASSERT_EQ(::read(fd_, hello, sizeof(hello)), 22);
    std::string mine(4 + 2 + 32, '\0');
    std::memcpy(mine.data(), hello, 6);  // echo magic and version
    send(mine);
    char status = 1;
    ASSERT_EQ(::read(fd_, &status, 1), 1);
    ASSERT_EQ(status, 0);
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
                     ErrorCode::kRemoteError, "refused", "secret");
  TCPStoreOptions none;
  none.timeout = milliseconds(2000);
  EXPECT_TUTTI_ERROR(TCPStore("127.0.0.1", server.port(), none).set("x", "y"),
                     ErrorCode::kRemoteError, "refused");
  EXPECT_EQ(good.get("k"), "v");
  EXPECT_FALSE(good.check({"x"}));
}

TEST(TCPStoreClient, RetriesUntilTheHostComesUp) {
  // Pick a free port, release it, start the server a little after the client starts trying.
  uint16_t port;
  { port = TCPStoreServer("127.0.0.1", 0).port(); }
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
  uint16_t port;
  { port = TCPStoreServer("127.0.0.1", 0).port(); }
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
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> args = {TUTTI_STORE_PROGRAM, "--host", "127.0.0.1", "--port", "0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  std::string line;
  char c;
  while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  const std::string prefix = "tutti-store listening on 127.0.0.1:";
  ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
  const auto port = static_cast<uint16_t>(std::stoi(line.substr(prefix.size())));
  {
    TCPStore a("127.0.0.1", port), b("127.0.0.1", port);
    a.set("k", "v");
    EXPECT_EQ(b.get("k"), "v");
    EXPECT_EQ(b.add("n", 2), 2);
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace tutti::testing
