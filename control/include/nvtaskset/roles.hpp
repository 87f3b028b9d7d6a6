// SPDX-License-Identifier: Apache-2.0
// Latency-critical and best-effort roles (docs/design.md, "Roles").
//
// A latency-critical (LC) task holds a reservation of TPCs no other
// partition takes, and bursts onto the rest of the GPU while it has work. A
// best-effort (BE) task runs on everything while every LC task is idle, and
// gets out of an LC task's way while it is busy: its shim holds new launches
// back (the burst), or launches them only on its floor (its partition minus
// every LC reservation) when the LC task has used up its burst. The SMs are
// not all an LC task needs: next to a shrunk neighbour its kernels still ran
// 1.4x slower on an H100 (DRAM and L2 are shared; docs/hardware.md), so while
// it bursts the BE task launches nothing at all. A mask reaches a kernel only
// at its launch (docs/hardware.md), so a BE task also keeps few kernels
// queued at any time: its queue is what an LC request waits behind.
//
// How the tasks meet: each LC task's shim publishes a beacon, a small
// shared-memory file in the status directory (status.hpp), world-readable,
// writable by its user only, trusted by readers as status entries are
// (owner, live process, start time). Its controller thread (in the LC
// task's shim: it owns the signal, its own kernels' completions, and dies
// with it) marks the task busy from its first launch until its last launch
// completes, and decides whether it may burst. BE shims map beacons
// read-only and decide per launch, in the intercepted API call, never in the
// launch callback.
//
// Everything here but the file handling is pure, so that the policy can be
// tested against recorded traces without a clock.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <span>
#include <vector>

#include "nvtaskset/partition.hpp"

namespace nvtaskset::roles {

enum class Role : std::uint32_t { kNone = 0, kLatencyCritical = 1, kBestEffort = 2 };

// "latency-critical", "best-effort" or "none": the names of the CLI options
// and of "role" in `--status --json`.
const char* role_name(Role r) noexcept;
std::optional<Role> parse_role(std::string_view s) noexcept;

// ---- the beacon --------------------------------------------------------------------

inline constexpr std::uint32_t kBeaconMagic = 0x4e42564eu;  // "NVBN"
inline constexpr std::uint32_t kBeaconVersion = 3;
inline constexpr unsigned kBeaconDevices = 8;

// One GPU of an LC task: its reservation, what it bursts onto, and its
// top-up (TPCs it takes beyond its reservation while saturated; see TopUp),
// as physical enable bits, seqlocked (odd while written).
struct BeaconDevice {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint32_t> in_use;
  std::uint32_t pad;
  std::uint8_t uuid[16];
  std::atomic<std::uint64_t> reserved[2];
  std::atomic<std::uint64_t> burst[2];
  std::atomic<std::uint64_t> topup[2];
};

// What a burst is, in the controller's words.
enum class LcState : std::uint32_t { kIdle = 0, kBursting = 1, kSaturated = 2 };

struct Beacon {
  std::atomic<std::uint32_t> magic;  // stored last
  std::uint32_t version;
  std::uint32_t size;
  std::int32_t pid;
  std::uint64_t start_time;  // /proc/<pid>/stat field 22
  std::uint32_t uid;
  std::uint32_t pad;
  // Launches the LC task made, and the highest of them known complete: the
  // task is busy while they differ.
  std::atomic<std::uint64_t> launches;
  std::atomic<std::uint64_t> completed;
  // CLOCK_MONOTONIC (ns) of the controller's last pass: a beacon whose
  // controller stopped (the task is stopped or hangs) is stale.
  std::atomic<std::uint64_t> heartbeat_ns;
  // 1 while a busy LC task may burst (BE tasks hold their launches); 0 when
  // it used up its burst (BE tasks launch on their floor).
  std::atomic<std::uint32_t> may_burst;
  std::atomic<std::uint32_t> state;  // LcState, for --status
  // The controller's record, for --status: busy periods, the time busy, the
  // periods it had to stop bursting.
  std::atomic<std::uint64_t> busy_periods;
  std::atomic<std::uint64_t> busy_ns;
  std::atomic<std::uint64_t> saturations;
  // The top-up: bumped with every change of a device's top-up (BE tasks then
  // work out their floors again); its size in TPCs, and the last ratio of
  // the task's durations to its durations alone on its reservation (x1000),
  // for --status.
  std::atomic<std::uint64_t> topup_gen;
  std::atomic<std::uint32_t> topup_tpcs;
  std::atomic<std::uint32_t> topup_ratio_milli;
  // 1 while a reference probe runs (BE tasks hold, the task runs on its
  // reservation alone).
  std::atomic<std::uint32_t> probing;
  std::atomic<std::uint32_t> topup_probes;  // reference probes made, for --status
  // Bumped, and its futex woken (wake_best_effort), whenever a BE task may
  // have to make way: the task turned busy (a launch made while every
  // earlier one was known complete), or it may burst or probes again. BE
  // gatekeepers sleep on it while none has to (await_wake) instead of
  // polling every 20 us: that polling cost GPT-2-medium training 6 points of
  // its throughput next to an idle LC task on an H200 (run 95,
  // docs/results.md, "The gatekeeper asleep while the LC task is idle").
  std::atomic<std::uint32_t> wake;
  BeaconDevice devices[kBeaconDevices];
};

// Wakes every gatekeeper asleep on `b` (FUTEX_WAKE on the shared mapping:
// the key is the file's page, so it reaches read-only mappings of other
// processes, and a read-only mapping may wake too). A system call: from
// intercepted API calls and the controller, never from the launch callback.
// The LC task bumps `b.wake` first; a BE task wakes its own gatekeeper this
// way when the LC tasks it knows change.
void wake_best_effort(const Beacon& b) noexcept;
// Sleeps while `b.wake` is still `seen`, at most `timeout_ns`: woken (or
// the word had changed already, or a signal came), timed out, or refused by
// the kernel (the caller then polls as before).
enum class Wake { kWoken, kTimedOut, kRefused };
Wake await_wake(const Beacon& b, std::uint32_t seen, std::uint64_t timeout_ns) noexcept;
// The same on several beacons at once (seen[i] for bs[i], at most 128):
// woken by any. One beacon: await_wake; several: futex_waitv (Linux 5.16
// or later; refused by older kernels, whose callers poll).
Wake await_any_wake(std::span<const Beacon* const> bs, std::span<const std::uint32_t> seen,
                    std::uint64_t timeout_ns) noexcept;

// Beacons are this big (one page), whatever sizeof(Beacon) is.
inline constexpr std::size_t kBeaconBytes = 4096;
static_assert(sizeof(Beacon) <= kBeaconBytes);
// `wake` is a futex: 4 bytes, lock-free.
static_assert(sizeof(std::atomic<std::uint32_t>) == 4 && std::atomic<std::uint32_t>::is_always_lock_free);

// The LC task's own beacon (read-write mapping), created in status_dir() as
// "nvtaskset-beacon.<pid>.<16 hex>", mode 0644; removed with the object.
class BeaconFile {
 public:
  // Throws ctl::Error with one line.
  static std::unique_ptr<BeaconFile> create();
  ~BeaconFile();
  BeaconFile(const BeaconFile&) = delete;
  BeaconFile& operator=(const BeaconFile&) = delete;
  Beacon& beacon() noexcept { return *b_; }
  const std::string& path() const noexcept { return path_; }
  // After fork: the child must not remove its parent's file (its own is made anew).
  void forget() noexcept { path_.clear(); }

