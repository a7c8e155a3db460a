// 1000 destroy/re-create cycles of a Gloo group on every store kind (label "large": about 40 s
// a kind here, past the CI budget; TUTTI_TEST_LARGE=1 scripts/test.sh runs it). The default run
// has 1000 shm cycles through the file store, 250 through each other kind and 150 Gloo ones
// through the TCP store rank 0 hosts (fault_test's Cycles).
#include "fault_util.h"

namespace tutti::testing {
namespace {

class GlooCycles : public ::testing::TestWithParam<std::string> {};

TEST_P(GlooCycles, AThousandLeaveNothingBehind) {
  run_cycles("gloo", GetParam(), 1000);
}

INSTANTIATE_TEST_SUITE_P(Stores, GlooCycles,
                         ::testing::Values("file", "tcp_hosted", "tutti_store", "redis"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tutti::testing
