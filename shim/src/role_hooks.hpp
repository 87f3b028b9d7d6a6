// SPDX-License-Identifier: Apache-2.0
// The roles in a task's shim: what shim.cpp, the launch callback and the
// graph wrappers call (shim-internal; the beacon and the policy are the
// roles library's, ../../roles; the files that do the work are named in
// role_shared.hpp).
//
// Latency-critical task: every launch (kernels and graphs) counts, before
// the real call, in the task's beacon, and an event recorded after it tells
// the controller thread when the task's last launch completed. The launch
// callback widens the task's kernels from its reservation to its burst set
// (roles_adjust): every working TPC that no other partition except a
// best-effort one holds.
//
// Best-effort task: before each launch the shim reads the beacons of the
// latency-critical tasks. While one is busy and may burst, the launch waits
// (bounded by kHoldBudget); while one is busy but may not burst, or its
// controller is stale, the launch runs on the floor (the partition minus the
// reservations). After each launch it keeps at most NVTASKSET_BE_DEPTH
// launches queued, waiting on an event for the oldest. CUDA graph launches
// never run on the floor (their kernels keep the mask they were encoded
// with): they wait until every latency-critical task is idle.
//
// All the work is done in the intercepted API calls and in the
// controller's thread; the callback only reads a flag and a seqlocked copy.
#pragma once

#include <atomic>
#include <cstdint>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/cuda_driver_api.hpp"
#include "nvtaskset/task_role.hpp"

namespace nvtaskset::roles_shim {

using WarnFn = void (*)(const char* msg);

// For the init, after the driver is loaded and before the slots are filled:
// the task's role (NVTASKSET_ROLE), its region, the driver's handle.
void configure(roles::Role role, std::atomic<ctl::Header*>* header, void* driver, WarnFn warn) noexcept;
roles::Role role() noexcept;

// For the init: the wrapper that replaces launch export `name`; nullptr
// when `name` is none, or the task has no role.
void* wrap_export(const char* name, void* real) noexcept;
// For cuGetProcAddress: when *pfn is a real function a wrapper stands for.
void hand_out(void** pfn) noexcept;

// Around a graph launch (graphs.cpp): the same as around a kernel launch,
// except that a best-effort graph never runs on the floor.
// The token before_ returns goes to after_.
std::uint64_t before_graph_launch(const void* exec, CUstream s, bool per_thread) noexcept;
void after_graph_launch(std::uint64_t token, const void* exec, CUstream s, bool per_thread) noexcept;

// The launch callback: the mask for a kernel of the entry in `slot` whose
// partition is `enabled`, with clusters of `cluster_blocks` (0: none).
// Lock-free, allocation-free, no system call. A best-effort kernel with
// clusters goes on the floor only where the floor hosts them (worked out
// when the floor changes, from NVTASKSET_CLUSTER_MAP); one it does not host
// would wait for ever there, so it runs on the whole partition and is
// counted (floor_skipped).
void adjust(unsigned slot, Bits128& enabled, std::uint32_t cluster_blocks) noexcept;

// In a fork child: the parent's controller thread and beacon are not the
// child's.
void atfork_child() noexcept;

}  // namespace nvtaskset::roles_shim
