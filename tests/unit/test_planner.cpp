// SPDX-License-Identifier: Apache-2.0
// The planner (planner/, planner.hpp, request.hpp) without processes or a
// GPU: requests parsed once; each kind planned on an H200-like layout
// (test_topology_fixtures.hpp) against a made-up public status: translation,
// -n's choice around held TPCs, the exclusive refusals, the shared-GPC
// warning, physical masks, the roles' floor checks.
#include "nvtaskset/planner.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "nvtaskset/idlist.hpp"
#include "nvtaskset/topology_json.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::planner {
namespace {

using topo::testing::h200_device;
using topo::testing::h200_topology;
using topo::testing::ids_of;
using topo::testing::tpc_set;

// Layouts a test sets: `known` answers without calibrating; `calibrated`
// only when topology() is asked (and counts it).
struct FixedLayouts : Layouts {
  std::map<DeviceUuid, topo::Topology> known, calibrated;
  int calibrations = 0;
  const topo::Topology& topology(const topo::DeviceInfo& dev) override {
    if (auto it = known.find(dev.uuid); it != known.end()) return it->second;
    ++calibrations;
    return calibrated.at(dev.uuid);
  }
  const topo::Topology* known_topology(const topo::DeviceInfo& dev) override {
    auto it = known.find(dev.uuid);
    return it == known.end() ? nullptr : &it->second;
  }
};

struct PlannerTest : ::testing::Test {
  topo::DeviceInfo gpu = h200_device();
  topo::Topology t = h200_topology();
  FixedLayouts layouts;
  Notes notes;
  void SetUp() override { layouts.known[gpu.uuid] = t; }

