// SPDX-License-Identifier: Apache-2.0
// The beacon: how latency-critical and best-effort tasks meet (docs/design.md,
// "Roles").
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
// The policy that reads and writes beacons is pure, in the other headers of
// roles/ (burst_budget.hpp, best_effort_policy.hpp, work_queue.hpp,
// kernel_timer.hpp, gate_lane.hpp, topup.hpp), so that it can be tested
// against recorded traces without a clock.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "nvtaskset/burst_budget.hpp"
#include "nvtaskset/partition.hpp"
#include "nvtaskset/task_role.hpp"

namespace nvtaskset::roles {

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

// What a burst is, in the controller's words (its budget's state, lc_state()).
enum class LcState : std::uint32_t { kIdle = 0, kBursting = 1, kSaturated = 2 };
// The beacon's state of a controller whose budget is in `s`: resting
// (idle, may not burst yet) is idle to the other tasks.
constexpr LcState lc_state(BurstState s) noexcept {
  return s == BurstState::kBursting    ? LcState::kBursting
         : s == BurstState::kSaturated ? LcState::kSaturated
                                       : LcState::kIdle;
}

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
  // polling every 20 us (measured: docs/design.md, "Roles", "The numbers, measured").
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

}  // namespace nvtaskset::roles
