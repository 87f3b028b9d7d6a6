#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "nvtaskset/control_region.hpp"

using namespace nvtaskset;
using namespace nvtaskset::ctl;

namespace {

std::string shm_path(pid_t pid) { return "/dev/shm/" + region_name(pid); }
bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

DevicePartition tpcs(std::uint64_t enabled_lo, std::uint64_t enabled_hi = 0) {
  DevicePartition dp;
  dp.partition.kind = SpecKind::kTpcList;
  dp.partition.enabled.bits = {enabled_lo, enabled_hi};
  dp.partition.tpcs.bits = {enabled_lo, enabled_hi};
  return dp;
}

// Removes this process's region when a test ends, whatever happens.
struct SelfRegion {
  std::unique_ptr<Region> r;
  explicit SelfRegion(const std::vector<DevicePartition>& init) : r(Region::create_for_self(init)) {}
  ~SelfRegion() { r->unlink(); }
};

std::string attach_error(pid_t pid) {
  try {
    Region::attach(pid);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ControlRegion, CreateAttachUpdate) {
  SelfRegion self({tpcs(0xff)});
  const pid_t me = ::getpid();
  EXPECT_EQ(self.r->header().pid, me);
  EXPECT_EQ(self.r->header().start_time, process_start_time(me));
  EXPECT_NE(process_start_time(me), 0u);

  auto other = Region::attach(me);  // a second, independent mapping
  auto parts = other->read_all();
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0], tpcs(0xff));

  other->write(tpcs(0x0f, 0x1));
  auto again = self.r->read_all();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0], tpcs(0x0f, 0x1));
  std::uint64_t lo = 0, hi = 0;
  EXPECT_TRUE(read_enabled(self.r->header().devices[0], lo, hi));
  EXPECT_EQ(lo, 0x0fu);
  EXPECT_EQ(hi, 0x1u);
  EXPECT_EQ(self.r->header().devices[0].generation.load(), 2u);

  // A second device gets its own entry; an unpartitioned entry reads as inactive.
  DevicePartition dev;
  dev.device = *uuid_from_string("GPU-00112233-4455-6677-8899-aabbccddeeff");
  other->write(dev);
  EXPECT_EQ(self.r->read_all().size(), 2u);
  EXPECT_FALSE(read_enabled(self.r->header().devices[1], lo, hi));
}

TEST(ControlRegion, RunsOutOfDeviceSlotsWithAnError) {
  SelfRegion self({});
  for (unsigned i = 0; i < kMaxDevices; ++i) {
    DevicePartition dp = tpcs(1);
    dp.device[0] = static_cast<std::uint8_t>(i + 1);
    self.r->write(dp);
  }
  DevicePartition extra = tpcs(1);
  extra.device[0] = 0xee;
  EXPECT_THROW(self.r->write(extra), Error);
}

