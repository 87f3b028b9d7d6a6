// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of -p: querying and changing the partition of a running
// task (also with --physical, from many threads, of a process started
// without nvtaskset), and -p on PIDs that are not tasks.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- -p: query and live change in the middle of a run --------------------------------------------

TEST_F(E2E, LiveChangeReachesTheNextLaunch) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);

  Result q = run({kCli, "-p", spid});
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3")) << q;

  q = run({kCli, "-p", "-t", "4-5", spid});
  // Only records written after the command returned count.
  std::size_t before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3") + pid_line(pid, "new TPC list", "4-5")) << q;
  // The first record after the command may come from a launch whose callback
  // ran before the change; every launch after that has the new mask.
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x30)) << rec;

  q = run({kCli, "-p", spid});
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "4-5")) << q;

  q = run({kCli, "-p", "0x3", spid});
  before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC mask", "0x30") + pid_line(pid, "new TPC mask", "0x3")) << q;
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x3)) << rec;

  // The launches before the first change all had the original partition.
  const auto all = records_of(pid);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front().mask, disable64(0xf));

  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(E2E, QueryShowsTheFormTheUserAsksFor) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "0x30", kLauncher, "--until-file", until, "--interval-ms", "5", "--ready-file",
                   ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  // By default a query answers with a TPC list; --show picks the form.
  EXPECT_EQ(run({kCli, "-p", spid}).out, pid_line(pid, "current TPC list", "4-5"));
  EXPECT_EQ(run({kCli, "-p", "--show", "list", spid}).out, pid_line(pid, "current TPC list", "4-5"));
  EXPECT_EQ(run({kCli, "-p", "--show", "mask", spid}).out, pid_line(pid, "current TPC mask", "0x30"));
  EXPECT_EQ(run({kCli, "-p", "--show", "physical", spid}).out, pid_line(pid, "current physical mask", "0x30"));
  // Not a GPC partition: shown as TPCs.
  EXPECT_EQ(run({kCli, "-p", "--show", "gpcs", spid}).out, pid_line(pid, "current TPC list", "4-5"));
  Result q = run({kCli, "-p", "--show", "bogus", spid});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  q = run({kCli, "-p", "--show", "list", "-t", "1", spid});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  EXPECT_EQ(run({kCli, "-p", spid}).out, pid_line(pid, "current TPC list", "4-5")) << "a refused --show changed it";
  q = run({kCli, "--show", "list", "--topology"});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(E2E, LiveChangesWhileManyThreadsLaunch) {
  // Four threads launch back to back while the partition flips: every launch
  // sees one of the partitions, whole (never a mix of two), and once a change
  // has returned, each thread's next launch has it.
  constexpr int kThreads = 4;
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--threads", std::to_string(kThreads), "--interval-ms",
                   "1", "--until-file", until, "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  const std::vector<std::pair<std::string, std::uint64_t>> flips = {
      {"4-7", 0xf0}, {"0-3", 0x0f}, {"0,2,4,6", 0x55}, {"1,3,5,7", 0xaa}, {"0-7", 0xff}};
  for (const auto& [list, enabled] : flips) {
    const Result q = run({kCli, "-p", "-t", list, spid});
    const std::size_t before = records().size();
    ASSERT_TRUE(ExitedWith(q, 0));
    for (const auto& rec : records_after(pid, before, kThreads, 8)) EXPECT_EQ(rec.mask, disable64(enabled)) << rec;
  }
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
  std::set<std::string> allowed{disable64(0x0f)};
  for (const auto& f : flips) allowed.insert(disable64(f.second));
  std::size_t n = 0;
  for (const auto& rec : records_of(pid)) {
    ++n;
    EXPECT_TRUE(allowed.count(rec.mask)) << "torn or foreign mask: " << rec;
  }
  EXPECT_GT(n, 40u);
}

