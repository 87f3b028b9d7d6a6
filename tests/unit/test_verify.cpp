// SPDX-License-Identifier: Apache-2.0
// The partitions `nvtaskset --verify` checks (nvtaskset/src/verify.cpp). That
// they reach the kernels and are judged right is the e2e tests' part.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "nvtaskset/idlist.hpp"
#include "nvtaskset/verify.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::cli::verify {
namespace {

using topo::testing::h200_topology;

std::vector<std::string> labels(const std::vector<Planned>& ps) {
  std::vector<std::string> out;
  for (const auto& p : ps) out.push_back(p.label);
  return out;
}

TEST(VerifyPlan, EveryTpcThenEdgesThenEachGpcThenPairsThenRandomLists) {
  const topo::Topology t = h200_topology();
  const unsigned n = static_cast<unsigned>(t.tpcs.size());
  const unsigned g = static_cast<unsigned>(t.gpcs.size());
  ASSERT_GE(g, 3u);
  const auto ps = plan(t, 2026);
  ASSERT_EQ(ps.size(), 3 + g + 2 + kRandomLists);
  EXPECT_EQ(ps[0].label, "-t 0-" + std::to_string(n - 1));
  EXPECT_EQ(ps[1].label, "-t 0");
  EXPECT_EQ(ps[2].label, "-t " + std::to_string(n - 1));
  for (unsigned i = 0; i < g; ++i) {
    const Planned& p = ps[3 + i];
    EXPECT_EQ(p.label, "-g " + std::to_string(i));
    EXPECT_EQ(p.partition.kind, SpecKind::kGpcList);
    EXPECT_EQ(p.partition.tpcs, topo::tpcs_of_gpcs(t, p.partition.gpcs));
  }
  EXPECT_EQ(ps[3 + g].label, "-g 0," + std::to_string(g - 1));
  EXPECT_EQ(ps[3 + g + 1].partition.gpcs.size(), 2u);
  EXPECT_NE(ps[3 + g + 1].partition.gpcs, ps[3 + g].partition.gpcs);
  std::set<unsigned> sizes;
  for (unsigned i = 3 + g + 2; i < ps.size(); ++i) {
    const Planned& p = ps[i];
    EXPECT_EQ(p.partition.kind, SpecKind::kTpcList);
    EXPECT_EQ(p.label, "-t " + format_list(p.partition.tpcs.bits));
    ASSERT_FALSE(p.partition.tpcs.empty());
    EXPECT_LT(p.partition.tpcs.bits.width(), n + 1);
    EXPECT_LT(p.partition.tpcs.size(), n) << "every TPC is checked first; a random list is fewer";
    sizes.insert(p.partition.tpcs.size());
  }
  EXPECT_GT(sizes.size(), 5u) << "the random lists should come in many sizes";
}

TEST(VerifyPlan, PartitionsAreWhatTheCliWouldWrite) {
  const topo::Topology t = h200_topology();
  for (const Planned& p : plan(t, 7)) {
    EXPECT_TRUE(p.partition.active());
    EXPECT_EQ(p.partition.enabled, topo::to_physical(t, p.partition.tpcs)) << p.label;
    const topo::ClusterLimits c = topo::cluster_limits(t, p.partition.tpcs);
    EXPECT_EQ(p.partition.max_cluster, c.max_cluster) << p.label;
    EXPECT_EQ(p.partition.widened, topo::to_physical(t, c.widened)) << p.label;
  }
}

TEST(VerifyPlan, TheSeedDecidesTheRandomLists) {
  const topo::Topology t = h200_topology();
  EXPECT_EQ(labels(plan(t, 42)), labels(plan(t, 42)));
  EXPECT_NE(labels(plan(t, 42)), labels(plan(t, 43)));
}

TEST(VerifyPlan, WithoutGpcsOnlyTpcLists) {
  topo::Topology t = h200_topology();
  t.gpcs.clear();
  for (auto& ti : t.tpcs) ti.gpc.reset();
  const auto ps = plan(t, 3);
  ASSERT_EQ(ps.size(), 3 + kRandomLists);
  for (const auto& p : ps) EXPECT_EQ(p.partition.kind, SpecKind::kTpcList) << p.label;
}

TEST(VerifyPlan, UnknownBitsAreAnError) {
  topo::Topology t = h200_topology();
  t.tpcs[5].bit.reset();
  t.tpcs[9].bit.reset();
  try {
    plan(t, 1);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("TPCs 5,9"), std::string::npos) << e.what();
  }
}

TEST(VerifySeed, DecimalUpTo64Bits) {
  EXPECT_EQ(parse_seed("0"), 0u);
  EXPECT_EQ(parse_seed("2026"), 2026u);
  EXPECT_EQ(parse_seed("18446744073709551615"), ~std::uint64_t{0});
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "18446744073709551616", "99999999999999999999",
                          "123456789012345678901"})
    EXPECT_THROW(parse_seed(bad), std::runtime_error) << "'" << bad << "'";
}

}  // namespace
}  // namespace nvtaskset::cli::verify
