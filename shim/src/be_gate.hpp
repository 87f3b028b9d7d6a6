// SPDX-License-Identifier: Apache-2.0
// The best-effort gate on the GPU (NVTASKSET_BE_YIELD=gate).
// Held on the CPU, a launch waits before the driver sees it, and a shallow
// queue idles the GPU between a training's short kernels; the gate stops the
// stream on the GPU instead. Before a stream's launch (by learned work, or
// every NVTASKSET_BE_GATE_EVERY launches) the shim queues a wait on a word of
// the task's own mapped host memory (cuStreamWaitValue32, equal to 0), and
// the task's gatekeeper thread writes 1 while an LC task is busy and may
// burst (the same decision and budgets as a hold), 0 otherwise. The CPU keeps
// launching (those launches go on the floor, where they stay off the
// reservations whenever they run); an LC request waits behind at most the
// kernels queued before the next gate. The word is the task's own and only
// its own thread closes it: an LC task that dies or hangs cannot keep it
// closed (the budgets and staleness open it, as they end a hold). What the
// gate costs and how fast it opens, measured: docs/design.md, "The numbers,
// measured".

#pragma once

#include <atomic>
#include <cstdint>

#include "nvtaskset/gate_lane.hpp"
#include "nvtaskset/role_options.hpp"
#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

// The count where NVTASKSET_BE_GATE_EVERY is set or NVTASKSET_BE_GATE_US is
// 0, and where the task's kernels cannot be timed (no cuEventElapsedTime).
using roles::kDefaultGateEvery;  // 2 (role_options.hpp)
// By default the gates are spaced by learned work instead (roles::GateSpacing):
// at most this much between two, or one kernel longer.
using roles::kDefaultGateUs;  // 100 (role_options.hpp)
// Under the gate the queue no longer sets the give-back (an LC request waits
// behind the kernels before the next gate), so it is deeper, on the floor
// too. Launches queued while the LC task was idle keep all the TPCs, and run
// over its reservation if it has saturated by the time the gate opens (at
// most this queue, once per saturation; docs/design.md, "Roles").
using roles::kDefaultGateDepth;  // 64 (role_options.hpp)
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
extern Gate g_gate;

// Before a launch of `key` on `s` under the gate: the gate, where the
// stream's lane says (roles::GateLane: by the learned work since its last
// one, or every NVTASKSET_BE_GATE_EVERY launches; its first launch gets
// one). False when the gate cannot be used (the launch then holds on the CPU).
bool gate_before(CUstream s, bool per_thread, std::uint64_t key) noexcept;
// Before a best-effort kernel launch under the gate: no wait on the CPU. A
// launch an LC task's burst would hold goes on the floor, behind the gate;
// one the floor would take goes there. True when the launch must run on the floor.
bool be_before_gate();

}  // namespace nvtaskset::roles_shim
