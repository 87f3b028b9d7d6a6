// SPDX-License-Identifier: Apache-2.0
// Block-placement recorder used by `nvtaskset --verify` (nvtaskset/src/verify.cpp,
// through topology/src/block_probe.cpp).
//
// Every block writes the %smid it ran on, plus one, into out[blockIdx.x] (0
// means the block never ran), then stays busy for `spin_ns` nanoseconds. The
// host launches it as calibration launches its SM-ID kernel (smid.cu): with so
// much dynamic shared memory that one block fits on an SM, so the first wave
// of a grid of at least sm_count blocks puts a block on every SM the TPC mask
// enables. Unlike smid.cu it keeps one record per block, so a check can say
// how many blocks ran outside a partition, not only on which SMs.
//
// Generated into PTX by regen.sh; the build never needs nvcc.

// Layout of `out` (32-bit words): out[b] = %smid of block b, plus one.
extern "C" __global__ void nvtaskset_record_block_smid(unsigned int* out, unsigned long long spin_ns) {
  if (threadIdx.x != 0) return;
  unsigned int smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  out[blockIdx.x] = smid + 1u;
  // %globaltimer is in nanoseconds on every GPU since Volta.
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < spin_ns);
}
