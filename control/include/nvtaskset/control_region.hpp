// SPDX-License-Identifier: Apache-2.0
// The per-process control region: a small shared-memory object through which
// `nvtaskset -p` changes a running task's partition and the shim's launch
// callback reads it.
//
// Layout rules (it is shared between processes, possibly of different builds):
//   * only fixed-width integers and lock-free std::atomic of them;
//   * a magic/version header checked on attach; the magic is stored last, with
//     release order, so an attacher never sees a half-built region;
//   * the mask is double-buffered and each buffer is a seqlock, so the reader
//     (the launch callback) never blocks, never allocates, and never sees a
//     torn 128-bit value. Writers serialise with flock() on the region's file,
//     which the kernel drops if a writer dies; a writer killed mid-write can
//     only leave the buffer that is NOT published half-written.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvtaskset/partition.hpp"
#include "nvtaskset/seqlock.hpp"

namespace nvtaskset::ctl {

inline constexpr std::uint32_t kMagic = 0x5354564eu;  // "NVTS"
// 2: cluster limits and the widened set in each buffer, the partition epoch,
// graph and cluster counters in the header. 3: the role words.
inline constexpr std::uint32_t kVersion = 4;
inline constexpr unsigned kMaxDevices = 8;
// Cluster sizes counted per size: 1..16 (16 is the largest any GPU runs);
// index 0 counts launches without clusters.
inline constexpr unsigned kClusterSlots = 17;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the control region needs address-free 64-bit atomics");

// One seqlocked copy of a partition.
struct MaskBuffer {
  std::atomic<std::uint64_t> seq;  // odd while being written
  std::atomic<std::uint64_t> kind;
  std::atomic<std::uint64_t> enabled[2];  // physical enable bits, lo/hi
  std::atomic<std::uint64_t> tpcs[2];
  std::atomic<std::uint64_t> gpcs[2];
  std::atomic<std::uint64_t> max_cluster;  // Partition::max_cluster
  std::atomic<std::uint64_t> widened[2];   // Partition::widened
  std::atomic<std::uint64_t> widened_max_cluster;
};

struct DeviceEntry {
  std::atomic<std::uint32_t> in_use;  // 0 = free slot
  std::uint32_t reserved;
  std::uint8_t uuid[16];                  // all zero = any device
  std::uint32_t sm_count;                 // DeviceDesc, written with the entry
  std::uint32_t cc_major;
  std::uint32_t cc_minor;
  std::int32_t driver_version;
  std::atomic<std::uint64_t> generation;  // buffer[generation & 1] is current
  MaskBuffer buffer[2];
};

struct Header {
  std::atomic<std::uint32_t> magic;
  std::uint32_t version;
  std::uint32_t size;  // sizeof(Header) of the creator
  std::int32_t pid;
  std::uint64_t start_time;  // /proc/<pid>/stat field 22, detects PID reuse
  std::uint32_t uid;
  // Set by the shim at cuInit when the process sees none of the GPUs its
  // partitions are for (CUDA_VISIBLE_DEVICES changed after nvtaskset chose
  // the GPU): its kernels run on all TPCs. Was a reserved word (always 0).
  std::atomic<std::uint32_t> partition_unseen;
  // Bumped by every write, after the new partition is published. A CUDA
  // graph exec whose kernels were encoded at an older epoch is re-encoded
  // before its next launch (shim/src/graphs.cpp).
  std::atomic<std::uint64_t> epoch;
  // Written by the shim, read by the CLI. Relaxed counters, incremented
  // without a locked instruction (see the shim): approximate when several
  // threads launch at once.
  std::atomic<std::uint64_t> kernels_launched;
  std::atomic<std::uint64_t> kernels_masked;
  std::atomic<std::uint64_t> kernels_unsupported;  // unknown TMD layout while partitioned
  std::atomic<std::uint32_t> last_tmd_version;     // QMD version byte of the last TMD seen
  // The token of the process image whose shim subscribed the launch
  // callback; 0 while the shim has not loaded the driver yet (a region is set
  // up at load, the driver at the first call); kHookFailed when it could not.
  std::atomic<std::uint32_t> callback_registered;
  // CUDA graphs: live execs whose kernels follow partition changes, and
  // those that cannot (device-launched, conditional nodes, or a re-encode
  // that the driver did not perform). Written under the shim's graph lock.
  std::atomic<std::uint64_t> graphs_following;
  std::atomic<std::uint64_t> graphs_not_following;
  // Thread-block clusters: the largest launched (SMs), launches per size,
  // launches that did not fit the partition (stopped or widened), widened.
  std::atomic<std::uint32_t> max_cluster_launched;
  std::atomic<std::uint32_t> cluster_policy;  // 0 abort, 1 widen (NVTASKSET_ON_CLUSTER_MISFIT)
  std::atomic<std::uint64_t> cluster_launches[kClusterSlots];
  std::atomic<std::uint64_t> cluster_misfits;
  std::atomic<std::uint64_t> clusters_widened;
  // Launches whose partition could not be read consistently within a
  // bounded number of tries: the last good partition was applied instead.
  std::atomic<std::uint64_t> stale_reads;
  // Launches that ran on all TPCs although a partition was set (no good
  // partition was ever read, or NVTASKSET_ON_UNSUPPORTED=warn).
  std::atomic<std::uint64_t> kernels_unmasked;
  // Roles (task_role.hpp, ../../roles), written by the shim of a task that has one, read by
  // --status. role: roles::Role. role_state: for a best-effort task, what
  // its last launch did: 0 ran on its whole partition, 1 waited for a
  // latency-critical task, 2 ran on its floor. The counters: launches that
  // waited, the time they waited (ns), launches on the floor, launches that
  // waited for the task's own queue (NVTASKSET_BE_DEPTH); and launches that
  // should have run on the floor but ran on the whole partition (a kernel
  // with clusters the floor may not host, or an empty floor). Under
  // NVTASKSET_BE_YIELD=gate a hold is the gate on the GPU: launches_held
  // counts its closings, held_ns the time closed, gates_queued the waits
  // queued before launches. kept_off: launches made while every
  // latency-critical task was idle that went on the floor all the same, as
  // kernels timed too long to borrow the reservations (NVTASKSET_BE_BORROW_US).
  std::atomic<std::uint32_t> role;
  std::atomic<std::uint32_t> role_state;
  std::atomic<std::uint64_t> launches_held;
  std::atomic<std::uint64_t> held_ns;
  std::atomic<std::uint64_t> launches_on_floor;
  std::atomic<std::uint64_t> queue_waits;
  std::atomic<std::uint64_t> floor_skipped;
  std::atomic<std::uint64_t> gates_queued;
  std::atomic<std::uint64_t> kept_off;
  DeviceEntry devices[kMaxDevices];
};

// What the launch callback needs of one entry.
struct LaunchView {
  std::uint64_t enabled_lo, enabled_hi;
  std::uint64_t max_cluster;
  std::uint64_t widened_lo, widened_hi;
  std::uint64_t widened_max_cluster;
};

// Tries a reader makes before it gives up on an entry (seqlock.hpp). A read
// retries only while writers published twice during it (a few nanoseconds)
// or the region is corrupt (a sequence number that stays odd): neither may
// make a launch spin without bound.
inline constexpr int kReadTries = seqlock::kReadTries;

enum class ReadResult { kOk, kNone, kInconsistent };

// The one seqlock read of an entry's published buffer: `copy(buffer)` loads
// the fields the caller needs (relaxed); the copy counts only when the
// buffer's sequence was even and unchanged around it. Lock-free, bounded,
// allocation-free: the launch callback uses it.
template <class Copy>
inline ReadResult seqlock_read(const DeviceEntry& e, Copy&& copy) noexcept {
  std::uint64_t kind = 0;
  const bool ok = seqlock::read_picked(
      [&e]() noexcept -> const MaskBuffer& { return e.buffer[e.generation.load(std::memory_order_acquire) & 1]; },
      [&kind, &copy](const MaskBuffer& b) noexcept {
        kind = b.kind.load(std::memory_order_relaxed);
        copy(b);
      });
  if (!ok) return ReadResult::kInconsistent;
  return kind != 0 ? ReadResult::kOk : ReadResult::kNone;
}

// The largest cluster a buffer may name, in SMs: no GPU has more SMs than a
// 128-bit mask has TPCs, two SMs each.
inline constexpr std::uint64_t kMaxClusterSms = 256;

// Whether a consistent copy of a buffer holds what a writer can have stored:
// a known kind; for "no partition", no mask at all (writers store an empty
// Partition); cluster limits a GPU can have. A slot the task's own user
// scribbled over while leaving the header's magic intact fails this with
// near certainty, and then counts as unreadable (the callback falls back to
// its last good partition, says so and counts it) instead of as "no
// partition" (all TPCs, silently). Only compares values already loaded: the
// launch callback affords it.
inline bool view_plausible(std::uint64_t kind, const LaunchView& v) noexcept {
  if (kind > static_cast<std::uint64_t>(SpecKind::kPhysical)) return false;
  if (kind == 0) return (v.enabled_lo | v.enabled_hi | v.widened_lo | v.widened_hi | v.max_cluster) == 0;
  return v.max_cluster <= kMaxClusterSms && v.widened_max_cluster <= kMaxClusterSms;
}

// What the launch callback reads of one entry. kNone: the entry holds no
// partition; kInconsistent: no consistent copy within kReadTries, or a slot
// whose flag or fields no writer stores (see view_plausible); the caller
// falls back to its last good copy.
inline ReadResult read_launch_view(const DeviceEntry& e, LaunchView& v) noexcept {
  std::uint64_t kind = 0;
  const ReadResult r = seqlock_read(e, [&v, &kind](const MaskBuffer& b) {
    kind = b.kind.load(std::memory_order_relaxed);
    v.enabled_lo = b.enabled[0].load(std::memory_order_relaxed);
    v.enabled_hi = b.enabled[1].load(std::memory_order_relaxed);
    v.max_cluster = b.max_cluster.load(std::memory_order_relaxed);
    v.widened_lo = b.widened[0].load(std::memory_order_relaxed);
    v.widened_hi = b.widened[1].load(std::memory_order_relaxed);
    v.widened_max_cluster = b.widened_max_cluster.load(std::memory_order_relaxed);
  });
  if (r == ReadResult::kInconsistent) return r;
  if (e.in_use.load(std::memory_order_relaxed) != 1 || !view_plausible(kind, v)) return ReadResult::kInconsistent;
  return r;
}

// The entry whose partition applies on one GPU: that GPU's own entry, else
// the "any device" entry, else none (unrestricted). `uuid_of(out)` fills in
// the GPU's UUID and returns false when it cannot be told; it is called only
// when some entry names a GPU. Lock-free and allocation-free: the launch
// callback uses it (with the launching GPU), and so does the shim's SM-count
// answer (with the queried one).
inline bool is_any_device(const std::uint8_t (&u)[16]) noexcept {
  std::uint8_t acc = 0;
  for (std::uint8_t b : u) acc |= b;
  return acc == 0;
}
//
// A slot whose in-use flag is neither 0 nor 1 was scribbled over (writers
// store only those): it may have been this GPU's entry, so when no intact
// entry names the GPU, that slot is returned rather than the "any device"
// entry or none, and read_launch_view reports it unreadable. The launch then
// runs on the last partition read, or on all TPCs with a warning and a
// count, never silently. (Scribbled bytes that look like a valid entry for
// another GPU cannot be told from one.)
template <class UuidOf>
inline const DeviceEntry* entry_for_device(const Header& h, UuidOf&& uuid_of) noexcept {
  const DeviceEntry* any = nullptr;
  const DeviceEntry* scribbled = nullptr;
  bool specific = false;
  for (const DeviceEntry& e : h.devices) {
    const std::uint32_t in_use = e.in_use.load(std::memory_order_acquire);
    if (in_use == 0) continue;
    if (in_use != 1) {
      if (scribbled == nullptr) scribbled = &e;
    } else if (is_any_device(e.uuid)) {
      if (any == nullptr) any = &e;
    } else {
      specific = true;
    }
  }
  const DeviceEntry* fallback = scribbled != nullptr ? scribbled : any;
  if (!specific) return fallback;
  std::uint8_t uuid[16];
  if (!uuid_of(uuid)) return fallback;
  for (const DeviceEntry& e : h.devices)
    if (e.in_use.load(std::memory_order_acquire) == 1 && std::memcmp(e.uuid, uuid, 16) == 0) return &e;
  return fallback;
}

// The old interface, for tests: true when the entry holds a partition.
inline bool read_enabled(const DeviceEntry& e, std::uint64_t& lo, std::uint64_t& hi) noexcept {
  LaunchView v{};
  const bool ok = read_launch_view(e, v) == ReadResult::kOk;
  lo = v.enabled_lo;
  hi = v.enabled_hi;
  return ok;
}

// callback_registered when the shim loaded the driver but could not
// subscribe the launch callback (no image token takes this value).
inline constexpr std::uint32_t kHookFailed = 0xffffffffu;

// Errors meant for the user: what() is one line.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where a task's region lives (docs/design.md, "The control region"): an
// anonymous, sealed memory file (memfd_create) that the task's shim creates
// and keeps open, named "nvtaskset.<pid>". Nothing of it exists in a shared
// namespace, so no other user can create, replace or squat it; it can only
// be opened through /proc/<pid>/fd, which the kernel allows to the task's
// own user and root only; its size is sealed, so even they cannot truncate
// it under the task (a mapping past the end would fault); and it vanishes
// with the process. The descriptor is close-on-exec, so no program the task
// starts (or becomes) holds it: a new image reads its current partition
// from the task's status entry instead (shim.cpp, initial_partitions).
std::string region_name(pid_t pid);
// /proc/<pid>/stat field 22, or 0 when the process does not exist.
std::uint64_t process_start_time(pid_t pid);

class Region {
 public:
  // Shim side: the calling process's region, seeded with `initial`; or the
  // region another copy of the shim in this process image created, which
  // keeps its live partitions. Throws Error.
  static std::unique_ptr<Region> create_for_self(const std::vector<DevicePartition>& initial);
  // CLI side: open a live process's region, after checking that it is the
  // process's own (owner, mode 0600, exact size, sealed, pid and start
  // time). Throws Error with one-line messages: "pid 42: no such process",
  // "pid 42 is not running under nvtaskset", "pid 42 belongs to another
  // user ...", "control region of pid 42 is corrupt: ...".
  static std::unique_ptr<Region> attach(pid_t pid);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  Header& header() noexcept { return *header_; }
  const Header& header() const noexcept { return *header_; }
  pid_t pid() const noexcept { return header_->pid; }

