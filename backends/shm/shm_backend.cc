// The shm backend's set-up, waits, abort and liveness checks, and the two synchronisation steps
// of its collectives (a barrier and the small-message exchange).
#include "shm_backend.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "group/group_util.h"
#include "shm_cpus.h"
#include "shm_internal.h"
#include "shm_layout.h"
#include "shm_slice.h"
#include "tutti/error.h"
#include "tutti/store.h"
#include "util/host_identity.h"
#include "util/local_processes.h"
#include "util/logging.h"
#include "util/stream_copy.h"

namespace tutti::shm_backend {

namespace {

// A number from the environment in [min_value, max_value]; the fallback when unset, or (with a
// warning) when it is not such a number: one past the range wrapped the segment's arithmetic
// (a chunk of 0 bytes looped forever, one of 2^62 bytes pointed outside the mapping) or an int.
size_t env_size(const char* name, size_t fallback, size_t min_value = 4096,
                size_t max_value = size_t{1} << 30) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || errno == ERANGE || *v == '-' || n < min_value || n > max_value) {
    TUTTI_LOG_WARN("shm: {}='{}' is not a number from {} to {}: using {}", name, v, min_value,
                   max_value, fallback);
    return fallback;
  }
  return static_cast<size_t>(n);
}

}  // namespace

