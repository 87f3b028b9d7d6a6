// SPDX-License-Identifier: Apache-2.0
// A best-effort launch's action (best_effort_policy.hpp).
#include "nvtaskset/best_effort_policy.hpp"

namespace nvtaskset::roles {

BeAction be_action(std::span<const LcSnapshot> lcs, std::uint64_t now_ns) noexcept {
  BeAction a = BeAction::kRun;
  for (const LcSnapshot& s : lcs) {
    if (is_stale(s, now_ns)) {
      // Its controller stopped: whether the task is busy is unknown, so
      // its reservation is kept free, and nothing waits for it.
      if (a == BeAction::kRun) a = BeAction::kFloor;
      continue;
    }
    if (s.launches == s.completed) continue;
    if (s.may_burst) return BeAction::kHold;
    a = BeAction::kFloor;
  }
  return a;
}

bool hold_is_probe(std::span<const LcSnapshot> lcs, std::uint64_t now_ns) noexcept {
  bool any = false;
  for (const LcSnapshot& s : lcs) {
    if (is_stale(s, now_ns) || s.launches == s.completed || !s.may_burst) continue;
    if (!s.probing) return false;
    any = true;
  }
  return any;
}

}  // namespace nvtaskset::roles
