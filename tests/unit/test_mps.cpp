// SPDX-License-Identifier: Apache-2.0
// mps/: finding and starting the MPS control daemon, against the fake
// `nvidia-cuda-mps-control` in tests/fakemps (no GPU needed).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "nvtaskset/mps.hpp"

#ifndef FAKE_MPS_CONTROL
#error "FAKE_MPS_CONTROL (path of tests/fakemps' nvidia-cuda-mps-control) must be defined"
#endif

extern char** environ;

namespace fs = std::filesystem;
namespace mps = nvtaskset::mps;
using namespace std::chrono_literals;

namespace {

const std::string kFake = FAKE_MPS_CONTROL;

// Sets environment variables for one test and restores them afterwards.
class EnvGuard {
 public:
  ~EnvGuard() {
    for (auto& [name, old] : saved_) {
      if (old)
        ::setenv(name.c_str(), old->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  void set(const std::string& name, const std::string& value) {
    save(name);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    save(name);
    ::unsetenv(name.c_str());
  }

 private:
  void save(const std::string& name) {
    if (saved_.count(name)) return;
    const char* v = std::getenv(name.c_str());
    saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Alive and not a zombie: the daemon is reparented to whatever init the
// machine has, which may be slow to reap it.
bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

// A listening socket owned by the test, standing in for a running daemon.
int listen_at(const std::string& path, int type) {
  int s = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(s, 4) != 0) {
    ADD_FAILURE() << "cannot listen at " << path << ": " << std::strerror(errno);
    if (s >= 0) ::close(s);
    return -1;
  }
  return s;
}

// Runs `program` with `input` on stdin; returns its exit status, or -1 when
// it had to be killed after 5 s.
int run_with_stdin(const std::string& program, const std::string& input) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[0], 0);
  std::string arg0 = program;
  char* argv[] = {arg0.data(), nullptr};
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, program.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[0]);
  if (rc != 0) {
    ::close(p[1]);
    return -1;
  }
  (void)!::write(p[1], input.data(), input.size());
  ::close(p[1]);
  int st = 0;
  for (auto end = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < end;) {
    if (::waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    std::this_thread::sleep_for(5ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &st, 0);
  return -1;
}

bool wait_until_gone(const std::string& pipe_dir, std::chrono::milliseconds limit) {
  for (auto end = std::chrono::steady_clock::now() + limit;
       std::chrono::steady_clock::now() < end;) {
    if (!mps::daemon_running(pipe_dir)) return true;
    std::this_thread::sleep_for(5ms);
  }
  return !mps::daemon_running(pipe_dir);
}

class MpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short: a unix socket path has at most 107 bytes.
    char tmpl[] = "/tmp/nvt-mps-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    pipe_ = (tmp_ / "pipe").string();  // not created: ensure_daemon must create it
    log_ = (tmp_ / "log").string();
    env_.set("CUDA_MPS_PIPE_DIRECTORY", pipe_);
    env_.set("CUDA_MPS_LOG_DIRECTORY", log_);
    for (const char* v :
         {"NVTASKSET_MPS_CONTROL", "FAKE_MPS_FAIL", "FAKE_MPS_SILENT", "FAKE_MPS_FD_REPORT"})
      env_.unset(v);
    // A daemon this test loses dies on its own soon.
    env_.set("FAKE_MPS_IDLE_MS", "20000");
  }

  // Quits any daemon at our pipe dir, even after a failed assertion; kills it
  // by its pid file if it does not go.
  void TearDown() override {
    stop_daemon();
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }

  void stop_daemon() {
    const fs::path pidfile = fs::path(pipe_) / "nvidia-cuda-mps-control.pid";
    pid_t pid = 0;
    if (fs::exists(pidfile)) pid = std::atoi(read_file(pidfile).c_str());
    if (mps::daemon_running(pipe_)) {
      int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::strncpy(a.sun_path, (pipe_ + "/control").c_str(), sizeof(a.sun_path) - 1);
      if (s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0)
        ::send(s, "quit", 4, MSG_NOSIGNAL);
      if (s >= 0) ::close(s);
      wait_until_gone(pipe_, 2s);
    }
    for (int i = 0; i < 200 && process_alive(pid); ++i) std::this_thread::sleep_for(5ms);
    if (process_alive(pid)) ::kill(pid, SIGKILL);
  }

  mps::Options fake_opts(std::chrono::milliseconds timeout = 5000ms) {
    mps::Options o;
    o.control_binary = kFake;
    o.start_timeout = timeout;
    return o;
  }

  fs::path tmp_;
  std::string pipe_, log_;
  EnvGuard env_;
};

// ---------------------------------------------------------------------------

TEST_F(MpsTest, PipeDirectoryComesFromTheEnvironment) {
  EXPECT_EQ(mps::pipe_directory(), pipe_);
  env_.set("CUDA_MPS_PIPE_DIRECTORY", "");
  EXPECT_EQ(mps::pipe_directory(), "/tmp/nvidia-mps");
  env_.unset("CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_EQ(mps::pipe_directory(), "/tmp/nvidia-mps");
}

TEST_F(MpsTest, DaemonRunningNeedsASeqpacketListener) {
  fs::create_directories(pipe_);
  const std::string sock = pipe_ + "/control";
  EXPECT_FALSE(mps::daemon_running(pipe_)) << "no socket file";

  int stream = listen_at(sock, SOCK_STREAM);
  ASSERT_GE(stream, 0);
  EXPECT_FALSE(mps::daemon_running(pipe_)) << "a SOCK_STREAM listener is not the MPS daemon";
  ::close(stream);
  fs::remove(sock);

  int seq = listen_at(sock, SOCK_SEQPACKET);
  ASSERT_GE(seq, 0);
  EXPECT_TRUE(mps::daemon_running(pipe_));
  ::close(seq);
  EXPECT_TRUE(fs::exists(sock));
  EXPECT_FALSE(mps::daemon_running(pipe_)) << "a stale socket file is not a daemon";
}

TEST_F(MpsTest, StaleSocketFileDoesNotStopAStart) {
  fs::create_directories(pipe_);
  ::close(listen_at(pipe_ + "/control", SOCK_SEQPACKET));  // left behind by a dead daemon
  ASSERT_TRUE(fs::exists(pipe_ + "/control"));
  mps::EnsureResult r = mps::ensure_daemon(fake_opts());
  EXPECT_TRUE(r.started);
  EXPECT_TRUE(mps::daemon_running(pipe_));
}

// Options::multi_user (--mps-multi-user): the daemon is started with -d -M,
// and a running one's mode is read from the command line of the process
// that listens on its socket, so a daemon started with -d alone is refused,
// never shared, and a listener that is not the control program cannot be
// told (mps.hpp, running_daemon).
// The one-line message of the mps::Error that `f` throws; "" when it throws none.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const mps::Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(MpsTest, MultiUserStartsWithMAndRefusesASingleUserDaemon) {
  mps::Options multi = fake_opts();
  multi.multi_user = true;
  if (::geteuid() != 0) {
    const std::string m = error_of([&] { mps::ensure_daemon(multi); });
    EXPECT_NE(m.find("only root can start one that serves every user"), std::string::npos) << m;
    EXPECT_FALSE(fs::exists(pipe_)) << "nothing is created before the refusal";
    GTEST_SKIP() << "the rest starts a multi-user daemon, which needs root (CI runs as root)";
  }
  const mps::EnsureResult r = mps::ensure_daemon(multi);
  EXPECT_TRUE(r.started);
  EXPECT_TRUE(r.multi_user);
  EXPECT_NE(mps::started_message(r).find("started the MPS control daemon for every user (-M)"), std::string::npos)
      << mps::started_message(r);
  const mps::Daemon d = mps::running_daemon(pipe_);
  EXPECT_EQ(d.mode, mps::DaemonMode::kMultiUser);
  EXPECT_EQ(d.uid, 0u);
  EXPECT_EQ(d.pid, std::atoi(read_file(fs::path(pipe_) / "nvidia-cuda-mps-control.pid").c_str()));
  EXPECT_TRUE(mps::serves_every_user(pipe_));
  const mps::EnsureResult again = mps::ensure_daemon(multi);
  EXPECT_FALSE(again.started);
  EXPECT_TRUE(again.multi_user);
  stop_daemon();

  ASSERT_TRUE(mps::ensure_daemon(fake_opts()).started);  // -d, as before
  EXPECT_EQ(mps::running_daemon(pipe_).mode, mps::DaemonMode::kSingleUser);
  EXPECT_FALSE(mps::serves_every_user(pipe_));
  const std::string m = error_of([&] { mps::ensure_daemon(multi); });
  EXPECT_NE(m.find("serves one user at a time: it was started without -M"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  stop_daemon();

  // This test's own listener: root's, but not nvidia-cuda-mps-control, so its
  // flags mean nothing: the mode cannot be told, and nothing is assumed.
  fs::create_directories(pipe_);
  const int seq = listen_at(pipe_ + "/control", SOCK_SEQPACKET);
  ASSERT_GE(seq, 0);
  const std::string why = error_of([&] { mps::running_daemon(pipe_); });
  EXPECT_NE(why.find("not nvidia-cuda-mps-control"), std::string::npos) << why;
  EXPECT_FALSE(mps::serves_every_user(pipe_));
  EXPECT_THROW(mps::ensure_daemon(multi), mps::Error);
  ::close(seq);
}

TEST_F(MpsTest, ServersSaysWhichUserEachServerServes) {
  EXPECT_TRUE(mps::servers(fake_opts()).empty()) << "no daemon, no servers";
  // Server 1: this process (so our user), 2 clients; server 2: no such PID.
  ::setenv("FAKE_MPS_SERVERS", (std::to_string(::getpid()) + ":2,999999999:1").c_str(), 1);
  mps::EnsureResult r = mps::ensure_daemon(fake_opts());
  ::unsetenv("FAKE_MPS_SERVERS");
  ASSERT_TRUE(r.started);
  const std::vector<mps::Server> s = mps::servers(fake_opts());
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].pid, ::getpid());
  EXPECT_EQ(s[0].uid, ::getuid());
  EXPECT_EQ(s[0].clients, 2u);
}

// A launch only needs the servers a client of this user would wait for; it
// does not ask this user's own server for its clients (one run of the
// control program fewer in every launch's start-up).
TEST_F(MpsTest, OtherUsersServersSkipsThisUsersOwnServer) {
  ::setenv("FAKE_MPS_SERVERS", (std::to_string(::getpid()) + ":2").c_str(), 1);
  mps::EnsureResult r = mps::ensure_daemon(fake_opts());
  ::unsetenv("FAKE_MPS_SERVERS");
  ASSERT_TRUE(r.started);
  EXPECT_TRUE(mps::other_users_servers(fake_opts()).empty());
  const std::string log = read_file(fs::path(log_) / "control.log");
  EXPECT_NE(log.find("command: get_server_list"), std::string::npos) << log;
  EXPECT_EQ(log.find("command: get_client_list"), std::string::npos) << log;
  // --status still counts every server's clients.
  ASSERT_EQ(mps::servers(fake_opts()).size(), 1u);
  EXPECT_NE(read_file(fs::path(log_) / "control.log").find("command: get_client_list"), std::string::npos);
}

// A launch asks whom the server serves before it plans the partition and
// reads the answer after, so the control program runs meanwhile (docs/
// results.md, Fig. 11a).
TEST_F(MpsTest, OtherUsersCheckAsksAtOnceAndReadsLater) {
  ::setenv("FAKE_MPS_SERVERS", (std::to_string(::getpid()) + ":2").c_str(), 1);
  mps::EnsureResult r = mps::ensure_daemon(fake_opts());
  ::unsetenv("FAKE_MPS_SERVERS");
  ASSERT_TRUE(r.started);
  const fs::path log = fs::path(log_) / "control.log";
  mps::OtherUsersCheck check(fake_opts());
  bool asked = false;
  for (auto end = std::chrono::steady_clock::now() + 5s; !asked && std::chrono::steady_clock::now() < end;
       std::this_thread::sleep_for(5ms))
    asked = read_file(log).find("command: get_server_list") != std::string::npos;
  EXPECT_TRUE(asked) << "the query runs before its answer is read";
  EXPECT_TRUE(check.servers().empty()) << "this user's own server makes nobody wait";
  EXPECT_EQ(read_file(log).find("command: get_client_list"), std::string::npos);
}

// No daemon when the check was made (nvtaskset starts one after planning):
// the answer is asked for when it is read, never assumed empty.
TEST_F(MpsTest, OtherUsersCheckAsksAnewWhenTheDaemonCameLater) {
  mps::OtherUsersCheck check(fake_opts());
  ::setenv("FAKE_MPS_SERVERS", (std::to_string(::getpid()) + ":1").c_str(), 1);
  mps::EnsureResult r = mps::ensure_daemon(fake_opts());
  ::unsetenv("FAKE_MPS_SERVERS");
  ASSERT_TRUE(r.started);
  EXPECT_TRUE(check.servers().empty());
  EXPECT_NE(read_file(fs::path(log_) / "control.log").find("command: get_server_list"), std::string::npos);
}

// A launch that fails while planning never reads its check: the control
// program it started is killed and reaped, not left behind for the task.
TEST_F(MpsTest, AnUnreadCheckLeavesNoProcessBehind) {
  ASSERT_TRUE(mps::ensure_daemon(fake_opts()).started);
  const fs::path hang = tmp_ / "hang";
  std::ofstream(hang) << "#!/bin/sh\nexec sleep 30\n";
  fs::permissions(hang, fs::perms::owner_all);
  mps::Options o = fake_opts();
  o.control_binary = hang.string();
  auto children = [] {
    int n = 0;
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string stat = read_file(e.path() / "stat");
      const size_t paren = stat.rfind(')');
      if (paren != std::string::npos && std::atoi(stat.c_str() + paren + 4) == ::getpid()) ++n;
    }
    return n;
  };
  const int before = children();
  const auto t0 = std::chrono::steady_clock::now();
  {
    mps::OtherUsersCheck check(o);
    EXPECT_EQ(children(), before + 1) << "the query runs";
  }
  EXPECT_EQ(children(), before) << "killed and reaped";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_F(MpsTest, AlreadyRunningDaemonIsUsedWithoutStartingAnother) {
  fs::create_directories(pipe_);
  int s = listen_at(pipe_ + "/control", SOCK_SEQPACKET);
  ASSERT_GE(s, 0);
  mps::Options o;
  // Resolving this (and so exec'ing anything) would throw.
  o.control_binary = (tmp_ / "must-not-run").string();
  mps::EnsureResult r;
  EXPECT_NO_THROW(r = mps::ensure_daemon(o));
  EXPECT_FALSE(r.started);
  EXPECT_EQ(r.pipe_dir, pipe_);
  EXPECT_TRUE(r.control_binary.empty());
  EXPECT_FALSE(fs::exists(log_)) << "nothing was started, so no log directory is needed";
  ::close(s);
}

TEST_F(MpsTest, StartsTheDaemonAndQuitStopsIt) {
  mps::EnsureResult r = mps::ensure_daemon(fake_opts());
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.pipe_dir, pipe_);
  EXPECT_EQ(r.log_dir, log_);
  EXPECT_EQ(r.control_binary, kFake);
  EXPECT_TRUE(mps::daemon_running(pipe_));

