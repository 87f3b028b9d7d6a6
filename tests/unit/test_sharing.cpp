// SPDX-License-Identifier: Apache-2.0
// The pure parts of sharing a GPU (nvtaskset/sharing.hpp): which entries are
// new since a snapshot (what a lock-free choice checks after it publishes),
// and who holds which TPCs of a GPU.
#include "nvtaskset/sharing.hpp"

#include <gtest/gtest.h>

#include "test_topology_fixtures.hpp"

namespace nvtaskset::cli {
namespace {

using topo::testing::h200_device;

DevicePartition tpcs_on(const DeviceUuid& dev, std::initializer_list<unsigned> ids) {
  DevicePartition dp;
  dp.device = dev;
  dp.partition.kind = SpecKind::kTpcList;
  for (unsigned k : ids) {
    dp.partition.tpcs.insert(LogicalTpcId{k});
    dp.partition.enabled.bits.set(k);  // any physical view; only the logical one is read
  }
  return dp;
}

ctl::StatusEntry entry(pid_t pid, std::uint64_t start, std::vector<DevicePartition> parts, uid_t uid = 1000) {
  return {pid, start, uid, std::move(parts)};
}

std::vector<pid_t> pids(const std::vector<ctl::StatusEntry>& v) {
  std::vector<pid_t> out;
  for (const auto& e : v) out.push_back(e.pid);
  return out;
}

TEST(ChangedSince, KeepsOnlyTasksThatAppearedOrChanged) {
  const topo::DeviceInfo gpu = h200_device();
  const std::vector<ctl::StatusEntry> before{entry(10, 1, {tpcs_on(gpu.uuid, {0, 1})}),
                                             entry(11, 1, {tpcs_on(gpu.uuid, {2})}),
                                             entry(12, 1, {tpcs_on(gpu.uuid, {3})})};
  const std::vector<ctl::StatusEntry> after{
      entry(10, 1, {tpcs_on(gpu.uuid, {0, 1})}),  // as it was
      entry(11, 1, {tpcs_on(gpu.uuid, {2, 4})}),  // moved by -p
      entry(12, 9, {tpcs_on(gpu.uuid, {3})}),     // same PID, another process
      entry(13, 1, {tpcs_on(gpu.uuid, {5})}),     // a new task
  };
  EXPECT_EQ(pids(changed_since(before, after)), (std::vector<pid_t>{11, 12, 13}));
  EXPECT_TRUE(changed_since(after, after).empty());
  // A task that ended is no newcomer.
  EXPECT_TRUE(changed_since(after, {after[0]}).empty());
  EXPECT_EQ(pids(changed_since({}, after)).size(), 4u);
}

TEST(HoldersOn, CountsTheDevicesOwnPartitionOverTheAnyDeviceOneAndSkipsExcluded) {
  const topo::DeviceInfo gpu0 = h200_device(0), gpu1 = h200_device(1);
  const std::vector<ctl::StatusEntry> status{
      entry(10, 1, {tpcs_on(kAnyDevice, {0, 1}), tpcs_on(gpu0.uuid, {6})}),
      entry(11, 1, {tpcs_on(gpu1.uuid, {2})}),
      entry(12, 1, {tpcs_on(kAnyDevice, {3})}),
  };
  const auto on0 = holders_on(status, gpu0, nullptr, {12});
  ASSERT_EQ(on0.size(), 1u);
  EXPECT_EQ(on0[0].pid, 10);
  EXPECT_EQ(on0[0].tpcs.bits.indices(), (std::vector<unsigned>{6}));
  const auto on1 = holders_on(status, gpu1, nullptr, {});
  ASSERT_EQ(on1.size(), 3u);
  EXPECT_EQ(held_by(on1).bits.indices(), (std::vector<unsigned>{0, 1, 2, 3}));
  // Without GPCs, only common TPCs count.
  const Overlap o = overlap_with(nullptr, on0[0].tpcs, on1);
  EXPECT_TRUE(o.share_tpcs.empty());
  EXPECT_TRUE(o.share_gpcs.empty());
  const Overlap p = overlap_with(nullptr, held_by({on1[0]}), on1);
  EXPECT_EQ(p.share_tpcs, (std::vector<pid_t>{10}));
}

}  // namespace
}  // namespace nvtaskset::cli
