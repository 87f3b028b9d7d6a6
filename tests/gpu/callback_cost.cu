// SPDX-License-Identifier: Apache-2.0
// Diagnostic: what does touching the TMD inside the launch callback cost?
// Subscribes one callback (docs/hardware.md hook) whose work is switched between
// modes, and times 100k empty-kernel launches per mode, interleaved over
// several rounds in one process:
//   0 nothing          the callback returns at once
//   1 read version     reads TMD byte 72
//   2 read both        reads byte 72 and 32-bit word 0
//   3 edit (V04)       reads both, writes the 4 mask words and word 0 | valid
//   4 write only       writes the 4 mask words (no reads at all)
//   5 atomics          two relaxed fetch_add on a shared counter (no TMD access)
// The mask written enables every TPC (disable mask 0), so nothing changes
// where kernels run.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static const unsigned char kUuid[16] = {0x2c, 0x8e, 0x0a, 0xd8, 0x07, 0x10, 0xab, 0x4e,
                                        0x90, 0xdd, 0x54, 0x71, 0x9f, 0xe5, 0xf7, 0x4b};
static const char* kPtx = ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry empty()\n{\nret;\n}\n";
static volatile int g_mode = 0;
static volatile uint32_t g_sink = 0;
static std::atomic<uint64_t> g_counter{0};

static void cb(void*, int domain, int cbid, const void* params) {
  if (domain != 0xb || cbid != 1) return;
  unsigned char* t = static_cast<unsigned char*>(static_cast<void* const*>(params)[4]);
  volatile unsigned char* vt = t;
  switch (g_mode) {
    case 1: g_sink = vt[72]; break;
    case 2: g_sink = vt[72] + *reinterpret_cast<volatile uint32_t*>(t); break;
    case 3: {
      if (vt[72] != 0x40) break;
      const uint32_t zero = 0;
      for (int i = 0; i < 4; ++i) std::memcpy(t + 304 + 4 * i, &zero, 4);
      uint32_t w0;
      std::memcpy(&w0, t, 4);
      w0 |= 0x80000000u;
      std::memcpy(t, &w0, 4);
      break;
    }
    case 4: {
      const uint32_t zero = 0;
      for (int i = 0; i < 4; ++i) std::memcpy(t + 304 + 4 * i, &zero, 4);
      break;
    }
    case 5:
      g_counter.fetch_add(1, std::memory_order_relaxed);
      g_counter.fetch_add(1, std::memory_order_relaxed);
      break;
    default: break;
  }
}

#define CK(x)                                       \
  do {                                              \
    CUresult r = (x);                               \
    if (r != CUDA_SUCCESS) {                        \
      std::printf("FAIL %s -> %d\n", #x, (int)r);   \
      return 1;                                     \
    }                                               \
  } while (0)

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  const void* table = nullptr;
  CK(cuGetExportTable(&table, reinterpret_cast<const CUuuid*>(kUuid)));
  auto sub = reinterpret_cast<int (*)(uint32_t*, void (*)(void*, int, int, const void*), void*)>(
      static_cast<void* const*>(table)[3]);
  auto en = reinterpret_cast<int (*)(uint32_t, uint32_t, int, int)>(static_cast<void* const*>(table)[6]);
  uint32_t h = 0;
  if (sub(&h, cb, nullptr) || en(1, h, 0xb, 1)) return 2;
  CUmodule m;
  CK(cuModuleLoadData(&m, kPtx));
  CUfunction f;
  CK(cuModuleGetFunction(&f, m, "empty"));
  const int kModes = 6, kRounds = 7;
  const long kLaunches = 100000;
  const char* names[kModes] = {"nothing", "read version byte", "read byte 72 + word 0", "full V04 edit",
                               "write mask only", "two atomics"};
  std::vector<std::vector<double>> ns(kModes);
  for (int r = 0; r < kRounds; ++r)
    for (int mode = 0; mode < kModes; ++mode) {
      g_mode = mode;
      CK(cuCtxSynchronize());
      // Batches that never fill the GPU's queue; only the enqueue is timed.
      double t = 0;
      for (long done = 0; done < kLaunches; done += 256) {
        const auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < 256; ++i) CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
        t += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        CK(cuCtxSynchronize());
      }
      ns[mode].push_back(t / kLaunches);
    }
  CK(cuCtxSynchronize());
  for (int mode = 0; mode < kModes; ++mode) {
    std::vector<double> v = ns[mode];
    std::sort(v.begin(), v.end());
    std::vector<double> base = ns[0];
    std::sort(base.begin(), base.end());
    std::printf("mode %d %-22s %8.1f ns/launch (median of %d)  %.3fx of 'nothing'\n", mode, names[mode],
                v[kRounds / 2], kRounds, v[kRounds / 2] / base[kRounds / 2]);
  }
  return 0;
}
