// SPDX-License-Identifier: Apache-2.0
// The fixture of the end-to-end tests of --latency-critical and --best-effort
// (test_roles_*.cpp): the real CLI and
// shim on the stand-in driver. FAKECUDA_HOLD keeps a task's kernels
// "running" while a file exists, so a latency-critical (LC) task is busy
// for as long as a test wants, without any timing; NVTASKSET_TEST_BURST_MS
// makes its burst (and a best-effort task's hold) last that long. What the
// tasks do is read from `--status --json` (polled until a state is reached,
// with a generous deadline) and from the masks the stand-in recorded for
// each kernel. On the default stand-in GPU (8 TPCs, TPC k = mask bit k),
// "0xffffffffffffff00" is a kernel on all 8 TPCs.
#pragma once

#include <sys/syscall.h>

#include "e2e_fixture.hpp"

namespace roles_e2e {
using namespace e2e;

// The disable mask of a kernel on the TPCs whose bits `enabled` sets.
inline std::string on(std::uint64_t enabled) { return disable64(enabled); }
inline const std::string kAll = on(0xff);

constexpr Ms kStateWait = 20s;

class Roles : public E2E {
 protected:
  void SetUp() override {
    E2E::SetUp();
    hold_ = path("hold");
    env_["FAKECUDA_HOLD"] = hold_;
    env_["NVTASKSET_TEST_GATE_SLEEP_MS"] = "600000";
  }

