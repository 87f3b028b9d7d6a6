// SPDX-License-Identifier: Apache-2.0
// The latency-critical controller's burst budget (burst_budget.hpp).
#include "nvtaskset/burst_budget.hpp"

#include <algorithm>
#include <cmath>

namespace nvtaskset::roles {

void BurstBudget::advance(std::uint64_t now, bool busy) noexcept {
  if (!started_) {
    started_ = true;
    last_ = now;
  }
  const std::uint64_t dt = now > last_ ? now - last_ : 0;
  last_ = now;
  // The share of time busy, weighted by exp(-age / tau): what the last
  // interval adds is its length's weight, all busy or all idle.
  const double keep = std::exp(-static_cast<double>(dt) / static_cast<double>(p_.tau_ns));
  share_ = share_ * keep + (busy ? 1.0 - keep : 0.0);
  if (p_.fast_tau_ns != 0) {
    const double fast_keep = std::exp(-static_cast<double>(dt) / static_cast<double>(p_.fast_tau_ns));
    fast_share_ = fast_share_ * fast_keep + (busy ? 1.0 - fast_keep : 0.0);
  }
  // The event this pass is.
  BurstEvent event = BurstEvent::kIdle;
  if (busy) {
    if (busy_since_ == 0) busy_since_ = now - dt;
    const bool fast = p_.fast_tau_ns != 0 && fast_share_ > p_.fast_stop_share;
    event = share_ > p_.stop_share || fast || now - busy_since_ >= p_.max_burst_ns ? BurstEvent::kOverBudget
                                                                                   : BurstEvent::kBusy;
  } else {
    busy_since_ = 0;
    // Both shares below the resume share: a closed loop the fast share
    // stopped has a slow share still below it (0.32 after 0.39 s).
    if (share_ < p_.resume_share && (p_.fast_tau_ns == 0 || fast_share_ < p_.resume_share))
      event = BurstEvent::kSharesLow;
    else if (p_.resume_after_ns != 0 && now - stopped_at_ >= resume_timeout())
      event = BurstEvent::kTimedOut;  // stopped long enough: try again (burst_budget.hpp says why)
  }
  const BurstTransition& t = burst_transition(state_, event);
  switch (t.action) {
    case BurstAction::kNone: break;
    case BurstAction::kStop: {
      stopped_at_ = now;
      ++saturations_;
      // A probe the task's load ended at once: wait twice as long for the
      // next one (burst_budget.hpp).
      const bool failed_probe = probed_at_ != 0 && now - probed_at_ < 2 * p_.tau_ns;
      timeout_ns_ = failed_probe ? std::min(2 * resume_timeout(), std::max(p_.max_resume_after_ns, p_.resume_after_ns))
                                 : p_.resume_after_ns;
      probed_at_ = 0;
      break;
    }
    case BurstAction::kResume:
      timeout_ns_ = 0;
      probed_at_ = 0;
      break;
    case BurstAction::kProbe:
      share_ = std::min(share_, p_.resume_share);
      fast_share_ = std::min(fast_share_, p_.fast_resume_share);
      probed_at_ = now;
      break;
  }
  state_ = t.next;
}

}  // namespace nvtaskset::roles
