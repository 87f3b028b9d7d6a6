// SPDX-License-Identifier: Apache-2.0
// Where a best-effort stream's gates go (gate_lane.hpp).
#include "nvtaskset/gate_lane.hpp"

namespace nvtaskset::roles {

bool GateLane::next(const GateSpacing& s, std::uint64_t kernel_ns) noexcept {
  if (s.every != 0) {
    const bool gate = n_ % s.every == 0;
    ++n_;
    return gate;
  }
  const bool unknown = kernel_ns == GateSpacing::kUnknown;
  const std::uint64_t k = unknown ? 0 : kernel_ns;
  const bool gate = gate_next_ || unknown || n_ >= s.max_launches || work_ns_ + k > s.work_ns;
  if (gate) {
    n_ = 0;
    work_ns_ = 0;
  }
  ++n_;
  work_ns_ += k;
  // After a kernel not timed yet, or one longer than the bound, the next
  // one gets a gate of its own.
  gate_next_ = unknown || work_ns_ > s.work_ns;
  return gate;
}

}  // namespace nvtaskset::roles
