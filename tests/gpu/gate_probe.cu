// SPDX-License-Identifier: Apache-2.0
// Facts behind the best-effort gate (docs/design.md, "Roles"): a stream that
// waits on a word of the process's own mapped host memory
// (cuStreamWaitValue32, EQ 0) stops there while the word is not 0, and goes
// on once the CPU writes 0.
//   gate_probe [--kernel-us T] [--kernels N]
//   gate_probe --hold-ms H
// Prints, one line each:
//   gate_probe attrs wait_nor W mem_ops_64 M host_ptr H
//   gate_probe blocks STREAM ran_while_closed R open_to_run_us P50 P99 (n)
//   gate_probe cost every K us_per_kernel X ratio Y
// "blocks": a kernel queued behind the wait must not run while the word is 1
// (R counts the trials where it did), and the time from the CPU's store of 0
// to the kernel's flag seen by the CPU. "cost": N kernels of T us each with
// a wait (already open) before every K-th launch, against none (K 0).
// --hold-ms: only keep one stream stopped at a closed gate for H ms (for a
// second client's "cost" run beside it: a stopped stream must not stop it).
// Run it as a plain process and as an MPS client.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "gate_probe: %s: %s\n", #x, cudaGetErrorString(e_));      \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)
#define CU(x)                                                                        \
  do {                                                                               \
    CUresult r_ = (x);                                                               \
    if (r_ != CUDA_SUCCESS) {                                                        \
      const char* s_ = nullptr;                                                      \
      cuGetErrorString(r_, &s_);                                                     \
      std::fprintf(stderr, "gate_probe: %s: %s\n", #x, s_ ? s_ : "?");               \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)

#include "gpu_timer.cuh"

__global__ void set_flag(volatile unsigned* flag, unsigned v) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    *flag = v;
    __threadfence_system();
  }
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(q / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

int main(int argc, char** argv) {
  double kernel_us = 20;
  int kernels = 20000;
  double hold_ms = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--hold-ms") hold_ms = std::atof(argv[i + 1]);
    if (std::string(argv[i]) == "--kernel-us") kernel_us = std::atof(argv[i + 1]);
    if (std::string(argv[i]) == "--kernels") kernels = std::atoi(argv[i + 1]);
  }
  if (kernel_us <= 0 || kernels < 100) {
    std::fprintf(stderr, "gate_probe: bad arguments\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUdevice dev;
  CU(cuCtxGetDevice(&dev));
  int nor = -1, m64 = -1, hp = -1;
  cuDeviceGetAttribute(&nor, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev);
  cuDeviceGetAttribute(&m64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev);
  cuDeviceGetAttribute(&hp, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, dev);
  std::printf("gate_probe attrs wait_nor %d mem_ops_64 %d host_ptr %d\n", nor, m64, hp);

  // The gate word and the kernel's flag, both in mapped host memory.
  void* host = nullptr;
  CU(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  volatile unsigned* gate = static_cast<volatile unsigned*>(host);
  volatile unsigned* flag = gate + 16;
  CUdeviceptr dgate = 0;
  CU(cuMemHostGetDevicePointer(&dgate, host, 0));
  unsigned* dflag = reinterpret_cast<unsigned*>(dgate) + 16;

  cudaStream_t own;
  CK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  // Load both kernels first: loading a kernel lazily at its first launch
  // waits for the legacy stream, which a closed gate stops (a launching
  // thread that opens the gate itself then waits for ever; seen on H200).
  set_flag<<<1, 32>>>(dflag, 0);
  spin_for<<<1, 32>>>(1000);
  CK(cudaDeviceSynchronize());
  if (hold_ms > 0) {
    *flag = 0;
    *gate = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(own), dgate, 0, CU_STREAM_WAIT_VALUE_EQ));
    set_flag<<<1, 32, 0, own>>>(dflag, 1);
    CK(cudaGetLastError());
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(hold_ms));
    const unsigned ran = *flag;
    *gate = 0;
    CK(cudaStreamSynchronize(own));
    std::printf("gate_probe hold %.0f ms ran_while_closed %u then ran %u\n", hold_ms, ran, *flag);
    return ran != 0 ? 1 : 0;
  }
  struct Named {
    const char* name;
    cudaStream_t s;
  };
  for (const Named& st : {Named{"legacy", nullptr}, Named{"created", own}}) {
    std::vector<double> open_to_run;
    int ran_closed = 0;
    const int trials = 100;
    for (int t = 0; t < trials; ++t) {
      *flag = 0;
      *gate = 1;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(st.s), dgate, 0, CU_STREAM_WAIT_VALUE_EQ));
      set_flag<<<1, 32, 0, st.s>>>(dflag, 1);
      CK(cudaGetLastError());
      const double until = now_us() + (t < 5 ? 20000 : 1000);
      while (now_us() < until)
        if (*flag != 0) break;
      if (*flag != 0) ++ran_closed;
      if (t == 0) std::fprintf(stderr, "gate_probe: %s: first trial, ran while closed %u\n", st.name, *flag);
      const double t0 = now_us();
      *gate = 0;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      double seen = -1;
      while (now_us() - t0 < 1e6)
        if (*flag != 0) {
          seen = now_us() - t0;
          break;
        }
      CK(cudaStreamSynchronize(st.s));
      if (seen < 0) {
        std::printf("gate_probe blocks %s: the kernel did not run within 1 s of opening\n", st.name);
        return 1;
      }
      open_to_run.push_back(seen);
    }
    std::printf("gate_probe blocks %s ran_while_closed %d open_to_run_us %.1f %.1f (%d)\n", st.name, ran_closed,
                pct(open_to_run, 50), pct(open_to_run, 99), trials);
  }

  // The cost of an open gate every K launches.
  *gate = 0;
  const unsigned long long ns = static_cast<unsigned long long>(kernel_us * 1000);
  double base = 0;
  for (int k : {0, 8, 4, 2, 1, 0}) {
    spin_for<<<132, 64, 0, own>>>(ns);
    CK(cudaStreamSynchronize(own));
    const double t0 = now_us();
    for (int i = 0; i < kernels; ++i) {
      if (k > 0 && i % k == 0)
        CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(own), dgate, 0, CU_STREAM_WAIT_VALUE_EQ));
      spin_for<<<132, 64, 0, own>>>(ns);
    }
    CK(cudaStreamSynchronize(own));
    const double per = (now_us() - t0) / kernels;
    if (k == 0 && base == 0) base = per;
    std::printf("gate_probe cost every %d us_per_kernel %.3f ratio %.4f\n", k, per, per / base);
  }
  CU(cuMemFreeHost(host));
  return 0;
}
