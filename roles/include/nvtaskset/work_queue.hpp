// SPDX-License-Identifier: Apache-2.0
// The best-effort queue bounded in work (NVTASKSET_BE_WORK_US).
//
// What an LC request waits behind is the BE work already queued when it
// arrives (docs/runs.md, "Give-back time of the roles"). A bound in
// launches cannot tell GPT-2-medium's 10-us element-wise kernels from its
// 1-ms optimizer and LM-head kernels: 4 launches starve the GPU between the
// short ones (the training lost 22% next to an idle LC task on an H100) and
// stack up several ms of the long ones. So the shim learns each kernel's
// duration from its own launches, on the GPU's clock (the time between the
// events recorded after a launch and after the one before it, when it was
// queued behind that one), and keeps at most a bound of that work queued.
#pragma once

#include <cstdint>

#include "nvtaskset/kernel_durations.hpp"

namespace nvtaskset::roles {

// The queue itself: launches in the order they were queued, each with the
// work it was counted as. The shim records one event per launch in slot
// `next_slot()` and asks this class what to do; everything here is pure, so
// that tests drive it with recorded traces.
class WorkQueue {
 public:
  static constexpr unsigned kRing = 64;
  // At most `bound_ns` of estimated work queued behind the oldest launch (a
  // launch of more goes when nothing else is queued), and at most
  // `max_launches` (1 to kRing - 1) launches.
  WorkQueue(std::uint64_t bound_ns, unsigned max_launches) noexcept;

  unsigned size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  bool full() const noexcept { return size_ >= max_; }
  std::uint64_t queued_ns() const noexcept { return queued_ns_; }
  unsigned oldest() const noexcept { return static_cast<unsigned>(head_ % kRing); }
  unsigned next_slot() const noexcept { return static_cast<unsigned>((head_ + size_) % kRing); }

  // A launch recorded in next_slot(). It was queued behind the one before
  // it when that one is still queued and nothing went unrecorded between.
  void push(std::uint64_t key) noexcept;
  // Forgets every queued launch, keeping what it learned: in a forked
  // child, whose events are not the parent's.
  void clear() noexcept {
    head_ = 0;
    size_ = 0;
    queued_ns_ = 0;
    chained_ = false;
  }
  // A launch that could not be recorded: it is not counted, and the next
  // one's time since the one before is not its duration.
  void gap() noexcept { chained_ = false; }
  // Whether the oldest launch's duration can be learned when it completes:
  // the time from the previous launch's event (slot prev_slot()) to its own.
  // Only a launch queued behind the one before it: that one left the queue
  // first, so prev_slot() holds its completion.
  bool wants_sample() const noexcept { return size_ > 0 && slots_[oldest()].behind; }
  unsigned prev_slot() const noexcept { return static_cast<unsigned>((head_ + kRing - 1) % kRing); }
  // The oldest launch completed; `elapsed_ns` is what wants_sample() asked
  // for (ignored when it did not ask, or when it could not be read: < 0).
  void pop(std::int64_t elapsed_ns) noexcept;
  // Whether a launch of `key` may join the queue now; else the task waits
  // for the oldest launch first. The oldest is running, or next to: an LC
  // request waits out what is left of it whatever the bound, so the bound
  // counts the work queued behind it, this launch's included. Asked before
  // the launch: checked after it, each launch left one more queued past the
  // bound; counting the oldest too, every short kernel behind a long one
  // waited for it (measured: docs/design.md, "Roles", "The numbers, measured").
  bool fits(std::uint64_t key) const noexcept {
    if (size_ == 0) return true;
    if (size_ >= max_) return false;
    return queued_ns_ - slots_[oldest()].est + durations_.estimate(key, bound_ns_) <= bound_ns_;
  }

  const KernelDurations& durations() const noexcept { return durations_; }
  KernelDurations& durations() noexcept { return durations_; }

 private:
  struct Slot {
    std::uint64_t key = 0, est = 0;
    bool behind = false;
  };
  std::uint64_t bound_ns_;
  unsigned max_;
  std::uint64_t head_ = 0;  // sequence number of the oldest queued launch
  unsigned size_ = 0;
  std::uint64_t queued_ns_ = 0;
  bool chained_ = false;  // the launch before the next one was recorded
  Slot slots_[kRing]{};
  KernelDurations durations_;
};

}  // namespace nvtaskset::roles
