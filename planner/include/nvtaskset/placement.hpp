// SPDX-License-Identifier: Apache-2.0
// Choosing TPCs by count (`nvtaskset -n COUNT`): which `count` TPCs of a GPU
// a task gets when the user names only how many. Planner policy over the
// layout that topology/ describes.
#pragma once

#include <optional>
#include <string>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::planner {

enum class Placement {
  // Whole GPCs first, then as few partly used GPCs as possible: the set hosts
  // the largest thread-block cluster a set of its size can (docs/hardware.md:
  // a cluster needs its SMs in one GPC), and it shares GPCs, which do not
  // isolate (docs/hardware.md, "Interference"), with as few others as possible.
  kPacked,
  // Spread evenly over the GPCs (round robin): the most GPCs, so the most
  // L1/TEX and GPC-level bandwidth per TPC, but small clusters only.
  kSpread,
};

struct PlacementRequest {
  unsigned count = 0;
  Placement how = Placement::kPacked;
  // The TPCs it may take (e.g. those no other live partition holds). Must
  // hold at least `count` TPCs.
  LogicalTpcSet pool;
  // TPCs to keep when the rule allows (a live task's current TPCs under
  // `-p -n`): the choice is first the best by the rule, then, among equally
  // good ones, the one that keeps most of these.
  LogicalTpcSet keep;
};

struct PlacementResult {
  LogicalTpcSet tpcs;
  // Non-empty when the GPC layout is unknown and the documented fallback
  // (the lowest-numbered TPCs of the pool, kept ones first) was used.
  std::string note;
};

// Chooses `req.count` TPCs of `req.pool`. Packed, among the smallest sets of
// GPCs whose pool TPCs hold `count`, prefers (in this order): the largest
// hostable cluster; GPCs no one else uses (all their TPCs in the pool); the
// most kept TPCs; the fewest pool TPCs left stranded in a partly used GPC;
// the lowest GPC numbers. TPCs of unknown GPC are used only when the GPCs'
// TPCs are not enough. nullopt when the pool holds fewer than `count` TPCs.
std::optional<PlacementResult> choose_tpcs(const topo::Topology& t, const PlacementRequest& req);

// A GPC-aligned set of `count` TPCs: the packed choice among the TPCs of
// known GPC. nullopt when the GPC layout is unknown or fewer than `count`
// TPCs have a known GPC.
std::optional<LogicalTpcSet> gpc_aligned(const topo::Topology& t, unsigned count);

}  // namespace nvtaskset::planner
