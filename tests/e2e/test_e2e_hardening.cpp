// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the input hardening: the real `nvtaskset` binary and
// shim against the stand-in driver (tests/fakecuda), as in test_e2e.cpp,
// whose harness this file trims to what these tests need.
//
// Every child process runs in its own process group with a timeout; whatever
// is still running at the end of a test is killed (and reaped).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;
using Env = std::map<std::string, std::string>;

const std::string kCli = NVTASKSET_E2E_CLI;
const std::string kFake = NVTASKSET_E2E_FAKE;
const std::string kLauncher = NVTASKSET_E2E_LAUNCHER;

constexpr Ms kTimeout = 20s;  // any child
constexpr Ms kWait = 10s;     // a file, a process state

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

bool wait_until(const std::function<bool()>& pred, Ms timeout = kWait) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// The state letter of /proc/<pid>/stat (after the last ')'), or '?'.
char proc_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

struct Result {
  bool timed_out = false;
  bool exited = false;
  int code = -1;
  int signal = 0;
  std::string out, err, command;
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "\n  command: " << r.command << "\n  ";
  if (r.timed_out) os << "TIMED OUT (killed)";
  else if (r.exited) os << "exit " << r.code;
  else os << "killed by signal " << r.signal;
  return os << "\n  stdout: [" << r.out << "]\n  stderr: [" << r.err << "]";
}

::testing::AssertionResult ExitedWith(const Result& r, int code) {
  if (!r.timed_out && r.exited && r.code == code) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected exit " << code << r;
}

// The CLI's error contract: exit 1, exactly one stderr line "nvtaskset: ...".
::testing::AssertionResult FailedWithOneLine(const Result& r) {
  if (auto a = ExitedWith(r, 1); !a) return a;
  const auto ls = lines_of(r.err);
  if (ls.size() == 1 && ls[0].starts_with("nvtaskset: ") && ls[0].size() > 11 && r.err.ends_with("\n"))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected one stderr line \"nvtaskset: <message>\"" << r;
}

struct Proc {
  pid_t pid = -1;
  std::string out_path, err_path, command;
  bool reaped = false;
  Result result;

  Result wait(Ms timeout = kTimeout) {
    if (reaped) return result;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int st = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid) break;
      if (r < 0 && errno != EINTR) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        finish(st, true);
        return result;
      }
      std::this_thread::sleep_for(1ms);
    }
    finish(st, false);
    return result;
  }

  void kill_group() {
    if (reaped) return;
    ::kill(-pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    finish(st, true);
  }

 private:
  void finish(int st, bool timed_out) {
    reaped = true;
    result.timed_out = timed_out;
    result.exited = WIFEXITED(st);
    result.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    result.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    result.out = read_file(out_path);
    result.err = read_file(err_path);
    result.command = command;
  }
};

class Hardening : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvtaskset-e2e-hardening-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    fs::create_directories(path("tmp"));
    // The caller's environment without anything that could steer the shim,
    // the stand-in, CUDA or MPS; the stand-in is the real driver.
    for (char** p = environ; *p; ++p) {
      const std::string kv = *p;
      const auto eq = kv.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = kv.substr(0, eq);
      if (k.starts_with("NVTASKSET_") || k.starts_with("FAKECUDA_") || k.starts_with("CUDA_") ||
          k.starts_with("LD_") || k.starts_with("XDG_") || k == "SPDLOG_LEVEL" || k == "TMPDIR")
        continue;
      env_[k] = kv.substr(eq + 1);
    }
    env_["NVTASKSET_REAL_LIBCUDA"] = kFake;
    env_["FAKECUDA_RECORD"] = path("record");
    env_["XDG_CACHE_HOME"] = path("cache");
    env_["XDG_CONFIG_HOME"] = path("config");
    env_["XDG_RUNTIME_DIR"] = path("runtime");
    env_["TMPDIR"] = path("tmp");
    env_["CUDA_MPS_PIPE_DIRECTORY"] = path("mps-pipe");
    env_["CUDA_MPS_LOG_DIRECTORY"] = path("mps-log");
    env_["NVTASKSET_MPS_CONTROL"] = path("no-such-mps-control");
  }

  void TearDown() override {
    for (auto& p : procs_) p->kill_group();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  Proc& start(const std::vector<std::string>& argv, const Env& env) {
    auto p = std::make_unique<Proc>();
    const std::string tag = std::to_string(procs_.size());
    p->out_path = path("out." + tag);
    p->err_path = path("err." + tag);
    for (const auto& a : argv) p->command += (p->command.empty() ? "'" : " '") + a.substr(0, 200) + "'";
    std::vector<std::string> envs;
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const auto& s : envs) cenv.push_back(const_cast<char*>(s.c_str()));
    cenv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int in = ::open("/dev/null", O_RDONLY);
      const int out = ::open(p->out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(p->err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in < 0 || out < 0 || err < 0 || ::chdir(dir_.c_str()) != 0) ::_exit(126);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      ::execvpe(cargv[0], cargv.data(), cenv.data());
      ::_exit(125);
    }
    if (pid > 0) ::setpgid(pid, pid);
    p->pid = pid;
    procs_.push_back(std::move(p));
    return *procs_.back();
  }
  Result run(const std::vector<std::string>& argv, const Env& env) { return start(argv, env).wait(); }
  Result run(const std::vector<std::string>& argv) { return run(argv, env_); }

  std::string dir_;
  Env env_;
  std::vector<std::unique_ptr<Proc>> procs_;
};