  // The daemon got our log directory: the fake logs there, naming both dirs.
  const std::string log = read_file(fs::path(log_) / "control.log");
  EXPECT_NE(log.find("pipe directory " + pipe_), std::string::npos) << log;
  EXPECT_NE(log.find("log directory " + log_), std::string::npos) << log;

  // A second call finds it running, and has nothing to print.
  mps::EnsureResult again = mps::ensure_daemon(fake_opts());
  EXPECT_FALSE(again.started);
  EXPECT_EQ(mps::started_message(again), "");

  // The daemon answers commands, and `echo quit | nvidia-cuda-mps-control` stops it.
  EXPECT_EQ(run_with_stdin(kFake, "get_server_list\n"), 0);
  EXPECT_EQ(run_with_stdin(kFake, "quit\n"), 0);
  EXPECT_TRUE(wait_until_gone(pipe_, 2s));
  EXPECT_FALSE(fs::exists(pipe_ + "/control"));
  EXPECT_NE(read_file(fs::path(log_) / "control.log").find("command: quit"), std::string::npos);
}

TEST_F(MpsTest, FindsTheControlProgramOnPath) {
  env_.set("PATH", "/nonexistent-dir::" + fs::path(kFake).parent_path().string());
  mps::EnsureResult r = mps::ensure_daemon({});
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.control_binary, "nvidia-cuda-mps-control");
  EXPECT_TRUE(mps::daemon_running(pipe_));
  EXPECT_EQ(mps::started_message(r),
            "nvtaskset: started the MPS control daemon (pipe directory " + pipe_ +
                "); stop it with: echo quit | CUDA_MPS_PIPE_DIRECTORY=" + pipe_ +
                " nvidia-cuda-mps-control");
}

