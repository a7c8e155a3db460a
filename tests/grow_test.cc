// CollectiveGroup::grow and join with ranks as threads: new ranks are admitted into a running
// group, the members keep their ranks, every failure is named.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test_util.h"
#include "tutti/hash_store.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

GroupOptions through(std::shared_ptr<Store> store, milliseconds timeout = milliseconds(20000)) {
  GroupOptions o;
  o.store = std::move(store);
  o.timeout = timeout;
  return o;
}

// Members 0..m-1 grow by `add`; the new processes (threads here) join. Every rank's sum counts
// who took part: rank r gives r + 1.
void grow_and_check(const std::string& backend, int members, int add) {
  auto store = std::make_shared<HashStore>();
  const std::string name = unique_name("grow-" + backend);
  auto groups = create_groups(members, backend, name, milliseconds(20000), store);
  const int world = members + add;
  std::vector<std::shared_ptr<CollectiveGroup>> grown(world);
  GrowOptions g;
  g.add = add;
  run_ranks(world, [&](int r) {
    if (r < members) {
      grown[r] = groups[r]->grow(g);
      EXPECT_EQ(grown[r]->rank(), r);  // members keep their ranks
    } else {
      grown[r] = CollectiveGroup::join(name, through(store));
    }
    ASSERT_TRUE(grown[r]);
    EXPECT_EQ(grown[r]->world_size(), world);
    EXPECT_EQ(grown[r]->name(), name + ".grow0");
    const int me = grown[r]->rank();
    std::vector<int32_t> v(1000, me + 1);
    grown[r]->allreduce(v);
    EXPECT_EQ(v[0], world * (world + 1) / 2);
    EXPECT_EQ(v[999], world * (world + 1) / 2);
    // The members' own group still works beside it.
    if (r < members) {
      std::vector<int32_t> w(8, r + 1);
      groups[r]->allreduce(w);
      EXPECT_EQ(w[0], members * (members + 1) / 2);
    }
  });
  // New ranks are numbered after the members, each once.
  std::vector<int> seen;
  for (int r = members; r < world; ++r) seen.push_back(grown[r]->rank());
  std::sort(seen.begin(), seen.end());
  for (int i = 0; i < add; ++i) EXPECT_EQ(seen[i], members + i);
  for (auto& x : grown) x->destroy();
  for (auto& x : groups) x->destroy();
}

TEST(Grow, NewRanksJoinAndEverySumIsRight) {
  grow_and_check("gloo", 2, 1);
  grow_and_check("shm", 3, 1);
  grow_and_check("gloo", 1, 2);
}

// Three ranks; rank 2 "dies" (destroys its group) and a replacement joins under the job's group
// name while ranks 0 and 1 shrink the group and grow it back; the grown group's sum counts all
// three. Every group and the joiner use `timeout`.
void shrink_and_grow_back(const std::string& prefix, milliseconds timeout) {
  auto store = std::make_shared<HashStore>();
  const std::string name = unique_name(prefix);
  auto groups = create_groups(3, "gloo", name, timeout, store);
  std::vector<std::shared_ptr<CollectiveGroup>> grown(3);
  ShrinkOptions s;
  s.exclude = {2};
  run_ranks(3, [&](int r) {
    if (r == 2) {
      groups[2]->destroy();
      grown[2] = CollectiveGroup::join(name, through(store, timeout));
    } else {
      auto small = groups[r]->shrink(s);
      EXPECT_EQ(small->world_size(), 2);
      grown[r] = small->grow();
      small->destroy();
    }
    std::vector<float> v(16, static_cast<float>(grown[r]->rank() + 1));
    grown[r]->allreduce(v);
    EXPECT_EQ(v[0], 6.0f);
  });
  EXPECT_EQ(grown[2]->rank(), 2);
  for (auto& x : grown) x->destroy();
  for (auto& x : groups) x->destroy();
}

TEST(Grow, AShrunkGroupGrowsBackUnderItsRootsName) {
  shrink_and_grow_back("grow-back", milliseconds(20000));
}

// The same with every timeout infinite (milliseconds::max(), as Python's math.inf arrives): the
// shrink's default of twice the group's timeout, the admission record and the joiner's deadline
// all mean "never", not an overflow (a shrink refused "timeout must be positive, got -2 ms", a
// joiner refused the record as damaged).
TEST(Grow, AnInfiniteTimeoutShrinksGrowsAndJoins) {
  shrink_and_grow_back("grow-inf", milliseconds::max());
}

