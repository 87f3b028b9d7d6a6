// SPDX-License-Identifier: Apache-2.0
// What every end-to-end test file shares: the fixture that starts the real
// `nvtaskset` binary and the real shim against the stand-in driver
// (tests/fakecuda), reads what the stand-in recorded for each launch, and
// kills whatever is still running at the end of a test. Each test file
// includes it and builds on its own, so the files compile in parallel; the
// fixture's code is compiled once, in e2e_fixture.cpp, not in every file.
#pragma once

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

namespace e2e {

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

inline std::string shim_dir() { return fs::path(kShim).parent_path().string(); }

// The descriptor through which process `pid` holds its control region (an
// anonymous memory file, "/memfd:nvtaskset.<pid>"), or "" when it has none.
std::string region_fd(long pid);

// Any child (nvtaskset, -p, a launcher) must finish within this.
constexpr Ms kTimeout = 20s;
// Waiting for a file, a record, a process state.
constexpr Ms kWait = 10s;

using Env = std::map<std::string, std::string>;

std::string read_file(const std::string& path);
std::vector<std::string> lines_of(const std::string& s);
bool exists(const std::string& p);
void touch(const std::string& p);
bool wait_until(const std::function<bool()>& pred, Ms timeout = kWait);

// "0x" + minimal lowercase hex of a 128-bit value, as the stand-in records it.
std::string hex128(std::uint64_t hi, std::uint64_t lo);
// The disable mask a V01-V03 TMD (64-bit mask field) gets for an enable mask.
inline std::string disable64(std::uint64_t enabled) { return hex128(0, ~enabled); }
// The disable mask a V04/V05 TMD (128-bit mask field) gets.
inline std::string disable128(std::uint64_t enabled_hi, std::uint64_t enabled_lo) { return hex128(~enabled_hi, ~enabled_lo); }

struct Result {
  bool timed_out = false;
  bool exited = false;  // exited normally (not by a signal)
  int code = -1;        // exit status when exited
  int signal = 0;       // terminating signal otherwise
  std::string out, err;
  std::string command;
};

std::ostream& operator<<(std::ostream& os, const Result& r);

::testing::AssertionResult ExitedWith(const Result& r, int code);
// The CLI's error contract: exactly one line on stderr, "nvtaskset: <message>".
::testing::AssertionResult OneErrorLine(const Result& r);
::testing::AssertionResult FailedWithOneLine(const Result& r, int code = 1);

struct Record {
  long pid = 0;
  std::string layout;
  int valid = -1;
  std::string mask;
  std::string source;  // "launch", or "graph<grid width>" for a graph kernel node
};

std::ostream& operator<<(std::ostream& os, const Record& r);

// A started child process, in its own process group.
struct Proc {
  pid_t pid = -1;
  std::string out_path, err_path, command;
  bool reaped = false;
  Result result;

  std::string out() const { return read_file(out_path); }
  std::string err() const { return read_file(err_path); }

  bool running();
  Result wait(Ms timeout = kTimeout);
  void kill_group();

 private:
  void finish(int st, bool timed_out);
};

class E2E : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // `lib` as LD_PRELOAD can name it: ld.so splits LD_PRELOAD at ' ' and ':'
  // with no escape, so a library under a path that holds one (a checkout at
  // such a path) is named by a link of the same name in this test's
  // directory.
  std::string preloadable(const std::string& lib) const {
    if (lib.find_first_of(" :") == std::string::npos) return lib;
    // One link per library: the shim and the stand-in driver are both libcuda.so.1.
    const std::string link = path("preload." + std::to_string(std::hash<std::string>{}(lib) % 1000000) + "." +
                                  fs::path(lib).filename().string());
    std::error_code ec;
    if (!fs::is_symlink(link, ec)) fs::create_symlink(lib, link);
    return link;
  }

