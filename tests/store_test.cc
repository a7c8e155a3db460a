// One suite every store passes: Hash, File, Prefix over each.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "store/stoppable_store.h"
#include "test_util.h"

extern char** environ;

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

struct StoreFactory {
  std::string name;
  // Each call returns a client of the same underlying store (a new connection where the store
  // has them: a FileStore opens the file again, as another process would).
  std::function<std::shared_ptr<Store>(const std::string& dir)> client;
};

class StoreTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override {
    if (!GetParam().client(dir_.path())) {
      GTEST_SKIP() << GetParam().name
                   << " store unavailable: " << RedisServer::instance().why_not();
    }
  }
  std::shared_ptr<Store> client() { return GetParam().client(dir_.path()); }
  TempDir dir_;
};

TEST_P(StoreTest, SetGetOverwrite) {
  auto s = client();
  s->set("k", "v1");
  EXPECT_EQ(s->get("k"), "v1");
  s->set("k", std::string("bin\0ary", 7));
  EXPECT_EQ(client()->get("k"), std::string("bin\0ary", 7));
}

TEST_P(StoreTest, GetOfMissingKeyTimesOutNamingIt) {
  auto s = client();
  s->set_timeout(milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TUTTI_ERROR(s->get("absent-key"), ErrorCode::kTimeout, "absent-key");
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(100));
}

TEST_P(StoreTest, WaitReturnsWhenAnotherClientSets) {
  auto waiter = client();
  auto setter = client();
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(20));  // the wait below must really block first
    setter->set("late", "1");
  });
  waiter->wait({"late"}, milliseconds(10000));
  t.join();
  EXPECT_TRUE(waiter->check({"late"}));
}

TEST_P(StoreTest, HugeTimeoutsMeanNoDeadline) {
  // milliseconds::max() used to overflow `now + timeout` into the past: waits ended at once.
  auto waiter = client();
  auto setter = client();
  waiter->set_timeout(milliseconds::max());
  setter->set("present", "1");
  EXPECT_EQ(waiter->get("present"), "1");
  waiter->wait({"present"});
  EXPECT_EQ(waiter->add("n", 2), 2);
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(20));  // the waits below must really block first
    setter->set("late", "1");
    setter->set("later", "2");
  });
  waiter->wait({"late"}, milliseconds::max());
  waiter->wait({"later"}, milliseconds::max() / 3);
  EXPECT_EQ(waiter->get("later"), "2");
  t.join();
}

TEST_P(StoreTest, WaitTimeoutListsOnlyMissingKeys) {
  auto s = client();
  s->set("here", "1");
  try {
    s->wait({"here", "gone-1", "gone-2"}, milliseconds(50));
    ADD_FAILURE() << "wait returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    const std::string what = e.what();
    EXPECT_NE(what.find("'gone-1', 'gone-2'"), std::string::npos) << what;
    EXPECT_EQ(what.find("'here'"), std::string::npos) << what;
  }
}

// The core's waits go through a StoppableStore, in slices of 50 ms: the whole wait's timeout
// ends with the whole wait's figure and the keys still missing, not the last slice's.
TEST_P(StoreTest, ASlicedWaitTimesOutWithTheWholeTimeout) {
  auto s = client();
  s->set("here", "1");
  detail::StoppableStore sliced(s, [] { return detail::StoppableStore::Stop{}; });
  const Error e = expect_error(
      [&] {
        sliced.wait({"here", "gone"}, milliseconds(320));
      },
      ErrorCode::kTimeout);
  const std::string what = e.what();
  EXPECT_NE(what.find("timed out after 320 ms waiting for key(s) 'gone'"), std::string::npos)
      << what;
  EXPECT_EQ(what.find("'here'"), std::string::npos) << what;
}

