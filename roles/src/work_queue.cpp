// SPDX-License-Identifier: Apache-2.0
// The best-effort queue bounded in work (work_queue.hpp).
#include "nvtaskset/work_queue.hpp"

#include <algorithm>

namespace nvtaskset::roles {

WorkQueue::WorkQueue(std::uint64_t bound_ns, unsigned max_launches) noexcept
    : bound_ns_(bound_ns), max_(std::clamp(max_launches, 1u, kRing - 1)) {}

void WorkQueue::push(std::uint64_t key) noexcept {
  Slot& s = slots_[next_slot()];
  s.key = key;
  // Not learned yet: counted as the whole bound, so an unknown kernel is
  // queued behind nothing else (the first training step runs shallow once).
  s.est = durations_.estimate(key, bound_ns_);
  s.behind = chained_ && size_ > 0;
  queued_ns_ += s.est;
  ++size_;
  chained_ = true;
}

void WorkQueue::pop(std::int64_t elapsed_ns) noexcept {
  if (size_ == 0) return;
  const Slot& s = slots_[oldest()];
  if (wants_sample() && elapsed_ns >= 0) durations_.learn(s.key, static_cast<std::uint64_t>(elapsed_ns));
  queued_ns_ -= std::min(queued_ns_, s.est);
  ++head_;
  --size_;
}

}  // namespace nvtaskset::roles
