// Survivors shrink and go on. Four ranks run an allreduce loop; rank 2 is killed (SIGKILL) in
// the middle of it. The other three see their op fail naming the dead rank, call shrink(), agree
// on the step to go on from (one survivor may have finished the step another failed in), and
// finish the loop in a group of three made through the same store (no new server, no new
// rendezvous of the job), checking every sum.
//
//   tutti-run -n 4 --max-failures 1 ./shrink_example
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include <tutti/tutti.h>

int main() {
  using Clock = std::chrono::steady_clock;
  try {
    tutti::GroupOptions options;
    options.timeout = std::chrono::seconds(30);
    tutti::init_collective_group_from_env("", "train", options);
    std::shared_ptr<tutti::CollectiveGroup> group = tutti::get_group("train");
    const int me = group->rank();
    if (group->world_size() != 4) {
      std::fprintf(stderr, "run with 4 ranks: tutti-run -n 4 --max-failures 1 ...\n");
      return 2;
    }
    std::vector<float> grad(1 << 16);
    for (int step = 0; step < 40;) {
      if (me == 2 && step == 15) ::raise(SIGKILL);  // a node lost mid-training
      // Each rank's contribution: its rank in the job + 1, so the sum says who took part.
      std::fill(grad.begin(), grad.end(), static_cast<float>(group->global_rank() + 1));
      try {
        group->allreduce(grad);
      } catch (const tutti::Error& e) {
        const auto failed = Clock::now();
        std::printf("rank %d, step %d: %s\n", me, step, e.what());
        auto survivors = group->shrink();  // every survivor calls it
        const double ms =
            std::chrono::duration<double, std::milli>(Clock::now() - failed).count();
        tutti::destroy_collective_group("train");  // local: never waits on the dead rank
        group = survivors;
        // Go on from the earliest step a survivor has not finished.
        std::vector<int64_t> resume{step};
        tutti::AllreduceOptions earliest;
        earliest.reduce_op = tutti::ReduceOp::kMin;
        group->allreduce(resume, earliest);
        step = static_cast<int>(resume[0]);
        std::printf("rank %d is rank %d of %d after %.1f ms; on from step %d\n", me, group->rank(),
                    group->world_size(), ms, step);
        continue;
      }
      float want = 0;
      for (int r : group->global_ranks()) want += static_cast<float>(r + 1);
      if (grad.front() != want || grad.back() != want) {
        std::fprintf(stderr, "rank %d, step %d: sum %g, want %g\n", me, step, grad.front(), want);
        return 1;
      }
      ++step;
    }
    std::printf("rank %d: 40 steps done at world %d\n", me, group->world_size());
    const bool shrank = group->world_size() == 3;
    group->destroy();
    return shrank ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