TEST_P(StoreTest, AddIsAtomicAcross64Threads) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 64; ++t) {
    threads.emplace_back([&] {
      auto s = client();
      for (int i = 0; i < 20; ++i) s->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(client()->add("counter", 0), 64 * 20);
  EXPECT_EQ(client()->add("counter", -5), 64 * 20 - 5);
}

// A sum past int64 fails, naming the key, and leaves the counter as it was (both ways).
TEST_P(StoreTest, AnAddThatOverflowsFailsAndLeavesTheCounter) {
  auto s = client();
  const int64_t top = std::numeric_limits<int64_t>::max() - 1;
  EXPECT_EQ(s->add("big", top), top);
  EXPECT_TUTTI_ERROR(s->add("big", 5), ErrorCode::kInvalidArgument, "big'", "overflows");
  EXPECT_EQ(s->add("big", 0), top);
  EXPECT_EQ(s->add("big", 1), top + 1);  // to the very top is fine
  const int64_t bottom = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(s->add("small", bottom), bottom);
  EXPECT_TUTTI_ERROR(s->add("small", -1), ErrorCode::kInvalidArgument, "overflows");
  EXPECT_EQ(s->add("small", 0), bottom);
}

TEST_P(StoreTest, AddReturnsDistinctValues) {
  std::mutex m;
  std::set<int64_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      auto s = client();
      for (int i = 0; i < 10; ++i) {
        const int64_t v = s->add("ticket", 1);
        std::lock_guard<std::mutex> lock(m);
        EXPECT_TRUE(seen.insert(v).second) << "ticket " << v << " handed out twice";
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(seen.size(), 160u);
  EXPECT_EQ(*seen.rbegin(), 160);
}

TEST_P(StoreTest, CompareSetSemantics) {
  auto s = client();
  EXPECT_EQ(s->compare_set("cs", "x", "y"), "x");  // missing key, non-empty expected: no change
  EXPECT_FALSE(s->check({"cs"}));
  EXPECT_EQ(s->compare_set("cs", "", "first"), "first");  // missing + empty expected: created
  EXPECT_EQ(s->compare_set("cs", "wrong", "second"), "first");
  EXPECT_EQ(s->compare_set("cs", "first", "second"), "second");
  EXPECT_EQ(s->get("cs"), "second");
}

TEST_P(StoreTest, CompareSetRaceHasOneWinner) {
  std::atomic<int> winners{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 32; ++t) {
    threads.emplace_back([&, t] {
      const std::string mine = "thread-" + std::to_string(t);
      if (client()->compare_set("race", "", mine) == mine) ++winners;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
}

TEST_P(StoreTest, CheckDeleteAndCount) {
  auto s = client();
  const int64_t before = s->num_keys();
  s->set("a", "1");
  s->set("b", "2");
  EXPECT_TRUE(s->check({"a", "b"}));
  EXPECT_FALSE(s->check({"a", "c"}));
  EXPECT_EQ(s->num_keys(), before + 2);
  EXPECT_TRUE(s->delete_key("a"));
  EXPECT_FALSE(s->delete_key("a"));
  EXPECT_FALSE(client()->check({"a"}));
  EXPECT_EQ(s->num_keys(), before + 1);
}

TEST_P(StoreTest, AddOnNonCounterIsAnError) {
  auto s = client();
  s->set("text", "hello");
  EXPECT_TUTTI_ERROR(s->add("text", 1), ErrorCode::kInvalidUsage, "text", "hello");
}

std::vector<StoreFactory> factories() {
  // One HashStore per test directory, shared by every client of that test.
  struct Shared {
    std::mutex mutex;
    std::map<std::string, std::shared_ptr<Store>> stores;
  };
  auto shared = std::make_shared<Shared>();
  auto hash_for = [shared](const std::string& dir) {
    std::lock_guard<std::mutex> lock(shared->mutex);
    auto& slot = shared->stores[dir];
    if (!slot) slot = std::make_shared<HashStore>();
    return slot;
  };
  // One TCP server per test directory; each client is a new connection to it.
  struct Servers {
    std::mutex mutex;
    std::map<std::string, std::shared_ptr<TCPStoreServer>> servers;
  };
  auto servers = std::make_shared<Servers>();
  auto tcp_for = [servers](const std::string& dir) {
    uint16_t port;
    {
      std::lock_guard<std::mutex> lock(servers->mutex);
      auto& slot = servers->servers[dir];
      if (!slot) slot = std::make_shared<TCPStoreServer>("127.0.0.1", 0);
      port = slot->port();
    }
    TCPStoreOptions o;
    o.timeout = std::chrono::seconds(30);
    return std::make_shared<TCPStore>("127.0.0.1", port, o);
  };
  auto redis_for = [](const std::string& dir) -> std::shared_ptr<Store> {
    auto& server = RedisServer::instance();
    if (!server.available()) return nullptr;
    RedisStoreOptions o;
    o.prefix = dir + "/";  // each test its own namespace in the one server
    o.timeout = std::chrono::seconds(30);
    return std::make_shared<RedisStore>("127.0.0.1", server.port(), o);
  };
  return {
      {"Hash", hash_for},
      {"Redis", redis_for},
      {"TCP", tcp_for},
      {"PrefixOverTCP",
       [tcp_for](const std::string& dir) {
         return std::make_shared<PrefixStore>("p", tcp_for(dir));
       }},
      {"File", [](const std::string& dir) { return std::make_shared<FileStore>(dir + "/store"); }},
      {"PrefixOverHash",
       [hash_for](const std::string& dir) {
         return std::make_shared<PrefixStore>("job/7", hash_for(dir));
       }},
      {"PrefixOverFile",
       [](const std::string& dir) {
         return std::make_shared<PrefixStore>("job", std::make_shared<FileStore>(dir + "/store"));
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest, ::testing::ValuesIn(factories()),
                         [](const auto& info) { return info.param.name; });

TEST(PrefixStore, KeysLiveUnderThePrefix) {
  auto base = std::make_shared<HashStore>();
  PrefixStore p("scope", base);
  p.set("k", "v");
  EXPECT_TRUE(base->check({"scope/k"}));
  EXPECT_FALSE(base->check({"k"}));
}

TEST(OpenStore, RedisUrl) {
  auto& server = RedisServer::instance();
  if (!server.available()) GTEST_SKIP() << server.why_not();
  const std::string base = "redis://127.0.0.1:" + std::to_string(server.port());
  auto a = open_store(base + "/0?prefix=url-test/");
  auto b = open_store(base + "?prefix=url-test/");
  a->set("k", "v");
  EXPECT_EQ(b->get("k"), "v");
  auto other_db = open_store(base + "/1?prefix=url-test/");
  EXPECT_FALSE(other_db->check({"k"}));
  EXPECT_TUTTI_ERROR(open_store(base + "?colour=red"), ErrorCode::kInvalidArgument, "colour");
  EXPECT_TUTTI_ERROR(open_store(base + "/x"), ErrorCode::kInvalidArgument, "bad db");
}

TEST(OpenStore, SecretsAndPasswordsAreNeverEchoed) {
  const std::vector<std::string> bad_urls = {
      "tcp://127.0.0.1:1?secret=TOPSECRET&x=1",
      "tcp://127.0.0.1:99999?secret=TOPSECRET",
      "tcp://127.0.0.1:1?secrte=TOPSECRET",  // misspelt: its value is not shown either
      "redis://127.0.0.1:1?password=TOPSECRET&colour=red",
      "redis://127.0.0.1:1/x?password=TOPSECRET",
      "redis://user:TOPSECRET@127.0.0.1:6379",
      "tcp://:TOPSECRET@127.0.0.1:1",
  };
  for (const auto& url : bad_urls) {
    try {
      open_store(url);
      ADD_FAILURE() << "no error for " << url;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_EQ(std::string(e.what()).find("TOPSECRET"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("***"), std::string::npos) << e.what();
    }
  }
  EXPECT_TUTTI_ERROR(open_store("tcp://127.0.0.1:1?secret=TOPSECRET&x=1"),
                     ErrorCode::kInvalidArgument, "secret=***", "unknown parameter 'x'");
}

// A wrong or missing password is the same error whichever store refuses it (docs/errors.md).
TEST(OpenStore, AuthenticationFailuresAreInvalidArgumentForEveryStore) {
  TCPStoreServer tcp("127.0.0.1", 0, "right");
  const std::string tcp_url = "tcp://127.0.0.1:" + std::to_string(tcp.port());
  EXPECT_TUTTI_ERROR(open_store(tcp_url + "?secret=wrong", milliseconds(5000))->set("k", "v"),
                     ErrorCode::kInvalidArgument, "secret");
  open_store(tcp_url + "?secret=right", milliseconds(5000))->set("k", "v");

  auto& redis = RedisServer::with_password("right");
  if (!redis.available()) GTEST_SKIP() << redis.why_not();
  const std::string redis_url = "redis://127.0.0.1:" + std::to_string(redis.port());
  EXPECT_TUTTI_ERROR(open_store(redis_url, milliseconds(5000))->set("k", "v"),
                     ErrorCode::kInvalidArgument, "NOAUTH", "?password=");
  EXPECT_TUTTI_ERROR(open_store(redis_url + "?password=wrong", milliseconds(5000))->set("k", "v"),
                     ErrorCode::kInvalidArgument, "password");
  auto good = open_store(redis_url + "?password=right", milliseconds(5000));
  good->set("k", "v");
  EXPECT_EQ(good->get("k"), "v");
}

TEST(FileStoreFile, RefusesASymbolicLinkAndIsPrivate) {
  TempDir dir;
  const std::string target = dir.path() + "/victim";
  { std::ofstream(target) << "precious"; }
  const std::string link = dir.path() + "/store";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_TUTTI_ERROR(FileStore{link}, ErrorCode::kInvalidArgument, link, "symbolic link");
  std::ifstream in(target);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");

  const std::string path = dir.path() + "/real";
  FileStore store(path);
  store.set("k", "v");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TUTTI_ERROR(FileStore{dir.path()}, ErrorCode::kIoError, dir.path());
  ASSERT_EQ(::mkfifo((dir.path() + "/fifo").c_str(), 0600), 0);
  EXPECT_TUTTI_ERROR(FileStore{dir.path() + "/fifo"}, ErrorCode::kInvalidArgument,
                     "not a regular file");
}

// Bytes this process has read through read(2) and pread(2) so far.
long long bytes_read() {
  std::ifstream io("/proc/self/io");
  std::string name;
  long long value = 0;
  while (io >> name >> value) {
    if (name == "rchar:") return value;
  }
  return -1;
}

// Review C.19: a FileStore opened again in the same process (a group re-created through one
// file) reads only what is new, not the whole file.
TEST(FileStoreFile, OpeningTheFileAgainReadsOnlyWhatIsNew) {
  TempDir dir;
  const std::string path = dir.path() + "/store";
  FileStore first(path);
  const std::string value(10 * 1024, 'v');
  for (int i = 0; i < 200; ++i) first.set("key/" + std::to_string(i), value);  // 2 MB of log
  first.set("last", "1");
  const long long before = bytes_read();
  FileStore again(path);
  EXPECT_EQ(again.get("last"), "1");
  EXPECT_EQ(again.get("key/7"), value);
  EXPECT_LT(bytes_read() - before, 256 * 1024) << "bytes read to open the file again";
  // What another process appends still arrives.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileStore(path).set("late", "2");
    ::_exit(0);
  }
  int status = -1;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(first.get("late"), "2");
  EXPECT_EQ(again.get("late"), "2");
}

TEST(OpenStore, Urls) {
  TempDir dir;
  auto s = open_store("file://" + dir.path() + "/s");
  s->set("x", "1");
  EXPECT_EQ(FileStore(dir.path() + "/s").get("x"), "1");
  EXPECT_NE(std::dynamic_pointer_cast<HashStore>(open_store("hash://")), nullptr);
  EXPECT_TUTTI_ERROR(open_store("nowhere"), ErrorCode::kInvalidArgument, "no scheme");
  EXPECT_TUTTI_ERROR(open_store("file://relative"), ErrorCode::kInvalidArgument, "absolute");
  EXPECT_TUTTI_ERROR(open_store("gopher://x"), ErrorCode::kInvalidArgument, "gopher");
  EXPECT_TUTTI_ERROR(FileStore("/proc/no/such/dir/store"), ErrorCode::kIoError, "/proc/no/such");
}

}  // namespace
}  // namespace tutti::testing
