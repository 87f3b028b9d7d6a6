// SPDX-License-Identifier: Apache-2.0
// What a best-effort task does before a launch, from the latency-critical
// tasks' beacons: run, hold or go on its floor (docs/design.md, "Roles").
// Pure.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "nvtaskset/beacon.hpp"
#include "nvtaskset/bits.hpp"
#include "nvtaskset/burst_budget.hpp"

namespace nvtaskset::roles {

enum class BeAction {
  kRun,    // every LC task idle: launch on the whole partition (borrowing)
  kHold,   // an LC task bursts: launch nothing yet
  kFloor,  // an LC task is busy but does not burst (or is stale): launch on the floor
};
// (A span: the shim passes a fixed array it fills under its lock, where an
// allocation that failed would throw.)
BeAction be_action(std::span<const LcSnapshot> lcs, std::uint64_t now_ns) noexcept;
inline BeAction be_action(const std::vector<LcSnapshot>& lcs, std::uint64_t now_ns) noexcept {
  return be_action(std::span<const LcSnapshot>(lcs), now_ns);
}
// Whether a hold (be_action's kHold) is for reference probes only: every LC
// task that makes the BE task hold is probing, none bursts.
bool hold_is_probe(std::span<const LcSnapshot> lcs, std::uint64_t now_ns) noexcept;
inline bool hold_is_probe(const std::vector<LcSnapshot>& lcs, std::uint64_t now_ns) noexcept {
  return hold_is_probe(std::span<const LcSnapshot>(lcs), now_ns);
}

// A BE task holds for an LC task for at most this long in a row, and at
// most half of its time (a BurstBudget of its own): an LC task that claims
// to burst for ever, by fault or by design, cannot stop it.
// No resume time-out: this bound is the BE task's own, not a guess about
// how fast the LC task would run.
inline constexpr BudgetParams kHoldBudget{200'000'000, 0.5, 0.35, 100'000'000, 0, 0, 0, 0, 0};
// A hold for a reference probe (TopUp) counts against a bound of its own, not
// against kHoldBudget: a closed loop's burst spends that one, and a probe
// that then ran next to the BE task timed contended durations as "alone"
// (measured: docs/design.md, "Roles", "The numbers, measured"). A probe lasts
// at most 80 ms, one per 4 s (0.5 s while they time nothing): 2-14% of the
// time. This bound, 100 ms in a row and a fifth of the time over 2 s, keeps
// an LC task that probes for ever from stopping the BE task.
inline constexpr BudgetParams kProbeHoldBudget{2'000'000'000, 0.2, 0.1, 100'000'000, 0, 0, 0, 0, 0};

// The floor of a BE partition: what is left of it without the LC
// reservations on its GPU. Empty when nothing is.
inline Bits128 floor_of(const Bits128& enabled, const Bits128& reserved) noexcept {
  return Bits128{enabled.lo & ~reserved.lo, enabled.hi & ~reserved.hi};
}

}  // namespace nvtaskset::roles