  // The CLI, its shim, the stand-in driver and the launchers, copied into this
  // test's directory for the tests that run them as a second user: the build
  // tree may sit where no other user can open a file (a checkout under
  // `mktemp -d` is 0700), and the loader then cannot open the shim or the
  // driver. The copied CLI finds the copied shim next to it (../lib/nvtaskset),
  // and this test's environment names the copied driver.
  struct Copies {
    std::string cli, shim, launcher, launcher_dlopen;
  };
  Copies copies_for_other_users();

  // The caller's environment without anything that could steer the shim, the
  // stand-in, CUDA or MPS, plus the stand-in as the real driver.
  Env base_env() const;

  Proc& start(const std::vector<std::string>& argv, const Env& env);
  Proc& start(const std::vector<std::string>& argv) { return start(argv, env_); }

  Result run(const std::vector<std::string>& argv, const Env& env, Ms timeout = kTimeout) {
    return start(argv, env).wait(timeout);
  }
  Result run(const std::vector<std::string>& argv) { return run(argv, env_); }

  std::vector<Record> records() const;
  std::vector<Record> records_of(long pid) const;

  // Waits for a launcher's --ready-file and returns the pid it wrote.
  long wait_ready(const std::string& ready, Proc& p);

  // The pid a launcher printed on its first line ("pid N").
  static long printed_pid(const std::string& out);

  // Value printed by the launcher's --print-env NAME.
  static std::optional<std::string> printed_env(const std::string& out, const std::string& name);

  // Waits until `n` records of `pid` come after index `from` in the record
  // file, then returns those after `from + skip`.
  std::vector<Record> records_after(long pid, std::size_t from, std::size_t skip, std::size_t n);

  std::string dir_;
  std::string record_;
  Env env_;
  std::vector<std::unique_ptr<Proc>> procs_;
  std::vector<std::string> cleanup_;
};

std::string pid_line(long pid, const std::string& what, const std::string& value);

// Every record of `pid` from a graph kernel node, from index `from` on
// (test_graphs.cpp, test_clusters.cpp).
std::vector<Record> graph_records(const std::vector<Record>& all, long pid, std::size_t from = 0);

// The stand-in's device 0 (its UUID is fixed, fakecuda.cpp) as a Hopper part
// with 8 TPCs whose mask bits are scattered, not monotone, some above 63,
// like an H200's: TPC k -> bit kBits[k]. GPC 0 = TPCs 0,2,4,6; GPC 1 = 1,3,5;
// TPC 7's GPC is unknown.
constexpr std::array<unsigned, 8> kBits = {9, 3, 70, 12, 100, 5, 64, 1};
const std::string kStandInUuid = "GPU-fa4ecda0-0000-4000-8000-000000000000";

std::string hopper_topology_json(const std::string& uuid = kStandInUuid, const std::array<unsigned, 8>& bits = kBits);

// The 128-bit disable mask the TMD must get when `tpcs` are enabled.
std::string hopper_disable(const std::vector<unsigned>& tpcs);

class TopologyFile : public E2E {
 protected:
  void SetUp() override;
  std::string file_;
};

// A second Unix user, for the tests of what another user can do. CI runs as
// root and can create one; elsewhere these tests say why they cannot run.
// Another name gives another user (two users who are not root).
std::optional<std::pair<uid_t, gid_t>> second_user(const char* name = "nvtaskset-e2e");

// argv run as `user` (setpriv from util-linux).
std::vector<std::string> as_user(std::pair<uid_t, gid_t> user, std::vector<std::string> argv);

// --- sharing a GPU: -n, --exclusive, --status, -a (test_sharing.cpp, test_fail_closed.cpp) ------
// On the Hopper-like layout of TopologyFile: GPC 0 = TPCs 0,2,4,6; GPC 1 =
// 1,3,5; TPC 7 of unknown GPC.

class Sharing : public TopologyFile {
 protected:
  void SetUp() override;
  // A task that launches a kernel every 5 ms until told to stop.
  long start_task(const std::vector<std::string>& options, const std::string& tag, Proc** out = nullptr,
                  const std::vector<std::string>& launcher_args = {}, const std::string& launcher = kLauncher);
  void stop_all();
  std::vector<Proc*> tasks_;
  std::string mask_of(long pid);
};

}  // namespace e2e
