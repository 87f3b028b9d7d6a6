// SPDX-License-Identifier: Apache-2.0
// Kernels' durations as a best-effort task learns them from its own
// launches: the work bound, the borrow limit and the gates use them. Pure.
#pragma once

#include <cstdint>

namespace nvtaskset::roles {

// A kernel as the work bound knows it: its function and grid size (the same
// kernel over another tensor size takes another time). Never 0.
inline std::uint64_t kernel_key(const void* fn, std::uint64_t blocks) noexcept {
  std::uint64_t k = reinterpret_cast<std::uintptr_t>(fn) * 0x9E3779B97F4A7C15ull ^ (blocks + 0x632BE59BD9B4E019ull);
  k ^= k >> 29;
  return k != 0 ? k : 1;
}

// Learned durations, by kernel key: a moving average (a quarter weight per
// sample, the first sample as it is). A fixed table (no allocation on the
// launch path); a key that finds no room is not learned.
class KernelDurations {
 public:
  static constexpr unsigned kSlots = 4096, kProbe = 16;
  // Its estimate in ns, or `unknown` where it has none.
  std::uint64_t estimate(std::uint64_t key, std::uint64_t unknown) const noexcept;
  // How many samples the estimate is of (0: none).
  unsigned samples(std::uint64_t key) const noexcept;
  // The least of the first kFirst samples, then a moving average (a
  // quarter weight each). The first launch of a kernel loads its module
  // (CUDA's lazy loading, the default), so its sample is longer than the
  // kernel, and a moving average re-timed once in 64 launches takes dozens
  // of steps to forget it (measured: docs/design.md, "Roles", "The numbers, measured").
  static constexpr unsigned kFirst = 2;
  void learn(std::uint64_t key, std::uint64_t sample_ns) noexcept;
  // The least sample instead of an average (durations alone, TopUp).
  void learn_least(std::uint64_t key, std::uint64_t sample_ns) noexcept;
  void clear() noexcept {
    for (Entry& e : e_) e = {};
  }

 private:
  template <class Merge>
  void put(std::uint64_t key, std::uint64_t sample_ns, Merge merge) noexcept;
  struct Entry {
    std::uint64_t key = 0;
    std::uint64_t ns = 0;
    unsigned samples = 0;
  };
  // The entry of `key`, or nullptr where it has none.
  const Entry* find(std::uint64_t key) const noexcept;
  Entry e_[kSlots]{};
};

}  // namespace nvtaskset::roles
