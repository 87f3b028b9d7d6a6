// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the ways a task could reach the GPU around the shim:
// programs the loader will not preload into, a wrapper that replaces the
// library path, the driver under another name, children started by paths
// that run no fork handler, and a user switch in between. Each one either
// runs partitioned, is refused before it starts, or is shown as
// UNPARTITIONED: never a partition reported that the launches do not get.
#include <linux/capability.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>

#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

constexpr auto npos = std::string::npos;

// Whether set-id bits and file capabilities take effect under `dir`.
bool suid_honoured(const std::string& dir) {
  struct statvfs v {};
  return ::statvfs(dir.c_str(), &v) == 0 && (v.f_flag & ST_NOSUID) == 0;
}

class Bypass : public E2E {
 protected:
  void SetUp() override {
    E2E::SetUp();
    // Another user must reach the programs and the status directory.
    ::chmod(dir_.c_str(), 0711);
  }
  // The launches of every process but `pid` (its children).
  std::vector<Record> records_of_others(long pid) const {
    std::vector<Record> out;
    for (const auto& rec : records())
      if (rec.pid != pid) out.push_back(rec);
    return out;
  }
  // A copy of the linked launcher, as a program of the user's own.
  std::string copy_of_launcher(const std::string& name) {
    const std::string prog = path(name);
    fs::copy_file(kLauncher, prog, fs::copy_options::overwrite_existing);
    ::chmod(prog.c_str(), 0755);
    return prog;
  }
};

