// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace nvtaskset::planner {

using namespace topo;
namespace {

// Above this many GPCs with free TPCs, the packed choice stops enumerating
// subsets and takes GPCs largest first (no GPU known to nvtaskset has more
// than 8; the bound only keeps a hostile topology file cheap).
constexpr unsigned kMaxEnumeratedGpcs = 16;

// `ids` with kept TPCs first, then cluster-capable ones, then by number: the
// order in which TPCs of one GPC are taken.
std::vector<LogicalTpcId> preference_order(const Topology& t, std::vector<LogicalTpcId> ids,
                                           const LogicalTpcSet& keep) {
  std::stable_sort(ids.begin(), ids.end(), [&](LogicalTpcId a, LogicalTpcId b) {
    auto rank = [&](LogicalTpcId x) {
      const bool capable = x.value < t.tpcs.size() && t.tpcs[x.value].cluster_capable;
      return std::make_tuple(!keep.contains(x), !capable, x.value);
    };
    return rank(a) < rank(b);
  });
  return ids;
}

struct Group {
  const GpcInfo* gpc;
  std::vector<LogicalTpcId> free;  // pool TPCs of this GPC, in preference order
  bool whole;                      // every TPC of the GPC is in the pool
};

void take(LogicalTpcSet& out, const std::vector<LogicalTpcId>& ids, unsigned n) {
  for (unsigned i = 0; i < n && i < ids.size(); ++i) out.insert(ids[i]);
}

unsigned overlap(const LogicalTpcSet& a, const LogicalTpcSet& b) { return (a.bits & b.bits).count(); }

PlacementResult fallback_lowest(const PlacementRequest& req, const std::string& why) {
  std::vector<LogicalTpcId> ids = req.pool.ids();
  std::stable_sort(ids.begin(), ids.end(), [&](LogicalTpcId a, LogicalTpcId b) {
    return std::make_tuple(!req.keep.contains(a), a.value) < std::make_tuple(!req.keep.contains(b), b.value);
  });
  PlacementResult r;
  take(r.tpcs, ids, req.count);
  r.note = why;
  return r;
}

LogicalTpcSet packed(const Topology& t, const std::vector<Group>& groups, unsigned count, const LogicalTpcSet& keep) {
  const unsigned n = static_cast<unsigned>(groups.size());
  struct Candidate {
    LogicalTpcSet tpcs;
    std::tuple<long, long, long, long> score;  // cluster, -shared GPCs, kept, -stranded: larger is better
    std::vector<unsigned> gpc_ids;
  };
  std::optional<Candidate> best;
  auto consider = [&](const std::vector<unsigned>& members) {
    unsigned total = 0, shared = 0;
    for (unsigned i : members) {
      total += static_cast<unsigned>(groups[i].free.size());
      shared += groups[i].whole ? 0 : 1;
    }
    if (total < count) return;
    // Each member can be the one used in part; every other is used whole.
    for (unsigned partial : members) {
      LogicalTpcSet s;
      unsigned used = 0;
      for (unsigned i : members)
        if (i != partial) {
          take(s, groups[i].free, static_cast<unsigned>(groups[i].free.size()));
          used += static_cast<unsigned>(groups[i].free.size());
        }
      if (used > count) continue;
      take(s, groups[partial].free, count - used);
      std::vector<unsigned> ids;
      for (unsigned i : members) ids.push_back(groups[i].gpc->id.value);
      std::sort(ids.begin(), ids.end());
      const long cluster = static_cast<long>(largest_hostable_cluster(t, s));
      const long stranded = static_cast<long>(total - count);
      Candidate c{s, {cluster, -static_cast<long>(shared), static_cast<long>(overlap(s, keep)), -stranded}, ids};
      // Ties: the lowest GPC numbers; then the first partly used GPC tried.
      if (!best || c.score > best->score || (c.score == best->score && c.gpc_ids < best->gpc_ids)) best = c;
    }
  };
  if (n <= kMaxEnumeratedGpcs) {
    // The fewest GPCs that hold `count`: try sizes 1, 2, ... and stop at the
    // first size with any candidate.
    for (unsigned size = 1; size <= n && !best; ++size) {
      for (unsigned mask = 0; mask < (1u << n); ++mask) {
        if (static_cast<unsigned>(__builtin_popcount(mask)) != size) continue;
        std::vector<unsigned> members;
        for (unsigned i = 0; i < n; ++i)
          if (mask & (1u << i)) members.push_back(i);
        consider(members);
      }
    }
  }
  if (best) return best->tpcs;
  // Many GPCs: largest first, the last one in part.
  std::vector<unsigned> order(n);
  for (unsigned i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](unsigned a, unsigned b) { return groups[a].free.size() > groups[b].free.size(); });
  LogicalTpcSet s;
  for (unsigned i : order) {
    if (s.size() >= count) break;
    take(s, groups[i].free, count - s.size());
  }
  return s;
}

