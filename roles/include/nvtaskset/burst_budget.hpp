// SPDX-License-Identifier: Apache-2.0
// How long a latency-critical task may burst: its controller's budget
// (docs/design.md, "Roles"). Pure.
#pragma once

#include <cstdint>

namespace nvtaskset::roles {

// What the controller may burst: an exponentially weighted share of time
// busy (time constant tau_ns), and the length of the current busy period.
// Bursting stops when the share passes stop_share or one busy period lasts
// max_burst_ns, and starts again once the share is below resume_share and
// the task was idle. A task that keeps the GPU busy (a closed loop) then
// runs on its reservation next to BE tasks on their floors, instead of
// starving them.
//
// The time constant is 1 s, not less: an open-loop load is bursty, and over
// a shorter one a light server was stopped in its busier stretches.
//
// The share is measured at the speed the task runs at, and a task stopped
// from bursting runs slower, so it is busier: a load that is light while it
// bursts can be heavy on the reservation alone and would never fall below
// the resume share again. So after resume_after_ns
// stopped, the first idle pass lets it burst again, its share lowered to
// the resume share: a task that bursts its way back to a light load keeps
// bursting. A closed loop, busy at any speed, is stopped again within
// tau * ln((1 - resume) / (1 - stop)) = 0.26 s; a probe that ends so (within
// 2 tau of its start) doubles the next time-out, up to max_resume_after_ns,
// so a closed loop pays one such probe per 8 s once settled; any other
// resume or stop starts again from resume_after_ns. 0: no time-out.
//
// A second, fast share (time constant fast_tau_ns) stops a task that is
// busy but for short gaps, as a closed loop is between its requests: from
// idle the 1-s share passes 0.5 only after 0.7 s, all of it a burst while
// the BE tasks hold. Over 100 ms at 0.93 a closed loop 95-98% busy is stopped
// after 0.32-0.39 s; one busy period without a gap passes 0.93 only after
// 266 ms, later than max_burst_ns stops it, and an open-loop load passes it
// only when it keeps the GPU busy for a third of a second (GPT-2 at 87
// requests/s is 20% busy while bursting). A resume by the time-out lowers
// it to fast_resume_share, not to the resume share as the slow one: a task
// busy without a pause (a closed loop) is stopped again after
// 0.1 s * ln((1 - 0.9) / (1 - 0.93)) = 36-60 ms, not after the slow share's
// 0.28 s, each time holding the BE tasks, while a task that bursts its way
// back to a light load falls below it at once. 0: no fast share.
// The values (measured: docs/design.md, "Roles", "The numbers, measured").
struct BudgetParams {
  std::uint64_t tau_ns = 1'000'000'000;
  double stop_share = 0.5;
  double resume_share = 0.35;
  std::uint64_t max_burst_ns = 250'000'000;
  std::uint64_t resume_after_ns = 1'000'000'000;
  std::uint64_t max_resume_after_ns = 8'000'000'000;
  std::uint64_t fast_tau_ns = 100'000'000;
  double fast_stop_share = 0.93;
  double fast_resume_share = 0.9;
};

// ---- the states and transitions, in one table ----------------------------------------
//
// A budget is in one of four states, and each pass (advance) is one event.
// advance() is driven from kBurstTransitions: it classifies the pass, looks
// up (state, event), applies the row's action and takes its next state. The
// latency-critical controller runs one budget (its beacon's LcState is its
// state with resting shown as idle); a best-effort task runs two as the
// bounds of its holds (kHoldBudget, kProbeHoldBudget). docs/design.md
// ("Roles") shows the same table; a unit test fails when the two differ.
enum class BurstState : std::uint8_t {
  kIdle,       // nothing pending, may burst
  kBursting,   // busy and may burst
  kSaturated,  // busy and may not burst (its burst was stopped)
  kResting,    // idle after a stop, may not burst yet
};
enum class BurstEvent : std::uint8_t {
  kBusy,        // a busy pass within the budget
  kOverBudget,  // a busy pass past it: the share over stop_share, the fast share over
                // fast_stop_share, or one busy period of max_burst_ns
  kIdle,        // an idle pass
  kSharesLow,   // an idle pass with both shares below resume_share
  kTimedOut,    // an idle pass, not kSharesLow, resume_timeout() after the stop
};
enum class BurstAction : std::uint8_t {
  kNone,
  kStop,    // a saturation counted; the time-out resume_after_ns, doubled (up to
            // max_resume_after_ns) when the probe before ended within 2 tau
  kResume,  // the time-out back to resume_after_ns
  kProbe,   // a probe: the shares lowered to resume_share and fast_resume_share
};
inline constexpr unsigned kBurstStates = 4, kBurstEvents = 5;

struct BurstTransition {
  BurstState state;
  BurstEvent event;
  BurstState next;
  BurstAction action;
};

// Every (state, event), in that order: the row of (s, e) is s * kBurstEvents + e.
inline constexpr BurstTransition kBurstTransitions[kBurstStates * kBurstEvents] = {
    {BurstState::kIdle, BurstEvent::kBusy, BurstState::kBursting, BurstAction::kNone},
    {BurstState::kIdle, BurstEvent::kOverBudget, BurstState::kSaturated, BurstAction::kStop},
    {BurstState::kIdle, BurstEvent::kIdle, BurstState::kIdle, BurstAction::kNone},
    {BurstState::kIdle, BurstEvent::kSharesLow, BurstState::kIdle, BurstAction::kNone},
    {BurstState::kIdle, BurstEvent::kTimedOut, BurstState::kIdle, BurstAction::kNone},
    {BurstState::kBursting, BurstEvent::kBusy, BurstState::kBursting, BurstAction::kNone},
    {BurstState::kBursting, BurstEvent::kOverBudget, BurstState::kSaturated, BurstAction::kStop},
    {BurstState::kBursting, BurstEvent::kIdle, BurstState::kIdle, BurstAction::kNone},
    {BurstState::kBursting, BurstEvent::kSharesLow, BurstState::kIdle, BurstAction::kNone},
    {BurstState::kBursting, BurstEvent::kTimedOut, BurstState::kIdle, BurstAction::kNone},
    {BurstState::kSaturated, BurstEvent::kBusy, BurstState::kSaturated, BurstAction::kNone},
    {BurstState::kSaturated, BurstEvent::kOverBudget, BurstState::kSaturated, BurstAction::kNone},
    {BurstState::kSaturated, BurstEvent::kIdle, BurstState::kResting, BurstAction::kNone},
    {BurstState::kSaturated, BurstEvent::kSharesLow, BurstState::kIdle, BurstAction::kResume},
    {BurstState::kSaturated, BurstEvent::kTimedOut, BurstState::kIdle, BurstAction::kProbe},
    {BurstState::kResting, BurstEvent::kBusy, BurstState::kSaturated, BurstAction::kNone},
    {BurstState::kResting, BurstEvent::kOverBudget, BurstState::kSaturated, BurstAction::kNone},
    {BurstState::kResting, BurstEvent::kIdle, BurstState::kResting, BurstAction::kNone},
    {BurstState::kResting, BurstEvent::kSharesLow, BurstState::kIdle, BurstAction::kResume},
    {BurstState::kResting, BurstEvent::kTimedOut, BurstState::kIdle, BurstAction::kProbe},
};
static_assert([] {
  for (unsigned i = 0; i < kBurstStates * kBurstEvents; ++i)
    if (static_cast<unsigned>(kBurstTransitions[i].state) != i / kBurstEvents ||
        static_cast<unsigned>(kBurstTransitions[i].event) != i % kBurstEvents)
      return false;
  return true;
}(), "kBurstTransitions must hold every (state, event) in order");

constexpr const BurstTransition& burst_transition(BurstState s, BurstEvent e) noexcept {
  return kBurstTransitions[static_cast<unsigned>(s) * kBurstEvents + static_cast<unsigned>(e)];
}
// May a budget in state `s` burst?
constexpr bool may_burst_in(BurstState s) noexcept { return s == BurstState::kIdle || s == BurstState::kBursting; }

// Their names, as docs/design.md's table shows them.
constexpr const char* state_name(BurstState s) noexcept {
  constexpr const char* kNames[kBurstStates] = {"idle", "bursting", "saturated", "resting"};
  return kNames[static_cast<unsigned>(s)];
}
constexpr const char* event_name(BurstEvent e) noexcept {
  constexpr const char* kNames[kBurstEvents] = {"busy", "over budget", "idle", "shares low", "timed out"};
  return kNames[static_cast<unsigned>(e)];
}
constexpr const char* action_name(BurstAction a) noexcept {
  constexpr const char* kNames[] = {"-", "stop", "resume", "probe"};
  return kNames[static_cast<unsigned>(a)];
}

class BurstBudget {
 public:
  explicit BurstBudget(BudgetParams p = {}) : p_(p) {}
  // Time `now` (ns, monotonic), the task busy or not since the last call:
  // one event, one row of kBurstTransitions.
  void advance(std::uint64_t now, bool busy) noexcept;
  BurstState state() const noexcept { return state_; }
  bool may_burst() const noexcept { return may_burst_in(state_); }
  double share() const noexcept { return share_; }
  double fast_share() const noexcept { return fast_share_; }
  std::uint64_t saturations() const noexcept { return saturations_; }
  // The time-out before the next probe.
  std::uint64_t resume_timeout() const noexcept { return timeout_ns_ != 0 ? timeout_ns_ : p_.resume_after_ns; }

 private:
  BudgetParams p_;
  std::uint64_t last_ = 0;
  std::uint64_t busy_since_ = 0;  // 0: idle
  std::uint64_t stopped_at_ = 0;  // when bursting last stopped
  std::uint64_t probed_at_ = 0;   // when the time-out last let it burst (0: not since)
  std::uint64_t timeout_ns_ = 0;  // the current time-out (0: resume_after_ns)
  double share_ = 0;
  double fast_share_ = 0;
  BurstState state_ = BurstState::kIdle;
  bool started_ = false;
  std::uint64_t saturations_ = 0;
};

}  // namespace nvtaskset::roles
