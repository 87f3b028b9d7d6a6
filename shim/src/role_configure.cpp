// SPDX-License-Identifier: Apache-2.0
// A role's options, read once at the shim's init (configure), and the
// role's state reset in a fork child (role_hooks.hpp).
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "be_borrow.hpp"
#include "be_gate.hpp"
#include "be_queue.hpp"
#include "lc_controller.hpp"
#include "nvtaskset/options.hpp"
#include "nvtaskset/partition.hpp"
#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

std::atomic<std::uint32_t> g_role{0};
std::atomic<std::atomic<ctl::Header*>*> g_header_src{nullptr};
std::atomic<WarnFn> g_warn{nullptr};

void warn(const char* msg) noexcept {
  if (const WarnFn w = g_warn.load(std::memory_order_acquire)) w(msg);
}

void configure(Role r, std::atomic<ctl::Header*>* hdr, void* driver, WarnFn w) noexcept {
  g_header_src.store(hdr, std::memory_order_release);
  g_warn.store(w, std::memory_order_release);
  if (r == Role::kNone || driver == nullptr) return;
  load(g_drv.event_create, driver, "cuEventCreate");
  load(g_drv.event_record, driver, "cuEventRecord");
  load(g_drv.event_record_ptsz, driver, "cuEventRecord_ptsz");
  load(g_drv.event_query, driver, "cuEventQuery");
  load(g_drv.event_sync, driver, "cuEventSynchronize");
  load(g_drv.event_elapsed, driver, "cuEventElapsedTime");
  load(g_drv.is_capturing, driver, "cuStreamIsCapturing");
  load(g_drv.is_capturing_ptsz, driver, "cuStreamIsCapturing_ptsz");
  load(g_drv.ctx_get, driver, "cuCtxGetCurrent");
  load(g_drv.ctx_set, driver, "cuCtxSetCurrent");
  load(g_drv.host_alloc, driver, "cuMemHostAlloc");
  load(g_drv.host_device_ptr, driver, "cuMemHostGetDevicePointer_v2");
  load(g_drv.wait_value, driver, "cuStreamWaitValue32_v2");
  load(g_drv.wait_value_ptsz, driver, "cuStreamWaitValue32_v2_ptsz");
  try {
    if (r == Role::kLatencyCritical) {
      g_lc.pool = new std::vector<DevicePartition>();
      if (const char* v = option_value(Option::kBurstPool)) *g_lc.pool = decode_partitions(v);
      g_lc.maps = new std::vector<ClusterMap>();
      if (const char* v = option_value(Option::kClusterMap)) {
        try {
          *g_lc.maps = decode_cluster_maps(v);
        } catch (const std::invalid_argument& e) {
          warn((std::string("NVTASKSET_CLUSTER_MAP: ") + e.what() +
                "; the top-up takes TPCs in mask bit order, not keeping GPCs whole")
                   .c_str());
        }
      }
      const Choice<LcTopup> t = choice_of<Option::kLcTopup>();
      if (t.unknown) warn("NVTASKSET_LC_TOPUP: not on or off; using on");
      const NumberValue tt = number(Option::kTestTopup, 1, 128, 0);
      g_lc.test_topup = static_cast<std::uint32_t>(tt.value);
      if (t.value == LcTopup::kOn && g_lc.test_topup == 0) {
        if (g_drv.event_elapsed.load(std::memory_order_acquire) == nullptr)
          warn("NVTASKSET_LC_TOPUP: the driver has no cuEventElapsedTime; no top-up");
        else
          g_lc.topup = new roles::TopUp();
      }
    } else {
      g_be.peers = new std::vector<roles::Peer>();
      g_be.maps = new std::vector<ClusterMap>();
      if (const char* v = option_value(Option::kClusterMap)) {
        try {
          *g_be.maps = decode_cluster_maps(v);
        } catch (const std::invalid_argument& e) {
          warn((std::string("NVTASKSET_CLUSTER_MAP: ") + e.what() +
                "; kernels with thread-block clusters run on the whole partition while a latency-critical task is "
                "busy")
                   .c_str());
        }
      }
      g_be.hold_budget = new roles::BurstBudget(budget_params(roles::kHoldBudget));
      g_be.probe_budget = new roles::BurstBudget(budget_params(roles::kProbeHoldBudget));
      const Choice<BeYield> y = choice_of<Option::kBeYield>();
      if (y.unknown) warn("NVTASKSET_BE_YIELD: not gate, hold, floor or run; using gate");
      g_be.yield = y.value;
      // A gate every NVTASKSET_BE_GATE_EVERY launches where that is set,
      // and where the kernels cannot be timed; else by NVTASKSET_BE_GATE_US
      // of learned work (0: every 2 launches).
      const NumberValue ge = number(Option::kBeGateEvery, 1, 64, kDefaultGateEvery);
      if (ge.bad) warn("NVTASKSET_BE_GATE_EVERY: not a number from 1 to 64; using 2");
      const NumberValue gu = number(Option::kBeGateUs, 0, 100'000, kDefaultGateUs);
      if (gu.bad)
        warn(("NVTASKSET_BE_GATE_US: not a number from 0 to 100000; using " + std::to_string(kDefaultGateUs)).c_str());
      const bool by_work = option_value(Option::kBeGateEvery) == nullptr && gu.value != 0 &&
                           g_drv.event_elapsed.load(std::memory_order_acquire) != nullptr;
      g_gate.spacing = by_work ? roles::GateSpacing{0, gu.value * 1000} : roles::GateSpacing{static_cast<unsigned>(ge.value), 0};
      if (g_be.yield == BeYield::kGate) {
        if (g_drv.host_alloc.load(std::memory_order_acquire) == nullptr ||
            g_drv.host_device_ptr.load(std::memory_order_acquire) == nullptr ||
            g_drv.wait_value.load(std::memory_order_acquire) == nullptr)
          warn("--best-effort: the driver has no cuStreamWaitValue32_v2 or mapped host memory; its launches wait on "
               "the CPU instead of behind a gate (NVTASKSET_BE_YIELD=hold)");
        else
          g_gate.on = true;
      }
      const unsigned depth_default = g_gate.on ? kDefaultGateDepth : kDefaultBeDepth;
      const NumberValue d = number(Option::kBeDepth, 1, 1024, depth_default);
      if (d.bad)
        warn(("NVTASKSET_BE_DEPTH: not a number from 1 to 1024; using " + std::to_string(depth_default)).c_str());
      g_be.depth = static_cast<unsigned>(d.value);
      const NumberValue q = number(Option::kBeQueueUs, 0, 1'000'000, 0);
      if (q.bad) warn("NVTASKSET_BE_QUEUE_US: not a number from 0 to 1000000; no time bound");
      g_be.queue_ns = q.value * 1000;
      const NumberValue w = number(Option::kBeWorkUs, 0, 1'000'000, 0);
      if (w.bad) warn("NVTASKSET_BE_WORK_US: not a number from 0 to 1000000; no work bound");
      if (w.value != 0 && g_drv.event_elapsed.load(std::memory_order_acquire) == nullptr)
        warn("NVTASKSET_BE_WORK_US: the driver has no cuEventElapsedTime; no work bound");
      else if (w.value != 0)
        // At most NVTASKSET_BE_DEPTH launches too (a ring of 64 events, so 63 by default).
        g_be.work = new roles::WorkQueue(w.value * 1000, option_value(Option::kBeDepth) != nullptr
                                                            ? g_be.depth
                                                            : roles::WorkQueue::kRing - 1);
      // Bounded under gate or hold, or when a bound was asked for.
      g_be.bounded = g_be.yield == BeYield::kHold || g_be.yield == BeYield::kGate ||
                     option_value(Option::kBeDepth) != nullptr || g_be.queue_ns != 0 || g_be.work != nullptr;
      const unsigned floor_default = g_gate.on ? kDefaultGateDepth : kDefaultBeFloorDepth;
      const NumberValue fd = number(Option::kBeFloorDepth, 1, 1024, floor_default);
      if (fd.bad)
        warn(("NVTASKSET_BE_FLOOR_DEPTH: not a number from 1 to 1024; using " + std::to_string(floor_default)).c_str());
      g_be.depth_given = option_value(Option::kBeDepth) != nullptr && !d.bad;
      g_be.floor_given = option_value(Option::kBeFloorDepth) != nullptr && !fd.bad;
      size_queue(g_be.depth, static_cast<unsigned>(fd.value));
      const NumberValue bu = number(Option::kBeBorrowUs, 0, 1'000'000, kDefaultBorrowUs);
      if (bu.bad)
        warn(("NVTASKSET_BE_BORROW_US: not a number from 0 to 1000000; using " + std::to_string(kDefaultBorrowUs))
                 .c_str());
      if (bu.value != 0 && g_drv.event_elapsed.load(std::memory_order_acquire) == nullptr)
        warn("NVTASKSET_BE_BORROW_US: the driver has no cuEventElapsedTime; every kernel borrows the reservations");
      else if (bu.value != 0 || (g_gate.on && g_gate.spacing.every == 0))
        g_timing.timer = new roles::KernelTimer(bu.value * 1000);
    }
  } catch (const std::exception& e) {
    warn((std::string(roles::role_name(r)) + ": " + e.what() + "; the task runs without its role").c_str());
    return;
  }
  if (ctl::Header* h = header()) h->role.store(static_cast<std::uint32_t>(r), std::memory_order_relaxed);
  g_role.store(static_cast<std::uint32_t>(r), std::memory_order_release);
}

Role role() noexcept { return static_cast<Role>(g_role.load(std::memory_order_acquire)); }

void atfork_child() noexcept {
  g_lc.mu = PTHREAD_MUTEX_INITIALIZER;
  g_lc.file = nullptr;  // the parent's (its path stays the parent's to remove)
  g_lc.beacon.store(nullptr, std::memory_order_relaxed);
  g_lc.launches.store(0, std::memory_order_relaxed);
  g_lc.started.store(false, std::memory_order_relaxed);
  g_lc.failed.store(false, std::memory_order_relaxed);
  g_lc.stop.store(false, std::memory_order_relaxed);
  g_lc.ctx = nullptr;
  for (auto& s : g_lc.slot_seq) s.store(0, std::memory_order_relaxed);
  for (auto& s : g_lc.start_seq) s.store(0, std::memory_order_relaxed);
  g_lc.timing.store(0, std::memory_order_relaxed);
  if (g_lc.topup != nullptr) *g_lc.topup = roles::TopUp();  // the parent's durations and probes
  g_be.mu = PTHREAD_MUTEX_INITIALIZER;
  g_be.qmu = PTHREAD_MUTEX_INITIALIZER;
  g_be.ctx = nullptr;
  g_be.ring_failed = false;
  for (bool& r : g_be.recorded) r = false;
  g_be.count = 0;
  if (g_be.work != nullptr) g_be.work->clear();  // the parent's launches and events
  g_timing.ctx = nullptr;
  g_timing.failed = false;
  if (g_timing.timer != nullptr) g_timing.timer->drop_pairs();
  g_floor_users.store(0, std::memory_order_relaxed);
  // The parent's gatekeeper is not in the child: no gate there.
  g_gate.word = nullptr;
  g_gate.failed = true;
  g_captures.store(0, std::memory_order_relaxed);
  g_ctl_calls.store(0, std::memory_order_relaxed);
}

}  // namespace nvtaskset::roles_shim
