// SPDX-License-Identifier: Apache-2.0
// The planner: a request (request.hpp) becomes a partition of one GPU, with
// every check made before anything is started or changed. What it is planned
// against is the public status of the other live tasks and the user's
// sharing options (Sharing); what it needs of the GPU is its layout
// (Layouts). The command line (nvtaskset/) and any other launcher (a Slurm
// plugin) plan through it, then claim the choice (claim.hpp) and deliver it
// (the task's environment at launch, its control region for a live change).
//
// Nothing here prints: refusals are thrown (Refusal, one line), and what is
// to be said once the change is certain is returned (Notes).
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvtaskset/holders.hpp"
#include "nvtaskset/partition.hpp"
#include "nvtaskset/request.hpp"
#include "nvtaskset/task_role.hpp"
#include "nvtaskset/status.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::planner {

// A request that cannot be planned: what() is one line.
struct Refusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The GPUs' layouts as the planner asks for them. The CLI's Devices (driver
// query, device cache, calibration) implements it; tests give fixed layouts.
class Layouts {
 public:
  virtual ~Layouts() = default;
  // The layout, calibrating when needed. Throws with a one-line reason.
  virtual const topo::Topology& topology(const topo::DeviceInfo& dev) = 0;
  // The layout when it is known without calibrating (file, cache,
  // identity); nullptr otherwise.
  virtual const topo::Topology* known_topology(const topo::DeviceInfo& dev) = 0;
};

// What a launch or a change asks of sharing.
struct SharingOptions {
  bool spread = false;     // -n: spread over GPCs instead of packing
  bool exclusive = false;  // refuse sharing TPCs with another live partition
  roles::Role role = roles::Role::kNone;
};

// What a new partition is checked and chosen against: the other live
// partitions (the public status), and the user's sharing options.
struct Sharing {
  std::vector<ctl::StatusEntry> status;      // the entries this claim counts (visible_to its role)
  std::set<pid_t> exclude;                   // the task being changed (and, with -a, its family)
  std::map<DeviceUuid, LogicalTpcSet> keep;  // -p -n: the TPCs a task has now
  bool spread = false;
  bool exclusive = false;  // --exclusive, or --latency-critical
  // The launch's role (task_role.hpp). A latency-critical reservation is
  // exclusive but for best-effort tasks, which make way for it; a
  // best-effort partition may overlap latency-critical reservations.
  roles::Role role = roles::Role::kNone;
  // Every entry as read, the roles' own included (check_roles).
  std::vector<ctl::StatusEntry> all;
  // --exclusive, or --latency-critical: what a refusal names.
  const char* claim_name = "--exclusive";
  // With exclusive: live tasks whose kernels reach the driver around their
  // shim, and why; they run on every TPC whatever their entries say.
  std::map<pid_t, std::string> everywhere;
  // For a latency-critical claim: the largest thread-block cluster (SMs)
  // each best-effort task has launched, where this user may read its
  // region (check_roles: its floor must still host them).
  std::map<pid_t, std::uint32_t> clusters_launched;
};

// The entries a launch or change of role `role` counts as holders: a
// latency-critical reservation does not count best-effort tasks (they make
// way), and a best-effort partition does not count latency-critical ones
// (it makes way for them). Everyone else counts everyone.
std::vector<ctl::StatusEntry> visible_to(roles::Role role, std::vector<ctl::StatusEntry> status);

// The sharing context of a launch or change: the public status of the other
// tasks as it is now (ctl::read_status), and, for an exclusive claim, which
// of them run around their shim (task_driver.hpp; only where this user may
// read their maps). `exclude`: the task itself (and its family).
Sharing read_sharing(const SharingOptions& o, std::set<pid_t> exclude);
// The same from a status already read (tests, and callers that read it).
Sharing sharing_from(const SharingOptions& o, std::set<pid_t> exclude, std::vector<ctl::StatusEntry> all);

// What planning has to say, for the caller to print once the change is
// certain (a refusal stays one line).
struct Notes {
  std::vector<std::string> warnings;  // clusters it cannot host, TPCs or GPCs it shares
  std::vector<std::string> choices;   // -n: "-n 4 on device 0: TPCs 0,2,4,6" (-v says them)
};

// Turns a request into a partition for `dev`: translates lists to mask
// bits, chooses -n's TPCs (whole GPCs first, avoiding those others hold,
// keeping sh.keep), refuses what cannot run or, for an exclusive claim,
// would share, and computes the cluster limits the shim checks. Writes
// nothing. Throws Refusal, or ParseError for an ID the GPU lacks.
Partition plan_partition(const Request& r, const topo::DeviceInfo& dev, Layouts& layouts, const Sharing& sh,
                         Notes* notes);

// What a launch or a change chose on one GPU: to claim and deliver.
struct Choice {
  const topo::DeviceInfo* dev;
  Partition partition;
};

// What is left to a best-effort task while latency-critical tasks are busy
// (its floor) must not be empty: a reservation that would leave a live
// best-effort task (in sh.all) no TPC is refused, and so is a best-effort
// partition inside the reservations. As -p does for a task's own
// partition, a reservation that would leave a best-effort task a floor
// that cannot host the clusters it has launched (sh.clusters_launched) is
// refused too: those kernels would run over the reservation. Throws Refusal.
void check_roles(roles::Role role, const std::vector<Choice>& chosen, const Sharing& sh, Layouts& layouts);

// Every working TPC of the GPU, as a partition (a latency-critical task's
// burst pool, --best-effort without a list).
Partition whole_gpu(const topo::Topology& t);

// The GPU's cluster layout for a best-effort task's shim (partition.hpp,
// ClusterMap); nullopt when the GPU has no clusters or its GPC layout or
// mask bits are unknown (the shim then keeps no clustered kernel on a floor).
std::optional<ClusterMap> cluster_map_of(const topo::Topology& t, const DeviceUuid& device);

// "device 0", or the UUID of a device known only from a task's region.
std::string device_label(const topo::DeviceInfo& d);
// What a region or status entry carries of the device (partition.hpp).
DeviceDesc describe_device(const topo::DeviceInfo& d);
// "TPCs 0-3" / "GPCs 1-2" / "physical mask 0x..": the partition in a phrase.
std::string phrase(const Partition& p);
// "42, 43": PIDs as messages name them.
std::string pid_list(const std::vector<pid_t>& pids);
// A warning when `tpcs` cannot host some cluster size the GPU supports, with
// a GPC-aligned list of the same size that can; "" when none.
std::string cluster_warning(const topo::Topology& t, const LogicalTpcSet& tpcs);

}  // namespace nvtaskset::planner