  // All entries in use (consistent snapshot of each). Throws Error when the
  // region cannot be read consistently (corrupt).
  std::vector<DevicePartition> read_all() const;
  // Replace the partition of `device` (adding an entry if needed). Writers
  // are serialised across processes (the writer lock, below, taken for this
  // write unless this object holds it). Throws Error when all slots are
  // taken, when the lock is not had within kLockTimeout, or when the
  // partition is impossible for its GPU (partition_problem).
  void write(const DevicePartition& dp);

  // The writer lock (flock on the region), held by this object until
  // unlock() or its destruction, so that a change of several steps (the
  // status entry, the region, the entry again) is one to other writers. The
  // kernel drops it when the holder dies. Waits at most `timeout`, then
  // throws Error naming the holder when /proc/locks tells it: a user who
  // holds the lock of their own task must not stall root's -p for ever.
  void lock(std::chrono::milliseconds timeout);
  // Takes the lock only if it is free now; false if another holds it.
  bool try_lock();
  void unlock() noexcept;
  bool locked() const noexcept;

  struct Impl;  // the descriptor and the mapping (opaque)

 private:
  explicit Region(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  Header* header_ = nullptr;
};

// How long a writer waits for another's lock before it gives up (a -p holds
// it for its whole change: a few milliseconds, up to a second when choices
// race).
inline constexpr std::chrono::milliseconds kLockTimeout{3000};

// Reads one entry's current partition (consistent snapshot). Throws Error
// ("inconsistent") when no consistent copy is read within kReadTries.
Partition read_partition(const DeviceEntry& e);

// Checks what a reader can check of a region without the device: entry
// flags, partition kinds, a non-empty mask for every active partition, a
// device description a GPU can have (at most 256 SMs: masks have 128 bits),
// no device given twice. Returns "" or the first problem, one line.
std::string validate(const Header& h);

// The entry whose partition the shim applies to kernels of `device`: the
// entry for that GPU, else the first "any device" entry, else none. The
// launch callback (shim.cpp, select_entry) follows the same rule.
const DevicePartition* applied_to(const std::vector<DevicePartition>& parts, const DeviceUuid& device);

// Why a task's shim cannot apply a partition (its kernels run on all TPCs),
// or "" when it can. Read from the counters the shim keeps in the region.
std::string cannot_apply(const Header& h);

// Initialises a Header for the calling process with `initial` partitions
// (any entries it held before are dropped). Used for shared regions and, when
// no region can be created, for a process-local header so the partition
// still applies.
void init_header(Header& h, const std::vector<DevicePartition>& initial);

// All entries in use of a header (consistent snapshot of each).
std::vector<DevicePartition> read_all(const Header& h);

}  // namespace nvtaskset::ctl
