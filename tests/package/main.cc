// Links the installed tutti, checks that "gloo" registered itself, runs an allreduce over two
// processes (this one and a child it starts) meeting through a FileStore.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <tutti/plugin_loader.h>
#include <tutti/tutti.h>

int main(int argc, char** argv) {
  if (!tutti::is_registered_collective_backend("gloo")) {
    std::fprintf(stderr, "gloo is not registered\n");
    return 1;
  }
  const std::string store = argc > 1 ? argv[1] : "";
  if (store.empty()) {
    std::fprintf(stderr, "usage: consumer file:///path/to/store\n");
    return 2;
  }
  // Fork before any tutti thread exists; the child is rank 1.
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  tutti::GroupOptions options;
  options.store_url = store;
  options.timeout = std::chrono::seconds(20);
  tutti::init_collective_group(2, rank, "gloo", "default", options);
  std::vector<float> v(16, rank + 1.0f);
  tutti::allreduce(v);
  tutti::destroy_collective_group();
  if (v[15] != 3.0f) {
    std::fprintf(stderr, "rank %d: wrong sum %f\n", rank, v[15]);
    return 1;
  }
#ifdef PLUGIN_PATH
  // A plugin built outside tutti's tree, loaded into the installed tutti: its backend by name.
  const tutti::LoadedPlugin plugin = tutti::load_plugin(PLUGIN_PATH);
  tutti::init_collective_group(2, rank, plugin.backends.at(0), "plugged", options);
  std::vector<int64_t> w(5, rank + 10);
  tutti::allreduce(w, "plugged");
  tutti::destroy_collective_group("plugged");
  if (w[4] != 21) {
    std::fprintf(stderr, "rank %d: the plugin's sum is %lld\n", rank, static_cast<long long>(w[4]));
    return 1;
  }
  if (rank == 0)
    std::printf("plugin '%s' built outside the tree: allreduce OK\n", plugin.name.c_str());
#endif
  if (child == 0) return 0;
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
  std::printf("installed tutti %s: allreduce over 2 processes OK\n", tutti::version());
  return 0;
}
