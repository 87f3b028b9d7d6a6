// SPDX-License-Identifier: Apache-2.0
// The block-placement probe of `nvtaskset --verify` (block_probe.hpp). It sets
// up a device the way calibration's session does (calibration.cpp), but
// subscribes no launch callback: the mask its kernels get is the shim's.
#include "nvtaskset/block_probe.hpp"

#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "calibration_util.hpp"
#include "cuda_api.hpp"
#include "nvtaskset/calibration.hpp"
#include "nvtaskset/cuda_driver.hpp"

namespace nvtaskset::topo {

using detail::fail;

namespace {
// Threads per block: one warp; only thread 0 records.
constexpr unsigned kThreads = 32;
// How long each block stays on its SM, so the first wave covers every
// enabled SM (as calibration's SM-ID kernel, CalibrationOptions::spin_ns).
constexpr unsigned long long kSpinNs = 20000;
}  // namespace

struct BlockProbe::Impl {
  Impl(CudaDriver& d, const DeviceInfo& dv, std::chrono::milliseconds t)
      : drv(d), a(d.api()), dev(dv), timeout(t), who(fmt::format("the probe on device {}", dv.ordinal)) {}

  CudaDriver& drv;
  const CudaDriver::Api& a;
  DeviceInfo dev;
  std::chrono::milliseconds timeout;
  std::string who;
  CUdevice cu_dev = 0;
  CUcontext ctx = nullptr;
  bool have_ctx = false, pushed = false;
  CUstream stream = nullptr;
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  int smem = 0;
  unsigned grid = 0;
  CUdeviceptr dbuf = 0;
  std::uint32_t* host = nullptr;
  std::uint32_t* zero = nullptr;

  void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) fail(fmt::format("{}: {} failed: {}", who, what, drv.describe(r)));
  }

  int attr(CUdevice_attribute at) {
    int v = 0;
    check(a.cuDeviceGetAttribute(&v, at, cu_dev), "cuDeviceGetAttribute");
    return v;
  }

  void setup() {
    check(a.cuDeviceGet(&cu_dev, static_cast<int>(dev.ordinal)), "cuDeviceGet");
    CUuuid uuid{};
    check(a.cuDeviceGetUuid(&uuid, cu_dev), "cuDeviceGetUuid");
    if (std::memcmp(uuid.bytes, dev.uuid.data(), 16) != 0)
      fail(fmt::format("{}: device {} is not {} (CUDA_VISIBLE_DEVICES changed?)", who, dev.ordinal,
                       uuid_to_string(dev.uuid)));
    check(a.cuDevicePrimaryCtxRetain(&ctx, cu_dev), "cuDevicePrimaryCtxRetain");
    have_ctx = true;
    check(a.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
    pushed = true;
    check(a.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");

    // One block per SM: more dynamic shared memory than half an SM has.
    smem = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    char log[4096] = {};
    CUjit_option keys[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* vals[] = {log, reinterpret_cast<void*>(static_cast<std::uintptr_t>(sizeof log - 1))};
    if (CUresult r = a.cuModuleLoadDataEx(&module, block_smid_kernel_ptx(), 2, keys, vals); r != CUDA_SUCCESS) {
      std::string first_line = log;
      first_line = first_line.substr(0, first_line.find('\n'));
      fail(fmt::format("{}: loading the block-SM kernel failed: {}{}{}", who, drv.describe(r),
                       first_line.empty() ? "" : ": ", first_line));
    }
    check(a.cuModuleGetFunction(&fn, module, "nvtaskset_record_block_smid"), "cuModuleGetFunction");
    check(a.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
          "cuFuncSetAttribute(dynamic shared memory)");
    int per_sm = 0;
    check(a.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, static_cast<size_t>(smem)),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    if (per_sm < 1) fail(fmt::format("{}: the block-SM kernel cannot run on this device (occupancy 0)", who));

    grid = 2 * dev.sm_count;
    check(a.cuMemAlloc(&dbuf, grid * 4ull), "cuMemAlloc");
    void* p = nullptr;
    check(a.cuMemAllocHost(&p, grid * 4ull), "cuMemAllocHost");
    host = static_cast<std::uint32_t*>(p);
    check(a.cuMemAllocHost(&p, grid * 4ull), "cuMemAllocHost");
    zero = static_cast<std::uint32_t*>(p);
    std::memset(zero, 0, grid * 4ull);
  }

  void cleanup() {
    // A kernel that never finished may still be queued: tearing down would
    // block on it. Leak instead; the caller leaves with _exit().
    if (drv.wedged()) return;
    if (stream) a.cuStreamDestroy(stream);
    if (dbuf) a.cuMemFree(dbuf);
    if (host) a.cuMemFreeHost(host);
    if (zero) a.cuMemFreeHost(zero);
    if (module) a.cuModuleUnload(module);
    if (pushed) {
      CUcontext c = nullptr;
      a.cuCtxPopCurrent(&c);
    }
    if (have_ctx) a.cuDevicePrimaryCtxRelease(cu_dev);
    stream = nullptr;
    dbuf = 0;
    host = zero = nullptr;
    module = nullptr;
    pushed = have_ctx = false;
  }

  // Bounded, as every GPU wait of nvtaskset's (calibration.cpp).
  void wait() {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const CUresult r = a.cuStreamQuery(stream);
      if (r == CUDA_SUCCESS) return;
      if (r != CUDA_ERROR_NOT_READY) fail(fmt::format("{}: the kernel failed: {}", who, drv.describe(r)));
      if (std::chrono::steady_clock::now() >= deadline) {
        drv.mark_wedged();
        fail(fmt::format("{}: the kernel did not finish within {} ms", who, timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
};

BlockProbe::BlockProbe(CudaDriver& driver, const DeviceInfo& dev, std::chrono::milliseconds wait_timeout)
    : impl_(std::make_unique<Impl>(driver, dev, wait_timeout)) {
  if (driver.wedged()) fail(impl_->who + ": an earlier GPU wait timed out in this process; not touching the GPU");
  try {
    impl_->setup();
  } catch (...) {
    impl_->cleanup();
    throw;
  }
}

BlockProbe::~BlockProbe() { impl_->cleanup(); }

unsigned BlockProbe::blocks() const { return impl_->grid; }

std::vector<std::optional<SmId>> BlockProbe::run() {
  Impl& I = *impl_;
  I.check(I.a.cuMemcpyHtoDAsync(I.dbuf, I.zero, I.grid * 4ull, I.stream), "cuMemcpyHtoDAsync");
  unsigned long long spin = kSpinNs;
  void* args[] = {&I.dbuf, &spin};
  I.check(I.a.cuLaunchKernel(I.fn, I.grid, 1, 1, kThreads, 1, 1, static_cast<unsigned>(I.smem), I.stream, args,
                             nullptr),
          "cuLaunchKernel");
  I.check(I.a.cuMemcpyDtoHAsync(I.host, I.dbuf, I.grid * 4ull, I.stream), "cuMemcpyDtoHAsync");
  I.wait();
  std::vector<std::optional<SmId>> out(I.grid);
  for (unsigned b = 0; b < I.grid; ++b)
    if (I.host[b] != 0) out[b] = SmId{I.host[b] - 1};
  return out;
}

}  // namespace nvtaskset::topo
