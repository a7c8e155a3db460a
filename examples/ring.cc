// Pass tensors around a ring in one batched call: every rank sends to its right neighbour and
// receives from its left, posted together, so no rank waits in a send for a receive that
// comes later (as a loop of blocking send/recv would, once messages are large).
//
//   tutti-run -n 4 ./ring_example
#include <cstdio>
#include <vector>

#include <tutti/tutti.h>

int main() {
  try {
    tutti::init_collective_group_from_env();
    auto group = tutti::get_group();
    const int rank = group->rank(), world = group->world_size();
    const int right = (rank + 1) % world, left = (rank + world - 1) % world;

    std::vector<double> mine(1 << 20, rank), from_left(1 << 20, -1);
    group->batch_isend_irecv(
        {tutti::P2POp::send(mine, right), tutti::P2POp::recv(from_left, left)});

    std::printf("rank %d: received %g from rank %d\n", rank, from_left[0], left);
    tutti::destroy_collective_group();
    return from_left[0] == left ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
