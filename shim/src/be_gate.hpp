// SPDX-License-Identifier: Apache-2.0
// The best-effort gate on the GPU (NVTASKSET_BE_YIELD=gate).
// Held on the CPU, a launch waits before the driver sees it, so what an LC
// request waits behind is the BE queue (NVTASKSET_BE_DEPTH), and a shallow
// queue idles the GPU between GPT-2-medium's short kernels: 4 launches cost
// the training 22% next to an idle LC task (H100, docs/runs.md, "What the
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

#pragma once

#include <atomic>
#include <cstdint>

#include "nvtaskset/gate_lane.hpp"
#include "nvtaskset/role_options.hpp"
#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

// A gate every 2 launches: next to GPT-2-medium training it took 0.22-0.42x
// off the open loop's LC p99 where every 4 took 0.04 (H200, runs 69-70), and
// on an H100 it gave the training 13-15 points more than the hold at the same
// or a better tail, where every launch gave less of both (run 72). Now the
// count where NVTASKSET_BE_GATE_EVERY is set or NVTASKSET_BE_GATE_US is 0,
// and where the task's kernels cannot be timed (no cuEventElapsedTime).
using roles::kDefaultGateEvery;  // 2 (role_options.hpp)
// By default the gates are spaced by learned work instead (roles::GateSpacing):
// at most this much between two, or one kernel longer.
using roles::kDefaultGateUs;  // 100 (role_options.hpp)
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
