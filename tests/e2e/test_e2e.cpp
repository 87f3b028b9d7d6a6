// SPDX-License-Identifier: Apache-2.0
// End-to-end tests: the real `nvtaskset` binary and the real shim, run against
// the stand-in driver (tests/fakecuda), on a machine without a GPU.
//
// The stand-in records, for every cuLaunchKernel, the TPC-disable mask that the
// shim's launch callback left in the TMD ("<pid> <layout> <valid> <mask>"), so
// these tests check what the hardware would have been told, per launch.
//
// Every child process runs in its own process group with a timeout; whatever
// is still running at the end of a test is killed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <pwd.h>
#include <sys/mman.h>

#include <nlohmann/json.hpp>

#include "nvtaskset/control_region.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

const std::string kCli = NVTASKSET_E2E_CLI;
const std::string kShim = NVTASKSET_E2E_SHIM;
const std::string kFake = NVTASKSET_E2E_FAKE;
const std::string kLauncher = NVTASKSET_E2E_LAUNCHER;
const std::string kLauncherDlopen = NVTASKSET_E2E_LAUNCHER_DLOPEN;
const std::string kGraphLauncher = NVTASKSET_E2E_GRAPH_LAUNCHER;
const std::string kFakeMps = NVTASKSET_E2E_FAKE_MPS;

std::string shim_dir() { return fs::path(kShim).parent_path().string(); }

// The descriptor through which process `pid` holds its control region (an
// anonymous memory file, "/memfd:nvtaskset.<pid>"), or "" when it has none.
std::string region_fd(long pid) {
  const std::string want = "/memfd:nvtaskset." + std::to_string(pid) + " (deleted)";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    if (fs::read_symlink(e.path(), ec2).string() == want) return e.path().string();
  }
  return "";
}

// Any child (nvtaskset, -p, a launcher) must finish within this.
constexpr Ms kTimeout = 20s;
// Waiting for a file, a record, a process state.
constexpr Ms kWait = 10s;

using Env = std::map<std::string, std::string>;

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

void touch(const std::string& p) { std::ofstream(p) << ""; }

bool wait_until(const std::function<bool()>& pred, Ms timeout = kWait) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// "0x" + minimal lowercase hex of a 128-bit value, as the stand-in records it.
std::string hex128(std::uint64_t hi, std::uint64_t lo) {
  char buf[40];
  if (hi)
    std::snprintf(buf, sizeof buf, "0x%llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
  else
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(lo));
  return buf;
}
// The disable mask a V01-V03 TMD (64-bit mask field) gets for an enable mask.
std::string disable64(std::uint64_t enabled) { return hex128(0, ~enabled); }
// The disable mask a V04/V05 TMD (128-bit mask field) gets.
std::string disable128(std::uint64_t enabled_hi, std::uint64_t enabled_lo) { return hex128(~enabled_hi, ~enabled_lo); }

struct Result {
  bool timed_out = false;
  bool exited = false;  // exited normally (not by a signal)
  int code = -1;        // exit status when exited
  int signal = 0;       // terminating signal otherwise
  std::string out, err;
  std::string command;
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "\n  command: " << r.command << "\n  ";
  if (r.timed_out) os << "TIMED OUT (killed)";
  else if (r.exited) os << "exit " << r.code;
  else os << "killed by signal " << r.signal << " (" << strsignal(r.signal) << ")";
  return os << "\n  stdout: [" << r.out << "]\n  stderr: [" << r.err << "]";
}

::testing::AssertionResult ExitedWith(const Result& r, int code) {
  if (!r.timed_out && r.exited && r.code == code) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected exit " << code << r;
}

// The CLI's error contract: exactly one line on stderr, "nvtaskset: <message>".
::testing::AssertionResult OneErrorLine(const Result& r) {
  const auto ls = lines_of(r.err);
  if (ls.size() == 1 && ls[0].starts_with("nvtaskset: ") && ls[0].size() > 11 && r.err.ends_with("\n"))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected one stderr line \"nvtaskset: <message>\"" << r;
}

::testing::AssertionResult FailedWithOneLine(const Result& r, int code = 1) {
  if (auto a = ExitedWith(r, code); !a) return a;
  return OneErrorLine(r);
}

struct Record {
  long pid = 0;
  std::string layout;
  int valid = -1;
  std::string mask;
  std::string source;  // "launch", or "graph<grid width>" for a graph kernel node
};

std::ostream& operator<<(std::ostream& os, const Record& r) {
  return os << r.pid << " " << r.layout << " " << r.valid << " " << r.mask << " " << r.source;
}

// A started child process, in its own process group.
struct Proc {
  pid_t pid = -1;
  std::string out_path, err_path, command;
  bool reaped = false;
  Result result;

  std::string out() const { return read_file(out_path); }
  std::string err() const { return read_file(err_path); }

  bool running() {
    if (reaped) return false;
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      finish(st, false);
      return false;
    }
    return true;
  }

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
    result.out = out();
    result.err = err();
    result.command = command;
  }
};

class E2E : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvtaskset-e2e-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    record_ = path("record");
    fs::create_directories(path("tmp"));
    // The public status entries of this test's tasks (control/status.hpp):
    // sticky and world-writable, as /dev/shm, for the second-user tests.
    fs::create_directories(path("status"));
    ::chmod(path("status").c_str(), 01777);
    env_ = base_env();
  }

  void TearDown() override {
    for (auto& p : procs_) {
      p->kill_group();
    }
    for (const auto& f : cleanup_) ::unlink(f.c_str());
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // The caller's environment without anything that could steer the shim, the
  // stand-in, CUDA or MPS, plus the stand-in as the real driver.
  Env base_env() const {
    Env e;
    for (char** p = environ; *p; ++p) {
      const std::string kv = *p;
      const auto eq = kv.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = kv.substr(0, eq);
      if (k.starts_with("NVTASKSET_") || k.starts_with("FAKECUDA_") || k.starts_with("CUDA_") ||
          k.starts_with("LD_") || k.starts_with("XDG_") || k == "SPDLOG_LEVEL" || k == "TMPDIR")
        continue;
      e[k] = kv.substr(eq + 1);
    }
    e["NVTASKSET_REAL_LIBCUDA"] = kFake;
    e["FAKECUDA_RECORD"] = record_;
    // Keep any topology cache or config of the CLI inside this test.
    e["XDG_CACHE_HOME"] = path("cache");
    e["XDG_CONFIG_HOME"] = path("config");
    e["XDG_RUNTIME_DIR"] = path("runtime");
    e["TMPDIR"] = path("tmp");
    // Every nvtaskset run here passes --no-mps; should one still reach for
    // MPS, it finds no daemon and no control program.
    e["CUDA_MPS_PIPE_DIRECTORY"] = path("mps-pipe");
    e["CUDA_MPS_LOG_DIRECTORY"] = path("mps-log");
    e["NVTASKSET_MPS_CONTROL"] = path("no-such-mps-control");
    e["NVTASKSET_STATUS_DIR"] = path("status");
    return e;
  }

  Proc& start(const std::vector<std::string>& argv, const Env& env) {
    auto p = std::make_unique<Proc>();
    const std::string tag = std::to_string(procs_.size());
    p->out_path = path("out." + tag);
    p->err_path = path("err." + tag);
    for (const auto& a : argv) p->command += (p->command.empty() ? "" : " ") + ("'" + a + "'");

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
      // Dies with the test binary, even if it is killed before TearDown
      // (kept across the exec, and across nvtaskset's exec of the command).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int in = ::open("/dev/null", O_RDONLY);
      const int out = ::open(p->out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(p->err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in < 0 || out < 0 || err < 0 || ::chdir(dir_.c_str()) != 0) ::_exit(126);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      ::execvpe(cargv[0], cargv.data(), cenv.data());
      ::_exit(125);  // distinct from 127: the test harness, not nvtaskset, failed to exec
    }
    if (pid > 0) ::setpgid(pid, pid);
    p->pid = pid;
    procs_.push_back(std::move(p));
    return *procs_.back();
  }
  Proc& start(const std::vector<std::string>& argv) { return start(argv, env_); }

  Result run(const std::vector<std::string>& argv, const Env& env, Ms timeout = kTimeout) {
    return start(argv, env).wait(timeout);
  }
  Result run(const std::vector<std::string>& argv) { return run(argv, env_); }

  std::vector<Record> records() const {
    std::vector<Record> out;
    std::string text = read_file(record_);
    // Only whole lines: a reader may catch a launch's write half-way.
    text.erase(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
    for (const auto& l : lines_of(text)) {
      std::istringstream in(l);
      Record r;
      in >> r.pid >> r.layout >> r.valid >> r.mask >> r.source;
      out.push_back(r);
    }
    return out;
  }
  std::vector<Record> records_of(long pid) const {
    std::vector<Record> out;
    for (const auto& r : records())
      if (r.pid == pid) out.push_back(r);
    return out;
  }

  // Waits for a launcher's --ready-file and returns the pid it wrote.
  long wait_ready(const std::string& ready, Proc& p) {
    if (!wait_until([&] { return exists(ready) || !p.running(); })) return -1;
    if (!exists(ready)) return -1;
    return std::stol(read_file(ready));
  }

  // The pid a launcher printed on its first line ("pid N").
  static long printed_pid(const std::string& out) {
    const auto ls = lines_of(out);
    if (ls.empty() || !ls[0].starts_with("pid ")) return -1;
    return std::stol(ls[0].substr(4));
  }

  // Value printed by the launcher's --print-env NAME.
  static std::optional<std::string> printed_env(const std::string& out, const std::string& name) {
    for (const auto& l : lines_of(out)) {
      if (l == "env " + name + " unset") return std::nullopt;
      if (l.starts_with("env " + name + "=")) return l.substr(5 + name.size());
    }
    ADD_FAILURE() << "launcher did not print " << name << " in: " << out;
    return std::nullopt;
  }

  // Waits until `n` records of `pid` come after index `from` in the record
  // file, then returns those after `from + skip`.
  std::vector<Record> records_after(long pid, std::size_t from, std::size_t skip, std::size_t n) {
    std::vector<Record> mine;
    wait_until([&] {
      mine.clear();
      const auto all = records();
      for (std::size_t i = from; i < all.size(); ++i)
        if (all[i].pid == pid) mine.push_back(all[i]);
      return mine.size() >= skip + n;
    });
    if (mine.size() < skip + n) {
      ADD_FAILURE() << "only " << mine.size() << " launches of pid " << pid << " after record " << from;
      return {};
    }
    return {mine.begin() + static_cast<long>(skip), mine.end()};
  }

  std::string dir_;
  std::string record_;
  Env env_;
  std::vector<std::unique_ptr<Proc>> procs_;
  std::vector<std::string> cleanup_;
};

std::string pid_line(long pid, const std::string& what, const std::string& value) {
  return "pid " + std::to_string(pid) + "'s " + what + ": " + value + "\n";
}

// --- 1, 2: launches under -t and under a hex mask --------------------------------

class LauncherKinds : public E2E, public ::testing::WithParamInterface<std::string> {};

TEST_P(LauncherKinds, TpcListMasksEveryLaunch) {
  const std::string launcher = GetParam();
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", launcher, "--kernels", "5"});
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0));
  const long pid = printed_pid(r.out);
  // nvtaskset execs the command: same process, so the exit status is the user's.
  EXPECT_EQ(pid, p.pid) << r;
  const auto recs = records();
  ASSERT_EQ(recs.size(), 5u) << read_file(record_);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.pid, pid);
    EXPECT_EQ(rec.layout, "v3");
    EXPECT_EQ(rec.valid, 1);
    EXPECT_EQ(rec.mask, "0xfffffffffffffff0");  // ~0xf over the V03 64-bit field
  }
}

TEST_P(LauncherKinds, RunsUnchangedWithoutNvtaskset) {
  // The test programs themselves: they reach the stand-in without the shim,
  // and then nothing touches CUDA's own mask.
  Env env = env_;
  env["FAKECUDA_INITIAL_MASK"] = "0x5";
  const Result r = run({GetParam(), "--kernels", "3"}, env);
  ASSERT_TRUE(ExitedWith(r, 0));
  const auto recs = records();
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, "0x5") << rec;
}

