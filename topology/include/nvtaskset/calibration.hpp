// SPDX-License-Identifier: Apache-2.0
// Measuring a GPU's layout on the GPU itself (no kernel module).
//
// 1. Mask bit -> logical TPC, by the hang-free method of docs/hardware.md: with our
//    own launch callback writing the TMD mask, disable ONE bit at a time and
//    see which SM pair (%smid 2k, 2k+1) vanishes from a kernel that records
//    %smid on every SM. Never launch a mask that enables only non-working bits:
//    such a kernel never runs and the process hangs.
// 2. GPCs (sm_90+), from thread-block-cluster co-residency: all blocks of one
//    cluster run on one GPC, so SMs that ever share a cluster share a GPC.
//    GPC IDs are numbered 0.. in order of each group's lowest logical TPC;
//    they are not the hardware's GPC numbers (nvdebug can supply those).
//    TPCs that never host a cluster block get an unknown GPC.
// The GPU part (calibrate) only collects observations; turning them into a
// Topology (topology_from_observations) is pure and unit-tested.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo {

class CudaDriver;

// What disabling one mask bit (and nothing else) did: the SMs that never ran
// a block although they ran one with no bit disabled.
struct BitObservation {
  PhysicalTpcBit bit;
  std::vector<SmId> vanished;  // any order; duplicates are ignored
  unsigned launches = 1;       // how many launches the value rests on (for messages)
};

// One cluster launch: for each cluster, the SMs its blocks ran on.
struct ClusterObservation {
  unsigned cluster_size = 0;
  std::vector<std::vector<SmId>> clusters;
};

struct CalibrationObservations {
  DeviceInfo device;
  std::vector<BitObservation> bits;  // one per probed bit
  unsigned probed_bits = 0;          // bits 0..probed_bits-1 were probed (for messages)
  bool clusters_probed = false;      // false before Hopper
  std::vector<ClusterObservation> cluster_runs;
  std::vector<unsigned> refused_cluster_sizes;  // sizes the device would not run (for gpc_note)
};

// Pure. Throws std::runtime_error with one line when the observations are
// inconsistent: a bit that hides anything but nothing or exactly one TPC's SM
// pair, a TPC controlled by two bits or by none, an SM ID out of range, a
// cluster with the wrong number of blocks. The result's source is
// "calibration"; calibrated_at / calibration_ms are left for the caller.
Topology topology_from_observations(const CalibrationObservations& obs);

struct CalibrationOptions {
  // Every GPU wait gives up after this long (the GPU is then "wedged").
  std::chrono::milliseconds wait_timeout{10000};
  // Baseline: launches until two in a row see every SM.
  unsigned max_baseline_launches = 16;
  // Per bit: launches until the vanished set is settled.
  unsigned max_bit_launches = 6;
  // Cluster launches per cluster size, and waves of clusters per launch.
  unsigned cluster_launches_per_size = 3;
  unsigned cluster_waves = 3;
  // How long each block stays on its SM, so the first wave covers every SM.
  unsigned spin_ns = 20000;
  // Probe GPCs with clusters (sm_90+ only).
  bool probe_clusters = true;
};

// Measures `dev` (sm_90+: bits and GPCs; before Hopper: verifies that bit k
// controls TPC k, GPCs stay unknown). Reports progress as (done, total) steps.
// Throws std::runtime_error with one line on any failure; never guesses.
Topology calibrate(CudaDriver& driver, const DeviceInfo& dev, const ProgressFn& progress = {},
                   const CalibrationOptions& opts = {});

// The embedded PTX (topology/src/kernels_ptx.inc, made by topology/kernels/regen.sh).
const char* smid_kernel_ptx();
const char* cluster_kernel_ptx();
const char* block_smid_kernel_ptx();  // nvtaskset --verify's probe (block_probe.hpp)

}  // namespace nvtaskset::topo