// 1. A set-gid program runs in secure-execution mode: the loader ignores
// LD_LIBRARY_PATH and LD_PRELOAD, so it would reach the driver without the
// shim and launch on all TPCs. Refused before it starts, however it is named.
TEST_F(Bypass, SetGidProgramIsRefusedBeforeItStarts) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to give a program another group (CI runs as root)";
  if (!suid_honoured(dir_)) GTEST_SKIP() << dir_ << " is mounted nosuid: set-gid bits have no effect there";
  const std::string prog = copy_of_launcher("rt_app");
  ASSERT_EQ(::chown(prog.c_str(), 0, other->second), 0) << std::strerror(errno);
  ASSERT_EQ(::chmod(prog.c_str(), 02755), 0) << std::strerror(errno);
  // The hole: started as nvtaskset would start it, it never loads the shim.
  Env direct = env_;
  direct["LD_LIBRARY_PATH"] = shim_dir();
  direct["LD_PRELOAD"] = preloadable(kShim);
  direct["NVTASKSET_PARTITION"] = "any,0x1,0x0,0x1,0x0";
  ASSERT_TRUE(ExitedWith(run({prog, "--kernels", "1"}, direct), 0));
  ASSERT_EQ(records().size(), 1u);
  EXPECT_EQ(records()[0].mask, "0x0") << "the stand-in's own mask: no shim touched it";
  ::unlink(record_.c_str());

  Result r = run({kCli, "--no-mps", "-t", "0-3", prog, "--kernels", "1"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find(prog + " is set-gid (group "), npos) << r;
  EXPECT_NE(r.err.find("secure-execution mode"), npos) << r;
  EXPECT_NE(r.err.find("chmod g-s"), npos) << r;
  EXPECT_FALSE(exists(record_)) << read_file(record_);
  // Found on PATH, as execvp finds it.
  Env env = env_;
  env["PATH"] = dir_ + ":" + env["PATH"];
  r = run({kCli, "--no-mps", "-t", "0-3", "rt_app", "--kernels", "1"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("is set-gid"), npos) << r;
  // A script runs its interpreter: a set-gid interpreter is refused too.
  const std::string script = path("wrapper");
  std::ofstream(script) << "#!" << prog << " --kernels\n";
  ::chmod(script.c_str(), 0755);
  r = run({kCli, "--no-mps", "-t", "0-3", script});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("(the interpreter of " + script + ")"), npos) << r;
  EXPECT_FALSE(exists(record_)) << read_file(record_);
  // Without the bit it runs, on its TPCs.
  ASSERT_EQ(::chmod(prog.c_str(), 0755), 0);
  r = run({kCli, "--no-mps", "-t", "0-3", prog, "--kernels", "2"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(records().size(), 2u);
  for (const auto& rec : records()) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
}

// A set-uid program of another user is refused; one of our own changes no
// ID, so the loader honours the environment and it runs partitioned.
TEST_F(Bypass, SetUidProgramOfAnotherUserIsRefused) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to give a program another owner (CI runs as root)";
  if (!suid_honoured(dir_)) GTEST_SKIP() << dir_ << " is mounted nosuid: set-uid bits have no effect there";
  const std::string prog = copy_of_launcher("suid_app");
  ASSERT_EQ(::chown(prog.c_str(), other->first, 0), 0);
  ASSERT_EQ(::chmod(prog.c_str(), 04755), 0);
  Result r = run({kCli, "--no-mps", "-t", "0-3", prog, "--kernels", "1"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find(prog + " is set-uid (owner nvtaskset-e2e)"), npos) << r;
  ASSERT_EQ(::chown(prog.c_str(), ::getuid(), 0), 0);
  ASSERT_EQ(::chmod(prog.c_str(), 04755), 0);  // chown clears the bit
  r = run({kCli, "--no-mps", "-t", "0-3", prog, "--kernels", "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(records().size(), 1u);
  EXPECT_EQ(records()[0].mask, disable64(0xf));
}

// File capabilities (`setcap cap_sys_nice+ep ./rt_app`, common for real-time
// programs) put an unprivileged user's exec in secure-execution mode too.
// Root's exec gains nothing it did not have, so root's runs partitioned.
TEST_F(Bypass, FileCapabilitiesAreRefusedForAnUnprivilegedUser) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to set file capabilities and a second user (CI runs as root)";
  if (!suid_honoured(dir_)) GTEST_SKIP() << dir_ << " is mounted nosuid: file capabilities have no effect there";
  const std::string prog = copy_of_launcher("rt_app");
  // What `setcap cap_sys_nice+ep` writes (capability.h, vfs_cap_data v2).
  std::uint32_t cap[5] = {VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, 1u << CAP_SYS_NICE, 0, 0, 0};
  if (::setxattr(prog.c_str(), "security.capability", cap, sizeof cap, 0) != 0)
    GTEST_SKIP() << "this file system keeps no file capabilities: " << std::strerror(errno);
  // (The hole itself, the loader ignoring the shim, is shown by the set-gid
  // test: run by another user, the program could not even open the stand-in
  // its RUNPATH names when the build tree is private.)
  const Copies pub = copies_for_other_users();
  Result r = run(as_user(*other, {pub.cli, "--no-mps", "-t", "0-3", prog, "--kernels", "1"}));
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find(prog + " carries file capabilities (cap_sys_nice+ep)"), npos) << r;
  EXPECT_NE(r.err.find("setcap -r"), npos) << r;
  EXPECT_TRUE(records().empty());
  r = run({kCli, "--no-mps", "-t", "0-3", prog, "--kernels", "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(records().size(), 1u);
  EXPECT_EQ(records()[0].mask, disable64(0xf));
}

// 2. A wrapper that replaces LD_LIBRARY_PATH (a conda activation, a
// container entry point) no longer drops the shim: it is preloaded too.
class ReplacedLibraryPath : public Bypass, public ::testing::WithParamInterface<std::string> {};

TEST_P(ReplacedLibraryPath, KeepsTheShim) {
  if (shim_dir().find(' ') != npos) {
    // LD_PRELOAD cannot name a shim under a path with a space, so nvtaskset
    // preloads it by name, which the replaced LD_LIBRARY_PATH no longer
    // finds: the task runs on all TPCs, and --status must say so.
    const std::string until = path("until"), ready = path("ready");
    Proc& p = start({kCli, "--no-mps", "-t", "0-3", "sh", "-c",
                     "export LD_LIBRARY_PATH=/usr/local/cuda/lib64; exec \"$0\" --until-file \"$1\" --interval-ms 5 "
                     "--ready-file \"$2\"",
                     GetParam(), until, ready});
    const long pid = wait_ready(ready, p);
    ASSERT_GT(pid, 0) << p.err();
    const auto recs = records_of(pid);
    ASSERT_FALSE(recs.empty());
    EXPECT_EQ(recs.back().mask, "0x0");
    const Result st = run({kCli, "--status", "--json"});
    ASSERT_TRUE(ExitedWith(st, 0)) << st;
    bool shown = false;
    const auto j = nlohmann::json::parse(st.out);
    for (const auto& t : j["tasks"])
      shown = shown || (t["pid"].get<long>() == pid && t["partitioned"] == false);
    EXPECT_TRUE(shown) << st.out;
    touch(until);
    EXPECT_TRUE(ExitedWith(p.wait(), 0));
    return;
  }
  // exec'd by the wrapper (same process), and started as its child.
  for (const std::string how : {"exec \"$0\" --kernels 2", "\"$0\" --kernels 2"}) {
    ::unlink(record_.c_str());
    const Result r = run({kCli, "--no-mps", "-t", "0-3", "sh", "-c",
                          "export LD_LIBRARY_PATH=/usr/local/cuda/lib64; " + how, GetParam()});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    const auto recs = records();
    ASSERT_EQ(recs.size(), 2u) << how;
    for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0xf)) << how << ": " << rec;
  }
}

INSTANTIATE_TEST_SUITE_P(E2E, ReplacedLibraryPath, ::testing::Values(kLauncher, kLauncherDlopen),
                         [](const auto& info) { return fs::path(info.param).filename().string(); });

// The task's own execve(): the new image holds no region (close-on-exec) and
// takes the partition nvtaskset last wrote for its PID, the live one.
TEST_F(Bypass, ExecKeepsTheCurrentPartition) {
  const std::string go = path("go");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", "sh", "-c",
                   "while [ ! -e '" + go + "' ]; do sleep 0.01; done; exec \"$0\" --kernels 2", kLauncher});
  // The shell nvtaskset exec'd sets its region up at load.
  ASSERT_TRUE(wait_until([&] { return !region_fd(p.pid).empty() || !p.running(); })) << p.err();
  const Result q = run({kCli, "-p", "-t", "4-5", std::to_string(p.pid)});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  touch(go);
  ASSERT_TRUE(ExitedWith(p.wait(), 0));
  const auto recs = records();
  ASSERT_EQ(recs.size(), 2u) << read_file(record_);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.pid, p.pid);
    EXPECT_EQ(rec.mask, disable64(0x30)) << rec;
  }
}

