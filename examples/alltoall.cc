// alltoall, gather and scatter, each in its single-buffer form.
//
//   tutti-run -n 4 ./alltoall_example
#include <cstdio>
#include <vector>

#include <tutti/tutti.h>

int main() {
  try {
    tutti::init_collective_group_from_env();
    auto group = tutti::get_group();
    const int rank = group->rank(), world = group->world_size();
    bool ok = true;

    // alltoall: block r of the input goes to rank r; block r of the output came from rank r.
    std::vector<int> send(world * 2), recv(world * 2);
    for (int r = 0; r < world; ++r) send[2 * r] = send[2 * r + 1] = 100 * rank + r;
    group->alltoall(tutti::TensorView(recv), tutti::TensorView(send));
    for (int r = 0; r < world; ++r) ok = ok && recv[2 * r] == 100 * r + rank;

    // gather to rank 0 (the others pass an empty output), then scatter back from rank 0.
    std::vector<int> mine(3, rank), all(rank == 0 ? 3 * world : 0);
    group->gather(tutti::TensorView(all), tutti::TensorView(mine));
    if (rank == 0) {
      for (int r = 0; r < world; ++r) ok = ok && all[3 * r] == r;
      for (int& x : all) x *= 10;
    }
    std::vector<int> back(3, -1);
    group->scatter(tutti::TensorView(back), tutti::TensorView(all));
    ok = ok && back[2] == 10 * rank;

    std::printf("rank %d: alltoall, gather and scatter %s\n", rank, ok ? "OK" : "WRONG");
    tutti::destroy_collective_group();
    return ok ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