ShmBackend::ShmBackend(const BackendContext& ctx)
    : rank_(ctx.rank),
      world_size_(ctx.world_size),
      symmetric_(std::make_shared<SymmetricTable>(ctx.rank, ctx.world_size)) {
  if (world_size_ == 1) return;  // every op is local
  inputs_.resize(static_cast<size_t>(world_size_));
  block_inputs_.resize(static_cast<size_t>(world_size_));
  pidfds_.assign(static_cast<size_t>(world_size_), -1);

  // Shared memory needs one host: the group compared every rank's host identity at join.
  for (int r = 0; r < world_size_; ++r) {
    if (static_cast<size_t>(r) < ctx.hosts.size() && ctx.hosts[r] != ctx.hosts[rank_]) {
      throw Error(ErrorCode::kUnavailable,
                  "the shm backend needs every rank on one host: rank " + std::to_string(r) +
                      " runs on '" + ctx.hosts[r] + "', rank " + std::to_string(rank_) + " on '" +
                      ctx.hosts[rank_] + "' (use backend 'gloo', or 'auto' to choose)");
    }
  }

  // Pages of this host's size (64 KiB on some arm64 kernels): a mailbox's pages are populated
  // on first use, which takes page-aligned ranges.
  const size_t page = std::max<size_t>(4096, static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  const size_t w = static_cast<size_t>(world_size_);
  const size_t asked = env_size("TUTTI_SHM_CHUNK_BYTES", 1 << 20);
  chunk_ = staging_chunk(asked, w, page);
  if (chunk_ > align_up(asked, page)) {
    TUTTI_LOG_WARN(
        "shm: a staging chunk of {} bytes holds no 8-byte element for each of {} "
        "ranks: using {}",
        asked, world_size_, chunk_);
  }
  publish_ = PublishChooser(PublishChooser::mode_from_env());
  mail_ = align_up(env_size("TUTTI_SHM_MAILBOX_BYTES", 256 << 10), page);
  const size_t slots_off = align_up(sizeof(Header), 64);
  const size_t bells_off = slots_off + w * sizeof(RankSlot);
  const size_t channels_off = bells_off + w * sizeof(Bell);
  const size_t sym_off = align_up(channels_off + w * w * sizeof(Channel), 64);
  const size_t small_off = align_up(sym_off + w * sizeof(SymSlot), 64);
  const size_t staging_off = align_up(small_off + w * 2 * kSmallSlotBytes, page);
  const size_t mail_off = staging_off + w * 2 * chunk_;
  const size_t size = mail_off + w * w * 2 * mail_;
  try {
    // What lies where, as every rank must agree: the structures' sizes (a build with another
    // layout), the staging chunks and mailboxes (the environment), and the offsets they give.
    // The version goes up where a structure's words change meaning at the same size.
    const std::string layout =
        "v2 header " + std::to_string(sizeof(Header)) + ", slot " +
        std::to_string(sizeof(RankSlot)) + ", bell " + std::to_string(sizeof(Bell)) + ", channel " +
        std::to_string(sizeof(Channel)) + ", symmetric " + std::to_string(sizeof(SymSlot)) +
        ", small " + std::to_string(kSmallSlotBytes) + ", chunk " + std::to_string(chunk_) +
        ", mailbox " + std::to_string(mail_) + ", staging at " + std::to_string(staging_off) +
        ", mailboxes at " + std::to_string(mail_off);
    segment_ = ShmSegment(*ctx.store, ctx.instance, rank_, world_size_, size, mail_off, layout);
  } catch (...) {
    // Perhaps before this rank knew the segment's name (a peer died, the store failed): the
    // group cannot be made now, and the rank that made the segment may be dead. (A rank that
    // mapped it and fails later takes its name away when its ShmSegment goes.)
    remove_segments_of(ctx.instance);
    throw;
  }
  mail_ready_.assign(w * w, 0);
  seen_beat_.assign(w, 0);
  char* base = segment_.data();
  header_ = reinterpret_cast<Header*>(base);
  slots_ = reinterpret_cast<RankSlot*>(base + slots_off);
  bells_ = reinterpret_cast<Bell*>(base + bells_off);
  channels_ = reinterpret_cast<Channel*>(base + channels_off);
  sym_ = reinterpret_cast<SymSlot*>(base + sym_off);
  small_ = base + small_off;
  staging_ = base + staging_off;
  mailboxes_ = base + mail_off;
  const long pid = static_cast<long>(::getpid());
  slots_[rank_].start.store(detail::process_start_time(pid));
  slots_[rank_].pid.store(static_cast<int32_t>(pid));
  // Each rank says it is here, and which CPUs it may run on: whether the ranks have a core each
  // depends on the union of their masks (ranks bound one CPU each are not oversubscribed;
  // shm_cpus.h).
  const std::string mask = affinity_mask_text();
  ctx.store->set("shm/ready/" + std::to_string(rank_), mask.empty() ? "?" : mask);
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back("shm/ready/" + std::to_string(r));
  ctx.store->wait(keys);
  // Every rank has the segment mapped (each says it is ready after mapping it): its name goes,
  // so that neither destroy nor a crash leaves it in /dev/shm.
  segment_.unlink_name();
  std::vector<std::string> masks;
  for (const std::string& k : keys) {
    std::string m = ctx.store->get(k);
    if (m != "?") masks.push_back(std::move(m));
  }
  const int cores =
      usable_cpus(masks.size() == keys.size() ? cpus_in_union(masks) : 0, cgroup_cpu_limit(),
                  static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  // Every process of this user running tutti groups on this kernel competes for those CPUs too,
  // whatever its group or host id (local_processes.h): ranks of two "hosts" in network
  // namespaces on one machine, or of two jobs.
  ranks_cpus_ = mask_union(masks);
  cores_ = cores;
  set_spin_policy(detail::count_local_processes(ranks_cpus_));
  next_look_ = Clock::now() + kLookAgain;
  // Once every rank has said who it is: a handle on each peer's process, so that its death is
  // noticed at once. Only where its pid and start time match what this host's /proc says, so
  // another pid namespace, or a pid reused since, never counts.
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    const long peer = static_cast<long>(slots_[r].pid.load());
    const int fd = peer > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, peer, 0)) : -1;
    if (fd < 0) continue;
    if (detail::process_start_time(peer) != slots_[r].start.load()) {
      ::close(fd);
      continue;
    }
    pidfds_[r] = fd;
  }
}

ShmBackend::~ShmBackend() {
  if (header_ != nullptr) {
    // Peers still waiting for this rank learn at once that it will not come.
    slots_[rank_].left.store(1);
    wake_everyone();
  }
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

std::unique_ptr<SymmetricRegion> ShmBackend::create_symmetric(size_t bytes) {
  // The peers' parts of regions their owners let go; not after an abort (the group refuses an
  // allocation then, but an abort from another thread may come after that check): an op the
  // abort left queued may still copy from one of them.
  if (!aborted_.load()) symmetric_->prune();
  return std::make_unique<ShmRegion>(symmetric_, bytes);
}

void ShmBackend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    if (reason_.empty()) reason_ = reason;
  }
  aborted_.store(true);
  if (header_ == nullptr) return;
  uint32_t nobody = 0;
  if (header_->abort_owner.value.compare_exchange_strong(nobody,
                                                         static_cast<uint32_t>(rank_ + 1))) {
    header_->abort_op.value.store(static_cast<uint32_t>(completed_ops_.load() + 1));
    const size_t n = std::min(reason.size(), sizeof(header_->abort_reason) - 1);
    std::memcpy(header_->abort_reason, reason.data(), n);
    header_->abort_reason[n] = '\0';
    header_->abort_ready.value.store(1);
  }
  wake_everyone();
}

