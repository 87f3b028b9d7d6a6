// SPDX-License-Identifier: Apache-2.0
// Kernels too long to borrow the reservations (be_borrow.hpp).
#include "be_borrow.hpp"

#include "be_queue.hpp"

namespace nvtaskset::roles_shim {

constinit Timing g_timing{};

namespace {

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

}  // namespace

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

}  // namespace nvtaskset::roles_shim
