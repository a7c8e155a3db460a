// Re-creating a group under the same name, on every store kind, after what used to wedge it: a
// failed init, a change of world size, survivors re-forming, a claim left by a crashed attempt,
// and fast destroy/re-create cycles. Ranks are threads, each with its own store client (or URL).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "util/host_identity.h"
#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

struct StoreKind {
  std::string name;
  // GroupOptions for one rank of a group whose store lives in `dir` (shared by all ranks).
  std::function<GroupOptions(const std::string& dir, int rank)> options;
};

std::vector<StoreKind> store_kinds() {
  static std::map<std::string, std::shared_ptr<Store>> hash_stores;
  static std::map<std::string, uint16_t> ports;
  static std::mutex mutex;
  return {
      {"Hash",
       [](const std::string& dir, int) {
         std::lock_guard<std::mutex> lock(mutex);
         auto& store = hash_stores[dir];
         if (!store) store = std::make_shared<HashStore>();
         GroupOptions o;
         o.store = store;
         return o;
       }},
      {"File",
       [](const std::string& dir, int) {
         GroupOptions o;
         o.store_url = "file://" + dir + "/store";
         return o;
       }},
      {"TcpHostedByRank0",
       [](const std::string& dir, int) {
         std::lock_guard<std::mutex> lock(mutex);
         auto& port = ports[dir];
         if (port == 0) port = free_port();
         GroupOptions o;
         o.store_url = "tcp://127.0.0.1:" + std::to_string(port);
         return o;
       }},
      {"Redis",
       [](const std::string& dir, int) {
         GroupOptions o;
         o.store_url = "redis://127.0.0.1:" + std::to_string(RedisServer::instance().port()) +
                       "?prefix=" + dir + "/";
         return o;
       }},
  };
}

class Recreate : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override {
    if (GetParam().name == "Redis" && !RedisServer::instance().available()) {
      GTEST_SKIP() << RedisServer::instance().why_not();
    }
  }

  GroupOptions options(int rank, milliseconds timeout = milliseconds(20000)) {
    GroupOptions o = GetParam().options(dir_.path(), rank);
    o.timeout = timeout;
    o.job_id = "job";
    return o;
  }

  // Every rank in `ranks` creates the group (of len(ranks) ranks) and checks an allreduce.
  void form(const std::string& name, int world, const std::string& backend = "shm") {
    run_ranks(world, [&](int r) {
      auto g = CollectiveGroup::create(world, r, backend, name, options(r));
      std::vector<int32_t> v(10, r + 1);
      g->allreduce(v);
      EXPECT_EQ(v[9], world * (world + 1) / 2) << "rank " << r;
      g->destroy();
    });
  }

  TempDir dir_;
};

TEST_P(Recreate, AFailedInitDoesNotStopTheNextOne) {
  const std::string name = "failed-once";
  // Rank 2 never comes: ranks 0 and 1 time out naming it.
  run_ranks(2, [&](int r) {
    EXPECT_TUTTI_ERROR(CollectiveGroup::create(3, r, "shm", name, options(r, milliseconds(500))),
                       ErrorCode::kTimeout, "missing rank(s) 2");
  });
  form(name, 3);
  form(name, 3);
}

TEST_P(Recreate, TheWorldSizeMayChangeUnderOneName) {
  const std::string name = "resized";
  form(name, 3);
  form(name, 2);
  form(name, 4);
}

TEST_P(Recreate, SurvivorsFormASmallerGroup) {
  const std::string name = "survivors";
  std::vector<std::shared_ptr<CollectiveGroup>> groups(3);
  run_ranks(3, [&](int r) { groups[r] = CollectiveGroup::create(3, r, "shm", name, options(r)); });
  // Rank 2 is gone without a word (its group is simply dropped); 0 and 1 start again as two.
  groups[2].reset();
  run_ranks(2, [&](int r) { groups[r]->destroy(); });
  form(name, 2);
}

// A later rank that comes before rank 0 waits for rank 0's new incarnation rather than joining
// the last one (or failing on its own old claim).
TEST_P(Recreate, RanksMayComeBackBeforeRankZero) {
  const std::string name = "early";
  for (int round = 0; round < 5; ++round) {
    run_ranks(3, [&](int r) {
      if (r == 0) std::this_thread::sleep_for(milliseconds(30));
      auto g = CollectiveGroup::create(3, r, "shm", name, options(r));
      std::vector<int32_t> v(3, 1);
      g->allreduce(v);
      EXPECT_EQ(v[0], 3);
      g->destroy();
    });
  }
}

TEST_P(Recreate, ManyDestroyCreateCycles) {
  const std::string name = "cycles";
  std::vector<std::shared_ptr<CollectiveGroup>> groups(2);
  run_ranks(2, [&](int r) {
    for (int cycle = 0; cycle < 100; ++cycle) {
      auto g = CollectiveGroup::create(2, r, "shm", name, options(r));
      std::vector<int64_t> v(4, cycle + r);
      g->allreduce(v);
      ASSERT_EQ(v[0], 2 * cycle + 1) << "cycle " << cycle;
      g->destroy();
    }
  });
}

// What a crash in the middle of an init leaves: an incarnation with a claim of a process that
// is gone, never marked formed or failed. The next init of the name forms anyway.
TEST_P(Recreate, AClaimLeftByACrashedAttemptIsSkipped) {
  const std::string name = "crashed";
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ::waitpid(child, &status, 0);  // a pid that is certainly gone
  {
    GroupOptions o = options(1);
    std::shared_ptr<Store> store = o.store ? o.store : open_store(o.store_url, o.timeout, true);
    const std::string base = "tutti/job/job/group/" + name;
    store->add(base + "/incarnations", 1);
    store->set(base + "/current", "1");
    store->set(base + "/1/rank/1", "2\nshm\n" + detail::host_identity() + "\n" +
                                       std::to_string(child) + "\n12345\n99");
  }
  run_ranks(2, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(milliseconds(100));  // rank 1 finds the old claim
    auto g = CollectiveGroup::create(2, r, "shm", name, options(r));
    std::vector<int32_t> v(2, 5);
    g->allreduce(v);
    EXPECT_EQ(v[0], 10);
    g->destroy();
  });
}

TEST_P(Recreate, TwoLiveClaimsOfOneRankFailFast) {
  const std::string name = "twice";
  // Threads 1 and 2 both say they are rank 1 of 2; rank 0 is there.
  std::atomic<int> refused{0}, joined{0};
  std::vector<std::shared_ptr<CollectiveGroup>> groups(3);  // all alive until every thread is done
  run_ranks(3, [&](int t) {
    const int rank = t == 0 ? 0 : 1;
    try {
      groups[t] = CollectiveGroup::create(2, rank, "shm", name, options(rank, milliseconds(3000)));
      ++joined;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1 is already claimed by process"),
                std::string::npos)
          << e.what();
      ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(joined.load(), 2);
}

INSTANTIATE_TEST_SUITE_P(Stores, Recreate, ::testing::ValuesIn(store_kinds()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tutti::testing