// Every word anyone may sleep on: an abort or a departure carries no change of those words, so
// the sleepers are woken regardless (and would see it within kMaxNap anyway).
void ShmBackend::wake_everyone() const {
  wake_always(header_->generation.value);
  for (int r = 0; r < world_size_; ++r) {
    wake_always(bells_[r].ring.value);
    wake_always(small_slot(r, 0).seq);
    wake_always(small_slot(r, 1).seq);
  }
}

void ShmBackend::ring(int rank) const {
  bells_[rank].ring.value.fetch_add(1);
  wake_all(bells_[rank].ring.value, bells_[rank].sleepers.value);
}

// How long a wait polls, for `local` processes of tutti's on the ranks' CPUs (this one among
// them; local_processes.h counts only those that ran an op lately).
void ShmBackend::set_spin_policy(int local) {
  const int cores = cores_;
  const bool oversubscribed = std::max(world_size_, local) > cores;
  oversubscribed_ = oversubscribed;
  publish_.allow_wall_clock(!oversubscribed);
  // Spinning helps only while every rank has a core (then a peer is < 1 us away); with more
  // ranks than cores, a spinning rank would hold up the very rank it waits for, so it yields.
  // Otherwise a rank polls for kLongSpin (5 ms) before it yields or sleeps: a rank that gives its
  // CPU away to another process (a yield, a futex sleep) gets it back only at that process's next
  // tick or slice, since a wake-up does not preempt it (Linux 6.18, PREEMPT_NONE, HZ=250,
  // measured 2026-12-01: 2 ranks bound to a CPU each beside `yes` took 4 ms per 8-byte allreduce
  // with 2000 polls, 0.7 us with ~200 us of polling; with both CPUs busy (two `yes`, or a build)
  // ~200 us of polling was not enough either: 8 ms per op at 256 KiB, 116 ms at 16 MiB, where
  // 5 ms gives 27 us and 6-7 ms, ahead of Open MPI, which never sleeps). The polls stop at once
  // when a rank waited for is on this rank's CPU (unbound ranks that the scheduler put together;
  // shm_internal.h): there a long spin held up the peer, 270-530 us per call beside `yes`,
  // against ~4 us now. A wait whose budget ran out sleeps on a futex, so a rank waiting for a
  // slow peer burns at most 5 ms of CPU per wait; except that where this rank lost its CPU while
  // it polled (another process wants it: asleep, the rank would wait out that process's slice at
  // every wait) and every rank it waits for is inside the collective (or p2p batch) already, it
  // polls on, budget after budget, up to kContendedSpin (100 ms) in all (shm_wait.h,
  // shm_internal.h; 2026-12-06 beside a build: 2 MiB in 0.4 ms per op instead of 44-48 ms).
  // TUTTI_SHM_SPIN_US, TUTTI_SHM_SPINS, TUTTI_SHM_YIELDS and TUTTI_SHM_CONTENDED_SPIN_US override
  // the budget (time, the least polls, then yields; the contended polls' total, 0: none). Cores:
  // the CPUs the ranks may run on together (shm_cpus.h). TUTTI_SHM_ADAPT (default 1: fixed) lets
  // the budget grow up to that many times after waits that slept briefly (AdaptiveSpin,
  // shm_wait.h).
  // TUTTI_SHM_STILL_LOOKS: the looks after which a wait sleeps for ranks that sit still inside
  // waits of their own (shm_internal.h; 0: never).
  // Oversubscribed, a waiting thread sleeps, and asks for short slices so that its wake-up
  // preempts whatever else runs on its CPU (shm_slice.h; the kernel clamps to 100-100000 us).
  // Where the kernel keeps them (Linux 6.12 and later: it reports this thread's slice), the
  // yields before a sleep are fewer: a yield hands the CPU to whatever else is runnable on it,
  // and where that is another busy process, for its whole slice (sched_yield is no wake-up).
  // Measured 2026-12-06, 4 ranks on 2 vCPUs beside two `yes`, 100 us slices, us per allreduce
  // at 8 B / 4 KiB / 2 MiB / 16 MiB: 200 yields 5.2 / 10.0 / 15728 / 67836; 20 yields 3.3 / 8.9 /
  // 4171 / 28182; 5 yields 4.9 / 9.8 / 3506 / 19023; none 11.0 / 18.7 / 3419 / 20251. Quiet, 20
  // yields ran as 200 (4.0 / 8.1 / 1013 / 6797 against 4.6 / 8.3 / 1020 / 6614), 5 or fewer
  // slower at the small sizes.
  // (1-99 us mean the kernel's least, 100.)
  const size_t slice_us = oversubscribed ? env_size("TUTTI_SHM_SLICE_US", 100, 0, 100'000) : 0;
  slice_ns_ = slice_us == 0 ? 0 : std::max<size_t>(slice_us, 100) * 1000;
  const bool short_slices = slice_ns_ != 0 && slices_apply_to_this_thread();
  SpinPolicy spin;
  spin.spins =
      static_cast<int>(env_size("TUTTI_SHM_SPINS", oversubscribed ? 0 : kMinSpins, 0, 100'000'000));
  spin.spin_for = std::chrono::microseconds(
      env_size("TUTTI_SHM_SPIN_US", oversubscribed ? 0 : static_cast<size_t>(kLongSpin.count()), 0,
               10'000'000));
  spin.yields = static_cast<int>(
      env_size("TUTTI_SHM_YIELDS", oversubscribed ? (short_slices ? 20 : 200) : 50, 0, 1'000'000));
  spin.contended_for = std::chrono::microseconds(env_size(
      "TUTTI_SHM_CONTENDED_SPIN_US",
      oversubscribed ? 0 : static_cast<size_t>(kContendedSpin.count()) * 1000, 0, 10'000'000));
  spin_ = AdaptiveSpin(spin, static_cast<int>(env_size("TUTTI_SHM_ADAPT", 1, 0, 1000)));
  still_looks_ = static_cast<int>(env_size("TUTTI_SHM_STILL_LOOKS", kStillLooks, 0, 1'000'000'000));
  TUTTI_LOG_DEBUG(
      "shm: {} ranks ({} tutti processes here) on {} usable CPUs ({}): polls for {} "
      "us (at least {}; up to {} us while kept off its CPU) then yields {}{}",
      world_size_, local, cores, oversubscribed ? "oversubscribed" : "a core each",
      std::chrono::duration_cast<std::chrono::microseconds>(spin.spin_for).count(), spin.spins,
      std::chrono::duration_cast<std::chrono::microseconds>(spin.contended_for).count(),
      spin.yields,
      slice_ns_ == 0 ? std::string()
                     : ", asks for " + std::to_string(slice_ns_ / 1000) + " us slices" +
                           (short_slices ? "" : " (this kernel keeps none)"));
  spin_local_ = local;
}

void ShmBackend::shorten_slice_once() const {
  thread_local uint64_t asked = 0;  // the slice this thread last asked for
  if (asked == slice_ns_) return;
  asked = slice_ns_;
  const SliceAnswer answer = ask_for_short_slices(slice_ns_);
  TUTTI_LOG_DEBUG(
      "shm: rank {} (ranks outnumber the CPUs) asked for {} us scheduler slices for "
      "thread {}: {}",
      rank_, slice_ns_ / 1000, static_cast<long>(::syscall(SYS_gettid)), describe(answer));
}

bool ShmBackend::stopped(uint64_t op_seq) const {
  if (aborted_.load(std::memory_order_relaxed)) return true;
  if (header_->abort_owner.value.load(std::memory_order_relaxed) == 0) return false;
  // The abort stops the collective it names and every later one (across the numbers' wrap).
  // The owner writes abort_op right after it claims abort_owner: a look between the two reads it
  // again for a moment, then (an owner preempted there) stops them all.
  uint32_t from = header_->abort_op.value.load();
  for (int i = 0; from == 0 && i < 1000; ++i) from = header_->abort_op.value.load();
  return op_seq == 0 || from == 0 || seq_at_or_after(static_cast<uint32_t>(op_seq), from);
}

void ShmBackend::throw_if_stopped(const OpContext& ctx, uint64_t op_seq) const {
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    throw Error(ErrorCode::kAborted, ctx.description() + ": aborted: " + reason_);
  }
  if (!stopped(op_seq)) return;
  const uint32_t owner = header_->abort_owner.value.load();
  const std::string why =
      header_->abort_ready.value.load() != 0 ? std::string(header_->abort_reason) : "(no reason)";
  throw Error(ErrorCode::kRemoteError, ctx.description() + ": rank " +
                                           std::to_string(static_cast<int>(owner) - 1) +
                                           " aborted the group: " + why);
}

// Throws for a peer we wait on that left the group or whose process died.
// A peer we wait on that left the group or whose process died, as the error to throw; none
// when all of them can still come. (What they did before leaving is visible by the time this
// sees them gone: callers check their condition once more before throwing.)
std::optional<Error> ShmBackend::gone_peer(const OpContext& ctx,
                                           const std::function<bool(int)>& waiting_on) const {
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_ || !waiting_on(r)) continue;
    if (slots_[r].left.load() != 0) {
      return Error(ErrorCode::kRemoteError,
                   ctx.description() + ": rank " + std::to_string(r) +
                       " destroyed its group while this rank waits for it (did the ranks call "
                       "different ops?)");
    }
    const int fd = pidfds_[r];
    if (fd < 0) continue;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0) {
      return Error(ErrorCode::kIoError, ctx.description() + ": rank " + std::to_string(r) +
                                            " (pid " + std::to_string(slots_[r].pid.load()) +
                                            ") died");
    }
  }
  return std::nullopt;
}

