// SPDX-License-Identifier: Apache-2.0
// Thread-block-cluster recorder used by calibration (topology/src/calibration.cpp).
//
// Launched with cuLaunchKernelEx and a 1-D cluster dimension C. All blocks of
// one cluster run on one GPC (CUDA programming guide, "Thread Block
// Clusters"), so SMs that share a cluster share a GPC. The host gives each
// block so much dynamic shared memory that only one block fits on an SM, so
// the C blocks of a cluster sit on C distinct SMs of the GPC.
//
// Generated into PTX by regen.sh; the build never needs nvcc.

// Layout of `out` (32-bit words), shared with calibration.cpp: for block b,
//   out[2b]     = %smid + 1         (0 = the block never ran)
//   out[2b + 1] = %clusterid.x + 1
extern "C" __global__ void nvtaskset_record_cluster(unsigned int* out, unsigned long long spin_ns) {
  if (threadIdx.x != 0) return;
  unsigned int smid, cluster;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cluster));
  out[2u * blockIdx.x] = smid + 1u;
  out[2u * blockIdx.x + 1u] = cluster + 1u;
  // Stay resident a while so the clusters of one wave spread over the GPCs.
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < spin_ns);
}
