// SPDX-License-Identifier: Apache-2.0
// The latency-critical controller (lc_controller.hpp).
#include "lc_controller.hpp"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>

#include "nvtaskset/options.hpp"
#include "nvtaskset/status.hpp"

namespace nvtaskset::roles_shim {

constinit LcController g_lc{};

namespace {

void futex_wake(std::atomic<std::uint32_t>& w) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}
void futex_wait(std::atomic<std::uint32_t>& w, std::uint32_t seen, long ns) noexcept {
  timespec ts{0, ns};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
}

// The map of the GPU in slot `sp` (nullptr: none).
const ClusterMap* map_of(const SlotPartition& sp) noexcept {
  if (g_lc.maps == nullptr) return nullptr;
  for (const ClusterMap& m : *g_lc.maps)
    if (m.device == sp.uuid || m.device == kAnyDevice) return &m;
  return nullptr;
}

// The burst set of each slot: the base minus every TPC another task's
// partition holds, unless that task is best-effort; and the top-up, `topup`
// TPCs of that set beyond the reservation (roles::choose_topup). Written to
// the callback's masks and the beacon; a change makes CUDA graphs
// re-encode, and BE tasks work out their floors again. Returns the
// reservation's size and the most TPCs a top-up may take: the reservation's
// size, and half of what the burst set has beyond it (the BE tasks keep the
// rest), the least over the task's GPUs; and the reservation's identity (a
// hash of every slot's TPCs), which a `-p` changes.
struct TopupLimits {
  unsigned most = 0, reserved = 0;
  std::uint64_t reservation = 0;
};
TopupLimits refresh_burst(roles::Beacon& b, unsigned topup) {
  std::vector<ctl::StatusEntry> status;
  try {
    status = ctl::read_status();
  } catch (const std::exception&) {
    return {};
  }
  const pid_t self = ::getpid();
  bool changed = false, topup_changed = false;
  unsigned used = 0, most = ~0u, reserved = ~0u;
  std::uint64_t identity = 0xcbf29ce484222325ull;  // FNV-1a over each slot's reservation
  const auto mix = [&identity](std::uint64_t w) {
    for (unsigned i = 0; i < 8; ++i) identity = (identity ^ ((w >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  };
  for (const SlotPartition& sp : region_slots()) {
    mix(sp.slot);
    mix(sp.enabled.lo);
    mix(sp.enabled.hi);
    Bits128 base;
    if (g_lc.pool != nullptr)
      for (const DevicePartition& dp : *g_lc.pool)
        if (dp.device == sp.uuid || dp.device == kAnyDevice) base = base | dp.partition.enabled.bits;
    Bits128 taken;
    for (const ctl::StatusEntry& e : status) {
      if (e.pid == self || e.role == Role::kBestEffort) continue;
      for (const DevicePartition& dp : e.partitions)
        if (dp.partition.active() && (dp.device == sp.uuid || dp.device == kAnyDevice || sp.uuid == kAnyDevice))
          taken = taken | dp.partition.enabled.bits;
    }
    const Bits128 burst = base & ~taken;
    const Bits128 free = burst & ~sp.enabled;
    reserved = std::min(reserved, sp.enabled.count());
    most = std::min({most, sp.enabled.count(), free.count() / 2});
    const Bits128 x = roles::choose_topup(free, sp.enabled, map_of(sp), std::min(topup, free.count() / 2));
    SlotView old;
    const bool had = load_mask(sp.slot, old);
    if (!had || !(old.m == burst)) changed = true;
    if (!had || !(old.x == x)) topup_changed = true;
    store_mask(sp.slot, {burst, x, {}, 0, 0}, true);
    roles::set_device(b, used++, sp.uuid, sp.enabled, sp.enabled | burst, x);
  }
  for (unsigned i = used; i < roles::kBeaconDevices; ++i) b.devices[i].in_use.store(0, std::memory_order_release);
  if (topup_changed) b.topup_gen.fetch_add(1, std::memory_order_acq_rel);
  if (changed || topup_changed)
    if (ctl::Header* h = header()) h->epoch.fetch_add(1, std::memory_order_acq_rel);
  if (used == 0) return {};
  return {most, reserved, identity | 1};
}

}  // namespace

// The budgets, unless a test stretches them (NVTASKSET_TEST_BURST_MS).
roles::BudgetParams budget_params(roles::BudgetParams p) noexcept {
  const NumberValue t = number(Option::kTestBurstMs, 1, 3'600'000, 0);
  if (t.value == 0) return p;
  p.max_burst_ns = t.value * 1'000'000ull;
  p.stop_share = 2.0;  // never by share
  p.fast_tau_ns = 0;
  return p;
}

namespace {

// A saturated task's launch completed (`slot`, its end event done): time it
// from the event recorded before it, for the top-up.
void time_launch(unsigned slot, std::uint64_t seq) noexcept {
  if (g_lc.topup == nullptr || g_lc.start_seq[slot].load(std::memory_order_acquire) != seq) return;
  const ElapsedFn elapsed = g_drv.event_elapsed.load(std::memory_order_acquire);
  float ms = 0;
  if (elapsed == nullptr || elapsed(&ms, g_lc.starts[slot], g_lc.events[slot]) != CUDA_SUCCESS || !(ms > 0)) return;
  g_lc.topup->sample(g_lc.start_key[slot].load(std::memory_order_relaxed),
                     static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6),
                     g_lc.start_gen[slot].load(std::memory_order_relaxed),
                     g_lc.start_ns[slot].load(std::memory_order_relaxed));
}

void* controller(void*) {
  ::prctl(PR_SET_NAME, "nvt-controller");  // as top -H and /proc show it
  roles::Beacon& b = *g_lc.beacon.load(std::memory_order_acquire);
  roles::BurstBudget budget(budget_params({}));
  std::uint64_t completed = 0, busy_since = 0;
  bool ctx_set = false;
  std::int64_t stamp = -1;
  std::uint64_t next_refresh = 0, next_check = 0;
  unsigned applied = 0;  // the top-up in the masks, in TPCs
  while (!g_lc.stop.load(std::memory_order_acquire)) {
    const std::uint64_t now = roles::monotonic_ns();
    const std::uint64_t launches = g_lc.launches.load(std::memory_order_acquire);
    const bool busy = launches != completed;
    budget.advance(now, busy);
    b.heartbeat_ns.store(now, std::memory_order_relaxed);
    // Saturated: its burst stopped, busy or between two launches (a closed
    // loop is idle for microseconds between its requests; the top-up must
    // not come and go with them).
    const bool saturated = !budget.may_burst();
    unsigned want = 0;
    bool probing = false;
    if (g_lc.test_topup != 0) {
      want = saturated ? g_lc.test_topup : 0;
    } else if (g_lc.topup != nullptr) {
      g_lc.topup->advance(now, saturated);
      probing = g_lc.topup->probing();
      want = g_lc.topup->tpcs();
      g_lc.timing.store(saturated ? g_lc.topup->generation() : 0, std::memory_order_release);
      b.topup_ratio_milli.store(static_cast<std::uint32_t>(g_lc.topup->last_ratio() * 1000), std::memory_order_relaxed);
      b.topup_probes.store(static_cast<std::uint32_t>(g_lc.topup->probes()), std::memory_order_relaxed);
    }
    // A reference probe: best-effort tasks hold as for a burst; the task's
    // own kernels stay on its reservation (adjust reads `probing`).
    const std::uint32_t probe = probing ? 1 : 0;
    const bool probe_changed = b.probing.exchange(probe, std::memory_order_seq_cst) != probe;
    const std::uint32_t may = budget.may_burst() || probing ? 1 : 0;
    const bool may_changed = b.may_burst.exchange(may, std::memory_order_seq_cst) != may;
    // BE tasks may have to hold again (a busy task may burst, or a probe
    // begins): gatekeepers asleep on the beacon look now.
    if ((may_changed && may == 1) || (probe_changed && probe == 1)) {
      b.wake.fetch_add(1, std::memory_order_seq_cst);
      roles::wake_best_effort(b);
    }
    if (may_changed || probe_changed) {
      // A CUDA graph's kernels keep the mask they were encoded with: a new
      // epoch makes the task's graphs encode again at their next launch
      // (graphs.cpp), with the burst set or without it (a probe that
      // follows a burst keeps may_burst at 1 but ends it). Once per stop or
      // resume, a few microseconds a kernel node (docs/design.md).
      if (ctl::Header* h = header()) h->epoch.fetch_add(1, std::memory_order_acq_rel);
    }
    b.state.store(static_cast<std::uint32_t>(roles::lc_state(budget.state())), std::memory_order_relaxed);
    b.saturations.store(budget.saturations(), std::memory_order_relaxed);
    // The burst set and the top-up: when the top-up changes, when the
    // status directory changed (entries come and go by rename and unlink),
    // and every 200 ms (an entry whose task was killed stays until a
    // reader removes it, without touching the directory before).
    if (now >= next_check || want != applied) {
      next_check = now + 5'000'000;
      const std::int64_t s = dir_stamp();
      if (s != stamp || now >= next_refresh || want != applied) {
        stamp = s;
        next_refresh = now + 200'000'000;
        const TopupLimits lim = refresh_burst(b, want);
        applied = want;
        if (g_lc.topup != nullptr) g_lc.topup->set_max(lim.most, lim.reserved, lim.reservation);
        b.topup_tpcs.store(std::min(want, lim.most), std::memory_order_relaxed);
      }
    }
    if (!busy) {
      const std::uint32_t seen = g_lc.wake.load(std::memory_order_acquire);
      g_lc.sleeping.store(1, std::memory_order_seq_cst);
      if (g_lc.launches.load(std::memory_order_seq_cst) == completed) futex_wait(g_lc.wake, seen, 5'000'000);
      g_lc.sleeping.store(0, std::memory_order_relaxed);
      continue;
    }
    if (busy_since == 0) {
      busy_since = now;
      bump(b.busy_periods);
    }
    const unsigned slot = static_cast<unsigned>(launches % kRing);
    const std::uint64_t recorded = g_lc.slot_seq[slot].load(std::memory_order_acquire);
    bool done = false;
    if ((recorded & ~kNoEvent) != launches) {
      sleep_ns(5'000);  // launched, its event not recorded yet
      continue;
    }
    if (recorded & kNoEvent) {
      done = true;
    } else {
      // No driver call while a capture is under way or beginning (begin_capture).
      bool capture = false;
      {
        const OwnCalls calls;
        capture = !calls.ok();
        if (!capture) {
          if (!ctx_set) {
            const CtxSetFn set = g_drv.ctx_set.load(std::memory_order_acquire);
            ctx_set = set != nullptr && set(g_lc.ctx) == CUDA_SUCCESS;
          }
          const CUresult r = g_drv.event_query.load(std::memory_order_acquire)(g_lc.events[slot]);
          // Any answer but "not ready" ends the wait: an error must not keep
          // best-effort tasks waiting.
          done = r != CUDA_ERROR_NOT_READY;
          if (r == CUDA_SUCCESS) time_launch(slot, launches);
        }
      }
      if (capture) {
        sleep_ns(50'000);  // (not counted: the capture need not wait for it)
        continue;
      }
    }
    if (!done) {
      sleep_ns(10'000);
      continue;
    }
    completed = launches;
    b.completed.store(completed, std::memory_order_release);
    if (g_lc.launches.load(std::memory_order_acquire) == completed) {
      bump(b.busy_ns, roles::monotonic_ns() - busy_since);
      busy_since = 0;
    }
  }
  return nullptr;
}

// Stops the controller before the driver's own exit handlers run (this one
// is registered after cuInit, so it runs before them): its thread must not
// query events of a driver being torn down. The beacon goes with it.
void stop_controller() {
  g_lc.stop.store(true, std::memory_order_release);
  g_lc.wake.fetch_add(1, std::memory_order_acq_rel);
  futex_wake(g_lc.wake);
  if (g_lc.file != nullptr) ::unlink(g_lc.file->path().c_str());
}

// The beacon and the controller, at the task's first launch (the driver is
// initialised by then). False when they could not be made: said once; the
// task then runs on its reservation only, and best-effort tasks do not see
// it busy.
bool start_lc() noexcept {
  if (g_lc.started.load(std::memory_order_acquire)) return true;
  if (g_lc.failed.load(std::memory_order_acquire)) return false;
  pthread_mutex_lock(&g_lc.mu);
  if (!g_lc.started.load(std::memory_order_relaxed) && !g_lc.failed.load(std::memory_order_relaxed)) {
    std::string why;
    if (!have_events()) why = "the driver lacks the event functions";
    else {
      try {
        g_lc.file = roles::BeaconFile::create().release();
        g_lc.beacon.store(&g_lc.file->beacon(), std::memory_order_release);
        refresh_burst(g_lc.file->beacon(), 0);
        g_lc.file->beacon().heartbeat_ns.store(roles::monotonic_ns(), std::memory_order_relaxed);
        g_lc.file->beacon().may_burst.store(1, std::memory_order_relaxed);
        pthread_t t;
        if (::pthread_create(&t, nullptr, &controller, nullptr) != 0) why = "cannot start its controller thread";
        else {
          ::pthread_detach(t);
          std::atexit(&stop_controller);
        }
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (why.empty()) g_lc.started.store(true, std::memory_order_release);
    else {
      g_lc.failed.store(true, std::memory_order_release);
      warn(("latency-critical: " + why + "; this task runs on its reservation only, and best-effort tasks do not "
            "make way for it")
               .c_str());
    }
  }
  pthread_mutex_unlock(&g_lc.mu);
  return g_lc.started.load(std::memory_order_acquire);
}

// The ring's events, in the current context: created on first use; false
// in another context. Under g_lc.mu.
bool lc_ring_ready() noexcept {
  CUcontext ctx = nullptr;
  if (g_captures.load(std::memory_order_acquire) != 0 ||
      g_drv.ctx_get.load(std::memory_order_acquire)(&ctx) != CUDA_SUCCESS || ctx == nullptr)
    return false;
  if (g_lc.ctx == nullptr) {
    // Timed when the top-up may time launches.
    const bool timing = g_lc.topup != nullptr;
    if (create_events(g_lc.events, kRing, timing) && create_events(g_lc.starts, kRing, timing)) g_lc.ctx = ctx;
  }
  return ctx == g_lc.ctx;
}

}  // namespace

// Before a latency-critical launch: the task is busy from now on. While
// the controller saturates, an event before the launch times it.
std::uint64_t lc_before(CUstream s, bool per_thread, std::uint64_t key) noexcept {
  if (capturing(s, per_thread) || !start_lc()) return 0;
  const std::uint64_t seq = g_lc.launches.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (const std::uint64_t gen = g_lc.timing.load(std::memory_order_acquire); gen != 0) {
    const unsigned slot = static_cast<unsigned>(seq % kRing);
    pthread_mutex_lock(&g_lc.mu);
    if (lc_ring_ready() && record(g_lc.starts[slot], s, per_thread) == CUDA_SUCCESS) {
      g_lc.start_key[slot].store(key, std::memory_order_relaxed);
      g_lc.start_gen[slot].store(gen, std::memory_order_relaxed);
      g_lc.start_ns[slot].store(roles::monotonic_ns(), std::memory_order_relaxed);
      g_lc.start_seq[slot].store(seq, std::memory_order_release);
    }
    pthread_mutex_unlock(&g_lc.mu);
  }
  roles::Beacon& b = *g_lc.beacon.load(std::memory_order_acquire);
  // Busy from now on. Every earlier launch known complete: the task turns
  // busy, and BE gatekeepers asleep on its beacon are woken (one system
  // call a busy period, here in the intercepted call, never in the
  // callback). Both seq_cst: a gatekeeper reads `wake`, then `completed`,
  // then `launches`; it cannot see this task idle and miss the wake too
  // (docs/design.md, "Roles").
  b.launches.store(seq, std::memory_order_seq_cst);
  if (b.completed.load(std::memory_order_seq_cst) + 1 == seq) {
    b.wake.fetch_add(1, std::memory_order_seq_cst);
    roles::wake_best_effort(b);
  }
  return seq;
}

// After it: an event the controller waits for.
void lc_after(std::uint64_t seq, CUstream s, bool per_thread) noexcept {
  if (seq == 0) return;
  const unsigned slot = static_cast<unsigned>(seq % kRing);
  std::uint64_t mark = seq | kNoEvent;
  pthread_mutex_lock(&g_lc.mu);
  if (lc_ring_ready() && record(g_lc.events[slot], s, per_thread) == CUDA_SUCCESS) mark = seq;
  g_lc.slot_seq[slot].store(mark, std::memory_order_release);
  pthread_mutex_unlock(&g_lc.mu);
  if (g_lc.sleeping.load(std::memory_order_seq_cst) != 0) {
    g_lc.wake.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(g_lc.wake);
  }
}

}  // namespace nvtaskset::roles_shim
