// SPDX-License-Identifier: Apache-2.0
// A compute-bound CUDA program for co-running checks: it keeps every SM it is
// given busy for a fixed amount of work and prints its own wall time.
//   busy [--work N] [--start-at MS]
// N kernels of fixed per-block work over 8 blocks per SM. With --start-at,
// it waits (after creating its context) until that CLOCK_REALTIME time in
// milliseconds, so two copies run their kernels at the same moment. Prints
// "busy: <seconds> s start <ms> end <ms>".
#include <cuda_runtime.h>

#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <string>

__global__ void spin(float* out, int rounds) {
  float x = threadIdx.x * 1e-3f;
  for (int i = 0; i < rounds; ++i) x = x * 0.999f + 0.5f;
  if (x == 12345.f) out[0] = x;  // keep the loop
}

int main(int argc, char** argv) {
  int work = 200;
  long long start_at = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--work") work = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--start-at") start_at = std::atoll(argv[i + 1]);
  }
  auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 2;
  float* d = nullptr;
  cudaMalloc(&d, 4);
  cudaDeviceSynchronize();
  while (start_at && now_ms() < start_at) std::this_thread::sleep_for(std::chrono::microseconds(200));
  const long long begin = now_ms();
  const auto t0 = std::chrono::steady_clock::now();
  // A fixed number of blocks of fixed work: the time is proportional to how
  // many SMs the kernel may use.
  for (int k = 0; k < work; ++k) spin<<<prop.multiProcessorCount * 8, 256>>>(d, 200000);
  if (cudaDeviceSynchronize() != cudaSuccess) return 3;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("busy: %.3f s start %lld end %lld\n", s, begin, now_ms());
  return 0;
}
