// SPDX-License-Identifier: Apache-2.0
// A partition as the CLI hands it to a task and the control region carries it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/options.hpp"

namespace nvtaskset {

// How the user asked for the partition; decides how `-p` prints it.
enum class SpecKind : std::uint32_t {
  kNone = 0,      // unpartitioned: the shim leaves every TMD untouched
  kTpcList = 1,   // -t LIST
  kTpcMask = 2,   // hex enable mask over logical TPC IDs
  kGpcList = 3,   // -g LIST
  kPhysical = 4,  // --physical MASK: raw TMD bits, untranslated
};

// Cluster sizes are counted in SMs of one GPC: a kernel launched with
// clusters of C blocks runs only where C SMs of ONE GPC are inside its
// partition (docs/hardware.md, "Thread-block clusters"). 0 = not known, so
// the shim does not check (pre-Hopper GPUs, unknown GPC layouts, --physical
// masks on an unknown layout).
inline constexpr std::uint32_t kClusterUnchecked = 0;

struct Partition {
  SpecKind kind = SpecKind::kNone;
  PhysicalTpcMask enabled;  // TMD bits the task may use; the TMD receives the complement
  LogicalTpcSet tpcs;       // the logical view, for display (empty for kPhysical)
  GpcSet gpcs;              // for kGpcList
  // Largest thread-block cluster (SMs of one GPC) `enabled` can host, or
  // kClusterUnchecked. Computed by the CLI from the topology when the
  // partition is written, never in the launch callback.
  std::uint32_t max_cluster = kClusterUnchecked;
  // The smallest set of whole GPCs that holds the partition (its GPC
  // closure), and the largest cluster that set hosts: where a launch goes
  // under NVTASKSET_ON_CLUSTER_MISFIT=widen. Empty when GPCs are unknown.
  PhysicalTpcMask widened;
  std::uint32_t widened_max_cluster = kClusterUnchecked;

  bool active() const noexcept { return kind != SpecKind::kNone; }
  bool operator==(const Partition&) const = default;
};

// A GPU UUID (cuDeviceGetUuid). All zeros means "any device".
using DeviceUuid = std::array<std::uint8_t, 16>;
inline constexpr DeviceUuid kAnyDevice{};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the form nvidia-smi prints.
std::string uuid_to_string(const DeviceUuid& u);
// Accepts the form above, with or without "GPU-", with or without dashes.
std::optional<DeviceUuid> uuid_from_string(std::string_view s);

// What the CLI knew of the device when it set a partition. Carried in the
// control region so that `nvtaskset -p` can translate lists for a running
// task from the cached topology, without initialising the driver (cuInit
// takes about 150 ms on an H200; a repartition should take a few ms).
struct DeviceDesc {
  std::uint32_t sm_count = 0;  // 0 = unknown
  std::uint32_t cc_major = 0;
  std::uint32_t cc_minor = 0;
  std::int32_t driver_version = 0;  // cuDriverGetVersion of the task's driver
  bool known() const noexcept { return sm_count != 0; }
  bool operator==(const DeviceDesc&) const = default;
};

// One device's partition inside a task.
struct DevicePartition {
  DeviceUuid device = kAnyDevice;
  Partition partition;
  DeviceDesc desc;
  bool operator==(const DevicePartition&) const = default;
};

// The environment variable through which the CLI passes partitions to the
// task it starts (and a partitioned task to the children it execs).
inline constexpr const char* kPartitionEnv = option(Option::kPartition).name;
// The PID of the process the CLI exec'd with kPartitionEnv. The shim in that
// process takes kPartitionEnv even when its parent is itself partitioned
// (otherwise a child inherits its parent's live partition).
inline constexpr const char* kPartitionPidEnv = option(Option::kPartitionPid).name;

// Text form: entries separated by ';', each
//   <device>,<kind>,<enabled hex>,<tpcs hex>,<gpcs hex>,<sms>,<cc major>,<cc minor>,<driver version>,
//   <max cluster>,<widened hex>,<widened max cluster>
// with <device> either '*' or a UUID string. Round-trips exactly.
std::string encode_partitions(const std::vector<DevicePartition>& parts);
// Throws std::invalid_argument with a one-line reason on malformed text, or
// on a partition that partition_problem() refuses.
std::vector<DevicePartition> decode_partitions(std::string_view text);

// Which thread-block clusters a subset of a GPU's TPCs hosts, in mask bits,
// for a task's shim, which has no topology. A best-effort task's floor (its
// partition without the latency-critical reservations) is known only in its
// shim, as those tasks come and go; the CLI hands it this summary of the
// GPU's layout (NVTASKSET_CLUSTER_MAP), and the shim asks it whenever the
// floor changes, never in the launch callback.
struct ClusterMap {
  // One GPC: the mask bits of its cluster-capable TPCs, and the largest
  // cluster it ran (SMs; 0 = not measured, no cap).
  struct Gpc {
    PhysicalTpcMask capable;
    std::uint32_t max_cluster = 0;
    bool operator==(const Gpc&) const = default;
  };
  DeviceUuid device = kAnyDevice;
  PhysicalTpcMask capable;  // every cluster-capable TPC, of a known GPC or not
  std::vector<Gpc> gpcs;
  bool operator==(const ClusterMap&) const = default;
};
// At most this many GPCs a map (a GH100 has 8).
inline constexpr unsigned kMaxMapGpcs = 32;

// The largest cluster (SMs of one GPC) a kernel can be launched with on the
// TPCs `set` enables: topo::largest_hostable_cluster's rule over mask bits
// (the most cluster-capable SMs one GPC has in the set, capped by the
// largest it ran; 2 as soon as the set holds one cluster-capable TPC, whose
// two SMs share a GPC; else 1).
std::uint32_t hostable_cluster(const ClusterMap& m, const Bits128& set) noexcept;

// Text form: maps separated by ';', each
//   <device>:<capable hex>[:<gpc capable hex>/<max cluster>]...
// with <device> '*' or a UUID string. Round-trips exactly; decoding throws
// std::invalid_argument with a one-line reason.
std::string encode_cluster_maps(const std::vector<ClusterMap>& maps);
std::vector<ClusterMap> decode_cluster_maps(std::string_view text);

// Why `dp` cannot be a partition of the GPU its descriptor describes, or ""
// (nothing to check when the descriptor is unknown). A kernel whose mask
// enables no working TPC is accepted and never runs (docs/hardware.md), so a
// partition that enables only bits the GPU lacks is refused wherever it is
// decoded or written into a region. With the descriptor alone this is
// certain only for logical TPC lists (TPC k < SMs / 2) and, before Hopper,
// for masks (bit k controls TPC k); on Hopper and later a physical bit may
// control a working TPC above that number, and only the CLI, with the
// topology, can check it.
std::string partition_problem(const DevicePartition& dp);

}  // namespace nvtaskset
