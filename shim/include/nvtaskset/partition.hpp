// A partition as the CLI hands it to a task and the control region carries it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nvtaskset/bits.hpp"

namespace nvtaskset {

// How the user asked for the partition; decides how `-p` prints it.
enum class SpecKind : std::uint32_t {
  kNone = 0,      // unpartitioned: the shim leaves every TMD untouched
  kTpcList = 1,   // -t LIST
  kTpcMask = 2,   // hex enable mask over logical TPC IDs
  kGpcList = 3,   // -g LIST
  kPhysical = 4,  // --physical MASK: raw TMD bits, untranslated
};

struct Partition {
  SpecKind kind = SpecKind::kNone;
  PhysicalTpcMask enabled;  // TMD bits the task may use; the TMD receives the complement
  LogicalTpcSet tpcs;       // the logical view, for display (empty for kPhysical)
  GpcSet gpcs;              // for kGpcList

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

// One device's partition inside a task.
struct DevicePartition {
  DeviceUuid device = kAnyDevice;
  Partition partition;
  bool operator==(const DevicePartition&) const = default;
};

// The environment variable through which the CLI passes partitions to the
// task it starts (and a partitioned task to the children it execs).
inline constexpr const char* kPartitionEnv = "NVTASKSET_PARTITION";
// The PID of the process the CLI exec'd with kPartitionEnv. The shim in that
// process takes kPartitionEnv even when its parent is itself partitioned
// (otherwise a child inherits its parent's live partition).
inline constexpr const char* kPartitionPidEnv = "NVTASKSET_PARTITION_PID";

// Text form: entries separated by ';', each
//   <device>,<kind>,<enabled hex>,<tpcs hex>,<gpcs hex>
// with <device> either '*' or a UUID string. Round-trips exactly.
std::string encode_partitions(const std::vector<DevicePartition>& parts);
// Throws std::invalid_argument with a one-line reason on malformed text.
std::vector<DevicePartition> decode_partitions(std::string_view text);

}  // namespace nvtaskset
