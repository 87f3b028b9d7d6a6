// SPDX-License-Identifier: Apache-2.0
// Translation of logical TPC / GPC lists to physical mask bits, cluster
// capability and rendering, on synthetic topologies (test_topology_fixtures.hpp).
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <stdexcept>

#include "nvtaskset/topology.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::topo {
namespace {

using namespace testing;


TEST(TopologyModel, H200ModelIsHopperLike) {
  const HwModel m = h200_model();
  ASSERT_EQ(m.bit_of_tpc.size(), 66u);
  std::set<unsigned> bits(m.bit_of_tpc.begin(), m.bit_of_tpc.end());
  EXPECT_EQ(bits.size(), 66u) << "bits must be unique";
  EXPECT_GT(*bits.rbegin(), 63u) << "working TPCs above bit 63";
  EXPECT_LT(*bits.rbegin(), 128u);
  // Holes: bits below the highest that control nothing.
  EXPECT_LT(bits.size(), *bits.rbegin() + 1);
  // Not monotone, not the identity.
  bool monotone = true;
  for (unsigned k = 1; k < 66; ++k) monotone &= m.bit_of_tpc[k] > m.bit_of_tpc[k - 1];
  EXPECT_FALSE(monotone);
  // SMs 2-3 (TPC 1) are not in the GPC of SMs 0-1 (TPC 0).
  EXPECT_NE(m.hw_gpc_of_tpc[0], m.hw_gpc_of_tpc[1]);
  EXPECT_NO_THROW(validate(h200_topology()));
}

TEST(Translation, SingleTpcMapsToItsPhysicalBit) {
  const Topology t = h200_topology();
  const HwModel m = h200_model();
  for (unsigned k = 0; k < 66; ++k) {
    LogicalTpcSet s;
    s.insert(LogicalTpcId{k});
    PhysicalTpcMask mask = to_physical(t, s);
    ASSERT_EQ(mask.size(), 1u);
    EXPECT_TRUE(mask.contains(PhysicalTpcBit{m.bit_of_tpc[k]})) << "TPC " << k;
  }
}

TEST(Translation, AllTpcsGiveEveryWorkingBitIncludingBitsAbove63) {
  const Topology t = h200_topology();
  const PhysicalTpcMask mask = to_physical(t, all_tpcs(t));
  EXPECT_EQ(mask.size(), 66u);
  EXPECT_EQ(mask, t.working_bits());
  EXPECT_NE(mask.bits.hi, 0u);
  // The holes stay disabled: e.g. slot 1 of GPC 0 (bit 1) is floorswept.
  EXPECT_FALSE(mask.contains(PhysicalTpcBit{1}));
  EXPECT_EQ(all_tpcs(t).size(), 66u);
}

TEST(Translation, RoundTripsThroughLogicalOfPhysical) {
  const Topology t = h200_topology();
  std::mt19937 rng(42);
  for (int i = 0; i < 200; ++i) {
    LogicalTpcSet s;
    while (s.empty())
      for (unsigned k = 0; k < 66; ++k)
        if (rng() % 3 == 0) s.insert(LogicalTpcId{k});
    const PhysicalTpcMask mask = to_physical(t, s);
    EXPECT_EQ(mask.size(), s.size());
    EXPECT_EQ(logical_of_physical(t, mask), s);
  }
}

TEST(Translation, LogicalOfPhysicalIgnoresBitsWithoutTpc) {
  const Topology t = h200_topology();
  PhysicalTpcMask holes;
  holes.insert(PhysicalTpcBit{1});    // floorswept slot in GPC 0
  holes.insert(PhysicalTpcBit{127});  // beyond every slot
  EXPECT_TRUE(logical_of_physical(t, holes).empty());
  PhysicalTpcMask one = holes;
  one.insert(*t.tpcs[5].bit);
  EXPECT_EQ(ids_of(logical_of_physical(t, one)), std::vector<unsigned>{5});
}

TEST(Translation, RejectsTpcsThatDoNotExist) {
  const Topology t = h200_topology();
  EXPECT_EQ(error_of([&] { to_physical(t, tpc_set({0, 70})); }), "TPC 70 does not exist on device 0 (TPCs 0-65)");
  EXPECT_EQ(error_of([&] { to_physical(t, tpc_set({66})); }), "TPC 66 does not exist on device 0 (TPCs 0-65)");
  EXPECT_EQ(error_of([&] { to_physical(t, tpc_set({127})); }), "TPC 127 does not exist on device 0 (TPCs 0-65)");
  const Topology t1 = h200_topology(1);
  EXPECT_EQ(error_of([&] { to_physical(t1, tpc_set({99})); }), "TPC 99 does not exist on device 1 (TPCs 0-65)");
}

TEST(Translation, RejectsAnEmptyList) {
  const Topology t = h200_topology();
  EXPECT_NE(error_of([&] { to_physical(t, LogicalTpcSet{}); }).find("empty TPC list"), std::string::npos);
  EXPECT_NE(error_of([&] { tpcs_of_gpcs(t, GpcSet{}); }).find("empty GPC list"), std::string::npos);
}

TEST(Translation, RejectsTpcsWhoseBitIsUnknown) {
  Topology t = h200_topology();
  t.tpcs[7].bit.reset();
  t.tpcs[9].bit.reset();
  t.source = "file";
  EXPECT_FALSE(t.bits_known());
  const std::string e = error_of([&] { to_physical(t, tpc_set({1, 7, 9})); });
  EXPECT_NE(e.find("mask bit of TPC 7,9 on device 0 is unknown"), std::string::npos) << e;
  EXPECT_NE(e.find("--calibrate"), std::string::npos) << e;
  // Known TPCs still translate.
  EXPECT_EQ(to_physical(t, tpc_set({1})).size(), 1u);
}

TEST(Translation, NeverProducesAMaskWithoutWorkingTpc) {
  // Every accepted list yields a non-empty mask of working bits; a list that
  // could only yield nothing (all bits unknown) is rejected.
  Topology t = h200_topology();
  for (auto& ti : t.tpcs) ti.bit.reset();
  EXPECT_THROW(to_physical(t, tpc_set({0})), std::runtime_error);
  EXPECT_THROW(to_physical(t, all_tpcs(t)), std::runtime_error);
}

TEST(Translation, GpcListsSelectExactlyThoseGpcsKnownTpcs) {
  const Topology t = h200_topology();
  const HwModel m = h200_model();
  ASSERT_EQ(t.gpcs.size(), 8u);
  for (unsigned g = 0; g < 8; ++g) {
    GpcSet gs;
    gs.insert(GpcId{g});
    const LogicalTpcSet s = tpcs_of_gpcs(t, gs);
    for (unsigned k = 0; k < 66; ++k) {
      const bool in_gpc = t.tpcs[k].gpc && t.tpcs[k].gpc->value == g;
      EXPECT_EQ(s.contains(LogicalTpcId{k}), in_gpc) << "GPC " << g << " TPC " << k;
    }
  }
  // Two GPCs: the union; TPCs of unknown GPC are never included.
  const LogicalTpcSet two = tpcs_of_gpcs(t, gpc_set({0, 2}));
  EXPECT_EQ(two.size(), t.gpcs[0].tpcs.size() + t.gpcs[2].tpcs.size());
  const LogicalTpcSet all_gpcs = tpcs_of_gpcs(t, gpc_set({0, 1, 2, 3, 4, 5, 6, 7}));
  for (unsigned k = 0; k < 66; ++k) {
    EXPECT_EQ(all_gpcs.contains(LogicalTpcId{k}), static_cast<bool>(m.cluster_capable[k])) << "TPC " << k;
  }
  // And the result translates.
  EXPECT_EQ(to_physical(t, two).size(), two.size());
}

TEST(Translation, RejectsGpcsThatDoNotExist) {
  const Topology t = h200_topology();
  EXPECT_EQ(error_of([&] { tpcs_of_gpcs(t, gpc_set({9})); }), "GPC 9 does not exist on device 0 (GPCs 0-7)");
  EXPECT_EQ(error_of([&] { tpcs_of_gpcs(t, gpc_set({1, 8})); }), "GPC 8 does not exist on device 0 (GPCs 0-7)");
}

TEST(Translation, GpcListsNeedAKnownLayout) {
  Topology t = *identity_topology(a100_device());
  t.gpc_note = "the nvdebug kernel module is not loaded (/proc/gpu0 is absent)";
  const std::string e = error_of([&] { tpcs_of_gpcs(t, gpc_set({0})); });
  EXPECT_EQ(e.rfind("GPC lists need the GPU's GPC layout: ", 0), 0u) << e;
  EXPECT_NE(e.find("/proc/gpu0 is absent"), std::string::npos) << e;
}

TEST(Identity, PreHopperBitsAreLogical) {
  const auto t = identity_topology(a100_device());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, "identity");
  ASSERT_EQ(t->tpcs.size(), 54u);
  for (unsigned k = 0; k < 54; ++k) EXPECT_EQ(t->tpcs[k].bit->value, k);
  EXPECT_TRUE(t->bits_known());
  EXPECT_FALSE(t->gpcs_known());
  EXPECT_NO_THROW(validate(*t));
  EXPECT_EQ(to_physical(*t, tpc_set({3, 53})).bits.indices(), (std::vector<unsigned>{3, 53}));
}

