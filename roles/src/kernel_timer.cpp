// SPDX-License-Identifier: Apache-2.0
// Which launches a best-effort task times (kernel_timer.hpp).
#include "nvtaskset/kernel_timer.hpp"

namespace nvtaskset::roles {

int KernelTimer::start(std::uint64_t key) noexcept {
  const bool due = ++launches_ % kEvery == 0;
  int free = -1;
  for (unsigned i = 0; i < kPairs; ++i) {
    if (pairs_[i].state == State::kFree) {
      if (free < 0) free = static_cast<int>(i);
    } else if (pairs_[i].key == key && !due) {
      return -1;  // being timed now
    }
  }
  if (free < 0) return -1;
  if (!due && durations_.samples(key) >= KernelDurations::kFirst) return -1;
  pairs_[free] = {key, State::kStarted};
  return free;
}

void KernelTimer::ended(int pair, bool ok) noexcept {
  if (pair < 0 || pair >= static_cast<int>(kPairs) || pairs_[pair].state != State::kStarted) return;
  if (ok) pairs_[pair].state = State::kRecorded;
  else pairs_[pair] = {};
}

void KernelTimer::finish(int pair, std::int64_t elapsed_ns) noexcept {
  if (!pending(pair)) return;
  if (elapsed_ns >= 0) durations_.learn(pairs_[pair].key, static_cast<std::uint64_t>(elapsed_ns));
  pairs_[pair] = {};
}

}  // namespace nvtaskset::roles