void ShmBackend::note_cpu() const {
  const int cpu = ::sched_getcpu();
  if (cpu < 0) return;
  auto& word = bells_[rank_].cpu.value;
  const uint32_t value = static_cast<uint32_t>(cpu) + 1;
  if (word.load(std::memory_order_relaxed) != value) word.store(value, std::memory_order_relaxed);
}

// Every kLookAgain of ops: whether the processes competing for the ranks' CPUs changed (another
// job began or went idle), and the spin policy with them. Once a second, it reads /proc for
// each process on those CPUs that ran an op lately (10-20 us each). Collectives only (through
// begin_op; a group of point-to-point ops alone keeps the policy it was made with).
void ShmBackend::look_again(Clock::time_point now) {
  next_look_ = now + kLookAgain;
  const int local = detail::count_local_processes(ranks_cpus_);
  if (local != spin_local_) set_spin_policy(local);
}

ShmBackend::Op ShmBackend::begin_op(const OpContext& ctx) {
  if (ctx.started >= next_look_) look_again(ctx.started);
  // In 32 bits, compared across their wrap (seq_at_or_after). The one collective in 2^32 whose
  // number wraps to 0 looks like point-to-point to stopped(): an abort then stops it even where
  // the abort came after it (its parity still alternates, which skipping 0 would break).
  const uint32_t seq = static_cast<uint32_t>(++ops_);
  throw_if_stopped(ctx, seq);
  note_cpu();
  Op op{ctx, ctx.deadline(), seq, seq & 1};
  uint64_t sig[2];
  pack_signature(ctx.signature, sig);
  slots_[rank_].signature[op.parity][0].store(sig[0], std::memory_order_relaxed);
  slots_[rank_].signature[op.parity][1].store(sig[1], std::memory_order_relaxed);
  // Plain stores (no locked instruction): peers read the tag only after `begun` (acquire), or
  // after a barrier.
  slots_[rank_].tag[op.parity].store(ctx.tag, std::memory_order_relaxed);
  slots_[rank_].begun.store(seq, std::memory_order_release);
  return op;
}

