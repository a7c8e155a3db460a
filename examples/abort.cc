// Abort a stuck group from another thread. The other ranks are busy for 2 s before they join
// the second allreduce, so rank 0's waits; a watchdog thread aborts the group after 300 ms. The
// op ends at once with kAborted (the others, when they arrive, find the group aborted: shm
// names rank 0, gloo a rank whose connection reset); then every rank makes the group again
// under the same name.
//
//   tutti-run -n 2 ./abort_example
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <tutti/tutti.h>

int main() {
  try {
    tutti::GroupOptions options;
    options.timeout = std::chrono::seconds(60);
    tutti::init_collective_group_from_env("", "default", options);
    auto group = tutti::get_group();
    const int rank = group->rank();
    std::vector<float> v(1024, 1.0f);
    group->allreduce(v);

    if (rank == 0) {
      std::thread watchdog([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        tutti::abort_collective_group("default", "the watchdog gave up on it");
      });
      const auto start = std::chrono::steady_clock::now();
      try {
        group->allreduce(v);  // rank 1 never comes
      } catch (const tutti::Error& e) {
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        std::printf("rank 0: %s after %.0f ms: %s\n", tutti::to_string(e.code()), ms, e.what());
      }
      watchdog.join();
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(2));  // busy elsewhere
      try {
        group->allreduce(v);
      } catch (const tutti::Error& e) {
        std::printf("rank %d: %s: %s\n", rank, tutti::to_string(e.code()), e.what());
      }
    }
    const bool aborted = group->is_aborted();
    const int world_size = group->world_size();
    tutti::destroy_collective_group();

    // The same name again: a fresh group.
    tutti::init_collective_group_from_env("", "default", options);
    std::vector<float> w(8, 1.0f);
    tutti::allreduce(w);
    std::printf("rank %d: the group was made again: %g\n", rank, w[0]);
    tutti::destroy_collective_group();
    return aborted && w[0] == world_size ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