 private:
  BeaconFile(std::string path, Beacon* b) : path_(std::move(path)), b_(b) {}
  std::string path_;
  Beacon* b_;
};

// Writes one device's reservation, burst set and top-up (seqlocked).
void set_device(Beacon& b, unsigned slot, const DeviceUuid& uuid, const Bits128& reserved, const Bits128& burst,
                const Bits128& topup = {});

struct DeviceView {
  DeviceUuid uuid{};
  Bits128 reserved, burst, topup;
};
// A consistent copy of every device in use; false when none could be had.
bool read_devices(const Beacon& b, std::vector<DeviceView>& out);
// The reservation on `uuid` (nothing when the beacon has none there).
// Lock-free and allocation-free, with a bounded number of tries.
Bits128 reserved_on(const Beacon& b, const std::uint8_t (&uuid)[16]) noexcept;
// The same for the top-up on `uuid`.
Bits128 topup_on(const Beacon& b, const std::uint8_t (&uuid)[16]) noexcept;

// A live LC task's beacon, mapped read-only (the mapping is never unmapped:
// launching threads may still read it; one page per LC task ever seen).
struct Peer {
  pid_t pid = 0;
  std::uint64_t start_time = 0;
  uid_t uid = 0;
  const Beacon* beacon = nullptr;
};
// Every trusted beacon of a live task other than `self`: a regular file of
// exactly kBeaconBytes, owned by the task's user (or root), writable by its
// owner only, whose header names that task and its start time. Beacons of
// ended tasks are removed where the caller may. `known` are mappings kept
// from an earlier scan: reused, not mapped again.
// `other_builds`, when given, gets the live tasks whose beacon passes those
// checks but has another layout (kBeaconVersion): an LC task of another
// nvtaskset build, which this one can neither read nor make way for.
struct OtherBuild {
  pid_t pid = 0;
  std::uint32_t version = 0;
};
std::vector<Peer> scan_beacons(pid_t self, const std::vector<Peer>& known,
                               std::vector<OtherBuild>* other_builds = nullptr);
// Whether the task a beacon names is still the one that wrote it.
bool peer_alive(const Peer& p);

// ---- the policy (pure) ---------------------------------------------------------------

// What the controller may burst: an exponentially weighted share of time
// busy (time constant tau_ns), and the length of the current busy period.
// Bursting stops when the share passes stop_share or one busy period lasts
// max_burst_ns, and starts again once the share is below resume_share and
// the task was idle. A task that keeps the GPU busy (a closed loop) then
// runs on its reservation next to BE tasks on their floors, instead of
// starving them.
//
// The time constant is 1 s, not less: an open-loop load is bursty, and a
// server at 20% of the GPU (GPT-2 at 87 requests/s bursting on an H100)
// was busy for half of some 200-ms stretches; with a 200-ms constant it was
// stopped there, ran 3.5 times slower on its reservation, and its queue
// grew to a p99 of 60 ms (docs/results.md, "The burst budget's time
// constant"). Over 1 s the same load stays near its mean.
//
// The share is measured at the speed the task runs at, and a task stopped
// from bursting runs slower, so it is busier: a load that is light while it
// bursts can be heavy on the reservation alone (GPT-2 inference at 87
// requests/s is about 60% busy on 16 TPCs of an H100, docs/results.md) and
// would never fall below the resume share again. So after resume_after_ns
// stopped, the first idle pass lets it burst again, its share lowered to
// the resume share: a task that bursts its way back to a light load keeps
// bursting. A closed loop, busy at any speed, is stopped again within
// tau * ln((1 - resume) / (1 - stop)) = 0.26 s; a probe that ends so (within
// 2 tau of its start) doubles the next time-out, up to max_resume_after_ns,
// so a closed loop pays one such probe per 8 s once settled; any other
// resume or stop starts again from resume_after_ns. 0: no time-out.
//
// A second, fast share (time constant fast_tau_ns) stops a task that is
// busy but for short gaps, as a closed loop is between its requests: from
// idle the 1-s share passes 0.5 only after 0.7 s, and the mix's closed loop
// burst for its first 0.7 s of every window while the training held (run 61,
// docs/results.md, "A top-up that pays for the memory system"): 17% of a
// 4-s window. Over 100 ms at 0.93 a closed loop 95-98% busy is stopped
// after 0.32-0.39 s; one busy period without a gap passes 0.93 only after
// 266 ms, later than max_burst_ns stops it, and an open-loop load passes it
// only when it keeps the GPU busy for a third of a second (GPT-2 at 87
// requests/s is 20% busy while bursting). A resume by the time-out lowers
// it to fast_resume_share, not to the resume share as the slow one: a task
// busy without a pause (a closed loop) is stopped again after
// 0.1 s * ln((1 - 0.9) / (1 - 0.93)) = 36-60 ms, not after the slow share's
// 0.28 s, each time holding the BE tasks (run 64: the initial burst and two
// such tries took about a fifth of a 4-s closed window from the training,
// 8.27 it/s against 9.98 for the static split of the same shape), while a
// task that bursts its way back to a light load falls below it at once.
// 0: no fast share.
struct BudgetParams {
  std::uint64_t tau_ns = 1'000'000'000;
  double stop_share = 0.5;
  double resume_share = 0.35;
  std::uint64_t max_burst_ns = 250'000'000;
  std::uint64_t resume_after_ns = 1'000'000'000;
  std::uint64_t max_resume_after_ns = 8'000'000'000;
  std::uint64_t fast_tau_ns = 100'000'000;
  double fast_stop_share = 0.93;
  double fast_resume_share = 0.9;
};

class BurstBudget {
 public:
  explicit BurstBudget(BudgetParams p = {}) : p_(p) {}
  // Time `now` (ns, monotonic), the task busy or not since the last call.
  void advance(std::uint64_t now, bool busy) noexcept;
  bool may_burst() const noexcept { return allowed_; }
  double share() const noexcept { return share_; }
  double fast_share() const noexcept { return fast_share_; }
  std::uint64_t saturations() const noexcept { return saturations_; }
  // The time-out before the next probe.
  std::uint64_t resume_timeout() const noexcept { return timeout_ns_ != 0 ? timeout_ns_ : p_.resume_after_ns; }

