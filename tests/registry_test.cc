// The backend registry. This binary names no symbol of tutti::gloo: "gloo" must be registered
// by linking the target alone.
#include <gtest/gtest.h>

#include "test_util.h"

namespace tutti::testing {
namespace {

class NullBackend : public Backend {
 public:
  const char* name() const override { return "null"; }
  bool supports(OpType op) const override { return op == OpType::kBarrier; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCPU; }
  WorkPtr barrier(const BarrierOptions&, const OpContext&) override { return nullptr; }
  void abort(const std::string&) override {}
};

TEST(Registry, GlooIsRegisteredByLinking) {
  EXPECT_TRUE(is_registered_collective_backend("gloo"));
  EXPECT_TRUE(is_registered_collective_backend("GLOO"));
  EXPECT_TRUE(is_backend_available("Gloo"));
}

TEST(Registry, UnknownNamesAnswerFalse) {
  EXPECT_FALSE(is_registered_collective_backend("no-such-backend"));
  EXPECT_FALSE(is_backend_available("no-such-backend"));
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(1, 0, "no-such-backend", "g"),
                     ErrorCode::kUnavailable, "'no-such-backend' is not registered", "gloo");
}

TEST(Registry, DuplicatesAreRefusedCaseInsensitively) {
  auto factory = [](const BackendContext&) { return std::make_unique<NullBackend>(); };
  register_collective_backend("Null-Test", factory);
  EXPECT_TRUE(is_registered_collective_backend("null-test"));
  EXPECT_TUTTI_ERROR(register_collective_backend("NULL-TEST", factory), ErrorCode::kInvalidUsage,
                     "already registered");
  EXPECT_TUTTI_ERROR(register_collective_backend("", factory), ErrorCode::kInvalidArgument,
                     "empty");
}

TEST(Registry, AvailabilityIsAskedOfTheBackend) {
  register_collective_backend(
      "never-here", [](const BackendContext&) { return std::make_unique<NullBackend>(); },
      [] { return false; });
  EXPECT_TRUE(is_registered_collective_backend("never-here"));
  EXPECT_FALSE(is_backend_available("never-here"));
}

TEST(Registry, UnsupportedOpsFailBeforeIO) {
  register_collective_backend("barrier-only",
                              [](const BackendContext&) { return std::make_unique<NullBackend>(); });
  auto g = CollectiveGroup::create(1, 0, "barrier-only", "ops");
  g->barrier();
  std::vector<float> v(3);
  EXPECT_TUTTI_ERROR(g->allreduce(v), ErrorCode::kUnavailable,
                     "backend 'barrier-only' does not support 'allreduce'", "group 'ops'");
}

}  // namespace
}  // namespace tutti::testing
