// SPDX-License-Identifier: Apache-2.0
// `-n COUNT`: which TPCs a task gets by count (planner/placement.hpp), on
// the layout calibrated on an H100 (tests/data/topology/h100_measured.json,
// docs/runs.md, run 9: 8 GPCs of 4, 8 x 5 and 9 x 2 TPCs striped over
// the logical numbers, TPCs 62-65 of unknown GPC), on the synthetic H200
// model, and on a pre-Hopper layout without GPCs.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "nvtaskset/placement.hpp"
#include "nvtaskset/topology_json.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::planner {
namespace {
using namespace nvtaskset::topo;
using namespace nvtaskset::topo::testing;

const std::string kData = NVTASKSET_TEST_DATA_DIR;

Topology h100() { return load_topology_file(kData + "/topology/h100_measured.json").at(0); }

LogicalTpcSet all_of(const Topology& t) { return all_tpcs(t); }

PlacementResult choose(const Topology& t, unsigned n, Placement how = Placement::kPacked,
                       std::optional<LogicalTpcSet> pool = std::nullopt, LogicalTpcSet keep = {}) {
  PlacementRequest r;
  r.count = n;
  r.how = how;
  r.pool = pool ? *pool : all_of(t);
  r.keep = keep;
  auto out = choose_tpcs(t, r);
  EXPECT_TRUE(out.has_value()) << n;
  return out ? *out : PlacementResult{};
}

// GPC of each TPC (-1: unknown), and how many chosen TPCs each GPC holds.
std::map<int, unsigned> per_gpc(const Topology& t, const LogicalTpcSet& s) {
  std::map<int, unsigned> m;
  for (unsigned k : s.bits.indices()) m[t.tpcs[k].gpc ? static_cast<int>(t.tpcs[k].gpc->value) : -1]++;
  return m;
}

unsigned whole_gpcs(const Topology& t, const LogicalTpcSet& s) {
  unsigned n = 0;
  for (const GpcInfo& g : t.gpcs) {
    unsigned in = 0;
    for (LogicalTpcId tpc : g.tpcs) in += s.contains(tpc) ? 1 : 0;
    n += in == g.tpcs.size() ? 1 : 0;
  }
  return n;
}

TEST(Placement, PackedTakesWholeGpcs) {
  const Topology t = h100();
  // 16 = two whole 8-TPC GPCs: clusters of 16.
  PlacementResult r = choose(t, 16);
  EXPECT_EQ(r.tpcs.size(), 16u);
  EXPECT_EQ(per_gpc(t, r.tpcs).size(), 2u);
  EXPECT_EQ(whole_gpcs(t, r.tpcs), 2u);
  EXPECT_EQ(largest_hostable_cluster(t, r.tpcs), 16u);
  EXPECT_TRUE(r.note.empty());
  // 4 = GPC 0 whole (its 4 TPCs host clusters of 8); an 8-TPC GPC used in
  // part would host 8 too but strand 4 TPCs of it.
  r = choose(t, 4);
  EXPECT_EQ(format_ranges(r.tpcs.bits), "0,8,16,24");
  // 8: one whole 8-TPC GPC, the lowest numbered: GPC 1.
  r = choose(t, 8);
  EXPECT_EQ(format_ranges(r.tpcs.bits), "1,9,17,25,32,39,46,53");
  // 9: a whole 9-TPC GPC (GPC 6).
  r = choose(t, 9);
  EXPECT_EQ(per_gpc(t, r.tpcs), (std::map<int, unsigned>{{6, 9}}));
}

TEST(Placement, PackedUsesTheFewestGpcsAndHostsTheLargestCluster) {
  const Topology t = h100();
  for (unsigned n = 1; n <= 62; ++n) {
    const PlacementResult r = choose(t, n);
    ASSERT_EQ(r.tpcs.size(), n);
    // The fewest GPCs that can hold n, with the largest GPCs (9, 9, 8, ...).
    unsigned need = 0, held = 0;
    for (unsigned size : {9u, 9u, 8u, 8u, 8u, 8u, 8u, 4u}) {
      if (held >= n) break;
      held += size;
      ++need;
    }
    EXPECT_EQ(per_gpc(t, r.tpcs).size(), need) << "n=" << n << ": " << format_ranges(r.tpcs.bits);
    EXPECT_EQ(per_gpc(t, r.tpcs).count(-1), 0u) << "no TPC of unknown GPC while GPCs have room, n=" << n;
    // Cluster: as large as any set of n TPCs can host (a GPC hosts at most
    // 16, and 2 per TPC).
    const unsigned best = std::min(16u, 2 * std::min(n, 8u));
    EXPECT_EQ(largest_hostable_cluster(t, r.tpcs), best) << "n=" << n;
  }
}

TEST(Placement, TpcsOfUnknownGpcOnlyWhenNeeded) {
  const Topology t = h100();
  const PlacementResult r = choose(t, 64);
  EXPECT_EQ(r.tpcs.size(), 64u);
  EXPECT_EQ(per_gpc(t, r.tpcs)[-1], 2u);
  EXPECT_EQ(choose(t, 66).tpcs, all_of(t));
  PlacementRequest req;
  req.count = 67;
  req.pool = all_of(t);
  EXPECT_FALSE(choose_tpcs(t, req).has_value());
  req.count = 0;
  EXPECT_FALSE(choose_tpcs(t, req).has_value());
}

TEST(Placement, SpreadIsEvenOverGpcs) {
  const Topology t = h100();
  const PlacementResult r = choose(t, 16, Placement::kSpread);
  EXPECT_EQ(r.tpcs.size(), 16u);
  const auto m = per_gpc(t, r.tpcs);
  EXPECT_EQ(m.size(), 8u);
  for (const auto& [g, n] : m) EXPECT_EQ(n, 2u) << "GPC " << g;
  // 20 over 8 GPCs: 2 or 3 each.
  for (const auto& [g, n] : per_gpc(t, choose(t, 20, Placement::kSpread).tpcs)) EXPECT_TRUE(n == 2 || n == 3);
  // Spread 8 = one TPC per GPC = the natural striped list 0-7.
  EXPECT_EQ(format_ranges(choose(t, 8, Placement::kSpread).tpcs.bits), "0-7");
}

TEST(Placement, AvoidsTakenTpcs) {
  const Topology t = h100();
  LogicalTpcSet pool = all_of(t);
  // Another task holds GPC 1 whole and one TPC of GPC 2.
  const LogicalTpcSet taken = tpcs_of_gpcs(t, gpc_set({1}));
  for (LogicalTpcId x : taken.ids()) pool.erase(x);
  pool.erase(LogicalTpcId{2});
  const PlacementResult r = choose(t, 8, Placement::kPacked, pool);
  EXPECT_EQ((r.tpcs.bits & taken.bits).count(), 0u);
  EXPECT_FALSE(r.tpcs.contains(LogicalTpcId{2}));
  // A GPC no one else uses (GPC 3), not GPC 2 which it would share.
  EXPECT_EQ(per_gpc(t, r.tpcs), (std::map<int, unsigned>{{3, 8}}));
  // Not enough in the pool: nullopt (the caller decides).
  PlacementRequest req;
  req.count = 60;
  req.pool = pool;
  EXPECT_FALSE(choose_tpcs(t, req).has_value());
}

TEST(Placement, KeepsCurrentTpcsWhenTheRuleAllows) {
  const Topology t = h100();
  // A task on GPCs 4 and 5 shrinks to 8: it keeps one of them whole.
  const LogicalTpcSet cur = tpcs_of_gpcs(t, gpc_set({4, 5}));
  PlacementResult r = choose(t, 8, Placement::kPacked, std::nullopt, cur);
  EXPECT_EQ(per_gpc(t, r.tpcs), (std::map<int, unsigned>{{4, 8}}));
  // Grows from GPC 5 to 12: GPC 5 whole plus 4 more; of equally good
  // choices, the one keeping all 8.
  r = choose(t, 12, Placement::kPacked, std::nullopt, tpcs_of_gpcs(t, gpc_set({5})));
  EXPECT_EQ((r.tpcs.bits & tpcs_of_gpcs(t, gpc_set({5})).bits).count(), 8u);
  // Never at the price of the rule: a striped current list 0-7 shrinking to
  // 4 still gets a whole GPC (GPC 0 = 0,8,16,24, keeping TPC 0), not 0-3.
  r = choose(t, 4, Placement::kPacked, std::nullopt, tpc_set({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(format_ranges(r.tpcs.bits), "0,8,16,24");
}

TEST(Placement, RandomPoolsAlwaysGiveExactlyCountFromThePool) {
  const Topology t = h100();
  std::mt19937 rng(11);
  for (int i = 0; i < 2000; ++i) {
    LogicalTpcSet pool;
    for (unsigned k = 0; k < 66; ++k)
      if (rng() % 3) pool.insert(LogicalTpcId{k});
    const unsigned n = 1 + rng() % 66;
    for (Placement how : {Placement::kPacked, Placement::kSpread}) {
      PlacementRequest req{n, how, pool, {}};
      const auto r = choose_tpcs(t, req);
      if (pool.size() < n) {
        EXPECT_FALSE(r.has_value());
        continue;
      }
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->tpcs.size(), n);
      EXPECT_EQ((r->tpcs.bits & ~pool.bits).count(), 0u) << "a TPC outside the pool";
    }
  }
}

TEST(Placement, WithoutGpcsTakesTheLowestAndSaysSo) {
  Topology t = h100();
  t.gpcs.clear();
  for (auto& ti : t.tpcs) ti.gpc.reset();
  PlacementResult r = choose(t, 6);
  EXPECT_EQ(format_ranges(r.tpcs.bits), "0-5");
  EXPECT_NE(r.note.find("GPC layout of this GPU is unknown"), std::string::npos) << r.note;
  r = choose(t, 3, Placement::kPacked, std::nullopt, tpc_set({10, 11, 12, 13}));
  EXPECT_EQ(format_ranges(r.tpcs.bits), "10-12");
  // Pre-Hopper (identity bits, no clusters): the same documented fallback.
  const Topology a = expected_topology(a100_model());
  EXPECT_EQ(format_ranges(choose(a, 4).tpcs.bits), "0-3");
}

TEST(Placement, GpcAlignedIsThePackedChoice) {
  const Topology t = h100();
  for (unsigned n : {1u, 4u, 8u, 16u, 20u, 33u}) {
    LogicalTpcSet known;
    for (const GpcInfo& g : t.gpcs)
      for (LogicalTpcId x : g.tpcs) known.insert(x);
    EXPECT_EQ(gpc_aligned(t, n), choose(t, n, Placement::kPacked, known).tpcs) << n;
  }
  const Topology h200 = h200_topology();
  const auto a = gpc_aligned(h200, 16);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(largest_hostable_cluster(h200, *a), 16u);
}

}  // namespace
}  // namespace nvtaskset::planner
