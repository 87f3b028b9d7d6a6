// SPDX-License-Identifier: Apache-2.0
// The latency-critical controller's top-up (topup.hpp).
#include "nvtaskset/topup.hpp"

#include <algorithm>
#include <cmath>

namespace nvtaskset::roles {

void TopUp::set_max(unsigned max_tpcs, unsigned reserved, std::uint64_t reservation) noexcept {
  reserved_ = reserved;
  if (reservation != 0) {
    if (reservation_ != 0 && reservation != reservation_) forget();
    reservation_ = reservation;
  }
  if (max_ == max_tpcs) return;
  max_ = max_tpcs;
  if (tpcs_ > max_) {
    tpcs_ = max_;
    if (mode_ == Mode::kRun) ++gen_;
  }
}

void TopUp::forget() noexcept {
  alone_.clear();
  ever_probed_ = false;
  timed_alone_ = false;
  n_ = 0;
  below_ = 0;
}

void TopUp::advance(std::uint64_t now, bool saturated) noexcept {
  if (!saturated) {
    // Bursting or idle: the top-up waits, at the size it had, for the next
    // saturation (a closed loop's probes of the burst come and go).
    if (mode_ != Mode::kOff) {
      mode_ = Mode::kOff;
      ++gen_;
    }
    below_ = 0;
    return;
  }
  if (mode_ == Mode::kProbe) {
    if (probe_n_ >= p_.probe_samples || now - probe_start_ >= p_.probe_max_ns) {
      mode_ = Mode::kRun;
      ++gen_;
      probed_at_ = now;
      timed_alone_ = probe_n_ > 0;
      if (!ever_ran_) {
        // Its first top-up starts at its most, and shrinks to what it needs:
        // the task is protected first (grown from none, its first launches
        // after each stop were a closed loop's tail: docs/design.md, "The
        // numbers, measured").
        ever_ran_ = true;
        tpcs_ = max_;
      }
      start_window(now);
    }
    return;
  }
  if (!ever_probed_ || now - probed_at_ >= (timed_alone_ ? p_.probe_every_ns : p_.probe_retry_ns)) {
    // Durations alone on the reservation: learned anew, so that they follow
    // the clocks and the task's work; a probe that times nothing leaves none,
    // and no decision is made until the next one.
    mode_ = Mode::kProbe;
    ++gen_;
    ++probes_;
    ever_probed_ = true;
    probe_start_ = now;
    probe_n_ = 0;
    below_ = 0;
    alone_.clear();
    return;
  }
  if (mode_ == Mode::kOff) {
    mode_ = Mode::kRun;
    ++gen_;
    start_window(now);
    return;
  }
  // Growing comes as soon as two of min_samples timed launches are slow, shrinking
  // only after shrink_after whole windows: the task is protected first, and
  // the top-up does not swing. After each stop of the burst the task starts on the
  // top-up it last had, or none; a window at the wrong size was a closed
  // loop's p99 (docs/design.md, "The numbers, measured").
  const bool full = now - decided_at_ >= p_.decide_ns;
  if (n_ < p_.min_samples) {
    if (full && n_ == 0) decided_at_ = now;  // nothing timed: wait a whole window again
    return;
  }
  std::sort(ratios_, ratios_ + n_);
  // Nearest rank: the ceil(q n)-th smallest (of 20 at 0.9, the slowest but two).
  const unsigned rank = static_cast<unsigned>(std::ceil(p_.quantile * static_cast<double>(n_)));
  const unsigned at = std::min(n_ - 1, rank > 0 ? rank - 1 : 0);
  // Before the window is over, two slow launches are needed, so that one
  // outlier does not decide.
  const double r = full ? ratios_[at] : ratios_[n_ - 2];
  if (r <= p_.grow_above && !full) return;
  last_ratio_ = r;
  const unsigned before = tpcs_;
  if (r > p_.grow_above) {
    const double need = static_cast<double>(reserved_ + tpcs_) * (r - 1.0);
    unsigned add = std::max(p_.step, static_cast<unsigned>(std::ceil(need)));
    add += add % 2;  // an even number, as the step
    tpcs_ = std::min(max_, tpcs_ + add);
    below_ = 0;
  } else if (r < p_.shrink_below) {
    below_max_ = below_ == 0 ? r : std::max(below_max_, r);
    if (++below_ >= p_.shrink_after) {
      unsigned cut = p_.step;
      if (reserved_ > 0) {
        // To where the heaviest of those windows would run at shrink_to.
        const double total = static_cast<double>(reserved_ + tpcs_);
        const double want = std::ceil(total * below_max_ / p_.shrink_to);
        const unsigned by = want < total ? static_cast<unsigned>(total - want) : 0;
        cut = std::max(p_.step, by - by % 2);
      }
      tpcs_ = tpcs_ > cut ? tpcs_ - cut : 0;
      below_ = 0;
    }
  } else {
    below_ = 0;
  }
  if (tpcs_ != before) ++gen_;
  start_window(now);
}

void TopUp::sample(std::uint64_t key, std::uint64_t ns, std::uint64_t gen, std::uint64_t launched_ns) noexcept {
  if (gen != gen_ || ns == 0) return;
  if (mode_ == Mode::kProbe) {
    if (launched_ns < probe_start_ + p_.probe_settle_ns) return;
    alone_.learn_least(key, ns);
    ++probe_n_;
    return;
  }
  if (mode_ != Mode::kRun || n_ >= kWindow) return;
  const std::uint64_t alone = alone_.estimate(key, 0);
  if (alone == 0) return;  // not timed alone: no measure of it
  ratios_[n_++] = static_cast<double>(ns) / static_cast<double>(alone);
}

namespace {

Bits128 take_bits(Bits128 from, unsigned& n) noexcept {
  Bits128 out;
  for (unsigned b = 0; b < 128 && n > 0; ++b)
    if (from.test(b)) {
      out.set(b);
      --n;
    }
  return out;
}

}  // namespace

Bits128 choose_topup(const Bits128& free, const Bits128& reserved, const ClusterMap* map, unsigned n) noexcept {
  Bits128 out;
  if (map == nullptr) return take_bits(free, n);
  out = out | take_bits(free & ~map->capable.bits, n);
  for (const ClusterMap::Gpc& g : map->gpcs)
    if ((g.capable.bits & reserved).any()) out = out | take_bits(free & g.capable.bits & ~out, n);
  for (const ClusterMap::Gpc& g : map->gpcs) out = out | take_bits(free & g.capable.bits & ~out, n);
  out = out | take_bits(free & ~out, n);
  return out;
}

}  // namespace nvtaskset::roles