void ShmBackend::check_agreement(const Op& op) const {
  // A peer in the same collective (by number) under another tag called another op: it may wait
  // on other words than this rank (a small op's slot, a large one's barrier), so neither wait
  // would ever end on its own. Looked at after each of the wait's naps.
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_ || slots_[r].begun.load(std::memory_order_acquire) != op.seq) continue;
    const uint32_t theirs = slots_[r].tag[op.parity].load();
    if (theirs != op.ctx.tag && (theirs ^ kSymmetricTag) != op.ctx.tag) mismatch(op, r, theirs);
  }
}

void ShmBackend::end_op(const Op& op) {
  // A peer that aborted inside this op (its own waits ended) fails it here too, so that no rank
  // returns a result another rank gave up on.
  throw_if_stopped(op.ctx, op.seq);
  completed_ops_.store(op.seq, std::memory_order_release);
}

void ShmBackend::published(PublishChooser::Kind kind, size_t bytes, const PublishChooser::Pick& how,
                           const PublishTimer& timer) {
  // Not timed, or ended before its first barrier (the symmetric path) or the small path's wait.
  if (!how.timed || !timer.complete()) return;
  published(kind, bytes, how, timer.work(), false);  // a wall-clock one over kWallLeftOut: record()
}

void ShmBackend::published(PublishChooser::Kind kind, size_t bytes, const PublishChooser::Pick& how,
                           Clock::duration took, bool disturbed) {
  // With more ranks than cores the ranks hand their CPUs to each other at every wait (yields
  // count as involuntary switches): that is how every op runs there, so it voids no time.
  disturbed = disturbed && !oversubscribed_;
  if (how.timed && disturbed) {
    TUTTI_LOG_DEBUG(
        "shm: rank {} leaves out a timed {} of {} B with {} stores ({:.1f} us): another "
        "thread had its CPU meanwhile",
        rank_, PublishChooser::name(kind), bytes, how.stream ? "streaming" : "ordinary",
        std::chrono::duration<double, std::micro>(took).count());
  }
  if (publish_.record(how, took, disturbed)) {
    const PublishChooser::Seen seen = publish_.seen(kind, bytes);
    TUTTI_LOG_DEBUG(
        "shm: rank {} publishes {} of {} B and up (to twice that) with {} stores from now on "
        "({:.1f} us per op with ordinary stores, {:.1f} us with streaming ones)",
        rank_, PublishChooser::name(kind), PublishChooser::class_floor(bytes),
        seen.stream ? "streaming" : "ordinary", seen.cached_ns / 1e3, seen.streamed_ns / 1e3);
  }
}

