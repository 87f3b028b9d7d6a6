// SPDX-License-Identifier: Apache-2.0
// Who holds which TPCs of a GPU, from the public status (control/status.hpp),
// and what a partition shares with them. Pure: no process is read here.
#pragma once

#include <sys/types.h>

#include <set>
#include <vector>

#include "nvtaskset/partition.hpp"
#include "nvtaskset/status.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::planner {

// Another live task's partition on one GPU.
struct Holder {
  pid_t pid = 0;
  uid_t uid = 0;
  LogicalTpcSet tpcs;
};

// The TPCs a partition holds: its logical view, or for a physical mask its
// translation through `t` (empty when the layout is unknown).
LogicalTpcSet logical_view(const Partition& p, const topo::Topology* t);

// The live partitions on `dev` in `status`, but those of `exclude`. A
// partition for any GPU counts on every GPU. A physical mask counts through
// the layout `t` (skipped when it is unknown).
std::vector<Holder> holders_on(const std::vector<ctl::StatusEntry>& status, const topo::DeviceInfo& dev,
                               const topo::Topology* t, const std::set<pid_t>& exclude);

LogicalTpcSet held_by(const std::vector<Holder>& holders);

// The entries of `after` that `before` does not have as they are: tasks that
// appeared, and tasks whose partitions changed (or whose PID was reused).
std::vector<ctl::StatusEntry> changed_since(const std::vector<ctl::StatusEntry>& before,
                                            const std::vector<ctl::StatusEntry>& after);

// How `mine` relates to the others: the PIDs it shares TPCs with, and
// (with `t`'s GPCs; without them TPCs only) those it shares only a GPC with.
struct Overlap {
  std::vector<pid_t> share_tpcs;  // pids whose TPCs intersect mine
  std::vector<pid_t> share_gpcs;  // pids with no common TPC but a common GPC
  LogicalTpcSet common_tpcs;      // all TPCs mine shares
  GpcSet common_gpcs;             // GPCs shared with share_gpcs
};
Overlap overlap_with(const topo::Topology* t, const LogicalTpcSet& mine, const std::vector<Holder>& others);

}  // namespace nvtaskset::planner