// 3. The real driver by another name in LD_PRELOAD: judged by its DT_SONAME.
TEST_F(Bypass, DriverPreloadedUnderAnotherNameIsRefused) {
  const std::string link = path("nvidia-helper.so");
  fs::create_symlink(kFake, link);
  const std::string copy = path("renamed-copy.so");
  fs::copy_file(kFake, copy);
  for (const std::string& lib : {link, copy}) {
    Env env = env_;
    env["LD_PRELOAD"] = lib;
    // The CLI itself is preloaded too here: in the sanitizer build its ASan
    // runtime must not insist on coming first.
    env["ASAN_OPTIONS"] = "verify_asan_link_order=0";
    const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "1"}, env);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find("LD_PRELOAD names the CUDA driver (" + lib + ")"), npos) << r;
    EXPECT_FALSE(exists(record_));
  }
  // The shim itself may be preloaded (it carries nvtaskset's note).
  Env env = env_;
  env["LD_PRELOAD"] = preloadable(kShim);
  env["ASAN_OPTIONS"] = "verify_asan_link_order=0";
  const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "1"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(records().at(0).mask, disable64(0xf));
}

// 5. A task that reaches the driver around the shim anyway is never shown
// as partitioned: found from its maps, not from anything it says.
TEST_F(Bypass, ATaskThatReachesTheDriverWithoutTheShimIsShownUnpartitioned) {
  const std::string until = path("until");
  // A wrapper that clears LD_PRELOAD and replaces LD_LIBRARY_PATH, and a
  // program that loads a renamed copy of the driver by its path.
  const std::string copy = path("private-driver.so");
  fs::copy_file(kFake, copy);
  Env env = env_;
  env["LAUNCHER_LIBCUDA"] = copy;
  Proc& a = start({kCli, "--no-mps", "-t", "0-1", "sh", "-c",
                   "exec env -u LD_PRELOAD LD_LIBRARY_PATH=/nonexistent \"$0\" --until-file \"$1\" --interval-ms 5 "
                   "--ready-file \"$1.a\"", kLauncher, until});
  Proc& b = start({kCli, "--no-mps", "-t", "2-3", kLauncherDlopen, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", until + ".b"}, env);
  Proc& c = start({kCli, "--no-mps", "-t", "4-5", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", until + ".c"});
  const long pa = wait_ready(until + ".a", a), pb = wait_ready(until + ".b", b), pc = wait_ready(until + ".c", c);
  ASSERT_GT(pa, 0) << a.err();
  ASSERT_GT(pb, 0) << b.err();
  ASSERT_GT(pc, 0) << c.err();
  // The bypass is real: a's and b's launches are unmasked.
  for (long pid : {pa, pb}) {
    const auto recs = records_of(pid);
    ASSERT_FALSE(recs.empty());
    EXPECT_EQ(recs.back().mask, "0x0") << pid;
  }
  Result st = run({kCli, "--status", "--json"});
  ASSERT_TRUE(ExitedWith(st, 0)) << st;
  std::map<long, nlohmann::json> by_pid;
  const auto j = nlohmann::json::parse(st.out);
  for (const auto& t : j["tasks"]) by_pid[t["pid"].get<long>()] = t;
  ASSERT_EQ(by_pid.size(), 3u) << st.out;
  EXPECT_EQ(by_pid[pa]["partitioned"], false) << st.out;
  EXPECT_NE(by_pid[pa]["unpartitioned_reason"].get<std::string>().find("is loaded without nvtaskset's shim"), npos);
  EXPECT_EQ(by_pid[pb]["partitioned"], false) << st.out;
  EXPECT_NE(by_pid[pb]["unpartitioned_reason"].get<std::string>().find("private-driver.so"), npos) << st.out;
  EXPECT_EQ(by_pid[pc]["partitioned"], true) << st.out;
  for (long pid : {pa, pb, pc}) EXPECT_EQ(by_pid[pid]["verified"], true) << pid;
  st = run({kCli, "--status"});
  for (long pid : {pa, pb}) {
    bool row = false;
    for (const auto& l : lines_of(st.out))
      row = row || (l.starts_with(std::to_string(pid) + " ") && l.find(" UNPARTITIONED ") != npos);
    EXPECT_TRUE(row) << pid << ":\n" << st.out;
    EXPECT_NE(st.out.find("note: pid " + std::to_string(pid) + " runs on all TPCs, not on "), npos) << st.out;
  }
  // -p neither reports nor changes a partition that does not hold.
  for (long pid : {pa, pb}) {
    for (const std::vector<std::string>& argv :
         {std::vector<std::string>{kCli, "-p", std::to_string(pid)},
          std::vector<std::string>{kCli, "-p", "-t", "6", std::to_string(pid)}}) {
      const Result q = run(argv);
      EXPECT_TRUE(FailedWithOneLine(q)) << q;
      EXPECT_NE(q.err.find("pid " + std::to_string(pid) + " runs on all TPCs: "), npos) << q;
    }
  }
  EXPECT_TRUE(ExitedWith(run({kCli, "-p", std::to_string(pc)}), 0));
  // --exclusive cannot keep TPCs to itself next to a task that runs on all
  // of them, whatever TPCs its entry names (6-7 are in no entry).
  const Result x = run({kCli, "--no-mps", "--exclusive", "-t", "6-7", "true"});
  EXPECT_TRUE(FailedWithOneLine(x)) << x;
  EXPECT_NE(x.err.find(" runs on all TPCs of device 0 ("), npos) << x;
  EXPECT_NE(x.err.find("--exclusive cannot keep any to itself"), npos) << x;
  EXPECT_TRUE(ExitedWith(run({kCli, "--no-mps", "-t", "6-7", "true"}), 0)) << "without --exclusive it runs";
  // Another user cannot read the tasks' maps: the entries are shown as
  // published, and said to be unverified.
  if (const auto other = second_user()) {
    const Result o = run(as_user(*other, {kCli, "--status", "--json"}));
    ASSERT_TRUE(ExitedWith(o, 0)) << o;
    const auto oj = nlohmann::json::parse(o.out);
    ASSERT_EQ(oj["tasks"].size(), 3u) << o.out;
    for (const auto& t : oj["tasks"]) EXPECT_EQ(t["verified"], false) << o.out;
  }
  touch(until);
  for (Proc* p : {&a, &b, &c}) EXPECT_TRUE(ExitedWith(p->wait(), 0));
}

// 4. Children started by paths that run no fork handler (system(), popen(),
// posix_spawn(), vfork()) hold no descriptor or mapping of the task's
// region, and get its CURRENT partition, not the launch-time list.
class SpawnPaths : public Bypass, public ::testing::WithParamInterface<std::string> {};

// The output of a task that ran `--print-regions` and then a child that did
// too: the parent's lines, and the child's (from its "pid" line on).
std::pair<std::vector<std::string>, std::vector<std::string>> split_at_child(const std::string& out) {
  std::vector<std::string> parent, child;
  int pids = 0;
  for (const auto& l : lines_of(out)) {
    if (l.starts_with("pid ")) ++pids;
    (pids >= 2 ? child : parent).push_back(l);
  }
  return {parent, child};
}

void expect_child_holds_no_region_of(long parent, const std::vector<std::string>& child_lines) {
  ASSERT_FALSE(child_lines.empty());
  const std::string child = child_lines[0].substr(4);
  std::size_t own = 0;
  for (const auto& l : child_lines) {
    if (!l.starts_with("region-")) continue;
    EXPECT_EQ(l.find("memfd:nvtaskset." + std::to_string(parent) + " "), npos)
        << "the child holds the parent's region: " << l;
    own += l.find("memfd:nvtaskset." + child + " ") != npos;
  }
  EXPECT_GE(own, 2u) << "the child shows no region of its own (a descriptor and a mapping)";
}

TEST_P(SpawnPaths, ChildGetsTheCurrentPartitionAndNoRegionOfTheParent) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready, "--spawn-via", GetParam(), "--spawn", kLauncher, "--kernels", "2",
                   "--print-regions"});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.err();
  const Result q = run({kCli, "-p", "-t", "4-5", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  touch(until);
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  const std::vector<Record> child = records_of_others(pid);
  ASSERT_EQ(child.size(), 2u) << read_file(record_);
  for (const auto& rec : child) EXPECT_EQ(rec.mask, disable64(0x30)) << "the launch-time list, not the current: " << rec;
  const auto [parent_lines, child_lines] = split_at_child(r.out);
  ASSERT_FALSE(child_lines.empty()) << r;
  EXPECT_EQ(child_lines[0], "pid " + std::to_string(child[0].pid));
  expect_child_holds_no_region_of(pid, child_lines);
}

// A child that switches user on its way (a privilege-dropping helper) holds
// nothing of root's task that it could steer it with, and still runs on the
// task's current TPCs (read from its public status entry).
TEST_F(Bypass, ChildThatSwitchesUserHoldsNothingOfTheTaskAndKeepsItsPartition) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  touch(record_);
  ::chmod(record_.c_str(), 0666);
  const Copies pub = copies_for_other_users();
  const std::string until = path("until"), ready = path("ready");
  std::vector<std::string> argv{pub.cli, "--no-mps", "-t", "0-3", pub.launcher, "--until-file", until, "--interval-ms",
                                "5", "--ready-file", ready, "--spawn-via", "system", "--spawn"};
  for (const auto& a : as_user(*other, {pub.launcher, "--kernels", "2", "--print-regions"})) argv.push_back(a);
  Proc& p = start(argv);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.err();
  ASSERT_TRUE(ExitedWith(run({kCli, "-p", "-t", "1,6", std::to_string(pid)}), 0));
  touch(until);
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  const std::vector<Record> child = records_of_others(pid);
  ASSERT_EQ(child.size(), 2u) << read_file(record_);
  for (const auto& rec : child) EXPECT_EQ(rec.mask, disable64(0x42)) << rec;
  expect_child_holds_no_region_of(pid, split_at_child(r.out).second);
}

// A child that never calls the driver (a privilege-dropping helper, a shell)
// runs no shim init that would close what it inherited: it must inherit no
// descriptor of the task's region to begin with.
TEST_P(SpawnPaths, ChildThatNeverCallsTheDriverInheritsNoRegion) {
  const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "1", "--spawn-via", GetParam(),
                        "--spawn", "sh", "-c", "ls -l /proc/$$/fd; cat /proc/$$/maps"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  const long pid = printed_pid(r.out);
  ASSERT_GT(pid, 0) << r;
  EXPECT_NE(r.out.find(" -> "), npos) << "the shell listed no descriptor: " << r.out;
  EXPECT_EQ(r.out.find("memfd:nvtaskset." + std::to_string(pid) + " "), npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(E2E, SpawnPaths, ::testing::Values("fork", "vfork", "posix_spawn", "system"));

}  // namespace
