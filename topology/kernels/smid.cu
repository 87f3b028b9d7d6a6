// SPDX-License-Identifier: Apache-2.0
// SM-ID recorder used by calibration (topology/src/calibration.cpp).
//
// Every block records the %smid it ran on into a bitmap, then stays busy for
// `spin_ns` nanoseconds. The host launches it with so much dynamic shared
// memory that only one block fits on an SM: the first wave of a grid of at
// least sm_count blocks then puts one block on EVERY enabled SM, so an SM
// missing from the bitmap is an SM the TPC mask disabled (docs/hardware.md: "Safe
// discovery").
//
// Generated into PTX by regen.sh; the build never needs nvcc.

// Layout of `out` (32-bit words), shared with calibration.cpp:
//   [0, 32)  bitmap of SM IDs 0..1023
//   32       max %nsmid seen (atomicMax)
//   33       set to 1 when some %smid was >= 1024 (does not fit the bitmap)
extern "C" __global__ void nvtaskset_record_smid(unsigned int* out, unsigned long long spin_ns) {
  if (threadIdx.x != 0) return;
  unsigned int smid, nsmid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  asm volatile("mov.u32 %0, %%nsmid;" : "=r"(nsmid));
  if (smid < 1024u) {
    atomicOr(&out[smid >> 5], 1u << (smid & 31u));
  } else {
    atomicOr(&out[33], 1u);
  }
  atomicMax(&out[32], nsmid);
  // %globaltimer is in nanoseconds on every GPU since Volta.
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < spin_ns);
}
