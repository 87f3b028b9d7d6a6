// SPDX-License-Identifier: Apache-2.0
// The best-effort task's part of the shim before and after a launch: the
// hold (it waits while a latency-critical task bursts), the floor (its
// launches keep off the reservations while one is busy but saturated) and
// the queue bound (at most NVTASKSET_BE_DEPTH launches, or a bound in time
// or learned work, queued while a latency-critical task exists), from the
// beacons it refreshes (roles::be_action).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "nvtaskset/beacon.hpp"
#include "nvtaskset/best_effort_policy.hpp"
#include "nvtaskset/burst_budget.hpp"
#include "nvtaskset/options.hpp"
#include "nvtaskset/partition.hpp"
#include "nvtaskset/work_queue.hpp"
#include "nvtaskset/role_options.hpp"
#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

constexpr unsigned kMaxPeers = 16;
// A best-effort task's queue under the hold, in launches: what an LC request
// waits behind is what the BE task has queued.
using roles::kDefaultBeDepth;  // 4 (role_options.hpp)
// Its queue while on the floor (every busy LC task saturated), in launches:
// nothing waits behind them for TPCs, so it is deeper.
using roles::kDefaultBeFloorDepth;  // 16 (role_options.hpp)

struct BeState {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  // peers, floors, budget
  std::vector<roles::Peer>* peers = nullptr;
  // Which TPCs of each GPU host clusters together (NVTASKSET_CLUSTER_MAP).
  std::vector<ClusterMap>* maps = nullptr;
  // Whether any LC task was seen at the last refresh: with none, the queue is
  // not bounded (nothing would wait behind it), and the task gets everything.
  std::atomic<bool> any_lc{false};
  // Whether be_refresh ran once: before, any_lc says nothing.
  std::atomic<bool> looked{false};
  // Launches held on the CPU now (a graph's under the gate): "holding" is
  // theirs, and the gatekeeper leaves it.
  std::atomic<unsigned> cpu_holds{0};
  std::uint64_t next_check = 0, next_scan = 0, next_alive = 0;
  std::int64_t stamp = -1;
  std::uint64_t epoch = ~0ull;
  std::uint64_t topup_gens = 0;  // of the peers, when the floors were last worked out
  roles::BurstBudget* hold_budget = nullptr;
  roles::BurstBudget* probe_budget = nullptr;  // holds for reference probes (kProbeHoldBudget)
  // The queue (NVTASKSET_BE_DEPTH): one event per `stride` launches, in a
  // ring of `ring` slots.
  pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
  unsigned depth = 4, stride = 1, ring = 4;  // configure() sets them
  // How many events back a launch waits for: `back` (the depth in
  // strides), or `floor_back` for a launch on the floor
  // (NVTASKSET_BE_FLOOR_DEPTH; 0: as any other).
  unsigned back = 4, floor_back = 0;
  // Whether NVTASKSET_BE_DEPTH and NVTASKSET_BE_FLOOR_DEPTH were given (a
  // gate that cannot be made falls back to the hold's defaults otherwise).
  bool depth_given = false, floor_given = false;
  unsigned floor_depth = kDefaultBeFloorDepth;
  // NVTASKSET_BE_YIELD; and whether the queue is bounded at all (gate or
  // hold, or a depth or a time bound asked for).
  BeYield yield = BeYield::kGate;
  bool bounded = true;
  CUcontext ctx = nullptr;
  bool ring_failed = false;
  CUevent events[64] = {};
  bool recorded[64] = {};
  std::uint64_t recorded_ns[64] = {};  // when each event was recorded (the time bound)
  std::uint64_t count = 0;
  // NVTASKSET_BE_QUEUE_US in ns (0: none): while the oldest launch still
  // queued was queued longer ago than this, the next launch waits for it.
  std::uint64_t queue_ns = 0;
  // NVTASKSET_BE_WORK_US (nullptr: none): the queue bounded in learned
  // kernel durations, one timed event per launch in events[].
  roles::WorkQueue* work = nullptr;
  std::atomic<bool> unchained{false};
};
extern BeState g_be;

// The queue's events for at most `depth` launches, and `floor_depth` on the
// floor (every busy LC task saturated). Set once the role is known, and again
// under g_be.qmu when the gate falls back to the hold.
void size_queue(unsigned depth, unsigned floor_depth) noexcept;
// The beacons and the floors, looked at again where due (never throws).
// Under g_be.mu.
void be_refresh(std::uint64_t now) noexcept;
// `probe`: the hold is for reference probes only (roles::hold_is_probe).
// Under g_be.mu. No allocation (a vector's first growth could throw there,
// leaving the lock held): the peers are at most kMaxPeers.
// `stale` (when given): whether any LC task's controller is stale.
roles::BeAction be_decide(std::uint64_t now, bool& probe, bool* stale = nullptr) noexcept;
// Before a best-effort launch: waits while an LC task bursts; true when the
// launch must run on the floor.
// (A launch into a capturing stream runs nothing; it may wait here all the
// same: asking every launch whether its stream captures costs a driver call,
// and best-effort launches are many and short.)
bool be_before(CUstream s, bool per_thread, bool graph);
// Before a best-effort launch, under the work bound: completed launches
// leave the queue (and teach their durations), and the task waits while
// this kernel would put more than the bound of learned work in it. Before
// the hold decision (be_before), so that a launch that waited here still
// makes way for an LC task that became busy meanwhile.
void work_wait(std::uint64_t key) noexcept;
// After a best-effort launch: at most `depth` launches queued while an LC
// task exists. With none, the queue is the program's own: a BE task with no
// LC task gets everything, its throughput included. (An LC task that then
// starts may find a deep queue once: the bound holds from the next launch.)
void be_after(CUstream s, bool per_thread, std::uint64_t key, bool floor) noexcept;

}  // namespace nvtaskset::roles_shim
