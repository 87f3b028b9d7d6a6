// SPDX-License-Identifier: Apache-2.0
// The nvdebug kernel module's topology registers (docs/hardware.md, "GPCs and
// thread-block clusters"). nvdebug exposes, under /proc/gpuN/, hex text files:
//   num_gpcs            GPC slots of the chip
//   gpc_mask            set bit = GPC disabled (floorswept)
//   num_tpc_per_gpc     TPC slots per GPC
//   gpc<i>_tpc_mask     set bit = TPC disabled in physical GPC i
//   CWD_GPC_TPC_ID<k>   4 TPCs per register, one byte each; the upper nibble
//                       of byte j is the GPC of logical TPC 4k+j
// nvdebug numbers GPUs in PCI bus order over every NVIDIA GPU of the machine
// (libsmctrl sets CUDA_DEVICE_ORDER=PCI_BUS_ID and unsets
// CUDA_VISIBLE_DEVICES to match it), not in CUDA's order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo {

struct NvdebugLayout {
  std::string dir;                     // e.g. "/proc/gpu0"
  unsigned num_gpcs = 0;               // GPC slots
  std::uint64_t gpc_mask = 0;          // set bit = disabled GPC
  unsigned tpcs_per_gpc = 0;           // TPC slots per GPC
  std::vector<unsigned> enabled_tpcs_per_gpc;  // per ENABLED physical GPC, in slot order
  std::vector<GpcId> gpc_of_tpc;       // index = logical TPC; GPC IDs as the registers give them

  unsigned tpc_count() const { return static_cast<unsigned>(gpc_of_tpc.size()); }
  unsigned gpc_count() const { return static_cast<unsigned>(enabled_tpcs_per_gpc.size()); }
};

// nullopt when <root>/gpu<index> does not exist (nvdebug not loaded: "not
// available"). Throws std::runtime_error with one line for a missing or
// malformed file, or registers that contradict each other.
std::optional<NvdebugLayout> read_nvdebug(const std::string& root, unsigned gpu_index);

// nvdebug's index of the GPU at `pci_bus_id` ("0000:3b:00.0"): its rank among
// the NVIDIA display/3D controllers under `sysfs_pci_root`
// (/sys/bus/pci/devices) in bus-ID order. nullopt when it is not listed.
std::optional<unsigned> nvdebug_index_of(const std::string& pci_bus_id,
                                         const std::string& sysfs_pci_root = "/sys/bus/pci/devices");

// Gives a topology whose GPCs are unknown (identity, pre-Hopper) nvdebug's
// GPCs. Throws when nvdebug describes a different number of TPCs.
void apply_nvdebug_gpcs(Topology& t, const NvdebugLayout& nv);

// Compares a calibrated topology with nvdebug. Returns a one-line warning
// when they disagree (different TPC count, or TPCs grouped differently, GPC
// numbering aside; TPCs calibration could not place are not compared), or
// nullopt when they agree.
std::optional<std::string> cross_check_nvdebug(const Topology& calibrated, const NvdebugLayout& nv);

// Cross-checks, then: when they agree, renumbers the GPCs as nvdebug numbers
// them and fills in the GPC of TPCs calibration could not place (they stay
// cluster_capable = false); source gains "+nvdebug". When they disagree the
// calibration is kept and the warning is appended to t.warnings. Returns the
// warning, if any.
std::optional<std::string> merge_nvdebug(Topology& t, const NvdebugLayout& nv);

}  // namespace nvtaskset::topo
