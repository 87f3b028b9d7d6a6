// SPDX-License-Identifier: Apache-2.0
// The real CUDA driver, opened at run time (never linked: the shim is also
// named libcuda.so.1, see driver_locate.hpp), and the devices it reports.
//
// Constructing a CudaDriver makes this process a NON-MPS client: before
// cuInit it points CUDA_MPS_PIPE_DIRECTORY at a fresh, empty, private
// directory, because under MPS %smid is virtualised (each client sees SM IDs
// renumbered from 0), which would make calibration measure nonsense
// (docs/hardware.md, "%smid and MPS"). The original value is put back by
// restore_environment() (call it before exec'ing a task) or the destructor.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nvtaskset/driver_locate.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo {

// Resolves a driver symbol by its exported name ("cuMemAlloc_v2"); nullptr
// when absent. Lets tests stand in a simulated driver without dlopen.
using SymbolResolver = std::function<void*(const char* name)>;

struct DriverOptions {
  // How to find the real driver; set `locate.exclude` to the shim path(s).
  LocateOptions locate;
  // Point CUDA_MPS_PIPE_DIRECTORY at an empty private directory before cuInit.
  bool private_mps_pipe = true;
  // Tests: resolve symbols through this instead of dlopen()ing a driver.
  SymbolResolver resolver;
  // Tests: the library path to report with `resolver`.
  std::string library_path;
};

class CudaDriver {
 public:
  // Opens the driver, resolves the functions calibration needs, and calls
  // cuInit(0). Throws std::runtime_error with one line:
  //   "no CUDA driver found: <why>", "cuInit failed: CUDA_ERROR_NO_DEVICE (100)".
  explicit CudaDriver(const DriverOptions& opts = {});
  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  // Every device this process sees (CUDA_VISIBLE_DEVICES applies).
  std::vector<DeviceInfo> query_devices() const;

  int driver_version() const;                 // cuDriverGetVersion, e.g. 13000
  const std::string& driver_release() const;  // "580.159.04", or "" when unknown
  const std::string& library_path() const;    // the driver file that was opened

  // Puts CUDA_MPS_PIPE_DIRECTORY back as it was (unset if it was unset).
  // Call it before exec'ing a task that must reach the MPS daemon. Harmless
  // to call twice; the destructor calls it too.
  void restore_environment();
  // The private pipe directory in use ("" when none).
  const std::string& private_mps_pipe_dir() const;

  // True after a GPU wait timed out: the GPU may still run (or never run) a
  // kernel of ours. Do not tear anything down; leave with _exit().
  bool wedged() const;
  void mark_wedged();

  // "CUDA_ERROR_NO_DEVICE (100)".
  std::string describe(int result) const;

  // The resolved function table (src/cuda_api.hpp); for calibration.
  struct Api;
  const Api& api() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Picks a device by index ("1"), UUID ("GPU-..." in full or an unambiguous
// prefix, or the 32 hex digits), or PCI bus ID ("0000:3b:00.0", "3b:00.0",
// "00000000:3B:00.0"). Throws std::runtime_error with one line that lists the
// devices that exist.
DeviceInfo select_device(const std::vector<DeviceInfo>& devices, std::string_view spec);

// "0000:3b:00.0" from any of the accepted PCI forms; nullopt if malformed.
std::optional<std::string> normalize_pci_bus_id(std::string_view s);

}  // namespace nvtaskset::topo
