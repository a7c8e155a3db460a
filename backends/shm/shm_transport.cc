// The "shm" tensor transport of the direct transport (tutti/transfer_agent.h): consumers on the
// owner's host read the owner's memory themselves.
// - Tensors in the owner's blocks (TransferAgent::allocate's memory, or memory registered with its
//   file; shm_blocks.h): the consumer maps the block (once: mappings are cached, shm_mappings.h),
//   then copies from it, or borrows views of it (zero-copy), or, for a get that asks for
//   copy-on-write, maps it privately and hands out views its writes never leave.
// - Any other CPU tensor: one copy by cross-memory read (process_vm_readv) from the owner's
//   address space; where the kernel refuses it (another user, Yama), the owner streams the bytes
//   over the agents' Unix socket instead.
// The agent's lease keeps the owner from freeing an object while a consumer reads it.
#include <sched.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "shm_blocks.h"
#include "shm_mappings.h"
#include "shm_messages.h"
#include "tutti/error.h"
#include "tutti/tensor_transport.h"
#include "tutti/transport_codec.h"
#include "util/logging.h"
#include "util/shared_memory.h"

namespace tutti::shm_backend {
namespace {

// A long copy looks at cancel and its deadline between slices. Large, because memcpy streams
// (non-temporal stores) only above a size tied to the cache (~100 MiB on a 260 MiB L3): smaller
// slices of a huge copy ran at half a plain memcpy's speed. At >= 5 GB/s a slice takes <= 50 ms.
constexpr size_t kCopySlice = 256u << 20;
// A copy from twice this is shared between threads: this one and up to copy_threads() - 1 more,
// in slices of at least this. Two threads of this VM read another process's memory at 17 GB/s
// (process_vm_readv, 16 MiB), one at 9; but at 4 MiB two took 1.20x one's time (starting a
// thread, and both pinning the owner's pages), at 8 MiB 0.59x (memcpy from a mapped block: 0.89x
// and 0.66x).
constexpr size_t kPartBytes = 4u << 20;

// TUTTI_TRANSFER_COPY_THREADS (1-64), else the CPUs the thread of the process's first large copy
// may run on, at most 4 (read once: a later change of affinity is not seen).
size_t copy_threads() {
  static const size_t threads = [] {
    const char* v = std::getenv("TUTTI_TRANSFER_COPY_THREADS");
    if (v != nullptr && *v != '\0') return static_cast<size_t>(std::clamp(std::atol(v), 1L, 64L));
    cpu_set_t set;
    CPU_ZERO(&set);
    const long cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0
                          ? CPU_COUNT(&set)
                          : static_cast<long>(std::thread::hardware_concurrency());
    return static_cast<size_t>(std::clamp(cpus, 1L, 4L));
  }();
  return threads;
}

// Throws kAborted once the fetch is cancelled, kTimeout past its deadline.
void check_going(const FetchRequest& request, const std::string& what) {
  if (request.cancelled.load()) throw Error(ErrorCode::kAborted, what + ": cancelled");
  if (std::chrono::steady_clock::now() >= request.deadline) {
    throw Error(ErrorCode::kTimeout, what + ": the copy ran past the deadline");
  }
}

// Copies [0, bytes) by slice(offset, length) (false: stop, nothing wrong), slice after slice in
// order, on this thread and, from 2 x kPartBytes, up to copy_threads() - 1 more taking the next
// slice each. Before taking one, a thread looks at cancel and the deadline. Every slice taken is
// finished, so a copy that a cancel or its deadline ends has copied whole slices from the start:
// a prefix (after a failed read the target holds whatever arrived). Slices are kCopySlice, or half
// of it where that gives each thread two or more (a cancel then finds slices not yet taken;
// memcpy still streams at that size); a copy too small for that is one slice per thread, or
// slices of kPartBytes (the last shorter) where those would be smaller. The first error thrown
// is rethrown once every thread has ended; a thread that cannot start is not needed (no pool: a
// copy this large takes ~0.3 ms or more, a thread ~30 us to start).
template <typename Slice>
void copy_in_slices(size_t bytes, const FetchRequest& request, const std::string& what,
                    const Slice& slice) {
  if (bytes == 0) return;
  const size_t threads = bytes >= 2 * kPartBytes ? copy_threads() : 1;
  size_t size = kCopySlice;
  if (threads > 1 && bytes / size < 2 * threads) {
    constexpr size_t kPage = 4096;
    const size_t share = (bytes + threads - 1) / threads;  // rounded up: `threads` slices at most
    size = bytes / (kCopySlice / 2) >= 2 * threads
               ? kCopySlice / 2
               : std::max(kPartBytes, (share + kPage - 1) / kPage * kPage);
  }
  const size_t count = (bytes + size - 1) / size;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::exception_ptr first;
  auto work = [&]() noexcept {
    try {
      while (!stop.load()) {
        check_going(request, what);
        const size_t k = next.fetch_add(1);
        if (k >= count) return;
        const size_t at = k * size;
        if (!slice(at, std::min(size, bytes - at))) stop = true;
      }
    } catch (...) {
      stop = true;
      std::lock_guard<std::mutex> lock(mutex);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  try {
    helpers.reserve(std::min(threads, count) - 1);
    for (size_t t = 1; t < std::min(threads, count); ++t) helpers.emplace_back(work);
  } catch (...) {  // no memory or no thread: the slices left are this thread's
  }
  work();
  for (std::thread& t : helpers) t.join();
  if (first) std::rethrow_exception(first);
}

class ShmTransport final : public TensorTransport {
 public:
  explicit ShmTransport(const TransportContext&) {}

  const char* name() const override { return "shm"; }
  TransportTraits traits() const override { return {true, true, false}; }

  // ---- owner (shm_blocks.h) ----

  TensorView allocate(size_t bytes, DType dtype) override { return blocks_.allocate(bytes, dtype); }
  void deallocate(const TensorView& memory) override { blocks_.deallocate(memory); }
  bool owns(const TensorView& memory) const override { return blocks_.owns(memory); }
  void register_memory(const TensorView& region, int fd, uint64_t fd_offset) override {
    blocks_.register_memory(region, fd, fd_offset);
  }
  void unregister_memory(const TensorView& region) override { blocks_.unregister_memory(region); }
  Publication publish(const PublishRequest& request) override {
    return blocks_.publish(request.object, request.tensors);
  }
  void unpublish(ObjectId object) noexcept override { blocks_.unpublish(object); }
  // A block's memfd (and the table of live blocks), to a consumer of this user on this host (the
  // agent checked both when it accepted the connection); both sealed: read-only there.
  std::string answer(const std::string& request, const AgentIdentity&,
                     std::vector<int>* fds) override {
    return blocks_.answer(parse_block_request(request), fds);
  }

  // ---- consumer ----

  // Tensors in a block: copied from the block's cached mapping, or lent as views of it (a borrow;
  // a private copy-on-write mapping when writable). Others: cross-memory reads, all of the
  // object's as one copy (read_remote; a borrow's into memory of its own, one allocation for
  // those under 4 MiB).
  FetchResult fetch(const FetchRequest& request) override {
    const auto& metas = request.ref.tensors();
    const bool lend = request.borrow;
    FetchResult out;
    out.shares_owner_memory = false;
    std::vector<std::shared_ptr<Mapping>> keep;
    std::vector<const char*> sources = map_blocks(request, lend && request.writable, keep);
    std::vector<size_t> remote;
    std::vector<TensorView> remote_into;
    auto storage = std::make_shared<std::vector<std::shared_ptr<void>>>();
    // A borrow's memory for the tensors outside blocks, allocated together (receive_buffers).
    std::vector<std::shared_ptr<void>> own;
    if (lend) {
      std::vector<size_t> bytes;
      for (size_t i = 0; i < metas.size(); ++i) {
        if (sources[i] == nullptr) bytes.push_back(metas[i].nbytes());
      }
      own = detail::receive_buffers(bytes);
    }
    for (size_t i = 0; i < metas.size(); ++i) {
      const TensorMeta& m = metas[i];
      if (lend && sources[i] != nullptr) {
        out.views.emplace_back(const_cast<char*>(sources[i]), m.dtype, m.shape, Device::cpu());
        out.shares_owner_memory = true;
      } else if (lend) {
        storage->push_back(std::move(own[remote.size()]));
        void* p = storage->back().get();
        out.views.emplace_back(p, m.dtype, m.shape, Device::cpu());
        remote.push_back(i);
        remote_into.push_back(out.views.back());
      } else if (sources[i] != nullptr) {
        char* dst = static_cast<char*>(request.targets[i].data());
        const char* src = sources[i];
        copy_in_slices(m.nbytes(), request, "shm transport: copying tensor " + std::to_string(i),
                       [dst, src](size_t at, size_t n) {
                         std::memcpy(dst + at, src + at, n);
                         return true;
                       });
      } else {
        remote.push_back(i);
        remote_into.push_back(request.targets[i]);
      }
    }
    read_remote(request, remote, remote_into);
    if (lend) {
      out.keep = std::make_shared<std::pair<decltype(keep), decltype(storage)>>(std::move(keep),
                                                                                std::move(storage));
    }
    return out;
  }

 private:
  // Where each tensor lies in this process once its block is mapped (null: not in a block). A
  // private copy maps each block once for all the tensors in it that do not overlap (a thousand
  // views of one block: one mapping, where each took its own of the whole block); a tensor that
  // overlaps one of them gets a mapping of its own, so that no two tensors of the get share
  // bytes, as no two copies do.
  std::vector<const char*> map_blocks(const FetchRequest& request, bool private_copy,
                                      std::vector<std::shared_ptr<Mapping>>& keep) {
    const std::vector<RefPlace> places = read_ref_places(request.ref);
    std::vector<const char*> sources(places.size(), nullptr);
    struct Private {
      std::shared_ptr<Mapping> mapping;
      std::map<uint64_t, uint64_t> taken;  // [offset, end) of the tensors it holds
    };
    std::map<uint64_t, Private> privates;  // by block
    for (size_t i = 0; i < places.size(); ++i) {
      const RefPlace& place = places[i];
      if (!place.in_block) continue;
      std::shared_ptr<Mapping> m;
      if (private_copy) {
        Private& p = privates[place.block];
        const uint64_t begin = place.at;
        const uint64_t end = begin + place.bytes;  // (past the block, or wrapped: refused below)
        auto after = p.taken.lower_bound(end);     // the first that begins at or past our end
        const bool overlaps =
            end > begin && after != p.taken.begin() && std::prev(after)->second > begin;
        if (p.mapping && !overlaps) {
          m = p.mapping;
        } else {
          m = mappings_.map(request, place.block, true);
          if (!p.mapping) p.mapping = m;
        }
        if (m == p.mapping && end > begin) p.taken.emplace(begin, end);
      } else {
        m = mappings_.map(request, place.block, false);
      }
      check_in_block(i, place, m->size());
      sources[i] = m->data() + place.at;
      keep.push_back(std::move(m));
    }
    return sources;
  }

  // `bytes` of tensor `index` from `address` in the owner's memory; false (after setting
  // cma_refused_) where the kernel refuses cross-memory reads from it.
  bool read_range(pid_t pid, size_t index, char* dst, uint64_t address, size_t bytes) {
    for (size_t done = 0; done < bytes;) {
      iovec local{dst + done, bytes - done};
      iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
      const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (got > 0) {
        done += static_cast<size_t>(got);
        continue;
      }
      const int err = errno;
      if (err == EPERM || err == ENOSYS) {
        if (!cma_refused_.exchange(true)) {
          TUTTI_LOG_INFO(
              "shm transport: cross-memory reads from pid {} are refused ({}); the "
              "owner streams such tensors over a Unix socket (put tensors from "
              "TransferAgent::allocate for zero-copy)",
              pid, std::strerror(err));
        }
        return false;
      }
      if (err == ESRCH) {
        throw Error(ErrorCode::kIoError, "shm transport: the owner (pid " + std::to_string(pid) +
                                             ") is gone: it exited or died");
      }
      throw Error(ErrorCode::kIoError, "shm transport: reading tensor " + std::to_string(index) +
                                           " from pid " + std::to_string(pid) + ": " +
                                           std::strerror(err));
    }
    return true;
  }

  // Tensors outside shared blocks: a cross-memory read, or the owner streams them.
  void read_remote(const FetchRequest& request, const std::vector<size_t>& which,
                   const std::vector<TensorView>& into) {
    if (which.empty()) return;
    const auto& places = request.ref.places();
    const pid_t pid = static_cast<pid_t>(request.ref.owner().pid);
    std::atomic<bool> refused{cma_refused_.load()};
    // The tensors end to end, as one copy: a thousand small ones share the threads of a large
    // one (each slice reads the pieces of the tensors it covers).
    std::vector<size_t> ends(which.size());  // where tensor k ends in the whole
    size_t total = 0;
    for (size_t k = 0; k < which.size(); ++k) ends[k] = total += into[k].nbytes();
    if (!refused.load()) {
      copy_in_slices(total, request, "shm transport", [&](size_t at, size_t n) {
        size_t k =
            static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), at) - ends.begin());
        for (const size_t end = at + n; at < end; ++k) {
          // A slice of a thousand small tensors is as many reads: cancel and the deadline are
          // looked at every few, not only between slices as copy_in_slices does.
          if (k % 64 == 63) check_going(request, "shm transport");
          const size_t begins = ends[k] - into[k].nbytes();
          const size_t from = at - begins;
          const size_t len = std::min(end, ends[k]) - at;
          char* dst = static_cast<char*>(into[k].data()) + from;
          if (!read_range(pid, which[k], dst, places[which[k]].second + from, len)) {
            refused = true;
            return false;
          }
          at += len;
        }
        return true;
      });
    }
    if (!refused.load()) return;
    // The owner streams every tensor of the object: keep what this one needs.
    std::vector<std::shared_ptr<void>> scratch;
    std::vector<TensorView> all;
    size_t k = 0;
    for (size_t i = 0; i < request.ref.tensors().size(); ++i) {
      const TensorMeta& m = request.ref.tensors()[i];
      if (k < which.size() && which[k] == i) {
        all.push_back(into[k++]);
      } else {
        void* p = ::operator new(std::max<size_t>(m.nbytes(), 1));
        scratch.emplace_back(p, [](void* q) { ::operator delete(q); });
        all.emplace_back(p, m.dtype, m.shape, Device::cpu());
      }
    }
    request.owner.stream(all);
  }

  OwnerBlocks blocks_;
  MappingCache mappings_;
  std::atomic<bool> cma_refused_{false};
};

}  // namespace

void register_shm_transport() {
  TransportInfo info;
  info.name = "shm";
  info.factory = [](const TransportContext& ctx) { return std::make_unique<ShmTransport>(ctx); };
  info.priority = 20;  // "auto" for CPU tensors, above socket
  register_tensor_transport(std::move(info));
}

}  // namespace tutti::shm_backend
