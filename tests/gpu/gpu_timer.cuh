// SPDX-License-Identifier: Apache-2.0
// The GPU's global timer and a kernel that spins on it for a given time, for
// the probes in tests/gpu that need work of a known length.
#pragma once

__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_for(unsigned long long ns) {
  const unsigned long long start = gtimer();
  while (gtimer() - start < ns) {
  }
}
