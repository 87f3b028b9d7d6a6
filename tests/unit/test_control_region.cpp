// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include <sys/mman.h>
#include <fcntl.h>

#include "nvtaskset/control_region.hpp"
#include "region_test_util.hpp"

using namespace nvtaskset;
using namespace nvtaskset::ctl;

namespace {

using test::own_region_fd;

// Waits for a forked child's status; -1 when it did not exit normally.
int exit_code(pid_t child) {
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
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

TEST(ControlRegion, OwnerOnlySealedAndGoneWithTheRegion) {
  const pid_t me = ::getpid();
  {
    SelfRegion self({tpcs(1)});
    const int fd = own_region_fd();
    ASSERT_GE(fd, 0);
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_EQ(st.st_size, static_cast<off_t>(sizeof(Header)));
    // Nobody, not even the owner, can change its size under the task (a
    // truncated mapping would kill the task with SIGBUS at its next launch).
    EXPECT_NE(::ftruncate(fd, 0), 0);
    EXPECT_EQ(errno, EPERM);
    EXPECT_NE(::ftruncate(fd, 100), 0);
    // And nothing appears in a shared namespace another user could squat.
    EXPECT_FALSE(std::ifstream("/dev/shm/" + region_name(me)).good());
  }
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
    const int fd = own_region_fd();
    ASSERT_EQ(::fchmod(fd, 0), 0);
    EXPECT_NE(attach_error(me).find("belongs to another user"), std::string::npos);
    ::fchmod(fd, 0600);
  }
}

TEST(ControlRegion, BadDeadAndZombiePids) {
  EXPECT_EQ(attach_error(0), "invalid pid 0");
  EXPECT_EQ(attach_error(-5), "invalid pid -5");
  // A child that creates a region and exits: a zombie until reaped, then gone.
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    Region::create_for_self({tpcs(1)}).release();
    ::_exit(0);
  }
  ::close(pipefd[1]);
  char c;
  ASSERT_EQ(::read(pipefd[0], &c, 1), 0);  // EOF: the child has exited
  ::close(pipefd[0]);
  // Still unreaped: a zombie is dead, whatever its region said.
  for (int i = 0; i < 200 && attach_error(child).find("no such process") == std::string::npos; ++i) ::usleep(5000);
  EXPECT_EQ(attach_error(child), "pid " + std::to_string(child) + ": no such process");
  EXPECT_EQ(::kill(child, 0), 0) << "not reaped yet: still a zombie";
  ASSERT_EQ(exit_code(child), 0);
  EXPECT_EQ(attach_error(child), "pid " + std::to_string(child) + ": no such process");
}