TEST_F(MpsTest, EnvironmentVariableNamesTheControlProgram) {
  fs::create_directories(tmp_ / "empty");
  env_.set("PATH", (tmp_ / "empty").string());
  env_.set("NVTASKSET_MPS_CONTROL", kFake);
  mps::EnsureResult r = mps::ensure_daemon({});
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.control_binary, kFake);
  EXPECT_TRUE(mps::daemon_running(pipe_));
}

TEST_F(MpsTest, MissingProgramOnPathIsAOneLineError) {
  fs::create_directories(tmp_ / "empty");
  env_.set("PATH", (tmp_ / "empty").string());
  try {
    mps::ensure_daemon({});
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nvidia-cuda-mps-control not found on $PATH"), std::string::npos) << m;
    EXPECT_NE(m.find("install the NVIDIA MPS tools"), std::string::npos) << m;
    EXPECT_NE(m.find("--no-mps"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_FALSE(mps::daemon_running(pipe_));
}

TEST_F(MpsTest, MissingExplicitProgramIsNamed) {
  const std::string missing = (tmp_ / "no-such-mps-control").string();
  mps::Options o = fake_opts();
  o.control_binary = missing;
  try {
    mps::ensure_daemon(o);
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(missing + " not found"), std::string::npos) << m;
    EXPECT_NE(m.find("--no-mps"), std::string::npos) << m;
  }
  env_.set("NVTASKSET_MPS_CONTROL", missing);
  try {
    mps::ensure_daemon({});
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    EXPECT_NE(std::string(e.what()).find("$NVTASKSET_MPS_CONTROL"), std::string::npos) << e.what();
  }
}

TEST_F(MpsTest, NonExecutableProgramIsAnError) {
  const fs::path f = tmp_ / "not-executable";
  std::ofstream(f) << "#!/bin/sh\nexit 0\n";
  fs::permissions(f, fs::perms::owner_read | fs::perms::owner_write);
  mps::Options o = fake_opts();
  o.control_binary = f.string();
  try {
    mps::ensure_daemon(o);
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not an executable file"), std::string::npos)
        << e.what();
  }
}

TEST_F(MpsTest, FailingControlProgramReportsItsExitStatus) {
  env_.set("FAKE_MPS_FAIL", "1");
  try {
    mps::ensure_daemon(fake_opts());
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("exited with status 3"), std::string::npos) << m;
    EXPECT_NE(m.find("log directory " + log_), std::string::npos) << m;
    // Its own stderr line is carried into the message.
    EXPECT_NE(m.find("FAKE_MPS_FAIL"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_FALSE(mps::daemon_running(pipe_));
}

TEST_F(MpsTest, SilentDaemonTimesOut) {
  env_.set("FAKE_MPS_SILENT", "1");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    mps::ensure_daemon(fake_opts(300ms));
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("did not answer"), std::string::npos) << m;
    EXPECT_NE(m.find("within 300 ms"), std::string::npos) << m;
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 3s) << "every wait must be bounded by the timeout";
}

TEST_F(MpsTest, HungControlProgramIsKilledAtTheTimeout) {
  // A program that neither daemonizes nor listens: the wait for it must end.
  const fs::path hang = tmp_ / "hang";
  std::ofstream(hang) << "#!/bin/sh\nexec sleep 30\n";
  fs::permissions(hang, fs::perms::owner_all);
  mps::Options o = fake_opts(200ms);
  o.control_binary = hang.string();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(mps::ensure_daemon(o), mps::Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_F(MpsTest, ConcurrentStartByAnotherProcessIsNotAnError) {
  // The control program loses a race: another process's daemon is up by the
  // time it checks, so it exits non-zero; that daemon is good enough.
  const fs::path racer = tmp_ / "racer";
  std::ofstream(racer) << "#!/bin/sh\n'" << kFake << "' -d\nexit 1\n";
  fs::permissions(racer, fs::perms::owner_all);
  mps::Options o = fake_opts();
  o.control_binary = racer.string();
  mps::EnsureResult r;
  ASSERT_NO_THROW(r = mps::ensure_daemon(o));
  EXPECT_TRUE(mps::daemon_running(pipe_));
}

TEST_F(MpsTest, ControlProgramInheritsNoStrayFds) {
  // An fd the caller left inheritable must not reach the daemon either.
  int leaky = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaky, 3);
  const fs::path report = tmp_ / "fds";
  env_.set("FAKE_MPS_FD_REPORT", report.string());
  mps::EnsureResult r = mps::ensure_daemon(fake_opts());
  ::close(leaky);
  EXPECT_TRUE(r.started);
  EXPECT_EQ(read_file(report), "0 1 2\n");
}

TEST_F(MpsTest, StartWorksWhenTheCallerIgnoresSigchld) {
  // Children are then reaped by the kernel and waitpid() says ECHILD: the
  // socket alone must decide.
  struct sigaction ign {
  }, old{};
  ign.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGCHLD, &ign, &old), 0);
  mps::EnsureResult r;
  EXPECT_NO_THROW(r = mps::ensure_daemon(fake_opts()));
  ::sigaction(SIGCHLD, &old, nullptr);
  EXPECT_TRUE(r.started);
  EXPECT_TRUE(mps::daemon_running(pipe_));
}

TEST_F(MpsTest, FakeDaemonExitsWhenIdle) {
  // So that a test that loses its daemon cannot leave it running for long.
  env_.set("FAKE_MPS_IDLE_MS", "200");
  ASSERT_TRUE(mps::ensure_daemon(fake_opts()).started);
  // Watch the socket file, not the socket: every connection is activity.
  const auto end = std::chrono::steady_clock::now() + 3s;
  while (fs::exists(pipe_ + "/control") && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(fs::exists(pipe_ + "/control"));
  EXPECT_FALSE(mps::daemon_running(pipe_));
}

TEST_F(MpsTest, PipeDirectoryTooLongIsAnError) {
  env_.set("CUDA_MPS_PIPE_DIRECTORY", (tmp_ / std::string(120, 'p')).string());
  EXPECT_THROW(mps::ensure_daemon(fake_opts()), mps::Error);
}

TEST_F(MpsTest, StartedMessageForTheDefaultPipeDirectory) {
  mps::EnsureResult r;
  r.started = true;
  r.pipe_dir = "/tmp/nvidia-mps";
  r.control_binary = "nvidia-cuda-mps-control";
  EXPECT_EQ(mps::started_message(r),
            "nvtaskset: started the MPS control daemon (pipe directory /tmp/nvidia-mps); stop it "
            "with: echo quit | nvidia-cuda-mps-control");
  r.pipe_dir = "/tmp/my mps";
  r.control_binary = "/opt/it's/nvidia-cuda-mps-control";
  EXPECT_EQ(mps::started_message(r),
            "nvtaskset: started the MPS control daemon (pipe directory /tmp/my mps); stop it "
            "with: echo quit | CUDA_MPS_PIPE_DIRECTORY='/tmp/my mps' "
            "'/opt/it'\\''s/nvidia-cuda-mps-control'");
}

// --- directories and daemons another user controls ---------------------------

// A pipe directory another user can write (or owns) is where they can run a
// daemon of their own, or put one in place of ours: root's launches then
// waited on it and became its clients. It is neither used nor started in,
// in one line that says what to do.
TEST_F(MpsTest, PipeDirectoryOthersCanWriteIsRefused) {
  // Under a directory every user can write (and not sticky), anyone could
  // put another tree in its place.
  const std::string open_parent = fs::path(pipe_).parent_path().string() + "/open";
  fs::create_directories(open_parent);
  ::chmod(open_parent.c_str(), 0777);
  const std::string inside = open_parent + "/mps";
  fs::create_directories(inside);
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", inside.c_str(), 1);
  try {
    mps::ensure_daemon(fake_opts());
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MPS pipe directory not used: " + open_parent + " is writable by every user"), std::string::npos)
        << m;
    EXPECT_NE(m.find("set CUDA_MPS_PIPE_DIRECTORY to a directory of your own, or use --no-mps"), std::string::npos)
        << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(inside + "/control")) << "no daemon was started there";
  EXPECT_FALSE(fs::exists(fs::path(log_) / "control.log"));
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_.c_str(), 1);
  // A pipe directory of another user, whatever its mode.
  if (::geteuid() == 0) {
    fs::create_directories(pipe_);
    ::chmod(pipe_.c_str(), 0777);
    ASSERT_EQ(::chown(pipe_.c_str(), 54321, static_cast<gid_t>(-1)), 0);
    try {
      mps::ensure_daemon(fake_opts());
      FAIL() << "expected mps::Error";
    } catch (const mps::Error& e) {
      EXPECT_NE(std::string(e.what()).find(pipe_ + " is owned by uid 54321"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(pipe_ + "/control"));
  }
}

// The control daemon makes its pipe directory writable by every user (0777,
// measured with the real daemon started by root): a directory of this
// user's or root's in that layout is used, its socket's owner checked.
TEST_F(MpsTest, ThePipeDirectoryAsTheDaemonLeavesItIsUsed) {
  fs::create_directories(pipe_);
  ::chmod(pipe_.c_str(), 0777);
  EXPECT_TRUE(mps::ensure_daemon(fake_opts()).started);
  EXPECT_TRUE(fs::exists(pipe_ + "/control"));
}

// In a directory others can write, anyone may create the socket's name first.
TEST_F(MpsTest, AControlSocketOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a socket away";
  fs::create_directories(pipe_);
  ::chmod(pipe_.c_str(), 01777);
  const int s = listen_at(pipe_ + "/control", SOCK_SEQPACKET);
  ASSERT_GE(s, 0);
  ASSERT_EQ(::chown((pipe_ + "/control").c_str(), 54321, static_cast<gid_t>(-1)), 0);
  try {
    mps::ensure_daemon(fake_opts());
    ADD_FAILURE() << "expected mps::Error";
  } catch (const mps::Error& e) {
    EXPECT_NE(std::string(e.what()).find(pipe_ + "/control is owned by uid 54321"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(mps::servers(fake_opts()).empty());
  ::close(s);
}

// --status and a launch ask the daemon whom its servers serve: never one in
// a directory that fails the check (the daemon below is asked nothing).
TEST_F(MpsTest, ServersAreNotAskedOfADaemonInADirectoryOthersCanWrite) {
  ::setenv("FAKE_MPS_SERVERS", (std::to_string(::getpid()) + ":2").c_str(), 1);
  ASSERT_TRUE(mps::ensure_daemon(fake_opts()).started);
  ::unsetenv("FAKE_MPS_SERVERS");
  // A link in its place: never followed.
  const std::string real = pipe_ + ".real";
  fs::rename(pipe_, real);
  fs::create_directory_symlink(real, pipe_);
  EXPECT_TRUE(mps::servers(fake_opts()).empty());
  {
    mps::OtherUsersCheck check(fake_opts());
    EXPECT_TRUE(check.servers().empty());
  }
  EXPECT_EQ(read_file(fs::path(log_) / "control.log").find("command: get_server_list"), std::string::npos);
  fs::remove(pipe_);
  fs::rename(real, pipe_);
  EXPECT_EQ(mps::servers(fake_opts()).size(), 1u) << "the same daemon, once the directory is safe";
}

TEST_F(MpsTest, LogDirectoryOthersCanWriteIsRefused) {
  fs::create_directories(log_);
  ::chmod(log_.c_str(), 0777);
  try {
    mps::ensure_daemon(fake_opts());
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MPS log directory not used: " + log_ + " is writable by every user"), std::string::npos) << m;
    EXPECT_NE(m.find("CUDA_MPS_LOG_DIRECTORY"), std::string::npos) << m;
  }
  EXPECT_FALSE(mps::daemon_running(pipe_));
}

// A daemon that answers each get_client_list 2.9 s late (as a fake one did)
// cost a launch or --status 2.9 s per server it named. The whole
// conversation is bounded instead (mps.cpp, kConversationBudget: 500 ms):
// three servers here took 8.7 s before; the 3 s asserted leaves a loaded
// machine six times the bound.
TEST_F(MpsTest, ASlowDaemonCostsABoundedTotalNotATimePerServer) {
  const std::string list = std::to_string(::getpid()) + ":1," + std::to_string(::getppid()) + ":1,1:1";
  ::setenv("FAKE_MPS_SERVERS", list.c_str(), 1);
  ::setenv("FAKE_MPS_CLIENT_LIST_DELAY_MS", "2900", 1);
  const bool started = mps::ensure_daemon(fake_opts()).started;
  ::unsetenv("FAKE_MPS_SERVERS");
  ::unsetenv("FAKE_MPS_CLIENT_LIST_DELAY_MS");
  ASSERT_TRUE(started);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<mps::Server> s = mps::servers(fake_opts());
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 3s);
  EXPECT_EQ(s.size(), 3u) << "the servers are still named, their clients unknown";
  for (const auto& sv : s) EXPECT_EQ(sv.clients, 0u);
}

// --- log directory ----------------------------------------------------------

TEST_F(MpsTest, LogDirectoryFromTheEnvironmentIsCreated) {
  const std::string nested = log_ + "/a/b";
  env_.set("CUDA_MPS_LOG_DIRECTORY", nested);
  EXPECT_EQ(mps::log_directory(), nested);
  EXPECT_TRUE(fs::is_directory(nested));
}

TEST_F(MpsTest, LogDirectoryUsesTheSystemDefaultWhenUsable) {
  env_.unset("CUDA_MPS_LOG_DIRECTORY");
  mps::detail::LogDirDefaults d;
  d.system_dir = (tmp_ / "var-log" / "nvidia-mps").string();  // creatable
  d.tmp_dir = tmp_.string();
  EXPECT_EQ(mps::detail::log_directory(d), d.system_dir);
  EXPECT_TRUE(fs::is_directory(d.system_dir));
}

// /var/log/nvidia-mps cannot be created by a non-root user; a path under a
// regular file cannot be created by anyone, root included.
class LogFallbackTest : public MpsTest {
 protected:
  void SetUp() override {
    MpsTest::SetUp();
    env_.unset("CUDA_MPS_LOG_DIRECTORY");
    std::ofstream(tmp_ / "file") << "x";
    d_.system_dir = (tmp_ / "file" / "nvidia-mps").string();
    d_.tmp_dir = (tmp_ / "t").string();
    fs::create_directories(d_.tmp_dir);
    fs::create_directories(tmp_ / "xdg");
  }
  std::string tmp_fallback() const {
    return d_.tmp_dir + "/nvidia-mps-log-" + std::to_string(::geteuid());
  }
  mps::detail::LogDirDefaults d_;
};

TEST_F(LogFallbackTest, FallsBackToXdgRuntimeDir) {
  env_.set("XDG_RUNTIME_DIR", (tmp_ / "xdg").string());
  const std::string want = (tmp_ / "xdg" / "nvidia-mps-log").string();
  EXPECT_EQ(mps::detail::log_directory(d_), want);
  EXPECT_TRUE(fs::is_directory(want));
  EXPECT_EQ(fs::status(want).permissions() & fs::perms::all, fs::perms::owner_all);
}

TEST_F(LogFallbackTest, FallsBackToAPrivateTmpDirectory) {
  env_.unset("XDG_RUNTIME_DIR");
  EXPECT_EQ(mps::detail::log_directory(d_), tmp_fallback());
  EXPECT_TRUE(fs::is_directory(tmp_fallback()));
  EXPECT_EQ(fs::status(tmp_fallback()).permissions() & fs::perms::all, fs::perms::owner_all);
}

TEST_F(LogFallbackTest, PlantedSymlinksAreRefused) {
  // Someone else could create the /tmp name first, pointing elsewhere.
  fs::create_directories(tmp_ / "elsewhere");
  fs::create_directory_symlink(tmp_ / "elsewhere", tmp_ / "xdg" / "nvidia-mps-log");
  fs::create_directory_symlink(tmp_ / "elsewhere", tmp_fallback());
  env_.set("XDG_RUNTIME_DIR", (tmp_ / "xdg").string());
  try {
    mps::detail::log_directory(d_);
    FAIL() << "expected mps::Error";
  } catch (const mps::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(tmp_fallback()), std::string::npos) << m;
    EXPECT_NE(m.find("CUDA_MPS_LOG_DIRECTORY"), std::string::npos) << m;
  }
}

}  // namespace
