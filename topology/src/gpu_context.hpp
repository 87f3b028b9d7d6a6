// SPDX-License-Identifier: Apache-2.0
// One device's primary context, current on this thread, with a stream and
// the modules and buffers loaded through it (internal to topology/): what
// calibration (calibration.cpp) and the block probe of --verify
// (block_probe.cpp) both run their kernels in.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "cuda_api.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo {

class GpuContext {
 public:
  // Finds `dev` by its ordinal and checks its UUID (CUDA_VISIBLE_DEVICES may
  // have changed since the device was listed), retains its primary context,
  // makes it current and creates a non-blocking stream. `who` starts every
  // error ("calibration of device 0"). Throws std::runtime_error with one
  // line, having undone what it did.
  GpuContext(CudaDriver& driver, const DeviceInfo& dev, std::string who);
  // Frees the buffers, unloads the modules, destroys the stream and releases
  // the context, unless the driver is wedged(): a kernel that never finished
  // may still be queued, and tearing down would block on it. Everything is
  // leaked then, and the caller leaves with _exit().
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  CudaDriver& driver() const noexcept { return drv_; }
  const CudaDriver::Api& api() const noexcept { return a_; }
  const std::string& who() const noexcept { return who_; }
  CUdevice device() const noexcept { return dev_; }
  CUstream stream() const noexcept { return stream_; }

  // Throws "<who>: <what> failed: <error>" unless `r` is CUDA_SUCCESS.
  void check(CUresult r, const char* what) const;
  int attribute(CUdevice_attribute at) const;
  // JIT-compiles `ptx`; the module lives until teardown. Throws "<who>:
  // loading the <what> failed: <error>: <first line of the JIT log>".
  CUmodule load_module(const char* ptx, const char* what);
  // Device memory and pinned host memory, freed at teardown.
  CUdeviceptr alloc_device(std::size_t bytes);
  void* alloc_host(std::size_t bytes);

  // Polls the stream until its work is done, at most `timeout`: every GPU wait
  // of nvtaskset's is bounded, since a kernel whose mask enables no working
  // TPC never runs (docs/hardware.md). CUDA_SUCCESS; the error of failed
  // work; or CUDA_ERROR_NOT_READY when it did not finish in time, and the
  // driver is then marked wedged().
  CUresult wait(std::chrono::milliseconds timeout);

 private:
  CudaDriver& drv_;
  const CudaDriver::Api& a_;
  std::string who_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  bool have_ctx_ = false, pushed_ = false;
  CUstream stream_ = nullptr;
  std::vector<CUmodule> modules_;
  std::vector<CUdeviceptr> device_buffers_;
  std::vector<void*> host_buffers_;

  void teardown() noexcept;
};

}  // namespace nvtaskset::topo
