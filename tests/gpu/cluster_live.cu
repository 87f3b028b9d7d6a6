// SPDX-License-Identifier: Apache-2.0
// A long-running cluster_probe: every few milliseconds it launches a kernel
// with thread-block clusters of a given size, then an ordinary kernel, and
// records the logical TPCs (%smid / 2) each ran on. Used on a real GPU for the
// live checks of docs/verification.md ("clusters"): a task that launched
// clusters of C keeps its partition when `nvtaskset -p` asks for one that
// cannot host C; with NVTASKSET_ON_CLUSTER_MISFIT=widen the cluster kernels
// run on whole GPCs while the ordinary kernels stay on the partition.
//
//   cluster_live --size C [--duration-ms D] [--interval-ms I] [--until-file F]
//
// prints "pid <pid> ...", then one line per iteration:
//   <i> <CLOCK_MONOTONIC ns before the cluster launch> cluster <TPC list> plain <TPC list>
// and "ready" (flushed) after the first. Exit status 2 on a CUDA error.
#include <cuda_runtime.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

__global__ void record(unsigned* out, long long spin_cycles) {
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const long long start = clock64();
    while (clock64() - start < spin_cycles) {
    }
    out[blockIdx.x] = smid;
  }
}

long long now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string ranges(const std::set<unsigned>& s) {
  std::string out;
  for (auto it = s.begin(); it != s.end();) {
    unsigned a = *it, b = a;
    auto jt = std::next(it);
    while (jt != s.end() && *jt == b + 1) b = *jt++;
    if (!out.empty()) out += ",";
    out += std::to_string(a);
    if (b > a) out += "-" + std::to_string(b);
    it = jt;
  }
  return out.empty() ? "none" : out;
}

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("cluster_live: %s: %s\n", #x, cudaGetErrorString(e_));       \
      std::fflush(stdout);                                                     \
      return 2;                                                                \
    }                                                                          \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  int size = 8, interval_ms = 5;
  long duration_ms = 5000;
  const char* until_file = nullptr;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--size") size = std::atoi(argv[++i]);
    else if (a == "--duration-ms") duration_ms = std::atol(argv[++i]);
    else if (a == "--interval-ms") interval_ms = std::atoi(argv[++i]);
    else if (a == "--until-file") until_file = argv[++i];
  }
  if (size < 1 || size > 16) {
    std::printf("cluster_live: bad --size\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (size > 8) CK(cudaFuncSetAttribute(record, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int smem = 0, clock_khz = 0;
  CK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  CK(cudaFuncSetAttribute(record, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));  // one block per SM
  const long long spin = static_cast<long long>(clock_khz) * 5 / 1000;                  // ~5 us
  const int clusters = std::max(1, 2 * prop.multiProcessorCount / size);
  const int cblocks = size * clusters;
  const int pblocks = 4 * prop.multiProcessorCount;
  unsigned* d = nullptr;
  CK(cudaMalloc(&d, sizeof(unsigned) * std::max(cblocks, pblocks)));
  std::vector<unsigned> h(std::max(cblocks, pblocks));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(cblocks);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = size;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  std::printf("pid %d cluster size %d clusters %d sms %d\n", getpid(), size, clusters, prop.multiProcessorCount);
  std::fflush(stdout);
  const long long deadline = now_ns() + duration_ms * 1000000LL;
  for (long it = 0;; ++it) {
    struct stat st;
    if (it > 0 && (now_ns() >= deadline || (until_file && stat(until_file, &st) == 0))) break;
    const long long t = now_ns();
    CK(cudaLaunchKernelEx(&cfg, record, d, spin));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, sizeof(unsigned) * cblocks, cudaMemcpyDeviceToHost));
    std::set<unsigned> ct, pt;
    for (int i = 0; i < cblocks; ++i) ct.insert(h[i] / 2);
    record<<<pblocks, 128, smem>>>(d, spin);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, sizeof(unsigned) * pblocks, cudaMemcpyDeviceToHost));
    for (int i = 0; i < pblocks; ++i) pt.insert(h[i] / 2);
    std::printf("%ld %lld cluster %s plain %s\n", it, t, ranges(ct).c_str(), ranges(pt).c_str());
    if (it == 0) std::printf("ready\n");
    std::fflush(stdout);
    if (interval_ms) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
  }
  std::printf("done\n");
  return 0;
}
