// SPDX-License-Identifier: Apache-2.0
// Failing closed where isolation depends on shared state: a full
// status directory, a -p killed between its steps, a region lock another
// holds, control characters in arguments, a partition with no TPC of its
// GPU. Through the real CLI and shim on the stand-in driver.
#include <sched.h>
#include <sys/mount.h>

#include "e2e_fixture.hpp"
#include "nvtaskset/status.hpp"

using namespace e2e;

namespace {

class FailClosed : public Sharing {
 protected:
  void TearDown() override {
    Sharing::TearDown();
    if (mounted_) ::umount2(path("status").c_str(), MNT_DETACH);
    if (set_status_dir_) ::unsetenv("NVTASKSET_STATUS_DIR");
  }

  // Makes the status directory full for every process this test starts from
  // now on: as root (CI), a tiny tmpfs mounted over it in a mount namespace
  // of this test process, then filled, as any user can fill /dev/shm;
  // otherwise a directory no one may create files in, which fails the same
  // writes (root ignores the mode, so it needs the real thing). Returns why
  // not, or "".
  std::string make_status_dir_unwritable_first() {
    const std::string dir = path("status");
    if (::geteuid() != 0) {
      ::chmod(dir.c_str(), 0555);
      return "";
    }
    if (::unshare(CLONE_NEWNS) != 0) return std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      return std::string("mount --make-rprivate /: ") + std::strerror(errno);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=1777") != 0)
      return std::string("mount -t tmpfs: ") + std::strerror(errno);
    mounted_ = true;
    return "";
  }
  // Fills the tmpfs (no-op for the read-only directory).
  void fill_status_dir() {
    if (!mounted_) return;
    const int fd = ::open(path("status/filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const std::string block(4096, 'x');
    while (::write(fd, block.data(), block.size()) > 0) {
    }
    // Smaller pieces for the last partial page.
    while (::write(fd, "x", 1) > 0) {
    }
    ::close(fd);
  }
  // The task's partition as its region holds it (attached here: this reads
  // without repairing the status entry, unlike nvtaskset -p or --status).
  std::string region_tpcs(long pid) {
    const auto r = nvtaskset::ctl::Region::attach(static_cast<pid_t>(pid));
    const auto parts = r->read_all();
    return parts.empty() ? std::string("none") : nvtaskset::format_ranges(parts[0].partition.tpcs.bits);
  }
  // What the task's status entry says, read in this process (no repair).
  std::string entry_tpcs(long pid) {
    if (!set_status_dir_) {
      ::setenv("NVTASKSET_STATUS_DIR", path("status").c_str(), 1);
      set_status_dir_ = true;
    }
    for (const auto& e : nvtaskset::ctl::read_status())
      if (e.pid == pid) return e.partitions.empty() ? std::string("none") : nvtaskset::format_ranges(e.partitions[0].partition.tpcs.bits);
    return "no entry";
  }
  // "0-3,6" as IDs.
  static std::vector<unsigned> ids(const std::string& list) {
    std::vector<unsigned> out;
    std::stringstream in(list);
    for (std::string x; std::getline(in, x, ',');) {
      const auto dash = x.find('-');
      const unsigned lo = static_cast<unsigned>(std::stoul(x.substr(0, dash)));
      const unsigned hi = dash == std::string::npos ? lo : static_cast<unsigned>(std::stoul(x.substr(dash + 1)));
      for (unsigned k = lo; k <= hi; ++k) out.push_back(k);
    }
    return out;
  }
  bool mounted_ = false;
  bool set_status_dir_ = false;
};

std::size_t lines_containing(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (const auto& l : lines_of(text)) n += l.find(what) != std::string::npos;
  return n;
}

}  // namespace

TEST_F(FailClosed, AFullStatusDirectoryStopsExclusiveAndLiveChangesAndIsSaidOtherwise) {
  if (const std::string why = make_status_dir_unwritable_first(); !why.empty())
    GTEST_SKIP() << "cannot mount a small tmpfs as the status directory: " << why;
  // For the read-only directory the task cannot publish either; it is
  // started before the directory fills in the tmpfs case only.
  const long a = start_task({"-t", "0,2"}, "a");
  ASSERT_GT(a, 0);
  fill_status_dir();

  // --exclusive: its TPCs would be invisible to other choosers. Refused,
  // one line, nothing started.
  const std::string marker = path("marker");
  Result r = run({kCli, "--no-mps", "--exclusive", "-n", "2", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("cannot publish the status entry"), std::string::npos) << r;
  EXPECT_FALSE(exists(marker));

  // -p: a change other choosers cannot see is not made.
  r = run({kCli, "-p", "-t", "1,3", std::to_string(a)});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("not changed"), std::string::npos) << r;
  EXPECT_EQ(run({kCli, "-p", std::to_string(a)}).out, pid_line(a, "current TPC list", "0,2"));
  EXPECT_EQ(mask_of(a), hopper_disable({0, 2}));

  // Other launches run, and say once that --status does not list them.
  for (const std::vector<std::string>& options : {std::vector<std::string>{"-n", "2"}, {"-t", "5"}}) {
    std::vector<std::string> argv{kCli, "--no-mps"};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.insert(argv.end(), {kLauncher, "--kernels", "1"});
    r = run(argv);
    EXPECT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_EQ(lines_containing(r.err, "nvtaskset: warning: this task has no status entry"), 1u) << r;
    EXPECT_EQ(lines_containing(r.err, "--status does not list it"), 1u) << r;
  }
  stop_all();
}

TEST_F(FailClosed, ALiveChangeKilledAtAnyStepNeverLeavesTheEntryWrong) {
  const long a = start_task({"-t", "0,2"}, "a");
  ASSERT_GT(a, 0);
  struct Step {
    const char* at;
    bool region_written;
  };
  std::string now = "0,2";
  for (const Step st : {Step{"locked", false}, Step{"claimed", false}, Step{"written", true},
                        Step{"published", true}}) {
    SCOPED_TRACE(st.at);
    const std::string next = now == "0,2" ? "1,3" : "0,2";
    Env env = env_;
    env["NVTASKSET_TEST_DIE_AT"] = st.at;
    const Result r = run({kCli, "-p", "-t", next, std::to_string(a)}, env);
    ASSERT_TRUE(!r.timed_out && !r.exited && r.signal == SIGKILL) << r;
    const std::string truth = st.region_written ? next : now;
    ASSERT_EQ(region_tpcs(a), truth);
    // Whatever the entry says now, it covers every TPC the task runs on: a
    // chooser that cannot repair it (a launch; another user) never takes them.
    std::set<unsigned> listed;
    for (unsigned k : ids(entry_tpcs(a) == "no entry" ? "99" : entry_tpcs(a))) listed.insert(k);
    for (unsigned k : ids(truth)) EXPECT_TRUE(listed.count(k)) << "entry " << entry_tpcs(a) << ", region " << truth;
    const Result x = run({kCli, "--no-mps", "--exclusive", "-t", truth, "true"});
    EXPECT_TRUE(FailedWithOneLine(x)) << x;
    // A reader that can attach the region (the owner, root) repairs it: from
    // then on the entry says exactly what the region holds, for everyone.
    const Result s = run({kCli, "--status", "--json"});
    ASSERT_TRUE(ExitedWith(s, 0)) << s;
    const auto j = nlohmann::json::parse(s.out);
    ASSERT_EQ(j["tasks"].size(), 1u) << s.out;
    EXPECT_EQ(j["tasks"][0]["tpcs"], truth) << s.out;
    EXPECT_EQ(entry_tpcs(a), truth);
    EXPECT_EQ(mask_of(a), hopper_disable(ids(truth)));
    now = truth;
  }
  stop_all();
}

TEST_F(FailClosed, AUserHoldingTheRegionLockCannotStallRootsChange) {
  // The task and the lock holder are another user's when CI can make one
  // (the case from the review); otherwise this user's own, which is the
  // same to the lock.
  const auto other = second_user();
  auto as = [&](std::vector<std::string> argv) { return other ? as_user(*other, std::move(argv)) : argv; };
  Env env = env_;
  const std::string u = path("u");
  fs::create_directories(u);
  ::chmod(u.c_str(), 0777);
  env["FAKECUDA_RECORD"] = u + "/record";
  env["TMPDIR"] = u;
  env["XDG_CACHE_HOME"] = u + "/cache";
  env["XDG_CONFIG_HOME"] = u + "/config";
  env["XDG_RUNTIME_DIR"] = u + "/runtime";
  ::chmod(path("topology.json").c_str(), 0644);
  const Copies pub = copies_for_other_users();
  env["NVTASKSET_REAL_LIBCUDA"] = env_["NVTASKSET_REAL_LIBCUDA"];
  Proc& task = start(as({pub.cli, "--no-mps", "-t", "0,2", pub.launcher, "--until-file", u + "/until", "--interval-ms",
                         "5", "--ready-file", u + "/ready"}),
                     env);
  const long a = wait_ready(u + "/ready", task);
  ASSERT_GT(a, 0) << task.err();
  const std::string fd = region_fd(a);
  ASSERT_FALSE(fd.empty());
  Proc& holder = start(as({"flock", fd, "sleep", "60"}), env);
  // Held once /proc/locks lists a lock by the holder.
  ASSERT_TRUE(wait_until([&] {
    return read_file("/proc/locks").find(" " + std::to_string(holder.pid) + " ") != std::string::npos;
  })) << holder.err();

  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run({kCli, "-p", "-t", "1,3", std::to_string(a)});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("locked by pid " + std::to_string(holder.pid)), std::string::npos) << r;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
  // Nothing changed: neither the region nor the entry.
  EXPECT_EQ(run({kCli, "-p", std::to_string(a)}).out, pid_line(a, "current TPC list", "0,2"));
  EXPECT_EQ(entry_tpcs(a), "0,2");
  holder.kill_group();
  // Once the holder is gone, the change goes through.
  const Result ok = run({kCli, "-p", "-t", "1,3", std::to_string(a)});
  EXPECT_TRUE(ExitedWith(ok, 0)) << ok;
  EXPECT_EQ(entry_tpcs(a), "1,3");
  touch(u + "/until");
  EXPECT_TRUE(ExitedWith(task.wait(), 0)) << task.err();
}

TEST_F(FailClosed, ControlCharactersInArgumentsNeverReachTheTerminal) {
  const std::string marker = path("marker");
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{kCli, "--no-mps", "-d", "0\n1", "-t", "0", "touch", marker},
        {kCli, "--no-mps", "-d", "\x1b[31mGPU-evil", "-t", "0", "touch", marker},
        {kCli, "--no-mps", "-d", "GPU-\x07zz", "-t", "0", "touch", marker},
        {kCli, "-p", "--show", "list\nmore", "1"},
        {kCli, "--no-mps", "-\x1b[2J", "touch", marker},
        {kCli, "-p", "-t", "0", "12\n34"}}) {
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    for (const char c : r.err) EXPECT_TRUE(c == '\n' || (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f)) << r;
    EXPECT_FALSE(exists(marker));
  }
  // A selector that is printable but names no device: the message quotes it.
  const Result r = run({kCli, "--no-mps", "-d", "GPU-nonesuch", "-t", "0", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("GPU-nonesuch"), std::string::npos) << r;
}

TEST_F(E2E, AnEnvironmentPartitionWithNoTpcOfTheGpuIsRefused) {
  // The stand-in's default GPU: 16 SMs (8 TPCs), compute capability 8.6, so
  // mask bit k is TPC k and bit 8 controls nothing: a real GPU would accept
  // the kernel and never run it.
  for (const std::string partition : {"*,4,0x100,0x0,0x0,16,8,6,13000,0,0x0,0",
                                      "*,1,0x100,0x100,0x0,16,8,6,13000,0,0x0,0"}) {
    Env env = env_;
    env["LD_LIBRARY_PATH"] = shim_dir();
    env["NVTASKSET_PARTITION"] = partition;
    const Result r = run({kLauncher, "--kernels", "1"}, env);
    EXPECT_TRUE(ExitedWith(r, 1)) << r;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r;
    EXPECT_TRUE(r.err.find("enables no TPC") != std::string::npos || r.err.find("does not have") != std::string::npos)
        << r;
    EXPECT_TRUE(records().empty());
  }
  // The CLI refuses it up front.
  const Result r = run({kCli, "--no-mps", "--physical", "0x100", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
}
