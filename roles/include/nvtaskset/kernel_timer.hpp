// SPDX-License-Identifier: Apache-2.0
// Best-effort kernels too long to borrow the reservations
// (NVTASKSET_BE_BORROW_US).
//
// While every LC task is idle a BE task borrows the reservations, and an LC
// request that arrives then waits on its reservation for the BE kernel
// running there (and the rest of its gate's group) to end: a training step's
// few long kernels put milliseconds of BE work in the way of some arrivals
// (measured: docs/design.md, "Roles", "The numbers, measured"). So a kernel the task's
// own launches timed at the limit or more keeps off the reservations even
// while every LC task is idle, and the short ones borrow them. The same
// durations space the task's gates (GateLane). Pure: the shim records the
// events and asks this class which launch to time, when to read them, and
// what it learned.
#pragma once

#include <cstdint>

#include "nvtaskset/kernel_durations.hpp"

namespace nvtaskset::roles {

class KernelTimer {
 public:
  static constexpr unsigned kPairs = 4;   // launches timed at once (two events each)
  static constexpr unsigned kEvery = 64;  // a kernel already timed is timed again once in this many launches
  // The pending pairs are read once in this many launches, not at every
  // one: their end events wait behind the task's queue (64 launches), so
  // read at each launch they cost 1-2 event queries a launch for nothing
  // (measured: docs/design.md, "Roles", "The numbers, measured").
  static constexpr unsigned kPollEvery = 16;
  // `limit_ns` 0: every kernel borrows (the durations still space the gates).
  explicit KernelTimer(std::uint64_t limit_ns) noexcept : limit_ns_(limit_ns) {}

  std::uint64_t limit_ns() const noexcept { return limit_ns_; }
  // Whether a launch of `key` may borrow the reservations: no limit, not
  // timed yet, or timed shorter than the limit (a moving average).
  bool borrows(std::uint64_t key) const noexcept {
    return limit_ns_ == 0 || durations_.estimate(key, 0) < limit_ns_;
  }
  // Before a launch: whether the pending pairs are to be read now (once in
  // kPollEvery launches while any is pending).
  bool poll_due() noexcept {
    if (!any_pending()) return false;
    return ++since_poll_ % kPollEvery == 0;
  }
  // Before a launch of `key`: the pair of events to time it with (its
  // start event is recorded next, after any gate), or -1: a kernel timed
  // fewer than KernelDurations::kFirst times and not being timed now, or
  // every kEvery-th launch, while a pair is free.
  int start(std::uint64_t key) noexcept;
  // After the launch: its end event was recorded (`ok`), or it could not
  // be, or the launch failed: the pair is free again, nothing learned.
  void ended(int pair, bool ok) noexcept;
  // Whether `pair` waits for its end event to complete.
  bool pending(int pair) const noexcept {
    return pair >= 0 && pair < static_cast<int>(kPairs) && pairs_[pair].state == State::kRecorded;
  }
  bool any_pending() const noexcept {
    for (const Pair& p : pairs_)
      if (p.state == State::kRecorded) return true;
    return false;
  }
  // The launch timed with `pair` completed: `elapsed_ns` from its start
  // event to its end event (< 0: could not be read; nothing learned).
  void finish(int pair, std::int64_t elapsed_ns) noexcept;
  // Forgets the pairs (a forked child: the events are the parent's),
  // keeping what was learned.
  void drop_pairs() noexcept {
    for (Pair& p : pairs_) p = {};
  }
  const KernelDurations& durations() const noexcept { return durations_; }

 private:
  enum class State : std::uint8_t { kFree, kStarted, kRecorded };
  struct Pair {
    std::uint64_t key = 0;
    State state = State::kFree;
  };
  Pair pairs_[kPairs]{};
  KernelDurations durations_;
  std::uint64_t limit_ns_;
  std::uint64_t launches_ = 0;
  unsigned since_poll_ = 0;
};

}  // namespace nvtaskset::roles
