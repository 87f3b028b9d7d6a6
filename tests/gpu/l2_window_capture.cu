// SPDX-License-Identifier: Apache-2.0
// Does a kernel captured from a stream keep the stream's L2 access policy
// window? bench/lc_be_mix.py's roles-l2 setup gives the LC task's capture
// stream a persisting window and relies on the captured kernels keeping it
// (docs/runs.md, "An L2 persisting window for the LC task"). Prints the
// device's persisting L2 limits, the set-aside this context got, the stream's
// window read back, and each captured kernel node's window.
//   l2_window_capture
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

__global__ void touch(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1.f;
}

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                      \
      return 2;                                                                \
    }                                                                          \
  } while (0)

int main() {
  int max_persist = 0, max_window = 0, l2 = 0;
  CHECK(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, 0));
  CHECK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, 0));
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const cudaError_t set = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, max_persist);
  size_t got = 0;
  CHECK(cudaDeviceGetLimit(&got, cudaLimitPersistingL2CacheSize));
  std::printf("l2 %d max_persisting %d max_window %d set_limit %s set_aside %zu\n", l2, max_persist, max_window,
              cudaGetErrorString(set), got);
  const int n = 1 << 22;  // 16 MB
  float* p = nullptr;
  CHECK(cudaMalloc(&p, n * sizeof(float)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaLaunchAttributeValue v{};
  v.accessPolicyWindow.base_ptr = p;
  v.accessPolicyWindow.num_bytes = n * sizeof(float);
  v.accessPolicyWindow.hitRatio = 0.5f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  CHECK(cudaStreamSetAttribute(s, cudaLaunchAttributeAccessPolicyWindow, &v));
  cudaLaunchAttributeValue r{};
  CHECK(cudaStreamGetAttribute(s, cudaLaunchAttributeAccessPolicyWindow, &r));
  std::printf("stream window bytes %zu hit %.2f hitProp %d\n", r.accessPolicyWindow.num_bytes,
              r.accessPolicyWindow.hitRatio, static_cast<int>(r.accessPolicyWindow.hitProp));
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < 3; ++k) touch<<<(n + 255) / 256, 256, 0, s>>>(p, n);
  CHECK(cudaStreamEndCapture(s, &g));
  size_t count = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
  int kernels = 0, with_window = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(node, &t));
    if (t != cudaGraphNodeTypeKernel) continue;
    ++kernels;
    cudaLaunchAttributeValue a{};
    CHECK(cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeAccessPolicyWindow, &a));
    if (a.accessPolicyWindow.num_bytes == n * sizeof(float) && a.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting)
      ++with_window;
    std::printf("node window bytes %zu hit %.2f hitProp %d\n", a.accessPolicyWindow.num_bytes,
                a.accessPolicyWindow.hitRatio, static_cast<int>(a.accessPolicyWindow.hitProp));
  }
  std::printf("captured kernels %d with the stream's window %d\n", kernels, with_window);
  return 0;
}