TEST_F(E2E, PhysicalQueryAndLiveChange) {
  env_["FAKECUDA_CC"] = "9.0";
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "--physical", "0xffff", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();

  Result q = run({kCli, "-p", std::to_string(pid)});
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current physical mask", "0xffff")) << q;

  q = run({kCli, "-p", "--physical", "0xff", std::to_string(pid)});
  const std::size_t before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current physical mask", "0xffff") + pid_line(pid, "new physical mask", "0xff"))
      << q;
  for (const auto& rec : records_after(pid, before, 1, 3)) {
    EXPECT_EQ(rec.valid, 1) << rec;
    EXPECT_EQ(rec.mask, disable128(0, 0xff)) << rec;
  }
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// What a task already read stays; a query after `-p` answers with the new
// partition. Only a launch takes the option.
TEST_F(E2E, PartitionSmCountFollowsLaterQueriesOnly) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "--partition-sm-count", "-t", "0-3", kLauncher, "--print-sms", "--until-file",
                   until, "--interval-ms", "5", "--ready-file", ready},
                  env_);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0);
  EXPECT_NE(p.out().find("sms 8\n"), std::string::npos) << p.out();
  const Result q = run({kCli, "-p", "-t", "0", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  const Result bad = run({kCli, "-p", "--partition-sm-count", "-t", "1", std::to_string(pid)});
  EXPECT_TRUE(FailedWithOneLine(bad)) << bad;
  EXPECT_NE(bad.err.find("goes with a launch"), std::string::npos) << bad;
  touch(until);
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 8\n"), std::string::npos) << r;
  EXPECT_NE(r.out.find("sms-end 2\n"), std::string::npos) << r;
}

// --- a process started without nvtaskset (system-wide mode) --------------------------------------

TEST_F(E2E, UnpartitionedProcessIsUntouchedThenMovable) {
  const std::string until = path("until"), ready = path("ready");
  Env env = env_;
  env["LD_LIBRARY_PATH"] = shim_dir();
  env["FAKECUDA_INITIAL_MASK"] = "0x5";  // CUDA's own mask must survive
  Proc& p = start({kLauncher, "--until-file", until, "--interval-ms", "5", "--ready-file", ready}, env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);

  Result q = run({kCli, "-p", spid});
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-7")) << q;
  const auto untouched = records_of(pid);
  ASSERT_FALSE(untouched.empty());
  for (const auto& rec : untouched) EXPECT_EQ(rec.mask, "0x5") << rec;

  q = run({kCli, "-p", "-t", "1", spid});
  const std::size_t before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-7") + pid_line(pid, "new TPC list", "1")) << q;
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x2)) << rec;

  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(E2E, ShimWorksFromLdPreload) {
  // The partition as nvtaskset hands it over...
  Result r = run({kCli, "--no-mps", "-t", "2-3", kLauncher, "--print-env", "NVTASKSET_PARTITION"});
  ASSERT_TRUE(ExitedWith(r, 0));
  const auto partition = printed_env(r.out, "NVTASKSET_PARTITION");
  ASSERT_TRUE(partition.has_value()) << r;
  ::unlink(record_.c_str());
  // ...given to a program that gets the shim through LD_PRELOAD, and also
  // finds it first on LD_LIBRARY_PATH (loaded twice: harmless).
  for (const bool also_path : {false, true}) {
    SCOPED_TRACE(also_path ? "LD_PRELOAD and LD_LIBRARY_PATH" : "LD_PRELOAD");
    Env env = env_;
    env["LD_PRELOAD"] = preloadable(kShim);
    if (also_path) env["LD_LIBRARY_PATH"] = shim_dir();
    env["NVTASKSET_PARTITION"] = *partition;
    r = run({kLauncher, "--kernels", "3"}, env);
    ASSERT_TRUE(ExitedWith(r, 0));
    const auto recs = records_of(printed_pid(r.out));
    ASSERT_EQ(recs.size(), 3u);
    for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0xc)) << rec;
  }
}

// --- -p on PIDs that are not tasks: gone, not ours, malformed, zombies ---------------------------

TEST_F(E2E, BadPids) {
  Proc& gone = start({"true"});
  ASSERT_TRUE(ExitedWith(gone.wait(), 0));
  const std::string dead = std::to_string(gone.pid);
  Result r = run({kCli, "-p", dead});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_NE(r.err.find("pid " + dead), std::string::npos) << r;

  Proc& sleeper = start({"sleep", "30"});
  ASSERT_TRUE(wait_until([&] { return read_file("/proc/" + std::to_string(sleeper.pid) + "/comm") == "sleep\n"; }));
  for (const std::string& pid : {std::string("1"), std::to_string(sleeper.pid)}) {
    SCOPED_TRACE("pid " + pid);
    const std::string expected = "nvtaskset: pid " + pid + " is not running under nvtaskset\n";
    r = run({kCli, "-p", pid});
    EXPECT_TRUE(FailedWithOneLine(r));
    EXPECT_EQ(r.err, expected) << r;
    r = run({kCli, "-p", "-t", "0", pid});
    EXPECT_TRUE(FailedWithOneLine(r));
    EXPECT_EQ(r.err, expected) << r;
    EXPECT_EQ(r.out, "") << r;
  }
  EXPECT_TRUE(sleeper.running());

  for (const std::string bad : {"abc", "-5", "0", "12abc", "99999999999999999999"}) {
    SCOPED_TRACE("pid \"" + bad + "\"");
    r = run({kCli, "-p", bad});
    EXPECT_TRUE(FailedWithOneLine(r));
    r = run({kCli, "-p", "-t", "0", bad});
    EXPECT_TRUE(FailedWithOneLine(r));
  }
  r = run({kCli, "-p"});
  EXPECT_TRUE(FailedWithOneLine(r));
}

// The state letter of /proc/<pid>/stat (after the last ')'), or '?'.
char proc_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

TEST_F(E2E, ZombieTaskIsRefused) {
  const std::string until = path("until"), ready = path("ready");
  Proc& task = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                      "--ready-file", ready},
                     env_);
  ASSERT_TRUE(wait_until([&] { return exists(ready); })) << task.wait();
  const pid_t pid = task.pid;  // nvtaskset execs the launcher: same process
  ASSERT_EQ(std::stol(read_file(ready)), pid);
  const std::string spid = std::to_string(pid);

  // Control: while it runs, -p answers.
  Result q = run({kCli, "-p", spid});
  ASSERT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, "pid " + spid + "'s current TPC list: 0-3\n") << q;

  // Killed; we are its parent and do not reap it, so it stays a zombie whose
  // control region the shim never got to remove.
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(wait_until([&] { return proc_state(pid) == 'Z'; })) << "state " << proc_state(pid);

  q = run({kCli, "-p", spid});
  EXPECT_TRUE(FailedWithOneLine(q));
  EXPECT_EQ(q.err, "nvtaskset: pid " + spid + ": no such process\n") << q;
  EXPECT_EQ(q.out, "") << q;
  q = run({kCli, "-p", "-t", "5", spid});
  EXPECT_TRUE(FailedWithOneLine(q));
  EXPECT_EQ(q.out, "") << "reported a change to a dead task" << q;
  EXPECT_EQ(proc_state(pid), 'Z');

  const Result r = task.wait();
  EXPECT_FALSE(r.exited);
  EXPECT_EQ(r.signal, SIGKILL);
}

}  // namespace
