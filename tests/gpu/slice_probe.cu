// SPDX-License-Identifier: Apache-2.0
// Probe: can a launch run only a range of its grid's thread blocks, by
// editing its TMD in the hidden launch callback, so that one kernel can be
// issued as several smaller launches ("slices") with room between them?
//
// QMD V04_00 (Hopper, NVIDIA open-gpu-doc classes/compute/clcbc0qmd.h):
//   GRID_WIDTH MW(1055:1024) = u32 at byte 128, GRID_HEIGHT MW(1071:1056) =
//   u16 at byte 132, GRID_DEPTH MW(1103:1088) = u16 at byte 136;
//   GRID_WIDTH_RESUME MW(1439:1408) = u32 at byte 176, GRID_HEIGHT_RESUME
//   MW(1455:1440) = u16 at byte 180, GRID_DEPTH_RESUME MW(1471:1456) = u16
//   at byte 182 (the resume point of a preempted grid).
// The probe sets the resume point to a slice's first block along the grid's
// slowest dimension and that dimension's extent to the slice's end, and
// checks, per block, that every block ran exactly once over the slices, with
// the blockIdx and gridDim of the unsliced launch.
//
//   slice_probe [--cluster]      (--cluster: the clustered case alone, last:
//                                 it may hang, so run it under `timeout`)
// Exit 0 when every check holds, 1 when one fails, 2 on a CUDA error.
//
// Found on an H100 (driver 580.159.04, docs/runs.md run 117, docs/hardware.md
// "Slicing a kernel through its TMD"): the grid fields bound the blocks that
// run (a launch whose GRID_WIDTH is cut to e runs blocks 0..e-1, and gridDim
// still reads the launch's grid), but a resume point written at launch is
// ignored: every slice starts at block 0. So a kernel can be cut short through
// its TMD, not split; the shim does not slice kernels.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static const unsigned char kUuid[16] = {0x2c, 0x8e, 0x0a, 0xd8, 0x07, 0x10, 0xab, 0x4e,
                                        0x90, 0xdd, 0x54, 0x71, 0x9f, 0xe5, 0xf7, 0x4b};

// The slice the next launch is to run: dim 0/1/2 (x/y/z), [begin, end).
struct Req {
  int armed = 0;
  int dim = 0;
  uint32_t begin = 0, end = 0;
  int dump = 0;
};
static Req g_req;
static unsigned char g_dump[320];

static uint32_t ld32(const unsigned char* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
static uint16_t ld16(const unsigned char* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
static void st32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, 4); }
static void st16(unsigned char* p, uint16_t v) { std::memcpy(p, &v, 2); }

static void cb(void*, int domain, int cbid, const void* params) {
  if (domain != 0xb || cbid != 1) return;
  auto* t = static_cast<unsigned char*>(static_cast<void* const*>(params)[4]);
  if (g_req.dump) { std::memcpy(g_dump, t, sizeof g_dump); g_req.dump = 0; }
  if (!g_req.armed || t[72] != 0x40) return;
  g_req.armed = 0;
  switch (g_req.dim) {
    case 0: st32(t + 176, g_req.begin); st32(t + 128, g_req.end); break;
    case 1: st16(t + 180, (uint16_t)g_req.begin); st16(t + 132, (uint16_t)g_req.end); break;
    case 2: st16(t + 182, (uint16_t)g_req.begin); st16(t + 136, (uint16_t)g_req.end); break;
  }
}

__global__ void rec(unsigned* count, uint4* info, unsigned spin_ns) {
  const unsigned id = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (threadIdx.x == 0) {
    atomicAdd(&count[id], 1u);
    info[id] = make_uint4(gridDim.x, gridDim.y, gridDim.z, 1);
    if (spin_ns) {
      unsigned long long t0, t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < spin_ns);
    }
  }
  __syncthreads();
}

__global__ void __cluster_dims__(2, 1, 1) rec_cluster(unsigned* count, uint4* info) {
  const unsigned id = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (threadIdx.x == 0) {
    atomicAdd(&count[id], 1u);
    info[id] = make_uint4(gridDim.x, gridDim.y, gridDim.z, 1);
  }
}

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                            \
    }                                                                          \
  } while (0)

static int g_fail = 0;
static void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++g_fail;
}

// Runs grid `g` as slices of `step` along `dim` (or only [only_b, only_e) when
// only_e > 0), then checks every block's count and gridDim.
template <class Launch>
static void sliced(const char* name, dim3 g, int dim, unsigned step, Launch launch, unsigned only_b = 0,
                   unsigned only_e = 0) {
  const size_t n = (size_t)g.x * g.y * g.z;
  unsigned* count;
  uint4* info;
  CK(cudaMalloc(&count, n * sizeof(unsigned)));
  CK(cudaMalloc(&info, n * sizeof(uint4)));
  CK(cudaMemset(count, 0, n * sizeof(unsigned)));
  CK(cudaMemset(info, 0, n * sizeof(uint4)));
  const unsigned extent = dim == 0 ? g.x : dim == 1 ? g.y : g.z;
  const unsigned b0 = only_e ? only_b : 0, e0 = only_e ? only_e : extent;
  int launches = 0;
  for (unsigned b = b0; b < e0; b += step) {
    g_req = Req{1, dim, b, b + step < e0 ? b + step : e0, 0};
    launch(g, count, info);
    ++launches;
    if (g_req.armed) { std::printf("FAIL %s: the callback did not see the launch\n", name); ++g_fail; }
  }
  CK(cudaDeviceSynchronize());
  std::vector<unsigned> c(n);
  std::vector<uint4> in(n);
  CK(cudaMemcpy(c.data(), count, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(in.data(), info, n * sizeof(uint4), cudaMemcpyDeviceToHost));
  size_t wrong = 0, bad_dim = 0, ran = 0;
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) {
        const size_t id = x + (size_t)g.x * (y + (size_t)g.y * z);
        const unsigned k = dim == 0 ? x : dim == 1 ? y : z;
        const unsigned want = (k >= b0 && k < e0) ? 1u : 0u;
        if (c[id] != want) ++wrong;
        if (c[id]) {
          ++ran;
          if (in[id].x != g.x || in[id].y != g.y || in[id].z != g.z) ++bad_dim;
        }
      }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: grid %ux%ux%u in %d launches along %c: %zu blocks ran, %zu wrong counts, %zu wrong gridDim",
                name, g.x, g.y, g.z, launches, "xyz"[dim], ran, wrong, bad_dim);
  check(wrong == 0 && bad_dim == 0, buf);
  cudaFree(count);
  cudaFree(info);
}