// --partition-sm-count: the task's MULTIPROCESSOR_COUNT is its partition's
// SMs (2 per TPC), through the export and through cuGetProcAddress (the
// dlopen launcher), and only when asked. The stand-in has 16 SMs.
TEST_P(LauncherKinds, PartitionSmCountIsWhatTheTaskReads) {
  Result r = run({kCli, "--no-mps", "-t", "0-2", GetParam(), "--print-sms"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 16\n"), std::string::npos) << "off by default: " << r;
  for (const std::string flag : {"--partition-sm-count", "--hide-unallocated"}) {
    r = run({kCli, "--no-mps", flag, "-t", "0-2", GetParam(), "--print-sms"});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_NE(r.out.find("sms 6\nsms-end 6\n"), std::string::npos) << flag << ": " << r;
    EXPECT_EQ(r.err, "") << r;
  }
  // The same through the environment, as for the other options.
  Env env = env_;
  env["NVTASKSET_SM_COUNT"] = "Partition";
  r = run({kCli, "--no-mps", "0x3", GetParam(), "--print-sms"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 4\n"), std::string::npos) << r;
  // An unknown value is said, and the GPU's count stays.
  env["NVTASKSET_SM_COUNT"] = "half";
  r = run({kCli, "--no-mps", "-t", "0-2", GetParam(), "--print-sms"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 16\n"), std::string::npos) << r;
  EXPECT_NE(r.err.find("NVTASKSET_SM_COUNT=half: unknown value"), std::string::npos) << r;
  // Never more than the driver says (a physical mask may name more bits than exist).
  r = run({kCli, "--no-mps", "--partition-sm-count", "--physical", "0xffffffffff", GetParam(), "--print-sms"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 16\n"), std::string::npos) << r;
}

INSTANTIATE_TEST_SUITE_P(E2E, LauncherKinds, ::testing::Values(kLauncher, kLauncherDlopen),
                         [](const auto& info) { return fs::path(info.param).filename().string(); });

struct MaskCase {
  std::string name;
  std::vector<std::string> spec;  // arguments between --no-mps and the command
  std::string layout_env;         // FAKECUDA_TMD_LAYOUT, or "" for the default
  std::string layout;             // expected layout in the records
  std::string disable;            // expected disable mask
};

void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

class Masks : public E2E, public ::testing::WithParamInterface<MaskCase> {};

TEST_P(Masks, EveryLaunchGetsTheMask) {
  const MaskCase& c = GetParam();
  Env env = env_;
  if (!c.layout_env.empty()) env["FAKECUDA_TMD_LAYOUT"] = c.layout_env;
  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), c.spec.begin(), c.spec.end());
  argv.insert(argv.end(), {kLauncher, "--kernels", "3"});
  const Result r = run(argv, env);
  ASSERT_TRUE(ExitedWith(r, 0));
  const auto recs = records();
  ASSERT_EQ(recs.size(), 3u) << read_file(record_);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.layout, c.layout) << rec;
    EXPECT_EQ(rec.valid, 1) << rec;
    EXPECT_EQ(rec.mask, c.disable) << rec;
  }
}

INSTANTIATE_TEST_SUITE_P(
    E2E, Masks,
    ::testing::Values(MaskCase{"HexMask", {"0xf0"}, "", "v3", disable64(0xf0)},
                      MaskCase{"HexMaskWithout0x", {"f0"}, "", "v3", disable64(0xf0)},
                      MaskCase{"ListWithStride", {"-t", "0-7:2"}, "", "v3", disable64(0x55)},
                      MaskCase{"ListOfRanges", {"-t", "1,3-4"}, "", "v3", disable64(0x1a)},
                      MaskCase{"AllTpcs", {"-t", "0-7"}, "", "v3", disable64(0xff)},
                      MaskCase{"LayoutV01", {"-t", "0-3"}, "v1", "v1", disable64(0xf)}),
    [](const auto& info) { return info.param.name; });

// --- 3: Hopper and Blackwell layouts with --physical -------------------------

struct PhysicalCase {
  std::string name;
  std::string cc;
  std::string layout;
  std::string mask;
  std::string disable;
};

void PrintTo(const PhysicalCase& c, std::ostream* os) { *os << c.name; }

class Physical : public E2E, public ::testing::WithParamInterface<PhysicalCase> {};

TEST_P(Physical, RawBitsReachThe128BitField) {
  const PhysicalCase& c = GetParam();
  Env env = env_;
  env["FAKECUDA_CC"] = c.cc;
  const Result r = run({kCli, "--no-mps", "--physical", c.mask, kLauncher, "--kernels", "3"}, env);
  ASSERT_TRUE(ExitedWith(r, 0));
  const auto recs = records();
  ASSERT_EQ(recs.size(), 3u) << read_file(record_);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.layout, c.layout) << rec;
    EXPECT_EQ(rec.valid, 1) << rec;  // V04/V05: the mask counts only with its valid bit
    EXPECT_EQ(rec.mask, c.disable) << rec;
  }
}

INSTANTIATE_TEST_SUITE_P(
    E2E, Physical,
    ::testing::Values(PhysicalCase{"Hopper", "9.0", "v4", "0xffff", disable128(0, 0xffff)},
                      // bit 80: working Hopper TPCs sit above bit 63 (docs/hardware.md)
                      PhysicalCase{"HopperHighBits", "9.0", "v4", "0x10000000000000000ffff",
                                   disable128(0x10000, 0xffff)},
                      PhysicalCase{"Blackwell", "10.0", "v5", "0xffff", disable128(0, 0xffff)}),
    [](const auto& info) { return info.param.name; });

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

// --- 4: -p query and live change in the middle of a run ----------------------

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

// --- 5: a process started without nvtaskset (system-wide mode) -------------------

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
    env["LD_PRELOAD"] = kShim;
    if (also_path) env["LD_LIBRARY_PATH"] = shim_dir();
    env["NVTASKSET_PARTITION"] = *partition;
    r = run({kLauncher, "--kernels", "3"}, env);
    ASSERT_TRUE(ExitedWith(r, 0));
    const auto recs = records_of(printed_pid(r.out));
    ASSERT_EQ(recs.size(), 3u);
    for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0xc)) << rec;
  }
}

// --- 6: bad PIDs -----------------------------------------------------------------

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

// --- 7: bad lists and masks never start the command --------------------------------

struct BadSpec {
  std::string name;
  std::vector<std::string> args;  // between --no-mps and the command
};

void PrintTo(const BadSpec& c, std::ostream* os) { *os << c.name; }

class BadSpecs : public E2E, public ::testing::WithParamInterface<BadSpec> {};

TEST_P(BadSpecs, RejectedBeforeTheCommandRuns) {
  // Control: the same command with a good list runs, so the failure below is
  // the bad argument's, not the setup's.
  const std::string control = path("control");
  ASSERT_TRUE(ExitedWith(run({kCli, "--no-mps", "-t", "0", "touch", control}), 0));
  ASSERT_TRUE(exists(control));
  ::unlink(record_.c_str());

  const std::string marker = path("marker");
  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), GetParam().args.begin(), GetParam().args.end());
  argv.insert(argv.end(), {"touch", marker});
  const Result r = run(argv);
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_FALSE(exists(marker)) << "the command ran" << r;
  EXPECT_FALSE(exists(record_));
}

INSTANTIATE_TEST_SUITE_P(E2E, BadSpecs,
                         ::testing::Values(BadSpec{"EmptyList", {"-t", ""}},                     //
                                           BadSpec{"OpenRange", {"-t", "1-"}},                   //
                                           BadSpec{"LeadingDash", {"-t", "-1"}},                 //
                                           BadSpec{"Letter", {"-t", "a"}},                       //
                                           BadSpec{"ReversedRange", {"-t", "3-1"}},              //
                                           BadSpec{"ZeroStride", {"-t", "0-7:0"}},               //
                                           BadSpec{"EmptyItem", {"-t", "0,,1"}},                 //
                                           BadSpec{"TpcBeyondDevice", {"-t", "8"}},              //
                                           BadSpec{"RangeBeyondDevice", {"-t", "0-8"}},          //
                                           BadSpec{"EmptyMask", {"0x0"}},                        //
                                           BadSpec{"NotHex", {"0xzz"}},                          //
                                           BadSpec{"MaskOf33Digits", {"0x1" + std::string(32, '0')}},  //
                                           BadSpec{"MaskBeyondDevice", {"0x100"}},               //
                                           BadSpec{"UnknownOption", {"--bogus", "-t", "0"}}),
                         [](const auto& info) { return info.param.name; });

TEST_F(E2E, MissingCommandIsAnError) {
  const Result r = run({kCli, "--no-mps", "-t", "0"});
  EXPECT_TRUE(FailedWithOneLine(r));
}

// --- 8: the shim never loads itself as the real driver -------------------------------

TEST_F(E2E, RealDriverPointingAtTheShimIsAnError) {
  env_["NVTASKSET_REAL_LIBCUDA"] = kShim;
  const std::string marker = path("marker");
  Result r = run({kCli, "--no-mps", "-t", "0-3", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_FALSE(exists(marker));

  // A program that loads the shim directly, told the same: it must neither
  // hang nor crash, nor run kernels.
  Env env = env_;
  env["LD_LIBRARY_PATH"] = shim_dir();
  r = run({kLauncher, "--kernels", "1"}, env);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_TRUE(r.exited) << r;
  EXPECT_NE(r.code, 0) << r;
  EXPECT_FALSE(exists(record_));
}

TEST_F(E2E, ShimCopyOnLibraryPathIsNeverLoaded) {
  // A copy of the shim, alone in a directory, looks exactly like a driver to
  // anyone searching for libcuda.so.1.
  const std::string decoy_dir = path("decoy");
  fs::create_directories(decoy_dir);
  const std::string decoy = decoy_dir + "/libcuda.so.1";
  fs::copy_file(kShim, decoy);
  Env env = env_;
  env.erase("NVTASKSET_REAL_LIBCUDA");
  env["LD_LIBRARY_PATH"] = decoy_dir;
  // The loader logs every file it tries or loads, in every process.
  env["LD_DEBUG"] = "files,libs";
  env["LD_DEBUG_OUTPUT"] = path("ld");
  auto decoy_seen = [&] {
    std::vector<std::string> hits;
    for (const auto& f : fs::directory_iterator(dir_))
      if (f.path().filename().string().starts_with("ld.")) {
        const std::string log = read_file(f.path().string());
        for (const auto& l : lines_of(log))
          if (l.find(decoy) != std::string::npos) hits.push_back(l);
      }
    return hits;
  };

  // Through nvtaskset: without a real driver the CLI must fail cleanly; with
  // one (a GPU machine) the task runs; either way the decoy is never loaded.
  Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--print-libcuda", "--kernels", "1"}, env);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_TRUE(r.exited) << r;
  if (r.code != 0) {
    EXPECT_TRUE(FailedWithOneLine(r));
  }
  EXPECT_EQ(r.out.find(decoy), std::string::npos) << r;
  EXPECT_TRUE(decoy_seen().empty()) << "loader tried the decoy:\n" << ::testing::PrintToString(decoy_seen());

  // A program that loads the real shim first (as nvtaskset arranges), with
  // the decoy behind it on the path: the shim looks for the driver and must
  // not take the decoy.
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_))
    if (f.path().filename().string().starts_with("ld.")) fs::remove(f.path(), ec);
  env["LD_LIBRARY_PATH"] = shim_dir() + ":" + decoy_dir;
  r = run({kLauncher, "--print-libcuda", "--kernels", "1"}, env);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_TRUE(r.exited) << r;
  // The launcher got to main and listed what it had mapped: the shim, not the decoy.
  EXPECT_NE(r.out.find("libcuda " + fs::canonical(kShim).string()), std::string::npos) << r;
  EXPECT_EQ(r.out.find(decoy), std::string::npos) << r;
  EXPECT_TRUE(decoy_seen().empty()) << "loader tried the decoy:\n" << ::testing::PrintToString(decoy_seen());
  // The loader log exists, so the check above could have failed.
  bool logged = false;
  for (const auto& f : fs::directory_iterator(dir_))
    logged |= f.path().filename().string().starts_with("ld.") &&
              read_file(f.path().string()).find(shim_dir()) != std::string::npos;
  EXPECT_TRUE(logged) << "no loader log mentions the shim directory";
}

// --- 9: children ----------------------------------------------------------------------

TEST_F(E2E, ForkedChildGetsItsOwnRegionWithTheParentsPartition) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--fork", "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const long child = wait_ready(ready + ".child", p);
  ASSERT_GT(child, 0) << p.wait();
  EXPECT_NE(p.out().find("child " + std::to_string(child) + "\n"), std::string::npos) << p.out();

  Result q = run({kCli, "-p", std::to_string(child)});
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(child, "current TPC list", "0-3")) << q;
  EXPECT_NE(region_fd(child), "");

  // Its own region: moving the child leaves the parent where it was.
  q = run({kCli, "-p", "-t", "6-7", std::to_string(child)});
  const std::size_t before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(child, "current TPC list", "0-3") + pid_line(child, "new TPC list", "6-7")) << q;
  for (const auto& rec : records_after(child, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0xc0)) << rec;
  for (const auto& rec : records_after(pid, before, 0, 3)) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
  q = run({kCli, "-p", std::to_string(pid)});
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3")) << q;

  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
  const auto child_recs = records_of(child);
  ASSERT_FALSE(child_recs.empty());
  EXPECT_EQ(child_recs.front().mask, disable64(0xf)) << "the child's first launch was not masked";
}

TEST_F(E2E, ExecdChildGetsTheParentsCurrentPartition) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--exec-child", "--kernels", "3", "--until-file", until,
                   "--interval-ms", "5", "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const Result q = run({kCli, "-p", "-t", "4-5", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0));
  touch(until);
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0));
  long child = -1;
  for (const auto& l : lines_of(r.out))
    if (l.starts_with("child ")) child = std::stol(l.substr(6));
  ASSERT_GT(child, 0) << r;
  const auto recs = records_of(child);
  ASSERT_EQ(recs.size(), 3u) << read_file(record_);
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0x30)) << rec;
}

// --- 10: an unknown TMD layout while partitioned ----------------------------------------

// Lines of `text` that mention the TMD (also called QMD), case-insensitively.
std::size_t tmd_lines(const std::string& text) {
  std::size_t n = 0;
  for (auto l : lines_of(text)) {
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
    if (l.find("tmd") != std::string::npos || l.find("qmd") != std::string::npos) ++n;
  }
  return n;
}

// nvtaskset run from inside a partitioned CUDA process: the partition the
// user just asked for wins over the one the new task would inherit from its
// (partitioned) parent.
TEST_F(E2E, NvtasksetInsideAPartitionedTaskAppliesItsOwnPartition) {
  const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "1", "--spawn", kCli, "--no-mps", "-t",
                        "4-5", kLauncher, "--kernels", "2"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  const auto recs = records();
  ASSERT_EQ(recs.size(), 3u) << read_file(record_);
  const long parent = recs[0].pid;
  EXPECT_EQ(recs[0].mask, disable64(0xf));
  for (const auto& rec : recs)
    if (rec.pid != parent) {
      EXPECT_EQ(rec.mask, disable64(0x30)) << rec;
    }
}

// A partition is per GPU: with two devices, each launch gets the mask of its
// own device (the shim asks the driver which device the launch is on), and a
// device without a partition is left alone.
TEST_F(E2E, EachGpuGetsItsOwnPartition) {
  env_["FAKECUDA_DEVICES"] = "2";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  for (const auto& [device, want] : std::vector<std::pair<std::string, std::string>>{
           {"0", disable64(0xf)}, {"1", disable64(0x30)}}) {
    ::unlink(record_.c_str());
    const Result r = run({kCli, "--no-mps", "-d", "0", "-t", "0-3", "-d", "1", "-t", "4-5", kLauncher, "--device",
                          device, "--kernels", "2"});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    const auto recs = records();
    ASSERT_EQ(recs.size(), 2u);
    for (const auto& rec : recs) EXPECT_EQ(rec.mask, want) << "device " << device << ": " << rec;
  }
  // Only device 1 partitioned: device 0's launches keep CUDA's own mask.
  ::unlink(record_.c_str());
  Result r = run({kCli, "--no-mps", "-d", "1", "-t", "4-5", kLauncher, "--device", "0", "--kernels", "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(records().size(), 1u);
  EXPECT_EQ(records()[0].mask, "0x5");
  // By full UUID; a UUID prefix that matches both devices is refused.
  for (const std::string spec : {"GPU-fa4ecda0-0000-4000-8000-000000000001", "GPU-fa4ecda0-0000-4000-8000-00000000000"}) {
    ::unlink(record_.c_str());
    r = run({kCli, "--no-mps", "-d", spec, "-t", "4-5", kLauncher, "--device", "1", "--kernels", "1"});
    if (spec.size() == 40) {
      ASSERT_TRUE(ExitedWith(r, 0)) << r;
      EXPECT_EQ(records()[0].mask, disable64(0x30));
    } else {
      EXPECT_TRUE(FailedWithOneLine(r)) << "an ambiguous UUID prefix must be refused: " << r;
    }
  }
}

// --partition-sm-count per GPU: each device answers with its own partition;
// a device without one with the driver's count.
TEST_F(E2E, PartitionSmCountIsPerGpu) {
  env_["FAKECUDA_DEVICES"] = "2";
  for (const auto& [device, want] : std::vector<std::pair<std::string, std::string>>{{"0", "sms 16"}, {"1", "sms 4"}}) {
    const Result r = run({kCli, "--no-mps", "--partition-sm-count", "-d", "1", "-t", "4-5", kLauncher, "--device",
                          device, "--print-sms"});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_NE(r.out.find(want + "\n"), std::string::npos) << "device " << device << ": " << r;
  }
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

// The device cache (topology/include/nvtaskset/device_cache.hpp): with the
// GPUs described in procfs (here a stand-in tree), the second launch takes the
// device list from the cache and the CLI never initialises the driver; any
// change to what decides CUDA's enumeration, and a cache file others could
// have written, make the CLI ask the driver again. Without that procfs tree
// (no NVIDIA kernel driver) there is no cache at all.
class DeviceCache : public E2E {
 protected:
  void SetUp() override {
    E2E::SetUp();
    proc_ = path("proc");
    fs::create_directories(proc_ + "/driver/nvidia/gpus/0000:01:00.0");
    fs::create_directories(proc_ + "/driver/nvidia/gpus/0000:02:00.0");
    write(proc_ + "/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module  580.159.04\n");
    write(gpu_info(1), "Model: \t\t Stand-in\nGPU UUID: \t GPU-fa4ecda0-0000-4000-8000-000000000000\n");
    write(gpu_info(2), "Model: \t\t Stand-in\nGPU UUID: \t GPU-fa4ecda0-0000-4000-8000-000000000001\n");
    env_["NVTASKSET_NVDEBUG_ROOT"] = proc_;
    env_["FAKECUDA_INIT_LOG"] = path("inits");
    env_["FAKECUDA_DEVICES"] = "2";
  }
  static void write(const std::string& file, const std::string& text) { std::ofstream(file) << text; }
  std::string gpu_info(int bus) const {
    return proc_ + "/driver/nvidia/gpus/0000:0" + std::to_string(bus) + ":00.0/information";
  }
  // Launches on `device`, checks the mask the kernel got, and returns the
  // programs that called cuInit ("nvtaskset" is the CLI before its exec).
  std::string launch(const std::string& device, const Env& env) {
    ::unlink(path("inits").c_str());
    ::unlink(record_.c_str());
    const Result r = run({kCli, "--no-mps", "-d", device, "-t", "1-2", kLauncher, "--device", device}, env);
    EXPECT_TRUE(ExitedWith(r, 0)) << r;
    const auto recs = records();
    EXPECT_EQ(recs.size(), 1u);
    for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0x6)) << rec;
    return read_file(path("inits"));
  }
  std::vector<std::string> cache_files() {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path("cache/nvtaskset"), ec))
      if (e.path().filename().string().starts_with("devices-")) out.push_back(e.path().string());
    return out;
  }
  std::string proc_;
};