TEST(ControlRegion, OwnerOnlyAndRemovedByUnlink) {
  const pid_t me = ::getpid();
  {
    SelfRegion self({tpcs(1)});
    struct stat st {};
    ASSERT_EQ(::stat(shm_path(me).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  EXPECT_FALSE(exists(shm_path(me)));
  EXPECT_EQ(attach_error(me), "pid " + std::to_string(me) + " is not running under nvtaskset");
}

TEST(ControlRegion, CreatingTwiceInOneProcessSharesTheRegion) {
  // A second copy of the shim in the same process must find the first one's region.
  SelfRegion first({tpcs(0x3)});
  auto second = Region::create_for_self({tpcs(0xff)});
  ASSERT_EQ(second->read_all().size(), 1u);
  EXPECT_EQ(second->read_all()[0], tpcs(0x3));  // not reseeded
  second->header().callback_registered.store(1);
  EXPECT_EQ(first.r->header().callback_registered.load(), 1u);
}

TEST(ControlRegion, AnotherUserCannotAttach) {
  SelfRegion self({tpcs(1)});
  const pid_t me = ::getpid();
  if (::getuid() == 0) {
    // Root can open anything: check from a child that drops to "nobody".
    const pid_t child = ::fork();
    if (child == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      const std::string err = attach_error(me);
      ::_exit(err.find("belongs to another user") != std::string::npos ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  } else {
    // Not root: a region we may not open looks exactly like another user's.
    ASSERT_EQ(::chmod(shm_path(me).c_str(), 0), 0);
    EXPECT_NE(attach_error(me).find("belongs to another user"), std::string::npos);
    ::chmod(shm_path(me).c_str(), 0600);
  }
}

TEST(ControlRegion, BadAndDeadPids) {
  EXPECT_EQ(attach_error(0), "invalid pid 0");
  EXPECT_EQ(attach_error(-5), "invalid pid -5");
  // A child that creates a region and dies without removing it.
  const pid_t child = ::fork();
  if (child == 0) {
    Region::create_for_self({tpcs(1)}).release();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(exists(shm_path(child)));
  EXPECT_EQ(attach_error(child), "pid " + std::to_string(child) + ": no such process");
  EXPECT_FALSE(exists(shm_path(child)));  // the stale leftover was removed
}

TEST(ControlRegion, ReusedPidIsDetectedAsStale) {
  // A live process (sleep) that never ran nvtaskset, and a leftover region
  // under its PID from a process that had that PID before.
  const pid_t sleeper = ::fork();
  if (sleeper == 0) {
    ::execlp("sleep", "sleep", "30", nullptr);
    ::_exit(127);
  }
  // Killed and reaped however the test ends (a failed ASSERT returns early).
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      int st = 0;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
    }
  } reaper{sleeper};
  const pid_t writer = ::fork();
  if (writer == 0) {
    auto r = Region::create_for_self({tpcs(1)});
    // Pretend this region belongs to `sleeper` but with another start time.
    const std::string from = shm_path(::getpid()), to = shm_path(sleeper);
    ::_exit(::rename(from.c_str(), to.c_str()) == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(writer, &status, 0), writer);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_TRUE(exists(shm_path(sleeper)));
  EXPECT_EQ(attach_error(sleeper), "pid " + std::to_string(sleeper) + " is not running under nvtaskset");
  EXPECT_FALSE(exists(shm_path(sleeper)));
}

TEST(ControlRegion, RemoveStaleCleansLeftovers) {
  const pid_t child = ::fork();
  if (child == 0) {
    Region::create_for_self({tpcs(1)}).release();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(exists(shm_path(child)));
  SelfRegion live({tpcs(1)});
  EXPECT_GE(Region::remove_stale(), 1u);
  EXPECT_FALSE(exists(shm_path(child)));
  EXPECT_TRUE(exists(shm_path(::getpid())));  // live regions stay
}

// Writers flip between masks whose halves are tied together (hi == ~lo)
// while readers check every value they see; a torn read breaks the tie.
TEST(ControlRegion, ReadersNeverSeeATornMask) {
  SelfRegion self({tpcs(0x1, ~0x1ull)});
  const pid_t me = ::getpid();
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> reads{0}, torn{0};

  // One writer in another process (its own mapping and the cross-process lock)...
  const pid_t proc_writer = ::fork();
  if (proc_writer == 0) {
    auto r = Region::attach(me);
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(800);
    for (std::uint64_t i = 2; std::chrono::steady_clock::now() < end; ++i) r->write(tpcs(i * 0x9e3779b97f4a7c15ull | 1, ~(i * 0x9e3779b97f4a7c15ull | 1)));
    r.release();  // do not run destructors that touch shared state twice
    ::_exit(0);
  }
  // ...and two in this one.
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      auto r = Region::attach(me);
      for (std::uint64_t i = w; !stop.load(); i += 2) r->write(tpcs(i << 1 | 1, ~(i << 1 | 1)));
    });
  }
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      const DeviceEntry& e = self.r->header().devices[0];
      while (!stop.load()) {
        std::uint64_t lo = 0, hi = 0;
        if (!read_enabled(e, lo, hi) || hi != ~lo) torn.fetch_add(1);
        const Partition p = read_partition(e);
        if (p.tpcs.bits.hi != ~p.tpcs.bits.lo || p.enabled.bits != p.tpcs.bits)
          torn.fetch_add(1);
        reads.fetch_add(1);
      }
    });
  }
  int status = 0;
  ASSERT_EQ(::waitpid(proc_writer, &status, 0), proc_writer);
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_GT(reads.load(), 10000u);
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_GT(self.r->header().devices[0].generation.load(), 1000u);
}
