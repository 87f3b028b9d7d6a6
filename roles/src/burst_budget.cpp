// SPDX-License-Identifier: Apache-2.0
// The latency-critical controller's burst budget (burst_budget.hpp).
#include "nvtaskset/burst_budget.hpp"

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
  if (busy) {
    if (busy_since_ == 0) busy_since_ = now - dt;
    const bool fast = p_.fast_tau_ns != 0 && fast_share_ > p_.fast_stop_share;
    if (allowed_ && (share_ > p_.stop_share || fast || now - busy_since_ >= p_.max_burst_ns)) {
      allowed_ = false;
      stopped_at_ = now;
      ++saturations_;
      // A probe the task's load ended at once: wait twice as long for the
      // next one (burst_budget.hpp).
      const bool failed_probe = probed_at_ != 0 && now - probed_at_ < 2 * p_.tau_ns;
      timeout_ns_ = failed_probe ? std::min(2 * resume_timeout(), std::max(p_.max_resume_after_ns, p_.resume_after_ns))
                                 : p_.resume_after_ns;
      probed_at_ = 0;
    }
  } else {
    busy_since_ = 0;
    // Both shares below the resume share: a closed loop the fast share
    // stopped has a slow share still below it (0.32 after 0.39 s).
    if (!allowed_ && share_ < p_.resume_share && (p_.fast_tau_ns == 0 || fast_share_ < p_.resume_share)) {
      allowed_ = true;
      timeout_ns_ = 0;
      probed_at_ = 0;
    } else if (!allowed_ && p_.resume_after_ns != 0 && now - stopped_at_ >= resume_timeout()) {
      // Stopped long enough: try again at the resume share (burst_budget.hpp says why).
      allowed_ = true;
      share_ = std::min(share_, p_.resume_share);
      fast_share_ = std::min(fast_share_, p_.fast_resume_share);
      probed_at_ = now;
    }
  }
}

}  // namespace nvtaskset::roles
