// SPDX-License-Identifier: Apache-2.0
// Where a best-effort stream's gates go (NVTASKSET_BE_GATE_US, _EVERY).
//
// An LC request that arrives while a BE stream runs waits for the kernels
// queued before that stream's next gate (the gate: a wait on the GPU that the
// task's gatekeeper closes while the LC task is busy). Each gate costs the
// stream and its launching thread a few microseconds (measured:
// docs/design.md, "Roles", "The numbers, measured"). A gate every 2 launches
// puts one before every other kernel of a training step's many short ones
// (element-wise, normalisation, optimizer) though a group of them is over
// sooner than one matmul. So, by default, a stream's kernels are grouped by
// their learned durations (KernelTimer): a gate goes before a launch once the
// learned work since the stream's last gate, this kernel included, would pass
// the bound, before a kernel not timed yet and the launch after it (it may be
// long), and after max_launches launches. What a request waits for is then
// the rest of a group: at most the bound of learned work, or one kernel
// longer than that. Pure: the shim keeps one lane per stream.
#pragma once

#include <cstdint>

namespace nvtaskset::roles {

struct GateSpacing {
  unsigned every = 0;          // > 0: a gate every this many launches (NVTASKSET_BE_GATE_EVERY), nothing learned
  std::uint64_t work_ns = 0;   // otherwise: at most this much learned work between two gates
  unsigned max_launches = 16;  // and at most this many launches
  static constexpr std::uint64_t kUnknown = ~0ull;  // a kernel's duration not learned yet
};

class GateLane {
 public:
  // Before a launch of a kernel that runs `kernel_ns` (GateSpacing::kUnknown:
  // not timed yet): whether a gate goes before it. The lane's first launch
  // gets one.
  bool next(const GateSpacing& s, std::uint64_t kernel_ns) noexcept;
  // The gate could not be queued: the next launch gets one.
  void reset() noexcept { *this = {}; }

 private:
  unsigned n_ = 0;            // launches since the last gate, the one after it included (0: none yet)
  std::uint64_t work_ns_ = 0; // their learned work
  bool gate_next_ = true;     // the last kernel's duration was unknown (or the lane is new)
};

}  // namespace nvtaskset::roles