TEST(Identity, NoneFromHopperOn) {
  EXPECT_FALSE(identity_topology(h200_device()).has_value());
  DeviceInfo b = h200_device();
  b.cc_major = 10;
  EXPECT_FALSE(identity_topology(b).has_value());
}

TEST(Validate, CatchesBrokenInvariants) {
  {
    Topology t = h200_topology();
    t.tpcs[3].bit = t.tpcs[2].bit;
    EXPECT_NE(error_of([&] { validate(t); }).find("already controls TPC 2"), std::string::npos);
  }
  {
    Topology t = h200_topology();
    t.tpcs.pop_back();
    EXPECT_NE(error_of([&] { validate(t); }).find("65 entries"), std::string::npos);
  }
  {
    Topology t = h200_topology();
    t.tpcs[0].gpc = GpcId{1};  // but gpcs[0] lists TPC 0
    EXPECT_FALSE(error_of([&] { validate(t); }).empty());
  }
  {
    Topology t = h200_topology();
    t.tpcs[0].bit = PhysicalTpcBit{128};
    EXPECT_NE(error_of([&] { validate(t); }).find("tpcs[0].bit"), std::string::npos);
  }
  {
    Topology t = *identity_topology(a100_device());
    t.tpcs[0].bit = PhysicalTpcBit{64};  // pre-Hopper TMD masks have 64 bits
    EXPECT_NE(error_of([&] { validate(t); }).find("not below 64"), std::string::npos);
  }
}