  Partition plan(RequestKind kind, std::string_view text, const Sharing& sh = {}) {
    return plan_partition(parse_request("", kind, text), gpu, layouts, sh, &notes);
  }
  std::string refusal(RequestKind kind, std::string_view text, const Sharing& sh = {}) {
    try {
      plan(kind, text, sh);
    } catch (const Refusal& e) {
      return e.what();
    }
    return "";
  }
  // The TPCs of GPC g.
  LogicalTpcSet gpc_tpcs(unsigned g) const {
    LogicalTpcSet s;
    for (LogicalTpcId x : t.gpcs[g].tpcs) s.insert(x);
    return s;
  }
  // Two TPCs of one GPC (TPCs that host no cluster block have no GPC).
  std::pair<unsigned, unsigned> same_gpc() const {
    return {t.gpcs[0].tpcs.at(0).value, t.gpcs[0].tpcs.at(1).value};
  }
};

ctl::StatusEntry holding(pid_t pid, const DeviceUuid& dev, const LogicalTpcSet& tpcs,
                         roles::Role role = roles::Role::kNone) {
  DevicePartition dp;
  dp.device = dev;
  dp.partition.kind = SpecKind::kTpcList;
  dp.partition.tpcs = tpcs;
  dp.partition.enabled.bits = tpcs.bits;  // only the logical view is read
  ctl::StatusEntry e{pid, 1, 1000, {dp}};
  e.role = role;
  return e;
}

Sharing with(std::vector<ctl::StatusEntry> status, bool exclusive = false, roles::Role role = roles::Role::kNone) {
  return sharing_from({false, exclusive, role}, {}, std::move(status));
}

TEST(ParseRequest, ParsesEachKindOnceIntoItsIds) {
  const Request list = parse_request("1", RequestKind::kTpcList, "0-3,8");
  EXPECT_EQ(list.device, "1");
  EXPECT_EQ(list.ids, (std::vector<unsigned>{0, 1, 2, 3, 8}));
  EXPECT_EQ(parse_request("", RequestKind::kTpcMask, "0xff00").ids,
            (std::vector<unsigned>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(parse_request("", RequestKind::kGpcList, "0,2-3").ids, (std::vector<unsigned>{0, 2, 3}));
  EXPECT_EQ(parse_request("", RequestKind::kPhysical, "0x5").mask, (Bits128{5, 0}));
  // -n is a count, not a TPC list: no IDs, and its text stays for messages.
  const Request n = parse_request("", RequestKind::kCount, "16");
  EXPECT_EQ(n.count, 16u);
  EXPECT_TRUE(n.ids.empty());
  EXPECT_EQ(n.text, "16");
  EXPECT_TRUE(n.changes());
  EXPECT_FALSE(parse_request("", RequestKind::kNone, "").changes());
  EXPECT_THROW(parse_request("", RequestKind::kTpcList, "0-"), ParseError);
  EXPECT_THROW(parse_request("", RequestKind::kTpcMask, "0x0"), ParseError);
  EXPECT_THROW(parse_request("", RequestKind::kCount, "0"), ParseError);
  EXPECT_THROW(parse_request("", RequestKind::kCount, "0-3"), ParseError);
}

TEST(ParseRequest, RecordsTheFormMinusPShows) {
  EXPECT_EQ(spec_kind(RequestKind::kTpcList), SpecKind::kTpcList);
  EXPECT_EQ(spec_kind(RequestKind::kCount), SpecKind::kTpcList);
  EXPECT_EQ(spec_kind(RequestKind::kAllTpcs), SpecKind::kTpcList);
  EXPECT_EQ(spec_kind(RequestKind::kTpcMask), SpecKind::kTpcMask);
  EXPECT_EQ(spec_kind(RequestKind::kGpcList), SpecKind::kGpcList);
  EXPECT_EQ(spec_kind(RequestKind::kPhysical), SpecKind::kPhysical);
  EXPECT_EQ(spec_kind(RequestKind::kNone), SpecKind::kNone);
  EXPECT_STREQ(form_name(SpecKind::kTpcList), "TPC list");
  EXPECT_STREQ(form_name(SpecKind::kTpcMask), "TPC mask");
  EXPECT_STREQ(form_name(SpecKind::kGpcList), "GPC list");
  EXPECT_STREQ(form_name(SpecKind::kPhysical), "physical mask");
}

TEST_F(PlannerTest, TranslatesATpcListAndComputesItsClusterLimits) {
  const Partition p = plan(RequestKind::kTpcList, "0-3");
  EXPECT_EQ(p.kind, SpecKind::kTpcList);
  EXPECT_EQ(ids_of(p.tpcs), (std::vector<unsigned>{0, 1, 2, 3}));
  EXPECT_EQ(p.enabled, topo::to_physical(t, p.tpcs));
  const topo::ClusterLimits c = topo::cluster_limits(t, p.tpcs);
  EXPECT_EQ(p.max_cluster, c.max_cluster);
  EXPECT_EQ(p.widened, topo::to_physical(t, c.widened));
  EXPECT_EQ(layouts.calibrations, 0);
  // A mask over TPC IDs is the same TPCs, recorded as a mask.
  const Partition m = plan(RequestKind::kTpcMask, "0xf");
  EXPECT_EQ(m.kind, SpecKind::kTpcMask);
  EXPECT_EQ(m.tpcs, p.tpcs);
}

TEST_F(PlannerTest, RefusesATpcTheGpuLacks) {
  EXPECT_EQ(refusal(RequestKind::kTpcList, "64-70"), "TPC 66 does not exist on device 0 (TPCs 0-65)");
  EXPECT_EQ(refusal(RequestKind::kCount, "100"), "-n 100: device 0 has 66 TPCs");
}

TEST_F(PlannerTest, GpcListAndEveryTpc) {
  const Partition g = plan(RequestKind::kGpcList, "1");
  EXPECT_EQ(g.kind, SpecKind::kGpcList);
  EXPECT_EQ(ids_of(g.tpcs), ids_of(gpc_tpcs(1)));
  EXPECT_EQ(g.gpcs.bits.indices(), (std::vector<unsigned>{1}));
  const Partition all = plan(RequestKind::kAllTpcs, "");
  EXPECT_EQ(all.kind, SpecKind::kTpcList);
  EXPECT_EQ(all.tpcs.size(), 66u);
  EXPECT_EQ(all.tpcs, whole_gpu(t).tpcs);
  EXPECT_EQ(all.enabled, whole_gpu(t).enabled);
}

TEST_F(PlannerTest, CountTakesAWholeFreeGpcAroundHeldTpcs) {
  // GPC 0 is held: -n of a GPC's size takes another whole GPC.
  const LogicalTpcSet held = gpc_tpcs(0);
  const unsigned n = static_cast<unsigned>(t.gpcs[1].tpcs.size());
  const Partition p = plan(RequestKind::kCount, std::to_string(n), with({holding(100, gpu.uuid, held)}));
  EXPECT_EQ(p.kind, SpecKind::kTpcList);
  EXPECT_EQ(p.tpcs.size(), n);
  EXPECT_TRUE((p.tpcs.bits & held.bits).none());
  bool whole = false;
  for (unsigned g = 1; g < t.gpcs.size(); ++g) whole = whole || p.tpcs == gpc_tpcs(g);
  EXPECT_TRUE(whole) << format_list(p.tpcs.bits);
  EXPECT_TRUE(notes.warnings.empty());
  ASSERT_EQ(notes.choices.size(), 1u);
  EXPECT_EQ(notes.choices[0], "-n " + std::to_string(n) + " on device 0: TPCs " + format_list(p.tpcs.bits));
}

TEST_F(PlannerTest, CountBeyondTheFreeTpcsSharesOrIsRefusedWhenExclusive) {
  LogicalTpcSet held;
  for (unsigned k = 0; k < 60; ++k) held.insert(LogicalTpcId{k});
  const std::vector<ctl::StatusEntry> status{holding(100, gpu.uuid, held)};
  EXPECT_EQ(refusal(RequestKind::kCount, "8", with(status, true)),
            "-n 8 --exclusive: only 6 of 66 TPCs of device 0 are free (held by pid 100)");
  EXPECT_EQ(refusal(RequestKind::kCount, "8", with(status, false, roles::Role::kLatencyCritical)),
            "-n 8 --latency-critical: only 6 of 66 TPCs of device 0 are free (held by pid 100)");
  const Partition p = plan(RequestKind::kCount, "8", with(status));
  EXPECT_EQ(p.tpcs.size(), 8u);
  ASSERT_FALSE(notes.warnings.empty());
  EXPECT_EQ(notes.warnings[0], "-n 8: only 6 of 66 TPCs of device 0 are free (held by pid 100); sharing TPCs with them");
}

// A role's -n keeps off the other role's TPCs while enough others are
// free (a best-effort floor is its TPCs minus the reservations), and
// overlaps them only when it must: a best-effort task may borrow a
// reservation, and a reservation may take a best-effort task's TPCs.
TEST_F(PlannerTest, RoleCountKeepsOffTheOtherRoleWhileEnoughIsFree) {
  const LogicalTpcSet lc = gpc_tpcs(0), be = gpc_tpcs(1);
  const std::vector<ctl::StatusEntry> all{holding(100, gpu.uuid, lc, roles::Role::kLatencyCritical),
                                          holding(200, gpu.uuid, be, roles::Role::kBestEffort)};
  const unsigned total = gpu.tpc_count(), free = total - lc.size() - be.size();
  for (const roles::Role role : {roles::Role::kBestEffort, roles::Role::kLatencyCritical}) {
    SCOPED_TRACE(roles::role_name(role));
    const LogicalTpcSet other = role == roles::Role::kBestEffort ? lc : be;
    const Partition p = plan(RequestKind::kCount, std::to_string(free), with(all, false, role));
    EXPECT_EQ(p.tpcs.size(), free);
    EXPECT_TRUE((p.tpcs.bits & (lc.bits | be.bits)).none()) << format_list(p.tpcs.bits);
    // One more than that: the other role's TPCs are taken (its own role's never).
    const Partition q = plan(RequestKind::kCount, std::to_string(free + 1), with(all, false, role));
    EXPECT_EQ(q.tpcs.size(), free + 1);
    EXPECT_TRUE((q.tpcs.bits & (role == roles::Role::kBestEffort ? be.bits : lc.bits)).none());
    EXPECT_FALSE((q.tpcs.bits & other.bits).none()) << format_list(q.tpcs.bits);
  }
  // Without a role, either kind of task is held.
  EXPECT_TRUE((plan(RequestKind::kCount, std::to_string(free), with(all)).tpcs.bits & (lc.bits | be.bits)).none());
}

TEST_F(PlannerTest, ExclusiveRefusesSharedTpcsAndOthersAreWarned) {
  const std::vector<ctl::StatusEntry> status{holding(100, gpu.uuid, tpc_set({2, 9}))};
  EXPECT_EQ(refusal(RequestKind::kTpcList, "0-3", with(status, true)),
            "TPCs 2 of device 0 are held by pid 100; --exclusive refuses a partition that overlaps another");
  plan(RequestKind::kTpcList, "0-3", with(status));
  ASSERT_FALSE(notes.warnings.empty());  // (after the cluster sizes 0-3 cannot host)
  EXPECT_EQ(notes.warnings.back(), "TPCs 2 of device 0 are held by pid 100: the tasks share them");
  // The task itself (and its family) is no other holder.
  notes = {};
  Sharing self = with(status, true);
  self.exclude = {100};
  EXPECT_NO_THROW(plan(RequestKind::kTpcList, "0-3", self));
}

TEST_F(PlannerTest, WarnsOfASharedGpcAndNamesAFreeOneOfTheSameSize) {
  const auto [held, other] = same_gpc();
  plan(RequestKind::kTpcList, std::to_string(other), with({holding(100, gpu.uuid, tpc_set({held}))}));
  ASSERT_FALSE(notes.warnings.empty());
  const std::string& w = notes.warnings.back();
  EXPECT_EQ(w.find("TPCs " + std::to_string(other) + " of device 0 share GPC 0 with pid 100: partitions that share "
                   "a GPC host smaller thread-block clusters than whole GPCs; GPCs no other task uses hold the same size: -t "),
            0u)
      << w;
}

TEST_F(PlannerTest, ExclusiveRefusesNextToATaskThatRunsAroundItsShim) {
  Sharing sh = with({holding(100, gpu.uuid, tpc_set({60}))}, true);
  sh.everywhere[100] = "the driver is mapped without the shim";
  EXPECT_EQ(refusal(RequestKind::kTpcList, "0-3", sh),
            "pid 100 runs on all TPCs of device 0 (the driver is mapped without the shim); --exclusive cannot keep "
            "any to itself");
}

TEST_F(PlannerTest, PhysicalMasksAreCheckedWhereTheLayoutIsKnownAndNeverCalibrate) {
  Bits128 dead;  // bits no working TPC has
  for (unsigned b = 0; b < 128; ++b)
    if (!t.working_bits().bits.test(b)) dead.set(b);
  ASSERT_TRUE(dead.any());
  EXPECT_EQ(refusal(RequestKind::kPhysical, dead.to_hex()),
            "physical mask " + dead.to_hex() + " enables no working TPC on device 0: its kernels would never run");
  const PhysicalTpcMask two = topo::to_physical(t, tpc_set({4, 5}));
  const Partition p = plan(RequestKind::kPhysical, two.bits.to_hex());
  EXPECT_EQ(p.kind, SpecKind::kPhysical);
  EXPECT_EQ(ids_of(p.tpcs), (std::vector<unsigned>{4, 5}));
  // Unknown layout: the mask goes as given, unchecked, and nothing calibrates.
  layouts.calibrated[gpu.uuid] = t;
  layouts.known.clear();
  const Partition raw = plan(RequestKind::kPhysical, "0x3");
  EXPECT_EQ(raw.enabled.bits, (Bits128{3, 0}));
  EXPECT_TRUE(raw.tpcs.empty());
  EXPECT_EQ(raw.max_cluster, kClusterUnchecked);
  EXPECT_EQ(layouts.calibrations, 0);
  // A list needs the layout, and gets it calibrated.
  plan(RequestKind::kTpcList, "0");
  EXPECT_GT(layouts.calibrations, 0);
}

TEST(VisibleTo, EachRoleIgnoresTheOtherOnly) {
  const DeviceUuid d = h200_device().uuid;
  const std::vector<ctl::StatusEntry> all{holding(1, d, tpc_set({0})),
                                          holding(2, d, tpc_set({1}), roles::Role::kLatencyCritical),
                                          holding(3, d, tpc_set({2}), roles::Role::kBestEffort)};
  auto pids = [](const std::vector<ctl::StatusEntry>& v) {
    std::vector<pid_t> out;
    for (const auto& e : v) out.push_back(e.pid);
    return out;
  };
  EXPECT_EQ(pids(visible_to(roles::Role::kNone, all)), (std::vector<pid_t>{1, 2, 3}));
  EXPECT_EQ(pids(visible_to(roles::Role::kLatencyCritical, all)), (std::vector<pid_t>{1, 2}));
  EXPECT_EQ(pids(visible_to(roles::Role::kBestEffort, all)), (std::vector<pid_t>{1, 3}));
  const Sharing lc = sharing_from({false, false, roles::Role::kLatencyCritical}, {}, all);
  EXPECT_TRUE(lc.exclusive);
  EXPECT_STREQ(lc.claim_name, "--latency-critical");
  EXPECT_EQ(lc.all.size(), 3u);
  EXPECT_EQ(pids(lc.status), (std::vector<pid_t>{1, 2}));
}

TEST_F(PlannerTest, RolesKeepABestEffortFloor) {
  const std::vector<ctl::StatusEntry> all{holding(2, gpu.uuid, tpc_set({0, 1, 2, 3}), roles::Role::kLatencyCritical),
                                          holding(3, gpu.uuid, tpc_set({4, 5}), roles::Role::kBestEffort)};
  auto choice = [&](std::initializer_list<unsigned> ids) {
    Partition p;
    p.kind = SpecKind::kTpcList;
    p.tpcs = tpc_set(ids);
    p.enabled = topo::to_physical(t, p.tpcs);
    return std::vector<Choice>{{&gpu, p}};
  };
  auto refused = [&](roles::Role role, std::initializer_list<unsigned> ids) -> std::string {
    try {
      check_roles(role, choice(ids), sharing_from({false, false, role}, {}, all), layouts);
    } catch (const Refusal& e) {
      return e.what();
    }
    return "";
  };
  // A best-effort partition inside the reservations has no floor.
  EXPECT_EQ(refused(roles::Role::kBestEffort, {1, 2}),
            "--best-effort: every TPC of 1-2 of device 0 is reserved by a latency-critical task: it would have "
            "nowhere to run while they are busy");
  EXPECT_EQ(refused(roles::Role::kBestEffort, {3, 4}), "");
  // A reservation that covers the best-effort task's last TPCs is refused.
  EXPECT_EQ(refused(roles::Role::kLatencyCritical, {4, 5}),
            "--latency-critical: with TPCs 4-5 reserved, best-effort pid 3 would have no TPC of device 0 left while "
            "latency-critical tasks are busy");
  EXPECT_EQ(refused(roles::Role::kLatencyCritical, {5, 6}), "");
  EXPECT_EQ(refused(roles::Role::kNone, {4, 5}), "");
}

// A best-effort task's shim decides which clustered kernels its floor hosts
// from the map the CLI hands it (NVTASKSET_CLUSTER_MAP), over mask bits and
// without the topology: it must answer what the topology's own rule
// (topo::largest_hostable_cluster, what -p checks against) answers, for any
// floor. Checked on the layout calibrated on an H100 (striped logical
// numbers, TPCs of unknown GPC, GPCs that ran clusters of 16, 12 and 8)
// and on the H200 model.
TEST(ClusterMapTest, HostsWhatTheTopologyHostsForAnySet) {
  const topo::Topology h100 =
      topo::load_topology_file(std::string(NVTASKSET_TEST_DATA_DIR) + "/topology/h100_measured.json").at(0);
  std::mt19937 rng(22);
  for (const topo::Topology& t : {h100, h200_topology()}) {
    const std::optional<ClusterMap> m = cluster_map_of(t, t.device.uuid);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->gpcs.size(), t.gpcs.size());
    // Whole GPU, single TPCs, whole GPCs, and random sets of every density.
    std::vector<LogicalTpcSet> sets{topo::all_tpcs(t)};
    for (unsigned k = 0; k < t.tpcs.size(); ++k) sets.push_back(tpc_set({k}));
    for (const topo::GpcInfo& g : t.gpcs) {
      LogicalTpcSet s;
      for (LogicalTpcId k : g.tpcs) s.insert(k);
      sets.push_back(s);
    }
    for (int i = 0; i < 400; ++i) {
      LogicalTpcSet s;
      const unsigned keep = 1 + rng() % 100;
      for (unsigned k = 0; k < t.tpcs.size(); ++k)
        if (rng() % 100 < keep) s.insert(LogicalTpcId{k});
      if (!s.empty()) sets.push_back(s);
    }
    std::set<std::uint32_t> seen;
    for (const LogicalTpcSet& s : sets) {
      const std::uint32_t want = topo::largest_hostable_cluster(t, s);
      EXPECT_EQ(hostable_cluster(*m, topo::to_physical(t, s).bits), want) << format_list(s.bits);
      seen.insert(want);
    }
    EXPECT_GE(seen.size(), 4u) << "the sets should span small and large clusters";
    // What the CLI hands the task reads back the same.
    EXPECT_EQ(decode_cluster_maps(encode_cluster_maps({*m})), std::vector<ClusterMap>{*m});
  }
}

TEST(ClusterMapTest, NoMapWhereTheLayoutCannotTell) {
  topo::Topology t = h200_topology();
  t.gpcs.clear();
  for (topo::TpcInfo& k : t.tpcs) k.gpc.reset();
  EXPECT_FALSE(cluster_map_of(t, t.device.uuid).has_value()) << "GPCs unknown";
  topo::Topology old = h200_topology();
  old.device.cc_major = 8;
  EXPECT_FALSE(cluster_map_of(old, old.device.uuid).has_value()) << "no clusters before Hopper";
}

TEST(ClusterMapTest, MalformedTextIsRefusedInOneLine) {
  const std::string uuid = uuid_to_string(h200_device().uuid);
  const std::vector<ClusterMap> two = decode_cluster_maps("*:0xff:0xf/8:0xf0/0;" + uuid + ":0x3");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].device, kAnyDevice);
  EXPECT_EQ(two[0].gpcs.size(), 2u);
  EXPECT_EQ(two[0].gpcs[1].max_cluster, 0u);
  EXPECT_EQ(two[1].device, h200_device().uuid);
  EXPECT_TRUE(decode_cluster_maps("").empty());
  for (const std::string& bad : std::vector<std::string>{"*", "*:ff", "*:0xff:0xf", "*:0xff:0xf/x", "*:0x1:0x3/4", "*:0xff:0xf/9999",
                                "GPU-nope:0x1", "*:0x1;*:0x1", "*:0x1:0x1/2:" + std::string(40, 'x')}) {
    try {
      decode_cluster_maps(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  std::string many = "*:0x1";
  for (unsigned i = 0; i <= kMaxMapGpcs; ++i) many += ":0x1/2";
  EXPECT_THROW(decode_cluster_maps(many), std::invalid_argument);
}

}  // namespace
}  // namespace nvtaskset::planner