  // A task that launches a kernel every 20 ms until until.<tag> exists;
  // with `idle`, one kernel and then none until until.<tag> exists. Returns
  // its pid once it made its first launch (-1 if it did not). With `env`,
  // that environment instead of the fixture's.
  long start_task(const std::vector<std::string>& options, const std::string& tag, Proc** out = nullptr,
                  bool idle = false, const Env* env = nullptr) {
    std::vector<std::string> argv{kCli, "--no-mps"};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back(kLauncher);
    if (idle) argv.insert(argv.end(), {"--kernels", "1", "--idle-until", path("until." + tag)});
    else argv.insert(argv.end(), {"--until-file", path("until." + tag), "--interval-ms", "20"});
    argv.insert(argv.end(), {"--ready-file", path("ready." + tag)});
    Proc& p = start(argv, env != nullptr ? *env : env_);
    if (out) *out = &p;
    return wait_ready(path("ready." + tag), p);
  }
  // An LC task on TPCs 0-1 whose kernels stay "running" (the hold file)
  // and which bursts for as long as a test runs; its pid once it bursts
  // (-1, with the failure added, if it does not). `one_kernel`: it launches
  // one kernel and no more, so that once the hold file goes it stays idle
  // (otherwise it launches every 20 ms).
  long start_bursting_lc(Proc** out, bool one_kernel = false) {
    env_["NVTASKSET_TEST_BURST_MS"] = "600000";
    touch(hold_);
    const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", out, one_kernel);
    if (lc <= 0) {
      ADD_FAILURE() << (*out)->err();
      return -1;
    }
    return wait_state(lc, "bursting") ? lc : -1;
  }
  // An LC task with `args` whose kernels stay "running" (the hold file), so
  // it is busy for 100 ms in a row: its pid once saturated (-1, with the
  // failure added, if it does not get there). `extra` goes into its
  // environment.
  long start_saturated(const std::vector<std::string>& args, const Env& extra, Proc** out) {
    touch(hold_);
    Env env = env_;
    for (const auto& [k, v] : extra) env[k] = v;
    const long lc = start_task(args, "lc", out, false, &env);
    if (lc <= 0) {
      ADD_FAILURE() << (*out)->err();
      return -1;
    }
    if (!wait_state(lc, "saturated")) {
      ADD_FAILURE() << "not saturated";
      return -1;
    }
    return lc;
  }
  // A saturated LC task on TPCs 0-1, its top-up off: no reference probes
  // (during which best-effort tasks hold), and the floor is the partition
  // minus the reservation.
  long start_saturated_lc(Proc** out) {
    return start_saturated({"-t", "0-1", "--latency-critical"}, {{"NVTASKSET_LC_TOPUP", "off"}}, out);
  }
  // A saturated LC task on `tpcs` of the Hopper layout (hopper_topology_json,
  // written to `topo`).
  long start_saturated_hopper_lc(const std::string& tpcs, const std::string& topo, const Env& extra, Proc** out) {
    env_["FAKECUDA_CC"] = "9.0";
    std::ofstream(topo) << hopper_topology_json();
    return start_saturated({"--topology-file", topo, "-t", tpcs, "--latency-critical"}, extra, out);
  }
  // An LC task on TPCs 0-1 that launched once and is idle; from then on
  // every kernel launched keeps "running" (the hold file), so a BE task's
  // queue fills. Its pid (-1, with the failure added, if it did not start).
  long start_idle_lc_then_hold(Proc** out) {
    const long lc = start_idle_lc(out);
    if (lc > 0) touch(hold_);
    return lc;
  }
  // An LC task on TPCs 0-1 that launched once and is idle: its pid (-1,
  // with the failure added, if it did not start).
  long start_idle_lc(Proc** out) {
    const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", out, true);
    if (lc <= 0 || !wait_state(lc, "idle")) {
      ADD_FAILURE() << "the idle LC task did not start";
      return -1;
    }
    return lc;
  }
  // A BE task of 10 launches (with `env`) whose kernels stay "running"
  // (hold_ exists): its status entry once it waited for its queue, which
  // then holds 4 of them, give or take the one launch that found it full
  // (a queue of 4: nothing more until they run).
  nlohmann::json be_waiting_at_four(const Env& env, Proc** out) {
    Proc& be = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "10"}, env);
    *out = &be;
    const nlohmann::json t =
        wait_task(be.pid, [](const nlohmann::json& x) { return counter(x, "queue_waits") >= 1; }, "a queue wait");
    const auto queued = records_of(be.pid);
    EXPECT_GE(queued.size(), 4u);
    EXPECT_LE(queued.size(), 5u);
    EXPECT_EQ(t.value("kernels_launched", 0UL), queued.size()) << t.dump();
    EXPECT_EQ(counter(t, "queue_waits"), 1u) << t.dump();
    return t;
  }
  // An idle LC task whose kernels from then on stay "running"
  // (start_idle_lc_then_hold), and a BE task with `extra` in its
  // environment that launches every 20 ms ("until.be"); the BE task, or
  // nullptr (with the failure added) if either did not start.
  Proc* start_be_next_to_idle_lc(const Env& extra, Proc** lc) {
    if (start_idle_lc_then_hold(lc) <= 0) return nullptr;
    Env env = env_;
    for (const auto& [k, v] : extra) env[k] = v;
    Proc* be = nullptr;
    if (start_task({"--best-effort"}, "be", &be, false, &env) <= 0) {
      ADD_FAILURE() << "the BE task did not start";
      return nullptr;
    }
    return be;
  }
  void stop(const std::string& tag, Proc& p) {
    touch(path("until." + tag));
    EXPECT_TRUE(ExitedWith(p.wait(), 0)) << p.command;
  }

  nlohmann::json status_json() {
    const Result r = run({kCli, "--status", "--json"});
    if (!ExitedWith(r, 0)) {
      ADD_FAILURE() << r;
      return nullptr;
    }
    return nlohmann::json::parse(r.out, nullptr, false);
  }
  static nlohmann::json task_in(const nlohmann::json& st, long pid) {
    if (st.is_object() && st.contains("tasks"))
      for (const auto& t : st["tasks"])
        if (t.value("pid", -1L) == pid) return t;
    return nullptr;
  }
  nlohmann::json task(long pid) { return task_in(status_json(), pid); }
  static std::string state(const nlohmann::json& t) {
    if (!t.is_object() || !t.contains("controller") || !t["controller"].is_object()) return "";
    return t["controller"].value("state", "");
  }
  // Polls --status --json until `pred` holds for pid's entry; the last
  // entry seen either way (a failure says what it was).
  nlohmann::json wait_task(long pid, const std::function<bool(const nlohmann::json&)>& pred, const std::string& what,
                           Ms timeout = kStateWait) {
    nlohmann::json t;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      t = task(pid);
      if (!t.is_null() && pred(t)) return t;
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "pid " << pid << " never reached: " << what << "; last entry: " << t.dump();
        return t;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  bool wait_state(long pid, const std::string& want) {
    const nlohmann::json t = wait_task(pid, [&](const nlohmann::json& x) { return state(x) == want; }, "state " + want);
    return state(t) == want;
  }
  static std::uint64_t counter(const nlohmann::json& t, const char* name) {
    return t.is_object() && t.contains("controller") ? t["controller"].value(name, std::uint64_t{0}) : 0;
  }

  // The ROLE column of pid's row in the table `--status` prints.
  std::string role_column(long pid) {
    const Result r = run({kCli, "--status"});
    EXPECT_TRUE(ExitedWith(r, 0)) << r;
    for (const std::string& l : lines_of(r.out)) {
      std::istringstream in(l);
      std::vector<std::string> cols;
      for (std::string c; in >> c;) cols.push_back(c);
      if (cols.size() > 6 && cols[0] == std::to_string(pid)) return cols[6];
    }
    ADD_FAILURE() << "no row for pid " << pid << " in:\n" << r.out;
    return "";
  }

  // Waits until pid has `n` records; returns them all.
  std::vector<Record> wait_records(long pid, std::size_t n) {
    std::vector<Record> got;
    wait_until([&] { return (got = records_of(pid)).size() >= n; }, kStateWait);
    EXPECT_GE(got.size(), n) << "launches of pid " << pid;
    return got;
  }

  std::vector<std::string> beacons_of(long pid) {
    std::vector<std::string> out;
    const std::string prefix = "nvtaskset-beacon." + std::to_string(pid) + ".";
    for (const auto& e : fs::directory_iterator(path("status")))
      if (e.path().filename().string().starts_with(prefix)) out.push_back(e.path().string());
    return out;
  }

  // A best-effort task with `bad` in its environment: it runs its 3
  // kernels and says one line, which holds `warning`.
  ::testing::AssertionResult one_warning_and_runs(const Env& bad, const std::string& warning) {
    Env env = env_;
    for (const auto& [k, v] : bad) env[k] = v;
    const Result r = run({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "3"}, env);
    if (!ExitedWith(r, 0)) return ::testing::AssertionFailure() << r;
    const auto ls = lines_of(r.err);
    if (ls.size() != 1 || ls[0].find(warning) == std::string::npos)
      return ::testing::AssertionFailure() << "not one line with \"" << warning << "\": " << r;
    if (records_of(printed_pid(r.out)).size() != 3) return ::testing::AssertionFailure() << "not 3 kernels: " << r;
    return ::testing::AssertionSuccess();
  }

  // A BE task launching every 20 ms ("until.be") whose gate waits the
  // stand-in appends to `waits`: once one was queued open (its gatekeeper
  // decided, every LC task idle); nullptr, with the failure added, if not.
  Proc* start_be_with_open_gate(const std::string& waits) {
    Env env = env_;
    env["FAKECUDA_WAITS"] = waits;
    Proc* be = nullptr;
    if (start_task({"--best-effort"}, "be", &be, false, &env) <= 0) {
      ADD_FAILURE() << "the BE task did not start: " << be->err();
      return nullptr;
    }
    const std::string open = std::to_string(be->pid) + " wait 0 0";
    if (!wait_until([&] { return read_file(waits).find(open) != std::string::npos; }, kStateWait)) {
      ADD_FAILURE() << "no gate queued open: " << read_file(waits);
      return nullptr;
    }
    return be;
  }

  // What pid's gatekeeper thread (nvt-gatekeeper) is doing: the fields of
  // /proc/<pid>/task/<tid>/syscall (the call's number and arguments, or
  // "running"); none if it has no such thread.
  static std::vector<std::string> gatekeeper_syscall(long pid) {
    std::error_code ec;
    for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
      if (read_file(t.path().string() + "/comm") != "nvt-gatekeeper\n") continue;
      std::istringstream in(read_file(t.path().string() + "/syscall"));
      std::vector<std::string> out;
      for (std::string f; in >> f;) out.push_back(f);
      return out;
    }
    return {};
  }

  std::string hold_;
};

inline ::testing::AssertionResult AllOn(const std::vector<Record>& recs, const std::string& mask) {
  if (recs.empty()) return ::testing::AssertionFailure() << "no launch recorded";
  for (const Record& r : recs)
    if (r.mask != mask || r.valid != 1)
      return ::testing::AssertionFailure() << "launch [" << r << "], expected mask " << mask;
  return ::testing::AssertionSuccess();
}

}  // namespace roles_e2e
