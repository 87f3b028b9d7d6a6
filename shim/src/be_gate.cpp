// SPDX-License-Identifier: Apache-2.0
// The gate on the GPU and its gatekeeper thread (be_gate.hpp).
#include "be_gate.hpp"

#include <pthread.h>
#include <sys/prctl.h>

#include <new>
#include <string>

#include "be_borrow.hpp"
#include "be_queue.hpp"

namespace nvtaskset::roles_shim {

constinit Gate g_gate{};

namespace {

constexpr unsigned kWaitValueEq = 0x1;        // CU_STREAM_WAIT_VALUE_EQ
constexpr unsigned kHostAllocPortable = 0x1;  // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kHostAllocDeviceMap = 0x2; // CU_MEMHOSTALLOC_DEVICEMAP

// The gatekeeper: the hold decision of be_before, written to the gate. Its
// budgets are the hold's: closed for at most 100 ms in a row and half of its
// time (for probes, a fifth), whatever the beacons say. How often it looks:
// - while it holds, or may have to without being told (a stale LC task), or
//   where the kernel refuses the wait below, every 20 us;
// - next to LC tasks that need no hold, asleep on their beacons' `wake`
//   words (at most 2 ms; several at once by futex_waitv, Linux 5.16): a
//   task wakes it when it turns busy, may burst again or probes (polling
//   there cost a training next to an idle LC task: docs/design.md, "The
//   numbers, measured");
// - with no LC task, every 2 ms.
constexpr std::uint64_t kGatePollNs = 20'000;
constexpr std::uint64_t kGateSleepNs = roles::kDefaultGateSleepMs * 1'000'000ull;

void* gatekeeper(void*) {
  ::prctl(PR_SET_NAME, "nvt-gatekeeper");  // as top -H and /proc show it
  ::prctl(PR_SET_TIMERSLACK, 1000UL);     // this thread's sleeps are short: 1-us slack, not 50
  const NumberValue ts = number(Option::kTestGateSleepMs, 1, 3'600'000, 0);
  const std::uint64_t asleep_ns = ts.value != 0 ? ts.value * 1'000'000ull : kGateSleepNs;
  std::uint64_t closed_since = 0;
  for (;;) {
    pthread_mutex_lock(&g_be.mu);
    const std::uint64_t now = roles::monotonic_ns();
    be_refresh(now);
    // The words to sleep on, read before the decision's reads of the
    // beacons (completed, then launches): a task that turns busy after them
    // bumps its word. (Copied: the peers may change once the lock is let go;
    // their mappings stay.)
    const roles::Beacon* on[kMaxPeers];
    std::uint32_t seen[kMaxPeers];
    std::size_t n = 0;
    for (const roles::Peer& p : *g_be.peers) {
      if (n == kMaxPeers) break;
      on[n] = p.beacon;
      seen[n++] = p.beacon->wake.load(std::memory_order_seq_cst);
    }
    bool probe = false, stale = false;
    const roles::BeAction a = be_decide(now, probe, &stale);
    probe = probe && a == roles::BeAction::kHold;
    const bool close = a == roles::BeAction::kHold && (probe ? g_be.probe_budget : g_be.hold_budget)->may_burst();
    g_be.hold_budget->advance(now, close && !probe);
    g_be.probe_budget->advance(now, close && probe);
    const bool any = g_be.any_lc.load(std::memory_order_relaxed);
    // Nothing can call for a hold before a task wakes us: none is needed
    // now, and no controller is stale (one that comes back wakes nobody).
    const bool may_sleep = n != 0 && a != roles::BeAction::kHold && !stale;
    pthread_mutex_unlock(&g_be.mu);
    // The counters first: whoever sees the gate open also sees its time closed.
    if (ctl::Header* h = header()) {
      if (close && closed_since == 0) {
        closed_since = now;
        bump(h->launches_held);
        h->role_state.store(1, std::memory_order_relaxed);
      } else if (!close) {
        if (closed_since != 0) bump(h->held_ns, now - closed_since);
        closed_since = 0;
        // "holding" ends with the gate closed. Every time, not only when it
        // opens: the word is created closed (gate_ready), and a launch that
        // read it closed may store "holding" just after the gate opened.
        std::uint32_t held = 1;
        if (g_be.cpu_holds.load(std::memory_order_relaxed) == 0)
          h->role_state.compare_exchange_strong(held, a == roles::BeAction::kRun ? 0 : 2, std::memory_order_relaxed);
      }
    }
    g_gate.word->store(close ? 1 : 0, std::memory_order_release);
    // (A beacon unmapped meanwhile, or a kernel that refuses the wait: poll.)
    if (!any) sleep_ns(kGateSleepNs);
    else if (!may_sleep || roles::await_any_wake({on, n}, {seen, n}, asleep_ns) == roles::Wake::kRefused)
      sleep_ns(kGatePollNs);
  }
  return nullptr;
}

// Whether the gate can be queued now: the word exists (created here, in the
// current context, at the first call) and the gatekeeper runs. Not during a
// capture (the allocation would invalidate it). Under g_be.qmu.
bool gate_ready() noexcept {
  if (g_gate.failed) return false;
  if (g_gate.word != nullptr) return true;
  if (g_captures.load(std::memory_order_acquire) != 0) return false;
  std::string why;
  void* host = nullptr;
  CUdeviceptr d = 0;
  if (g_drv.host_alloc.load(std::memory_order_acquire)(&host, 4096, kHostAllocPortable | kHostAllocDeviceMap) !=
          CUDA_SUCCESS ||
      host == nullptr)
    why = "cannot allocate mapped host memory";
  else if (g_drv.host_device_ptr.load(std::memory_order_acquire)(&d, host, 0) != CUDA_SUCCESS || d == 0)
    why = "no device address for its mapped host memory";
  if (why.empty()) {
    // Closed until the gatekeeper's first decision, a few microseconds
    // away: a gate queued open before it would let the task's first kernel
    // run beside a bursting LC task's (a test caught it: "wait 0 0").
    g_gate.word = new (host) std::atomic<std::uint32_t>(1);
    g_gate.device_word = d;
    pthread_t t;
    if (::pthread_create(&t, nullptr, &gatekeeper, nullptr) != 0) {
      why = "cannot start its gatekeeper thread";
      g_gate.word = nullptr;  // (the page stays: a thread may have read the pointer)
    } else {
      ::pthread_detach(t);
    }
  }
  if (!why.empty()) {
    g_gate.failed = true;
    // Behind no gate the queue is what an LC request waits behind: the
    // hold's queue, unless one was asked for.
    size_queue(g_be.depth_given ? g_be.depth : kDefaultBeDepth,
               g_be.floor_given ? g_be.floor_depth : kDefaultBeFloorDepth);
    warn(("--best-effort: " + why + "; its launches wait on the CPU instead of behind a gate (NVTASKSET_BE_YIELD=hold)")
             .c_str());
    return false;
  }
  return true;
}

}  // namespace

bool gate_before(CUstream s, bool per_thread, std::uint64_t key) noexcept {
  if (!g_be.looked.load(std::memory_order_acquire)) {
    // The task's first launch: look for LC tasks now, or it would go
    // ungated beside one that bursts.
    pthread_mutex_lock(&g_be.mu);
    be_refresh(roles::monotonic_ns());
    pthread_mutex_unlock(&g_be.mu);
  }
  if (!g_be.any_lc.load(std::memory_order_acquire)) return true;  // nothing to make way for
  if (g_captures.load(std::memory_order_acquire) != 0) return false;
  pthread_mutex_lock(&g_be.qmu);
  bool ok = gate_ready();
  if (ok) {
    const std::uintptr_t k = reinterpret_cast<std::uintptr_t>(s) ^ (per_thread ? 0x9e37u : 0u);
    Gate::Lane& lane = g_gate.lanes[(k ^ (k >> 4) ^ (k >> 12)) % kGateLanes];
    if (lane.s != s || lane.per_thread != per_thread) lane = {s, per_thread, {}};
    // The kernel's learned duration, where the gates are spaced by work
    // (read under g_be.qmu, where the timer learns).
    const std::uint64_t ns = g_gate.spacing.every == 0 && g_timing.timer != nullptr
                                 ? g_timing.timer->durations().estimate(key, roles::GateSpacing::kUnknown)
                                 : roles::GateSpacing::kUnknown;
    if (lane.since.next(g_gate.spacing, ns)) {
      if (capturing(s, per_thread)) {
        ok = false;  // work captured into a graph never ran here: hold it on the CPU
      } else {
        const auto [f, st] = on_stream(g_drv.wait_value, g_drv.wait_value_ptsz, s, per_thread);
        ok = f(st, g_gate.device_word, 0, kWaitValueEq) == CUDA_SUCCESS;
        if (ok) {
          if (ctl::Header* h = header()) bump(h->gates_queued);
        } else {
          lane.since.reset();  // the next launch tries again
        }
      }
    }
  }
  pthread_mutex_unlock(&g_be.qmu);
  return ok;
}

bool be_before_gate() {
  ctl::Header* h = header();
  pthread_mutex_lock(&g_be.mu);
  const std::uint64_t now = roles::monotonic_ns();
  be_refresh(now);
  bool probe = false;
  const roles::BeAction a = be_decide(now, probe);
  pthread_mutex_unlock(&g_be.mu);
  if (h) {
    // "holding" only while the gate is closed: with the hold's budget spent
    // the gatekeeper opens it, and the launch just runs on the floor.
    const bool closed = g_gate.word != nullptr && g_gate.word->load(std::memory_order_acquire) == 1;
    h->role_state.store(a == roles::BeAction::kRun ? 0 : closed ? 1 : 2, std::memory_order_relaxed);
    if (a != roles::BeAction::kRun) bump(h->launches_on_floor);
  }
  return a != roles::BeAction::kRun;
}

}  // namespace nvtaskset::roles_shim
