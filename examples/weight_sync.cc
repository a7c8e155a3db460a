// Weight sync with the direct transport: rank 0 (the trainer) publishes its weights in place,
// hands the small reference to the other ranks (the inference workers) over the group, and
// they pull the weights straight from its memory: a zero-copy borrow, or a copy into their own
// buffer. Before it overwrites the weights for the next step, the trainer waits until every
// worker has let go of them.
//
//   tutti-run -n 3 ./weight_sync_example
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <tutti/transfer_agent.h>
#include <tutti/tutti.h>

// Rank 0's ref text to every rank (any channel would do: a store, a file, an RPC).
std::string share(tutti::CollectiveGroup& group, std::string text) {
  std::vector<int64_t> size = {static_cast<int64_t>(text.size())};
  group.broadcast(size);
  text.resize(static_cast<size_t>(size[0]));
  group.broadcast(tutti::TensorView(reinterpret_cast<uint8_t*>(text.data()), text.size()));
  return text;
}

int main() {
  try {
    tutti::init_collective_group_from_env();
    auto group = tutti::get_group();
    const int rank = group->rank();
    auto agent = tutti::default_agent();
    constexpr int64_t kWeights = 1 << 20;
    bool ok = true;

    if (rank == 0) {
      // Memory the consumers on this host can map: their borrows are zero-copy.
      tutti::TensorView weights = agent->allocate(kWeights * sizeof(float), tutti::DType::kFloat32);
      float* w = static_cast<float*>(weights.data());
      for (int step = 0; step < 3; ++step) {
        for (int64_t i = 0; i < kWeights; ++i) w[i] = static_cast<float>(step * 1000 + i % 1000);
        tutti::PutOptions options;
        options.expected_gets = static_cast<uint32_t>(group->world_size() - 1);
        tutti::ObjectHandle handle = agent->put({weights}, options);
        share(*group, handle.ref().to_text());
        handle.release();  // the expected gets keep it until every worker has it
        agent->wait_tensor_freed(weights, std::chrono::seconds(60));
        std::printf("trainer: step %d weights taken by %d workers\n", step,
                    group->world_size() - 1);
      }
      agent->deallocate(weights);
    } else {
      std::vector<float> mine(kWeights);
      for (int step = 0; step < 3; ++step) {
        const auto ref = tutti::TensorRef::from_text(share(*group, ""));
        float first;
        if (rank % 2 == 1) {
          tutti::Borrowed view = agent->borrow(ref);  // zero-copy, read-only
          first = static_cast<const float*>(view.tensors()[0].data())[999];
        } else {
          tutti::GetOptions options;
          options.targets = {tutti::TensorView(mine)};
          agent->get(ref, options);  // one copy into our own buffer
          first = mine[999];
        }
        ok = ok && first == static_cast<float>(step * 1000 + 999);
        std::printf("worker %d (%s): step %d weight[999] = %g\n", rank,
                    rank % 2 == 1 ? "borrow" : "copy", step, first);
      }
    }
    tutti::destroy_collective_group();
    return ok ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
