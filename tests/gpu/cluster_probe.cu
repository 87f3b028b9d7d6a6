// SPDX-License-Identifier: Apache-2.0
// Launches a thread-block-cluster kernel of a given cluster size (one block
// per SM) and reports the SMs/TPCs its blocks ran on. Under a GPC partition
// (nvtaskset -g) a kernel with cluster size C can run only if the partition
// holds C SMs of one GPC (docs/hardware.md); this checks that the largest size the
// GPC supports still runs.
//   cluster_probe --size C [--clusters N]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

__global__ void record(unsigned* out) {
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    out[blockIdx.x] = smid;
  }
}

int main(int argc, char** argv) {
  int size = 2, clusters = 64;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--size") size = std::atoi(argv[++i]);
    else if (a == "--clusters") clusters = std::atoi(argv[++i]);
  }
  if (size > 8 && cudaFuncSetAttribute(record, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    std::printf("cluster_probe: non-portable cluster sizes refused\n");
    return 2;
  }
  // One block per SM: ask for most of the shared memory.
  int smem = 0;
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  cudaFuncSetAttribute(record, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const int blocks = size * clusters;
  unsigned* d = nullptr;
  cudaMalloc(&d, sizeof(unsigned) * blocks);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = size;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&cfg, record, d);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("cluster_probe: size %d failed: %s\n", size, cudaGetErrorString(e));
    return 3;
  }
  std::vector<unsigned> h(blocks);
  cudaMemcpy(h.data(), d, sizeof(unsigned) * blocks, cudaMemcpyDeviceToHost);
  std::set<unsigned> tpcs;
  for (unsigned s : h) tpcs.insert(s / 2);
  std::printf("cluster size %d ran; tpcs:", size);
  for (unsigned t : tpcs) std::printf(" %u", t);
  std::printf("\n");
  return 0;
}
