// SPDX-License-Identifier: Apache-2.0
// The block-placement probe of `nvtaskset --verify` (block_probe.hpp). It runs
// in the same kind of GPU context as calibration's session (gpu_context.hpp),
// but subscribes no launch callback: the mask its kernels get is the shim's.
#include "nvtaskset/block_probe.hpp"

#include <cstring>
#include <string>

#include <fmt/format.h>

#include "calibration_util.hpp"
#include "cuda_api.hpp"
#include "gpu_context.hpp"
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
      : dev(dv), timeout(t), ctx(d, dv, fmt::format("the probe on device {}", dv.ordinal)) {
    const CudaDriver::Api& a = ctx.api();
    // One block per SM: more dynamic shared memory than half an SM has.
    smem = ctx.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    CUmodule module = ctx.load_module(block_smid_kernel_ptx(), "block-SM kernel");
    ctx.check(a.cuModuleGetFunction(&fn, module, "nvtaskset_record_block_smid"), "cuModuleGetFunction");
    ctx.check(a.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
              "cuFuncSetAttribute(dynamic shared memory)");
    int per_sm = 0;
    ctx.check(a.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, static_cast<size_t>(smem)),
              "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    if (per_sm < 1) fail(fmt::format("{}: the block-SM kernel cannot run on this device (occupancy 0)", ctx.who()));

    grid = 2 * dev.sm_count;
    dbuf = ctx.alloc_device(grid * 4ull);
    host = static_cast<std::uint32_t*>(ctx.alloc_host(grid * 4ull));
    zero = static_cast<std::uint32_t*>(ctx.alloc_host(grid * 4ull));
    std::memset(zero, 0, grid * 4ull);
  }

  DeviceInfo dev;
  std::chrono::milliseconds timeout;
  GpuContext ctx;  // torn down (or leaked, when wedged) with this
  CUfunction fn = nullptr;
  int smem = 0;
  unsigned grid = 0;
  CUdeviceptr dbuf = 0;
  std::uint32_t* host = nullptr;
  std::uint32_t* zero = nullptr;

  // Bounded, as every GPU wait of nvtaskset's (gpu_context.hpp).
  void wait() {
    const CUresult r = ctx.wait(timeout);
    if (r == CUDA_SUCCESS) return;
    if (r == CUDA_ERROR_NOT_READY)
      fail(fmt::format("{}: the kernel did not finish within {} ms", ctx.who(), timeout.count()));
    fail(fmt::format("{}: the kernel failed: {}", ctx.who(), ctx.driver().describe(r)));
  }
};

BlockProbe::BlockProbe(CudaDriver& driver, const DeviceInfo& dev, std::chrono::milliseconds wait_timeout) {
  if (driver.wedged())
    fail(fmt::format("the probe on device {}: an earlier GPU wait timed out in this process; not touching the GPU",
                     dev.ordinal));
  impl_ = std::make_unique<Impl>(driver, dev, wait_timeout);
}

BlockProbe::~BlockProbe() = default;

unsigned BlockProbe::blocks() const { return impl_->grid; }

std::vector<std::optional<SmId>> BlockProbe::run() {
  Impl& I = *impl_;
  const CudaDriver::Api& a = I.ctx.api();
  const CUstream stream = I.ctx.stream();
  I.ctx.check(a.cuMemcpyHtoDAsync(I.dbuf, I.zero, I.grid * 4ull, stream), "cuMemcpyHtoDAsync");
  unsigned long long spin = kSpinNs;
  void* args[] = {&I.dbuf, &spin};
  I.ctx.check(a.cuLaunchKernel(I.fn, I.grid, 1, 1, kThreads, 1, 1, static_cast<unsigned>(I.smem), stream, args,
                               nullptr),
              "cuLaunchKernel");
  I.ctx.check(a.cuMemcpyDtoHAsync(I.host, I.dbuf, I.grid * 4ull, stream), "cuMemcpyDtoHAsync");
  I.wait();
  std::vector<std::optional<SmId>> out(I.grid);
  for (unsigned b = 0; b < I.grid; ++b)
    if (I.host[b] != 0) out[b] = SmId{I.host[b] - 1};
  return out;
}

}  // namespace nvtaskset::topo
