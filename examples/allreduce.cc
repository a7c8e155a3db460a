// A multi-process allreduce to copy from. Start one process per rank:
//
//   for r in 0 1 2 3; do ./allreduce_example $r 4 file:///tmp/demo.store & done; wait
//
// Each rank contributes rank+1 in every element; all of them print the sum, 1+2+3+4 = 10.
// Use a fresh store file per job (rm /tmp/demo.store between runs).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <tutti/tutti.h>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <rank> <world_size> <store_url>\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int world_size = std::atoi(argv[2]);
  try {
    tutti::GroupOptions options;
    options.store_url = argv[3];
    options.timeout = std::chrono::seconds(30);
    tutti::init_collective_group(world_size, rank, "gloo", "default", options);

    std::vector<float> gradients(1 << 20, static_cast<float>(rank + 1));
    tutti::allreduce(gradients);  // in place, sum over ranks

    std::printf("rank %d/%d: gradients[0] = %g\n", rank, world_size, gradients[0]);
    tutti::destroy_collective_group();
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
