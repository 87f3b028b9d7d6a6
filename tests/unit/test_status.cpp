// SPDX-License-Identifier: Apache-2.0
// The public status entries (control/status.hpp) as files: a reader never
// misses a live task's entry while the task replaces it, which is what a
// lock-free `-n`/`--exclusive` choice relies on (nvtaskset/src/cli.cpp,
// settle), and a writer's leftovers go with it.
#include "nvtaskset/status.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace nvtaskset::ctl {
namespace {

TEST(SharedName, ThePidOfAnEntryABeaconOrATemporaryFile) {
  bool temp = true;
  EXPECT_EQ(pid_of_shared_name("nvtaskset-status.4242.0123456789abcdef", "nvtaskset-status.", ".new", &temp), 4242);
  EXPECT_FALSE(temp);
  EXPECT_EQ(pid_of_shared_name("nvtaskset-status.77.0123456789abcdef.new", "nvtaskset-status.", ".new", &temp), 77);
  EXPECT_TRUE(temp);
  EXPECT_EQ(pid_of_shared_name("nvtaskset-beacon.9.fedcba9876543210", "nvtaskset-beacon."), 9);
  // Without a temp suffix to strip, a temporary name is no name at all.
  EXPECT_FALSE(pid_of_shared_name("nvtaskset-beacon.9.fedcba9876543210.new", "nvtaskset-beacon."));
}

TEST(SharedName, AnythingElseIsNoName) {
  for (const char* n : {"nvtaskset-status.", "nvtaskset-status.12", "nvtaskset-status.12.abc",
                        "nvtaskset-status.12.0123456789abcdef0", "nvtaskset-statusX12.0123456789abcdef",
                        "nvtaskset-status.-5.0123456789abcdef", "nvtaskset-status.9999999999.0123456789abcdef",
                        "nvtaskset-status.0x10.0123456789abcdef", "nvtaskset-beacon.12.0123456789abcdef", "."})
    EXPECT_FALSE(pid_of_shared_name(n, "nvtaskset-status.", ".new")) << n;
}

class StatusDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvtaskset-status-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const char* old = std::getenv("NVTASKSET_STATUS_DIR");
    if (old != nullptr) old_ = old;
    ::setenv("NVTASKSET_STATUS_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (old_.empty()) ::unsetenv("NVTASKSET_STATUS_DIR");
    else ::setenv("NVTASKSET_STATUS_DIR", old_.c_str(), 1);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }
  std::string dir_, old_;
};

DevicePartition tpcs(std::initializer_list<unsigned> ids) {
  DevicePartition dp;
  dp.device = kAnyDevice;
  dp.partition.kind = SpecKind::kTpcList;
  for (unsigned k : ids) {
    dp.partition.tpcs.insert(LogicalTpcId{k});
    dp.partition.enabled.bits.set(k);
  }
  return dp;
}

const StatusEntry* find(const std::vector<StatusEntry>& v, pid_t pid) {
  for (const auto& e : v)
    if (e.pid == pid) return &e;
  return nullptr;
}

// A task's shim republishes the entry its CLI wrote, and `-p` replaces it,
// while other CLIs read the directory to see which TPCs are taken. A reader
// that saw neither the old nor the new entry took the task's TPCs for free:
// two `--exclusive` launches then got the same TPCs (Racing e2e test, 1 run
// in 60 on a loaded 2-core machine, before entries were renamed into place).
TEST_F(StatusDir, AReplacedEntryIsSeenByEveryReader) {
  const std::vector<DevicePartition> a{tpcs({1, 3})}, b{tpcs({0, 2})};
  ASSERT_EQ(publish_status(::getpid(), a), "");
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 3000; ++i) EXPECT_EQ(publish_status(::getpid(), i % 2 ? a : b), "");
    done = true;
  });
  int reads = 0, missed = 0;
  while (!done) {
    const auto st = read_status();
    ++reads;
    const StatusEntry* e = find(st, ::getpid());
    if (e == nullptr) ++missed;
    else EXPECT_TRUE(e->partitions == a || e->partitions == b);
  }
  writer.join();
  EXPECT_GT(reads, 100);
  EXPECT_EQ(missed, 0) << "of " << reads << " reads";
  // One entry, and nothing else, once the writer is done.
  EXPECT_EQ(names().size(), 1u);
}