TEST_F(DeviceCache, SecondLaunchSkipsTheDriverUntilSomethingChanges) {
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
  ASSERT_EQ(cache_files().size(), 1u);
  struct stat st {};
  ASSERT_EQ(::stat(cache_files()[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(launch("1", env_), "init launcher\n") << "fresh cache: the CLI must not initialise the driver";
  EXPECT_EQ(launch("0", env_), "init launcher\n");
  // A device that does not exist is refused from the cache as from the driver.
  Result r = run({kCli, "--no-mps", "-d", "2", "-t", "1", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  // What decides CUDA's enumeration changes: the driver is asked again.
  Env env = env_;
  env["CUDA_VISIBLE_DEVICES"] = "0,1";
  EXPECT_EQ(launch("1", env), "init nvtaskset\ninit launcher\n") << "CUDA_VISIBLE_DEVICES";
  EXPECT_EQ(launch("1", env), "init launcher\n");
  env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  EXPECT_EQ(launch("1", env), "init nvtaskset\ninit launcher\n") << "CUDA_DEVICE_ORDER";
  write(gpu_info(2), "Model: \t\t Stand-in\nGPU UUID: \t GPU-fa4ecda0-0000-4000-8000-000000000009\n");
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << "another GPU";
  write(proc_ + "/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module  580.999.01\n");
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << "another driver";
  fs::create_directories(proc_ + "/driver/nvidia/capabilities/gpu0/mig/gi1/ci0");
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << "a MIG instance";
  EXPECT_EQ(launch("1", env_), "init launcher\n");
  fs::remove(gpu_info(2));
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << "a GPU that cannot be described";
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
}

TEST_F(DeviceCache, UntrustedOrBrokenFilesAreNotUsed) {
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
  ASSERT_EQ(cache_files().size(), 1u);
  const std::string file = cache_files()[0];
  ::chmod(file.c_str(), 0622);  // others could have written it
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
  ASSERT_EQ(cache_files().size(), 1u);
  EXPECT_EQ(launch("1", env_), "init launcher\n") << "rewritten owner-only";
  // A device list that does not parse, or whose driver file changed.
  write(file, "{\"schema\": \"nvtaskset-devices/1\", \"key\": 7}");
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
  const std::string text = read_file(file);
  ASSERT_NE(text.find("\"identity\""), std::string::npos);
  std::string edited = text;
  const auto at = edited.find(":", edited.find("\"identity\"") + 11);
  edited.insert(at + 3, "9");
  write(file, edited);
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << edited;
}

TEST_F(E2E, NoDeviceCacheWithoutTheKernelDriversGpuList) {
  env_["FAKECUDA_INIT_LOG"] = path("inits");
  env_["NVTASKSET_NVDEBUG_ROOT"] = path("empty-proc");
  for (int i = 0; i < 2; ++i) {
    ::unlink(path("inits").c_str());
    const Result r = run({kCli, "--no-mps", "-t", "1", kLauncher});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_EQ(read_file(path("inits")), "init nvtaskset\ninit launcher\n");
  }
}

TEST_F(E2E, UnknownTmdLayoutStopsThePartitionedTask) {
  env_["FAKECUDA_TMD_LAYOUT"] = "unknown";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "3"});
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_FALSE(r.exited && r.code == 0) << "a partitioned task ran unpartitioned" << r;
  const auto ls = lines_of(r.err);
  ASSERT_EQ(ls.size(), 1u) << r;
  EXPECT_EQ(tmd_lines(r.err), 1u) << r;
  for (const auto& rec : records()) EXPECT_EQ(rec.mask, "0x5") << "a launch ran with a guessed mask: " << rec;
}

TEST_F(E2E, UnknownTmdLayoutWithWarnRunsUnmasked) {
  env_["FAKECUDA_TMD_LAYOUT"] = "unknown";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  env_["NVTASKSET_ON_UNSUPPORTED"] = "warn";
  const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "5"});
  ASSERT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(tmd_lines(r.err), 1u) << "the warning must appear once" << r;
  const auto recs = records();
  ASSERT_EQ(recs.size(), 5u);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.layout, "unknown") << "TMD bytes changed: " << rec;
    EXPECT_EQ(rec.mask, "0x5") << rec;
  }
}

// A partition names its GPU by UUID. A task that changed CUDA_VISIBLE_DEVICES
// (a wrapper, or a launcher giving each worker its own GPU) may see none of
// its partitioned GPUs: stopped at cuInit in one line, never run unmasked
// while nvtaskset reports a partition. The stand-in applies
// CUDA_VISIBLE_DEVICES at cuInit as the driver does (tests/fakecuda).
TEST_F(E2E, ATaskThatSeesNoneOfItsPartitionedGpusIsStopped) {
  env_["FAKECUDA_DEVICES"] = "2";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  const Result r =
      run({kCli, "--no-mps", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1", kLauncher, "--kernels", "3"});
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_EQ(r.signal, SIGABRT) << r;
  ASSERT_EQ(lines_of(r.err).size(), 1u) << r;
  EXPECT_NE(r.err.find("the partition is for GPU-fa4ecda0-0000-4000-8000-000000000000, which this process does "
                       "not see (1 GPU, CUDA_VISIBLE_DEVICES=1)"),
            std::string::npos)
      << r;
  EXPECT_TRUE(records().empty()) << "a kernel ran unmasked";
}

TEST_F(E2E, APartitionFollowsItsGpuWhateverOrdinalTheTaskGivesIt) {
  env_["FAKECUDA_DEVICES"] = "2";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  // -d 1: the task's only GPU, its device 0, is that GPU.
  Result r = run({kCli, "--no-mps", "-d", "1", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1", kLauncher, "--kernels",
                  "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  auto recs = records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].mask, disable64(0x3)) << recs[0];
  // Reordered: GPU 0 is the task's device 1, partitioned; its device 0 (GPU 1)
  // has no partition and is unrestricted, as documented.
  r = run({kCli, "--no-mps", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1,0", kLauncher, "--device", "1", "--kernels",
           "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(r.err.empty()) << r;
  r = run({kCli, "--no-mps", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1,0", kLauncher, "--device", "0", "--kernels",
           "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  recs = records();
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[1].mask, disable64(0x3)) << recs[1];
  EXPECT_EQ(recs[2].mask, "0x5") << recs[2];
}

TEST_F(E2E, ATaskThatSeesNoneOfItsGpusRunsUnmaskedOnlyWhenToldAndSaysSo) {
  env_["FAKECUDA_DEVICES"] = "2";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  env_["NVTASKSET_ON_UNSUPPORTED"] = "warn";
  Proc& p = start({kCli, "--no-mps", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1", kLauncher, "--until-file",
                   path("until"), "--interval-ms", "5", "--ready-file", path("ready")});
  const long pid = wait_ready(path("ready"), p);
  ASSERT_GT(pid, 0) << p.err();
  // -p neither reports nor changes a partition that does not apply.
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{kCli, "-p", std::to_string(pid)}, {kCli, "-p", "-t", "2", std::to_string(pid)}}) {
    const Result q = run(argv);
    EXPECT_TRUE(FailedWithOneLine(q)) << q;
    EXPECT_NE(q.err.find("runs on all TPCs: it sees none of the GPUs its partition is for"), std::string::npos) << q;
  }
  // --status does not list TPCs it does not hold.
  const Result st = run({kCli, "--status", "--json"});
  EXPECT_EQ(nlohmann::json::parse(st.out)["tasks"].size(), 0u) << st.out;
  touch(path("until"));
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(lines_of(r.err).size(), 1u) << r;
  EXPECT_NE(r.err.find("its kernels run on all TPCs (NVTASKSET_ON_UNSUPPORTED=warn)"), std::string::npos) << r;
  for (const auto& rec : records()) EXPECT_EQ(rec.mask, "0x5") << rec;
}

// --- 11: environment and exit status ------------------------------------------------------

TEST_F(E2E, EnvironmentOfTheTask) {
  const std::vector<std::string> print{"--print-env", "CUDA_DEVICE_MAX_CONNECTIONS",
                                       "--print-env", "CUDA_DEVICE_MAX_COPY_CONNECTIONS",
                                       "--print-env", "LD_LIBRARY_PATH",
                                       "--print-env", "NVTASKSET_PARTITION"};
  auto launch = [&](const Env& env) {
    std::vector<std::string> argv{kCli, "--no-mps", "-t", "0", kLauncher};
    argv.insert(argv.end(), print.begin(), print.end());
    return run(argv, env);
  };
  auto shim_first = [](const std::string& v) {
    const std::string first = v.substr(0, v.find(':'));
    std::error_code ec;
    return fs::equivalent(first, shim_dir(), ec);
  };

  Result r = launch(env_);
  ASSERT_TRUE(ExitedWith(r, 0));
  // Outside MPS, CUDA's default already gives 8 kernel queues (and a plain
  // process's 4 copy queues): left alone (an MPS client's, EnvironmentOfAnMpsClient).
  EXPECT_EQ(printed_env(r.out, "CUDA_DEVICE_MAX_CONNECTIONS").value_or("<unset>"), "<unset>");
  EXPECT_EQ(printed_env(r.out, "CUDA_DEVICE_MAX_COPY_CONNECTIONS").value_or("<unset>"), "<unset>");
  auto ldp = printed_env(r.out, "LD_LIBRARY_PATH");
  ASSERT_TRUE(ldp.has_value());
  // Exactly the shim dir: a trailing ':' would add the working directory.
  EXPECT_EQ(ldp->find(':'), std::string::npos) << *ldp;
  EXPECT_TRUE(shim_first(*ldp)) << *ldp;
  EXPECT_TRUE(printed_env(r.out, "NVTASKSET_PARTITION").has_value());

  Env env = env_;
  env["CUDA_DEVICE_MAX_CONNECTIONS"] = "4";
  env["LD_LIBRARY_PATH"] = "/opt/user/lib:/opt/other";
  r = launch(env);
  ASSERT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(printed_env(r.out, "CUDA_DEVICE_MAX_CONNECTIONS").value_or("<unset>"), "4");
  ldp = printed_env(r.out, "LD_LIBRARY_PATH");
  ASSERT_TRUE(ldp.has_value());
  EXPECT_TRUE(shim_first(*ldp)) << *ldp;
  EXPECT_TRUE(ldp->ends_with(":/opt/user/lib:/opt/other")) << *ldp;
  EXPECT_EQ(std::count(ldp->begin(), ldp->end(), ':'), 2) << *ldp;
}

TEST_F(E2E, ExitStatusIsTheCommands) {
  Result r = run({kCli, "--no-mps", "-t", "0", "sh", "-c", "exit 7"});
  EXPECT_TRUE(ExitedWith(r, 7));
  r = run({kCli, "--no-mps", "-t", "0", "sh", "-c", "exit 0"});
  EXPECT_TRUE(ExitedWith(r, 0));
  r = run({kCli, "--no-mps", "-t", "0", "sh", "-c", "kill -TERM $$"});
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_FALSE(r.exited) << r;
  EXPECT_EQ(r.signal, SIGTERM) << r;
}

TEST_F(E2E, CommandThatCannotRunExits127) {
  for (const std::string& cmd : {std::string("/nonexistent/command"), std::string("nvtaskset-no-such-command")}) {
    SCOPED_TRACE(cmd);
    const Result r = run({kCli, "--no-mps", "-t", "0", cmd});
    EXPECT_TRUE(FailedWithOneLine(r, 127));
  }
}

// --- 12: control-region lifetime ---------------------------------------------------------

TEST_F(E2E, RegionLivesExactlyAsLongAsTheTask) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string region = region_fd(pid);
  ASSERT_NE(region, "") << "pid " << pid << " holds no control region";
  struct stat st;
  ASSERT_EQ(::stat(region.c_str(), &st), 0) << region << ": " << std::strerror(errno);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "region mode " << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(st.st_uid, ::getuid());

  // A PID that is gone: taskset's answer.
  Proc& gone = start({"true"});
  ASSERT_TRUE(ExitedWith(gone.wait(), 0));
  const Result q = run({kCli, "-p", std::to_string(gone.pid)});
  EXPECT_TRUE(FailedWithOneLine(q));
  EXPECT_EQ(q.err, "nvtaskset: pid " + std::to_string(gone.pid) + ": no such process\n") << q;

  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
  // The region lived in the task: nothing of it is left anywhere.
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator("/dev/shm"))
    if (f.path().filename().string().find("nvtaskset." + std::to_string(pid)) != std::string::npos)
      left.push_back(f.path().string());
  EXPECT_TRUE(left.empty()) << ::testing::PrintToString(left);
}

TEST_F(E2E, LeavesNoTemporaryFiles) {
  // nvtaskset execs the command, so nothing it created in $TMPDIR for itself
  // can be cleaned up afterwards: it must be gone before the exec.
  ASSERT_TRUE(ExitedWith(run({kCli, "--no-mps", "-t", "0-3", kLauncher}), 0));
  ASSERT_EQ(records().size(), 1u);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(path("tmp"))) left.push_back(f.path().string());
  EXPECT_TRUE(left.empty()) << "left in $TMPDIR: " << ::testing::PrintToString(left);
}

// --- 13: Hopper needs a topology ---------------------------------------------------------

TEST_F(E2E, HopperLogicalListWithoutTopologyIsAnError) {
  env_["FAKECUDA_CC"] = "9.0";
  const std::string marker = path("marker");
  const Result r = run({kCli, "--no-mps", "-t", "0-3", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_FALSE(exists(marker));
  EXPECT_FALSE(exists(record_));
}

// --- topology files: translation on a Hopper-like layout, end to end ------------------------

// The stand-in's device 0 (its UUID is fixed, fakecuda.cpp) as a Hopper part
// with 8 TPCs whose mask bits are scattered, not monotone, some above 63,
// like an H200's: TPC k -> bit kBits[k]. GPC 0 = TPCs 0,2,4,6; GPC 1 = 1,3,5;
// TPC 7's GPC is unknown.
constexpr std::array<unsigned, 8> kBits = {9, 3, 70, 12, 100, 5, 64, 1};
const std::string kStandInUuid = "GPU-fa4ecda0-0000-4000-8000-000000000000";

std::string hopper_topology_json(const std::string& uuid = kStandInUuid, const std::array<unsigned, 8>& bits = kBits) {
  std::string tpcs;
  const char* gpc[8] = {"0", "1", "0", "1", "0", "1", "0", "null"};
  for (unsigned k = 0; k < 8; ++k)
    tpcs += std::string(k ? "," : "") + "{\"tpc\": " + std::to_string(k) + ", \"bit\": " + std::to_string(bits[k]) +
            ", \"gpc\": " + gpc[k] + ", \"cluster_capable\": " + (k == 7 ? "false" : "true") + "}";
  return "{\"schema\": \"nvtaskset-topology/1\", \"device\": {\"name\": \"Stand-in GPU\", \"uuid\": \"" + uuid +
         "\", \"pci_bus_id\": \"0000:01:00.0\", \"compute_capability\": \"9.0\", \"sm_count\": 16, "
         "\"driver_version\": 13000, \"driver_release\": \"\"}, \"source\": \"file\", \"calibrated_at\": null, "
         "\"calibration_ms\": null, \"tpcs\": [" + tpcs + "], \"gpcs\": ["
         "{\"gpc\": 0, \"tpcs\": [0, 2, 4, 6], \"max_cluster\": 8}, {\"gpc\": 1, \"tpcs\": [1, 3, 5], \"max_cluster\": 4}]}";
}

// The 128-bit disable mask the TMD must get when `tpcs` are enabled.
std::string hopper_disable(const std::vector<unsigned>& tpcs) {
  std::uint64_t lo = 0, hi = 0;
  for (unsigned k : tpcs) (kBits[k] < 64 ? lo : hi) |= std::uint64_t{1} << (kBits[k] % 64);
  return disable128(hi, lo);
}

class TopologyFile : public E2E {
 protected:
  void SetUp() override {
    E2E::SetUp();
    env_["FAKECUDA_CC"] = "9.0";
    file_ = path("topology.json");
    std::ofstream(file_) << hopper_topology_json();
  }
  std::string file_;
};

TEST_F(TopologyFile, ListsBecomeTheChipsPhysicalBits) {
  Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kLauncher, "--kernels", "2"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  auto recs = records();
  ASSERT_EQ(recs.size(), 2u);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.layout, "v4");
    EXPECT_EQ(rec.valid, 1);
    EXPECT_EQ(rec.mask, hopper_disable({0, 1})) << rec;  // bits 9 and 3, not 0 and 1
  }
  // A GPC list, and the topology from the environment instead of the option.
  Env env = env_;
  env["NVTASKSET_TOPOLOGY"] = file_;
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "-g", "1", kLauncher, "--kernels", "1"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  recs = records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].mask, hopper_disable({1, 3, 5})) << recs[0];
  // A hex mask over logical TPCs: 0x44 = TPCs 2 and 6 = bits 70 and 64.
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "0x44", kLauncher, "--kernels", "1"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  recs = records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].mask, hopper_disable({2, 6})) << recs[0];
}

