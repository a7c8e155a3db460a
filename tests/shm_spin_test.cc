// The shm backend's adaptive spin budget (backends/shm/shm_wait.h): how each kind of wait moves
// it. Pure bookkeeping, no timing.
#include <gtest/gtest.h>

#include "../backends/shm/shm_wait.h"

namespace tutti::shm_backend {
namespace {

using std::chrono::microseconds;

WaitOutcome spun() { return WaitOutcome{}; }
WaitOutcome slept(microseconds how_long) { return WaitOutcome{true, how_long}; }

TEST(AdaptiveSpin, ShortSleepsDoubleTheBudgetUpToTheCap) {
  AdaptiveSpin a(SpinPolicy{2000, 50}, 16);
  a.record(slept(microseconds(70)));
  EXPECT_EQ(a.policy().spins, 4000);
  EXPECT_EQ(a.policy().yields, 100);
  for (int i = 0; i < 10; ++i) a.record(slept(microseconds(70)));
  EXPECT_EQ(a.policy().spins, 32000);
  EXPECT_EQ(a.policy().yields, 800);
}

TEST(AdaptiveSpin, LongSleepsHalveItAndSpunWaitsDecayItToTheBase) {
  AdaptiveSpin a(SpinPolicy{2000, 50}, 16);
  for (int i = 0; i < 4; ++i) a.record(slept(microseconds(70)));
  ASSERT_EQ(a.policy().spins, 32000);
  a.record(slept(microseconds(5000)));
  EXPECT_EQ(a.policy().spins, 16000);
  a.record(spun());
  EXPECT_LT(a.policy().spins, 16000);
  EXPECT_GT(a.policy().spins, 14000);  // a slow decay, not a reset
  for (int i = 0; i < 1000; ++i) a.record(spun());
  EXPECT_EQ(a.policy().spins, 2000);
  EXPECT_EQ(a.policy().yields, 50);
}

TEST(AdaptiveSpin, AScaleOfOneKeepsItFixed) {
  AdaptiveSpin a(SpinPolicy{2000, 50}, 1);
  a.record(slept(microseconds(70)));
  a.record(slept(microseconds(70)));
  EXPECT_EQ(a.policy().spins, 2000);
  EXPECT_EQ(a.policy().yields, 50);
}

}  // namespace
}  // namespace tutti::shm_backend
