// SPDX-License-Identifier: Apache-2.0
// The claim protocol (planner/claim.hpp) on a scripted world: the status
// each re-read returns and every wait are the test's, so every step of
// settle() is checked without processes and without timing. What it must
// do (docs/design.md, "Sharing a GPU"): publish, read again, and only for an
// entry that is new or changed since the snapshot and overlaps the choice,
// take it back, wait a random growing moment, replan from the fresh status;
// after kClaimTries races an exclusive claim fails, any other keeps its
// choice and says why it shares.
#include "nvtaskset/claim.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <deque>
#include <map>

#include "test_topology_fixtures.hpp"

namespace nvtaskset::planner {
namespace {

using topo::testing::h200_device;
using topo::testing::h200_topology;
using topo::testing::tpc_set;

struct FixedLayouts : Layouts {
  std::map<DeviceUuid, topo::Topology> known;
  const topo::Topology& topology(const topo::DeviceInfo& dev) override { return known.at(dev.uuid); }
  const topo::Topology* known_topology(const topo::DeviceInfo& dev) override {
    auto it = known.find(dev.uuid);
    return it == known.end() ? nullptr : &it->second;
  }
};

ctl::StatusEntry holding(pid_t pid, std::uint64_t start, const DeviceUuid& dev, const LogicalTpcSet& tpcs,
                         roles::Role role = roles::Role::kNone) {
  DevicePartition dp;
  dp.device = dev;
  dp.partition.kind = SpecKind::kTpcList;
  dp.partition.tpcs = tpcs;
  dp.partition.enabled.bits = tpcs.bits;
  ctl::StatusEntry e{pid, start, 1000, {dp}};
  e.role = role;
  return e;
}

// The world and the caller's steps, recording what settle() did, in order.
struct ClaimTest : ::testing::Test {
  topo::DeviceInfo gpu = h200_device();
  FixedLayouts layouts;
  static constexpr pid_t kSelf = 4242;
  Sharing sh;
  std::vector<std::string> log;  // "publish 0-3", "read", "take back", "sleep 3", "plan"
  std::vector<int> sleeps;
  // What each read of the status returns; the last one repeats.
  std::deque<std::vector<ctl::StatusEntry>> reads;
  // What each replan chooses; the last one repeats.
  std::deque<LogicalTpcSet> plans;
  std::vector<std::string> warnings;

