// SPDX-License-Identifier: Apache-2.0
// What the evaluation programs (bench/cuda/*.cu, driven by bench/eval.py and
// bench_startup) share: checks of runtime and driver calls, the host clock, the GPU's %globaltimer, and the
// calibrated offset between the two.
//
// Why a calibration: %globaltimer is a GPU-wide nanosecond counter (the same
// for every process and context on the GPU, MPS clients included), which the
// driver starts from the host's wall clock, but nothing promises that it
// equals any host clock, nor that it does not drift from one. So each program
// measures the offset itself, NTP-style, with a ping-pong through host-mapped
// memory:
//   host -> GPU: the host reads CLOCK_MONOTONIC (h1), then writes a flag; the
//     GPU sees it and reads %globaltimer (g1). The GPU read comes after the
//     host read, so  offset = gpu - host <= g1 - h1.
//   GPU -> host: the GPU reads %globaltimer (g2), then writes a flag; the
//     host sees it and reads CLOCK_MONOTONIC (h2), so  offset >= g2 - h2.
// Over many rounds the tightest bounds give the offset to within half their
// gap (the one-way PCIe latencies plus a timer tick), which each program
// reports as `halfwidth`. CLOCK_MONOTONIC is system-wide on Linux, so a stamp
// converted to it compares with any other process's CLOCK_MONOTONIC stamp
// (bench_startup's pre-exec stamp, eval.py's NVML trace), and it is never
// stepped by NTP, unlike CLOCK_REALTIME.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace evalgpu {

inline std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

#define EVAL_CHECK(x)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
      std::exit(3);                                                                                \
    }                                                                                              \
  } while (0)

// The same for a driver API call.
#define DRV_CHECK(x)                                                                       \
  do {                                                                                     \
    CUresult r_ = (x);                                                                     \
    if (r_ != CUDA_SUCCESS) {                                                              \
      const char* s_ = nullptr;                                                            \
      cuGetErrorString(r_, &s_);                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");      \
      std::exit(3);                                                                        \
    }                                                                                      \
  } while (0)

// One ping-pong session (see the header comment). Bounded: the kernel gives
// up after timeout_ns of GPU time and flags it, the host after a second per
// round, so a lost flag never hangs the program.
__global__ void pingpong_kernel(volatile unsigned* to_gpu, volatile unsigned* to_host, unsigned long long* stamps,
                                int rounds, unsigned long long timeout_ns) {
  const unsigned long long start = globaltimer();
  for (int r = 0; r < rounds; ++r) {
    while (*to_gpu != static_cast<unsigned>(r + 1)) {
      if (globaltimer() - start > timeout_ns) {
        *to_host = 0xffffffffu;
        return;
      }
    }
    const unsigned long long g1 = globaltimer();
    const unsigned long long g2 = globaltimer();
    stamps[2 * r] = g1;
    stamps[2 * r + 1] = g2;
    __threadfence_system();
    *to_host = static_cast<unsigned>(r + 1);
  }
}

// The smallest step of %globaltimer seen in `changes` consecutive changes
// (its resolution), or 0 when it did not change within the loop bound.
__global__ void timer_resolution_kernel(unsigned long long* out, int changes) {
  unsigned long long prev = globaltimer(), best = ~0ull;
  int seen = 0;
  for (long long i = 0; i < 50000000ll && seen < changes; ++i) {
    const unsigned long long t = globaltimer();
    if (t != prev) {
      best = min(best, t - prev);
      prev = t;
      ++seen;
    }
  }
  *out = seen ? best : 0ull;
}

struct Offset {
  long long offset_ns = 0;     // %globaltimer - CLOCK_MONOTONIC
  long long halfwidth_ns = 0;  // half the gap between the bounds: the offset's uncertainty
  std::uint64_t at_host_ns = 0;
  bool ok = false;
};

// Measures %globaltimer - CLOCK_MONOTONIC on the current device (module-level
// kernels, the runtime's current context). Costs a few milliseconds.
inline Offset calibrate_offset(int rounds = 200) {
  Offset o;
  unsigned* flags = nullptr;
  unsigned long long* stamps = nullptr;
  if (cudaHostAlloc(&flags, 2 * sizeof(unsigned), cudaHostAllocMapped) != cudaSuccess) return o;
  if (cudaHostAlloc(&stamps, 2 * rounds * sizeof(unsigned long long), cudaHostAllocMapped) != cudaSuccess) {
    cudaFreeHost(flags);
    return o;
  }
  unsigned* d_flags = nullptr;
  unsigned long long* d_stamps = nullptr;
  EVAL_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_flags), flags, 0));
  EVAL_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_stamps), stamps, 0));
  __atomic_store_n(&flags[0], 0u, __ATOMIC_SEQ_CST);
  __atomic_store_n(&flags[1], 0u, __ATOMIC_SEQ_CST);
  cudaStream_t s;
  EVAL_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  pingpong_kernel<<<1, 1, 0, s>>>(d_flags, d_flags + 1, d_stamps, rounds, 5000000000ull);
  EVAL_CHECK(cudaGetLastError());
  long long upper = (1ll << 62), lower = -(1ll << 62);
  bool failed = false;
  std::uint64_t* h1 = new std::uint64_t[rounds];
  std::uint64_t* h2 = new std::uint64_t[rounds];
  for (int r = 0; r < rounds && !failed; ++r) {
    h1[r] = mono_ns();
    __atomic_store_n(&flags[0], static_cast<unsigned>(r + 1), __ATOMIC_SEQ_CST);
    for (;;) {
      const unsigned v = __atomic_load_n(&flags[1], __ATOMIC_ACQUIRE);
      if (v == static_cast<unsigned>(r + 1)) break;
      if (v == 0xffffffffu || mono_ns() - h1[r] > 1000000000ull) {
        failed = true;
        break;
      }
    }
    h2[r] = mono_ns();
  }
  if (failed) __atomic_store_n(&flags[0], 0xfffffff0u, __ATOMIC_SEQ_CST);
  EVAL_CHECK(cudaStreamSynchronize(s));
  if (!failed) {
    for (int r = 0; r < rounds; ++r) {
      upper = std::min(upper, static_cast<long long>(stamps[2 * r] - h1[r]));
      lower = std::max(lower, static_cast<long long>(stamps[2 * r + 1] - h2[r]));
    }
    // upper < lower would mean a clock stepped during the session.
    o.ok = upper >= lower;
    o.offset_ns = lower + (upper - lower) / 2;
    o.halfwidth_ns = (upper - lower) / 2;
    o.at_host_ns = h2[rounds - 1];
  }
  delete[] h1;
  delete[] h2;
  cudaStreamDestroy(s);
  cudaFreeHost(flags);
  cudaFreeHost(stamps);
  return o;
}

inline unsigned long long timer_resolution_ns() {
  unsigned long long* d = nullptr;
  unsigned long long h = 0;
  EVAL_CHECK(cudaMalloc(&d, sizeof h));
  timer_resolution_kernel<<<1, 1>>>(d, 64);
  EVAL_CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  cudaFree(d);
  return h;
}

// The line every program prints for each calibration, parsed by eval.py.
inline void print_offset(const char* tag, const Offset& o) {
  std::printf("calib %s offset_ns %lld halfwidth_ns %lld at_ns %llu ok %d\n", tag, o.offset_ns, o.halfwidth_ns,
              static_cast<unsigned long long>(o.at_host_ns), o.ok ? 1 : 0);
}

}  // namespace evalgpu