TEST_F(TopologyFile, LiveChangeTranslatesToo) {
  Env env = env_;
  env["NVTASKSET_TOPOLOGY"] = file_;
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0", kLauncher, "--until-file", until, "--interval-ms", "5", "--ready-file",
                   ready},
                  env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const Result q = run({kCli, "-p", "-g", "0", std::to_string(pid)}, env);
  const std::size_t before = records().size();
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  // The old partition was a TPC list: it is shown as one, not as GPC "0".
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0") + pid_line(pid, "new GPC list", "0")) << q;
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, hopper_disable({0, 2, 4, 6})) << rec;
  const Result again = run({kCli, "-p", std::to_string(pid)}, env);
  EXPECT_EQ(again.out, pid_line(pid, "current GPC list", "0")) << again;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(TopologyFile, TopologyPrintsGpcsAndUnknownTpcs) {
  Result r = run({kCli, "--topology", "--topology-file", file_});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("gpc 0 tpcs: 0 2 4 6\n"), std::string::npos) << r;
  EXPECT_NE(r.out.find("gpc 1 tpcs: 1 3 5\n"), std::string::npos) << r;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("gpc 0 mask bits: (9 64 70 100|9 70 100 64)\n"))) << r;
  EXPECT_NE(r.out.find("gpc unknown tpcs: 7\n"), std::string::npos) << r;
  r = run({kCli, "--topology", "--json", "--topology-file", file_});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("\"schema\": \"nvtaskset-topology/1\""), std::string::npos) << r;
}

TEST_F(TopologyFile, ImpossiblePartitionsAreRefusedBeforeTheCommandRuns) {
  const std::string marker = path("marker");
  for (const std::vector<std::string>& spec : std::vector<std::vector<std::string>>{
           {"-g", "2"},              // no such GPC
           {"-t", "8"},              // no such TPC
           {"--physical", "0x4"},    // bit 2 controls no TPC: kernels would never run
           {"-d", "1", "-t", "0"}})  // no such GPU
  {
    std::vector<std::string> argv{kCli, "--no-mps", "--topology-file", file_};
    argv.insert(argv.end(), spec.begin(), spec.end());
    argv.insert(argv.end(), {"touch", marker});
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << spec[0] << " " << spec[1];
    EXPECT_FALSE(exists(marker));
  }
  // A topology file for another GPU is an error, not a fallback.
  std::ofstream(file_) << hopper_topology_json("GPU-00000000-1111-2222-3333-444444444444");
  const Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_FALSE(exists(marker));
}

// --- --verify --------------------------------------------------------------------------------
// `nvtaskset --verify` runs its probe kernel in a process that loads the real
// shim; the stand-in runs that kernel, placing its blocks as a GPU does under
// the mask the shim left in the TMD (fakecuda.cpp, "Kernels"), on the chip
// FAKECUDA_TPC_BITS describes.

struct Verdict {
  bool ok;
  std::string label;  // "-t 0-7", "-g 1"
  std::string line;
};

std::vector<Verdict> verdicts(const std::string& out) {
  static const std::regex re("^(ok  |FAIL) (-[tg] [0-9,-]+)  \\([0-9]+ TPCs?\\): .+$");
  std::vector<Verdict> v;
  for (const auto& l : lines_of(out)) {
    std::smatch m;
    if (std::regex_match(l, m, re)) v.push_back({m[1] == "ok  ", m[2], l});
  }
  return v;
}

std::vector<std::string> labels(const std::vector<Verdict>& v) {
  std::vector<std::string> out;
  for (const auto& x : v) out.push_back(x.label);
  return out;
}

// The IDs of a list as nvtaskset prints it: "0-2,5".
std::set<unsigned> list_ids(const std::string& list) {
  std::set<unsigned> out;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const auto dash = item.find('-');
    const unsigned a = std::stoul(item.substr(0, dash));
    const unsigned b = dash == std::string::npos ? a : std::stoul(item.substr(dash + 1));
    for (unsigned k = a; k <= b; ++k) out.insert(k);
  }
  return out;
}

TEST_F(E2E, VerifyPassesWhenTheLayoutIsRight) {
  Proc& p = start({kCli, "--verify", "--seed", "7"});
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(r.err, "") << r;
  const auto ls = lines_of(r.out);
  ASSERT_GE(ls.size(), 3u) << r;
  EXPECT_EQ(ls[0], "device 0: Stand-in GPU " + kStandInUuid + ", 8 TPCs, 0 GPCs, layout from identity") << r;
  EXPECT_EQ(ls[1], "seed 7 (--seed 7 checks the same partitions)") << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 23u) << r;  // every TPC, the first, the last, 20 random lists (no GPCs known)
  EXPECT_EQ(v[0].line, "ok   -t 0-7  (8 TPCs): 32 blocks, all inside");
  EXPECT_EQ(v[1].label, "-t 0");
  EXPECT_EQ(v[2].label, "-t 7");
  for (const auto& x : v) EXPECT_TRUE(x.ok) << x.line;
  EXPECT_TRUE(std::regex_match(ls.back(), std::regex("PASS: all 23 partitions ran every block inside their TPCs "
                                                     "\\(seed 7, [0-9]+\\.[0-9] s\\)")))
      << r;
  // Every probe kernel went through the shim in one probe process, which
  // wrote each partition into its TMD: all TPCs first (from
  // NVTASKSET_PARTITION), then "-t 0" (written into its control region).
  const auto recs = records();
  ASSERT_GE(recs.size(), 23u) << read_file(record_);
  std::set<long> pids;
  for (const auto& rec : recs) pids.insert(rec.pid);
  EXPECT_EQ(pids.size(), 1u);
  EXPECT_NE(*pids.begin(), p.pid);
  EXPECT_EQ(recs[0].mask, disable64(0xff)) << recs[0];
  EXPECT_EQ(recs[1].mask, disable64(0x1)) << recs[1];
  // The probe process is gone with it, and left nothing in $TMPDIR.
  EXPECT_EQ(::kill(-p.pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(path("tmp"))) left.push_back(f.path().string());
  EXPECT_TRUE(left.empty()) << "left in $TMPDIR: " << ::testing::PrintToString(left);
}

TEST_F(E2E, VerifyChecksTheGpuItIsGiven) {
  env_["FAKECUDA_DEVICES"] = "2";
  const Result r = run({kCli, "--verify", "-d", "1", "--seed", "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(lines_of(r.out)[0].starts_with("device 1: Stand-in GPU GPU-fa4ecda0-0000-4000-8000-000000000001, "))
      << r;
  EXPECT_EQ(verdicts(r.out).size(), 23u) << r;
}

TEST_F(E2E, VerifySeedRepeatsARun) {
  const Result a = run({kCli, "--verify"});
  ASSERT_TRUE(ExitedWith(a, 0)) << a;
  std::smatch m;
  const auto ls = lines_of(a.out);
  ASSERT_GE(ls.size(), 2u) << a;
  ASSERT_TRUE(std::regex_match(ls[1], m, std::regex("seed ([0-9]+) \\(--seed \\1 checks the same partitions\\)")))
      << a;
  const Result b = run({kCli, "--verify", "--seed", m[1].str()});
  ASSERT_TRUE(ExitedWith(b, 0)) << b;
  EXPECT_EQ(labels(verdicts(a.out)), labels(verdicts(b.out)));
  const Result c = run({kCli, "--verify", "--seed", std::to_string(std::stoull(m[1].str()) + 1)});
  ASSERT_TRUE(ExitedWith(c, 0)) << c;
  EXPECT_NE(labels(verdicts(a.out)), labels(verdicts(c.out)));
}

TEST_F(E2E, VerifyErrorsAreOneLine) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--verify", "-d", "9"},
           {"--verify", "-d", "GPU-0123"},
           {"--verify", "-t", "0-3"},
           {"--verify", "-d", "0", "-g", "0"},
           {"--verify", "0xff"},
           {"--verify", "true"},
           {"--verify", "-p", "1"},
           {"--verify", "--topology"},
           {"--seed", "3", "-t", "0", "true"},
           {"--verify", "--seed", "x"},
           {"--verify", "--seed", "18446744073709551616"}}) {
    std::vector<std::string> argv{kCli};
    argv.insert(argv.end(), args.begin(), args.end());
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
  }
  EXPECT_FALSE(exists(record_)) << "a refused --verify ran a kernel";
  Env env = env_;
  env["FAKECUDA_DEVICES"] = "0";
  Result r = run({kCli, "--verify"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("no CUDA device is visible"), std::string::npos) << r;
  env = env_;
  env["NVTASKSET_SHIM_DIR"] = path("no-shim-here");
  r = run({kCli, "--verify"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("cannot find the shim"), std::string::npos) << r;
}

TEST_F(E2E, VerifyNeverPassesKernelsTheShimDidNotMask) {
  env_["FAKECUDA_TMD_LAYOUT"] = "unknown";
  // The shim stops a partitioned process whose TMD layout it does not know:
  // here, the probe, which is an error of its own.
  Result r = run({kCli, "--verify", "--seed", "1"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("nvtaskset: the probe process was killed by signal"), std::string::npos) << r;
  // Told to run such kernels unmasked, the shim does, and that is a failure
  // even where the blocks happen to land inside.
  env_["NVTASKSET_ON_UNSUPPORTED"] = "warn";
  r = run({kCli, "--verify", "--seed", "1"});
  ASSERT_TRUE(ExitedWith(r, 2)) << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 23u) << r;
  EXPECT_EQ(v[0].line, "FAIL -t 0-7  (8 TPCs): the shim masked 0 of 1 probe kernels");
  for (const auto& x : v) EXPECT_FALSE(x.ok) << x.line;
  EXPECT_TRUE(lines_of(r.out).back().starts_with("FAIL: 23 of 23 partitions failed (seed 1, ")) << r;
}

TEST_F(TopologyFile, VerifyPassesOnTheChipTheFileDescribes) {
  env_["FAKECUDA_TPC_BITS"] = "9,3,70,12,100,5,64,1";  // kBits
  const Result r = run({kCli, "--verify", "--topology-file", file_, "--seed", "7"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(lines_of(r.out)[0],
            "device 0: Stand-in GPU " + kStandInUuid + ", 8 TPCs, 2 GPCs, layout from file " + file_)
      << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 26u) << r;  // every TPC, first, last; GPC 0, GPC 1, both; 20 random lists
  EXPECT_EQ(v[3].line, "ok   -g 0  (4 TPCs): 32 blocks, all inside");
  EXPECT_EQ(v[4].line, "ok   -g 1  (3 TPCs): 32 blocks, all inside");
  EXPECT_EQ(v[5].label, "-g 0-1");
  for (const auto& x : v) EXPECT_TRUE(x.ok) << x.line;
  // The lists reached the TMDs as the chip's bits, through the shim.
  std::set<std::string> masks;
  for (const auto& rec : records()) {
    EXPECT_EQ(rec.layout, "v4") << rec;
    EXPECT_EQ(rec.valid, 1) << rec;
    masks.insert(rec.mask);
  }
  EXPECT_TRUE(masks.count(hopper_disable({0}))) << "-t 0";
  EXPECT_TRUE(masks.count(hopper_disable({0, 2, 4, 6}))) << "-g 0";
}

TEST_F(TopologyFile, VerifyFailsWhenTheLayoutIsWrong) {
  env_["FAKECUDA_TPC_BITS"] = "9,3,70,12,100,5,64,1";  // kBits
  // The file swaps the bits of TPCs 2 and 5: a partition holding one of them
  // but not the other runs on the other.
  std::ofstream(file_) << hopper_topology_json(kStandInUuid, {9, 3, 5, 12, 100, 70, 64, 1});
  const Result r = run({kCli, "--verify", "--topology-file", file_, "--seed", "7"});
  ASSERT_TRUE(ExitedWith(r, 2)) << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 26u) << r;
  const std::vector<std::set<unsigned>> gpcs = {{0, 2, 4, 6}, {1, 3, 5}};  // hopper_topology_json
  unsigned fails = 0;
  for (const auto& x : v) {
    std::set<unsigned> tpcs = list_ids(x.label.substr(3));
    if (x.label.starts_with("-g")) {
      std::set<unsigned> of_gpcs;
      for (unsigned g : tpcs) of_gpcs.insert(gpcs.at(g).begin(), gpcs.at(g).end());
      tpcs = of_gpcs;
    }
    const bool has2 = tpcs.count(2) != 0, has5 = tpcs.count(5) != 0;
    if (has2 == has5) {
      EXPECT_TRUE(x.ok) << x.line;
      continue;
    }
    ++fails;
    EXPECT_FALSE(x.ok) << x.line;
    const std::string other = has2 ? "5" : "2";
    EXPECT_TRUE(std::regex_search(x.line, std::regex(": [0-9]+ of 32 blocks on TPC " + other + " outside the partition$")))
        << x.line;
  }
  EXPECT_GE(fails, 2u);  // GPC 0 alone and GPC 1 alone, at least
  EXPECT_TRUE(std::regex_match(lines_of(r.out).back(), std::regex("FAIL: " + std::to_string(fails) +
                                                                  " of 26 partitions failed \\(seed 7, [0-9.]+ s\\)")))
      << r;
}

TEST_F(TopologyFile, VerifyReportsAKernelThatNeverRunsInsteadOfHanging) {
  env_["FAKECUDA_TPC_BITS"] = "9,3,70,12,100,5,64,1";  // kBits
  // The file gives TPC 7 bit 2, which controls nothing on this chip: a
  // partition of TPC 7 alone enables no TPC that works.
  std::ofstream(file_) << hopper_topology_json(kStandInUuid, {9, 3, 70, 12, 100, 5, 64, 2});
  Proc& p = start({kCli, "--verify", "--topology-file", file_, "--seed", "7"});
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 2)) << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 3u) << r;  // the third, "-t 7", stops the run
  EXPECT_EQ(v[0].line, "FAIL -t 0-7  (8 TPCs): all 128 blocks inside, but TPC 7 of it never ran one in 4 launches");
  EXPECT_EQ(v[1].line, "ok   -t 0  (1 TPC): 32 blocks, all inside");
  EXPECT_EQ(v[2].line,
            "FAIL -t 7  (1 TPC): the kernel did not finish within 5 s, so its mask enables no TPC that works (the "
            "layout is wrong)");
  EXPECT_TRUE(std::regex_match(lines_of(r.out).back(),
                               std::regex("FAIL: 2 of 26 partitions failed, 23 not checked after a kernel that never "
                                          "finished \\(seed 7, [0-9.]+ s\\)")))
      << r;
  // The probe process stuck behind that kernel did not outlive the check,
  // nor leave its private MPS pipe directory behind.
  EXPECT_EQ(::kill(-p.pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(path("tmp"))) left.push_back(f.path().string());
  EXPECT_TRUE(left.empty()) << "left in $TMPDIR: " << ::testing::PrintToString(left);
}

