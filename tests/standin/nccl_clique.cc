#include "nccl_clique.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <thread>

namespace tutti::standin {
namespace {

constexpr uint32_t kReady = 0x5354414eu;  // "STAN"
constexpr size_t kCapacity = 64 * 1024;   // bytes per channel
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "the segment's atomics must work across processes");

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// This process's mapping of each segment, shared by its communicators.
std::mutex& cache_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<std::string, std::weak_ptr<Clique>>& cache() {
  static auto* c = new std::map<std::string, std::weak_ptr<Clique>>();
  return *c;
}

}  // namespace

struct Clique::Header {
  std::atomic<uint32_t> ready;  // kReady once the creator has laid the segment out
  uint32_t nranks;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> bell[kMaxRanks];
  std::atomic<uint64_t> bus[kMaxRanks];  // 0 until the rank has attached
};

struct Clique::Channel {
  alignas(64) std::atomic<uint64_t> head;  // bytes written so far (by the sender)
  alignas(64) std::atomic<uint64_t> tail;  // bytes read so far (by the receiver)
};

Clique::Header* Clique::header() const {
  return static_cast<Header*>(base_);
}

Clique::Channel* Clique::channel(int from, int to) const {
  const size_t stride = sizeof(Channel) + capacity_;
  char* first = static_cast<char*>(base_) + (sizeof(Header) + 63) / 64 * 64;
  return reinterpret_cast<Channel*>(first + (static_cast<size_t>(from) * nranks_ + to) * stride);
}

char* Clique::ring_data(int from, int to) const {
  return reinterpret_cast<char*>(channel(from, to)) + sizeof(Channel);
}

