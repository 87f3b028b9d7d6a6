// SPDX-License-Identifier: Apache-2.0
// The driver functions the roles call, and the capture guard's counters
// (role_shared.hpp).
#include <atomic>

#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

constinit Driver g_drv{};
std::atomic<int> g_captures{0};
std::atomic<int> g_ctl_calls{0};

bool have_events() noexcept {
  return g_drv.event_create.load(std::memory_order_acquire) && g_drv.event_record.load(std::memory_order_acquire) &&
         g_drv.event_query.load(std::memory_order_acquire) && g_drv.event_sync.load(std::memory_order_acquire) &&
         g_drv.ctx_get.load(std::memory_order_acquire);
}

bool capturing(CUstream s, bool per_thread) noexcept {
  const IsCapturingFn f = (per_thread ? g_drv.is_capturing_ptsz : g_drv.is_capturing).load(std::memory_order_acquire);
  if (f == nullptr) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return f(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

bool create_events(CUevent* events, unsigned n, bool timing) noexcept {
  const EventCreateFn create = g_drv.event_create.load(std::memory_order_acquire);
  for (unsigned i = 0; i < n; ++i)
    if (create(&events[i], timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return false;
  return true;
}

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

CUresult record(CUevent ev, CUstream s, bool per_thread) noexcept {
  const auto [f, st] = on_stream(g_drv.event_record, g_drv.event_record_ptsz, s, per_thread);
  return f(ev, st);
}

}  // namespace nvtaskset::roles_shim
