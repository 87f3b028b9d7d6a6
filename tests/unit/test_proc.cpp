// SPDX-License-Identifier: Apache-2.0
// proc.hpp: the one /proc/<pid>/stat reader (stat_field, process_stat_field,
// process_stat_number) and what is built on it: process_is_zombie_or_dead
// (what `nvtaskset -p` uses to refuse a task that was killed but not yet
// reaped), parent_pid, ancestors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "nvtaskset/control_region.hpp"

#include "nvtaskset/proc.hpp"

namespace nvtaskset::ctl {
namespace {

using namespace std::chrono_literals;

// Polls until `pred` holds (at most 10 s).
template <class Pred>
bool eventually(Pred pred) {
  for (auto end = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < end;) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

TEST(ProcStat, FieldsCountAfterTheLastParen) {
  const std::string line = "4242 (a) b (c) S 17 4242 4242 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 987654 10 11\n";
  EXPECT_EQ(stat_field(line, 1), "4242");
  EXPECT_EQ(stat_field(line, 2), "a) b (c");
  EXPECT_EQ(stat_field(line, 3), "S");
  EXPECT_EQ(stat_field(line, 4), "17");
  EXPECT_EQ(stat_field(line, 7), "0");
  EXPECT_EQ(stat_field(line, 8), "-1");
  EXPECT_EQ(stat_field(line, 22), "987654");
  EXPECT_EQ(stat_field(line, 24), "11") << "the last field, without the newline";
  EXPECT_EQ(stat_field(line, 25), std::nullopt);
  EXPECT_EQ(stat_field(line, 0), std::nullopt);
}

TEST(ProcStat, CommThatLooksLikeFields) {
  // A name ending in ") Z 1": only the last ')' ends it.
  const std::string line = "7 (x) Z 1) R 3 4";
  EXPECT_EQ(stat_field(line, 2), "x) Z 1");
  EXPECT_EQ(stat_field(line, 3), "R");
  EXPECT_EQ(stat_field(line, 4), "3");
  // Empty comm, and comm of only parentheses.
  EXPECT_EQ(stat_field("8 () S 1", 2), "");
  EXPECT_EQ(stat_field("8 () S 1", 4), "1");
  EXPECT_EQ(stat_field("9 ()()) S 2", 2), ")()");
  EXPECT_EQ(stat_field("9 ()()) S 2", 4), "2");
}

TEST(ProcStat, MalformedLinesHaveNoFields) {
  for (const char* bad : {"", "42", "42 (x", "42 x) S 1", "42 (x)S 1", "42 (x)"}) {
    EXPECT_EQ(stat_field(bad, 3), std::nullopt) << bad;
    EXPECT_EQ(stat_field(bad, 4), std::nullopt) << bad;
  }
  EXPECT_EQ(stat_field("42 (x) S  1", 4), std::nullopt) << "an empty field is no field";
}

TEST(ProcStat, ReadsThisProcess) {
  const pid_t self = ::getpid();
  EXPECT_EQ(process_stat_field(self, 1), std::to_string(self));
  EXPECT_EQ(process_stat_field(self, 2), read_file("/proc/self/comm"));
  EXPECT_EQ(process_stat_field(self, 3), "R") << "a process reading its own stat runs";
  EXPECT_EQ(process_stat_number(self, 4), static_cast<std::uint64_t>(::getppid()));
  const auto start = process_stat_number(self, 22);
  ASSERT_TRUE(start.has_value());
  EXPECT_GT(*start, 0u);
  EXPECT_EQ(process_start_time(self), *start);
  EXPECT_EQ(process_stat_number(self, 2), std::nullopt) << "comm is no number";
  EXPECT_EQ(process_stat_field(self, 1000), std::nullopt);
}

TEST(ProcStat, ReadsThroughANameWithParenthesesAndSpaces) {
  char old[17] = {};
  ASSERT_EQ(::prctl(PR_GET_NAME, old, 0, 0, 0), 0);
  ASSERT_EQ(::prctl(PR_SET_NAME, "x) Z 1 (y", 0, 0, 0), 0);
  const auto comm = process_stat_field(::getpid(), 2);
  const auto state = process_stat_field(::getpid(), 3);
  const auto ppid = process_stat_number(::getpid(), 4);
  ::prctl(PR_SET_NAME, old, 0, 0, 0);
  EXPECT_EQ(comm, "x) Z 1 (y");
  EXPECT_EQ(state, "R");
  EXPECT_EQ(ppid, static_cast<std::uint64_t>(::getppid()));
}

TEST(ProcStat, AnImpossiblePidIsGone) {
  bool gone = false;
  EXPECT_EQ(process_stat_field(4194305, 3, &gone), std::nullopt);  // above PID_MAX_LIMIT
  EXPECT_TRUE(gone);
  gone = false;
  EXPECT_EQ(process_stat_number(0, 22, &gone), std::nullopt);
  EXPECT_TRUE(gone);
  EXPECT_EQ(process_start_time(4194305), 0u);
  gone = true;
  EXPECT_TRUE(process_stat_field(::getpid(), 3, &gone).has_value());
  EXPECT_FALSE(gone);
}

TEST(Proc, RunningProcessesAreAlive) {
  EXPECT_FALSE(process_is_zombie_or_dead(::getpid()));
  EXPECT_FALSE(process_is_zombie_or_dead(::getppid()));
}

TEST(Proc, ZombieUntilReapedThenGone) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A name that puts ") Z" where a naive parse of /proc/<pid>/stat would
    // read the state: the state follows the last ')'.
    ::prctl(PR_SET_NAME, "x) Z (y", 0, 0, 0);
    ::pause();
    ::_exit(0);
  }
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(process_is_zombie_or_dead(child)) << "a sleeping child, whatever its name";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // Killed, not reaped: kill(pid, 0) still succeeds, the task is dead.
  EXPECT_TRUE(eventually([&] { return process_is_zombie_or_dead(child); }));
  EXPECT_EQ(::kill(child, 0), 0) << "the zombie still answers kill(0): why the helper exists";
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  EXPECT_TRUE(process_is_zombie_or_dead(child)) << "reaped: gone";
}

TEST(Proc, ImpossiblePidsAreDead) {
  EXPECT_TRUE(process_is_zombie_or_dead(0));
  EXPECT_TRUE(process_is_zombie_or_dead(-1));
  EXPECT_TRUE(process_is_zombie_or_dead(4194305));  // above PID_MAX_LIMIT
}

TEST(Proc, ParentPidIsTheParent) {
  EXPECT_EQ(parent_pid(::getpid()), ::getppid());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A comm with a space and ')' in it, as any program may set.
    ::prctl(PR_SET_NAME, "a) b (c", 0, 0, 0);
    ::pause();
    ::_exit(0);
  }
  EXPECT_TRUE(eventually([&] {
    std::ifstream f("/proc/" + std::to_string(child) + "/comm");
    std::string comm;
    return std::getline(f, comm) && comm == "a) b (c";
  }));
  EXPECT_EQ(parent_pid(child), ::getpid());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(parent_pid(child), 0);
  EXPECT_EQ(parent_pid(0), 0);
  EXPECT_EQ(parent_pid(-1), 0);
}

TEST(Proc, AncestorsWalkUpToInit) {
  const std::vector<pid_t> up = ancestors(::getpid());
  ASSERT_FALSE(up.empty());
  EXPECT_EQ(up.front(), ::getppid());
  for (std::size_t i = 1; i < up.size(); ++i) EXPECT_EQ(up[i], parent_pid(up[i - 1])) << i;
  EXPECT_NE(up.back(), 1);  // init itself is left out
  EXPECT_TRUE(ancestors(0).empty());
  EXPECT_TRUE(ancestors(-1).empty());
}

}  // namespace
}  // namespace nvtaskset::ctl