TEST(ClusterCapability, WholeGpuRunsEverySize) {
  const Topology t = h200_topology();
  const ClusterCapability c = cluster_capability(t, all_tpcs(t));
  EXPECT_TRUE(c.known);
  EXPECT_EQ(c.sizes, (std::vector<unsigned>{2, 4, 8, 16}));
  EXPECT_EQ(c.largest, 16u);
  EXPECT_EQ(c.gpu_largest, 16u);
  EXPECT_EQ(c.warning, "");
}

TEST(ClusterCapability, SmallGpcCapsTheSize) {
  const Topology t = h200_topology();
  // The GPC with 4 TPCs (8 SMs) ran clusters of 8 at most.
  const GpcInfo* small = nullptr;
  for (const auto& g : t.gpcs)
    if (g.tpcs.size() == 4) small = &g;
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->max_cluster, 8u);
  GpcSet gs;
  gs.insert(small->id);
  const ClusterCapability c = cluster_capability(t, tpcs_of_gpcs(t, gs));
  EXPECT_EQ(c.sizes, (std::vector<unsigned>{2, 4, 8}));
  EXPECT_EQ(c.warning, "this partition cannot run thread-block clusters larger than 8 (the GPU runs up to 16)");
}

TEST(ClusterCapability, CountsOnlyTpcsOfOneGpc) {
  const Topology t = h200_topology();
  // One TPC from each GPC: 8 TPCs, 16 SMs, but no two in one GPC.
  LogicalTpcSet spread;
  for (const auto& g : t.gpcs) spread.insert(g.tpcs.front());
  const ClusterCapability c = cluster_capability(t, spread);
  EXPECT_EQ(c.sizes, (std::vector<unsigned>{2}));
  EXPECT_EQ(c.warning, "this partition cannot run thread-block clusters larger than 2 (the GPU runs up to 16)");
  // Two TPCs of one GPC: 4 SMs.
  LogicalTpcSet two;
  two.insert(t.gpcs[0].tpcs[0]);
  two.insert(t.gpcs[0].tpcs[1]);
  EXPECT_EQ(cluster_capability(t, two).largest, 4u);
}