// --- a killed, unreaped task is dead --------------------------------------------------

TEST_F(Hardening, ZombieTaskIsRefused) {
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

// --- syntax errors come before any driver access ------------------------------------

struct BadSyntax {
  std::string name;
  std::vector<std::string> args;  // between --no-mps and the command
  std::string error;              // the whole stderr line, after "nvtaskset: "
};

void PrintTo(const BadSyntax& c, std::ostream* os) { *os << c.name; }

class SyntaxBeforeDriver : public Hardening, public ::testing::WithParamInterface<BadSyntax> {};

TEST_P(SyntaxBeforeDriver, IsReportedAsSuch) {
  // No driver anywhere: the stand-in is replaced by a file that does not exist.
  env_["NVTASKSET_REAL_LIBCUDA"] = path("no-such-libcuda.so.1");
  const std::string marker = path("marker");
  // Control: a good list gets as far as the (missing) driver.
  Result r = run({kCli, "--no-mps", "-t", "0-3", "touch", marker});
  ASSERT_TRUE(FailedWithOneLine(r));
  ASSERT_NE(r.err.find("no CUDA driver found"), std::string::npos) << r;

  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), GetParam().args.begin(), GetParam().args.end());
  argv.insert(argv.end(), {"touch", marker});
  r = run(argv);
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: " + GetParam().error + "\n") << r;
  EXPECT_FALSE(exists(marker)) << "the command ran";
}

INSTANTIATE_TEST_SUITE_P(
    Hardening, SyntaxBeforeDriver,
    ::testing::Values(
        BadSyntax{"ZeroStride", {"-t", "0-3:0"}, "invalid TPC list '0-3:0': stride must be at least 1"},
        BadSyntax{"StrideOf2To64Minus1",
                  {"-t", "50-53:18446744073709551615"},
                  "invalid TPC list '50-53:18446744073709551615': stride 18446744073709551615 is larger than 4095"},
        BadSyntax{"GpcList", {"-g", "1-"}, "invalid GPC list '1-': range without an end"},
        BadSyntax{"PositionalMask", {"0xzz"}, "invalid TPC mask '0xzz': 'z' is not a hex digit"},
        BadSyntax{"Physical", {"--physical", "0x"}, "invalid physical mask '0x': no digits"},
        BadSyntax{"SecondDevice", {"-d", "0", "-t", "0-3", "-d", "1", "-t", "x"},
                  "invalid TPC list 'x': 'x' is not a number or range"},
        BadSyntax{"MaskAfterDevice", {"-d", "1", "0x1g"}, "invalid TPC mask '0x1g': 'g' is not a hex digit"},
        BadSyntax{"ControlCharacters", {"-t", "1\n2"}, "invalid TPC list '1\\x0a2': unexpected '\\x0a2'"}),
    [](const auto& info) { return info.param.name; });

TEST_F(Hardening, PidModeChecksSyntaxFirstToo) {
  env_["NVTASKSET_REAL_LIBCUDA"] = path("no-such-libcuda.so.1");
  // PID 1 exists and is not under nvtaskset: the list is still the error.
  Result r = run({kCli, "-p", "-t", "0-3:0", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: invalid TPC list '0-3:0': stride must be at least 1\n") << r;
  r = run({kCli, "-p", "0xzz", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: invalid TPC mask '0xzz': 'z' is not a hex digit\n") << r;
  // Control: with good syntax, the PID is the error.
  r = run({kCli, "-p", "-t", "0-3", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: pid 1 is not running under nvtaskset\n") << r;
}

TEST_F(Hardening, OverlongListIsRefusedAtOnce) {
  std::string huge;
  while (huge.size() < 120 * 1024) huge += "0-4095:3,";
  huge += "0";
  const std::string marker = path("marker");
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run({kCli, "--no-mps", "-t", huge, "touch", marker});
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_NE(r.err.find("longer than 4096 characters"), std::string::npos) << r;
  EXPECT_LT(r.err.size(), 200u) << r;
  EXPECT_LT(elapsed, 3s) << "took 4-60 s before the bound";
  EXPECT_FALSE(exists(marker));
}

// --- NVTASKSET_LOG ---------------------------------------------------------------------

TEST_F(Hardening, LogLevelIsCaseInsensitiveAndUnknownLevelsWarn) {
  // `true` is no CUDA program, so only the CLI logs here.
  Env env = env_;
  env["NVTASKSET_LOG"] = "bogus";
  Result r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(r.err,
            "nvtaskset: warning: NVTASKSET_LOG=bogus: unknown level (trace, debug, info, warn, error, off); using warn\n")
      << r;

  env["NVTASKSET_LOG"] = "DEBUG";  // spdlog's from_str turned this into "off"
  r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_NE(r.err.find("nvtaskset: debug: CUDA driver: " + kFake + "\n"), std::string::npos) << r;

  env["NVTASKSET_LOG"] = "Warn";
  r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(r.err, "") << r;

  // Unknown means warn, not off: a warning still reaches the user.
  env["NVTASKSET_LOG"] = "INFOO";
  env["FAKECUDA_CC"] = "9.0";  // a Hopper without a known layout: the physical mask warning
  r = run({kCli, "--no-mps", "--physical", "0xf", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(lines_of(r.err).size(), 2u) << r;
  EXPECT_NE(r.err.find("NVTASKSET_LOG=INFOO: unknown level"), std::string::npos) << r;
}

}  // namespace
