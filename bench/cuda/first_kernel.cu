// SPDX-License-Identifier: Apache-2.0
// The child of bench_startup (bench/startup_overhead.cpp): an ordinary CUDA
// runtime program whose first CUDA call is a kernel launch. The kernel stamps
// %globaltimer when it runs; after it finished, the program measures the
// offset of %globaltimer to CLOCK_MONOTONIC (common.cuh) and prints
//   first_kernel main_ns M kernel_ns K sync_ns S halfwidth_ns W ok 1
// M: CLOCK_MONOTONIC at the top of main; K: the kernel's start on the same
// clock; S: when cudaDeviceSynchronize returned; W: the uncertainty of K.
// The parent compares them with its own CLOCK_MONOTONIC stamp taken just
// before it spawned this program (or nvtaskset, which execs it).
//
// `first_kernel --hold` then keeps its context open until stdin closes: the
// process that holds the GPU open while bench/eval.py measures start-up
// against a GPU that is already initialised (the driver skips bringing the
// GPU up for the next process).
#include <unistd.h>

#include <cstring>

#include "common.cuh"

__device__ unsigned long long g_first_stamp;

__global__ void first_kernel() {
  if (threadIdx.x == 0 && blockIdx.x == 0) g_first_stamp = evalgpu::globaltimer();
}

int main(int argc, char** argv) {
  const bool hold = argc > 1 && std::strcmp(argv[1], "--hold") == 0;
  const std::uint64_t main_ns = evalgpu::mono_ns();
  first_kernel<<<1, 32>>>();
  EVAL_CHECK(cudaGetLastError());
  EVAL_CHECK(cudaDeviceSynchronize());
  const std::uint64_t sync_ns = evalgpu::mono_ns();
  unsigned long long g = 0;
  EVAL_CHECK(cudaMemcpyFromSymbol(&g, g_first_stamp, sizeof g));
  const evalgpu::Offset o = evalgpu::calibrate_offset(100);
  const long long kernel_ns = static_cast<long long>(g) - o.offset_ns;
  std::printf("first_kernel main_ns %llu kernel_ns %lld sync_ns %llu halfwidth_ns %lld ok %d\n",
              static_cast<unsigned long long>(main_ns), kernel_ns, static_cast<unsigned long long>(sync_ns),
              o.halfwidth_ns, o.ok ? 1 : 0);
  std::fflush(stdout);
  if (hold) {
    char c;
    while (::read(0, &c, 1) > 0) {
    }
  }
  return o.ok ? 0 : 4;
}
