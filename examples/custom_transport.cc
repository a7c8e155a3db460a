// A custom tensor transport: "spool" writes each published object to a file in a directory both
// processes can read, and the consumer reads it back. Registered under a name, it is picked per
// put (PutOptions::transport) and found again by name when a ref is resolved; the agent keeps
// the object table, the refs and the leases, the transport only moves bytes.
//
//   tutti-run -n 2 ./custom_transport_example
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <tutti/tensor_transport.h>
#include <tutti/transfer_agent.h>
#include <tutti/tutti.h>

class SpoolTransport final : public tutti::TensorTransport {
 public:
  explicit SpoolTransport(std::string dir) : dir_(std::move(dir)) {}
  const char* name() const override { return "spool"; }
  // One-sided (the consumer reads the file itself; the agent's lease keeps the owner from
  // deleting it meanwhile), no borrowing, one host (or a shared file system).
  tutti::TransportTraits traits() const override { return {true, false, false}; }

  tutti::Publication publish(const tutti::PublishRequest& request) override {
    const std::string path = path_of(request.object);
    std::ofstream out(path, std::ios::binary);
    for (const tutti::TensorView& t : request.tensors) {
      out.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
    }
    if (!out) throw tutti::Error(tutti::ErrorCode::kIoError, "spool: cannot write " + path);
    return {path, {}};  // the blob: where the consumer finds the bytes
  }

  void unpublish(tutti::ObjectId object) noexcept override { ::unlink(path_of(object).c_str()); }

  tutti::FetchResult fetch(const tutti::FetchRequest& request) override {
    std::ifstream in(request.ref.blob(), std::ios::binary);
    for (const tutti::TensorView& t : request.targets) {
      in.read(static_cast<char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
    }
    if (!in)
      throw tutti::Error(tutti::ErrorCode::kIoError, "spool: cannot read " + request.ref.blob());
    return {};
  }

 private:
  std::string path_of(tutti::ObjectId object) const {
    return dir_ + "/tutti-spool-" + std::to_string(::getpid()) + "-" + std::to_string(object.id);
  }
  std::string dir_;
};

int main() {
  try {
    // Every process that puts or gets with it registers it (before the first ref names it).
    tutti::register_tensor_transport("spool", [](const tutti::TransportContext&) {
      return std::make_unique<SpoolTransport>(::getenv("TMPDIR") ? ::getenv("TMPDIR") : "/tmp");
    });
    tutti::init_collective_group_from_env();
    auto group = tutti::get_group();
    auto agent = tutti::default_agent();
    std::vector<int64_t> size = {0};
    std::string text;
    std::vector<double> data(1000);
    tutti::ObjectHandle handle;
    if (group->rank() == 0) {
      for (size_t i = 0; i < data.size(); ++i) data[i] = 0.5 * static_cast<double>(i);
      tutti::PutOptions options;
      options.transport = "spool";
      handle = agent->put({tutti::TensorView(data)}, options);
      text = handle.ref().to_text();
      size[0] = static_cast<int64_t>(text.size());
    }
    group->broadcast(size);  // the ref to rank 1, over the group
    text.resize(static_cast<size_t>(size[0]));
    group->broadcast(tutti::TensorView(reinterpret_cast<uint8_t*>(text.data()), text.size()));
    bool ok = true;
    if (group->rank() == 1) {
      tutti::Received got = agent->get(tutti::TensorRef::from_text(text));
      const double* d = static_cast<const double*>(got.tensors()[0].data());
      ok = d[999] == 499.5;
      std::printf("rank 1: got %lld doubles through 'spool', last %g\n",
                  static_cast<long long>(got.tensors()[0].numel()), d[999]);
    }
    group->barrier();  // rank 1 is done before rank 0 drops the object (and its file)
    handle.release();
    tutti::destroy_collective_group();
    return ok ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
