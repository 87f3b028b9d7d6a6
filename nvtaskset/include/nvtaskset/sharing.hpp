// SPDX-License-Identifier: Apache-2.0
// Sharing a GPU between tasks: who holds which TPCs (from the public status,
// control/status.hpp), what overlaps, and `nvtaskset --status`.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

#include "nvtaskset/control_region.hpp"
#include "nvtaskset/devices.hpp"
#include "nvtaskset/status.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::cli {

// Another live task's partition on one GPU.
struct Holder {
  pid_t pid = 0;
  uid_t uid = 0;
  LogicalTpcSet tpcs;
};

// The live partitions on `dev` in `status`, but those of `exclude`. A
// partition for any GPU counts on every GPU. A physical mask counts through
// the layout `t` (skipped when it is unknown).
std::vector<Holder> holders_on(const std::vector<ctl::StatusEntry>& status, const topo::DeviceInfo& dev,
                               const topo::Topology* t, const std::set<pid_t>& exclude);

LogicalTpcSet held_by(const std::vector<Holder>& holders);

// The role a task's shim runs (its region's header), kNone when unknown.
roles::Role role_in(const ctl::Region& region);

// The TPCs a partition holds: its logical view, or for a physical mask its
// translation through `t` (empty when the layout is unknown).
LogicalTpcSet logical_view(const Partition& p, const topo::Topology* t);

// The entries of `after` that `before` does not have as they are: tasks that
// appeared, and tasks whose partitions changed (or whose PID was reused).
std::vector<ctl::StatusEntry> changed_since(const std::vector<ctl::StatusEntry>& before,
                                            const std::vector<ctl::StatusEntry>& after);

// How `mine` relates to the others: "" when it shares neither TPCs nor GPCs
// with any; else one line naming the first PID it shares TPCs with, or
// (without `t`'s GPCs, TPCs only) the GPCs it shares.
struct Overlap {
  std::vector<pid_t> share_tpcs;  // pids whose TPCs intersect mine
  std::vector<pid_t> share_gpcs;  // pids with no common TPC but a common GPC
  LogicalTpcSet common_tpcs;      // all TPCs mine shares
  GpcSet common_gpcs;             // GPCs shared with share_gpcs
};
Overlap overlap_with(const topo::Topology* t, const LogicalTpcSet& mine, const std::vector<Holder>& others);

// The partition a -p's claim publishes for one GPU before it writes the
// region: every TPC of `now` and of `next`, as other choosers read an entry
// (its TPC list, else its mask through the layout).
Partition claim_union(const Partition& now, const Partition& next);

// An entry that disagrees with its task's region (a -p killed between
// publishing its claim and publishing the region's new partition; see
// docs/design.md, "Sharing a GPU") is republished from the region, unless a
// writer holds the region's lock (a -p under way: it publishes the final
// entry itself). `e.partitions` then says what the region holds. Returns
// whether the entry was repaired. Only the task's user and root can attach
// a region, so only they repair; every other reader sees the claim, which
// holds the old and the new TPCs, and so chooses around both.
bool repair_entry(ctl::StatusEntry& e, ctl::Region& region);

// The login name of `uid`, or the number when it has none.
std::string user_name(uid_t uid);

// `nvtaskset --status [--json]`: every partitioned task on this machine.
int print_status(Devices& devices, bool json);

}  // namespace nvtaskset::cli
