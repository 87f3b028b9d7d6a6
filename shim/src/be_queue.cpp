// SPDX-License-Identifier: Apache-2.0
// The best-effort hold, floor and queue bound (be_queue.hpp).
#include "be_queue.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <span>
#include <string>

namespace nvtaskset::roles_shim {

constinit BeState g_be{};

void size_queue(unsigned depth, unsigned floor_depth) noexcept {
  g_be.depth = depth;
  g_be.floor_depth = floor_depth;
  // One event per `stride` launches (a quarter of the depth; with a time
  // bound, as many as fit in 64), at most 64 events: the queue is bounded to
  // `depth` launches, give or take one stride. Every event recorded is a
  // driver call on the launch path.
  g_be.stride = g_be.queue_ns != 0 ? (depth + 63) / 64 : std::max(depth / 4, (depth + 63) / 64);
  if (g_be.stride == 0) g_be.stride = 1;
  g_be.ring = (depth + g_be.stride - 1) / g_be.stride;
  if (g_be.ring == 0) g_be.ring = 1;
  g_be.back = g_be.ring;
  // On the floor: at most `floor_depth` launches, in the same strides, in a
  // ring that holds both (at most 64 events).
  g_be.floor_back = 0;
  if (g_be.queue_ns == 0) {
    const unsigned fb = std::min(64u, (floor_depth + g_be.stride - 1) / g_be.stride);
    g_be.floor_back = std::max(fb, 1u);
    g_be.ring = std::max(g_be.ring, g_be.floor_back);
  }
}

namespace {

// The largest cluster a floor of slot `sp` hosts (0: not known): by the
// map of its GPU; on a slot for any GPU, the least any map allows.
std::uint32_t floor_cluster(const SlotPartition& sp, const Bits128& floor) noexcept {
  std::uint32_t best = 0;
  bool first = true;
  for (const ClusterMap& m : *g_be.maps) {
    if (sp.uuid == kAnyDevice) {
      const std::uint32_t h = hostable_cluster(m, floor);
      best = first ? h : std::min(best, h);
      first = false;
    } else if (m.device == sp.uuid || m.device == kAnyDevice) {
      return hostable_cluster(m, floor);
    }
  }
  return best;
}

// The sum of the known LC tasks' top-up generations: it changes whenever
// one of their top-ups does. Under g_be.mu.
std::uint64_t topup_gens() noexcept {
  std::uint64_t g = 0;
  for (const roles::Peer& p : *g_be.peers) g += p.beacon->topup_gen.load(std::memory_order_acquire);
  return g;
}

// Beacons of new LC tasks and the liveness of known ones, at most every few
// milliseconds; the floor of each slot when either, a top-up (at once) or
// the partition changed. Under g_be.mu. Throws only std::bad_alloc and the
// like, before anything is published (be_refresh).
void refresh_or_throw(std::uint64_t now) {
  const std::uint64_t gens = topup_gens();
  if (now < g_be.next_check && gens == g_be.topup_gens) return;
  bool changed = gens != g_be.topup_gens;
  if (now >= g_be.next_check) {
    g_be.next_check = now + 5'000'000;
    const std::int64_t s = dir_stamp();
    if (s != g_be.stamp || now >= g_be.next_scan) {
      g_be.stamp = s;
      g_be.next_scan = now + 500'000'000;
      std::vector<roles::OtherBuild> other;
      std::vector<roles::Peer> found = roles::scan_beacons(::getpid(), *g_be.peers, &other);
      // An LC task of another build: its beacon cannot be read, so this task
      // neither makes way for it nor keeps off its reservation. Said once.
      static bool said_other = false;
      if (!other.empty() && !said_other) {
        said_other = true;
        warn(("best-effort: latency-critical task " + std::to_string(other[0].pid) +
              " runs another nvtaskset build (beacon version " + std::to_string(other[0].version) + ", this one reads " +
              std::to_string(roles::kBeaconVersion) +
              "): this task cannot make way for it or keep off its reservation; run one build per machine")
                 .c_str());
      }
      if (found.size() > kMaxPeers) found.resize(kMaxPeers);
      bool differ = found.size() != g_be.peers->size();
      for (std::size_t i = 0; !differ && i < found.size(); ++i) differ = found[i].beacon != (*g_be.peers)[i].beacon;
      changed = changed || differ;
      // The gatekeeper may sleep on the LC tasks it knew (on the first's
      // word among them): a new one (or one gone) is news it must look at
      // now, not at the end of its sleep.
      if (differ && !g_be.peers->empty()) roles::wake_best_effort(*(*g_be.peers)[0].beacon);
      *g_be.peers = std::move(found);
    } else if (now >= g_be.next_alive) {
      g_be.next_alive = now + 50'000'000;
      std::vector<roles::Peer> alive;
      for (const roles::Peer& p : *g_be.peers)
        if (roles::peer_alive(p)) alive.push_back(p);
      changed = changed || alive.size() != g_be.peers->size();
      *g_be.peers = std::move(alive);
    }
  }
  g_be.any_lc.store(!g_be.peers->empty(), std::memory_order_release);
  g_be.looked.store(true, std::memory_order_release);
  g_be.topup_gens = topup_gens();
  const ctl::Header* h = header();
  const std::uint64_t epoch = h != nullptr ? h->epoch.load(std::memory_order_acquire) : 0;
  if (!changed && epoch == g_be.epoch) return;
  // The reservations and top-ups on each slot's GPU, for the callback's
  // floor: worked out in full before any is published, so that a throw
  // leaves the last floors in place (an unpublished slot would put the
  // task's kernels on its whole partition).
  SlotView views[ctl::kMaxDevices] = {};
  bool valid[ctl::kMaxDevices] = {};
  for (const SlotPartition& sp : region_slots()) {
    Bits128 reserved, topups;
    std::uint8_t u[16];
    std::memcpy(u, sp.uuid.data(), 16);
    for (const roles::Peer& p : *g_be.peers) {
      if (sp.uuid == kAnyDevice) {
        std::vector<roles::DeviceView> views;
        if (!roles::read_devices(*p.beacon, views)) reserved = Bits128{~0ull, ~0ull};
        for (const roles::DeviceView& v : views) {
          reserved = reserved | v.reserved;
          topups = topups | v.topup;
        }
      } else {
        reserved = reserved | roles::reserved_on(*p.beacon, u);
        topups = topups | roles::topup_on(*p.beacon, u);
      }
    }
    const Bits128 hard = roles::floor_of(sp.enabled, reserved);
    views[sp.slot] = {reserved, topups, sp.enabled, floor_cluster(sp, roles::floor_of(hard, topups)),
                      floor_cluster(sp, hard)};
    valid[sp.slot] = true;
  }
  g_be.epoch = epoch;
  for (unsigned i = 0; i < ctl::kMaxDevices; ++i) store_mask(i, views[i], valid[i]);
}

}  // namespace

// refresh_or_throw, which never throws: an allocation that fails leaves
// what was known published, and the next call looks again. (Under g_be.mu:
// a throw would leave it locked, and in the gatekeeper end the process.)
void be_refresh(std::uint64_t now) noexcept {
  try {
    refresh_or_throw(now);
  } catch (const std::exception&) {
    g_be.next_check = 0;
    g_be.epoch = ~0ull;
  }
}

namespace {

// What NVTASKSET_BE_YIELD makes of a hold: a wait, the floor, or a launch
// as if every LC task were idle.
roles::BeAction yielded(roles::BeAction a) noexcept {
  if (a != roles::BeAction::kHold) return a;
  switch (g_be.yield) {
    case BeYield::kHold: return a;
    case BeYield::kFloor: return roles::BeAction::kFloor;
    case BeYield::kRun: return roles::BeAction::kRun;
    case BeYield::kGate: return a;  // where the gate cannot be used: a hold
  }
  return a;
}

}  // namespace

roles::BeAction be_decide(std::uint64_t now, bool& probe, bool* stale) noexcept {
  roles::LcSnapshot snaps[kMaxPeers];
  std::size_t n = 0;
  for (const roles::Peer& p : *g_be.peers) {
    if (n == kMaxPeers) break;
    snaps[n++] = roles::snapshot(*p.beacon);
  }
  const std::span<const roles::LcSnapshot> seen(snaps, n);
  const roles::BeAction a = roles::be_action(seen, now);
  probe = a == roles::BeAction::kHold && roles::hold_is_probe(seen, now);
  if (stale != nullptr)
    *stale = std::any_of(seen.begin(), seen.end(), [now](const roles::LcSnapshot& x) { return roles::is_stale(x, now); });
  return a;
}

bool be_before(CUstream, bool, bool graph) {
  ctl::Header* h = header();
  pthread_mutex_lock(&g_be.mu);
  std::uint64_t now = roles::monotonic_ns();
  be_refresh(now);
  g_be.hold_budget->advance(now, false);
  g_be.probe_budget->advance(now, false);
  bool probe = false;
  roles::BeAction a = yielded(be_decide(now, probe));
  const std::uint64_t start = now;
  bool held = false;
  while (a == roles::BeAction::kHold || (graph && a == roles::BeAction::kFloor)) {
    // A hold for probes only counts against its own bound (kProbeHoldBudget).
    probe = probe && a == roles::BeAction::kHold;
    if (!(probe ? g_be.probe_budget : g_be.hold_budget)->may_burst()) break;
    if (!held) g_be.cpu_holds.fetch_add(1, std::memory_order_relaxed);
    held = true;
    if (h) h->role_state.store(1, std::memory_order_relaxed);
    pthread_mutex_unlock(&g_be.mu);
    sleep_ns(20'000);
    pthread_mutex_lock(&g_be.mu);
    now = roles::monotonic_ns();
    g_be.hold_budget->advance(now, !probe);
    g_be.probe_budget->advance(now, probe);
    be_refresh(now);
    a = yielded(be_decide(now, probe));
  }
  pthread_mutex_unlock(&g_be.mu);
  if (held) g_be.cpu_holds.fetch_sub(1, std::memory_order_relaxed);
  if (h) {
    if (held) {
      bump(h->launches_held);
      bump(h->held_ns, now - start);
    }
    const bool floor = a != roles::BeAction::kRun && !graph;
    h->role_state.store(a == roles::BeAction::kRun ? 0 : floor ? 2 : 1, std::memory_order_relaxed);
    if (floor) bump(h->launches_on_floor);
  }
  if (graph && a != roles::BeAction::kRun) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      warn("best-effort: a CUDA graph waited as long as it may for a busy latency-critical task and runs on the "
           "TPCs it was encoded with");
  }
  return a != roles::BeAction::kRun && !graph;
}

namespace {

// Waits until the launch recorded in ring slot `o` ran: a queue wait.
// Under g_be.qmu.
void wait_slot(unsigned o) noexcept {
  if (ctl::Header* h = header()) bump(h->queue_waits);
  g_drv.event_sync.load(std::memory_order_acquire)(g_be.events[o]);
}

// The queue bounded in time: what an LC request arriving now waits behind
// is the BE work queued ahead of it, and the oldest launch still queued was
// queued about that long ago. Short kernels (GPT-2-medium's optimizer and
// element-wise kernels) then queue deep, long ones shallow. Oldest first:
// each event that completed is forgotten; the first that has not waits, if
// it was queued more than queue_ns ago. Under g_be.qmu.
void bound_in_time(unsigned newest) noexcept {
  const auto query = g_drv.event_query.load(std::memory_order_acquire);
  for (unsigned k = 1; k < g_be.ring; ++k) {
    const unsigned o = (newest + k) % g_be.ring;
    if (!g_be.recorded[o]) continue;
    if (query(g_be.events[o]) != CUDA_ERROR_NOT_READY) {
      g_be.recorded[o] = false;
      continue;
    }
    if (roles::monotonic_ns() - g_be.recorded_ns[o] <= g_be.queue_ns) return;
    wait_slot(o);
    g_be.recorded[o] = false;
  }
}

// Whether a launch on `s` may be recorded in the event ring now: `s` does
// not capture, and the current context is the one whose events the ring
// holds (`n` of them, created on first use; a task whose creation failed
// keeps no ring). Under g_be.qmu, inside OwnCalls (no capture under way in
// the task).
bool ring_ready(CUstream s, bool per_thread, unsigned n, bool timing) noexcept {
  if (g_be.ring_failed || capturing(s, per_thread)) return false;
  return events_here(g_be.ctx, g_be.ring_failed, g_be.events, n, timing);
}

// The oldest launch of the work queue completed (or is waited for first,
// `wait`): learn its duration where it can. Under g_be.qmu.
void work_pop(bool wait) noexcept {
  roles::WorkQueue& q = *g_be.work;
  const unsigned o = q.oldest();
  if (wait) wait_slot(o);
  std::int64_t ns = -1;
  if (q.wants_sample()) {
    float ms = 0;
    if (g_drv.event_elapsed.load(std::memory_order_acquire)(&ms, g_be.events[q.prev_slot()], g_be.events[o]) ==
            CUDA_SUCCESS &&
        ms >= 0)
      ns = static_cast<std::int64_t>(static_cast<double>(ms) * 1e6);
  }
  q.pop(ns);
}

}  // namespace

void work_wait(std::uint64_t key) noexcept {
  if (g_be.work == nullptr || !g_be.any_lc.load(std::memory_order_acquire)) return;
  const OwnCalls calls;  // no driver call of ours during a capture
  if (!calls.ok()) return;
  pthread_mutex_lock(&g_be.qmu);
  roles::WorkQueue& q = *g_be.work;
  const auto query = g_drv.event_query.load(std::memory_order_acquire);
  while (!q.empty() && query(g_be.events[q.oldest()]) != CUDA_ERROR_NOT_READY) work_pop(false);
  while (!q.fits(key)) work_pop(true);
  pthread_mutex_unlock(&g_be.qmu);
}

void be_after(CUstream s, bool per_thread, std::uint64_t key, bool floor) noexcept {
  if (!g_be.bounded || !g_be.any_lc.load(std::memory_order_acquire)) {
    if (g_be.work != nullptr) g_be.unchained.store(true, std::memory_order_relaxed);
    return;
  }
  pthread_mutex_lock(&g_be.qmu);
  if (g_be.work != nullptr) {
    // Launches that went unrecorded (no LC task then, a capture, another
    // context) break the chain of durations.
    roles::WorkQueue& q = *g_be.work;
    if (g_be.unchained.exchange(false, std::memory_order_relaxed)) q.gap();
    // (Full: another thread's launches filled it since work_wait.)
    const OwnCalls calls;
    if (calls.ok() && ring_ready(s, per_thread, roles::WorkQueue::kRing, true) && !q.full() &&
        record(g_be.events[q.next_slot()], s, per_thread) == CUDA_SUCCESS)
      q.push(key);
    else
      q.gap();
    pthread_mutex_unlock(&g_be.qmu);
    return;
  }
  ++g_be.count;
  if (g_be.count % g_be.stride == 0) {
    const unsigned slot = static_cast<unsigned>((g_be.count / g_be.stride) % g_be.ring);
    // The launch `back` events ago: wait until it ran. On the floor (every
    // busy LC task saturated) the queue may be deeper: its kernels keep off
    // the reservations, so an LC request does not wait behind them for
    // TPCs, and a queue of 4 launches cost GPT-2-medium training 22%
    // (docs/runs.md, "What the best-effort queue costs by itself").
    const unsigned back = floor && g_be.floor_back != 0 ? g_be.floor_back : g_be.back;
    const unsigned w = (slot + g_be.ring - back % g_be.ring) % g_be.ring;
    // The wait and the record each counted against captures on their own
    // (OwnCalls): a capture that begins during a long wait (it waits 20 ms
    // at most) must not see the record after it.
    bool ready = false;
    {
      const OwnCalls calls;
      ready = calls.ok() && ring_ready(s, per_thread, g_be.ring, false);
      if (ready && g_be.recorded[w] &&
          g_drv.event_query.load(std::memory_order_acquire)(g_be.events[w]) == CUDA_ERROR_NOT_READY)
        wait_slot(w);
    }
    if (ready) {
      const OwnCalls calls;
      g_be.recorded[slot] = calls.ok() && record(g_be.events[slot], s, per_thread) == CUDA_SUCCESS;
      if (g_be.queue_ns != 0 && calls.ok()) {
        g_be.recorded_ns[slot] = roles::monotonic_ns();
        bound_in_time(slot);
      }
    }
  }
  pthread_mutex_unlock(&g_be.qmu);
}

}  // namespace nvtaskset::roles_shim
