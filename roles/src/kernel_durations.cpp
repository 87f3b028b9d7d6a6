// SPDX-License-Identifier: Apache-2.0
// Learned kernel durations (kernel_durations.hpp).
#include "nvtaskset/kernel_durations.hpp"

#include <algorithm>

namespace nvtaskset::roles {

const KernelDurations::Entry* KernelDurations::find(std::uint64_t key) const noexcept {
  for (unsigned i = 0; i < kProbe; ++i) {
    const Entry& e = e_[(key + i) % kSlots];
    if (e.key == key) return &e;
    if (e.key == 0) break;
  }
  return nullptr;
}

std::uint64_t KernelDurations::estimate(std::uint64_t key, std::uint64_t unknown) const noexcept {
  const Entry* e = find(key);
  return e != nullptr ? e->ns : unknown;
}

unsigned KernelDurations::samples(std::uint64_t key) const noexcept {
  const Entry* e = find(key);
  return e != nullptr ? e->samples : 0;
}

template <class Merge>
void KernelDurations::put(std::uint64_t key, std::uint64_t sample_ns, Merge merge) noexcept {
  sample_ns = std::min<std::uint64_t>(sample_ns, 1'000'000'000);  // a second: not a kernel, a stall
  for (unsigned i = 0; i < kProbe; ++i) {
    Entry& e = e_[(key + i) % kSlots];
    if (e.key == key) {
      e.ns = merge(e.ns, sample_ns, e.samples);
      if (e.samples != ~0u) ++e.samples;
      return;
    }
    if (e.key == 0) {
      e = {key, sample_ns, 1};
      return;
    }
  }
}

void KernelDurations::learn(std::uint64_t key, std::uint64_t sample_ns) noexcept {
  put(key, sample_ns, [](std::uint64_t old, std::uint64_t s, unsigned n) noexcept {
    return n < kFirst ? std::min(old, s) : old - old / 4 + s / 4;
  });
}

void KernelDurations::learn_least(std::uint64_t key, std::uint64_t sample_ns) noexcept {
  put(key, sample_ns, [](std::uint64_t old, std::uint64_t s, unsigned) noexcept { return std::min(old, s); });
}

}  // namespace nvtaskset::roles