char* ShmBackend::stage(int rank, int half) const {
  return staging_ + (static_cast<size_t>(rank) * 2 + static_cast<size_t>(half)) * chunk_;
}

void ShmBackend::ensure_mailbox(int src, int dst, const OpContext& ctx) {
  uint8_t& ready = mail_ready_[static_cast<size_t>(src) * world_size_ + static_cast<size_t>(dst)];
  if (ready != 0) return;
  // Its pages, both slots, now: a page /dev/shm has no room for fails here by name instead of
  // killing the rank that first touches it (SIGBUS). A kernel without MADV_POPULATE_WRITE
  // (before 5.14) leaves them to their first touch, as before.
  const size_t len = 2 * mail_;
  const int err = populate_pages(mailbox(src, dst, 0), len);
  if (err != 0 && err != EINVAL) {
    throw Error(ErrorCode::kUnavailable,
                ctx.description() + ": /dev/shm has no room for the mailbox of ranks " +
                    std::to_string(src) + " -> " + std::to_string(dst) + " (" +
                    std::to_string(len) + " bytes): " + std::strerror(err) +
                    " (give /dev/shm more room, e.g. docker's --shm-size, or lower "
                    "TUTTI_SHM_MAILBOX_BYTES)");
  }
  ready = 1;
}

char* ShmBackend::mailbox(int src, int dst, int slot) const {
  return mailboxes_ +
         ((static_cast<size_t>(src) * world_size_ + static_cast<size_t>(dst)) * 2 + slot) * mail_;
}

Channel& ShmBackend::channel(int src, int dst) const {
  return channels_[static_cast<size_t>(src) * world_size_ + static_cast<size_t>(dst)];
}

SmallSlot& ShmBackend::small_slot(int rank, uint32_t parity) const {
  return *reinterpret_cast<SmallSlot*>(small_ +
                                       (static_cast<size_t>(rank) * 2 + parity) * kSmallSlotBytes);
}

