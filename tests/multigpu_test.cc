// The multi-device (Ray *_multigpu) API's validation and dispatch, with a recording backend
// that claims CUDA devices: no GPU is touched, so this runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "test_util.h"

namespace tutti::testing {
namespace {

struct Recorded {
  std::mutex mutex;
  std::vector<std::string> calls;
};

Recorded& recorded() {
  static Recorded r;
  return r;
}

class RecordingBackend : public Backend {
 public:
  const char* name() const override { return "recording"; }
  bool supports_device(DeviceType) const override { return true; }
  int max_devices_per_op() const override { return 4; }
  WorkPtr allreduce(const std::vector<TensorView>& t, const AllreduceOptions&,
                    const OpContext& ctx) override {
    note("allreduce x" + std::to_string(t.size()) + " tag " + std::to_string(ctx.tag));
    return nullptr;
  }
  WorkPtr allgather(const std::vector<std::vector<TensorView>>& out,
                    const std::vector<TensorView>& in, const AllgatherOptions&,
                    const OpContext&) override {
    note("allgather " + std::to_string(in.size()) + "x" + std::to_string(out[0].size()));
    return nullptr;
  }
  WorkPtr send(const std::vector<TensorView>& t, int dst, const SendOptions& o,
               const OpContext& ctx) override {
    note("send " + std::to_string(t[0].numel()) + " to " + std::to_string(dst) + ":" +
         std::to_string(o.dst_device_index) + " tag " + std::to_string(ctx.tag));
    return nullptr;
  }
  WorkPtr recv(const std::vector<TensorView>& t, int src, const RecvOptions& o,
               const OpContext& ctx) override {
    note("recv " + std::to_string(t[0].numel()) + " from " + std::to_string(src) + ":" +
         std::to_string(o.src_device_index) + " tag " + std::to_string(ctx.tag));
    return nullptr;
  }
  void abort(const std::string&) override {}

 private:
  static void note(const std::string& s) {
    std::lock_guard<std::mutex> lock(recorded().mutex);
    recorded().calls.push_back(s);
  }
};

class MultiGpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!is_registered_collective_backend("recording")) {
      register_collective_backend(
          "recording", [](const BackendContext&) { return std::make_unique<RecordingBackend>(); });
    }
  }
  void SetUp() override {
    groups_ = create_groups(2, "recording", unique_name("multi"));
    std::lock_guard<std::mutex> lock(recorded().mutex);
    recorded().calls.clear();
  }
  // A fake device tensor: the recording backend never touches memory.
  TensorView on(int gpu, int64_t n = 8, DType dtype = DType::kFloat32) {
    return TensorView(fake_, dtype, {n}, Device::cuda(gpu));
  }
  // The same, 8 floats at slot `slot` (0-15) of the fake memory: apart from the others.
  TensorView at(int gpu, int slot) {
    return TensorView(reinterpret_cast<float*>(fake_) + 8 * slot, DType::kFloat32, {8},
                      Device::cuda(gpu));
  }
  std::vector<std::shared_ptr<CollectiveGroup>> groups_;
  double fake_[64] = {};
};