// An entry being written is never shown, though it says what an entry says;
// one whose writer died is removed by the next reader; a republished entry
// keeps its name.
TEST_F(StatusDir, AnEntryBeingWrittenIsNotShownAndAWriterLeftoverGoes) {
  ASSERT_EQ(publish_status(::getpid(), {tpcs({4})}), "");
  ASSERT_EQ(names().size(), 1u);
  const std::string name = names()[0];
  ASSERT_EQ(publish_status(::getpid(), {tpcs({5})}), "");
  EXPECT_EQ(names(), std::vector<std::string>{name});
  ASSERT_EQ(read_status().size(), 1u);
  EXPECT_TRUE(read_status()[0].partitions == std::vector<DevicePartition>{tpcs({5})});

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  const std::string text = [&] {
    std::ifstream in(dir_ + "/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  // A live writer's file (ours) and a dead one's, both with our entry's text.
  const std::string live = "nvtaskset-status." + std::to_string(::getpid()) + ".0123456789abcdef.new";
  const std::string dead = "nvtaskset-status." + std::to_string(child) + ".0123456789abcdef.new";
  for (const std::string& n : {live, dead}) {
    std::ofstream(dir_ + "/" + n) << text;
    fs::permissions(dir_ + "/" + n, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                                        fs::perms::others_read);
  }
  const auto st = read_status();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_TRUE(st[0].partitions == std::vector<DevicePartition>{tpcs({5})});
  EXPECT_TRUE(fs::exists(dir_ + "/" + live));
  EXPECT_FALSE(fs::exists(dir_ + "/" + dead));
  // Withdrawing removes the entry, not a writer's file in progress.
  withdraw_status(::getpid());
  EXPECT_EQ(names(), std::vector<std::string>{live});
}

// An entry is anyone's text: every count and size in it is capped as the
// control region caps its own (8 devices, 256 SMs), so no entry can size a
// reader's work. One claiming 999999998 SMs made every user's --status
// allocate 6.3 GB (the e2e test TrustFiles.HugeStatusEntry checks that).
TEST_F(StatusDir, AnEntryClaimingAnImpossibleGpuIsNotAnEntry) {
  ASSERT_EQ(publish_status(::getpid(), {tpcs({1})}), "");
  ASSERT_EQ(names().size(), 1u);
  const std::string path = dir_ + "/" + names()[0];
  const std::string text = [&] {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const auto at = text.find("partitions ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string head = text.substr(0, at + 11);
  const std::string good = "GPU-fa4ecda0-0000-4000-8000-000000000000,1,0x2,0x2,0x0,16,9,0,13000,0,0x0,0";
  auto entry = [&](const std::string& partitions) {
    std::ofstream(path) << head << partitions << "\n";
    return read_status();
  };
  ASSERT_EQ(entry(good).size(), 1u) << "a well-formed entry is read";
  for (const std::string& bad : {
           std::string("GPU-fa4ecda0-0000-4000-8000-000000000000,1,0x2,0x2,0x0,999999998,9,0,13000,0,0x0,0"),
           std::string("GPU-fa4ecda0-0000-4000-8000-000000000000,1,0x2,0x2,0x0,258,9,0,13000,0,0x0,0"),
           std::string("GPU-fa4ecda0-0000-4000-8000-000000000000,1,0x2,0x2,0x0,16,100,0,13000,0,0x0,0"),
           std::string("GPU-fa4ecda0-0000-4000-8000-000000000000,1,0x2,0x2,0x0,16,9,0,13000,999999,0x0,0"),
       }) {
    EXPECT_TRUE(entry(bad).empty()) << bad;
  }
  // More device partitions than a region holds.
  std::string many;
  for (int i = 0; i < 9; ++i) {
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-fa4ecda0-0000-4000-8000-%012d", i);
    many += std::string(many.empty() ? "" : ";") + uuid + ",1,0x2,0x2,0x0,16,9,0,13000,0,0x0,0";
  }
  EXPECT_TRUE(entry(many).empty());
  EXPECT_EQ(entry(many.substr(0, many.rfind(';'))).size(), 1u) << "8 devices are fine";
}

// A name's PID is checked as it is parsed: "9999999999" overflowed an int
// (UBSan) and the wrapped number named some other process. Such a name is no
// entry, so nothing acts on it, not even the cleanup of ended tasks' entries.
TEST_F(StatusDir, ANameWhosePidCannotExistIsNoEntry) {
  ASSERT_EQ(publish_status(::getpid(), {tpcs({1})}), "");
  ASSERT_EQ(names().size(), 1u);
  const std::string text = [&] {
    std::ifstream in(dir_ + "/" + names()[0]);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  for (const char* pid : {"9999999999", "4294967297", "04194305", "00001"}) {
    const std::string name = dir_ + "/nvtaskset-status." + std::string(pid) + ".0123456789abcdef";
    std::ofstream(name) << text;
    fs::permissions(name, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                              fs::perms::others_read);
  }
  const auto st = read_status();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].pid, ::getpid());
  EXPECT_EQ(names().size(), 5u) << "left alone: they name no task";
}

}  // namespace
}  // namespace nvtaskset::ctl