char* ShmBackend::small_payload(int rank, uint32_t parity, size_t bytes) const {
  SmallSlot& slot = small_slot(rank, parity);
  return bytes <= kInlineBytes ? slot.inline_payload
                               : reinterpret_cast<char*>(&slot) + sizeof(SmallSlot);
}

// "rank(s) 1, 3" of those for which pending(r) holds.
std::string ShmBackend::ranks_where(const std::function<bool(int)>& pending) const {
  std::string out;
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_ && pending(r)) out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out.empty() ? std::string("(none: all arrived late)") : out;
}

// A barrier over all ranks; after the op's first one, every rank's tag must equal ours.
void ShmBackend::sync(Op& op) {
  const uint32_t epoch = ++epoch_;
  slots_[rank_].arrived.store(epoch);
  const uint32_t generation = header_->generation.value.load();
  if (header_->count.value.fetch_add(1) + 1 == static_cast<uint32_t>(world_size_)) {
    header_->count.value.store(0);
    header_->generation.value.store(generation + 1);
    wake_all(header_->generation.value, header_->sleepers.value);
  } else {
    auto missing = [&](int r) {
      return static_cast<int32_t>(slots_[r].arrived.load() - epoch) < 0;
    };
    // Every peer's death ends the wait, not only a missing one's: the last to arrive releases
    // the others, and a rank that arrived last and died before it did would leave them waiting
    // for their timeout (seen by tutti-fault-bench: 2 SIGKILLs in 60 took the 10 s timeout).
    auto any_peer = [](int) { return true; };
    if (op.timer != nullptr) op.timer->wait_begins();
    wait_until([&] { return header_->generation.value.load() != generation; },
               header_->generation.value, header_->sleepers.value, op.ctx, op.seq, op.deadline,
               any_peer,
               [&] {
                 throw Error(ErrorCode::kTimeout, op.ctx.description() + ": timed out after " +
                                                      std::to_string(op.ctx.timeout.count()) +
                                                      " ms waiting for rank(s) " +
                                                      ranks_where(missing) + " (shm barrier)");
               },
               &op, missing);
    if (op.timer != nullptr) op.timer->wait_ends();
  }
  if (!op.checked) {
    op.checked = true;
    for (int r = 0; r < world_size_; ++r) {
      const uint32_t theirs = slots_[r].tag[op.parity].load();
      if (theirs == op.ctx.tag) continue;
      if ((theirs ^ kSymmetricTag) != op.ctx.tag) mismatch(op, r, theirs);
      ++op.symmetric;  // that rank's tensor is in symmetric memory (reduce_chunks)
    }
  }
}

namespace {

#if defined(__x86_64__) || defined(__i386__)
// Whether the CPU has PREFETCHW (CPUID 0x80000001 ECX bit 8, "3DNowPrefetch"; the kernel's
// prefetchw() checks the same bit). GCC emits a read prefetch for __builtin_prefetch(p, 1)
// unless built for such a target.
bool has_prefetchw() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(0x80000001u, &a, &b, &c, &d) != 0 && (c & (1u << 8)) != 0;
}
const bool kPrefetchw = has_prefetchw();
#endif

// Asks for the cache line at p in a state this core may write: a hint, with no fault and no
// effect on what any core reads.
inline void prefetch_for_write(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  if (kPrefetchw) {
    asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
    return;
  }
#endif
  __builtin_prefetch(p, 1);
}

}  // namespace

