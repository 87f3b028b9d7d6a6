// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/holders.hpp"

#include <map>

namespace nvtaskset::planner {
namespace {

bool applies_to(const DevicePartition& dp, const topo::DeviceInfo& dev) {
  return dp.partition.active() && (dp.device == dev.uuid || dp.device == kAnyDevice);
}

GpcSet gpcs_of(const topo::Topology& t, const LogicalTpcSet& tpcs) {
  GpcSet g;
  for (unsigned k : tpcs.bits.indices())
    if (k < t.tpcs.size() && t.tpcs[k].gpc) g.insert(*t.tpcs[k].gpc);
  return g;
}

}  // namespace

LogicalTpcSet logical_view(const Partition& p, const topo::Topology* t) {
  if (!p.tpcs.empty() || t == nullptr) return p.tpcs;
  return topo::logical_of_physical(*t, p.enabled);
}

std::vector<Holder> holders_on(const std::vector<ctl::StatusEntry>& status, const topo::DeviceInfo& dev,
                               const topo::Topology* t, const std::set<pid_t>& exclude) {
  std::vector<Holder> out;
  for (const auto& e : status) {
    if (exclude.count(e.pid)) continue;
    // A device-specific partition wins over the any-device one, as in the shim.
    const DevicePartition* best = nullptr;
    for (const auto& dp : e.partitions)
      if (applies_to(dp, dev) && (best == nullptr || dp.device != kAnyDevice)) best = &dp;
    if (best == nullptr) continue;
    const LogicalTpcSet tpcs = logical_view(best->partition, t);
    if (!tpcs.empty()) out.push_back({e.pid, e.uid, tpcs});
  }
  return out;
}

LogicalTpcSet held_by(const std::vector<Holder>& holders) {
  LogicalTpcSet s;
  for (const Holder& h : holders) s.bits = s.bits | h.tpcs.bits;
  return s;
}

std::vector<ctl::StatusEntry> changed_since(const std::vector<ctl::StatusEntry>& before,
                                            const std::vector<ctl::StatusEntry>& after) {
  std::map<pid_t, const ctl::StatusEntry*> old;
  for (const auto& e : before) old[e.pid] = &e;
  std::vector<ctl::StatusEntry> out;
  for (const auto& e : after) {
    const auto it = old.find(e.pid);
    const bool same = it != old.end() && it->second->start_time == e.start_time && it->second->uid == e.uid &&
                      it->second->partitions == e.partitions;
    if (!same) out.push_back(e);
  }
  return out;
}

Overlap overlap_with(const topo::Topology* t, const LogicalTpcSet& mine, const std::vector<Holder>& others) {
  Overlap o;
  const bool gpcs = t != nullptr && t->gpcs_known();
  const GpcSet my_gpcs = gpcs ? gpcs_of(*t, mine) : GpcSet{};
  for (const Holder& h : others) {
    const Bits128 common = mine.bits & h.tpcs.bits;
    if (common.any()) {
      o.share_tpcs.push_back(h.pid);
      o.common_tpcs.bits = o.common_tpcs.bits | common;
      continue;
    }
    if (!gpcs) continue;
    const Bits128 g = my_gpcs.bits & gpcs_of(*t, h.tpcs).bits;
    if (g.any()) {
      o.share_gpcs.push_back(h.pid);
      o.common_gpcs.bits = o.common_gpcs.bits | g;
    }
  }
  return o;
}

}  // namespace nvtaskset::planner
