// SPDX-License-Identifier: Apache-2.0
// topology/: what each GPU looks like, and the ONE place where logical TPC or
// GPC lists become physical TMD mask bits.
//
// Related headers:
//   nvtaskset/cuda_driver.hpp      the real driver (dlopen), devices, -d specs
//   nvtaskset/topology_source.hpp  get_topology(): file, cache, nvdebug, calibration
//   nvtaskset/calibration.hpp      measuring a GPU's layout (sm_90+: bits and GPCs)
//   nvtaskset/nvdebug.hpp          the nvdebug kernel module's /proc/gpuN registers
//   nvtaskset/topology_json.hpp    the JSON schema (docs/topology.md)
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/partition.hpp"

namespace nvtaskset::topo {

// What the driver reports about one device.
struct DeviceInfo {
  unsigned ordinal = 0;  // as the calling process sees it (CUDA_VISIBLE_DEVICES applies)
  std::string name;
  DeviceUuid uuid{};
  std::string pci_bus_id;  // "0000:3b:00.0"
  int cc_major = 0;
  int cc_minor = 0;
  unsigned sm_count = 0;
  int driver_version = 0;      // cuDriverGetVersion, e.g. 13000
  std::string driver_release;  // e.g. "580.159.04"; empty when unknown

  unsigned tpc_count() const { return sm_count / 2; }
  // Before Hopper, TMD mask bit k controls logical TPC k (docs/hardware.md).
  bool mask_bits_are_logical() const { return cc_major < 9; }
  // Thread-block clusters exist from sm_90 on.
  bool has_clusters() const { return cc_major >= 9; }
};

struct TpcInfo {
  LogicalTpcId id;
  std::optional<PhysicalTpcBit> bit;  // the TMD bit that controls it
  std::optional<GpcId> gpc;           // unknown when no source could tell
  bool cluster_capable = false;       // ever hosted a thread-block-cluster block
};

struct GpcInfo {
  GpcId id;
  std::vector<LogicalTpcId> tpcs;  // ascending
  unsigned max_cluster = 0;  // largest cluster size (in blocks, 1 block/SM) it ran; 0 = none/unknown
};

struct Topology {
  DeviceInfo device;
  std::vector<TpcInfo> tpcs;  // index == logical TPC ID, size == device.tpc_count()
  std::vector<GpcInfo> gpcs;  // empty when GPCs are unknown; index == GPC ID
  std::string source;         // "identity", "calibration", "file", "nvdebug" suffixes ("calibration+nvdebug")
  std::string calibrated_at;  // ISO 8601 UTC when measured on the GPU; empty otherwise
  std::optional<double> calibration_ms;  // how long the measurement took
  std::string gpc_note;                  // why GPCs are (partly) unknown; empty when all known
  std::vector<std::string> warnings;     // e.g. nvdebug and calibration disagree

  // Set when every logical TPC has a known mask bit.
  bool bits_known() const;
  // The mask bits that control at least one working TPC.
  PhysicalTpcMask working_bits() const;
  bool gpcs_known() const { return !gpcs.empty(); }
  // The largest cluster size any GPC ran (0: none, unknown, or pre-Hopper).
  unsigned max_cluster() const;
};

// Progress of a long operation (calibration): `done` of `total` steps.
using ProgressFn = std::function<void(unsigned done, unsigned total)>;

// Topology that needs no calibration: pre-Hopper devices (identity bits).
// Returns nullopt on Hopper and newer.
std::optional<Topology> identity_topology(const DeviceInfo& dev);

// Checks the invariants every Topology must satisfy (tpcs[i].id == i, unique
// bits < 128, GPC lists consistent with per-TPC GPCs, ...). Throws
// std::runtime_error with a one-line message. The JSON loader and the
// calibration run it on what they produce.
void validate(const Topology& t);

// Translation. Each throws std::runtime_error with a one-line message naming
// the offending ID ("TPC 70 does not exist on device 0 (TPCs 0-65)").
// to_physical: the enable mask for `tpcs`. Rejects an empty set, TPCs that do
// not exist and TPCs whose bit is unknown; never returns a mask without a
// working TPC (such a mask makes kernels wait forever, docs/hardware.md).
PhysicalTpcMask to_physical(const Topology& t, const LogicalTpcSet& tpcs);
// The TPCs of the given GPCs whose GPC is known. Rejects an empty set, GPCs
// that do not exist, and any GPC list when the GPC layout is unknown.
LogicalTpcSet tpcs_of_gpcs(const Topology& t, const GpcSet& gpcs);
// Every logical TPC of the device.
LogicalTpcSet all_tpcs(const Topology& t);
// Reverse: the logical TPCs a physical enable mask leaves usable.
LogicalTpcSet logical_of_physical(const Topology& t, const PhysicalTpcMask& m);

// Which thread-block-cluster sizes a partition can run. A kernel with cluster
// size C needs C SMs of one GPC inside its partition, or it never runs
// (docs/hardware.md). Size C counts as runnable on the set when some GPC g has at least
// ceil(C/2) cluster-capable TPCs inside the set and C <= g.max_cluster.
inline constexpr unsigned kClusterSizes[] = {2, 4, 8, 16};
struct ClusterCapability {
  std::vector<unsigned> sizes;  // runnable sizes among kClusterSizes, ascending
  unsigned largest = 0;         // largest of `sizes` (0 = no cluster runs)
  unsigned gpu_largest = 0;     // largest the whole GPU ran (0 = unknown or no clusters)
  bool known = false;           // false before Hopper or when GPCs are unknown
  // Empty when the set runs every size the GPU runs (or the GPU has no
  // clusters), else one line: "this partition cannot run thread-block clusters
  // larger than 4 (the GPU runs up to 16)".
  std::string warning;
};
ClusterCapability cluster_capability(const Topology& t, const LogicalTpcSet& tpcs);

// The largest thread-block cluster, in SMs of one GPC, that a kernel can be
// launched with on `tpcs`: the most cluster-capable SMs any one GPC has in
// the set (two per TPC, capped by the largest size that GPC ran), and 2 as
// soon as one cluster-capable TPC is in the set (a TPC's two SMs always share
// a GPC). 1 when the set holds no cluster-capable TPC. kClusterUnchecked
// (0) when the GPU has no clusters or its GPC layout is unknown.
std::uint32_t largest_hostable_cluster(const Topology& t, const LogicalTpcSet& tpcs);

// The smallest set of whole GPCs holding `tpcs` (every TPC of each GPC the
// set touches, plus the set's TPCs of unknown GPC). Equal to `tpcs` when the
// GPC layout is unknown.
LogicalTpcSet gpc_closure(const Topology& t, const LogicalTpcSet& tpcs);

// What the launch callback checks a clustered kernel against.
struct ClusterLimits {
  std::uint32_t max_cluster = kClusterUnchecked;
  LogicalTpcSet widened;  // gpc_closure(tpcs)
  std::uint32_t widened_max_cluster = kClusterUnchecked;
};
ClusterLimits cluster_limits(const Topology& t, const LogicalTpcSet& tpcs);

// `numactl --hardware`-like text, one block per GPU (see docs/topology.md).
std::string render_topology(const std::vector<Topology>& topos);
// The same as JSON: {"schema": "nvtaskset-topology/1", "devices": [...]}.
std::string render_topology_json(const std::vector<Topology>& topos);

// "0-3 8 10-11" style helpers used in messages and rendering.
std::string format_id_list(const std::vector<unsigned>& ids);  // "0 4 8" (space separated)
// "0-3,8,10-11" is format_ranges (bits.hpp).

}  // namespace nvtaskset::topo