// Publishes this rank's payload (up to kSmallBytes) for the op, then waits until every rank has
// published its own; checks that they all called the same op. Two slots alternate, and a rank
// reaches op k + 2 only after every rank published op k + 1, that is, finished reading op k.
void ShmBackend::exchange(Op& op, const void* payload, size_t bytes, size_t reads, int from,
                          const PublishChooser::Pick& how, PublishTimer* timer) {
  SmallSlot& mine = small_slot(rank_, op.parity);
  if (bytes > 0) publish(how, small_payload(rank_, op.parity, bytes), payload, bytes);
  mine.tag = op.ctx.tag;
  mine.seq.store(op.seq);
  if (timer != nullptr) timer->published();
  wake_all(mine.seq, mine.sleepers);
  // One spin-wait hint before the first look at the peers' slots, and one after each of the
  // wait's first polls (SpinPolicy::paced). The peers publish at about the same moment as this
  // rank (each starts its op when the last one's lines arrive), and a look at once most likely
  // takes a peer's line just before its store, which must then take it back: the delay is what
  // counts, not the hint (~30 ns of clock reads in its place did as well at 8-32 B; hints
  // between the polls alone did half as well). Measured 2026-12-07, 2 ranks, interleaved with
  // the polls unpaced (libtutti_shm swapped run by run, 300 rounds, mostly "near"): 8-32 B 0.26 ->
  // 0.20 us (per-round ratio 0.81-0.83, faster in 3 rounds of 4), 64 B-1 KiB 0.86-0.89, 4 KiB 0.98;
  // in a sitting where unpaced ran 0.31 us, 0.95; where a line takes ~300 ns between the CPUs,
  // 8-32 B 0.94-0.98 and 256 B-1 KiB 0.79-0.91. Two hints first (~50 ns) gave only 0.93-0.95 at
  // 8-32 B: the peer's line has come by then.
  spin_hint();
  auto missing = [&](int r) { return small_slot(r, op.parity).seq.load() != op.seq; };
  for (int q = 0; q < world_size_; ++q) {
    if (q == rank_) continue;
    SmallSlot& theirs = small_slot(q, op.parity);
    // A payload past the slot's line that this rank reads next: its lines are read while
    // polling, with the number. Read only once the number is seen, each one's transfer from the
    // writer's cache came after the number's; polled together, they overlap (2 ranks, the far
    // state: 64-256 B 0.73-0.76 -> 0.59-0.63 us). Up to kTouchBytes: past it, the larger reads
    // slowed 1 KiB near by ~6%.
    const char* lines = reads > kInlineBytes && reads <= kTouchBytes && (from < 0 || from == q)
                            ? small_payload(q, op.parity, reads)
                            : nullptr;
    auto ready = [&] {
      if (lines != nullptr) {
        for (size_t at = 0; at < reads; at += sizeof(Line)) {
          (void)*reinterpret_cast<const volatile char*>(lines + at);
        }
      }
      return theirs.seq.load() == op.seq;
    };
    wait_until(
        ready, theirs.seq, theirs.sleepers, op.ctx, op.seq, op.deadline, missing,
        [&] {
          throw Error(ErrorCode::kTimeout, op.ctx.description() + ": timed out after " +
                                               std::to_string(op.ctx.timeout.count()) +
                                               " ms waiting for rank(s) " + ranks_where(missing) +
                                               " (shm)");
        },
        &op);
    if (theirs.tag != op.ctx.tag) mismatch(op, q, theirs.tag);
  }
  op.checked = true;
  if (timer != nullptr) timer->met();
  // Every peer has published this op, so none still reads what this rank published in its
  // other slot (the last op's; peers that finished this op may already poll that slot's line for
  // the next). Take the line for writing now, while the caller computes, where the next publish
  // would wait for the peers' copies to go. In one sitting's "far" state (a line between the
  // CPUs in 250-300 ns, docs/PERFORMANCE.md) that halved an 8-byte allreduce at 2 ranks (0.51
  // -> 0.27 us; a later far sitting did not show it); near (70-80 ns) it costs ~6 ns. Only after
  // a publish that fit the line (a loop's next op is likely the same): after larger ones it
  // bought nothing, and cost 512 B-1 KiB 5-10%.
  if (bytes <= kInlineBytes) prefetch_for_write(&small_slot(rank_, op.parity ^ 1));
}

void ShmBackend::mismatch(const Op& op, int rank, uint32_t) const {
  // The peer wrote its signature before publishing the tag that differs from ours.
  const uint64_t words[2] = {slots_[rank].signature[op.parity][0].load(),
                             slots_[rank].signature[op.parity][1].load()};
  const std::string theirs = unpack_signature(words).str();
  const std::string mine = op.ctx.signature.str();
  throw Error(ErrorCode::kRemoteError,
              op.ctx.description() + ": rank " + std::to_string(rank) + " called " + theirs +
                  (theirs == mine ? " (at another position in the order)" : "") +
                  " where this rank called " + mine +
                  ": every rank must call the same ops in the same order");
}

}  // namespace tutti::shm_backend
