// tutti with a plugin loaded at run time, and no line of code about it: TUTTI_PLUGINS names it,
// "auto" takes its backend by priority, and PutOptions::transport names its transport.
//
//   cmake --build build --target tutti-plugin-storeloop plugin_example
//   TUTTI_PLUGINS=storeloop TUTTI_PLUGIN_PATH=build/plugins STORELOOP_PRIORITY=100 \
//     build/bin/tutti-run -n 2 build/examples/plugin_example [expected backend]
#include <cstdio>
#include <string>
#include <vector>

#include <tutti/tutti.h>

int main(int argc, char** argv) {
  try {
    tutti::init_collective_group_from_env();  // backend "auto": the plugin's, by its priority
    auto group = tutti::get_group();
    std::vector<float> v(8, static_cast<float>(group->rank() + 1));
    tutti::allreduce(v);
    const float want = static_cast<float>(group->world_size() * (group->world_size() + 1) / 2);
    bool ok = v[7] == want && (argc < 2 || group->backend_name() == argv[1]);
    std::printf("rank %d: backend %s, allreduce %g (want %g)\n", group->rank(),
                group->backend_name().c_str(), v[7], want);
    // rank 0 publishes through the plugin's transport; rank 1 gets the ref over the group.
    auto agent = tutti::default_agent();
    std::vector<int64_t> data(100), size = {0};
    std::string text;
    tutti::ObjectHandle handle;
    if (group->rank() == 0) {
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int64_t>(i * i);
      tutti::PutOptions options;
      options.transport = "inline";
      handle = agent->put({tutti::TensorView(data)}, options);
      text = handle.ref().to_text();
      size[0] = static_cast<int64_t>(text.size());
    }
    group->broadcast(size);
    text.resize(static_cast<size_t>(size[0]));
    group->broadcast(tutti::TensorView(reinterpret_cast<uint8_t*>(text.data()), text.size()));
    if (group->rank() == 1) {
      tutti::Received got = agent->get(tutti::TensorRef::from_text(text));
      const auto* d = static_cast<const int64_t*>(got.tensors()[0].data());
      ok = ok && d[99] == 99 * 99;
      std::printf("rank 1: got %lld int64s through transport '%s', last %lld\n",
                  static_cast<long long>(got.tensors()[0].numel()),
                  tutti::TensorRef::from_text(text).transport().c_str(),
                  static_cast<long long>(d[99]));
    }
    group->barrier();
    handle.release();
    tutti::destroy_collective_group();
    return ok ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
