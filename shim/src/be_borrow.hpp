// SPDX-License-Identifier: Apache-2.0
// Best-effort kernels too long to borrow the reservations
// (NVTASKSET_BE_BORROW_US).
// While every LC task is idle a BE kernel borrows the reservations, and an
// LC request arriving then waits on its reservation for it to end (how
// often, measured: docs/design.md, "The numbers, measured"). Kernels its
// own launches timed at the limit or more go on the floor instead. A launch
// is timed by two events around it (the start recorded after any gate: the
// time between them is the kernel's, queued or not), only while every LC
// task is idle: a kernel with fewer than two samples, then one launch in 64,
// at most 4 at a time; their completions are read at later launches (once
// in 16). No driver call of this while a capture is under way. The same
// durations space the gates (gate_before).
#pragma once

#include <cstdint>

#include "nvtaskset/kernel_timer.hpp"
#include "nvtaskset/role_options.hpp"
#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

using roles::kDefaultBorrowUs;  // 500 (role_options.hpp)

struct Timing {
  roles::KernelTimer* timer = nullptr;  // nullptr: nothing timed (every kernel borrows, gates by count)
  CUcontext ctx = nullptr;              // the events' context (the first used)
  bool failed = false;                  // the events could not be made
  CUevent ev[roles::KernelTimer::kPairs][2] = {};
};
extern Timing g_timing;

// Before a best-effort kernel launch that would borrow (every LC task
// idle): whether it goes on the floor instead, a kernel timed too long;
// `pair` the events that time this launch (-1: none).
bool borrow_before(CUstream s, bool per_thread, std::uint64_t key, int& pair) noexcept;
// After it: the end event of a timed launch (none for a launch that failed).
void borrow_after(int pair, CUstream s, bool per_thread, bool launched) noexcept;

}  // namespace nvtaskset::roles_shim
