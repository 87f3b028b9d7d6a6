// SPDX-License-Identifier: Apache-2.0
// What the role files of the shim share (shim-internal): the task's role and
// region, the driver functions the roles call, the capture guard, and the
// masks the launch callback reads. The jobs: lc_controller (latency-critical),
// be_queue (best-effort hold, floor and queue bound), be_borrow (kernels too
// long to borrow), be_gate (the gate on the GPU), role_wrappers (the
// intercepted calls that feed them), role_masks (what the callback applies),
// role_configure (the options, once).
#pragma once

#include <dlfcn.h>
#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/cuda_driver_api.hpp"
#include "nvtaskset/partition.hpp"
#include "nvtaskset/task_role.hpp"
#include "role_hooks.hpp"

namespace nvtaskset::roles_shim {

using roles::Role;

// The task's role (roles::Role; 0 until configure()), its region, and
// where warnings go.
extern std::atomic<std::uint32_t> g_role;
extern std::atomic<std::atomic<ctl::Header*>*> g_header_src;
extern std::atomic<WarnFn> g_warn;

inline ctl::Header* header() noexcept {
  auto* src = g_header_src.load(std::memory_order_acquire);
  return src != nullptr ? src->load(std::memory_order_acquire) : nullptr;
}

void warn(const char* msg) noexcept;

inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t by = 1) noexcept {
  c.fetch_add(by, std::memory_order_relaxed);
}

inline void sleep_ns(long ns) noexcept {
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
extern Driver g_drv;

template <class F>
void load(std::atomic<F>& slot, void* driver, const char* name) noexcept {
  slot.store(reinterpret_cast<F>(::dlsym(driver, name)), std::memory_order_release);
}

bool have_events() noexcept;
// Work launched into a capturing stream does not run: it neither makes the
// task busy nor waits.
bool capturing(CUstream s, bool per_thread) noexcept;
// `n` events in the current context, for a ring the shim waits on (timing
// off: only completion is asked). Not CU_EVENT_BLOCKING_SYNC: the waits are
// short, and a blocked thread's wake-up left the GPU idle between short
// best-effort kernels.
// The work bound (NVTASKSET_BE_WORK_US) times its events: `timing`.
bool create_events(CUevent* events, unsigned n, bool timing = false) noexcept;
// Whether the current context is the one `events` were made in, making
// the `n` of them there at the first call (`owner` is then that context);
// false in another context, and for good once they could not be made
// (`failed`).
bool events_here(CUcontext& owner, bool& failed, CUevent* events, unsigned n, bool timing) noexcept;

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

CUresult record(CUevent ev, CUstream s, bool per_thread) noexcept;

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

void store_mask(unsigned slot, const SlotView& v, bool valid) noexcept;
// False when the slot holds nothing, or no consistent copy was had within
// ctl::kReadTries (a writer publishes in nanoseconds).
bool load_mask(unsigned slot, SlotView& v) noexcept;

// Best-effort launches in flight on their floor: while any is, the
// callback applies the floor (a concurrent launch on the whole partition
// then gets the floor too: the safe side).
extern std::atomic<int> g_floor_users;

// The region's slots in use, with their GPU and partition.
struct SlotPartition {
  unsigned slot;
  DeviceUuid uuid;
  Bits128 enabled;
};
std::vector<SlotPartition> region_slots();

// The status directory's modification time: entries and beacons come and go
// by rename and unlink there.
std::int64_t dir_stamp() noexcept;

// Stream captures under way in this process (cuStreamBeginCapture* ..
// cuStreamEndCapture*). While one is, the shim makes no driver call of its
// own outside the launching thread's launch: in CUDA's global capture mode
// (PyTorch's default) a call another thread makes may invalidate the
// capture (seen on an H100: PyTorch's capture of the LC forward failed once
// in about ten runs while the controller queried an event).
extern std::atomic<int> g_captures;
// The shim's own driver calls in progress outside a launch's stream (the
// LC controller's event queries, a BE task's timing events): a capture does
// not begin during one (begin_capture).
extern std::atomic<int> g_ctl_calls;

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

}  // namespace nvtaskset::roles_shim