 private:
  BudgetParams p_;
  std::uint64_t last_ = 0;
  std::uint64_t busy_since_ = 0;  // 0: idle
  std::uint64_t stopped_at_ = 0;  // when bursting last stopped
  std::uint64_t probed_at_ = 0;   // when the time-out last let it burst (0: not since)
  std::uint64_t timeout_ns_ = 0;  // the current time-out (0: resume_after_ns)
  double share_ = 0;
  double fast_share_ = 0;
  bool allowed_ = true;
  bool started_ = false;
  std::uint64_t saturations_ = 0;
};

// One LC task as a BE task sees it at one moment.
struct LcSnapshot {
  std::uint64_t launches = 0, completed = 0, heartbeat_ns = 0;
  bool may_burst = false;
  bool probing = false;  // a reference probe of its top-up (may_burst is 1 for it)
};
LcSnapshot snapshot(const Beacon& b) noexcept;

// CLOCK_MONOTONIC in ns: the clock of heartbeats and budgets. No system
// call on Linux (the vDSO), so the shim may read it in intercepted calls.
inline std::uint64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// A controller that has not passed for this long is stale: its task is
// stopped or hangs, and BE tasks keep off its reservation without holding
// for it.
inline constexpr std::uint64_t kStaleNs = 250'000'000;
bool is_stale(const LcSnapshot& s, std::uint64_t now_ns) noexcept;

enum class BeAction {
  kRun,    // every LC task idle: launch on the whole partition (borrowing)
  kHold,   // an LC task bursts: launch nothing yet
  kFloor,  // an LC task is busy but does not burst (or is stale): launch on the floor
};
// (A span: the shim passes a fixed array it fills under its lock, where an
// allocation that failed would throw.)
BeAction be_action(std::span<const LcSnapshot> lcs, std::uint64_t now_ns) noexcept;
inline BeAction be_action(const std::vector<LcSnapshot>& lcs, std::uint64_t now_ns) noexcept {
  return be_action(std::span<const LcSnapshot>(lcs), now_ns);
}
// Whether a hold (be_action's kHold) is for reference probes only: every LC
// task that makes the BE task hold is probing, none bursts.
bool hold_is_probe(std::span<const LcSnapshot> lcs, std::uint64_t now_ns) noexcept;
inline bool hold_is_probe(const std::vector<LcSnapshot>& lcs, std::uint64_t now_ns) noexcept {
  return hold_is_probe(std::span<const LcSnapshot>(lcs), now_ns);
}

// A BE task holds for an LC task for at most this long in a row, and at
// most half of its time (a BurstBudget of its own): an LC task that claims
// to burst for ever, by fault or by design, cannot stop it.
// No resume time-out: this bound is the BE task's own, not a guess about
// how fast the LC task would run.
inline constexpr BudgetParams kHoldBudget{200'000'000, 0.5, 0.35, 100'000'000, 0, 0, 0, 0, 0};
// A hold for a reference probe (TopUp) counts against a bound of its own,
// not against kHoldBudget: a closed loop's burst spends that one (its first
// 0.35 s of burst held the BE task for more than 100 ms), and the probe
// that follows the stop at once then ran next to the BE task on its whole
// floor, so its "alone" durations were the contended ones and the top-up
// was sized against them (run 63: the top-up started at 2 TPCs with its
// ratio at 1.04 while the requests ran at 1.2-1.3x of alone; docs/runs.md).
// A probe lasts at most 80 ms, one per 4 s (0.5 s while they time nothing):
// 2-14% of the time. This bound, 100 ms in a row and a fifth of the time
// over 2 s, keeps an LC task that probes for ever from stopping the BE task.
inline constexpr BudgetParams kProbeHoldBudget{2'000'000'000, 0.2, 0.1, 100'000'000, 0, 0, 0, 0, 0};

// The floor of a BE partition: what is left of it without the LC
// reservations on its GPU. Empty when nothing is.
inline Bits128 floor_of(const Bits128& enabled, const Bits128& reserved) noexcept {
  return Bits128{enabled.lo & ~reserved.lo, enabled.hi & ~reserved.hi};
}

// ---- the best-effort queue bounded in work (NVTASKSET_BE_WORK_US) ---------------------
//
// What an LC request waits behind is the BE work already queued when it
// arrives (docs/results.md, "Give-back time of the roles"). A bound in
// launches cannot tell GPT-2-medium's 10-us element-wise kernels from its
// 1-ms optimizer and LM-head kernels: 4 launches starve the GPU between the
// short ones (the training lost 22% next to an idle LC task on an H100) and
// stack up several ms of the long ones. So the shim learns each kernel's
// duration from its own launches, on the GPU's clock (the time between the
// events recorded after a launch and after the one before it, when it was
// queued behind that one), and keeps at most a bound of that work queued.

// A kernel as the work bound knows it: its function and grid size (the same
// kernel over another tensor size takes another time). Never 0.
inline std::uint64_t kernel_key(const void* fn, std::uint64_t blocks) noexcept {
  std::uint64_t k = reinterpret_cast<std::uintptr_t>(fn) * 0x9E3779B97F4A7C15ull ^ (blocks + 0x632BE59BD9B4E019ull);
  k ^= k >> 29;
  return k != 0 ? k : 1;
}

// Learned durations, by kernel key: a moving average (a quarter weight per
// sample, the first sample as it is). A fixed table (no allocation on the
// launch path); a key that finds no room is not learned.
class KernelDurations {
 public:
  static constexpr unsigned kSlots = 4096, kProbe = 16;
  // Its estimate in ns, or `unknown` where it has none.
  std::uint64_t estimate(std::uint64_t key, std::uint64_t unknown) const noexcept;
  // How many samples the estimate is of (0: none).
  unsigned samples(std::uint64_t key) const noexcept;
  // The least of the first kFirst samples, then a moving average (a
  // quarter weight each). The first launch of a kernel loads its module
  // (CUDA's lazy loading, the default), so its sample is longer than the
  // kernel, and a moving average re-timed once in 64 launches takes dozens
  // of steps to forget it. With the first sample as the average's start,
  // GPT-2-medium training next to an idle LC task had a tenth of its
  // launches kept off the reservation as "500 us or longer" after 30 steps,
  // and 100 us of learned work gave it no fewer gates than one every 2
  // launches (H100, run 103); with the least of two, 28x fewer were kept
  // off (run 104). The samples themselves were not read out.
  static constexpr unsigned kFirst = 2;
  void learn(std::uint64_t key, std::uint64_t sample_ns) noexcept;
  // The least sample instead of an average (durations alone, TopUp).
  void learn_least(std::uint64_t key, std::uint64_t sample_ns) noexcept;
  void clear() noexcept {
    for (Entry& e : e_) e = {};
  }

 private:
  template <class Merge>
  void put(std::uint64_t key, std::uint64_t sample_ns, Merge merge) noexcept;
  struct Entry {
    std::uint64_t key = 0;
    std::uint64_t ns = 0;
    unsigned samples = 0;
  };
  // The entry of `key`, or nullptr where it has none.
  const Entry* find(std::uint64_t key) const noexcept;
  Entry e_[kSlots]{};
};

// The queue itself: launches in the order they were queued, each with the
// work it was counted as. The shim records one event per launch in slot
// `next_slot()` and asks this class what to do; everything here is pure, so
// that tests drive it with recorded traces.
class WorkQueue {
 public:
  static constexpr unsigned kRing = 64;
  // At most `bound_ns` of estimated work queued behind the oldest launch (a
  // launch of more goes when nothing else is queued), and at most
  // `max_launches` (1 to kRing - 1) launches.
  WorkQueue(std::uint64_t bound_ns, unsigned max_launches) noexcept;

  unsigned size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  bool full() const noexcept { return size_ >= max_; }
  std::uint64_t queued_ns() const noexcept { return queued_ns_; }
  unsigned oldest() const noexcept { return static_cast<unsigned>(head_ % kRing); }
  unsigned next_slot() const noexcept { return static_cast<unsigned>((head_ + size_) % kRing); }

  // A launch recorded in next_slot(). It was queued behind the one before
  // it when that one is still queued and nothing went unrecorded between.
  void push(std::uint64_t key) noexcept;
  // Forgets every queued launch, keeping what it learned: in a forked
  // child, whose events are not the parent's.
  void clear() noexcept {
    head_ = 0;
    size_ = 0;
    queued_ns_ = 0;
    chained_ = false;
  }
  // A launch that could not be recorded: it is not counted, and the next
  // one's time since the one before is not its duration.
  void gap() noexcept { chained_ = false; }
  // Whether the oldest launch's duration can be learned when it completes:
  // the time from the previous launch's event (slot prev_slot()) to its own.
  // Only a launch queued behind the one before it: that one left the queue
  // first, so prev_slot() holds its completion.
  bool wants_sample() const noexcept { return size_ > 0 && slots_[oldest()].behind; }
  unsigned prev_slot() const noexcept { return static_cast<unsigned>((head_ + kRing - 1) % kRing); }
  // The oldest launch completed; `elapsed_ns` is what wants_sample() asked
  // for (ignored when it did not ask, or when it could not be read: < 0).
  void pop(std::int64_t elapsed_ns) noexcept;
  // Whether a launch of `key` may join the queue now; else the task waits
  // for the oldest launch first. The oldest is running, or next to: an LC
  // request waits out what is left of it whatever the bound, so the bound
  // counts the work queued behind it, this launch's included. Asked before
  // the launch: checked after it, each launch left one more queued past the
  // bound (6-ms matmuls: one running and one queued, 8 ms of give-back on
  // an H100, run 49); counting the oldest too, every short kernel behind a
  // long one waited for it (GPT-2-medium training at 0.58 of alone, run 50).
  bool fits(std::uint64_t key) const noexcept {
    if (size_ == 0) return true;
    if (size_ >= max_) return false;
    return queued_ns_ - slots_[oldest()].est + durations_.estimate(key, bound_ns_) <= bound_ns_;
  }

  const KernelDurations& durations() const noexcept { return durations_; }
  KernelDurations& durations() noexcept { return durations_; }

 private:
  struct Slot {
    std::uint64_t key = 0, est = 0;
    bool behind = false;
  };
  std::uint64_t bound_ns_;
  unsigned max_;
  std::uint64_t head_ = 0;  // sequence number of the oldest queued launch
  unsigned size_ = 0;
  std::uint64_t queued_ns_ = 0;
  bool chained_ = false;  // the launch before the next one was recorded
  Slot slots_[kRing]{};
  KernelDurations durations_;
};

// ---- best-effort kernels too long to borrow the reservations (NVTASKSET_BE_BORROW_US) ----
//
// While every LC task is idle a BE task borrows the reservations, and an LC
// request that arrives then waits on its reservation for the BE kernel
// running there (and the rest of its gate's group) to end. GPT-2-medium
// training spends 16% of its GPU time in three kernels of 2.9-4.4 ms a step
// (sm75 CUTLASS GEMMs of alignment 1, once a step each: by all signs the LM
// head's, whose vocabulary, 50257, is odd), so an arrival finds more than 2 ms
// of BE work in the way 5-7% of the time (H200, bench/be_kernels.py, run 83).
// A BE task kept off the reservations altogether gave the LC p99 1.09x of
// alone at 44 requests/s where borrowing gave 1.56x, at 0.74 of the
// training's throughput alone against 0.85 (run 83). So a kernel the task's
// own launches timed at the limit or more keeps off the reservations even
// while every LC task is idle, and the short ones borrow them. The same
// durations space the task's gates (GateLane). Pure: the shim records the
// events and asks this class which launch to time, when to read them, and
// what it learned.
class KernelTimer {
 public:
  static constexpr unsigned kPairs = 4;   // launches timed at once (two events each)
  static constexpr unsigned kEvery = 64;  // a kernel already timed is timed again once in this many launches
  // The pending pairs are read once in this many launches, not at every
  // one: their end events wait behind the task's queue (64 launches), so
  // read at each launch they cost 1-2 event queries a launch for nothing
  // (on an H100 the timing cost GPT-2-medium training 3 points next to an
  // idle LC task, run 102).
  static constexpr unsigned kPollEvery = 16;
  // `limit_ns` 0: every kernel borrows (the durations still space the gates).
  explicit KernelTimer(std::uint64_t limit_ns) noexcept : limit_ns_(limit_ns) {}

  std::uint64_t limit_ns() const noexcept { return limit_ns_; }
  // Whether a launch of `key` may borrow the reservations: no limit, not
  // timed yet, or timed shorter than the limit (a moving average).
  bool borrows(std::uint64_t key) const noexcept {
    return limit_ns_ == 0 || durations_.estimate(key, 0) < limit_ns_;
  }
  // Before a launch: whether the pending pairs are to be read now (once in
  // kPollEvery launches while any is pending).
  bool poll_due() noexcept {
    if (!any_pending()) return false;
    return ++since_poll_ % kPollEvery == 0;
  }
  // Before a launch of `key`: the pair of events to time it with (its
  // start event is recorded next, after any gate), or -1: a kernel timed
  // fewer than KernelDurations::kFirst times and not being timed now, or
  // every kEvery-th launch, while a pair is free.
  int start(std::uint64_t key) noexcept;
  // After the launch: its end event was recorded (`ok`), or it could not
  // be, or the launch failed: the pair is free again, nothing learned.
  void ended(int pair, bool ok) noexcept;
  // Whether `pair` waits for its end event to complete.
  bool pending(int pair) const noexcept {
    return pair >= 0 && pair < static_cast<int>(kPairs) && pairs_[pair].state == State::kRecorded;
  }
  bool any_pending() const noexcept {
    for (const Pair& p : pairs_)
      if (p.state == State::kRecorded) return true;
    return false;
  }
  // The launch timed with `pair` completed: `elapsed_ns` from its start
  // event to its end event (< 0: could not be read; nothing learned).
  void finish(int pair, std::int64_t elapsed_ns) noexcept;
  // Forgets the pairs (a forked child: the events are the parent's),
  // keeping what was learned.
  void drop_pairs() noexcept {
    for (Pair& p : pairs_) p = {};
  }
  const KernelDurations& durations() const noexcept { return durations_; }

 private:
  enum class State : std::uint8_t { kFree, kStarted, kRecorded };
  struct Pair {
    std::uint64_t key = 0;
    State state = State::kFree;
  };
  Pair pairs_[kPairs]{};
  KernelDurations durations_;
  std::uint64_t limit_ns_;
  std::uint64_t launches_ = 0;
  unsigned since_poll_ = 0;
};

// ---- where a best-effort stream's gates go (NVTASKSET_BE_GATE_US, _EVERY) ------------------
//
// An LC request that arrives while a BE stream runs waits for the kernels
// queued before that stream's next gate (the gate: a wait on the GPU that
// the task's gatekeeper closes while the LC task is busy). Each gate costs:
// on an H100 a stream of 48-us kernels ran 1.45 us a launch slower with a
// gate every 2 launches (about 2.9 us a gate), the launching thread 1.3 us a
// launch more, and GPT-2-medium training next to an idle LC task gained 5
// points of its throughput with a gate every 64 launches (run 102). A gate
// every 2 launches puts one before every other kernel of a training step's
// many short ones (element-wise, normalisation, optimizer) though a group of
// them is over sooner than one matmul. So, by default, a stream's kernels
// are grouped by their learned durations (KernelTimer): a gate goes before a
// launch once the learned work since the stream's last gate, this kernel
// included, would pass the bound, before a kernel not timed yet and the
// launch after it (it may be long), and after max_launches launches. What a
// request waits for is then the rest of a group: at most the bound of
// learned work, or one kernel longer than that. Pure: the shim keeps one
// lane per stream.
struct GateSpacing {
  unsigned every = 0;          // > 0: a gate every this many launches (NVTASKSET_BE_GATE_EVERY), nothing learned
  std::uint64_t work_ns = 0;   // otherwise: at most this much learned work between two gates
  unsigned max_launches = 16;  // and at most this many launches
  static constexpr std::uint64_t kUnknown = ~0ull;  // a kernel's duration not learned yet
};

class GateLane {
 public:
  // Before a launch of a kernel that runs `kernel_ns` (GateSpacing::kUnknown:
  // not timed yet): whether a gate goes before it. The lane's first launch
  // gets one.
  bool next(const GateSpacing& s, std::uint64_t kernel_ns) noexcept;
  // The gate could not be queued: the next launch gets one.
  void reset() noexcept { *this = {}; }

 private:
  unsigned n_ = 0;            // launches since the last gate, the one after it included (0: none yet)
  std::uint64_t work_ns_ = 0; // their learned work
  bool gate_next_ = true;     // the last kernel's duration was unknown (or the lane is new)
};

// ---- the top-up: TPCs that pay a saturated LC task back for the memory system ------------
//
// A saturated LC task (its burst stopped: a closed loop) runs on its
// reservation next to BE tasks on their floors. The SMs are all it is fenced
// from: through DRAM and L2 it still ran 1.45x slower than alone there (p99,
// GPT-2 next to GPT-2-medium training on an H200, run 56), and the BE
// task's TPC count is its bandwidth (docs/hardware.md). The same mix with 8
// more TPCs for the LC task and 8 fewer for the BE task (24 / 42) ran the
// LC at 1.01x its p99 alone on 16 TPCs, with the training at 10 it/s
// (run 56, docs/results.md, "A top-up that pays for the memory system").
// How many a task needs depends on both tasks, so the controller measures
// it: reference probes (BE tasks hold, the LC task runs on its reservation
// alone) learn each of its kernels' durations alone; between them it
// compares the durations it sees with those, and grows its top-up while its
// slow launches are slower than alone, shrinks it while even they are
// clearly faster.
struct TopUpParams {
  // A decision from at least min_samples timed launches: to grow, as soon
  // as they are timed; to shrink (or stay), over a window of decide_ns.
  std::uint64_t decide_ns = 100'000'000;
  unsigned min_samples = 3;
  // Of the ratios of a window's launches to their durations alone, the one
  // at this quantile decides: the slow launches, the tail (the issue's
  // target is a p99), not the average, which stays below 1 while the p99 is
  // above (static 20 / 46 on an H200: p50 1.01x, p99 1.26x; run 56). By
  // nearest rank: of a window's 12-20 launches, the slowest but one or two,
  // so that one outlier does not decide.
  double quantile = 0.9;
  double grow_above = 1.0;    // more TPCs while that ratio is above this
  // Fewer while below this. The 0.9 quantile of a window swings with the
  // training's phases: at 0.9 the top-up swung between 4 and 8 TPCs (run
  // 59), at 0.85 between 6 and 10, shrinking at 0.81-0.84 and growing back
  // at 1.13-1.26 a few hundred ms later (run 61). Shrinking only after
  // shrink_after windows (below) stopped the swing (run 63: 10-12 TPCs,
  // settled at ratios of 0.74-0.93 with the bound at 0.75).
  // At 0.8 it settled at 10-12 TPCs with its launches at 0.75-0.9 of alone
  // and the LC p50 at 0.69x, while the closed loop's p99 was the probes'
  // own launches at 1.0x (run 64): the band's floor is the training's.
  double shrink_below = 0.85;
  // Shrinking, to where the heaviest of those windows would be at this
  // ratio if the task's time grew in proportion to its lost TPCs (at least
  // `step`): one decision, as growing is, from the top-up's start at its
  // most (below) to what the task needs.
  double shrink_to = 0.95;
  // ... in this many full windows in a row. A training step (about 110 ms
  // for GPT-2-medium on an H200) is as long as a window, and its phases
  // draw on DRAM and L2 unlike: one window at 0.7 and the next at 1.26
  // (run 61's traces), so a top-up that shrank after one window grew back
  // a few hundred ms later, and each time it grew two of the task's
  // launches had been slow first. Over half a second (about four steps)
  // the top-up is sized for the heaviest phase, as a static split is.
  unsigned shrink_after = 5;
  // TPCs a decision: at least `step`, and growing, as many as would pay the
  // ratio back if the task's time fell in proportion to its TPCs ((reserved
  // + top-up) x (ratio - 1), rounded up to a TPC pair): one or two
  // decisions reach the top-up instead of one step of 2 per 100 ms (run 57:
  // still at 4-6 after 3 s, its slow transient in every window's tail).
  unsigned step = 2;
  std::uint64_t probe_every_ns = 4'000'000'000;  // a reference probe this often while saturated
  // ... or this soon after one that timed nothing (run 59: one closed-loop
  // window of three ran with no top-up after its one probe timed nothing).
  std::uint64_t probe_retry_ns = 500'000'000;
  // Launches made this soon after a probe began may wait behind BE work
  // queued before it (the give-back: 5-13 ms, docs/results.md): not counted.
  std::uint64_t probe_settle_ns = 15'000'000;
  std::uint64_t probe_max_ns = 80'000'000;  // a probe ends by then,
  unsigned probe_samples = 3;               // or once this many launches were timed
};

// The controller's top-up, pure: the LC shim's controller thread feeds it
// its state and its launches' durations, and applies what it says.
class TopUp {
 public:
  static constexpr unsigned kWindow = 64;  // ratios kept per decision window
  explicit TopUp(TopUpParams p = {}) noexcept : p_(p) {}
  // At most this many TPCs (the controller's bound: see choose_topup), for a
  // reservation of `reserved` TPCs whose identity is `reservation` (any
  // number that changes when its TPCs do; 0: not known). When it changes,
  // the durations alone measured on the old one are forgotten (forget()).
  void set_max(unsigned max_tpcs, unsigned reserved = 0, std::uint64_t reservation = 0) noexcept;
  // A pass of the controller at `now`: the task saturated or not.
  void advance(std::uint64_t now, bool saturated) noexcept;
  // A reference probe: BE tasks hold, the task runs on its reservation alone.
  bool probing() const noexcept { return mode_ == Mode::kProbe; }
  // The TPCs to take beyond the reservation now (none while probing or not saturated).
  unsigned tpcs() const noexcept { return mode_ == Mode::kRun ? tpcs_ : 0; }
  // Changes whenever probing() or tpcs() does: a launch made under another
  // generation is not a sample of this one.
  std::uint64_t generation() const noexcept { return gen_; }
  // A launch of `key` made at `launched_ns` under generation `gen` ran `ns`.
  void sample(std::uint64_t key, std::uint64_t ns, std::uint64_t gen, std::uint64_t launched_ns) noexcept;
  // The ratio of the last decision (0: none yet).
  double last_ratio() const noexcept { return last_ratio_; }
  // Its durations alone are no longer true (its reservation changed).
  void forget() noexcept;
  std::uint64_t probes() const noexcept { return probes_; }
  // Whether the last probe timed the task alone (else no decision is made).
  bool timed_alone() const noexcept { return timed_alone_; }

 private:
  enum class Mode { kOff, kProbe, kRun };
  void start_window(std::uint64_t now) noexcept {
    decided_at_ = now;
    n_ = 0;
  }
  TopUpParams p_;
  Mode mode_ = Mode::kOff;
  unsigned max_ = 0, tpcs_ = 0, reserved_ = 0;
  unsigned below_ = 0;   // full windows in a row below shrink_below
  double below_max_ = 0;  // the highest ratio of those
  bool ever_ran_ = false;  // a top-up was applied once: the first starts at its most
  std::uint64_t reservation_ = 0;
  std::uint64_t gen_ = 1;
  std::uint64_t probe_start_ = 0, probed_at_ = 0, probes_ = 0;
  unsigned probe_n_ = 0;
  bool timed_alone_ = false;  // the last probe timed something
  bool ever_probed_ = false;
  std::uint64_t decided_at_ = 0;
  double ratios_[kWindow]{};
  unsigned n_ = 0;
  double last_ratio_ = 0;
  // Durations alone on the reservation: the least a probe saw, by kernel key.
  KernelDurations alone_;
};

// The TPCs of a top-up: `n` of `free` (the burst set without the
// reservation), those that host no thread-block cluster first (a BE
// task's clusters cannot use them anyway), then those of GPCs the
// reservation already takes TPCs of, then whole GPCs in the map's order
// (the BE task's floor keeps its GPCs whole as long as it can); mask bit
// order within each. Fewer when `free` has fewer.
Bits128 choose_topup(const Bits128& free, const Bits128& reserved, const ClusterMap* map, unsigned n) noexcept;

}  // namespace nvtaskset::roles