// --- 14: --help ----------------------------------------------------------------------------

// Every long option and NVTASKSET_ variable in --help is documented in the
// man page, and every option the man page documents is in --help: the two
// stay in step with the parser.
TEST_F(E2E, HelpAndManPageAgree) {
  const Result r = run({kCli, "--help"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  // One usage block, then examples (as taskset's usage()).
  EXPECT_EQ(r.out.find("Usage:"), 0u) << r.out;
  EXPECT_EQ(r.out.find("Usage:", 1), std::string::npos) << "two usage blocks:\n" << r.out;
  EXPECT_NE(r.out.find("\nExamples:\n"), std::string::npos) << r.out;
  auto collect = [](const std::string& text, const std::regex& re) {
    std::set<std::string> out;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
      out.insert((*it)[1].str());
    return out;
  };
  const std::string help_options = r.out.substr(r.out.find("Options:"), r.out.find("Examples:") - r.out.find("Options:"));
  const auto help_long = collect(help_options, std::regex("(?:^|[ ,])--([a-z][a-z-]+)"));
  const std::string man = read_file(NVTASKSET_E2E_MAN);
  const auto sec = [&](const std::string& name) {
    const auto a = man.find(".SH " + name + "\n");
    const auto b = man.find("\n.SH ", a + 1);
    return a == std::string::npos ? std::string() : man.substr(a, b - a);
  };
  // Option entries of the OPTIONS section: lines that follow ".TP".
  std::set<std::string> man_long;
  {
    std::istringstream in(sec("OPTIONS"));
    std::string line, prev;
    while (std::getline(in, line)) {
      if (prev == ".TP")
        for (const auto& o : collect(line, std::regex("\\\\-\\\\-([a-z][a-z\\\\-]+)"))) {
          std::string name = o;
          name.erase(std::remove(name.begin(), name.end(), '\\'), name.end());
          man_long.insert(name);
        }
      prev = line;
    }
  }
  ASSERT_FALSE(man_long.empty());
  EXPECT_EQ(help_long, man_long) << "--help and nvtaskset(1) document different options";
  const auto help_env = collect(r.out, std::regex("(NVTASKSET_[A-Z_]+)"));
  const std::string man_env = sec("ENVIRONMENT");
  for (const auto& v : help_env) EXPECT_NE(man_env.find(v), std::string::npos) << v << " is not in nvtaskset(1)";
}

TEST_F(E2E, VersionSaysWhatABugReportNeeds) {
  const Result r = run({kCli, "--version"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("nvtaskset [0-9]+\\.[0-9]+\\.[0-9]+\n"
                                                 "built against CUDA driver API [0-9]+\\.[0-9]+ \\(CUDA_VERSION [0-9]+\\), "
                                                 "control region version [0-9]+\n")))
      << r;
}

TEST_F(E2E, HelpNamesTheOptions) {
  const Result r = run({kCli, "--help"});
  ASSERT_TRUE(ExitedWith(r, 0));
  // As options, not as parts of longer ones ("--physical" contains "-p").
  for (const std::string opt : {"-p", "-t", "--physical", "--no-mps"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex("(^|[\\s,\\[])" + opt + "([\\s,=\\]]|$)")))
        << "--help does not mention " << opt << r;
}

// --- 15: CUDA graphs follow live changes ------------------------------------------------------
// The stand-in builds a graph kernel node's TMD at upload or first launch and
// replays reuse it, as the H200 does (docs/hardware.md): without the shim's
// re-encoding, every replay after a change would keep the old mask.

// Every record of `pid` from a graph kernel node, from index `from` on.
std::vector<Record> graph_records(const std::vector<Record>& all, long pid, std::size_t from = 0) {
  std::vector<Record> out;
  for (std::size_t i = from; i < all.size(); ++i)
    if (all[i].pid == pid && all[i].source.starts_with("graph")) out.push_back(all[i]);
  return out;
}

struct GraphCase {
  std::string mode;
  int threads;
};
void PrintTo(const GraphCase& c, std::ostream* os) { *os << c.mode << " x" << c.threads; }

class GraphReplays : public E2E, public ::testing::WithParamInterface<GraphCase> {
 protected:
  // Starts the graph launcher under `-t 0-3`, then makes `changes` live
  // changes and checks that every replay that began after each `-p` returned
  // ran on the new TPCs. Returns the pid.
  long follow_changes(const std::string& mode, int threads, int changes, const Env& env) {
    const std::string until = path("until"), ready = path("ready");
    Proc& p = start({kCli, "--no-mps", "-t", "0-3", kGraphLauncher, "--mode", mode, "--nodes", "2", "--threads",
                     std::to_string(threads), "--until-file", until, "--interval-ms", "2", "--ready-file", ready},
                    env);
    const long pid = wait_ready(ready, p);
    if (pid <= 0) {
      ADD_FAILURE() << p.wait();
      return -1;
    }
    const std::string spid = std::to_string(pid);
    // Before any change: the launch partition.
    for (const auto& rec : graph_records(records(), pid)) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
    std::uint32_t seed = 2026;
    for (int c = 0; c < changes; ++c) {
      seed = seed * 1664525u + 1013904223u;
      const std::uint64_t enabled = ((seed >> 8) & 0xff) | 1;  // never empty
      std::string list;
      for (unsigned k = 0; k < 8; ++k)
        if (enabled >> k & 1) list += (list.empty() ? "" : ",") + std::to_string(k);
      const Result q = run({kCli, "-p", "-t", list, spid});
      const std::size_t before = records().size();
      EXPECT_TRUE(ExitedWith(q, 0)) << q;
      // A replay already past its check when the change landed may still
      // carry the old mask: one per thread, two kernels each.
      std::vector<Record> after;
      wait_until([&] {
        after = graph_records(records(), pid, before);
        return after.size() >= static_cast<std::size_t>(2 * threads + 6);
      });
      if (after.size() < static_cast<std::size_t>(2 * threads + 6)) {
        ADD_FAILURE() << "change " << c << ": only " << after.size() << " replays after it";
        return -1;
      }
      for (std::size_t i = 2 * threads; i < after.size(); ++i)
        EXPECT_EQ(after[i].mask, disable64(enabled)) << "change " << c << " to " << list << ": " << after[i];
    }
    return pid;
  }
};

TEST_P(GraphReplays, EveryReplayAfterAChangeRunsOnTheNewTpcs) {
  const GraphCase c = GetParam();
  const long pid = follow_changes(c.mode, c.threads, 10, env_);
  ASSERT_GT(pid, 0);
  // The query reports the execs that follow (one per thread) and none that cannot.
  const Result q = run({kCli, "-p", std::to_string(pid)});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_NE(q.out.find("pid " + std::to_string(pid) + "'s CUDA graphs: " + std::to_string(c.threads) +
                       " follow the partition, 0 cannot\n"),
            std::string::npos)
      << q;
  touch(path("until"));
  for (auto& p : procs_)
    if (p->pid == pid) {
      const Result r = p->wait();
      EXPECT_TRUE(ExitedWith(r, 0)) << r;
      EXPECT_EQ(r.err.find("warning"), std::string::npos) << r;
    }
}

INSTANTIATE_TEST_SUITE_P(Modes, GraphReplays,
                         ::testing::Values(GraphCase{"plain", 1}, GraphCase{"child", 1}, GraphCase{"destroyed", 1},
                                           GraphCase{"update", 1}, GraphCase{"upload", 1}, GraphCase{"plain", 3}),
                         [](const auto& info) { return info.param.mode + std::to_string(info.param.threads); });

TEST_F(E2E, GraphNodeTheProgramDisabledStaysDisabled) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kGraphLauncher, "--mode", "disabled", "--nodes", "2",
                   "--until-file", until, "--interval-ms", "2", "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::size_t first = records().size();
  for (const std::string list : {"4-5", "1", "0-7", "6"}) {
    const Result q = run({kCli, "-p", "-t", list, std::to_string(pid)});
    EXPECT_TRUE(ExitedWith(q, 0)) << q;
    const std::size_t before = records().size();
    std::vector<Record> after;
    wait_until([&] { return (after = graph_records(records(), pid, before)).size() >= 4; });
    ASSERT_GE(after.size(), 4u);
  }
  // Node 2 (grid width 2) was disabled after the first replay: it never ran
  // again, although the shim re-encoded the exec four times.
  const auto later = graph_records(records(), pid, first + 2);
  ASSERT_FALSE(later.empty());
  for (const auto& rec : later) EXPECT_EQ(rec.source, "graph1") << rec;
  EXPECT_EQ(later.back().mask, disable64(0x40)) << later.back();
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// The H100's driver re-encodes kernel nodes of child graphs when toggled
// (docs/hardware.md); a driver that refused or ignored it must still never
// make the shim claim a partition the replays do not get: it checks that the
// driver re-encoded, and says so.
class ChildGraphDriver : public E2E, public ::testing::WithParamInterface<std::string> {};

TEST_P(ChildGraphDriver, AnExecTheDriverWillNotReencodeIsReportedNotTrusted) {
  Env env = env_;
  env["FAKECUDA_CHILD_NODES"] = GetParam();
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kGraphLauncher, "--mode", "child", "--nodes", "2", "--until-file",
                   until, "--interval-ms", "2", "--ready-file", ready},
                  env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  Result q = run({kCli, "-p", spid});
  EXPECT_NE(q.out.find("CUDA graphs: 1 follow the partition, 0 cannot"), std::string::npos) << q;
  q = run({kCli, "-p", "-t", "4-7", spid});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  const std::size_t before = records().size();
  wait_until([&] { return graph_records(records(), pid, before).size() >= 4; });
  // After the next replay the shim knows: the query says so.
  ASSERT_TRUE(wait_until([&] {
    return run({kCli, "-p", spid}).out.find("CUDA graphs: 0 follow the partition, 1 cannot") != std::string::npos;
  }));
  q = run({kCli, "-p", spid});
  EXPECT_NE(q.err.find("cannot follow partition changes"), std::string::npos) << q;
  q = run({kCli, "-p", "--json", spid});
  EXPECT_NE(q.out.find("\"graphs_not_following\": 1"), std::string::npos) << q;
  touch(until);
  const Result r = p.wait();
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  // ...and the task said it once on stderr.
  EXPECT_NE(r.err.find("a CUDA graph cannot follow partition changes"), std::string::npos) << r;
}

INSTANTIATE_TEST_SUITE_P(Answers, ChildGraphDriver, ::testing::Values("refuse", "ignore"));

// --- 16: thread-block clusters never hang ------------------------------------------------------
// On the stand-in Hopper layout (hopper_topology_json): GPC 0 = TPCs 0,2,4,6
// (clusters up to 8), GPC 1 = TPCs 1,3,5 (up to 4), TPC 7 of unknown GPC.
// `-t 0-1` has 2 SMs of each GPC: clusters of at most 2.

TEST_F(TopologyFile, ClusterThatCannotFitStopsTheTaskBeforeItLaunches) {
  for (const std::string mode : {"eager", "plain"}) {
    ::unlink(record_.c_str());
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kGraphLauncher, "--mode", mode,
                          "--cluster", "8", "--nodes", "1"});
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_FALSE(r.timed_out) << r;
    EXPECT_FALSE(r.exited) << r;
    EXPECT_EQ(r.signal, SIGABRT) << r;
    EXPECT_LT(took, 5s);
    EXPECT_NE(r.err.find("]: kernel with clusters of 8 cannot run on TPCs 0-1 (at most 2 SMs of one GPC); stopping\n"),
              std::string::npos)
        << mode << r;
    EXPECT_TRUE(records().empty()) << mode << ": a kernel reached the GPU: " << read_file(record_);
  }
}