TEST(Grow, BadInputIsRefusedBeforeAnyIo) {
  auto groups = create_groups(1, "gloo", unique_name("grow-bad"));
  GrowOptions g;
  g.add = 0;
  EXPECT_TUTTI_ERROR(groups[0]->grow(g), ErrorCode::kInvalidArgument,
                     "add must be at least 1, got 0");
  g.add = 1;
  g.timeout = milliseconds(-5);
  EXPECT_TUTTI_ERROR(groups[0]->grow(g), ErrorCode::kInvalidArgument, "timeout must be positive");
  g.timeout = milliseconds(1000);
  g.name = "two\nlines";
  EXPECT_TUTTI_ERROR(groups[0]->grow(g), ErrorCode::kInvalidArgument,
                     "the name must not hold a line break");
  EXPECT_TUTTI_ERROR(CollectiveGroup::join("", through(std::make_shared<HashStore>())),
                     ErrorCode::kInvalidArgument, "group name must not be empty");
  EXPECT_TUTTI_ERROR(CollectiveGroup::join("g", GroupOptions{}), ErrorCode::kInvalidArgument,
                     "joining needs the members' store");
  // Nothing was admitted: the group still runs alone.
  std::vector<int32_t> v(4, 7);
  groups[0]->allreduce(v);
  EXPECT_EQ(v[0], 7);
  groups[0]->destroy();
}

TEST(Grow, AJoinWithNoGrowTimesOutSayingSo) {
  auto store = std::make_shared<HashStore>();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TUTTI_ERROR(CollectiveGroup::join("nobody-grows", through(store, milliseconds(300))),
                     ErrorCode::kTimeout, "no grow of it began within 300 ms");
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
}

TEST(Grow, MembersNameTheNewRankThatNeverCame) {
  auto store = std::make_shared<HashStore>();
  const std::string name = unique_name("grow-missing");
  auto groups = create_groups(2, "gloo", name, milliseconds(20000), store);
  GrowOptions g;
  g.timeout = milliseconds(500);
  run_ranks(2, [&](int r) {
    EXPECT_TUTTI_ERROR(groups[r]->grow(g), ErrorCode::kTimeout, "missing rank(s) 2");
  });
  // A process that comes after the failed grow is not let into it: it waits for the next.
  EXPECT_TUTTI_ERROR(CollectiveGroup::join(name, through(store, milliseconds(300))),
                     ErrorCode::kTimeout,
                     "no grow of it began within 300 ms (the last one ended before this process "
                     "came)");
  // The members' group is unharmed.
  run_ranks(2, [&](int r) {
    std::vector<int32_t> v(4, 1);
    groups[r]->allreduce(v);
    EXPECT_EQ(v[0], 2);
  });
  for (auto& x : groups) x->destroy();
}

TEST(Grow, AJoinPastAFullAdmissionWaitsForTheNext) {
  auto store = std::make_shared<HashStore>();
  const std::string name = unique_name("grow-full");
  auto groups = create_groups(1, "gloo", name, milliseconds(20000), store);
  std::shared_ptr<CollectiveGroup> first, late;
  std::thread joiner([&] { first = CollectiveGroup::join(name, through(store)); });
  auto two = groups[0]->grow();
  joiner.join();
  ASSERT_TRUE(first);
  // A second process finds that grow over (its admission closed): it fails at its timeout...
  EXPECT_TUTTI_ERROR(CollectiveGroup::join(name, through(store, milliseconds(300))),
                     ErrorCode::kTimeout,
                     "no grow of it began within 300 ms (the last one ended before this process "
                     "came)");
  // ...or is admitted by the next grow.
  std::thread late_joiner([&] { late = CollectiveGroup::join(name, through(store)); });
  std::vector<std::shared_ptr<CollectiveGroup>> three(2);
  std::thread member1([&] { three[1] = first->grow(); });
  three[0] = two->grow();
  member1.join();
  late_joiner.join();
  ASSERT_TRUE(late);
  EXPECT_EQ(late->rank(), 2);
  EXPECT_EQ(late->world_size(), 3);
  std::vector<std::thread> ts;
  std::vector<int32_t> sums(3);
  std::vector<std::shared_ptr<CollectiveGroup>> all{three[0], three[1], late};
  for (int r = 0; r < 3; ++r) {
    ts.emplace_back([&, r] {
      all[r]->issue_from_this_thread();
      std::vector<int32_t> v(4, r + 1);
      all[r]->allreduce(v);
      sums[r] = v[0];
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(sums[r], 6);
  for (auto& x : all) x->destroy();
  two->destroy();
  first->destroy();
  groups[0]->destroy();
}

}  // namespace
}  // namespace tutti::testing