TEST(ClusterCapability, TpcsThatNeverHostClustersDoNotCount) {
  const Topology t = h200_topology();
  LogicalTpcSet none_capable;
  for (const auto& ti : t.tpcs)
    if (!ti.cluster_capable) none_capable.insert(ti.id);
  ASSERT_FALSE(none_capable.empty());
  const ClusterCapability c = cluster_capability(t, none_capable);
  EXPECT_TRUE(c.sizes.empty());
  EXPECT_EQ(c.largest, 0u);
  EXPECT_EQ(c.warning, "this partition cannot run thread-block clusters (the GPU runs up to 16)");
}

TEST(ClusterCapability, NothingToSayBeforeHopper) {
  const Topology t = *identity_topology(a100_device());
  const ClusterCapability c = cluster_capability(t, all_tpcs(t));
  EXPECT_FALSE(c.known);
  EXPECT_TRUE(c.sizes.empty());
  EXPECT_EQ(c.warning, "");
}

TEST(ClusterCapability, UnknownGpcsOnHopperAreSaidSo) {
  Topology t = h200_topology();
  t.gpcs.clear();
  for (auto& ti : t.tpcs) ti.gpc.reset();
  const ClusterCapability c = cluster_capability(t, all_tpcs(t));
  EXPECT_FALSE(c.known);
  EXPECT_NE(c.warning.find("GPC layout is unknown"), std::string::npos);
}

TEST(Render, NumactlLikeText) {
  const Topology t = h200_topology();
  const std::string s = render_topology({t});
  EXPECT_NE(s.find("available: 1 GPU\n"), std::string::npos) << s;
  EXPECT_NE(s.find("gpu 0: NVIDIA H200, " + uuid_to_string(t.device.uuid) + ", pci 0000:3b:00.0, cc 9.0, 132 SMs, 66 TPCs (topology: calibration)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("gpu 0 gpcs: 8\n"), std::string::npos) << s;
  // GPC 0's lines, built independently from the topology.
  std::string tpcs, sms, bits;
  for (auto k : t.gpcs[0].tpcs) {
    tpcs += (tpcs.empty() ? "" : " ") + std::to_string(k.value);
    sms += (sms.empty() ? "" : " ") + std::to_string(2 * k.value) + " " + std::to_string(2 * k.value + 1);
    bits += (bits.empty() ? "" : " ") + std::to_string(t.tpcs[k.value].bit->value);
  }
  EXPECT_NE(s.find("gpc 0 tpcs: " + tpcs + "\n"), std::string::npos) << s;
  EXPECT_NE(s.find("gpc 0 sms: " + sms + "\n"), std::string::npos) << s;
  EXPECT_NE(s.find("gpc 0 mask bits: " + bits + "\n"), std::string::npos) << s;
  EXPECT_NE(s.find("gpc 0 max cluster: 16\n"), std::string::npos) << s;
  EXPECT_NE(s.find("gpc unknown tpcs: "), std::string::npos) << s;
  EXPECT_NE(s.find("gpc unknown mask bits: "), std::string::npos) << s;
}

TEST(Render, UnknownGpcsAndSeveralGpus) {
  Topology a = *identity_topology(a100_device(0));
  a.gpc_note = "the nvdebug kernel module is not loaded";
  Topology h = h200_topology(1);
  const std::string s = render_topology({a, h});
  EXPECT_NE(s.find("available: 2 GPUs\n"), std::string::npos) << s;
  EXPECT_NE(s.find("gpu 0 gpcs: unknown (the nvdebug kernel module is not loaded)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("gpu 0 tpcs: 0 1 2 3"), std::string::npos) << s;
  EXPECT_NE(s.find("gpu 0 mask bits: 0 1 2 3"), std::string::npos) << s;
  EXPECT_NE(s.find("gpu 1: NVIDIA H200"), std::string::npos) << s;
  EXPECT_EQ(s.find("max cluster", s.find("gpu 1:")) != std::string::npos, true);
  EXPECT_EQ(s.find("max cluster"), s.find("max cluster", s.find("gpu 1:"))) << "no cluster lines for the A100";
}

TEST(Format, IdRanges) {
  EXPECT_EQ(format_ranges({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_ranges(std::vector<unsigned>{5}), "5");
  EXPECT_EQ(format_ranges(std::vector<unsigned>{}), "");
  EXPECT_EQ(format_ranges(std::vector<unsigned>{3, 1, 2, 2, 7}), "1-3,7");  // sorted, duplicates dropped
  EXPECT_EQ(format_id_list({4, 0, 8}), "4 0 8");
}

}  // namespace
}  // namespace nvtaskset::topo