ncclResult_t Clique::attach(const std::string& name, int nranks, int rank, uint64_t bus_id,
                            const std::atomic<bool>& stop, std::shared_ptr<Clique>* out,
                            std::string* why) {
  std::shared_ptr<Clique> c;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    if (auto it = cache().find(name); it != cache().end()) c = it->second.lock();
    if (c == nullptr) {
      c.reset(new Clique());
      c->name_ = name;
      c->nranks_ = nranks;
      c->capacity_ = kCapacity;
      c->size_ = (sizeof(Header) + 63) / 64 * 64 +
                 static_cast<size_t>(nranks) * nranks * (sizeof(Channel) + kCapacity);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (true) {
        if (stop.load()) return ncclInternalError;
        if (std::chrono::steady_clock::now() > deadline) {
          *why = "shared-memory segment " + name + " was never laid out";
          return ncclSystemError;
        }
        int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {  // first here: lay the segment out
          if (::ftruncate(fd, static_cast<off_t>(c->size_)) != 0) {
            *why = "ftruncate of " + name + ": " + std::strerror(errno);
            ::close(fd);
            ::shm_unlink(name.c_str());
            return ncclSystemError;
          }
          c->base_ = ::mmap(nullptr, c->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          ::close(fd);
          if (c->base_ == MAP_FAILED) {
            c->base_ = nullptr;
            *why = "mmap of " + name + ": " + std::strerror(errno);
            ::shm_unlink(name.c_str());
            return ncclSystemError;
          }
          Header* h = new (c->base_) Header;
          h->nranks = static_cast<uint32_t>(nranks);
          h->attached.store(0);
          for (int r = 0; r < kMaxRanks; ++r) {
            new (&h->bell[r]) std::atomic<uint32_t>(0);
            new (&h->bus[r]) std::atomic<uint64_t>(0);
          }
          for (int a = 0; a < nranks; ++a) {
            for (int b = 0; b < nranks; ++b) new (c->channel(a, b)) Channel{{0}, {0}};
          }
          h->ready.store(kReady, std::memory_order_release);
          break;
        }
        if (errno != EEXIST) {
          *why = "shm_open of " + name + ": " + std::strerror(errno);
          return ncclSystemError;
        }
        fd = ::shm_open(name.c_str(), O_RDWR, 0600);
        if (fd < 0) continue;  // unlinked meanwhile: try to create it again
        struct stat st {};
        if (::fstat(fd, &st) != 0 || st.st_size == 0) {  // the creator has not sized it yet
          ::close(fd);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        if (static_cast<size_t>(st.st_size) != c->size_) {
          ::close(fd);
          *why = "the ranks disagree on the number of ranks (segment " + name + ")";
          return ncclInvalidUsage;
        }
        c->base_ = ::mmap(nullptr, c->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ::close(fd);
        if (c->base_ == MAP_FAILED) {
          c->base_ = nullptr;
          *why = "mmap of " + name + ": " + std::strerror(errno);
          return ncclSystemError;
        }
        while (c->header()->ready.load(std::memory_order_acquire) != kReady) {
          if (stop.load() || std::chrono::steady_clock::now() > deadline) {
            *why = "shared-memory segment " + name + " was never laid out";
            return stop.load() ? ncclInternalError : ncclSystemError;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        break;
      }
      cache()[name] = c;
    }
  }
  Header* h = c->header();
  if (static_cast<int>(h->nranks) != nranks) {
    *why = "the ranks disagree on the number of ranks: " + std::to_string(h->nranks) + " and " +
           std::to_string(nranks);
    return ncclInvalidUsage;
  }
  uint64_t expected = 0;
  if (!h->bus[rank].compare_exchange_strong(expected, bus_id)) {
    *why = "rank " + std::to_string(rank) + " joined twice";
    return ncclInvalidUsage;
  }
  if (h->attached.fetch_add(1) + 1 == static_cast<uint32_t>(nranks)) ::shm_unlink(name.c_str());
  for (int r = 0; r < nranks; ++r) c->ring(r);
  *out = std::move(c);
  return ncclSuccess;
}

Clique::~Clique() {
  if (base_ != nullptr) ::munmap(base_, size_);
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto it = cache().find(name_);
  if (it != cache().end() && it->second.expired()) cache().erase(it);
}

ncclResult_t Clique::wait_for_all(int rank, const std::atomic<bool>& stop, std::string* why) {
  Header* h = header();
  while (true) {
    const uint32_t seen = h->bell[rank].load(std::memory_order_acquire);
    if (h->attached.load() == static_cast<uint32_t>(nranks_)) break;
    if (stop.load()) return ncclInternalError;
    futex_wait(&h->bell[rank], seen, 100);
  }
  for (int r = 0; r < nranks_; ++r) {
    if (r != rank && h->bus[r].load() == h->bus[rank].load()) {
      *why = "Duplicate GPU detected: rank " + std::to_string(rank) + " and rank " +
             std::to_string(r) + " both on the same device";
      return ncclInvalidUsage;
    }
  }
  return ncclSuccess;
}

void Clique::ring(int rank) {
  header()->bell[rank].fetch_add(1, std::memory_order_release);
  futex_wake(&header()->bell[rank]);
}

void Clique::give_up() {
  if (header()->attached.load() < static_cast<uint32_t>(nranks_)) ::shm_unlink(name_.c_str());
}

bool Clique::exchange(int me, std::vector<Transfer>& transfers, const std::atomic<bool>& stop) {
  Header* h = header();
  std::vector<char> busy(2 * static_cast<size_t>(nranks_));  // a channel already has a turn
  while (true) {
    const uint32_t seen = h->bell[me].load(std::memory_order_acquire);
    bool moved = false;
    bool done = true;
    std::fill(busy.begin(), busy.end(), 0);
    for (Transfer& t : transfers) {
      if (t.moved == t.bytes) continue;
      done = false;
      char& turn = busy[2 * static_cast<size_t>(t.peer) + (t.send ? 1 : 0)];
      if (turn) continue;  // an earlier transfer over this channel goes first
      turn = 1;
      Channel* ch = t.send ? channel(me, t.peer) : channel(t.peer, me);
      char* data = t.send ? ring_data(me, t.peer) : ring_data(t.peer, me);
      const uint64_t head =
          ch->head.load(t.send ? std::memory_order_relaxed : std::memory_order_acquire);
      const uint64_t tail =
          ch->tail.load(t.send ? std::memory_order_acquire : std::memory_order_relaxed);
      const uint64_t room = t.send ? capacity_ - (head - tail) : head - tail;
      size_t n = static_cast<size_t>(std::min<uint64_t>(room, t.bytes - t.moved));
      if (n == 0) continue;
      const uint64_t at = t.send ? head : tail;
      const size_t offset = static_cast<size_t>(at % capacity_);
      const size_t first = std::min(n, capacity_ - offset);
      if (t.send) {
        std::memcpy(data + offset, t.data + t.moved, first);
        std::memcpy(data, t.data + t.moved + first, n - first);
        ch->head.store(head + n, std::memory_order_release);
      } else {
        std::memcpy(t.data + t.moved, data + offset, first);
        std::memcpy(t.data + t.moved + first, data, n - first);
        ch->tail.store(tail + n, std::memory_order_release);
      }
      t.moved += n;
      moved = true;
      ring(t.peer);
    }
    if (done) return true;
    if (moved) continue;
    if (stop.load()) return false;
    futex_wait(&h->bell[me], seen, 100);
  }
}

}  // namespace tutti::standin