TEST_F(TopologyFile, ClusterThatFitsRuns) {
  // -g 0 hosts 8; -t 0,2 hosts 4; every launch of a fitting cluster runs.
  Result r = run({kCli, "--no-mps", "--topology-file", file_, "-g", "0", kGraphLauncher, "--mode", "eager",
                  "--cluster", "8", "--nodes", "1", "--replays", "3"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  auto recs = records();
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, hopper_disable({0, 2, 4, 6})) << rec;
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0,2", kGraphLauncher, "--mode", "plain", "--cluster",
           "4", "--nodes", "1", "--replays", "2"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(records().size(), 2u);
}

TEST_F(TopologyFile, WidenRunsTheMisfitOnThePartitionsWholeGpcs) {
  Env env = env_;
  env["NVTASKSET_ON_CLUSTER_MISFIT"] = "widen";
  Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kGraphLauncher, "--mode", "eager",
                  "--cluster", "8", "--nodes", "1", "--replays", "2"},
                 env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  auto recs = records();
  ASSERT_EQ(recs.size(), 2u);
  // TPCs 0 and 1 touch GPCs 0 and 1: the misfit ran on all their TPCs.
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, hopper_disable({0, 1, 2, 3, 4, 5, 6})) << rec;
  EXPECT_NE(r.err.find("does not fit TPCs 0-1 (at most 2 SMs of one GPC); running such kernels on the partition's "
                       "whole GPCs"),
            std::string::npos)
      << r;
  // Kernels without clusters keep the partition itself.
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kGraphLauncher, "--mode", "eager", "--nodes", "1"},
          env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  recs = records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].mask, hopper_disable({0, 1}));
  // When even the whole GPCs cannot host it (16 > 8), it stops.
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kGraphLauncher, "--mode", "eager", "--cluster",
           "16", "--nodes", "1"},
          env);
  EXPECT_EQ(r.signal, SIGABRT) << r;
  EXPECT_NE(r.err.find("cannot run on TPCs 0-1 (at most 2 SMs of one GPC), nor on its whole GPCs (at most 8); "
                       "stopping"),
            std::string::npos)
      << r;
  EXPECT_TRUE(records().empty());
}

TEST_F(TopologyFile, LiveChangeMustHostTheClustersTheTaskLaunched) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "--topology-file", file_, "-g", "0", kGraphLauncher, "--mode", "plain",
                   "--cluster", "8", "--nodes", "1", "--until-file", until, "--interval-ms", "2", "--ready-file",
                   ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  Result q = run({kCli, "-p", "--topology-file", file_, spid});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.out, pid_line(pid, "current GPC list", "0") +
                       pid_line(pid, "CUDA graphs", "1 follow the partition, 0 cannot") +
                       pid_line(pid, "largest thread-block cluster", "8"))
      << q;
  // 2 SMs of one GPC cannot host clusters of 8: refused, nothing changed.
  q = run({kCli, "-p", "--topology-file", file_, "-t", "0-1", spid});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  EXPECT_NE(q.err.find("has launched thread-block clusters of 8 SMs, but TPCs 0-1 can host at most 2 SMs of one GPC"),
            std::string::npos)
      << q;
  q = run({kCli, "-p", "--topology-file", file_, spid});
  EXPECT_TRUE(q.out.starts_with(pid_line(pid, "current GPC list", "0"))) << q;
  // A list that hosts 8 is accepted, and the replays follow it.
  q = run({kCli, "-p", "--topology-file", file_, "-t", "6,4,2,0", spid});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  const std::size_t before = records().size();
  std::vector<Record> after;
  wait_until([&] { return (after = graph_records(records(), pid, before)).size() >= 3; });
  ASSERT_GE(after.size(), 3u);
  EXPECT_EQ(after.back().mask, hopper_disable({0, 2, 4, 6}));
  q = run({kCli, "-p", "--json", "--topology-file", file_, spid});
  EXPECT_NE(q.out.find("\"max_cluster\": 8"), std::string::npos) << q;
  EXPECT_NE(q.out.find("\"max_cluster_hosted\": 8"), std::string::npos) << q;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(TopologyFile, UnpartitionedTaskKeepsCountOfItsClustersToo) {
  // System-wide mode: the shim loaded, no partition yet. A later -p must
  // still not give it a partition its clusters cannot run in.
  Env env = env_;
  env["LD_LIBRARY_PATH"] = shim_dir();
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kGraphLauncher, "--mode", "eager", "--cluster", "8", "--nodes", "1", "--until-file", until,
                   "--interval-ms", "2", "--ready-file", ready},
                  env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  ASSERT_TRUE(wait_until([&] {
    return run({kCli, "-p", "--topology-file", file_, spid}).out.find("largest thread-block cluster: 8") !=
           std::string::npos;
  }));
  Result q = run({kCli, "-p", "--topology-file", file_, "-t", "0-1", spid});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  q = run({kCli, "-p", "--topology-file", file_, "-g", "0", spid});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  const std::size_t before = records().size();
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, hopper_disable({0, 2, 4, 6})) << rec;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(TopologyFile, LaunchSuggestsAGpcAlignedListThatHostsClusters) {
  // -t 0-3 holds 2 TPCs of GPC 0 and 2 of GPC 1: clusters of 4 at most, while
  // GPC 0 alone (TPCs 0,2,4,6) hosts the portable size 8.
  const Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-3", "true"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("cannot run thread-block clusters larger than 4 (the GPU runs up to 8); a GPC-aligned list of "
                       "the same size hosts clusters of 8: -t 0,2,4,6"),
            std::string::npos)
      << r;
}

TEST_F(TopologyFile, DebugLogNamesTheClusterSizesLaunched) {
  Env env = env_;
  env["NVTASKSET_LOG"] = "debug";
  const Result r = run({kCli, "--no-mps", "--topology-file", file_, "-g", "0", kGraphLauncher, "--mode", "eager",
                        "--cluster", "4", "--nodes", "1", "--replays", "3"},
                       env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("cluster sizes launched: 4:3 (3 kernels in all)"), std::string::npos) << r;
}

// --- 17: hardening: other users, corrupt regions, silent ways to run unpartitioned ---------

TEST_F(E2E, PreloadedRealDriverIsRefused) {
  // The driver in LD_PRELOAD would be loaded instead of the shim: every
  // kernel on all TPCs. Refused before anything runs.
  Env env = env_;
  env["LD_PRELOAD"] = kFake;
  // In the sanitizer build the CLI carries ASan, which otherwise refuses to
  // start with anything preloaded before its runtime.
  env["ASAN_OPTIONS"] = "verify_asan_link_order=0";
  Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "2"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("LD_PRELOAD names the CUDA driver (" + kFake + ")"), std::string::npos) << r;
  EXPECT_TRUE(records().empty());
  // The shim itself may be preloaded.
  env["LD_PRELOAD"] = kShim;
  r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "1"}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(records().size(), 1u);
  EXPECT_EQ(records()[0].mask, disable64(0xf));
}