TEST_F(MultiGpu, ListRules) {
  CollectiveGroup& g = *groups_[0];
  EXPECT_TUTTI_ERROR(g.allreduce_multigpu({}), ErrorCode::kInvalidArgument, "tensor list is empty");
  EXPECT_TUTTI_ERROR(g.allreduce_multigpu({on(0), on(1), on(0)}), ErrorCode::kInvalidArgument,
                     "tensors 0 and 2 are both on cuda:0", "one tensor per device");
  EXPECT_TUTTI_ERROR(g.allreduce_multigpu({on(0), on(1, 9)}), ErrorCode::kInvalidArgument,
                     "tensor 1 is float32[9] on cuda:1", "one shape and dtype");
  EXPECT_TUTTI_ERROR(g.allreduce_multigpu({on(0), on(1, 8, DType::kFloat16)}),
                     ErrorCode::kInvalidArgument, "float16");
  EXPECT_TUTTI_ERROR(g.allreduce_multigpu({on(0), on(1), on(2), on(3), on(4)}),
                     ErrorCode::kInvalidArgument, "at most 4 tensor(s) per op, got a list of 5");
  ReduceOptions r;
  r.root_tensor = 2;
  EXPECT_TUTTI_ERROR(g.reduce_multigpu({on(0), on(1)}, r), ErrorCode::kInvalidArgument,
                     "root tensor 2 is outside [0, 2)");
  BroadcastOptions b;
  b.root_rank = 5;
  EXPECT_TUTTI_ERROR(g.broadcast_multigpu({on(0)}, b), ErrorCode::kInvalidArgument, "root rank 5");
  // allgather: per device, world size x devices outputs shaped like that device's input.
  EXPECT_TUTTI_ERROR(g.allgather_multigpu({{on(0), on(0), on(0), on(0)}}, {on(0), on(1)}),
                     ErrorCode::kInvalidArgument, "output list has 1 lists for 2 devices");
  EXPECT_TUTTI_ERROR(g.allgather_multigpu({{on(0), on(0)}, {on(1), on(1)}}, {on(0), on(1)}),
                     ErrorCode::kInvalidArgument, "output list 0 has 2 tensors",
                     "world size x devices = 4");
  EXPECT_TUTTI_ERROR(
      g.allgather_multigpu({{on(0), on(0), on(0), on(1)}, {on(1), on(1), on(1), on(1)}},
                           {on(0), on(1)}),
      ErrorCode::kInvalidArgument, "output list 0[3] is on cuda:1");
  EXPECT_TUTTI_ERROR(g.send_multigpu(on(0), 1, 9), ErrorCode::kInvalidArgument,
                     "n_elements 9 is outside [0, 8]");
  SendOptions neg;
  neg.dst_device_index = -1;
  EXPECT_TUTTI_ERROR(g.send_multigpu(on(0), 1, 0, neg), ErrorCode::kInvalidArgument,
                     "destination device index -1");
  EXPECT_TRUE(recorded().calls.empty());  // nothing reached the backend
}

TEST_F(MultiGpu, GlooTakesOneTensorPerOp) {
  auto gloo = CollectiveGroup::create(1, 0, "gloo", unique_name("one"));
  std::vector<float> a(4), b(4);
  TensorView va(a);
  TensorView vb(b.data(), DType::kFloat32, {4}, Device::cpu());
  EXPECT_TUTTI_ERROR(gloo->allreduce_multigpu({va, vb}), ErrorCode::kInvalidArgument,
                     "backend 'gloo' takes at most 1 tensor(s) per op");
  gloo->allreduce_multigpu({va});  // a list of one is the plain op
}

TEST_F(MultiGpu, DispatchAndMatchingPointToPointTags) {
  run_ranks(2, [&](int r) {
    CollectiveGroup& g = *groups_[r];
    g.allreduce_multigpu({on(0), on(1)});
    // Outputs apart from the input on each device (the list forms refuse an overlap, but for
    // this rank's own entry being the input itself).
    g.allgather_multigpu(
        {{at(0, 1), at(0, 2), at(0, 3), at(0, 4)}, {at(1, 1), at(1, 2), at(1, 3), at(1, 4)}},
        {on(0), on(1)});
    if (r == 0) {
      SendOptions o;
      o.dst_device_index = 1;
      g.send_multigpu(on(0), 1, 5, o);  // from cuda:0 to rank 1's cuda:1, 5 elements
    } else {
      RecvOptions o;
      o.src_device_index = 0;
      g.recv_multigpu(on(1), 0, 5, o);
    }
  });
  std::lock_guard<std::mutex> lock(recorded().mutex);
  auto& calls = recorded().calls;
  ASSERT_EQ(calls.size(), 6u);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "allgather 2x4"), 2);
  std::string send, recv;
  for (const auto& c : calls) {
    if (c.rfind("send", 0) == 0) send = c;
    if (c.rfind("recv", 0) == 0) recv = c;
  }
  ASSERT_EQ(send.rfind("send 5 to 1:1 tag ", 0), 0u) << send;
  ASSERT_EQ(recv.rfind("recv 5 from 0:0 tag ", 0), 0u) << recv;
  // Both ends derive the same tag, so a real transport pairs them.
  EXPECT_EQ(send.substr(send.find("tag")), recv.substr(recv.find("tag")));
}

}  // namespace
}  // namespace tutti::testing
