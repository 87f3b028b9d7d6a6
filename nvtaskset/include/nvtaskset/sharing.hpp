// SPDX-License-Identifier: Apache-2.0
// `nvtaskset --status`: every partitioned task on the machine, who holds
// which TPCs, what overlaps. Who holds what, and the claim, are the
// planner's (holders.hpp, claim.hpp).
#pragma once

#include <sys/types.h>

#include <string>

#include "nvtaskset/claim.hpp"
#include "nvtaskset/devices.hpp"
#include "nvtaskset/holders.hpp"

namespace nvtaskset::cli {

// The command line's names for the planner's (the CLI had them first).
using planner::changed_since;
using planner::claim_union;
using planner::held_by;
using planner::Holder;
using planner::holders_on;
using planner::logical_view;
using planner::Overlap;
using planner::overlap_with;
using planner::repair_entry;
using planner::role_in;

// The login name of `uid`, or the number when it has none.
std::string user_name(uid_t uid);

// `nvtaskset --status [--json]`: every partitioned task on this machine.
int print_status(Devices& devices, bool json);

}  // namespace nvtaskset::cli