LogicalTpcSet spread(const std::vector<Group>& groups, unsigned count) {
  LogicalTpcSet s;
  std::vector<unsigned> next(groups.size(), 0);
  // Round robin; in a round that cannot serve every GPC, the GPCs with the
  // most free TPCs left go first (then by number), so no GPC is drained early.
  while (s.size() < count) {
    std::vector<unsigned> order;
    for (unsigned i = 0; i < groups.size(); ++i)
      if (next[i] < groups[i].free.size()) order.push_back(i);
    if (order.empty()) break;
    std::stable_sort(order.begin(), order.end(), [&](unsigned a, unsigned b) {
      return groups[a].free.size() - next[a] > groups[b].free.size() - next[b];
    });
    for (unsigned i : order) {
      if (s.size() >= count) break;
      s.insert(groups[i].free[next[i]++]);
    }
  }
  return s;
}

}  // namespace

std::optional<PlacementResult> choose_tpcs(const Topology& t, const PlacementRequest& req) {
  LogicalTpcSet pool = req.pool;
  pool.bits = pool.bits & Bits128::first(static_cast<unsigned>(t.tpcs.size()));
  if (req.count == 0 || pool.size() < req.count) return std::nullopt;
  PlacementRequest r = req;
  r.pool = pool;
  if (!t.gpcs_known())
    return fallback_lowest(r, fmt::format("the GPC layout of this GPU is unknown, so -n takes the lowest-numbered "
                                          "TPCs{}",
                                          req.keep.empty() ? "" : " (those it has first)"));
  std::vector<Group> groups;
  LogicalTpcSet in_gpcs;
  for (const GpcInfo& g : t.gpcs) {
    std::vector<LogicalTpcId> free;
    for (LogicalTpcId tpc : g.tpcs)
      if (pool.contains(tpc)) free.push_back(tpc);
    for (LogicalTpcId tpc : g.tpcs) in_gpcs.insert(tpc);
    if (free.empty()) continue;
    const bool whole = free.size() == g.tpcs.size();
    groups.push_back({&g, preference_order(t, std::move(free), req.keep), whole});
  }
  unsigned in_groups = 0;
  for (const Group& g : groups) in_groups += static_cast<unsigned>(g.free.size());
  PlacementResult out;
  if (in_groups >= req.count) {
    out.tpcs = req.how == Placement::kPacked ? packed(t, groups, req.count, req.keep) : spread(groups, req.count);
    return out;
  }
  // Not enough TPCs of known GPC: all of them, then TPCs of unknown GPC.
  for (const Group& g : groups) take(out.tpcs, g.free, static_cast<unsigned>(g.free.size()));
  std::vector<LogicalTpcId> loose;
  for (LogicalTpcId tpc : pool.ids())
    if (!in_gpcs.contains(tpc)) loose.push_back(tpc);
  loose = preference_order(t, std::move(loose), req.keep);
  take(out.tpcs, loose, req.count - out.tpcs.size());
  return out;
}

std::optional<LogicalTpcSet> gpc_aligned(const Topology& t, unsigned count) {
  if (!t.gpcs_known() || count == 0) return std::nullopt;
  // The packed choice of `-n`, over the TPCs of known GPC only: one rule.
  PlacementRequest req;
  req.count = count;
  for (const GpcInfo& g : t.gpcs)
    for (LogicalTpcId tpc : g.tpcs) req.pool.insert(tpc);
  const auto r = choose_tpcs(t, req);
  if (!r) return std::nullopt;
  return r->tpcs;
}

}  // namespace nvtaskset::planner
