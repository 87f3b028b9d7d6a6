// SPDX-License-Identifier: Apache-2.0
// A stand-in for bench/cuda/first_kernel.cu (which needs a GPU), for the CPU
// test of bench_startup: prints the same line, its "kernel" starting now.
#include <time.h>

#include <cstdio>

namespace {
unsigned long long mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<unsigned long long>(ts.tv_sec) * 1000000000ull + static_cast<unsigned long long>(ts.tv_nsec);
}
}  // namespace

int main() {
  const unsigned long long main_ns = mono_ns();
  const unsigned long long kernel_ns = mono_ns();
  const unsigned long long sync_ns = mono_ns();
  std::printf("first_kernel main_ns %llu kernel_ns %llu sync_ns %llu halfwidth_ns 0 ok 1\n", main_ns, kernel_ns,
              sync_ns);
  return 0;
}