  void SetUp() override {
    unsetenv("NVTASKSET_CLAIM_DELAY_MS");
    layouts.known[gpu.uuid] = h200_topology();
    sh.exclude = {kSelf};
  }
  ClaimWorld world() {
    return {[this] {
              log.push_back("read");
              std::vector<ctl::StatusEntry> r = reads.front();
              if (reads.size() > 1) reads.pop_front();
              return r;
            },
            [this](std::chrono::milliseconds ms) {
              log.push_back("sleep");
              sleeps.push_back(static_cast<int>(ms.count()));
            }};
  }
  std::vector<Choice> choice(const LogicalTpcSet& tpcs) {
    Partition p;
    p.kind = SpecKind::kTpcList;
    p.tpcs = tpcs;
    p.enabled.bits = tpcs.bits;
    return {{&gpu, p}};
  }
  Claim steps() {
    return {[this] {
              log.push_back("plan");
              warnings.push_back("replanned");
              LogicalTpcSet next = plans.front();
              if (plans.size() > 1) plans.pop_front();
              return choice(next);
            },
            [this](const std::vector<Choice>& c) {
              log.push_back("publish " + format_ranges(c[0].partition.tpcs.bits));
            },
            [this] { log.push_back("take back"); }};
  }
  std::vector<Choice> settle_from(const LogicalTpcSet& first) {
    return settle(sh, layouts, steps(), choice(first), &warnings, world());
  }
  long count(const std::string& what) const { return std::count(log.begin(), log.end(), what); }
};

TEST_F(ClaimTest, AChoiceNobodyRacedStandsAfterOnePublishAndOneRead) {
  const auto other = holding(100, 1, gpu.uuid, tpc_set({10, 11}));
  sh.status = {other};
  reads = {{other, holding(kSelf, 1, gpu.uuid, tpc_set({0, 1, 2, 3}))}};  // our own entry is no racer
  warnings = {"planned"};
  const std::vector<Choice> got = settle_from(tpc_set({0, 1, 2, 3}));
  EXPECT_EQ(log, (std::vector<std::string>{"publish 0-3", "read"}));
  EXPECT_EQ(got[0].partition.tpcs, tpc_set({0, 1, 2, 3}));
  EXPECT_EQ(warnings, (std::vector<std::string>{"planned"}));
}

TEST_F(ClaimTest, AnOverlapThatWasThereWhenPlanningIsNoRace) {
  // Planned knowing pid 100 holds TPC 2 (a plain -t shares it, warned).
  const auto other = holding(100, 1, gpu.uuid, tpc_set({2}));
  sh.status = {other};
  reads = {{other}};
  settle_from(tpc_set({0, 1, 2, 3}));
  EXPECT_EQ(log, (std::vector<std::string>{"publish 0-3", "read"}));
}

TEST_F(ClaimTest, ARacerIsSeenTakenBackAndPlannedAround) {
  const auto racer = holding(200, 7, gpu.uuid, tpc_set({1}));
  reads = {{racer}, {racer}, {racer}};
  plans = {tpc_set({4, 5, 6, 7})};
  warnings = {"stale warning of the first plan"};
  const std::vector<Choice> got = settle_from(tpc_set({0, 1, 2, 3}));
  EXPECT_EQ(log, (std::vector<std::string>{"publish 0-3", "read", "take back", "sleep", "read", "plan",
                                           "publish 4-7", "read"}));
  EXPECT_EQ(got[0].partition.tpcs, tpc_set({4, 5, 6, 7}));
  // The replan saw the racer, and its warnings replaced the first plan's.
  ASSERT_EQ(sh.status.size(), 1u);
  EXPECT_EQ(sh.status[0].pid, 200);
  EXPECT_EQ(warnings, (std::vector<std::string>{"replanned"}));
  ASSERT_EQ(sleeps.size(), 1u);
  EXPECT_GE(sleeps[0], 1);
  EXPECT_LE(sleeps[0], 4);  // 2 << 1
}

TEST_F(ClaimTest, AChangedEntryAndASharedGpcAreRacesToo) {
  const topo::Topology& t = layouts.known[gpu.uuid];
  // Pid 100 was elsewhere when we planned, and moved next to us (same GPC, no common TPC).
  // Two TPCs of one GPC (TPCs that host no cluster block have no GPC).
  const unsigned mine = t.gpcs[0].tpcs.at(0).value, neighbour = t.gpcs[0].tpcs.at(1).value;
  const unsigned far = t.gpcs[1].tpcs.at(0).value;
  sh.status = {holding(100, 1, gpu.uuid, tpc_set({far}))};
  const auto moved = holding(100, 1, gpu.uuid, tpc_set({neighbour}));
  reads = {{moved}, {moved}};
  plans = {tpc_set({far})};
  settle_from(tpc_set({mine}));
  EXPECT_EQ(count("take back"), 1);
  EXPECT_EQ(count("plan"), 1);
}

TEST_F(ClaimTest, EachRoleIgnoresTheOthersEntries) {
  // A latency-critical reservation does not count best-effort tasks.
  sh.role = roles::Role::kLatencyCritical;
  sh.exclusive = true;
  reads = {{holding(300, 1, gpu.uuid, tpc_set({0, 1, 2, 3}), roles::Role::kBestEffort)}};
  settle_from(tpc_set({0, 1, 2, 3}));
  EXPECT_EQ(log, (std::vector<std::string>{"publish 0-3", "read"}));
}

// A racer that changes at every read (a new start time: another process).
std::deque<std::vector<ctl::StatusEntry>> churning(const DeviceUuid& dev, const LogicalTpcSet& tpcs) {
  std::deque<std::vector<ctl::StatusEntry>> r;
  for (std::uint64_t i = 1; i <= 2 * kClaimTries + 2; ++i) r.push_back({holding(200, i, dev, tpcs)});
  return r;
}

TEST_F(ClaimTest, AnExclusiveClaimThatKeepsRacingFailsAndTakesItsEntryBack) {
  sh.exclusive = true;
  reads = churning(gpu.uuid, tpc_set({0}));
  plans = {tpc_set({0, 1})};
  try {
    settle_from(tpc_set({0, 1}));
    FAIL() << "no refusal";
  } catch (const Refusal& e) {
    EXPECT_EQ(std::string(e.what()),
              "pid 200 took the same TPCs at the same moment, 8 times in a row; --exclusive refuses to share them "
              "(try again)");
  }
  EXPECT_EQ(count("publish 0-1"), kClaimTries);
  EXPECT_EQ(count("take back"), kClaimTries);  // after every race, the last included
  EXPECT_EQ(count("plan"), kClaimTries - 1);
  EXPECT_EQ(log.back(), "take back");
  // Random, growing waits: the k-th within 1 .. 2 << k ms.
  ASSERT_EQ(sleeps.size(), static_cast<std::size_t>(kClaimTries - 1));
  for (std::size_t k = 0; k < sleeps.size(); ++k) {
    EXPECT_GE(sleeps[k], 1);
    EXPECT_LE(sleeps[k], 2 << (k + 1));
  }
}

TEST_F(ClaimTest, AnyOtherClaimThatKeepsRacingKeepsItsChoiceAndSaysWhy) {
  reads = churning(gpu.uuid, tpc_set({0}));
  plans = {tpc_set({0, 1})};
  const std::vector<Choice> got = settle_from(tpc_set({0, 1}));
  EXPECT_EQ(got[0].partition.tpcs, tpc_set({0, 1}));
  EXPECT_EQ(count("take back"), kClaimTries - 1);  // the last choice stays published
  EXPECT_EQ(log.back(), "read");
  ASSERT_FALSE(warnings.empty());
  EXPECT_EQ(warnings.back(), "pid 200 chose TPCs at the same moment, 8 times in a row: the tasks share TPCs (see --status)");
}

TEST_F(ClaimTest, AnExclusiveClaimThatOnlySharesAGpcKeepsItsChoice) {
  const topo::Topology& t = layouts.known[gpu.uuid];
  const unsigned mine = t.gpcs[0].tpcs.at(0).value, neighbour = t.gpcs[0].tpcs.at(1).value;
  sh.exclusive = true;
  reads = churning(gpu.uuid, tpc_set({neighbour}));
  plans = {tpc_set({mine})};
  EXPECT_NO_THROW(settle_from(tpc_set({mine})));
  EXPECT_EQ(warnings.back(), "pid 200 chose TPCs at the same moment, 8 times in a row: the tasks share a GPC (see --status)");
}

TEST_F(ClaimTest, APublishThatFailsStopsTheClaimBeforeAnyRead) {
  Claim c = steps();
  c.publish = [this](const std::vector<Choice>&) {
    log.push_back("publish");
    throw Refusal("cannot publish");
  };
  reads = {{}};
  EXPECT_THROW(settle(sh, layouts, c, choice(tpc_set({0})), &warnings, world()), Refusal);
  EXPECT_EQ(log, (std::vector<std::string>{"publish"}));
}

TEST_F(ClaimTest, TestsWidenTheRaceWithADelayBeforeTheFirstPublish) {
  setenv("NVTASKSET_CLAIM_DELAY_MS", "25", 1);
  reads = {{}};
  settle_from(tpc_set({0}));
  unsetenv("NVTASKSET_CLAIM_DELAY_MS");
  EXPECT_EQ(log, (std::vector<std::string>{"sleep", "publish 0", "read"}));
  EXPECT_EQ(sleeps, (std::vector<int>{25}));
  // Out of range or not a number: no delay.
  for (const char* bad : {"0", "-5", "10001", "25ms"}) {
    log.clear();
    setenv("NVTASKSET_CLAIM_DELAY_MS", bad, 1);
    settle_from(tpc_set({0}));
    unsetenv("NVTASKSET_CLAIM_DELAY_MS");
    EXPECT_EQ(log.front(), "publish 0") << bad;
  }
}

TEST(ClaimUnion, CoversTheOldAndTheNewTpcs) {
  Partition now, next;
  now.kind = next.kind = SpecKind::kTpcList;
  now.tpcs = tpc_set({0, 1});
  now.enabled.bits = now.tpcs.bits;
  next.tpcs = tpc_set({4});
  next.enabled.bits = next.tpcs.bits;
  const Partition u = claim_union(now, next);
  EXPECT_EQ(u.tpcs, tpc_set({0, 1, 4}));
  EXPECT_EQ(u.enabled.bits, tpc_set({0, 1, 4}).bits);
  EXPECT_EQ(u.kind, SpecKind::kTpcList);
}

}  // namespace
}  // namespace nvtaskset::planner
