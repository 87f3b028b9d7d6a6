// SPDX-License-Identifier: Apache-2.0
// What fewer copy queues cost a program that overlaps copies with kernels on
// several streams (the pattern of CUDA's simpleStreams sample, and of a data
// loader feeding a model): each of N streams repeats "copy a chunk in, run a
// kernel on it, copy the result out". A copy queued behind its stream's kernel
// waits for it, and holds up every other stream's copies in the same hardware
// copy queue meanwhile, so the number of copy queues
// (CUDA_DEVICE_MAX_COPY_CONNECTIONS) sets how much of the copying overlaps.
// bench/copy_queues.py runs it side by side at several settings.
//   copy_pipeline [--streams N] [--chunk-mb M] [--kernel-us U] [--iters K]
// Prints the time of K rounds (after one round of warm-up) and the host<->GPU
// bandwidth achieved:
//   copy_pipeline streams N chunk_mb M kernel_us U iters K ms T gbps B
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"

// Stands in for the work on a chunk: one block touches the chunk's first
// words and then spins, so the kernel's length is set, not its bandwidth.
__global__ void work(unsigned* buf, unsigned long long ns) {
  const unsigned long long start = evalgpu::globaltimer();
  buf[threadIdx.x] += 1;
  while (evalgpu::globaltimer() - start < ns) {
  }
}

static int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) {
      char* end = nullptr;
      const long v = std::strtol(argv[i + 1], &end, 10);
      if (*end != '\0' || v <= 0 || v > 1 << 20) {
        std::fprintf(stderr, "copy_pipeline: %s %s: expected a positive number\n", name, argv[i + 1]);
        std::exit(2);
      }
      return static_cast<int>(v);
    }
  return def;
}

int main(int argc, char** argv) {
  const int streams = arg_int(argc, argv, "--streams", 8);
  const int chunk_mb = arg_int(argc, argv, "--chunk-mb", 16);
  const int kernel_us = arg_int(argc, argv, "--kernel-us", 500);
  const int iters = arg_int(argc, argv, "--iters", 20);
  const size_t bytes = static_cast<size_t>(chunk_mb) << 20;

  std::vector<cudaStream_t> s(streams);
  std::vector<unsigned*> h_in(streams), h_out(streams), d(streams);
  for (int i = 0; i < streams; ++i) {
    EVAL_CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    EVAL_CHECK(cudaMallocHost(&h_in[i], bytes));
    EVAL_CHECK(cudaMallocHost(&h_out[i], bytes));
    EVAL_CHECK(cudaMalloc(&d[i], bytes));
    std::memset(h_in[i], i, bytes);
  }
  auto round = [&] {
    for (int i = 0; i < streams; ++i) {
      EVAL_CHECK(cudaMemcpyAsync(d[i], h_in[i], bytes, cudaMemcpyHostToDevice, s[i]));
      work<<<1, 32, 0, s[i]>>>(d[i], 1000ull * kernel_us);
      EVAL_CHECK(cudaGetLastError());
      EVAL_CHECK(cudaMemcpyAsync(h_out[i], d[i], bytes, cudaMemcpyDeviceToHost, s[i]));
    }
  };
  round();  // warm-up: first-touch costs, lazy module loading
  EVAL_CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < iters; ++k) round();
  EVAL_CHECK(cudaDeviceSynchronize());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The result must be the input plus one in the word the kernel touched.
  for (int i = 0; i < streams; ++i) {
    unsigned expect;
    std::memset(&expect, i, sizeof expect);
    if (h_out[i][0] != expect + 1 || h_out[i][bytes / sizeof(unsigned) - 1] != expect) {
      std::fprintf(stderr, "copy_pipeline: stream %d: wrong result\n", i);
      return 1;
    }
  }
  const double gb = 2.0 * static_cast<double>(bytes) * streams * iters / 1e9;
  std::printf("copy_pipeline streams %d chunk_mb %d kernel_us %d iters %d ms %.3f gbps %.2f\n", streams, chunk_mb,
              kernel_us, iters, ms, gb / (ms / 1e3));
  return 0;
}
