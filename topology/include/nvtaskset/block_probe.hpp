// SPDX-License-Identifier: Apache-2.0
// Where the blocks of a kernel run: the probe behind `nvtaskset --verify`.
//
// It launches the block-SM kernel (topology/kernels/block_smid.cu) on one
// device; each block records the %smid it ran on. Unlike calibration, the
// probe writes no TPC mask of its own: its kernels get whatever mask this
// process's launch hook writes. `nvtaskset --verify` runs it in a process that
// loaded the shim (nvtaskset/src/verify.cpp), so what it measures is what a
// task under nvtaskset gets.
//
// Blocks are spread as calibration spreads them (calibration.hpp): each asks
// for more dynamic shared memory than half an SM has, so one block fits per
// SM and the first wave of the grid (2 x SM count blocks) reaches every SM
// the mask enables. Outside MPS only: under MPS %smid is renumbered
// (docs/hardware.md, "MPS"); the CudaDriver the probe runs on keeps this
// process out of MPS.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo {

class CudaDriver;

class BlockProbe {
 public:
  // Context, stream, kernel and buffers on `dev` (found by its ordinal, and
  // checked by UUID). Throws std::runtime_error with one line.
  BlockProbe(CudaDriver& driver, const DeviceInfo& dev, std::chrono::milliseconds wait_timeout);
  ~BlockProbe();
  BlockProbe(const BlockProbe&) = delete;
  BlockProbe& operator=(const BlockProbe&) = delete;

  // Blocks per launch.
  unsigned blocks() const;

  // One launch: for each block, the SM it ran on (nullopt: it never ran).
  // Throws std::runtime_error with one line on a CUDA error, and when the
  // kernel does not finish within the timeout: a mask that enables no working
  // TPC makes it wait forever (docs/hardware.md). The driver is then
  // wedged(): tear nothing down, leave with _exit().
  std::vector<std::optional<SmId>> run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvtaskset::topo
