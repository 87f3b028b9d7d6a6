// SPDX-License-Identifier: Apache-2.0
#include "gpu_context.hpp"

#include <cstdint>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "calibration_util.hpp"

namespace nvtaskset::topo {

using detail::fail;

GpuContext::GpuContext(CudaDriver& driver, const DeviceInfo& dev, std::string who)
    : drv_(driver), a_(driver.api()), who_(std::move(who)) {
  try {
    check(a_.cuDeviceGet(&dev_, static_cast<int>(dev.ordinal)), "cuDeviceGet");
    CUuuid uuid{};
    check(a_.cuDeviceGetUuid(&uuid, dev_), "cuDeviceGetUuid");
    if (std::memcmp(uuid.bytes, dev.uuid.data(), 16) != 0)
      fail(fmt::format("{}: device {} is not {} (CUDA_VISIBLE_DEVICES changed?)", who_, dev.ordinal,
                       uuid_to_string(dev.uuid)));
    check(a_.cuDevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
    have_ctx_ = true;
    check(a_.cuCtxPushCurrent(ctx_), "cuCtxPushCurrent");
    pushed_ = true;
    check(a_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  } catch (...) {
    teardown();
    throw;
  }
}

GpuContext::~GpuContext() { teardown(); }

void GpuContext::teardown() noexcept {
  if (drv_.wedged()) return;
  if (stream_) a_.cuStreamDestroy(stream_);
  for (CUdeviceptr p : device_buffers_) a_.cuMemFree(p);
  for (void* p : host_buffers_) a_.cuMemFreeHost(p);
  for (CUmodule m : modules_) a_.cuModuleUnload(m);
  if (pushed_) {
    CUcontext c = nullptr;
    a_.cuCtxPopCurrent(&c);
  }
  if (have_ctx_) a_.cuDevicePrimaryCtxRelease(dev_);
  stream_ = nullptr;
  device_buffers_.clear();
  host_buffers_.clear();
  modules_.clear();
  pushed_ = have_ctx_ = false;
}

void GpuContext::check(CUresult r, const char* what) const {
  if (r != CUDA_SUCCESS) fail(fmt::format("{}: {} failed: {}", who_, what, drv_.describe(r)));
}

int GpuContext::attribute(CUdevice_attribute at) const {
  int v = 0;
  check(a_.cuDeviceGetAttribute(&v, at, dev_), "cuDeviceGetAttribute");
  return v;
}

CUmodule GpuContext::load_module(const char* ptx, const char* what) {
  char log[4096] = {};
  CUjit_option keys[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* vals[] = {log, reinterpret_cast<void*>(static_cast<std::uintptr_t>(sizeof log - 1))};
  CUmodule m = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  if (const CUresult r = a_.cuModuleLoadDataEx(&m, ptx, 2, keys, vals); r != CUDA_SUCCESS) {
    std::string first_line = log;
    first_line = first_line.substr(0, first_line.find('\n'));
    fail(fmt::format("{}: loading the {} failed: {}{}{}", who_, what, drv_.describe(r), first_line.empty() ? "" : ": ",
                     first_line));
  }
  modules_.push_back(m);
  spdlog::debug("{}: {} JIT-compiled in {:.1f} ms", who_, what,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return m;
}

CUdeviceptr GpuContext::alloc_device(std::size_t bytes) {
  CUdeviceptr p = 0;
  check(a_.cuMemAlloc(&p, bytes), "cuMemAlloc");
  device_buffers_.push_back(p);
  return p;
}

void* GpuContext::alloc_host(std::size_t bytes) {
  void* p = nullptr;
  check(a_.cuMemAllocHost(&p, bytes), "cuMemAllocHost");
  host_buffers_.push_back(p);
  return p;
}

CUresult GpuContext::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const CUresult r = a_.cuStreamQuery(stream_);
    if (r != CUDA_ERROR_NOT_READY) return r;
    if (std::chrono::steady_clock::now() >= deadline) {
      drv_.mark_wedged();
      return CUDA_ERROR_NOT_READY;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace nvtaskset::topo
