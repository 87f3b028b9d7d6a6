// SPDX-License-Identifier: Apache-2.0
// process_is_zombie_or_dead (proc.hpp): what `nvtaskset -p` uses to refuse a
// task that was killed but not yet reaped.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

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

}  // namespace
}  // namespace nvtaskset::ctl
