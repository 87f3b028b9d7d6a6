// SPDX-License-Identifier: Apache-2.0
// The roles in a task's shim: see roles.hpp here, and the roles library (roles/).
#include "roles.hpp"

#include <dlfcn.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nvtaskset/options.hpp"
#include "nvtaskset/partition.hpp"
#include "nvtaskset/seqlock.hpp"
#include "nvtaskset/status.hpp"

namespace nvtaskset::roles_shim {
namespace {

using roles::Role;

std::atomic<std::uint32_t> g_role{0};
std::atomic<std::atomic<ctl::Header*>*> g_header_src{nullptr};
std::atomic<WarnFn> g_warn{nullptr};

ctl::Header* header() noexcept {
  auto* src = g_header_src.load(std::memory_order_acquire);
  return src != nullptr ? src->load(std::memory_order_acquire) : nullptr;
}

void warn(const char* msg) noexcept {
  if (const WarnFn w = g_warn.load(std::memory_order_acquire)) w(msg);
}

void bump(std::atomic<std::uint64_t>& c, std::uint64_t by = 1) noexcept {
  c.fetch_add(by, std::memory_order_relaxed);
}

void sleep_ns(long ns) noexcept {
  timespec ts{0, ns};
  ::nanosleep(&ts, nullptr);
}

// ---- the driver functions the roles use --------------------------------------------

using EventCreateFn = CUresult (*)(CUevent*, unsigned);
using EventRecordFn = CUresult (*)(CUevent, CUstream);
using EventFn = CUresult (*)(CUevent);
using ElapsedFn = CUresult (*)(float*, CUevent, CUevent);
using IsCapturingFn = CUresult (*)(CUstream, CUstreamCaptureStatus*);
using CtxGetFn = CUresult (*)(CUcontext*);
using CtxSetFn = CUresult (*)(CUcontext);
// The gate's (NVTASKSET_BE_YIELD=gate), as the driver exports them (cuda.h:
// cuMemHostAlloc, cuMemHostGetDevicePointer_v2, cuStreamWaitValue32_v2).
using HostAllocFn = CUresult (*)(void**, size_t, unsigned);
using HostDevicePtrFn = CUresult (*)(CUdeviceptr*, void*, unsigned);
using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, std::uint32_t, unsigned);

struct Driver {
  std::atomic<EventCreateFn> event_create{nullptr};
  std::atomic<EventRecordFn> event_record{nullptr};
  std::atomic<EventRecordFn> event_record_ptsz{nullptr};
  std::atomic<EventFn> event_query{nullptr};
  std::atomic<EventFn> event_sync{nullptr};
  std::atomic<ElapsedFn> event_elapsed{nullptr};
  std::atomic<IsCapturingFn> is_capturing{nullptr};
  std::atomic<IsCapturingFn> is_capturing_ptsz{nullptr};
  std::atomic<CtxGetFn> ctx_get{nullptr};
  std::atomic<CtxSetFn> ctx_set{nullptr};
  std::atomic<HostAllocFn> host_alloc{nullptr};
  std::atomic<HostDevicePtrFn> host_device_ptr{nullptr};
  std::atomic<WaitValueFn> wait_value{nullptr};
  std::atomic<WaitValueFn> wait_value_ptsz{nullptr};
};
constinit Driver g_drv{};

template <class F>
void load(std::atomic<F>& slot, void* driver, const char* name) noexcept {
  slot.store(reinterpret_cast<F>(::dlsym(driver, name)), std::memory_order_release);
}

bool have_events() noexcept {
  return g_drv.event_create.load(std::memory_order_acquire) && g_drv.event_record.load(std::memory_order_acquire) &&
         g_drv.event_query.load(std::memory_order_acquire) && g_drv.event_sync.load(std::memory_order_acquire) &&
         g_drv.ctx_get.load(std::memory_order_acquire);
}

// Work launched into a capturing stream does not run: it neither makes the
// task busy nor waits.
bool capturing(CUstream s, bool per_thread) noexcept {
  const IsCapturingFn f = (per_thread ? g_drv.is_capturing_ptsz : g_drv.is_capturing).load(std::memory_order_acquire);
  if (f == nullptr) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return f(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

// `n` events in the current context, for a ring the shim waits on (timing
// off: only completion is asked). Not CU_EVENT_BLOCKING_SYNC: the waits are
// short, and a blocked thread's wake-up left the GPU idle between short
// best-effort kernels.
// The work bound (NVTASKSET_BE_WORK_US) times its events: `timing`.
bool create_events(CUevent* events, unsigned n, bool timing = false) noexcept {
  const EventCreateFn create = g_drv.event_create.load(std::memory_order_acquire);
  for (unsigned i = 0; i < n; ++i)
    if (create(&events[i], timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return false;
  return true;
}

// Whether the current context is the one `events` were made in, making
// the `n` of them there at the first call (`owner` is then that context);
// false in another context, and for good once they could not be made
// (`failed`).
bool events_here(CUcontext& owner, bool& failed, CUevent* events, unsigned n, bool timing) noexcept {
  if (failed) return false;
  CUcontext ctx = nullptr;
  if (g_drv.ctx_get.load(std::memory_order_acquire)(&ctx) != CUDA_SUCCESS || ctx == nullptr) return false;
  if (owner == nullptr) {
    if (!create_events(events, n, timing)) {
      failed = true;
      return false;
    }
    owner = ctx;
  }
  return ctx == owner;
}

// A stream call for a launch on `s`: its _ptsz variant for a launch made
// through a _ptsz entry point, or the per-thread default stream by its
// handle where that variant is missing.
template <class Fn>
std::pair<Fn, CUstream> on_stream(const std::atomic<Fn>& plain, const std::atomic<Fn>& ptsz_fn, CUstream s,
                                  bool per_thread) noexcept {
  const Fn ptsz = ptsz_fn.load(std::memory_order_acquire);
  if (per_thread && ptsz != nullptr) return {ptsz, s};
  return {plain.load(std::memory_order_acquire), per_thread && s == nullptr ? CU_STREAM_PER_THREAD : s};
}

CUresult record(CUevent ev, CUstream s, bool per_thread) noexcept {
  const auto [f, st] = on_stream(g_drv.event_record, g_drv.event_record_ptsz, s, per_thread);
  return f(ev, st);
}

// ---- what the callback reads: one seqlocked mask per region slot ---------------------

// What the callback reads of one region slot, seqlocked.
//   latency-critical: `m` its burst set, `x` its top-up;
//   best-effort: `m` the LC reservations on its GPU, `x` their top-ups, and
//   the largest thread-block cluster (SMs of one GPC; 0: not known, so no
//   clustered kernel goes there) its floor hosts with the top-ups taken
//   away (`soft_cluster`) and without (`hard_cluster`), for the partition
//   they were worked out for.
struct SlotView {
  Bits128 m, x;
  Bits128 partition;
  std::uint32_t soft_cluster = 0, hard_cluster = 0;
};

struct SlotMask {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> lo, hi, xlo, xhi;
  std::atomic<std::uint32_t> valid;
  std::atomic<std::uint64_t> for_lo, for_hi;
  std::atomic<std::uint32_t> soft_cluster, hard_cluster;
};
constinit SlotMask g_mask[ctl::kMaxDevices]{};

void store_mask(unsigned slot, const SlotView& v, bool valid) noexcept {
  SlotMask& s = g_mask[slot];
  const std::uint64_t q = s.seq.load(std::memory_order_relaxed);
  s.seq.store(q | 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.lo.store(v.m.lo, std::memory_order_relaxed);
  s.hi.store(v.m.hi, std::memory_order_relaxed);
  s.xlo.store(v.x.lo, std::memory_order_relaxed);
  s.xhi.store(v.x.hi, std::memory_order_relaxed);
  s.valid.store(valid ? 1 : 0, std::memory_order_relaxed);
  s.for_lo.store(v.partition.lo, std::memory_order_relaxed);
  s.for_hi.store(v.partition.hi, std::memory_order_relaxed);
  s.soft_cluster.store(v.soft_cluster, std::memory_order_relaxed);
  s.hard_cluster.store(v.hard_cluster, std::memory_order_relaxed);
  s.seq.store((q | 1) + 1, std::memory_order_release);
}

// False when the slot holds nothing, or no consistent copy was had within
// ctl::kReadTries (a writer publishes in nanoseconds).
bool load_mask(unsigned slot, SlotView& v) noexcept {
  const SlotMask& s = g_mask[slot];
  bool valid = false;
  SlotView t;
  if (!seqlock::read(s.seq, [&]() noexcept {
        t.m = {s.lo.load(std::memory_order_relaxed), s.hi.load(std::memory_order_relaxed)};
        t.x = {s.xlo.load(std::memory_order_relaxed), s.xhi.load(std::memory_order_relaxed)};
        valid = s.valid.load(std::memory_order_relaxed) == 1;
        t.partition = {s.for_lo.load(std::memory_order_relaxed), s.for_hi.load(std::memory_order_relaxed)};
        t.soft_cluster = s.soft_cluster.load(std::memory_order_relaxed);
        t.hard_cluster = s.hard_cluster.load(std::memory_order_relaxed);
      }))
    return false;
  v = t;
  return valid;
}

// Best-effort launches in flight on their floor: while any is, the
// callback applies the floor (a concurrent launch on the whole partition
// then gets the floor too: the safe side).
std::atomic<int> g_floor_users{0};

// The region's slots in use, with their GPU and partition.
struct SlotPartition {
  unsigned slot;
  DeviceUuid uuid;
  Bits128 enabled;
};
std::vector<SlotPartition> region_slots() {
  std::vector<SlotPartition> out;
  const ctl::Header* h = header();
  if (h == nullptr) return out;
  for (unsigned i = 0; i < ctl::kMaxDevices; ++i) {
    const ctl::DeviceEntry& e = h->devices[i];
    if (e.in_use.load(std::memory_order_acquire) != 1) continue;
    try {
      const Partition p = ctl::read_partition(e);
      if (!p.active()) continue;
      DeviceUuid u;
      std::memcpy(u.data(), e.uuid, 16);
      out.push_back({i, u, p.enabled.bits});
    } catch (const std::exception&) {
    }
  }
  return out;
}

// The status directory's modification time: entries and beacons come and go
// by rename and unlink there.
std::int64_t dir_stamp() noexcept {
  struct stat st {};
  if (::stat(ctl::status_dir().c_str(), &st) != 0) return 0;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// Stream captures under way in this process (cuStreamBeginCapture* ..
// cuStreamEndCapture*). While one is, the shim makes no driver call of its
// own outside the launching thread's launch: in CUDA's global capture mode
// (PyTorch's default) a call another thread makes may invalidate the
// capture (seen on an H100: PyTorch's capture of the LC forward failed once
// in about ten runs while the controller queried an event).
std::atomic<int> g_captures{0};
// The shim's own driver calls in progress outside a launch's stream (the
// LC controller's event queries, a BE task's timing events): a capture does
// not begin during one (begin_capture).
std::atomic<int> g_ctl_calls{0};

// Around such calls: counted first, then made only while no capture is
// under way or beginning (either begin_capture sees the count and waits,
// or this sees the capture and makes none).
class OwnCalls {
 public:
  OwnCalls() noexcept {
    g_ctl_calls.fetch_add(1, std::memory_order_seq_cst);
    ok_ = g_captures.load(std::memory_order_seq_cst) == 0;
  }
  ~OwnCalls() { g_ctl_calls.fetch_sub(1, std::memory_order_release); }
  OwnCalls(const OwnCalls&) = delete;
  OwnCalls& operator=(const OwnCalls&) = delete;
  bool ok() const noexcept { return ok_; }

 private:
  bool ok_;
};

// ---- latency-critical: the beacon and the controller ---------------------------------

constexpr unsigned kRing = 64;
// A slot's sequence with this bit: the launch was in a context without the
// ring's events; it is not waited for.
constexpr std::uint64_t kNoEvent = 1ull << 63;

struct LcState {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  roles::BeaconFile* file = nullptr;  // leaked: threads may read it until exit
  std::atomic<roles::Beacon*> beacon{nullptr};
  std::atomic<std::uint64_t> launches{0};
  std::atomic<std::uint32_t> wake{0};
  std::atomic<std::uint32_t> sleeping{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> started{false};
  std::atomic<bool> failed{false};
  CUcontext ctx = nullptr;
  CUevent events[kRing] = {};
  std::atomic<std::uint64_t> slot_seq[kRing] = {};
  // The base of the burst set: every working TPC of each GPU (NVTASKSET_BURST_POOL).
  std::vector<DevicePartition>* pool = nullptr;
  // The top-up (roles::TopUp; nullptr: NVTASKSET_LC_TOPUP=off). While the
  // controller saturates (timing != 0: its generation), each launch records
  // a second event before it, so that the controller can time it.
  roles::TopUp* topup = nullptr;
  std::vector<ClusterMap>* maps = nullptr;  // which TPCs host clusters together (NVTASKSET_CLUSTER_MAP)
  std::uint32_t test_topup = 0;             // NVTASKSET_TEST_TOPUP: a fixed top-up, no probes (tests)
  std::atomic<std::uint64_t> timing{0};
  CUevent starts[kRing] = {};
  std::atomic<std::uint64_t> start_seq[kRing] = {};
  std::atomic<std::uint64_t> start_key[kRing] = {}, start_gen[kRing] = {}, start_ns[kRing] = {};
};
constinit LcState g_lc{};

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

// The budgets, unless a test stretches them (NVTASKSET_TEST_BURST_MS).
roles::BudgetParams budget_params(roles::BudgetParams p) noexcept {
  const NumberValue t = number(Option::kTestBurstMs, 1, 3'600'000, 0);
  if (t.value == 0) return p;
  p.max_burst_ns = t.value * 1'000'000ull;
  p.stop_share = 2.0;  // never by share
  p.fast_tau_ns = 0;
  return p;
}

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
    b.state.store(static_cast<std::uint32_t>(!busy                ? roles::LcState::kIdle
                                             : budget.may_burst() ? roles::LcState::kBursting
                                                                  : roles::LcState::kSaturated),
                  std::memory_order_relaxed);
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

// ---- best-effort: the gate, the floor, the queue --------------------------------------

constexpr unsigned kMaxPeers = 16;
// A best-effort task's queue, in launches. What an LC request waits behind
// is what the BE task has queued: on an H100 an LC probe waited 0.8 ms (p50)
// behind a BE that kept 1 launch of 1.5-ms matmuls queued, 5.0 ms behind 16,
// while the BE ran 625 instead of 656 matmuls/s (bench/yield_time.py --roles,
// docs/results.md).
constexpr unsigned kDefaultBeDepth = 4;
// Its queue while on the floor (every busy LC task saturated), in launches:
// 16 cost the training 3-6% next to an idle LC task where 4 cost 22% (H100,
// runs 40-41); nothing waits behind them for TPCs.
constexpr unsigned kDefaultBeFloorDepth = 16;

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
constinit BeState g_be{};

// The queue's events for at most `depth` launches, and `floor_depth` on the
// floor (every busy LC task saturated). Set once the role is known, and again
// under g_be.qmu when the gate falls back to the hold.
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

// `probe`: the hold is for reference probes only (roles::hold_is_probe).
// Under g_be.mu. No allocation (a vector's first growth could throw there,
// leaving the lock held): the peers are at most kMaxPeers.
// `stale` (when given): whether any LC task's controller is stale.
roles::BeAction be_decide(std::uint64_t now, bool& probe, bool* stale = nullptr) noexcept {
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

// Before a best-effort launch: waits while an LC task bursts; true when the
// launch must run on the floor.
// (A launch into a capturing stream runs nothing; it may wait here all the
// same: asking every launch whether its stream captures costs a driver call,
// and best-effort launches are many and short.)
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

// Before a best-effort launch, under the work bound: completed launches
// leave the queue (and teach their durations), and the task waits while
// this kernel would put more than the bound of learned work in it. Before
// the hold decision (be_before), so that a launch that waited here still
// makes way for an LC task that became busy meanwhile.
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

// After a best-effort launch: at most `depth` launches queued while an LC
// task exists. With none, the queue is the program's own: a BE task with no
// LC task gets everything, its throughput included. (An LC task that then
// starts may find a deep queue once: the bound holds from the next launch.)
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
    // (docs/results.md, "What the best-effort queue costs by itself").
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

// ---- best-effort: kernels too long to borrow (NVTASKSET_BE_BORROW_US) ------------------
//
// While every LC task is idle a BE kernel borrows the reservations, and an
// LC request arriving then waits on its reservation for it to end
// (roles.hpp, KernelTimer: GPT-2-medium training's three 2.9-4.4-ms sm75
// GEMMs put more than 2 ms of BE work in the way of 5-7% of arrivals; H200,
// run 83). Kernels its own launches timed at the limit or more go on the
// floor instead. A launch is timed by two events around it (the start
// recorded after any gate: the time between them is the kernel's, queued
// or not), only while every LC task is idle: a kernel with fewer than two
// samples, then one launch in 64, at most 4 at a time; their completions
// are read at later launches (once in 16). No driver call of this while a
// capture is under way. The same durations space the gates (gate_before).
constexpr unsigned kDefaultBorrowUs = 500;

struct Timing {
  roles::KernelTimer* timer = nullptr;  // nullptr: nothing timed (every kernel borrows, gates by count)
  CUcontext ctx = nullptr;              // the events' context (the first used)
  bool failed = false;                  // the events could not be made
  CUevent ev[roles::KernelTimer::kPairs][2] = {};
};
constinit Timing g_timing{};

// Whether the timing events can be used now: the current context is the
// events' (made at the first call). Under g_be.qmu, inside OwnCalls (no
// capture under way).
bool timing_ready() noexcept {
  return events_here(g_timing.ctx, g_timing.failed, &g_timing.ev[0][0], 2 * roles::KernelTimer::kPairs, true);
}

// The timed launches that completed teach their durations, once in
// KernelTimer::kPollEvery launches. Under g_be.qmu.
void timing_poll() noexcept {
  roles::KernelTimer& t = *g_timing.timer;
  if (!t.poll_due()) return;
  const OwnCalls calls;
  if (!calls.ok() || !timing_ready()) return;
  const auto query = g_drv.event_query.load(std::memory_order_acquire);
  const auto elapsed = g_drv.event_elapsed.load(std::memory_order_acquire);
  for (unsigned i = 0; i < roles::KernelTimer::kPairs; ++i) {
    const int p = static_cast<int>(i);
    if (!t.pending(p)) continue;
    const CUresult q = query(g_timing.ev[i][1]);
    if (q == CUDA_ERROR_NOT_READY) continue;
    float ms = -1;
    const bool read = q == CUDA_SUCCESS && elapsed(&ms, g_timing.ev[i][0], g_timing.ev[i][1]) == CUDA_SUCCESS;
    t.finish(p, read && ms >= 0 ? static_cast<std::int64_t>(static_cast<double>(ms) * 1e6) : -1);
  }
}

// Before a best-effort kernel launch that would borrow (every LC task
// idle): whether it goes on the floor instead, a kernel timed too long;
// `pair` the events that time this launch (-1: none).
bool borrow_before(CUstream s, bool per_thread, std::uint64_t key, int& pair) noexcept {
  pair = -1;
  if (g_timing.timer == nullptr || !g_be.any_lc.load(std::memory_order_acquire)) return false;
  pthread_mutex_lock(&g_be.qmu);
  timing_poll();
  roles::KernelTimer& t = *g_timing.timer;
  const bool off = !t.borrows(key);
  // The driver calls (the context, the capture check, the record) only for
  // a launch that is timed.
  pair = t.start(key);
  if (pair >= 0) {
    const OwnCalls calls;
    if (!calls.ok() || !timing_ready() || capturing(s, per_thread) ||
        record(g_timing.ev[pair][0], s, per_thread) != CUDA_SUCCESS) {
      t.ended(pair, false);
      pair = -1;
    }
  }
  pthread_mutex_unlock(&g_be.qmu);
  return off;
}

// After it: the end event of a timed launch (none for a launch that failed).
void borrow_after(int pair, CUstream s, bool per_thread, bool launched) noexcept {
  if (pair < 0) return;
  pthread_mutex_lock(&g_be.qmu);
  bool ok = false;
  if (launched) {
    const OwnCalls calls;
    ok = calls.ok() && record(g_timing.ev[pair][1], s, per_thread) == CUDA_SUCCESS;
  }
  g_timing.timer->ended(pair, ok);
  pthread_mutex_unlock(&g_be.qmu);
}

// ---- best-effort: the gate on the GPU (NVTASKSET_BE_YIELD=gate) -----------------------
//
// Held on the CPU, a launch waits before the driver sees it, so what an LC
// request waits behind is the BE queue (NVTASKSET_BE_DEPTH), and a shallow
// queue idles the GPU between GPT-2-medium's short kernels: 4 launches cost
// the training 22% next to an idle LC task (H100, docs/results.md, "What the
// best-effort queue costs by itself"). The gate stops the stream on the GPU
// instead: before every NVTASKSET_BE_GATE_EVERY launches of a stream the shim
// queues a wait on a word of the task's own mapped host memory
// (cuStreamWaitValue32, equal to 0), and the task's gatekeeper thread writes
// 1 while an LC task is busy and may burst (the same decision and budgets as
// a hold), 0 otherwise. The CPU keeps launching (those launches go on the
// floor, where they stay off the reservations whenever they run); an LC
// request waits behind at most the kernels queued before the next gate. On
// an H200, as a plain process and as an MPS client: a kernel behind a closed
// gate never ran (100 of 100 trials), it ran 8 us (p50; p99 11) after the
// CPU wrote 0, each open gate cost its stream 2.4 us, and a stream stopped
// at a gate for 4 s did not slow another client (tests/gpu/gate_probe.cu,
// docs/runs.md, run 68). The word is the task's own and only its own
// thread closes it: an LC task that dies or hangs cannot keep it closed (the
// budgets and staleness open it, as they end a hold).

constexpr unsigned kWaitValueEq = 0x1;        // CU_STREAM_WAIT_VALUE_EQ
constexpr unsigned kHostAllocPortable = 0x1;  // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kHostAllocDeviceMap = 0x2; // CU_MEMHOSTALLOC_DEVICEMAP
// A gate every 2 launches: next to GPT-2-medium training it took 0.22-0.42x
// off the open loop's LC p99 where every 4 took 0.04 (H200, runs 69-70), and
// on an H100 it gave the training 13-15 points more than the hold at the same
// or a better tail, where every launch gave less of both (run 72). Now the
// count where NVTASKSET_BE_GATE_EVERY is set or NVTASKSET_BE_GATE_US is 0,
// and where the task's kernels cannot be timed (no cuEventElapsedTime).
constexpr unsigned kDefaultGateEvery = 2;
// By default the gates are spaced by learned work instead (roles::GateSpacing):
// at most this much between two, or one kernel longer.
constexpr unsigned kDefaultGateUs = 100;
// Under the gate the queue no longer sets the give-back (an LC request waits
// behind the kernels before the next gate, not behind the queue: an LC probe
// waited as long behind 1.5- and 6-ms matmuls with 1024 launches queued as
// with 16, H200, run 80), so it is deeper, on the floor too. Next to an idle
// LC task 16 launches cost GPT-2-medium training 12% of its throughput, 64
// 4%, 1024 nothing (H100, run 76); on an H200, with no gate and no timing,
// 64 by themselves cost it 7% (run 106; presumably the lead the CPU can no
// longer bank for the training's launch-bound stretches, not measured
// apart). On the mix (H100 run 77, H200 runs 79-81) 1024 gave the training
// 6-8 points more than 16 at every rate, but at 44
// requests/s the LC p99 0.17-0.30x more; 64 kept 16's tail there (1.57-1.60x
// against 1.49-1.59x) and most of 1024's gains at 87 requests/s and in the
// closed loop. Launches queued while the LC task was idle keep all the TPCs,
// and run over its reservation if it has saturated by the time the gate
// opens (at most this queue, once per saturation; docs/design.md).
constexpr unsigned kDefaultGateDepth = 64;
constexpr unsigned kGateLanes = 16;

struct Gate {
  bool on = false;        // NVTASKSET_BE_YIELD=gate, and the driver has the calls
  roles::GateSpacing spacing{kDefaultGateEvery, 0};
  // In mapped host memory (one page), created in the task's context at its
  // first gated launch: 0 open, 1 closed. Written by the gatekeeper only.
  std::atomic<std::uint32_t>* word = nullptr;
  CUdeviceptr device_word = 0;
  bool failed = false;
  // Per stream, the launches since its last gate (a small table: a stream
  // that takes a lane from another starts again with a gate, so two
  // streams in one lane get their gates sooner, never later).
  struct Lane {
    CUstream s = nullptr;
    bool per_thread = false;
    roles::GateLane since;
  } lanes[kGateLanes];
};
constinit Gate g_gate{};

// The gatekeeper: the hold decision of be_before, written to the gate. Its
// budgets are the hold's: closed for at most 100 ms in a row and half of its
// time (for probes, a fifth), whatever the beacons say. How often it looks:
// - while it holds, or may have to without being told (a stale LC task), or
//   where the kernel refuses the wait below, every 20 us;
// - next to LC tasks that need no hold, asleep on their beacons' `wake`
//   words (at most 2 ms; several at once by futex_waitv, Linux 5.16): a
//   task wakes it when it turns busy, may burst again or probes. Polling
//   every 20 us there too cost GPT-2-medium training 6 points next to an
//   idle LC task on an H200, 4 of 4 rounds (run 95, docs/results.md, "The
//   gatekeeper asleep while the LC task is idle");
// - with no LC task, every 2 ms.
constexpr std::uint64_t kGatePollNs = 20'000;
constexpr std::uint64_t kGateSleepNs = 2'000'000;

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

// Before a launch of `key` on `s` under the gate: the gate, where the
// stream's lane says (roles::GateLane: by the learned work since its last
// one, or every NVTASKSET_BE_GATE_EVERY launches; its first launch gets
// one). False when the gate cannot be used (the launch then holds on the CPU).
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

// Before a best-effort kernel launch under the gate: no wait on the CPU. A
// launch an LC task's burst would hold goes on the floor, behind the gate;
// one the floor would take goes there. True when the launch must run on the floor.
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

// ---- one launch, either role ---------------------------------------------------------

struct Launch {
  std::uint64_t lc_seq = 0;
  std::uint64_t key = 0;  // the kernel, for the work bound
  bool floor = false;
  int timed = -1;  // the KernelTimer pair timing it
};

Launch before(CUstream s, bool per_thread, bool graph, std::uint64_t key) noexcept {
  Launch l;
  l.key = key;
  switch (static_cast<Role>(g_role.load(std::memory_order_relaxed))) {
    case Role::kLatencyCritical: l.lc_seq = lc_before(s, per_thread, key); break;
    case Role::kBestEffort:
      work_wait(key);
      try {
        // Under the gate a kernel launch is queued behind it (a graph's
        // kernels keep the TPCs they were encoded with: it holds).
        l.floor = g_gate.on && !graph && gate_before(s, per_thread, key) ? be_before_gate() : be_before(s, per_thread, graph);
      } catch (const std::exception&) {
        l.floor = true;  // the safe side
      }
      if (!l.floor && !graph && borrow_before(s, per_thread, key, l.timed)) {
        l.floor = true;
        if (ctl::Header* h = header()) bump(h->kept_off);
      }
      if (l.floor) g_floor_users.fetch_add(1, std::memory_order_acq_rel);
      break;
    case Role::kNone: break;
  }
  return l;
}

void after(const Launch& l, CUstream s, bool per_thread, bool launched = true) noexcept {
  switch (static_cast<Role>(g_role.load(std::memory_order_relaxed))) {
    case Role::kLatencyCritical: lc_after(l.lc_seq, s, per_thread); break;
    case Role::kBestEffort:
      borrow_after(l.timed, s, per_thread, launched);
      if (l.floor) g_floor_users.fetch_sub(1, std::memory_order_acq_rel);
      be_after(s, per_thread, l.key, l.floor);
      break;
    case Role::kNone: break;
  }
}

// ---- the wrappers ----------------------------------------------------------------------

enum Fn : unsigned {
  kLaunchKernel, kLaunchKernelPtsz, kLaunchKernelEx, kLaunchKernelExPtsz, kCoop, kCoopPtsz,
  kBeginCapture, kBeginCapturePtsz, kBeginCaptureV2, kBeginCaptureV2Ptsz, kBeginCaptureToGraph,
  kBeginCaptureToGraphPtsz, kEndCapture, kEndCapturePtsz, kFnCount
};
constexpr const char* kNames[kFnCount] = {
    "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuStreamBeginCapture",
    "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz",
    "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz", "cuStreamEndCapture",
    "cuStreamEndCapture_ptsz"};
std::atomic<void*> g_real[kFnCount]{};

template <class F>
F real(Fn f) noexcept {
  return reinterpret_cast<F>(g_real[f].load(std::memory_order_acquire));
}

using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void**, void**);
using LaunchKernelExFn = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using CoopFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**);

template <Fn F, bool kPtsz>
CUresult w_launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shm, CUstream s, void** params, void** extra) {
  const Launch l = before(s, kPtsz, false, roles::kernel_key(f, std::uint64_t{gx} * gy * gz));
  const CUresult rc = real<LaunchKernelFn>(F)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
  after(l, s, kPtsz, rc == CUDA_SUCCESS);
  return rc;
}

template <Fn F, bool kPtsz>
CUresult w_launch_kernel_ex(const CUlaunchConfig* cfg, CUfunction f, void** params, void** extra) {
  CUstream s = cfg != nullptr ? cfg->hStream : nullptr;
  const Launch l =
      before(s, kPtsz, false,
             roles::kernel_key(f, cfg != nullptr ? std::uint64_t{cfg->gridDimX} * cfg->gridDimY * cfg->gridDimZ : 0));
  const CUresult rc = real<LaunchKernelExFn>(F)(cfg, f, params, extra);
  after(l, s, kPtsz, rc == CUDA_SUCCESS);
  return rc;
}

template <Fn F, bool kPtsz>
CUresult w_coop(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shm, CUstream s, void** params) {
  const Launch l = before(s, kPtsz, false, roles::kernel_key(f, std::uint64_t{gx} * gy * gz));
  const CUresult rc = real<CoopFn>(F)(f, gx, gy, gz, bx, by, bz, shm, s, params);
  after(l, s, kPtsz, rc == CUDA_SUCCESS);
  return rc;
}

// Captures: counted (g_captures), the calls themselves unchanged. The
// driver's signatures (cuda.h): (stream); (stream, mode); (stream, graph,
// dependencies, edge data, count, mode); end: (stream, graph*).
using BeginFn = CUresult (*)(CUstream);
using BeginV2Fn = CUresult (*)(CUstream, int);
using BeginToGraphFn = CUresult (*)(CUstream, CUgraph, const void*, const void*, size_t, int);
using EndFn = CUresult (*)(CUstream, CUgraph*);

// A capture is counted before it begins, and begins only once the
// controller is in none of its own driver calls (controller_call): either
// the controller sees the count and makes no call, or the capture waits for
// the call to end. Counted after the begin, a controller that had just
// read no capture could query an event as the capture began, invalidating
// it (run 60, H200: PyTorch's capture of the LC forward failed in 2 of 3
// visits, "Offset increment outside graph capture").
template <class Begin>
CUresult begin_capture(Begin begin) noexcept {
  g_captures.fetch_add(1, std::memory_order_seq_cst);
  // The controller's calls are an event query or two (microseconds); a
  // controller stuck in one is not waited for beyond 20 ms.
  for (int i = 0; i < 2000 && g_ctl_calls.load(std::memory_order_seq_cst) != 0; ++i) sleep_ns(10'000);
  const CUresult rc = begin();
  if (rc != CUDA_SUCCESS) g_captures.fetch_sub(1, std::memory_order_acq_rel);
  return rc;
}
template <Fn F>
CUresult w_begin(CUstream s) {
  return begin_capture([&] { return real<BeginFn>(F)(s); });
}
template <Fn F>
CUresult w_begin_v2(CUstream s, int mode) {
  return begin_capture([&] { return real<BeginV2Fn>(F)(s, mode); });
}
template <Fn F>
CUresult w_begin_to_graph(CUstream s, CUgraph g, const void* deps, const void* edges, size_t n, int mode) {
  return begin_capture([&] { return real<BeginToGraphFn>(F)(s, g, deps, edges, n, mode); });
}
template <Fn F>
CUresult w_end(CUstream s, CUgraph* g) {
  const CUresult rc = real<EndFn>(F)(s, g);
  // A capture ends with this call whatever it answers (an invalidated one
  // too), unless the stream was not capturing.
  int n = g_captures.load(std::memory_order_acquire);
  while (n > 0 && !g_captures.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
  }
  return rc;
}

template <class W>
void* addr(W* w) noexcept {
  void* p;
  static_assert(sizeof p == sizeof w);
  std::memcpy(&p, &w, sizeof p);
  return p;
}

void* wrapper_of(unsigned f) noexcept {
  switch (f) {
    case kLaunchKernel: return addr(&w_launch_kernel<kLaunchKernel, false>);
    case kLaunchKernelPtsz: return addr(&w_launch_kernel<kLaunchKernelPtsz, true>);
    case kLaunchKernelEx: return addr(&w_launch_kernel_ex<kLaunchKernelEx, false>);
    case kLaunchKernelExPtsz: return addr(&w_launch_kernel_ex<kLaunchKernelExPtsz, true>);
    case kCoop: return addr(&w_coop<kCoop, false>);
    case kCoopPtsz: return addr(&w_coop<kCoopPtsz, true>);
    case kBeginCapture: return addr(&w_begin<kBeginCapture>);
    case kBeginCapturePtsz: return addr(&w_begin<kBeginCapturePtsz>);
    case kBeginCaptureV2: return addr(&w_begin_v2<kBeginCaptureV2>);
    case kBeginCaptureV2Ptsz: return addr(&w_begin_v2<kBeginCaptureV2Ptsz>);
    case kBeginCaptureToGraph: return addr(&w_begin_to_graph<kBeginCaptureToGraph>);
    case kBeginCaptureToGraphPtsz: return addr(&w_begin_to_graph<kBeginCaptureToGraphPtsz>);
    case kEndCapture: return addr(&w_end<kEndCapture>);
    case kEndCapturePtsz: return addr(&w_end<kEndCapturePtsz>);
    default: return nullptr;
  }
}

}  // namespace

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

void* wrap_export(const char* name, void* real_fn) noexcept {
  if (role() == Role::kNone || real_fn == nullptr) return nullptr;
  for (unsigned f = 0; f < kFnCount; ++f) {
    if (std::strcmp(name, kNames[f]) != 0) continue;
    g_real[f].store(real_fn, std::memory_order_release);
    return wrapper_of(f);
  }
  return nullptr;
}

void hand_out(void** pfn) noexcept {
  if (pfn == nullptr || *pfn == nullptr || role() == Role::kNone) return;
  for (unsigned f = 0; f < kFnCount; ++f)
    if (void* r = g_real[f].load(std::memory_order_acquire); r != nullptr && *pfn == r) {
      *pfn = wrapper_of(f);
      return;
    }
}

std::uint64_t before_graph_launch(const void* exec, CUstream s, bool per_thread) noexcept {
  return before(s, per_thread, true, roles::kernel_key(exec, 0)).lc_seq;  // a graph never runs on the floor
}

void after_graph_launch(std::uint64_t token, const void* exec, CUstream s, bool per_thread) noexcept {
  Launch l;
  l.lc_seq = token;
  l.key = roles::kernel_key(exec, 0);
  after(l, s, per_thread);
}

void adjust(unsigned slot, Bits128& enabled, std::uint32_t cluster_blocks) noexcept {
  if (slot >= ctl::kMaxDevices) return;
  switch (static_cast<Role>(g_role.load(std::memory_order_relaxed))) {
    case Role::kLatencyCritical: {
      // Bursting: its burst set. Saturated: its reservation and its top-up.
      // In a reference probe: its reservation alone.
      const roles::Beacon* b = g_lc.beacon.load(std::memory_order_acquire);
      if (b == nullptr || b->probing.load(std::memory_order_acquire) == 1) return;
      SlotView v;
      if (!load_mask(slot, v)) return;
      enabled = enabled | (b->may_burst.load(std::memory_order_relaxed) == 1 ? v.m : v.x);
      return;
    }
    case Role::kBestEffort: {
      if (g_floor_users.load(std::memory_order_acquire) == 0) return;
      SlotView v;
      if (!load_mask(slot, v)) return;
      // The floor: the partition without the LC reservations and, where it
      // hosts this kernel's clusters, without their top-ups too. A kernel
      // with clusters goes on a floor only where it hosts them (a misfit
      // would wait for ever, docs/hardware.md): bf16 cuBLAS matmuls launch
      // clusters of 2 and 4 on an H100, so most of a training step's time
      // is clustered kernels. A top-up never takes a BE kernel's clusters
      // from it: such a kernel runs beside the top-up, off the
      // reservations. The limits count only for the partition they were
      // worked out for (a -p since: not known).
      const Bits128 hard = roles::floor_of(enabled, v.m);
      const Bits128 soft = roles::floor_of(hard, v.x);
      auto fits = [&](std::uint32_t most) {
        return cluster_blocks <= 1 || (most != 0 && v.partition == enabled && cluster_blocks <= most);
      };
      if (soft.any() && fits(v.soft_cluster)) enabled = soft;
      else if (hard.any() && fits(v.hard_cluster)) enabled = hard;
      else if (ctl::Header* h = header()) bump(h->floor_skipped);
      return;
    }
    case Role::kNone: return;
  }
}

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
