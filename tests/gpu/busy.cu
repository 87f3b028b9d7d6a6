// A compute-bound CUDA program for co-running checks: it keeps every SM it is
// given busy for a fixed amount of work and prints its own wall time.
//   busy [--work N]   (N kernels of fixed per-block work over 8 blocks per SM)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

__global__ void spin(float* out, int rounds) {
  float x = threadIdx.x * 1e-3f;
  for (int i = 0; i < rounds; ++i) x = x * 0.999f + 0.5f;
  if (x == 12345.f) out[0] = x;  // keep the loop
}

int main(int argc, char** argv) {
  int work = 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--work") work = std::atoi(argv[i + 1]);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 2;
  float* d = nullptr;
  cudaMalloc(&d, 4);
  const auto t0 = std::chrono::steady_clock::now();
  // A fixed number of blocks of fixed work: the time is proportional to how
  // many SMs the kernel may use.
  for (int k = 0; k < work; ++k) spin<<<prop.multiProcessorCount * 8, 256>>>(d, 200000);
  if (cudaDeviceSynchronize() != cudaSuccess) return 3;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("busy: %.3f s\n", s);
  return 0;
}