TEST_F(E2E, TaskThatCannotApplyAPartitionIsNeverReportedAsPartitioned) {
  Env env = env_;
  env["FAKECUDA_TMD_LAYOUT"] = "unknown";
  env["NVTASKSET_ON_UNSUPPORTED"] = "warn";
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready},
                  env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  for (const std::vector<std::string>& args : {std::vector<std::string>{}, std::vector<std::string>{"-t", "4-5"}}) {
    std::vector<std::string> argv{kCli, "-p"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(std::to_string(pid));
    const Result q = run(argv);
    EXPECT_TRUE(FailedWithOneLine(q)) << q;
    EXPECT_NE(q.err.find("pid " + std::to_string(pid) + " runs on all TPCs: "), std::string::npos) << q;
    EXPECT_NE(q.err.find("a TMD layout nvtaskset does not know"), std::string::npos) << q;
  }
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// A second Unix user, for the tests of what another user can do. CI runs as
// root and can create one; elsewhere these tests say why they cannot run.
std::optional<std::pair<uid_t, gid_t>> second_user() {
  if (::getuid() != 0) return std::nullopt;
  const char* name = "nvtaskset-e2e";
  if (::getpwnam(name) == nullptr) {
    const std::string cmd = std::string("useradd --system --no-create-home --shell /usr/sbin/nologin ") + name +
                            " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0 && ::getpwnam(name) == nullptr) return std::nullopt;
  }
  const passwd* pw = ::getpwnam(name);
  if (pw == nullptr) return std::nullopt;
  return std::make_pair(pw->pw_uid, pw->pw_gid);
}

// argv run as `user` (setpriv from util-linux).
std::vector<std::string> as_user(std::pair<uid_t, gid_t> user, std::vector<std::string> argv) {
  std::vector<std::string> out{"setpriv", "--reuid=" + std::to_string(user.first),
                               "--regid=" + std::to_string(user.second), "--clear-groups", "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

TEST_F(E2E, AnotherUserCanNeitherTakeOverNorSteerATask) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  // The attack from the hardening issue: while a root task is still
  // starting under a known PID, the other user plants a region file for that
  // PID, mode 0666, with a valid header. Then it tries to repartition.
  const std::string until = path("until"), ready = path("ready"), go = path("go");
  Proc& p = start({"sh", "-c",
                   "while [ ! -e " + go + " ]; do sleep 0.01; done; exec " + kCli + " --no-mps -t 0-3 " + kLauncher +
                       " --until-file " + until + " --interval-ms 5 --ready-file " + ready});
  const std::string planted = "/dev/shm/nvtaskset." + std::to_string(p.pid);
  const Result plant = run(as_user(*other, {"sh", "-c", "umask 0; head -c 4096 /dev/zero > " + planted}));
  ASSERT_TRUE(ExitedWith(plant, 0)) << plant;
  cleanup_.push_back(planted);
  {
    // A valid-looking header in it, as the attacker would write.
    const int fd = ::open(planted.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    auto* h = static_cast<nvtaskset::ctl::Header*>(
        ::mmap(nullptr, sizeof(nvtaskset::ctl::Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ASSERT_NE(h, MAP_FAILED);
    nvtaskset::ctl::init_header(*h, {});
    h->pid = p.pid;
    h->start_time = nvtaskset::ctl::process_start_time(p.pid);
    ::munmap(h, sizeof *h);
    ::close(fd);
  }
  touch(go);
  const long pid = wait_ready(ready, p);
  ASSERT_EQ(pid, p.pid) << p.wait();
  const std::string spid = std::to_string(pid);
  // The other user can neither query nor change it.
  for (const std::vector<std::string>& args : {std::vector<std::string>{"-p", "-t", "6-7", spid},
                                              std::vector<std::string>{"-p", spid}}) {
    std::vector<std::string> argv{kCli};
    argv.insert(argv.end(), args.begin(), args.end());
    const Result q = run(as_user(*other, argv));
    EXPECT_TRUE(FailedWithOneLine(q)) << q;
    EXPECT_NE(q.err.find("belongs to another user: only its owner and root can query or change its TPCs"),
              std::string::npos)
        << q;
  }
  // The task never used the planted file, and kept its partition.
  const Result q = run({kCli, "-p", spid});
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3")) << q;
  const std::size_t before = records().size();
  for (const auto& rec : records_after(pid, before, 0, 5)) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
  struct stat st {};
  ASSERT_EQ(::stat(planted.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, other->first);
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// The task's owner can write anything into its region: corrupt states must
// not hang the task or the CLI, crash the task, or make either lie.
class CorruptRegion : public E2E {
 protected:
  long start_task() {
    const std::string ready = path("ready");
    task_ = &start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", path("until"), "--interval-ms", "2",
                    "--ready-file", ready});
    const long pid = wait_ready(ready, *task_);
    if (pid <= 0) return -1;
    const std::string fd = region_fd(pid);
    if (fd.empty()) return -1;
    fd_ = ::open(fd.c_str(), O_RDWR);
    if (fd_ < 0) return -1;
    void* m = ::mmap(nullptr, sizeof(nvtaskset::ctl::Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) return -1;
    h_ = static_cast<nvtaskset::ctl::Header*>(m);
    return pid;
  }
  void TearDown() override {
    if (h_) ::munmap(h_, sizeof *h_);
    if (fd_ >= 0) ::close(fd_);
    E2E::TearDown();
  }
  nvtaskset::ctl::MaskBuffer& published() {
    auto& e = h_->devices[0];
    return e.buffer[e.generation.load() & 1];
  }
  // The CLI answers a query promptly (a bounded read, not a wait: a few ms;
  // 3 s leaves room for the sanitizer build on a loaded 2-core CI machine,
  // where 1 s was exceeded by 50 ms), with one line.
  Result query_fails(long pid) {
    const auto t0 = std::chrono::steady_clock::now();
    Result q = run({kCli, "-p", std::to_string(pid)});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
    EXPECT_TRUE(FailedWithOneLine(q)) << q;
    return q;
  }
  // The task keeps launching, on TPCs 0-3.
  void still_on_0_3(long pid) {
    const std::size_t before = records().size();
    for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
  }
  Proc* task_ = nullptr;
  int fd_ = -1;
  nvtaskset::ctl::Header* h_ = nullptr;
};

TEST_F(CorruptRegion, NoStateHangsCrashesOrLies) {
  const long pid = start_task();
  ASSERT_GT(pid, 0);
  const std::string spid = std::to_string(pid);

  // 1. A sequence that stays odd (a writer killed as it published).
  auto& pub = published();
  const std::uint64_t seq = pub.seq.load();
  pub.seq.store(seq | 1);
  Result q = query_fails(pid);
  EXPECT_NE(q.err.find("control region of pid " + spid + " is corrupt: device slot 0 cannot be read consistently"),
            std::string::npos)
      << q;
  still_on_0_3(pid);  // the last good partition
  pub.seq.store(seq);

  // 2. A writer killed mid-write leaves the other buffer odd: the next
  // writer repairs it, and the change lands.
  auto& e = h_->devices[0];
  auto& other = e.buffer[(e.generation.load() + 1) & 1];
  other.seq.store(other.seq.load() | 1);
  q = run({kCli, "-p", "-t", "4-5", spid});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  std::size_t before = records().size();
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x30)) << rec;
  q = run({kCli, "-p", "-t", "0-3", spid});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  still_on_0_3(pid);

  // 3. An active partition that enables nothing: every kernel would hang.
  auto& p3 = published();
  const std::uint64_t lo = p3.enabled[0].load();
  p3.enabled[0].store(0);
  q = query_fails(pid);
  EXPECT_NE(q.err.find("device slot 0 enables no TPC"), std::string::npos) << q;
  still_on_0_3(pid);  // not the all-disabled mask
  p3.enabled[0].store(lo);

  // 4. An impossible device: refused at once, no huge topology.
  const std::uint32_t sms = e.sm_count;
  e.sm_count = 0xfffffffe;
  q = query_fails(pid);
  EXPECT_NE(q.err.find("describes an impossible GPU"), std::string::npos) << q;
  e.sm_count = sms;

  // 5. A logical list that does not match the mask the kernels get.
  auto& p5 = published();
  const std::uint64_t tpcs = p5.tpcs[0].load();
  p5.tpcs[0].store(0x3);
  q = query_fails(pid);
  EXPECT_NE(q.err.find("its TPC list 0-1 does not match the mask its kernels get"), std::string::npos) << q;
  p5.tpcs[0].store(tpcs);

  // 6. Every slot in use: the query shows what the shim applies, no more.
  for (unsigned i = 1; i < nvtaskset::ctl::kMaxDevices; ++i) {
    auto& d = h_->devices[i];
    std::memset(d.uuid, static_cast<int>(0x40 + i), sizeof d.uuid);
    d.buffer[0].kind.store(1);
    d.buffer[0].enabled[0].store(0xff);
    d.buffer[0].tpcs[0].store(0xff);
    d.generation.store(0);
    d.in_use.store(1);
  }
  q = run({kCli, "-p", spid});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3")) << q;
  still_on_0_3(pid);

  // 7. Its size cannot change: a truncation fails, the task lives on.
  EXPECT_NE(::ftruncate(fd_, 0), 0);
  still_on_0_3(pid);

  // 8. Random bytes over everything: the CLI refuses, the task keeps its
  // last good partition and says so once.
  std::uint32_t x = 7;
  auto* bytes = reinterpret_cast<unsigned char*>(h_);
  for (std::size_t i = 0; i < sizeof(nvtaskset::ctl::Header); ++i) bytes[i] = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 16);
  q = query_fails(pid);
  EXPECT_NE(q.err.find("is corrupt"), std::string::npos) << q;
  still_on_0_3(pid);
  touch(path("until"));
  const Result r = task_->wait();
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("the control region is corrupt; using the last partition read"), std::string::npos) << r;
  EXPECT_NE(r.err.find("cannot be read consistently; using the last partition read"), std::string::npos) << r;
}

TEST_F(E2E, KilledWritersNeverHangTheTaskOrTheCli) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "2",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  std::uint32_t seed = 99;
  for (int i = 0; i < 40; ++i) {
    seed = seed * 1664525u + 1013904223u;
    Proc& w = start({kCli, "-p", "-t", (i % 2) ? "4-5" : "6-7", spid});
    std::this_thread::sleep_for(std::chrono::microseconds(seed % 20000));
    w.kill_group();
  }
  // Whatever the writers left: the CLI answers at once, a change lands, the task launches.
  const Result q = run({kCli, "-p", "-t", "1-2", spid}, env_, 5s);
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  const std::size_t before = records().size();
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x6)) << rec;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// --- 18: input hardening: zombies, syntax before the driver, overlong lists, log levels ------

// The state letter of /proc/<pid>/stat (after the last ')'), or '?'.
char proc_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

// --- a killed, unreaped task is dead --------------------------------------------------

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

// --- syntax errors come before any driver access ------------------------------------

struct BadSyntax {
  std::string name;
  std::vector<std::string> args;  // between --no-mps and the command
  std::string error;              // the whole stderr line, after "nvtaskset: "
};

void PrintTo(const BadSyntax& c, std::ostream* os) { *os << c.name; }

class SyntaxBeforeDriver : public E2E, public ::testing::WithParamInterface<BadSyntax> {};

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

TEST_F(E2E, PidModeChecksSyntaxFirstToo) {
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

TEST_F(E2E, OverlongListIsRefusedAtOnce) {
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

TEST_F(E2E, LogLevelIsCaseInsensitiveAndUnknownLevelsWarn) {
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

// --- 19: sharing a GPU: -n, --exclusive, --status, -a ------------------------------------------
// On the Hopper-like layout of TopologyFile: GPC 0 = TPCs 0,2,4,6; GPC 1 =
// 1,3,5; TPC 7 of unknown GPC.

class Sharing : public TopologyFile {
 protected:
  void SetUp() override {
    TopologyFile::SetUp();
    env_["NVTASKSET_TOPOLOGY"] = file_;
    // Another user must reach the status directory, as it reaches /dev/shm.
    ::chmod(dir_.c_str(), 0711);
  }
  // A task that launches a kernel every 5 ms until told to stop.
  long start_task(const std::vector<std::string>& options, const std::string& tag, Proc** out = nullptr,
                  const std::vector<std::string>& launcher_args = {}, const std::string& launcher = kLauncher) {
    std::vector<std::string> argv{kCli, "--no-mps"};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.insert(argv.end(), {launcher, "--until-file", path("until"), "--interval-ms", "5", "--ready-file",
                             path("ready." + tag)});
    argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
    Proc& p = start(argv, env_);
    tasks_.push_back(&p);
    if (out) *out = &p;
    return wait_ready(path("ready." + tag), p);
  }
  void stop_all() {
    touch(path("until"));
    for (Proc* p : tasks_) EXPECT_TRUE(ExitedWith(p->wait(), 0)) << p->command;
  }
  std::vector<Proc*> tasks_;
  std::string mask_of(long pid) {
    const std::size_t before = records().size();
    const auto recs = records_after(pid, before, 1, 2);
    return recs.empty() ? std::string("none") : recs.back().mask;
  }
};

TEST_F(Sharing, CountPacksWholeGpcsAndAvoidsTpcsOthersHold) {
  // 4 TPCs: GPC 0 whole (clusters of 8), not the striped 0-3.
  const long a = start_task({"-v", "-n", "4"}, "a");
  ASSERT_GT(a, 0);
  EXPECT_EQ(mask_of(a), hopper_disable({0, 2, 4, 6}));
  EXPECT_EQ(run({kCli, "-p", std::to_string(a)}).out, pid_line(a, "current TPC list", "0,2,4,6"));
  // The next -n 3 takes GPC 1, which no one holds.
  const long b = start_task({"-n", "3"}, "b");
  ASSERT_GT(b, 0);
  EXPECT_EQ(mask_of(b), hopper_disable({1, 3, 5}));
  // Two left free of 8... one, TPC 7: --exclusive refuses -n 2, one line, no kernel.
  const Result r = run({kCli, "--no-mps", "--exclusive", "-n", "2", kLauncher, "--kernels", "1"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("only 1 of 8 TPCs of device 0 are free"), std::string::npos) << r;
  // Without --exclusive it runs, sharing, and says so.
  const Result s = run({kCli, "--no-mps", "-n", "2", kLauncher, "--kernels", "1"});
  EXPECT_TRUE(ExitedWith(s, 0)) << s;
  EXPECT_NE(s.err.find("-n 2: only 1 of 8 TPCs of device 0 are free"), std::string::npos) << s;
  stop_all();
}

TEST_F(Sharing, SpreadTakesOneTpcPerGpcFirst) {
  const long a = start_task({"-n", "2", "--spread"}, "a");
  ASSERT_GT(a, 0);
  EXPECT_EQ(run({kCli, "-p", std::to_string(a)}).out, pid_line(a, "current TPC list", "0-1"));
  stop_all();
  const Result r = run({kCli, "--no-mps", "--spread", "-t", "0", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
}

TEST_F(Sharing, CountIsValidatedBeforeAnythingRuns) {
  const std::string marker = path("marker");
  for (const std::string bad : {"0", "9", "-1", "1x", "", "129", "99999999999999999999"}) {
    const Result r = run({kCli, "--no-mps", "-n", bad, "touch", marker});
    EXPECT_TRUE(FailedWithOneLine(r)) << bad << ": " << r;
    EXPECT_FALSE(exists(marker)) << bad;
  }
  const Result r = run({kCli, "--no-mps", "-n", "9", "touch", marker});
  EXPECT_NE(r.err.find("device 0 has 8 TPCs"), std::string::npos) << r;
}

TEST_F(Sharing, ExclusiveRefusesOverlapAndSharedGpcsAreNamed) {
  const long a = start_task({"-t", "0,2"}, "a");
  ASSERT_GT(a, 0);
  // Overlap: refused under --exclusive, at launch and on -p.
  const std::string marker = path("marker");
  Result r = run({kCli, "--no-mps", "--exclusive", "-t", "2-3", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("TPCs 2 of device 0 are held by pid " + std::to_string(a)), std::string::npos) << r;
  EXPECT_FALSE(exists(marker));
  const long b = start_task({"-t", "4"}, "b");
  ASSERT_GT(b, 0);
  // TPC 4 shares GPC 0 with a: said at launch, with a same-size list in a GPC no one uses.
  const Proc& pb = *tasks_.back();
  EXPECT_NE(pb.err().find("TPCs 4 of device 0 share GPC 0 with pid " + std::to_string(a)), std::string::npos)
      << pb.err();
  EXPECT_NE(pb.err().find("GPCs no other task uses hold the same size: -t 1"), std::string::npos) << pb.err();
  r = run({kCli, "-p", "--exclusive", "-t", "0", std::to_string(b)});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_EQ(run({kCli, "-p", std::to_string(b)}).out, pid_line(b, "current TPC list", "4"));
  // Its own TPCs never count against a task: -p --exclusive to a superset of them.
  r = run({kCli, "-p", "--exclusive", "-t", "4,6", std::to_string(b)});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  // --status marks the pair.
  const Result st = run({kCli, "--status"});
  EXPECT_TRUE(ExitedWith(st, 0)) << st;
  EXPECT_NE(st.out.find("share a GPC: they do not isolate each other"), std::string::npos) << st.out;
  stop_all();
}

TEST_F(Sharing, LiveCountKeepsTheTpcsTheTaskHas) {
  const long a = start_task({"-g", "0"}, "a");
  ASSERT_GT(a, 0);
  const Result r = run({kCli, "-p", "-n", "2", std::to_string(a)});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  // A change answers in the terms of the new value (a TPC list).
  EXPECT_EQ(r.out, pid_line(a, "current TPC list", "0,2,4,6") + pid_line(a, "new TPC list", "0,2")) << r;
  EXPECT_EQ(mask_of(a), hopper_disable({0, 2}));
  stop_all();
}

TEST_F(Sharing, StatusListsEveryTaskOfEveryUserWithCountersForTheOwner) {
  const long a = start_task({"-n", "4"}, "a");
  // Task b is started by a path far longer than any column (as from a deep
  // checkout): the table still shows its program's name, and --json the
  // whole command line, wherever the tests run from.
  const std::string deep = path(std::string(120, 'd') + "/" + std::string(120, 'e'));
  fs::create_directories(deep);
  const std::string long_launcher = deep + "/launcher";
  fs::create_symlink(kLauncher, long_launcher);
  const long b = start_task({"-t", "1,3"}, "b", nullptr, {}, long_launcher);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  Result st = run({kCli, "--status", "--json"});
  ASSERT_TRUE(ExitedWith(st, 0)) << st;
  auto j = nlohmann::json::parse(st.out);
  ASSERT_EQ(j["tasks"].size(), 2u) << st.out;
  EXPECT_EQ(j["tasks"][0]["pid"], a);
  EXPECT_EQ(j["tasks"][0]["tpcs"], "0,2,4,6");
  EXPECT_EQ(j["tasks"][0]["gpcs"], "0");
  EXPECT_EQ(j["tasks"][0]["gpcs_whole"], 1);
  EXPECT_EQ(j["tasks"][0]["sms"], 8);
  EXPECT_GT(j["tasks"][0]["kernels_launched"].get<long>(), 0);
  EXPECT_EQ(j["tasks"][1]["pid"], b);
  EXPECT_EQ(j["tasks"][1]["gpcs_whole"], 0);
  const std::string whole = long_launcher + " --until-file " + path("until") + " --interval-ms 5 --ready-file " +
                            path("ready.b");
  EXPECT_EQ(j["tasks"][1]["command"], whole) << st.out;
  EXPECT_EQ(j["tasks"][1]["argv"][0], long_launcher) << st.out;
  st = run({kCli, "--status"});
  EXPECT_NE(st.out.find("PID"), std::string::npos);
  EXPECT_NE(st.out.find(std::to_string(a) + "  "), std::string::npos) << st.out;
  // The table: the program's name and its first arguments, on one line.
  bool named = false;
  for (const auto& l : lines_of(st.out))
    if (l.starts_with(std::to_string(b) + " ")) {
      named = l.find("  launcher --until-file ") != std::string::npos;
      EXPECT_LT(l.size(), 200u) << l;
    }
  EXPECT_TRUE(named) << st.out;
  // Another user sees both partitions, not the owner's counters.
  if (const auto other = second_user()) {
    const Result o = run(as_user(*other, {kCli, "--status", "--json"}));
    ASSERT_TRUE(ExitedWith(o, 0)) << o;
    const auto oj = nlohmann::json::parse(o.out);
    ASSERT_EQ(oj["tasks"].size(), 2u) << o.out;
    EXPECT_EQ(oj["tasks"][0]["tpcs"], "0,2,4,6");
    EXPECT_FALSE(oj["tasks"][0].contains("kernels_launched")) << o.out;
  }
  stop_all();
  // Ended tasks never show, and their entries are cleaned.
  st = run({kCli, "--status", "--json"});
  EXPECT_EQ(nlohmann::json::parse(st.out)["tasks"].size(), 0u) << st.out;
  std::size_t left = 0;
  for (const auto& f : fs::directory_iterator(path("status")))
    left += f.path().filename().string().starts_with("nvtaskset-status.");
  EXPECT_EQ(left, 0u);
}

TEST_F(Sharing, NoUserCanForgeOrHideAnotherUsersEntry) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  const long a = start_task({"-t", "0-1"}, "a");
  ASSERT_GT(a, 0);
  // The other user copies root's entry under its own name, claiming root's
  // task sits on TPCs 6-7, and tries to remove root's entry.
  std::string mine;
  for (const auto& f : fs::directory_iterator(path("status")))
    if (f.path().filename().string().starts_with("nvtaskset-status." + std::to_string(a) + "."))
      mine = f.path().string();
  ASSERT_FALSE(mine.empty());
  std::string text = read_file(mine);
  const std::string forged = path("status") + "/nvtaskset-status." + std::to_string(a) + ".00000000deadbeef";
  const Result w = run(as_user(*other, {"sh", "-c", "sed 's/,0x[0-9a-f]*,0x3,/,0x1,0xc0,/' " + mine + " > " + forged +
                                                        "; touch -d '+1 hour' " + forged + "; rm -f " + mine}));
  EXPECT_TRUE(exists(mine)) << "another user removed the entry";
  const Result st = run({kCli, "--status", "--json"});
  const auto j = nlohmann::json::parse(st.out);
  ASSERT_EQ(j["tasks"].size(), 1u) << st.out;
  EXPECT_EQ(j["tasks"][0]["tpcs"], "0-1") << st.out;
  // And a -n chooser is not fooled either: TPCs 0-1 are the ones taken.
  const Result r = run({kCli, "--no-mps", "--exclusive", "-t", "1", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  (void)w;
  stop_all();
}

TEST_F(Sharing, AllTasksMovesTheTaskAndItsChildren) {
  Proc* p = nullptr;
  const long pid = start_task({"-t", "0-1"}, "a", &p, {"--fork"});
  ASSERT_GT(pid, 0);
  const long child = wait_ready(path("ready.a") + ".child", *p);
  ASSERT_GT(child, 0);
  Result q = run({kCli, "-a", "-p", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-1") + pid_line(child, "current TPC list", "0-1")) << q;
  q = run({kCli, "-a", "-p", "-t", "6", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-1") + pid_line(pid, "new TPC list", "6") +
                       pid_line(child, "current TPC list", "0-1") + pid_line(child, "new TPC list", "6"))
      << q;
  const std::size_t before = records().size();
  for (const auto& rec : records_after(child, before, 1, 3)) EXPECT_EQ(rec.mask, hopper_disable({6})) << rec;
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, hopper_disable({6})) << rec;
  // The child holds TPC 6 too, but it is the task's own: no "held by" warning.
  q = run({kCli, "-p", "--exclusive", "-t", "6,7", std::to_string(pid)});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.err.find("held by"), std::string::npos) << q;
  // Without -a only the task moves.
  EXPECT_EQ(run({kCli, "-p", std::to_string(child)}).out, pid_line(child, "current TPC list", "6"));
  EXPECT_TRUE(FailedWithOneLine(run({kCli, "-a", "-t", "1", "true"})));
  stop_all();
}

// Launches that choose at the same moment never end up sharing TPCs unseen,
// and no lock serialises them (a lock in /dev/shm is one any user could hold
// forever). Each one publishes its choice, reads the status again and, when
// an entry that appeared meanwhile shares its TPCs or GPCs, takes its entry
// back and chooses again. NVTASKSET_CLAIM_DELAY_MS holds every launch between
// its snapshot and its first publish, so they all first choose from the same
// empty status: the same TPCs.
class Racing : public Sharing {
 protected:
  struct Outcome {
    Proc* proc;
    long pid;  // -1: did not start
  };
  std::vector<Outcome> launch_together(const std::vector<std::string>& options, int n) {
    Env env = env_;
    env["NVTASKSET_CLAIM_DELAY_MS"] = "300";
    std::vector<Outcome> out;
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv{kCli, "--no-mps"};
      argv.insert(argv.end(), options.begin(), options.end());
      argv.insert(argv.end(), {kLauncher, "--until-file", path("until"), "--interval-ms", "5", "--ready-file",
                               path("ready.r" + std::to_string(i))});
      out.push_back({&start(argv, env), -1});
    }
    for (int i = 0; i < n; ++i) {
      out[i].pid = wait_ready(path("ready.r" + std::to_string(i)), *out[i].proc);
      if (out[i].pid > 0) tasks_.push_back(out[i].proc);
    }
    return out;
  }
  // "0,2,4-6" -> {0, 2, 4, 5, 6}, as --status writes lists.
  static std::vector<unsigned> expand(const std::string& list) {
    std::vector<unsigned> out;
    std::istringstream in(list);
    std::string item;
    while (std::getline(in, item, ',')) {
      const auto dash = item.find('-');
      const unsigned lo = static_cast<unsigned>(std::stoul(item.substr(0, dash)));
      const unsigned hi = dash == std::string::npos ? lo : static_cast<unsigned>(std::stoul(item.substr(dash + 1)));
      for (unsigned k = lo; k <= hi; ++k) out.push_back(k);
    }
    return out;
  }
  // TPCs each started task is listed with, checked against the mask its
  // kernels get.
  std::map<long, std::vector<unsigned>> listed_and_applied(const std::vector<Outcome>& started) {
    const Result st = run({kCli, "--status", "--json"});
    EXPECT_TRUE(ExitedWith(st, 0)) << st;
    std::map<long, std::vector<unsigned>> out;
    const auto j = nlohmann::json::parse(st.out);
    for (const auto& t : j["tasks"]) out[t["pid"].get<long>()] = expand(t["tpcs"].get<std::string>());
    for (const Outcome& o : started) {
      if (o.pid < 0) continue;
      EXPECT_TRUE(out.count(o.pid)) << o.pid << " is not listed: " << st.out;
      EXPECT_EQ(mask_of(o.pid), hopper_disable(out[o.pid])) << o.pid;
    }
    return out;
  }
};

TEST_F(Racing, ExclusiveChoicesAtTheSameMomentAreDisjointOrRefused) {
  const auto outcomes = launch_together({"--exclusive", "-n", "2"}, 4);
  int started = 0;
  for (const Outcome& o : outcomes) {
    if (o.pid > 0) {
      ++started;
      continue;
    }
    // Refused: one line, no kernel.
    EXPECT_TRUE(FailedWithOneLine(o.proc->wait())) << o.proc->result;
  }
  EXPECT_GE(started, 1);
  const auto tpcs = listed_and_applied(outcomes);
  std::set<unsigned> seen;
  for (const Outcome& o : outcomes) {
    if (o.pid < 0) continue;
    for (unsigned k : tpcs.at(o.pid)) EXPECT_TRUE(seen.insert(k).second) << "TPC " << k << " taken twice";
  }
  stop_all();
}

TEST_F(Racing, CountChoicesAtTheSameMomentShareTpcsOnlyWhenTheySaySo) {
  const auto outcomes = launch_together({"-n", "2"}, 3);
  for (const Outcome& o : outcomes) ASSERT_GT(o.pid, 0) << o.proc->err();
  const auto tpcs = listed_and_applied(outcomes);
  for (std::size_t i = 0; i < outcomes.size(); ++i)
    for (std::size_t j = 0; j < outcomes.size(); ++j) {
      if (i == j) continue;
      const auto& a = tpcs.at(outcomes[i].pid);
      const auto& b = tpcs.at(outcomes[j].pid);
      std::vector<unsigned> common;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
      if (common.empty()) continue;
      // 8 TPCs hold three pairs: sharing is only ever the last resort, and said.
      const std::string said = outcomes[i].proc->err() + outcomes[j].proc->err();
      EXPECT_NE(said.find("share"), std::string::npos) << outcomes[i].pid << " and " << outcomes[j].pid;
    }
  stop_all();
}

// The same for two live changes: each publishes the task's new partition,
// reads again, and on a race republishes what the task's region still holds
// and chooses again.
TEST_F(Racing, LiveChangesAtTheSameMomentAreDisjointOrRefused) {
  const long a = start_task({"-t", "7"}, "a");
  const long b = start_task({"-t", "6"}, "b");
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  Env env = env_;
  env["NVTASKSET_CLAIM_DELAY_MS"] = "300";
  Proc& pa = start({kCli, "-p", "--exclusive", "-n", "3", std::to_string(a)}, env);
  Proc& pb = start({kCli, "-p", "--exclusive", "-n", "3", std::to_string(b)}, env);
  const Result ra = pa.wait(), rb = pb.wait();
  for (const Result* r : {&ra, &rb})
    EXPECT_TRUE(ExitedWith(*r, 0) || FailedWithOneLine(*r)) << *r;
  EXPECT_TRUE(ExitedWith(ra, 0) || ExitedWith(rb, 0)) << ra << rb;
  const auto tpcs = listed_and_applied({{&pa, a}, {&pb, b}});
  std::vector<unsigned> common;
  std::set_intersection(tpcs.at(a).begin(), tpcs.at(a).end(), tpcs.at(b).begin(), tpcs.at(b).end(),
                        std::back_inserter(common));
  EXPECT_TRUE(common.empty()) << "TPC " << common.front() << " held by both";
  EXPECT_EQ(tpcs.at(a).size(), ExitedWith(ra, 0) ? 3u : 1u);
  EXPECT_EQ(tpcs.at(b).size(), ExitedWith(rb, 0) ? 3u : 1u);
  stop_all();
}

// Another user's files in the status directory block no one: a lock held on
// the name an older nvtaskset locked, a FIFO and a directory named like
// entries.
TEST_F(Sharing, AnotherUsersFilesInTheStatusDirectoryBlockNoChoice) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  const std::string dir = path("status");
  Proc& squatter = start(as_user(*other, {"sh", "-c",
                                          "mkfifo " + dir + "/nvtaskset-status.1.0000000000000001 && mkdir " + dir +
                                              "/nvtaskset-status.2.0000000000000002 && exec flock " + dir +
                                              "/nvtaskset-status.lock sleep 30"}));
  ASSERT_TRUE(wait_until([&] { return exists(dir + "/nvtaskset-status.lock"); })) << squatter.err();
  const auto t0 = std::chrono::steady_clock::now();
  const long a = start_task({"--exclusive", "-n", "4"}, "a");
  ASSERT_GT(a, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(mask_of(a), hopper_disable({0, 2, 4, 6}));
  EXPECT_TRUE(ExitedWith(run({kCli, "-p", "--exclusive", "-n", "3", std::to_string(a)}), 0));
  ::kill(-squatter.pid, SIGKILL);
  squatter.wait();
  stop_all();
}

// A child forked without exec that uses the GPU (its own cuInit) is listed
// by --status with its own entry, which follows `-p` on it; a child that
// never initialises CUDA is not listed.
TEST_F(Sharing, StatusListsAForkedChildThatUsesTheGpu) {
  Proc* p = nullptr;
  const long pid = start_task({"-t", "0-1"}, "a", &p, {"--fork"});
  ASSERT_GT(pid, 0);
  const long child = wait_ready(path("ready.a") + ".child", *p);
  ASSERT_GT(child, 0);
  auto listed = [&] {
    const Result st = run({kCli, "--status", "--json"});
    EXPECT_TRUE(ExitedWith(st, 0)) << st;
    std::map<long, std::string> out;
    const auto j = nlohmann::json::parse(st.out);
    for (const auto& t : j["tasks"]) out[t["pid"].get<long>()] = t["tpcs"];
    return out;
  };
  auto m = listed();
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m[pid], "0-1");
  EXPECT_EQ(m[child], "0-1");
  ASSERT_TRUE(ExitedWith(run({kCli, "-p", "-t", "6", std::to_string(child)}), 0));
  m = listed();
  EXPECT_EQ(m[pid], "0-1");
  EXPECT_EQ(m[child], "6");
  // -n now avoids the child's TPC too: 5 free of 8 (0, 1 and 6 held).
  const Result r = run({kCli, "--no-mps", "--exclusive", "-n", "6", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("only 5 of 8 TPCs"), std::string::npos) << r;
  stop_all();
  EXPECT_TRUE(listed().empty());
}

// A child forked without exec that never touches CUDA (a data-loader worker)
// keeps the partition but is not listed.
TEST_F(Sharing, AForkedChildWithoutCudaIsNotListed) {
  const long pid = start_task({"-t", "0-1"}, "a", nullptr, {"--spawn", "sleep", "1"});
  ASSERT_GT(pid, 0);
  const Result st = run({kCli, "--status", "--json"});
  ASSERT_TRUE(ExitedWith(st, 0)) << st;
  const auto tasks = nlohmann::json::parse(st.out)["tasks"];
  ASSERT_EQ(tasks.size(), 1u) << st.out;
  EXPECT_EQ(tasks[0]["pid"], pid);
  stop_all();
}

// MPS serves one user at a time: a task that would wait behind another
// user's clients is told so, and NVTASKSET_MPS_OTHER_USER=fail refuses it.
// An MPS client gets a plain process's 8 kernel queues (2 otherwise
// serialise its streams) and 2 copy queues (each queue costs start-up time;
// copy pipelines ran as fast with 2 as with 4; measured on an H100,
// docs/hardware.md "MPS"), unless the user chose either number.
TEST_F(E2E, EnvironmentOfAnMpsClient) {
  Env env = env_;
  env["NVTASKSET_MPS_CONTROL"] = kFakeMps;
  env["FAKE_MPS_IDLE_MS"] = "20000";
  const std::string conn = "CUDA_DEVICE_MAX_CONNECTIONS";
  const std::string copy = "CUDA_DEVICE_MAX_COPY_CONNECTIONS";
  auto launch = [&](const Env& e) {
    return run({kCli, "-t", "0", kLauncher, "--print-env", conn, "--print-env", copy}, e);
  };
  Result r = launch(env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, conn).value_or("<unset>"), "8") << r;
  EXPECT_EQ(printed_env(r.out, copy).value_or("<unset>"), "2") << r;
  // The user's number of connections also sets the copy queues, in CUDA:
  // nvtaskset adds no copy setting of its own beside it.
  env[conn] = "2";
  r = launch(env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, conn).value_or("<unset>"), "2") << r;
  EXPECT_EQ(printed_env(r.out, copy).value_or("<unset>"), "<unset>") << r;
  // The user's copy queues are kept; the kernels still get 8.
  env.erase(conn);
  env[copy] = "1";
  r = launch(env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, conn).value_or("<unset>"), "8") << r;
  EXPECT_EQ(printed_env(r.out, copy).value_or("<unset>"), "1") << r;
  Proc& q = start({"sh", "-c", "echo quit | " + kFakeMps}, env);
  q.wait();
}

TEST_F(E2E, AnotherUsersMpsServerIsNamedNeverWaitedForSilently) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  Proc& server = start(as_user(*other, {"sleep", "30"}));  // stands for the server the daemon runs for them
  ASSERT_TRUE(wait_until([&] { return fs::exists("/proc/" + std::to_string(server.pid)); }));
  Env env = env_;
  env["NVTASKSET_MPS_CONTROL"] = kFakeMps;
  env["FAKE_MPS_SERVERS"] = std::to_string(server.pid) + ":3";
  env["FAKE_MPS_IDLE_MS"] = "20000";
  const std::string marker = path("marker");
  Result r = run({kCli, "-t", "0-1", "touch", marker}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(exists(marker));
  EXPECT_NE(r.err.find("serves user nvtaskset-e2e with 3 clients: this task waits until they exit"),
            std::string::npos)
      << r;
  ::unlink(marker.c_str());
  // An unknown value is said, and the default (wait) applies.
  env["NVTASKSET_MPS_OTHER_USER"] = "bogus";
  r = run({kCli, "-t", "0-1", "touch", marker}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("NVTASKSET_MPS_OTHER_USER=bogus: unknown value (wait|fail); using wait"), std::string::npos)
      << r;
  ::unlink(marker.c_str());
  env["NVTASKSET_MPS_OTHER_USER"] = "FAIL";  // any case, as every choice option
  r = run({kCli, "-t", "0-1", "touch", marker}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_FALSE(exists(marker));
  // --status shows the server and whom it serves.
  const Result st = run({kCli, "--status"}, env);
  EXPECT_NE(st.out.find("mps: server pid " + std::to_string(server.pid) + " serves user nvtaskset-e2e, 3 clients"),
            std::string::npos)
      << st;
  // Our own user's server is no reason to warn.
  env["FAKE_MPS_SERVERS"] = std::to_string(::getpid()) + ":1";
  Proc& q = start({"sh", "-c", "echo quit | " + kFakeMps}, env);
  q.wait();
  env.erase("NVTASKSET_MPS_OTHER_USER");
  r = run({kCli, "-t", "0-1", "touch", marker}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(r.err.find("serves user"), std::string::npos) << r;
  Proc& q2 = start({"sh", "-c", "echo quit | " + kFakeMps}, env);
  q2.wait();
}
