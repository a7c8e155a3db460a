// Overlap compute with an allreduce: issue it with async_op, compute, then wait.
//
//   tutti-run -n 2 ./overlap_example
//
// The buffer belongs to the op until wait() returns: do not read or write it meanwhile.
#include <cstdio>
#include <vector>

#include <tutti/tutti.h>

int main() {
  try {
    tutti::init_collective_group_from_env();
    auto group = tutti::get_group();
    const int rank = group->rank(), world = group->world_size();

    std::vector<float> gradients(1 << 22, static_cast<float>(rank + 1));
    tutti::AllreduceOptions opts;
    opts.async_op = true;
    std::shared_ptr<tutti::Work> work = group->allreduce(gradients, opts);  // returns at once

    double activations = 0;  // the caller's own work, on other data
    for (int i = 0; i < 10000000; ++i) activations += 1e-7;

    work->wait();  // rethrows the op's tutti::Error, if it failed
    const float want = world * (world + 1) / 2.0f;
    std::printf("rank %d: allreduce %s (%g), computed %.3f meanwhile\n", rank,
                gradients.back() == want ? "done" : "WRONG", gradients.back(), activations);
    tutti::destroy_collective_group();
    return gradients.back() == want ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
