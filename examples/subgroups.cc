// Split a group: even and odd ranks each get a subgroup and run collectives in it at the same
// time. Every rank calls split() with the same list; ranks outside it get null.
//
//   tutti-run -n 4 ./subgroups_example
#include <cstdio>
#include <numeric>
#include <vector>

#include <tutti/tutti.h>

int main() {
  try {
    tutti::init_collective_group_from_env();
    auto world = tutti::get_group();
    const int rank = world->rank();
    std::vector<int> evens, odds;
    for (int r = 0; r < world->world_size(); ++r) (r % 2 == 0 ? evens : odds).push_back(r);

    auto even_group = world->split(evens);  // collective: every rank calls both splits
    auto odd_group = world->split(odds);
    auto mine = rank % 2 == 0 ? even_group : odd_group;

    std::vector<int> v(4, rank);
    mine->allreduce(v);  // sums the global ranks of this subgroup only
    const std::vector<int>& members = mine->global_ranks();
    const int want = std::accumulate(members.begin(), members.end(), 0);
    std::printf("rank %d: rank %d of its subgroup, sum %d\n", rank, mine->rank(), v[0]);

    mine->destroy();
    tutti::destroy_collective_group();
    return v[0] == want ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
