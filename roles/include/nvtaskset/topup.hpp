// SPDX-License-Identifier: Apache-2.0
// The top-up: TPCs that pay a saturated latency-critical task back for the
// memory system.
//
// A saturated LC task (its burst stopped: a closed loop) runs on its
// reservation next to BE tasks on their floors. The SMs are all it is fenced
// from: through DRAM and L2 it still runs slower than alone there, and the BE
// task's TPC count is its bandwidth (docs/hardware.md); a few more TPCs for
// the LC task and a few fewer for the BE task pay that back (measured:
// docs/design.md, "Roles", "The numbers, measured"). How many a task needs
// depends on both tasks, so the controller measures it: reference probes (BE
// tasks hold, the LC task runs on its reservation alone) learn each of its
// kernels' durations alone; between them it compares the durations it sees
// with those, and grows its top-up while its slow launches are slower than
// alone, shrinks it while even they are clearly faster.
#pragma once

#include <cstdint>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/kernel_durations.hpp"
#include "nvtaskset/partition.hpp"

namespace nvtaskset::roles {

struct TopUpParams {
  // A decision from at least min_samples timed launches: to grow, as soon
  // as they are timed; to shrink (or stay), over a window of decide_ns.
  std::uint64_t decide_ns = 100'000'000;
  unsigned min_samples = 3;
  // Of the ratios of a window's launches to their durations alone, the one
  // at this quantile decides: the slow launches, the tail (the issue's
  // target is a p99), not the average, which stays below 1 while the p99 is
  // above. By
  // nearest rank: of a window's 12-20 launches, the slowest but one or two,
  // so that one outlier does not decide.
  double quantile = 0.9;
  double grow_above = 1.0;    // more TPCs while that ratio is above this
  // Fewer while below this. The 0.9 quantile of a window swings with the
  // training's phases; shrinking only after shrink_after windows (below)
  // stops the swing, and the band's floor is the training's.
  double shrink_below = 0.85;
  // Shrinking, to where the heaviest of those windows would be at this
  // ratio if the task's time grew in proportion to its lost TPCs (at least
  // `step`): one decision, as growing is, from the top-up's start at its
  // most (below) to what the task needs.
  double shrink_to = 0.95;
  // ... in this many full windows in a row. A training step (about 110 ms for
  // GPT-2-medium on an H200) is as long as a window, and its phases draw on
  // DRAM and L2 unlike, so a top-up that shrank after one window grew back a
  // few hundred ms later, and each time it grew two of the task's launches
  // had been slow first. Over half a second (about four steps) the top-up is
  // sized for the heaviest phase, as a static split is.
  unsigned shrink_after = 5;
  // TPCs a decision: at least `step`, and growing, as many as would pay the
  // ratio back if the task's time fell in proportion to its TPCs ((reserved
  // + top-up) x (ratio - 1), rounded up to a TPC pair): one or two
  // decisions reach the top-up instead of one step of 2 per 100 ms, which
  // left its slow transient in every window's tail.
  // These values (measured: docs/design.md, "Roles", "The numbers, measured").
  unsigned step = 2;
  std::uint64_t probe_every_ns = 4'000'000'000;  // a reference probe this often while saturated
  // ... or this soon after one that timed nothing (else a window may run
  // with no top-up at all).
  std::uint64_t probe_retry_ns = 500'000'000;
  // Launches made this soon after a probe began may wait behind BE work
  // queued before it (the give-back: 5-13 ms, docs/results.md): not counted.
  std::uint64_t probe_settle_ns = 15'000'000;
  std::uint64_t probe_max_ns = 80'000'000;  // a probe ends by then,
  unsigned probe_samples = 3;               // or once this many launches were timed
};

// The controller's top-up, pure: the LC shim's controller thread feeds it
// its state and its launches' durations, and applies what it says.
class TopUp {
 public:
  static constexpr unsigned kWindow = 64;  // ratios kept per decision window
  explicit TopUp(TopUpParams p = {}) noexcept : p_(p) {}
  // At most this many TPCs (the controller's bound: see choose_topup), for a
  // reservation of `reserved` TPCs whose identity is `reservation` (any
  // number that changes when its TPCs do; 0: not known). When it changes,
  // the durations alone measured on the old one are forgotten (forget()).
  void set_max(unsigned max_tpcs, unsigned reserved = 0, std::uint64_t reservation = 0) noexcept;
  // A pass of the controller at `now`: the task saturated or not.
  void advance(std::uint64_t now, bool saturated) noexcept;
  // A reference probe: BE tasks hold, the task runs on its reservation alone.
  bool probing() const noexcept { return mode_ == Mode::kProbe; }
  // The TPCs to take beyond the reservation now (none while probing or not saturated).
  unsigned tpcs() const noexcept { return mode_ == Mode::kRun ? tpcs_ : 0; }
  // Changes whenever probing() or tpcs() does: a launch made under another
  // generation is not a sample of this one.
  std::uint64_t generation() const noexcept { return gen_; }
  // A launch of `key` made at `launched_ns` under generation `gen` ran `ns`.
  void sample(std::uint64_t key, std::uint64_t ns, std::uint64_t gen, std::uint64_t launched_ns) noexcept;
  // The ratio of the last decision (0: none yet).
  double last_ratio() const noexcept { return last_ratio_; }
  // Its durations alone are no longer true (its reservation changed).
  void forget() noexcept;
  std::uint64_t probes() const noexcept { return probes_; }
  // Whether the last probe timed the task alone (else no decision is made).
  bool timed_alone() const noexcept { return timed_alone_; }

 private:
  enum class Mode { kOff, kProbe, kRun };
  void start_window(std::uint64_t now) noexcept {
    decided_at_ = now;
    n_ = 0;
  }
  TopUpParams p_;
  Mode mode_ = Mode::kOff;
  unsigned max_ = 0, tpcs_ = 0, reserved_ = 0;
  unsigned below_ = 0;   // full windows in a row below shrink_below
  double below_max_ = 0;  // the highest ratio of those
  bool ever_ran_ = false;  // a top-up was applied once: the first starts at its most
  std::uint64_t reservation_ = 0;
  std::uint64_t gen_ = 1;
  std::uint64_t probe_start_ = 0, probed_at_ = 0, probes_ = 0;
  unsigned probe_n_ = 0;
  bool timed_alone_ = false;  // the last probe timed something
  bool ever_probed_ = false;
  std::uint64_t decided_at_ = 0;
  double ratios_[kWindow]{};
  unsigned n_ = 0;
  double last_ratio_ = 0;
  // Durations alone on the reservation: the least a probe saw, by kernel key.
  KernelDurations alone_;
};

// The TPCs of a top-up: `n` of `free` (the burst set without the
// reservation), those that host no thread-block cluster first (a BE
// task's clusters cannot use them anyway), then those of GPCs the
// reservation already takes TPCs of, then whole GPCs in the map's order
// (the BE task's floor keeps its GPCs whole as long as it can); mask bit
// order within each. Fewer when `free` has fewer.
Bits128 choose_topup(const Bits128& free, const Bits128& reserved, const ClusterMap* map, unsigned n) noexcept;

}  // namespace nvtaskset::roles
