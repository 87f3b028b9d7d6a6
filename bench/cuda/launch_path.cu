// SPDX-License-Identifier: Apache-2.0
// What each driver call a best-effort task's shim may add to a launch costs the launching
// thread, side by side in one run: batches of launches of an empty kernel into one stream,
// each launch with one extra driver call (or a stream wait every 16 launches), arms interleaved
// round by round. Prints, per arm, the CPU time to queue a launch (the batch's enqueue time, its
// synchronize left out) and the wall time per launch with the GPU's share (enqueue to
// synchronize), median over rounds, and both as a ratio to the plain launch.
//   nvcc -arch=sm_90 -O2 -std=c++17 -o .dev/gpu/launch_path bench/cuda/launch_path.cu -lcuda
//   launch_path [--rounds 7] [--batch 512] [--batches 20]
// No nvtaskset involved: the shim's own code is not measured here, only the driver's calls.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.cuh"

extern "C" __global__ void empty_kernel() {}

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

enum Arm {
  kPlain,
  kIsCapturing,
  kCtxGetCurrent,
  kEventQuery,
  kRecordNoTiming,
  kRecordTiming,
  kWaitEvery16,
  kWaitEvery,
  kArms
};
const char* const kNames[kArms] = {"plain launch",        "+ cuStreamIsCapturing", "+ cuCtxGetCurrent",
                                   "+ cuEventQuery",      "+ cuEventRecord",       "+ cuEventRecord (timed)",
                                   "+ wait every 16",     "+ wait every launch"};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, batch = 512, batches = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--rounds") rounds = v;
    else if (a == "--batch") batch = v;
    else if (a == "--batches") batches = v;
    else {
      std::fprintf(stderr, "launch_path: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (rounds < 1 || batch < 16 || batches < 1) {
    std::fprintf(stderr, "launch_path: bad arguments\n");
    return 2;
  }
  // The runtime makes the primary context current and names this file's kernel for the driver.
  if (cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "launch_path: no CUDA device\n");
    return 2;
  }
  cudaFunction_t fn = nullptr;
  if (cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(&empty_kernel)) != cudaSuccess) {
    std::fprintf(stderr, "launch_path: the runtime cannot name this file's kernel\n");
    return 2;
  }
  const CUfunction f = reinterpret_cast<CUfunction>(fn);
  CUstream s;
  DRV_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent done, timed;
  DRV_CHECK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  DRV_CHECK(cuEventCreate(&timed, CU_EVENT_DEFAULT));
  DRV_CHECK(cuEventRecord(done, s));
  void* host = nullptr;
  DRV_CHECK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *static_cast<volatile unsigned*>(host) = 0;  // the gate, open
  CUdeviceptr word = 0;
  DRV_CHECK(cuMemHostGetDevicePointer(&word, host, 0));
  DRV_CHECK(cuStreamSynchronize(s));

  std::vector<double> enq[kArms], wall[kArms];
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up and is not counted
    for (int arm = 0; arm < kArms; ++arm) {
      double e = 0;
      const double t0 = now_us();
      for (int b = 0; b < batches; ++b) {
        const double b0 = now_us();
        for (int i = 0; i < batch; ++i) {
          switch (arm) {
            case kIsCapturing: {
              CUstreamCaptureStatus st;
              DRV_CHECK(cuStreamIsCapturing(s, &st));
              break;
            }
            case kCtxGetCurrent: {
              CUcontext c;
              DRV_CHECK(cuCtxGetCurrent(&c));
              break;
            }
            case kEventQuery: DRV_CHECK(cuEventQuery(done)); break;
            case kRecordNoTiming: DRV_CHECK(cuEventRecord(done, s)); break;
            case kRecordTiming: DRV_CHECK(cuEventRecord(timed, s)); break;
            case kWaitEvery16:
              if (i % 16 == 0) DRV_CHECK(cuStreamWaitValue32(s, word, 0, CU_STREAM_WAIT_VALUE_EQ));
              break;
            case kWaitEvery: DRV_CHECK(cuStreamWaitValue32(s, word, 0, CU_STREAM_WAIT_VALUE_EQ)); break;
            default: break;
          }
          DRV_CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr));
        }
        e += now_us() - b0;
        DRV_CHECK(cuStreamSynchronize(s));
      }
      const double n = static_cast<double>(batch) * batches;
      if (r > 0) {
        enq[arm].push_back(e / n);
        wall[arm].push_back((now_us() - t0) / n);
      }
    }
  }
  const double e0 = median(enq[kPlain]), w0 = median(wall[kPlain]);
  std::printf("launch_path: %d rounds of %d x %d launches of an empty kernel, medians\n", rounds, batches, batch);
  std::printf("%-26s %12s %8s %12s %8s\n", "arm", "CPU us/launch", "x plain", "wall us/launch", "x plain");
  for (int arm = 0; arm < kArms; ++arm) {
    const double e = median(enq[arm]), w = median(wall[arm]);
    std::printf("%-26s %12.3f %8.3f %12.3f %8.3f\n", kNames[arm], e, e / e0, w, w / w0);
  }
  return 0;
}
