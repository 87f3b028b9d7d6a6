// SPDX-License-Identifier: Apache-2.0
// The one seqlock reader. Writers make a sequence counter odd, store the
// fields, and make it even again (release); a reader copies the fields
// between two loads of the counter and keeps the copy only when the counter
// was even and unchanged around it.
//
// Made for the launch callback's hot path: header-only, no allocation, no
// lock, no system call, no locked instruction (loads and fences only). It
// never spins without bound: a read retries only while writers publish during
// it (nanoseconds) or the counter stays odd (a writer died mid-write, or the
// memory was scribbled over), and gives up after `tries` attempts, so the
// caller can fail closed. It never returns a torn copy.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>

namespace nvtaskset::seqlock {

// Attempts a reader makes before it gives up (the control region's readers,
// the shim's copies, beacons, calibration's mask).
inline constexpr int kReadTries = 64;

// A consistent copy of data whose writer publishes into one of several
// copies and says which (a double buffer): `pick()` returns the copy to read,
// anew on each attempt, as an object with an unsigned atomic `seq` counter;
// `copy(obj)` loads its fields into the caller's locals (relaxed atomic
// loads; it may run several times, and only the last run counts). True when
// a copy was taken with the counter even and unchanged around it; false after
// `tries` attempts (the locals then hold no consistent copy and must not be
// used).
template <class Pick, class Copy>
[[nodiscard]] inline bool read_picked(Pick&& pick, Copy&& copy, int tries = kReadTries) noexcept {
  for (int i = 0; i < tries; ++i) {
    const auto& obj = pick();
    const auto s1 = obj.seq.load(std::memory_order_acquire);
    if (s1 & 1) continue;
    copy(obj);
    // Orders the relaxed loads of copy() before the second load of the counter.
    std::atomic_thread_fence(std::memory_order_acquire);
    if (obj.seq.load(std::memory_order_relaxed) == s1) return true;
  }
  return false;
}

// The same for one object guarded by `seq`: `copy()` loads its fields.
template <std::unsigned_integral T, class Copy>
[[nodiscard]] inline bool read(const std::atomic<T>& seq, Copy&& copy, int tries = kReadTries) noexcept {
  struct One {
    const std::atomic<T>& seq;
  };
  return read_picked([&seq]() noexcept { return One{seq}; }, [&copy](const One&) noexcept { copy(); }, tries);
}

}  // namespace nvtaskset::seqlock
