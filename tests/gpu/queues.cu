// SPDX-License-Identifier: Apache-2.0
// How often independent streams falsely wait for each other because they
// share a hardware work queue (connection), for kernels and for copies.
//   queues [--streams N] [--ms T]
// For each stream j in turn, a helper stream runs a kernel for T ms and
// records an event; stream j waits for that event and then has a tiny kernel
// (or a copy) queued behind the wait, so its queue is stuck for T ms. Then
// every other stream gets one tiny kernel (or copy). One that finishes only
// after T/2 waited behind stream j although it does not depend on it: the
// two shared a queue. (A running kernel alone blocks nothing: kernels of
// other streams in its queue run beside it; only a wait stalls a queue.)
// Prints, per kind, how many of the N(N-1) ordered pairs were blocked:
//   queues compute streams N ms T blocked_pairs P of N(N-1)
// Run it with and without CUDA_DEVICE_MAX_CONNECTIONS /
// CUDA_DEVICE_MAX_COPY_CONNECTIONS, inside and outside MPS.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "queues: %s: %s\n", #x, cudaGetErrorString(e_));          \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)

#include "gpu_timer.cuh"

__global__ void tiny(int* p) {
  if (threadIdx.x == 0) p[blockIdx.x] = 1;
}

static double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  int n = 8;
  double ms = 40;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--streams") n = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--ms") ms = std::atof(argv[i + 1]);
  }
  if (n < 2 || n > 64 || ms <= 0) {
    std::fprintf(stderr, "queues: --streams 2-64, --ms > 0\n");
    return 2;
  }
  constexpr size_t kBytes = 1 << 16;
  std::vector<cudaStream_t> s(n);
  for (auto& st : s) CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaStream_t helper{};
  cudaEvent_t spun{};
  CK(cudaStreamCreateWithFlags(&helper, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&spun, cudaEventDisableTiming));
  char* host = nullptr;
  char* dev = nullptr;
  int* flags = nullptr;
  CK(cudaMallocHost(&host, kBytes * n));
  CK(cudaMalloc(&dev, kBytes * n));
  CK(cudaMalloc(&flags, sizeof(int) * 64));
  for (int i = 0; i < n; ++i) {  // every stream has its queue before anything is timed
    tiny<<<1, 32, 0, s[i]>>>(flags);
    CK(cudaMemcpyAsync(host + i * kBytes, dev + i * kBytes, kBytes, cudaMemcpyDeviceToHost, s[i]));
  }
  CK(cudaDeviceSynchronize());

  for (const bool copy : {false, true}) {
    int blocked_pairs = 0;
    for (int j = 0; j < n; ++j) {
      spin_for<<<1, 32, 0, helper>>>(static_cast<unsigned long long>(ms * 1e6));
      CK(cudaEventRecord(spun, helper));
      CK(cudaStreamWaitEvent(s[j], spun, 0));
      if (copy)
        CK(cudaMemcpyAsync(host + j * kBytes, dev + j * kBytes, kBytes, cudaMemcpyDeviceToHost, s[j]));
      else
        tiny<<<1, 32, 0, s[j]>>>(flags);
      const double t0 = now_ms();
      for (int i = 0; i < n; ++i) {
        if (i == j) continue;
        if (copy)
          CK(cudaMemcpyAsync(host + i * kBytes, dev + i * kBytes, kBytes, cudaMemcpyDeviceToHost, s[i]));
        else
          tiny<<<1, 32, 0, s[i]>>>(flags);
      }
      CK(cudaGetLastError());
      std::vector<double> done(n, -1);
      int left = n - 1;
      while (left > 0 && now_ms() - t0 < 20 * ms) {
        for (int i = 0; i < n; ++i) {
          if (i == j || done[i] >= 0) continue;
          const cudaError_t q = cudaStreamQuery(s[i]);
          if (q == cudaSuccess) {
            done[i] = now_ms() - t0;
            --left;
          } else if (q != cudaErrorNotReady) {
            CK(q);
          }
        }
      }
      CK(cudaDeviceSynchronize());
      for (int i = 0; i < n; ++i) blocked_pairs += i != j && !(done[i] >= 0 && done[i] < ms / 2);
    }
    std::printf("queues %s streams %d ms %.0f blocked_pairs %d of %d\n", copy ? "copy" : "compute", n, ms,
                blocked_pairs, n * (n - 1));
  }
  return 0;
}