int main(int argc, char** argv) {
  const bool cluster = argc > 1 && std::string(argv[1]) == "--cluster";
  CK(cudaFree(nullptr));
  const void* table = nullptr;
  if (cuGetExportTable(&table, reinterpret_cast<const CUuuid*>(kUuid)) != CUDA_SUCCESS) return 2;
  auto sub = reinterpret_cast<int (*)(uint32_t*, void (*)(void*, int, int, const void*), void*)>(
      static_cast<void* const*>(table)[3]);
  auto en = reinterpret_cast<int (*)(uint32_t, uint32_t, int, int)>(static_cast<void* const*>(table)[6]);
  uint32_t h = 0;
  if (sub(&h, cb, nullptr) != 0 || en(1, h, 0xb, 1) != 0) { std::printf("subscribe failed\n"); return 2; }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);

  auto plain = [](dim3 g, unsigned* c, uint4* i) { rec<<<g, 64>>>(c, i, 0); };
  if (cluster) {
    auto cl = [](dim3 g, unsigned* c, uint4* i) { rec_cluster<<<g, 64>>>(c, i); };
    sliced("clusters of 2, y", dim3(64, 100, 1), 1, 25, cl);
    sliced("clusters of 2, x in steps of 2", dim3(1000, 1, 1), 0, 250, cl);
    return g_fail ? 1 : 0;
  }

  // 1. The fields as the driver writes them for a 7x5x3 grid.
  {
    unsigned* c; uint4* i;
    CK(cudaMalloc(&c, 105 * 4)); CK(cudaMalloc(&i, 105 * 16));
    g_req = Req{}; g_req.dump = 1;
    rec<<<dim3(7, 5, 3), 64>>>(c, i, 0);
    CK(cudaDeviceSynchronize());
    std::printf("TMD version byte 0x%02x; grid %u x %u x %u; resume %u %u %u; cluster %u %u %u\n", g_dump[72],
                ld32(g_dump + 128), ld16(g_dump + 132), ld16(g_dump + 136), ld32(g_dump + 176), ld16(g_dump + 180),
                ld16(g_dump + 182), g_dump[268] & 0x3f, g_dump[269] & 0x3f, g_dump[270] & 0x3f);
    check(g_dump[72] == 0x40 && ld32(g_dump + 128) == 7 && ld16(g_dump + 132) == 5 && ld16(g_dump + 136) == 3 &&
              ld32(g_dump + 176) == 0 && ld16(g_dump + 180) == 0 && ld16(g_dump + 182) == 0,
          "the grid fields hold the launch's grid, the resume point is 0");
    cudaFree(c); cudaFree(i);
    if (g_dump[72] != 0x40) return 1;  // not V04: nothing below applies
  }
  // 2. Slices along the slowest dimension of 1-, 2- and 3-D grids.
  sliced("1-D", dim3(10000, 1, 1), 0, 2500, plain);
  sliced("1-D, uneven", dim3(10007, 1, 1), 0, 3000, plain);
  sliced("2-D", dim3(37, 300, 1), 1, 75, plain);
  sliced("3-D", dim3(5, 7, 40), 2, 10, plain);
  sliced("1-D, one slice [3000, 7000)", dim3(10000, 1, 1), 0, 4000, plain, 3000, 7000);
  sliced("2-D, one slice [100, 180)", dim3(37, 300, 1), 1, 80, plain, 100, 180);
  // 3. Time: the same work whole and in 8 slices (each block 20 us).
  {
    const unsigned n = prop.multiProcessorCount * 32 * 8;
    unsigned* c; uint4* i;
    CK(cudaMalloc(&c, n * 4)); CK(cudaMalloc(&i, (size_t)n * 16));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    float whole = 1e9f, parts = 1e9f;
    for (int rep = 0; rep < 5; ++rep) {
      CK(cudaEventRecord(a));
      rec<<<n, 64>>>(c, i, 20000);
      CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
      float ms; CK(cudaEventElapsedTime(&ms, a, b)); whole = ms < whole ? ms : whole;
      CK(cudaEventRecord(a));
      for (unsigned s = 0; s < 8; ++s) {
        g_req = Req{1, 0, s * (n / 8), (s + 1) * (n / 8), 0};
        rec<<<n, 64>>>(c, i, 20000);
      }
      CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
      CK(cudaEventElapsedTime(&ms, a, b)); parts = ms < parts ? ms : parts;
    }
    std::printf("time: %u blocks of 20 us whole %.3f ms, in 8 slices %.3f ms (%.3fx)\n", n, whole, parts, parts / whole);
    check(parts < whole * 1.25f, "8 slices take at most 1.25x the whole launch");
    cudaFree(c); cudaFree(i);
  }
  std::printf("%d failed\n", g_fail);
  return g_fail ? 1 : 0;
}