// A process that holds a memory file named like a region which its shim did
// not make (wrong mode, unsealed, wrong size, a header for another pid) is
// refused with the reason, never used.
TEST(ControlRegion, RegionNotMadeByTheShimIsRefused) {
  struct Case {
    const char* what;
    std::function<void(int fd)> spoil;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"mode", [](int fd) { ::fchmod(fd, 0666); }, "its mode is 0666, not 0600"},
      {"unsealed", [](int) {}, "its size is not sealed"},
      {"size", [](int fd) { ::ftruncate(fd, 100); }, "its size is 100 bytes, not"},
      {"pid", [](int fd) {
         auto* h = static_cast<Header*>(::mmap(nullptr, sizeof(Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
         h->pid = 1;
       }, "its header names pid 1"},
  };
  for (const Case& c : cases) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    if (child == 0) {
      // A well-formed region for this child, then spoiled one way.
      const int fd = ::memfd_create(region_name(::getpid()).c_str(), MFD_ALLOW_SEALING);
      ::fchmod(fd, 0600);
      ::ftruncate(fd, sizeof(Header));
      auto* h = static_cast<Header*>(::mmap(nullptr, sizeof(Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
      init_header(*h, {tpcs(1)});
      c.spoil(fd);
      if (std::string(c.what) != "unsealed" && std::string(c.what) != "size")
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
      ::write(ready[1], "x", 1);
      ::pause();
      ::_exit(0);
    }
    struct Reaper {
      pid_t pid;
      ~Reaper() {
        int st = 0;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
      }
    } reaper{child};
    char x;
    ASSERT_EQ(::read(ready[0], &x, 1), 1);
    ::close(ready[0]);
    ::close(ready[1]);
    const std::string err = attach_error(child);
    EXPECT_TRUE(err.starts_with("control region of pid " + std::to_string(child) + " is corrupt: ")) << c.what << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": " << err;
  }
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

// A writer killed at any point of a write (SIGKILL, the OOM killer) must
// never leave a reader spinning, nor a sequence that the next writer would
// publish odd. 1000 writers, each killed after a random delay while it
// rewrites this process's region in a loop.
TEST(ControlRegion, WritersKilledMidWriteNeverWedgeReadersOrWriters) {
  SelfRegion self({tpcs(0x1)});
  const pid_t me = ::getpid();
  std::uint32_t seed = 12345;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
  for (int i = 0; i < 1000; ++i) {
    const std::uint32_t delay_us = next() % 40;
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t writer = ::fork();
    if (writer == 0) {
      auto r = Region::attach(me);
      r->write(tpcs(3, ~std::uint64_t{3}));
      [[maybe_unused]] const auto n = ::write(ready[1], "x", 1);  // writing from now on
      for (std::uint64_t k = 2;; ++k) r->write(tpcs(k | 1, ~(k | 1)));
    }
    ::close(ready[1]);
    char x;
    ASSERT_EQ(::read(ready[0], &x, 1), 1);
    ::close(ready[0]);
    ::usleep(delay_us);
    ::kill(writer, SIGKILL);
    ASSERT_EQ(exit_code(writer), -1);
    // Readers: a consistent value at once: one the writer wrote (its halves
    // tied), or the value before it (it may have died before writing).
    LaunchView v{};
    ASSERT_EQ(read_launch_view(self.r->header().devices[0], v), ReadResult::kOk) << "after kill " << i;
    const bool before = (v.enabled_lo == 0x1 && v.enabled_hi == 0) || (v.enabled_lo == 0x5 && v.enabled_hi == 0x7);
    ASSERT_TRUE(before || v.enabled_hi == ~v.enabled_lo) << "torn value after kill " << i;
    // The next writer publishes an even sequence: its value is read back.
    self.r->write(tpcs(0x5, 0x7));
    ASSERT_EQ(read_launch_view(self.r->header().devices[0], v), ReadResult::kOk) << "after kill " << i;
    ASSERT_EQ(v.enabled_lo, 0x5u);
    const auto& pub = self.r->header().devices[0].buffer[self.r->header().devices[0].generation.load() & 1];
    ASSERT_EQ(pub.seq.load() & 1, 0u) << "published buffer left odd after kill " << i;
  }
}

// A corrupt sequence (odd for good) makes readers give up within a bounded
// number of tries instead of spinning; the CLI's read says "inconsistent".
TEST(ControlRegion, ReadersGiveUpOnASequenceThatStaysOdd) {
  SelfRegion self({tpcs(0x3)});
  DeviceEntry& e = self.r->header().devices[0];
  MaskBuffer& pub = e.buffer[e.generation.load() & 1];
  pub.seq.store(pub.seq.load() | 1);
  LaunchView v{};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_launch_view(e, v), ReadResult::kInconsistent);
  EXPECT_THROW(read_partition(e), Error);
  EXPECT_THROW(self.r->read_all(), Error);
  EXPECT_NE(validate(self.r->header()), "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
  // The next writer repairs it.
  self.r->write(tpcs(0x9));
  EXPECT_EQ(read_launch_view(e, v), ReadResult::kOk);
  EXPECT_EQ(v.enabled_lo, 0x9u);
  EXPECT_EQ(validate(self.r->header()), "");
}
