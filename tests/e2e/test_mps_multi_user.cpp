// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of --mps-multi-user (mps.hpp, running_daemon): MPS's
// multi-user server mode (`nvidia-cuda-mps-control -d -M`), under which one
// root server serves every user's clients at once. Against the stand-in
// daemon (tests/fakemps), which keeps -M on its command line as the real one
// does; its clients never connect (the stand-in driver knows no MPS), so what
// is tested is what nvtaskset decides: which daemon it starts or refuses,
// that nobody is told to wait, and that each task stays steerable only by
// its own user.
#include "e2e_fixture.hpp"

namespace e2e {
namespace {

constexpr auto npos = std::string::npos;

class MpsMultiUser : public E2E {
 protected:
  void SetUp() override {
    E2E::SetUp();
    // Every user reaches the pipe directory (dir_ is 0711 once copies are made).
    env_["CUDA_MPS_PIPE_DIRECTORY"] = pipe_ = path("mps");
    env_["CUDA_MPS_LOG_DIRECTORY"] = path("mps-log");
    env_["NVTASKSET_MPS_CONTROL"] = kFakeMps;
    env_["FAKE_MPS_IDLE_MS"] = "20000";
  }
  void TearDown() override {
    quit_daemon();
    E2E::TearDown();
  }
  // The stand-in daemon's PID and command line, as /proc shows them.
  pid_t daemon_pid() const { return static_cast<pid_t>(std::atol(read_file(pipe_ + "/nvidia-cuda-mps-control.pid").c_str())); }
  std::string daemon_cmdline() const {
    std::string s = read_file("/proc/" + std::to_string(daemon_pid()) + "/cmdline");
    std::replace(s.begin(), s.end(), '\0', ' ');
    return s;
  }
  // The stand-in daemon's program where another user can run it too (next
  // to the copied CLI: the build tree may be private).
  std::string public_control(const Copies& pub) {
    const std::string control = fs::path(pub.cli).parent_path().string() + "/nvidia-cuda-mps-control";
    fs::copy_file(kFakeMps, control, fs::copy_options::overwrite_existing);
    ::chmod(control.c_str(), 0755);
    return control;
  }
  // env_ for `user`: the stand-in's record in a directory every user
  // writes (sticky), and a cache, runtime and temporary directory of its own
  // there, so that no warning about another user's files joins a line
  // checked here.
  Env env_of(std::pair<uid_t, gid_t> user, Env env) {
    const std::string u = path("u");
    fs::create_directories(u);
    ::chmod(u.c_str(), 01777);
    // Made here, root's and writable by all: every user's tasks append to it.
    if (!exists(u + "/record")) {
      touch(u + "/record");
      ::chmod((u + "/record").c_str(), 0666);
    }
    env["FAKECUDA_RECORD"] = u + "/record";
    for (const char* var : {"XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "TMPDIR"})
      env[var] = u + "/" + var + "-" + std::to_string(user.first);
    return env;
  }
  Result run_as(std::pair<uid_t, gid_t> user, const std::vector<std::string>& argv, const Env& env) {
    return run(as_user(user, argv), env_of(user, env));
  }
  void quit_daemon() {
    if (!exists(pipe_ + "/control")) return;
    const pid_t pid = daemon_pid();
    run({"sh", "-c", "echo quit | \"$0\"", kFakeMps});
    wait_until([&] { return pid <= 0 || !fs::exists("/proc/" + std::to_string(pid)); }, 5s);
  }
  std::string pipe_;
};

TEST_F(MpsMultiUser, GoesWithALaunchAndNeverWithNoMps) {
  const std::string marker = path("marker");
  Result r = run({kCli, "--no-mps", "--mps-multi-user", "-t", "0", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("--no-mps and --mps-multi-user exclude each other"), npos) << r;
  EXPECT_FALSE(exists(marker));
  for (const std::vector<std::string>& argv : {std::vector<std::string>{kCli, "--mps-multi-user", "--status"},
                                               {kCli, "--mps-multi-user", "-p", std::to_string(::getpid())},
                                               {kCli, "--mps-multi-user", "--topology"}}) {
    r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find("--mps-multi-user goes with a launch or --env-for"), npos) << r;
  }
  EXPECT_FALSE(exists(pipe_ + "/control")) << "a daemon was started";
}

// A single-user daemon (`-d`) is refused in one line, never shared; one that
// another user started (-M or not) cannot serve every user. A daemon root
// started with -d -M by hand is used as it is.
TEST_F(MpsMultiUser, OnlyADaemonRootStartedWithMServes) {
  const std::string marker = path("marker");
  ASSERT_TRUE(ExitedWith(run({kFakeMps, "-d"}), 0));
  const pid_t single = daemon_pid();
  Result r = run({kCli, "--mps-multi-user", "-t", "0-1", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("the MPS control daemon at " + pipe_ + " (pid " + std::to_string(single) +
                       ") serves one user at a time: it was started without -M"),
            npos)
      << r;
  EXPECT_FALSE(exists(marker));
  // The same with --env-for, which the Slurm plugin and the DRA plugin run.
  Proc& holder = start({"sleep", "30"});
  r = run({kCli, "--env-for", std::to_string(holder.pid), "--mps-multi-user", "-t", "0-1"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("serves one user at a time"), npos) << r;
  EXPECT_TRUE(r.out.empty()) << r;
  quit_daemon();

  ASSERT_TRUE(ExitedWith(run({kFakeMps, "-d", "-M"}), 0));
  r = run({kCli, "--mps-multi-user", "-t", "0-1", "touch", marker});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(exists(marker));
  EXPECT_EQ(r.err.find("started"), npos) << "it started another daemon: " << r;
  r = run({kCli, "--env-for", std::to_string(holder.pid), "--mps-multi-user", "-t", "0-1"});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("NVTASKSET_PARTITION="), npos) << r;
  quit_daemon();

  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  const Copies pub = copies_for_other_users();
  // Their own pipe directory with their own daemon, -M and all.
  const std::string theirs = path("their-mps");
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), other->first, other->second), 0);
  Env env = env_;
  env["CUDA_MPS_PIPE_DIRECTORY"] = theirs;
  env["CUDA_MPS_LOG_DIRECTORY"] = theirs;
  const std::string control = public_control(pub);
  ASSERT_TRUE(ExitedWith(run_as(*other, {control, "-d", "-M"}, env), 0));
  r = run_as(*other, {pub.cli, "--mps-multi-user", "-t", "0", "true"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("serves one user at a time: it runs as uid " + std::to_string(other->first) + ", not root"), npos)
      << r;
  run_as(*other, {"sh", "-c", "echo quit | \"$0\"", control}, env);
}

// With none running, only root starts one (-d -M); a user is told, in one
// line, that root must, and nothing is created.
TEST_F(MpsMultiUser, RootStartsItAUserIsToldRootMust) {
  const auto other = second_user();
  if (other) {
    const Copies pub = copies_for_other_users();
    const std::string marker = path("marker");
    const Result r = run_as(*other, {pub.cli, "--mps-multi-user", "-t", "0", "touch", marker}, env_);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find("no MPS control daemon runs at " + pipe_ +
                         ", and only root can start one that serves every user (nvidia-cuda-mps-control -d -M)"),
              npos)
        << r;
    EXPECT_FALSE(exists(marker));
    EXPECT_FALSE(exists(pipe_)) << "the pipe directory was created";
  }
  const Result r = run({kCli, "--mps-multi-user", "-t", "0", "true"});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("nvtaskset: started the MPS control daemon for every user (-M) (pipe directory " + pipe_ + ")"),
            npos)
      << r;
  EXPECT_NE(daemon_cmdline().find(" -d -M "), npos) << daemon_cmdline();
  EXPECT_NE(read_file(path("mps-log/control.log")).find("multi-user server mode"), npos);
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
}

// Two users' tasks at once under the multi-user daemon: neither is told to
// wait, even where the daemon's one (root's) server has clients and
// NVTASKSET_MPS_OTHER_USER=fail would refuse a wait; a launch without the
// option beside that daemon runs too, silently, while beside a single-user
// daemon with the same server it is refused. Each task is steered by its own
// user only: MPS serving everyone as root changes nothing of that.
TEST_F(MpsMultiUser, TwoUsersRunAtOnceEachSteeredOnlyByItsOwner) {
  const auto a = second_user();
  const auto b = second_user("nvtaskset-e2e2");
  if (!a || !b) GTEST_SKIP() << "needs root to create two more Unix users (CI runs as root)";
  const Copies pub = copies_for_other_users();
  // The control program both users' nvtaskset may run (to ask for servers).
  const std::string control = public_control(pub);
  env_["NVTASKSET_MPS_CONTROL"] = control;
  Env env = env_of({0, 0}, env_);
  const std::string u = path("u");
  env["NVTASKSET_MPS_OTHER_USER"] = "fail";
  // The server the daemon runs, as root's with clients: the one a user's
  // client would wait for, were the daemon single-user.
  Proc& server = start({"sleep", "30"});
  env["FAKE_MPS_SERVERS"] = std::to_string(server.pid) + ":2";

  // Single-user first: B, not root, is refused beside root's busy server.
  ASSERT_TRUE(ExitedWith(run({control, "-d"}, env), 0));
  Result r = run_as(*b, {pub.cli, "-t", "2-3", "true"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("serves user root with 2 clients"), npos) << r;
  quit_daemon();

  ASSERT_TRUE(ExitedWith(run({kCli, "--mps-multi-user", "-t", "0", "true"}, env), 0));
  auto task = [&](std::pair<uid_t, gid_t> user, const std::string& tpcs, const std::string& tag) -> Proc& {
    return start(as_user(user, {pub.cli, "--mps-multi-user", "-t", tpcs, pub.launcher, "--until-file", u + "/until",
                                "--interval-ms", "5", "--ready-file", u + "/ready." + tag}),
                 env_of(user, env));
  };
  Proc& ta = task(*a, "0-1", "a");
  Proc& tb = task(*b, "2-3", "b");
  const long pa = wait_ready(u + "/ready.a", ta);
  const long pb = wait_ready(u + "/ready.b", tb);
  ASSERT_GT(pa, 0) << ta.err();
  ASSERT_GT(pb, 0) << tb.err();
  EXPECT_TRUE(ta.running() && tb.running()) << "both tasks run at once";
  // Each on its own TPCs, as the stand-in recorded its kernels.
  record_ = u + "/record";
  ASSERT_TRUE(wait_until([&] { return !records_of(pa).empty() && !records_of(pb).empty(); }));
  EXPECT_EQ(records_of(pa).back().mask, disable64(0x3));
  EXPECT_EQ(records_of(pb).back().mask, disable64(0xc));
  // Without the option, beside the multi-user daemon: runs, and says nothing of waiting.
  r = run_as(*b, {pub.cli, "-t", "4-5", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(r.err.find("serves user"), npos) << r;

  // Owner-only control: B cannot steer or query A's task; A steers its own.
  r = run_as(*b, {pub.cli, "-p", "-t", "0-7", std::to_string(pa)}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("belongs to another user: only its owner and root can query or change its TPCs"), npos) << r;
  r = run_as(*b, {pub.cli, "-p", std::to_string(pa)}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  r = run_as(*a, {pub.cli, "-p", "-t", "0", std::to_string(pa)}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(run({kCli, "-p", std::to_string(pa)}, env).out, pid_line(pa, "current TPC list", "0"));
  EXPECT_EQ(run({kCli, "-p", std::to_string(pb)}, env).out, pid_line(pb, "current TPC list", "2-3"));
  // Every user still sees every task, and the server as everyone's.
  const Result st = run_as(*b, {pub.cli, "--status"}, env);
  EXPECT_NE(st.out.find(std::to_string(pa)), npos) << st;
  EXPECT_NE(st.out.find("mps: server pid " + std::to_string(server.pid) + " serves every user (a multi-user daemon), 2 clients"),
            npos)
      << st;

  touch(u + "/until");
  EXPECT_TRUE(ExitedWith(ta.wait(), 0)) << ta.err();
  EXPECT_TRUE(ExitedWith(tb.wait(), 0)) << tb.err();
  EXPECT_EQ(ta.err().find("wait"), npos) << ta.err();
  EXPECT_EQ(tb.err().find("wait"), npos) << tb.err();
}

}  // namespace
}  // namespace e2e
