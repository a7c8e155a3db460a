// Survivors shrink and go on, and a replacement grows the group back. Four ranks run an allreduce
// loop; rank 2 is killed (SIGKILL) in the middle of it. The other three see their op fail naming
// the dead rank, call shrink(), agree on the step to go on from (one survivor may have finished
// the step another failed in), and go on in a group of three made through the same store (no new
// server, no new rendezvous of the job). At step 30 a replacement process (started here by rank
// 0, as a scheduler would start one) joins, the three grow the group back to four, and all four
// finish the loop. Every sum is checked.
//
//   tutti-run -n 4 --max-failures 1 ./shrink_example
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <tutti/tutti.h>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSteps = 40;
constexpr int kKillAt = 15;
constexpr int kGrowAt = 30;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The replacement: this program again, told so by its environment (it inherits the launcher's,
// so it finds the job's store).
pid_t start_replacement() {
  std::vector<std::string> env{"TUTTI_EXAMPLE_REPLACEMENT=1"};
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, self, nullptr, nullptr, argv, envp.data());
  if (rc != 0) {
    std::fprintf(stderr, "starting the replacement: %s\n", std::strerror(rc));
    std::exit(1);
  }
  return pid;
}

// The loop from `step` on; returns 0 when every sum was right.
int train(std::shared_ptr<tutti::CollectiveGroup> group, int step, int me) {
  std::vector<float> grad(1 << 16);
  pid_t replacement = 0;
  const std::string who = me < 0 ? "the replacement" : "rank " + std::to_string(me);
  while (step < kSteps) {
    if (me == 2 && step == kKillAt) ::raise(SIGKILL);  // a node lost mid-training
    if (step == kGrowAt && group->world_size() == 3) {
      // A replacement comes: the survivors admit it (every member calls grow), and tell it the
      // step to start from.
      const auto start = Clock::now();
      if (group->rank() == 0) replacement = start_replacement();
      auto grown = group->grow();
      group->destroy();
      group = grown;
      std::vector<int64_t> at{step};
      group->broadcast(at);
      std::printf("%s is rank %d of %d after a grow of %.1f ms\n", who.c_str(), group->rank(),
                  group->world_size(), ms_since(start));
    }
    // Each rank's contribution: its rank in the group it is in + 1 (so the sum says who took part).
    std::fill(grad.begin(), grad.end(), static_cast<float>(group->global_rank() + 1));
    try {
      group->allreduce(grad);
    } catch (const tutti::Error& e) {
      const auto failed = Clock::now();
      std::printf("%s, step %d: %s\n", who.c_str(), step, e.what());
      auto survivors = group->shrink();  // every survivor calls it
      const double ms = ms_since(failed);
      group->destroy();  // local: never waits on the dead rank
      group = survivors;
      // Go on from the earliest step a survivor has not finished.
      std::vector<int64_t> resume{step};
      tutti::AllreduceOptions earliest;
      earliest.reduce_op = tutti::ReduceOp::kMin;
      group->allreduce(resume, earliest);
      step = static_cast<int>(resume[0]);
      std::printf("%s is rank %d of %d after %.1f ms; on from step %d\n", who.c_str(),
                  group->rank(), group->world_size(), ms, step);
      continue;
    }
    float want = 0;
    for (int r : group->global_ranks()) want += static_cast<float>(r + 1);
    if (grad.front() != want || grad.back() != want) {
      std::fprintf(stderr, "%s, step %d: sum %g, want %g\n", who.c_str(), step, grad.front(), want);
      return 1;
    }
    ++step;
  }
  std::printf("%s: %d steps done at world %d\n", who.c_str(), kSteps, group->world_size());
  const bool regrown = group->world_size() == 4;
  group->destroy();
  if (replacement != 0) {
    int status = 0;
    ::waitpid(replacement, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "the replacement failed\n");
      return 1;
    }
  }
  return regrown ? 0 : 1;
}

}  // namespace

int main() {
  try {
    tutti::GroupOptions options;
    options.timeout = std::chrono::seconds(30);
    if (std::getenv("TUTTI_EXAMPLE_REPLACEMENT") != nullptr) {
      options.store_url = "env://";
      auto group = tutti::CollectiveGroup::join("train", options);
      std::vector<int64_t> at{0};
      group->broadcast(at);  // the step the others are at
      std::printf("replacement joined as rank %d of %d at step %d\n", group->rank(),
                  group->world_size(), static_cast<int>(at[0]));
      return train(group, static_cast<int>(at[0]), /*me=*/-1);
    }
    tutti::init_collective_group_from_env("", "train", options);
    std::shared_ptr<tutti::CollectiveGroup> group = tutti::get_group("train");
    if (group->world_size() != 4) {
      std::fprintf(stderr, "run with 4 ranks: tutti-run -n 4 --max-failures 1 ...\n");
      return 2;
    }
    const int me = group->rank();
    const int rc = train(group, 0, me);
    tutti::destroy_collective_group("train");
    return rc;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
