// SPDX-License-Identifier: Apache-2.0
// Failing closed where isolation depends on shared state: the
// writer lock is bounded and names its holder, a scribbled device slot is
// never taken for "no partition", a partition with no TPC of its GPU is
// never stored, and a -p's claim (old and new TPCs) is repaired from the
// region by a reader that can attach it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "nvtaskset/control_region.hpp"
#include "region_test_util.hpp"
#include "nvtaskset/sharing.hpp"
#include "nvtaskset/status.hpp"

namespace fs = std::filesystem;
using namespace nvtaskset;
using namespace nvtaskset::ctl;

namespace {

using test::own_region_fd;

DevicePartition tpcs(std::uint64_t lo, DeviceDesc desc = {}) {
  DevicePartition dp;
  dp.partition.kind = SpecKind::kTpcList;
  dp.partition.enabled.bits = {lo, 0};
  dp.partition.tpcs.bits = {lo, 0};
  dp.desc = desc;
  return dp;
}

// A second open file description of this process's region, as another
// process (the task's user running flock(1) on /proc/<pid>/fd/<n>) gets.
struct OtherHolder {
  int fd = -1;
  OtherHolder() {
    const int mine = own_region_fd();
    if (mine >= 0) fd = ::open(("/proc/self/fd/" + std::to_string(mine)).c_str(), O_RDWR | O_CLOEXEC);
  }
  ~OtherHolder() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TEST(WriterLock, WaitsABoundedTimeAndNamesTheHolder) {
  auto r = Region::create_for_self({tpcs(0x3)});
  OtherHolder other;
  ASSERT_GE(other.fd, 0);
  ASSERT_EQ(::flock(other.fd, LOCK_EX | LOCK_NB), 0);
  EXPECT_FALSE(r->try_lock());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r->lock(std::chrono::milliseconds(150));
    ADD_FAILURE() << "lock() returned while another held the lock";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("locked by pid " + std::to_string(::getpid())), std::string::npos) << what;
    EXPECT_NE(what.find("nothing was changed"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  // Bounded: the wait ends near its timeout, not never.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(read_all(r->header())[0].partition.enabled.bits, (Bits128{0x3, 0}));
  ::flock(other.fd, LOCK_UN);
  // Held by this object, a write does not take it again (no self-deadlock),
  // and another writer waits until unlock().
  r->lock(std::chrono::milliseconds(150));
  EXPECT_TRUE(r->locked());
  r->write(tpcs(0xc));
  EXPECT_NE(::flock(other.fd, LOCK_EX | LOCK_NB), 0);
  r->unlock();
  EXPECT_EQ(::flock(other.fd, LOCK_EX | LOCK_NB), 0);
  ::flock(other.fd, LOCK_UN);
  EXPECT_EQ(read_all(r->header())[0].partition.enabled.bits, (Bits128{0xc, 0}));
}

TEST(EntryValidation, AScribbledSlotIsUnreadableNeverNoPartition) {
  static Header h;  // process-local, as the shim's fallback header
  std::memset(static_cast<void*>(&h), 0, sizeof h);
  DevicePartition dp = tpcs(0x3);
  dp.device = *uuid_from_string("GPU-00112233-4455-6677-8899-aabbccddeeff");
  init_header(h, {dp});
  std::uint8_t gpu[16];
  std::memcpy(gpu, dp.device.data(), 16);
  auto uuid_of = [&](std::uint8_t (&out)[16]) {
    std::memcpy(out, gpu, 16);
    return true;
  };
  LaunchView v{};
  const DeviceEntry* e = entry_for_device(h, uuid_of);
  ASSERT_EQ(e, &h.devices[0]);
  EXPECT_EQ(read_launch_view(*e, v), ReadResult::kOk);
  EXPECT_EQ(validate(h), "");

  // The whole slot area scribbled with random bytes, the header's magic
  // intact: whatever the bytes, the launch finds a slot and cannot read it
  // (the callback then applies its last good partition, or runs unmasked
  // with a warning and a count), never "no partition" silently.
  std::mt19937_64 rng(21);
  for (int round = 0; round < 2000; ++round) {
    auto* bytes = reinterpret_cast<unsigned char*>(&h.devices[0]);
    for (std::size_t i = 0; i < sizeof h.devices; ++i) bytes[i] = static_cast<unsigned char>(rng());
    const DeviceEntry* s = entry_for_device(h, uuid_of);
    ASSERT_NE(s, nullptr) << "round " << round;
    EXPECT_EQ(read_launch_view(*s, v), ReadResult::kInconsistent) << "round " << round;
    EXPECT_NE(validate(h), "") << "round " << round;
  }

  // One field at a time, on an otherwise intact entry.
  init_header(h, {dp});
  auto& b = h.devices[0].buffer[h.devices[0].generation.load() & 1];
  b.kind.store(7);
  EXPECT_EQ(read_launch_view(h.devices[0], v), ReadResult::kInconsistent);
  EXPECT_NE(validate(h).find("partition kind 7"), std::string::npos) << validate(h);
  b.kind.store(0);  // "no partition", but a mask is there: not what a writer stores
  EXPECT_EQ(read_launch_view(h.devices[0], v), ReadResult::kInconsistent);
  EXPECT_NE(validate(h).find("holds a mask but no partition"), std::string::npos) << validate(h);
  b.kind.store(1);
  b.max_cluster.store(1u << 20);
  EXPECT_EQ(read_launch_view(h.devices[0], v), ReadResult::kInconsistent);
  b.max_cluster.store(0);
  EXPECT_EQ(read_launch_view(h.devices[0], v), ReadResult::kOk);
  h.devices[0].in_use.store(0x5a5a5a5a);
  EXPECT_EQ(entry_for_device(h, uuid_of), &h.devices[0]);
  EXPECT_EQ(read_launch_view(h.devices[0], v), ReadResult::kInconsistent);
  EXPECT_NE(validate(h).find("has flag"), std::string::npos);
  // A genuinely empty region is "no partition", as before.
  init_header(h, {});
  EXPECT_EQ(entry_for_device(h, uuid_of), nullptr);
  EXPECT_EQ(validate(h), "");
}

TEST(EntryValidation, APartitionWithNoTpcOfItsGpuIsNeverStored) {
  // A stand-in GPU of 16 SMs (8 TPCs), compute capability 8.6: mask bit k
  // controls TPC k, so bit 8 controls nothing.
  const DeviceDesc ampere{16, 8, 6, 13000};
  for (const char* bad : {"*,1,0x100,0x100,0x0,16,8,6,13000,0,0x0,0", "*,2,0x300,0x300,0x0,16,8,6,13000,0,0x0,0",
                          "*,4,0x100,0x0,0x0,16,8,6,13000,0,0x0,0", "*,4,0x10000000000000000,0x0,0x0,16,8,6,13000,0,0x0,0",
                          "*,1,0x1,0x1000000000000000000,0x0,132,9,0,13000,0,0x0,0"}) {
    try {
      decode_partitions(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  // Hopper and later: a physical bit above the TPC count can control a
  // working TPC (bit 100 of an 8-TPC part in the e2e layout): accepted.
  EXPECT_EQ(decode_partitions("*,4,0x10000000000000000000000000,0x0,0x0,16,9,0,13000,0,0x0,0").size(), 1u);
  // Unknown descriptor: nothing to check against.
  EXPECT_EQ(decode_partitions("*,4,0x100,0x0,0x0,0,0,0,0,0,0x0,0").size(), 1u);

  // Written into a region: refused with one line, the region unchanged.
  auto r = Region::create_for_self({tpcs(0x3, ampere)});
  DevicePartition none_working;
  none_working.partition.kind = SpecKind::kPhysical;
  none_working.partition.enabled.bits = {0x100, 0};
  none_working.desc = ampere;
  try {
    r->write(none_working);
    ADD_FAILURE() << "a mask with no TPC of its GPU was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("enables no TPC"), std::string::npos) << e.what();
  }
  EXPECT_EQ(r->read_all()[0].partition.enabled.bits, (Bits128{0x3, 0}));
  EXPECT_FALSE(r->locked());  // a refused write lets go of the lock
}

TEST(Claim, UnionHoldsTheOldAndTheNewTpcs) {
  Partition a = tpcs(0x3).partition, b = tpcs(0xc).partition;
  Partition u = cli::claim_union(a, b);
  EXPECT_EQ(u.tpcs.bits, (Bits128{0xf, 0}));
  EXPECT_EQ(u.enabled.bits, (Bits128{0xf, 0}));
  EXPECT_EQ(cli::claim_union(Partition{}, b), b);
  EXPECT_EQ(cli::claim_union(a, Partition{}), a);
  // Known only as a mask on one side: the claim is a mask, read through the layout.
  Partition phys;
  phys.kind = SpecKind::kPhysical;
  phys.enabled.bits = {0x30, 0};
  u = cli::claim_union(a, phys);
  EXPECT_EQ(u.kind, SpecKind::kPhysical);
  EXPECT_TRUE(u.tpcs.empty());
  EXPECT_EQ(u.enabled.bits, (Bits128{0x33, 0}));
  Partition g1 = a, g2 = b;
  g1.kind = g2.kind = SpecKind::kGpcList;
  g1.gpcs.bits = {0x1, 0};
  g2.gpcs.bits = {0x2, 0};
  EXPECT_EQ(cli::claim_union(g1, g2).gpcs.bits, (Bits128{0x3, 0}));
}

class Repair : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvtaskset-repair-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::setenv("NVTASKSET_STATUS_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("NVTASKSET_STATUS_DIR");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  StatusEntry own_entry() {
    for (const StatusEntry& e : read_status())
      if (e.pid == ::getpid()) return e;
    ADD_FAILURE() << "no entry for this process";
    return {};
  }
  std::string dir_;
};

TEST_F(Repair, AClaimLeftByAKilledWriterIsRepairedFromTheRegion) {
  auto r = Region::create_for_self({tpcs(0x3)});
  // A -p published its claim (TPCs 0-3: the task's 0-1 and the new 2-3),
  // then died before writing the region.
  ASSERT_EQ(publish_status(::getpid(), {tpcs(0xf)}), "");
  StatusEntry e = own_entry();
  ASSERT_EQ(e.partitions, std::vector<DevicePartition>{tpcs(0xf)});
  // While a writer holds the lock, the change is under way: left alone.
  {
    OtherHolder other;
    ASSERT_GE(other.fd, 0);
    ASSERT_EQ(::flock(other.fd, LOCK_EX | LOCK_NB), 0);
    EXPECT_FALSE(cli::repair_entry(e, *r));
    EXPECT_EQ(own_entry().partitions, std::vector<DevicePartition>{tpcs(0xf)});
  }
  // The writer gone (the kernel dropped its lock): repaired from the region.
  EXPECT_TRUE(cli::repair_entry(e, *r));
  EXPECT_EQ(e.partitions, r->read_all());
  EXPECT_EQ(own_entry().partitions, r->read_all());
  EXPECT_FALSE(r->locked());
  // An entry that agrees is left as it is.
  EXPECT_FALSE(cli::repair_entry(e, *r));
}
