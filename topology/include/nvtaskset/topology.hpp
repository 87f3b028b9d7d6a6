// topology/: what each GPU looks like, and the ONE place where logical TPC or
// GPC lists become physical TMD mask bits.
#pragma once

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
  int driver_version = 0;  // cuDriverGetVersion, e.g. 13000

  unsigned tpc_count() const { return sm_count / 2; }
  // Before Hopper, TMD mask bit k controls logical TPC k (FACTS.md).
  bool mask_bits_are_logical() const { return cc_major < 9; }
};

struct TpcInfo {
  LogicalTpcId id;
  std::optional<PhysicalTpcBit> bit;  // the TMD bit that controls it
  std::optional<GpcId> gpc;           // unknown when no source could tell
  bool cluster_capable = false;       // ever hosted a thread-block-cluster block
};

struct GpcInfo {
  GpcId id;
  std::vector<LogicalTpcId> tpcs;
  unsigned max_cluster = 0;  // largest cluster size (in blocks, 1 block/SM) it ran; 0 = none/unknown
};

struct Topology {
  DeviceInfo device;
  std::vector<TpcInfo> tpcs;  // index == logical TPC ID, size == device.tpc_count()
  std::vector<GpcInfo> gpcs;  // empty when GPCs are unknown
  std::string source;         // "identity", "calibration", "file", "nvdebug", ...
  // Set when every logical TPC has a known mask bit.
  bool bits_known() const;
  // The mask bits that control at least one working TPC.
  PhysicalTpcMask working_bits() const;
};

// Topology that needs no calibration: pre-Hopper devices (identity bits).
// Returns nullopt on Hopper and newer.
std::optional<Topology> identity_topology(const DeviceInfo& dev);

// Translation. Each throws ctl::Error-like std::runtime_error with a one-line
// message naming the offending ID ("TPC 70 does not exist on device 0 (TPCs 0-65)").
PhysicalTpcMask to_physical(const Topology& t, const LogicalTpcSet& tpcs);
LogicalTpcSet tpcs_of_gpcs(const Topology& t, const GpcSet& gpcs);
LogicalTpcSet all_tpcs(const Topology& t);
// Reverse: the logical TPCs a physical enable mask leaves usable.
LogicalTpcSet logical_of_physical(const Topology& t, const PhysicalTpcMask& m);

}  // namespace nvtaskset::topo
