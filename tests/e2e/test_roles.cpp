// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of --latency-critical and --best-effort: the real CLI and
// shim on the stand-in driver. FAKECUDA_HOLD keeps a task's kernels
// "running" while a file exists, so a latency-critical (LC) task is busy
// for as long as a test wants, without any timing; NVTASKSET_TEST_BURST_MS
// makes its burst (and a best-effort task's hold) last that long. What the
// tasks do is read from `--status --json` (polled until a state is reached,
// with a generous deadline) and from the masks the stand-in recorded for
// each kernel. On the default stand-in GPU (8 TPCs, TPC k = mask bit k),
// "0xffffffffffffff00" is a kernel on all 8 TPCs.
#include <sys/syscall.h>

#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// The disable mask of a kernel on the TPCs whose bits `enabled` sets.
std::string on(std::uint64_t enabled) { return disable64(enabled); }
const std::string kAll = on(0xff);

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
  // An LC task on `tpcs` of the Hopper layout (hopper_topology_json,
  // written to `topo`) whose kernels stay "running" (the hold file): its pid
  // once saturated (-1, with the failure added, if it does not get there).
  // `extra` goes into its environment.
  long start_saturated_hopper_lc(const std::string& tpcs, const std::string& topo, const Env& extra, Proc** out) {
    env_["FAKECUDA_CC"] = "9.0";
    std::ofstream(topo) << hopper_topology_json();
    touch(hold_);
    Env env = env_;
    for (const auto& [k, v] : extra) env[k] = v;
    const long lc = start_task({"--topology-file", topo, "-t", tpcs, "--latency-critical"}, "lc", out, false, &env);
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

::testing::AssertionResult AllOn(const std::vector<Record>& recs, const std::string& mask) {
  if (recs.empty()) return ::testing::AssertionFailure() << "no launch recorded";
  for (const Record& r : recs)
    if (r.mask != mask || r.valid != 1)
      return ::testing::AssertionFailure() << "launch [" << r << "], expected mask " << mask;
  return ::testing::AssertionSuccess();
}

// ---- (a) a bursting LC task holds BE launches back; idle, it lends them everything ----

// NVTASKSET_BE_YIELD=hold: the BE task's launches wait on the CPU.
TEST_F(Roles, BestEffortHoldsWhileTheLatencyCriticalTaskBurstsThenRunsOnAllTpcs) {
  env_["NVTASKSET_BE_YIELD"] = "hold";
  Proc* lcp = nullptr;
  const long lc = start_bursting_lc(&lcp);
  ASSERT_GT(lc, 0);

  Proc& be = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "2", "--until-file", path("until.be"),
                    "--interval-ms", "20", "--ready-file", path("ready.be")});
  ASSERT_TRUE(wait_state(be.pid, "holding")) << be.err();
  const nlohmann::json st = status_json();
  const nlohmann::json tl = task_in(st, lc), tb = task_in(st, be.pid);
  EXPECT_EQ(state(tl), "bursting") << tl.dump();
  EXPECT_EQ(tl["controller"]["may_burst"], true) << tl.dump();
  EXPECT_GE(tl["controller"]["launches"].get<long>(), 1) << tl.dump();
  // Busy: its newest launch has not completed; its controller is alive.
  EXPECT_LT(tl["controller"]["completed"].get<long>(), tl["controller"]["launches"].get<long>()) << tl.dump();
  EXPECT_LT(tl["controller"]["heartbeat_age_ms"].get<long>(), 250) << tl.dump();
  // A BE partition takes nothing from the LC task's burst.
  EXPECT_EQ(tl["controller"]["burst_tpcs"], "0-7") << tl.dump();
  EXPECT_EQ(tb["tpcs"], "0-7") << tb.dump();
  EXPECT_EQ(tb["kernels_launched"], 0) << tb.dump();
  // Their overlap is by design, not sharing.
  EXPECT_TRUE(tl["shares_tpcs_with"].empty()) << tl.dump();
  EXPECT_TRUE(tb["shares_tpcs_with"].empty()) << tb.dump();
  EXPECT_TRUE(records_of(be.pid).empty()) << "a BE kernel ran while the LC task was bursting";
  EXPECT_TRUE(be.running());

  // The LC task's work completes: it goes idle, and the BE's kernels run on every TPC.
  fs::remove(hold_);
  EXPECT_TRUE(AllOn(wait_records(be.pid, 2), kAll));
  const nlohmann::json after = task(be.pid);
  EXPECT_GE(counter(after, "launches_held"), 1u) << after.dump();
  EXPECT_GT(after["controller"].value("held_ms", 0.0), 0.0) << after.dump();
  EXPECT_EQ(counter(after, "launches_on_floor"), 0u) << after.dump();
  stop("be", be);
  // Every LC kernel had its burst: all TPCs, since nothing else holds any.
  EXPECT_TRUE(AllOn(records_of(lc), kAll));
  stop("lc", *lcp);
}

// NVTASKSET_BE_YIELD: while an LC task bursts, a BE task's launches go on
// its floor (floor) or on all its TPCs (run) without waiting; hold is the
// test above, gate (the default) the one below.
TEST_F(Roles, BestEffortYieldsAsAskedWhileTheLatencyCriticalTaskBursts) {
  Proc* lcp = nullptr;
  const long lc = start_bursting_lc(&lcp);
  ASSERT_GT(lc, 0);
  for (const auto& [yield, mask] : {std::pair{"floor", on(0xfc)}, std::pair{"run", kAll}}) {
    Env env = env_;
    env["NVTASKSET_BE_YIELD"] = yield;
    // Two launches, with the LC task busy and bursting throughout.
    const Result r = run({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "2"}, env);
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_EQ(r.err.find("NVTASKSET_BE_YIELD"), std::string::npos) << r;
    EXPECT_TRUE(AllOn(records_of(printed_pid(r.out)), mask)) << yield;
    EXPECT_EQ(state(task(lc)), "bursting") << yield;
  }
  // A value that is none of them: one warning, and the default (gate): the
  // launch is made, on the floor, behind a gate the gatekeeper closed.
  Env env = env_;
  env["NVTASKSET_BE_YIELD"] = "later";
  Proc& be = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "1", "--until-file", path("until.be"),
                    "--ready-file", path("ready.be")}, env);
  EXPECT_TRUE(AllOn(wait_records(be.pid, 1), on(0xfc)));
  ASSERT_TRUE(wait_state(be.pid, "holding")) << be.err();
  const nlohmann::json t =
      wait_task(be.pid, [](const nlohmann::json& x) { return counter(x, "gates_queued") >= 1; }, "a gate queued");
  EXPECT_GE(counter(t, "gates_queued"), 1u) << t.dump();
  // The LC task's work completes: the gate opens, and the BE's kernels
  // queued behind it complete (the task waits for them: its queue bound).
  fs::remove(hold_);
  wait_task(be.pid, [](const nlohmann::json& x) { return state(x) == "running"; }, "running");
  stop("be", be);
  EXPECT_NE(be.err().find("NVTASKSET_BE_YIELD: not gate, hold, floor or run; using gate"), std::string::npos)
      << be.err();
  stop("lc", *lcp);
}

// NVTASKSET_BE_YIELD=gate (the default): while an LC task bursts, a BE task's launches
// are not held on the CPU: they go on its floor, queued behind a gate (a
// wait on a word of its own mapped memory) that its gatekeeper closed; once
// the LC task is idle the gate opens and its kernels run on every TPC again.
TEST_F(Roles, BestEffortGateStopsItsStreamOnTheGpuWhileTheLatencyCriticalTaskBursts) {
  Proc* lcp = nullptr;
  const long lc = start_bursting_lc(&lcp);
  ASSERT_GT(lc, 0);
  Env env = env_;  // (the default: no NVTASKSET_BE_YIELD)
  const std::string waits = path("waits");
  env["FAKECUDA_WAITS"] = waits;
  Proc* be = nullptr;
  ASSERT_GT(start_task({"--best-effort"}, "be", &be, false, &env), 0) << be->err();
  // Launched, not held: on the floor (TPCs 2-7), while the LC task bursts.
  EXPECT_TRUE(AllOn(wait_records(be->pid, 3), on(0xfc)));
  ASSERT_TRUE(wait_state(be->pid, "holding")) << be->err();
  EXPECT_EQ(state(task(lc)), "bursting");
  // A gate queued while closed: "<pid> wait <the word then> <the value waited for>".
  const std::string closed = std::to_string(be->pid) + " wait 1 0";
  EXPECT_TRUE(wait_until([&] { return read_file(waits).find(closed) != std::string::npos; }, kStateWait))
      << read_file(waits);
  // The LC task's work completes: the gate opens, and the BE's kernels run
  // on every TPC again. (The LC task still launches every 20 ms: a BE launch
  // made while one of those is in flight goes on the floor, as it should.)
  fs::remove(hold_);
  const std::size_t before = records_of(be->pid).size();
  const auto all_again = [&] {
    const auto recs = records_of(be->pid);
    return std::any_of(recs.begin() + static_cast<std::ptrdiff_t>(std::min(before, recs.size())), recs.end(),
                       [](const Record& r) { return r.mask == kAll && r.valid == 1; });
  };
  EXPECT_TRUE(wait_until(all_again, kStateWait)) << "no BE kernel on every TPC after the LC task went idle";
  wait_task(be->pid, [](const nlohmann::json& x) { return state(x) == "running"; }, "running");
  // A gate queued open after the closed one (the first gate may be queued
  // before the gatekeeper first closed it).
  const std::string open = std::to_string(be->pid) + " wait 0 0";
  EXPECT_TRUE(wait_until(
      [&] {
        const std::string w = read_file(waits);
        const std::size_t c = w.find(closed);
        return c != std::string::npos && w.find(open, c) != std::string::npos;
      },
      kStateWait))
      << read_file(waits);
  // The counters, once the launches that queued those gates are counted
  // (each is bumped after its driver call returns).
  const nlohmann::json t =
      wait_task(be->pid, [](const nlohmann::json& x) { return counter(x, "gates_queued") >= 2; }, "gates_queued >= 2");
  EXPECT_GE(counter(t, "launches_held"), 1u) << t.dump();  // the gate's closings
  EXPECT_GT(t["controller"].value("held_ms", 0.0), 0.0) << t.dump();
  EXPECT_GE(counter(t, "gates_queued"), 2u) << t.dump();
  stop("be", *be);
  EXPECT_EQ(be->err().find("NVTASKSET_BE"), std::string::npos) << be->err();
  stop("lc", *lcp);
}

// Next to one LC task that needs no hold, the BE task's gatekeeper sleeps on
// the LC task's beacon (a shared futex) instead of polling every 20 us, and
// the LC task wakes it when it turns busy. The sleep is stretched to 10
// minutes here (NVTASKSET_TEST_GATE_SLEEP_MS): a wake that went missing
// would leave the gate open for the rest of the test.
TEST_F(Roles, BestEffortGatekeeperSleepsNextToAnIdleLatencyCriticalTaskAndIsWokenWhenItTurnsBusy) {
  env_["NVTASKSET_TEST_BURST_MS"] = "600000";
  Proc& lcp = start({kCli, "--no-mps", "-t", "0-1", "--latency-critical", kLauncher, "--kernels", "1", "--idle-until",
                     path("until.lc"), "--launch-when", path("busy.lc"), "--ready-file", path("ready.lc")},
                    env_);
  const long lc = wait_ready(path("ready.lc"), lcp);
  ASSERT_GT(lc, 0) << lcp.err();
  ASSERT_TRUE(wait_state(lc, "idle"));
  const std::string waits = path("waits");
  Proc* be = start_be_with_open_gate(waits);  // borrowing: on every TPC, its gates queued open
  ASSERT_NE(be, nullptr);
  // Its gatekeeper thread asleep on the beacon: in futex(FUTEX_WAIT) on a
  // shared word (op 0; a lock's wait is FUTEX_WAIT_PRIVATE, 0x80), not in a
  // 20-us sleep.
  const auto asleep_on_beacon = [&] {
    const auto c = gatekeeper_syscall(be->pid);
    return c.size() > 2 && c[0] == std::to_string(SYS_futex) && c[2] == "0x0";
  };
  EXPECT_TRUE(wait_until(asleep_on_beacon, kStateWait)) << "the gatekeeper never slept on the LC task's beacon";
  // The LC task launches one kernel that keeps "running": it bursts, and the
  // BE task's gate closes at once, not after the 10-minute sleep.
  touch(hold_);
  touch(path("busy.lc"));
  ASSERT_TRUE(wait_state(lc, "bursting"));
  EXPECT_TRUE(wait_state(be->pid, "holding")) << be->err();
  const std::string closed = std::to_string(be->pid) + " wait 1 0";
  EXPECT_TRUE(wait_until([&] { return read_file(waits).find(closed) != std::string::npos; }, kStateWait))
      << read_file(waits);
  fs::remove(hold_);
  stop("be", *be);
  stop("lc", lcp);
}

// Next to several idle LC tasks the gatekeeper sleeps on all their beacons
// at once (futex_waitv, Linux 5.16; where the kernel lacks it, it polls
// every 20 us as before), and a burst of any one of them stops the BE task's
// stream. The sleep is stretched to 10 minutes here, as everywhere in Roles.
TEST_F(Roles, BestEffortGatekeeperSleepsNextToSeveralIdleLatencyCriticalTasksAndIsWokenByAny) {
  Proc* first = nullptr;
  ASSERT_GT(start_idle_lc(&first), 0);
  env_["NVTASKSET_TEST_BURST_MS"] = "600000";
  Proc& second = start({kCli, "--no-mps", "-t", "2-3", "--latency-critical", kLauncher, "--kernels", "1",
                        "--idle-until", path("until.lc2"), "--launch-when", path("busy.lc2"), "--ready-file",
                        path("ready.lc2")},
                       env_);
  const long lc2 = wait_ready(path("ready.lc2"), second);
  ASSERT_GT(lc2, 0) << second.err();
  ASSERT_TRUE(wait_state(lc2, "idle"));
  const std::string waits = path("waits");
  Proc* be = start_be_with_open_gate(waits);
  ASSERT_NE(be, nullptr);
  errno = 0;
  const bool waitv = ::syscall(449, nullptr, 0, 0, nullptr, 0) == -1 && errno != ENOSYS;
  // In futex_waitv (449) where the kernel has it; polling (clock_nanosleep)
  // where it does not.
  const std::string want = waitv ? "449" : std::to_string(SYS_clock_nanosleep);
  EXPECT_TRUE(wait_until(
      [&] {
        const auto c = gatekeeper_syscall(be->pid);
        return !c.empty() && c[0] == want;
      },
      kStateWait))
      << "the gatekeeper was never in syscall " << want;
  touch(hold_);
  touch(path("busy.lc2"));
  ASSERT_TRUE(wait_state(lc2, "bursting"));
  EXPECT_TRUE(wait_state(be->pid, "holding")) << be->err();
  fs::remove(hold_);
  stop("be", *be);
  stop("lc2", second);
  stop("lc", *first);
}

// Asleep on the one LC task it knew, the gatekeeper is woken by its own
// task when another LC task appears: the second one's burst stops the BE
// task's stream as the first one's would.
TEST_F(Roles, BestEffortGatekeeperAsleepOnOneLatencyCriticalTaskSeesASecondOneBurst) {
  Proc* first = nullptr;
  ASSERT_GT(start_idle_lc(&first), 0);
  const std::string waits = path("waits");
  Proc* be = start_be_with_open_gate(waits);
  ASSERT_NE(be, nullptr);
  env_["NVTASKSET_TEST_BURST_MS"] = "600000";
  touch(hold_);
  Proc* second = nullptr;
  const long lc2 = start_task({"-t", "2-3", "--latency-critical"}, "lc2", &second, true);
  ASSERT_GT(lc2, 0) << second->err();
  ASSERT_TRUE(wait_state(lc2, "bursting"));
  EXPECT_TRUE(wait_state(be->pid, "holding")) << be->err();
  fs::remove(hold_);
  stop("be", *be);
  stop("lc2", *second);
  stop("lc", *first);
}

// A task's first launch is gated too: no LC task has been looked for
// before it, and a launch made without its gate while an LC task bursts
// would run at once (on the floor, but over the burst). One launch next to a
// bursting LC task: its gate is queued closed, and the kernel waits behind
// it until the LC task is idle.
TEST_F(Roles, BestEffortFirstLaunchIsQueuedBehindItsGate) {
  Proc* lcp = nullptr;
  const long lc = start_bursting_lc(&lcp);
  ASSERT_GT(lc, 0);
  Env env = env_;
  const std::string waits = path("waits");
  env["FAKECUDA_WAITS"] = waits;
  Proc& be = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "1", "--idle-until", path("until.be"),
                    "--ready-file", path("ready.be")},
                   env);
  ASSERT_GT(wait_ready(path("ready.be"), be), 0);
  const nlohmann::json t =
      wait_task(be.pid, [](const nlohmann::json& x) { return x.value("kernels_launched", 0) == 1; }, "1 launch");
  EXPECT_EQ(counter(t, "gates_queued"), 1u) << t.dump();
  EXPECT_EQ(read_file(waits), std::to_string(be.pid) + " wait 1 0\n");
  EXPECT_TRUE(AllOn(records_of(be.pid), on(0xfc)));
  fs::remove(hold_);
  stop("be", be);
  stop("lc", *lcp);
}

TEST_F(Roles, BadGateSpacingIsOneWarningAndTheTaskRuns) {
  EXPECT_TRUE(one_warning_and_runs({{"NVTASKSET_BE_YIELD", "gate"}, {"NVTASKSET_BE_GATE_EVERY", "65"}},
                                   "NVTASKSET_BE_GATE_EVERY: not a number from 1 to 64; using 2"));
}

// ---- (b) an LC task busy too long stops bursting: BE kernels run on the floor ----------

TEST_F(Roles, SaturatedLatencyCriticalTaskPutsBestEffortOnItsFloor) {
  touch(hold_);
  Proc* lcp = nullptr;
  // Without its top-up (and so without the reference probes, during which
  // best-effort tasks hold): the floor is the partition minus the reservation.
  Env lc_env = env_;
  lc_env["NVTASKSET_LC_TOPUP"] = "off";
  const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", &lcp, false, &lc_env);
  ASSERT_GT(lc, 0) << lcp->err();
  // Busy (its first kernel never completes while the hold file exists)
  // for 100 ms in a row: saturated.
  ASSERT_TRUE(wait_state(lc, "saturated"));
  const nlohmann::json tl = task(lc);
  EXPECT_EQ(tl["controller"]["may_burst"], false) << tl.dump();
  EXPECT_GE(tl["controller"]["saturations"].get<long>(), 1) << tl.dump();
  EXPECT_EQ(tl["controller"]["busy_periods"], 1) << tl.dump();
  EXPECT_EQ(role_column(lc), "lc:saturated");

  // A BE task neither waits for it nor touches its reservation (TPCs 0-1).
  const Result r = run({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "2"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  const long be = printed_pid(r.out);
  const auto recs = records_of(be);
  EXPECT_EQ(recs.size(), 2u);
  EXPECT_TRUE(AllOn(recs, on(0xfc)));

  // Its work done, the LC task goes idle and may burst again.
  fs::remove(hold_);
  wait_task(lc, [](const nlohmann::json& t) { return state(t) == "idle" && t["controller"]["may_burst"] == true; },
            "idle and may burst");
  stop("lc", *lcp);
}

// A saturated LC task runs on its reservation (man page: "stops the burst
// ... best-effort tasks then run on their floor next to it"; roles.hpp: "A
// task that keeps the GPU busy ... then runs on its reservation next to BE
// tasks on their floors").
TEST_F(Roles, SaturatedLatencyCriticalTaskRunsOnItsReservation) {
  touch(hold_);
  Proc* lcp = nullptr;
  // Without its top-up: its probes time nothing here (its kernel is held),
  // and after the first its top-up is its most (ATopUpWithNothingMeasuredIsItsMost).
  Env lc_env = env_;
  lc_env["NVTASKSET_LC_TOPUP"] = "off";
  const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", &lcp, false, &lc_env);
  ASSERT_GT(lc, 0) << lcp->err();
  ASSERT_TRUE(wait_state(lc, "saturated"));
  const std::size_t from = records().size();
  const auto recs = records_after(lc, from, 0, 3);
  EXPECT_TRUE(AllOn(recs, on(0x03)));
  fs::remove(hold_);
  stop("lc", *lcp);
}

// A saturated LC task's reservation holds for a BE task's clustered
// kernels too. A kernel with clusters of C blocks runs only where C SMs of
// one GPC are in its mask (docs/hardware.md), and bf16 cuBLAS matmuls launch
// clusters of 2 and 4 on an H100, so a BE task that kept every clustered
// kernel off its floor trained mostly on the LC task's TPCs. It goes on the
// floor where the floor hosts its clusters; a larger one runs on the whole
// partition and is counted (it would never run on the floor).
// Hopper layout (TopologyFile): GPC 0 = TPCs 0,2,4,6 (clusters up to 8),
// GPC 1 = 1,3,5 (up to 4), TPC 7 of no GPC. LC -t 0,2 leaves the floor
// 1,3-7: clusters of at most 4 (TPCs 4,6 of GPC 0; 1,3,5 capped at 4).
TEST_F(Roles, SaturatedLatencyCriticalTaskKeepsClusteredBestEffortKernelsOnTheFloorThatHostsThem) {
  const std::string topo = path("topology.json");
  Proc* lcp = nullptr;
  // Without its top-up: its probes time nothing here (its kernel is held),
  // and its top-up would then be its most (the next test has one).
  const long lc = start_saturated_hopper_lc("0,2", topo, {{"NVTASKSET_LC_TOPUP", "off"}}, &lcp);
  ASSERT_GT(lc, 0);
  auto be = [&](unsigned cluster) {
    const Result r = run({kCli, "--no-mps", "--topology-file", topo, "--best-effort", kGraphLauncher, "--mode",
                          "eager", "--cluster", std::to_string(cluster), "--nodes", "1", "--replays", "2"},
                         env_);
    EXPECT_TRUE(ExitedWith(r, 0)) << r;
    const long pid = printed_pid(r.out);
    EXPECT_EQ(r.err.find("NVTASKSET_CLUSTER_MAP"), std::string::npos) << r.err;
    return records_of(pid);
  };
  const std::string floor = hopper_disable({1, 3, 4, 5, 6, 7});
  EXPECT_TRUE(AllOn(be(2), floor)) << "clusters of 2";
  EXPECT_TRUE(AllOn(be(4), floor)) << "clusters of 4";
  // Clusters of 8 fit only GPC 0 whole: not on the floor.
  EXPECT_TRUE(AllOn(be(8), hopper_disable({0, 1, 2, 3, 4, 5, 6, 7}))) << "clusters of 8";
  ASSERT_EQ(state(task(lc)), "saturated") << "the LC task stopped being saturated during the test";
  // --status counts such kernels and says so.
  const std::string until = path("until.be"), ready = path("ready.be");
  Proc& bep = start({kCli, "--no-mps", "--topology-file", topo, "--best-effort", kGraphLauncher, "--mode", "eager",
                     "--cluster", "8", "--nodes", "1", "--until-file", until, "--ready-file", ready},
                    env_);
  const long be8 = wait_ready(ready, bep);
  ASSERT_GT(be8, 0) << bep.err();
  wait_task(be8, [](const nlohmann::json& t) { return counter(t, "floor_skipped") >= 1; }, "floor_skipped >= 1");
  const Result st = run({kCli, "--status"});
  EXPECT_NE(st.out.find("pid " + std::to_string(be8) + " ran "), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("their thread-block clusters do not fit its floor"), std::string::npos) << st.out;
  fs::remove(hold_);
  touch(until);
  EXPECT_TRUE(ExitedWith(bep.wait(), 0)) << bep.command;
  stop("lc", *lcp);
}

// A stream capture in CUDA's global mode (PyTorch's) is invalidated by an
// event call of another thread while it is under way (the stand-in does
// so, as the GPU did: docs/runs.md, run 60). The LC task's controller
// thread polls its kernel's event while the task is busy, so it must make
// no driver call from just before a capture begins until it ends: 200
// captures of 1 ms while a held kernel keeps the task busy, none broken.
TEST_F(Roles, LatencyCriticalControllerNeverBreaksAStreamCapture) {
  touch(hold_);
  Proc& p = start({kCli, "--no-mps", "-t", "0-1", "--latency-critical", kLauncher, "--kernels", "1", "--captures",
                   "200", "--ready-file", path("ready.lc")},
                  env_);
  const long lc = wait_ready(path("ready.lc"), p);  // written after the captures
  ASSERT_GT(lc, 0) << p.err();
  EXPECT_NE(state(task(lc)), "idle") << "busy: its controller polls its event";
  fs::remove(hold_);
  const Result r = p.wait();
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("captures 200 invalidated 0"), std::string::npos) << r;
}

// The top-up (roles.hpp, TopUp): a saturated LC task takes TPCs beyond its
// reservation from the BE tasks' floors, as many as its controller measured
// it needs; NVTASKSET_TEST_TOPUP fixes the number, so that this test checks
// where each task's kernels go, not the measurement (unit tests drive that
// with traces). Hopper layout as above; LC -t 1,3,5 (GPC 1 whole), top-up 2
// (at most min(3 reserved, half of the 5 free)): TPC 7 first (it hosts no
// cluster), then GPC 0's first TPC, 0. Soft floor 2,4,6: clusters of at most
// 6 SMs; without the top-up, 0,2,4,6,7: GPC 0 whole, clusters of 8.
TEST_F(Roles, SaturatedLatencyCriticalTaskTakesItsTopUpAndBestEffortKeepsItsClusters) {
  const std::string topo = path("topology.json");
  Proc* lcp = nullptr;
  const long lc = start_saturated_hopper_lc("1,3,5", topo, {{"NVTASKSET_TEST_TOPUP", "2"}}, &lcp);
  ASSERT_GT(lc, 0);
  // (--status without the topology names them by mask bit: TPC 0 is bit 9, TPC 7 bit 1.)
  const nlohmann::json tl =
      wait_task(lc, [](const nlohmann::json& t) { return t["controller"]["topup_size"] == 2; }, "a top-up of 2");
  EXPECT_EQ(tl["controller"]["topup_tpcs"], "physical 0x202") << tl.dump();
  EXPECT_EQ(tl["controller"]["probing"], false) << tl.dump();
  // Its kernels run on its reservation and its top-up.
  const std::size_t from = records().size();
  EXPECT_TRUE(AllOn(records_after(lc, from, 0, 3), hopper_disable({0, 1, 3, 5, 7})));
  // --status says so in the TPC column.
  const Result st = run({kCli, "--status", "--topology-file", topo});
  EXPECT_NE(st.out.find("1,3,5 (topped up with 0,7)"), std::string::npos) << st.out;
  auto be = [&](unsigned cluster) {
    const Result r = run({kCli, "--no-mps", "--topology-file", topo, "--best-effort", kGraphLauncher, "--mode",
                          "eager", "--cluster", std::to_string(cluster), "--nodes", "1", "--replays", "2"},
                         env_);
    EXPECT_TRUE(ExitedWith(r, 0)) << r;
    return records_of(printed_pid(r.out));
  };
  // A BE task's kernels keep off both, where their clusters fit what is left;
  EXPECT_TRUE(AllOn(be(1), hopper_disable({2, 4, 6}))) << "no clusters";
  EXPECT_TRUE(AllOn(be(4), hopper_disable({2, 4, 6}))) << "clusters of 4";
  // a kernel whose clusters only the floor without the top-up hosts runs
  // there: the top-up never takes a BE task's clusters from it.
  EXPECT_TRUE(AllOn(be(8), hopper_disable({0, 2, 4, 6, 7}))) << "clusters of 8";
  ASSERT_EQ(state(task(lc)), "saturated") << "the LC task stopped being saturated during the test";
  // Released, it bursts again, and its top-up goes with the saturation.
  fs::remove(hold_);
  wait_task(lc, [](const nlohmann::json& t) { return state(t) == "idle" && t["controller"]["may_burst"] == true; },
            "idle and may burst");
  wait_task(lc, [](const nlohmann::json& t) { return t["controller"]["topup_size"] == 0; }, "no top-up");
  stop("lc", *lcp);
}

// The measured top-up: with nothing to size it by (its kernel is held, so
// its reference probes time nothing), a saturated LC task's top-up is its
// most, min(3 reserved, half of the 5 free) = 2, and --status shows the
// probes it keeps making (one every 0.5 s while they time nothing).
TEST_F(Roles, ATopUpWithNothingMeasuredIsItsMost) {
  Proc* lcp = nullptr;
  const long lc = start_saturated_hopper_lc("1,3,5", path("topology.json"), {}, &lcp);
  ASSERT_GT(lc, 0);
  const nlohmann::json t =
      wait_task(lc, [](const nlohmann::json& x) { return x["controller"]["topup_size"] == 2; }, "a top-up of 2");
  EXPECT_EQ(t["controller"]["topup_tpcs"], "physical 0x202") << t.dump();
  wait_task(lc, [](const nlohmann::json& x) { return x["controller"]["topup_probes"].get<int>() >= 2; },
            "a second probe");
  fs::remove(hold_);
  stop("lc", *lcp);
}

// NVTASKSET_LC_TOPUP is on or off; anything else gets one warning and on.
TEST_F(Roles, LatencyCriticalTopUpOptionIsValidated) {
  Env env = env_;
  env["NVTASKSET_LC_TOPUP"] = "maybe";
  const Result r = run({kCli, "--no-mps", "-t", "0-1", "--latency-critical", kLauncher, "--kernels", "1"}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("NVTASKSET_LC_TOPUP: not on or off; using on"), std::string::npos) << r.err;
}

// What the CLI hands a BE task for that (NVTASKSET_CLUSTER_MAP): each GPC's
// cluster-capable TPCs as mask bits, and the largest cluster it ran; for a
// BE task only, and never inherited from the caller's environment.
TEST_F(Roles, BestEffortTaskIsHandedItsGpusClusterLayout) {
  env_["FAKECUDA_CC"] = "9.0";
  const std::string topo = path("topology.json");
  std::ofstream(topo) << hopper_topology_json();
  Proc& holder = start({"/bin/sleep", "60"});
  Env env = env_;
  env["NVTASKSET_CLUSTER_MAP"] = "*:0x1";  // the caller's: never passed on
  const Result be = run({kCli, "--no-mps", "--topology-file", topo, "--env-for", std::to_string(holder.pid),
                         "--best-effort", "-t", "0-7"},
                        env);
  ASSERT_TRUE(ExitedWith(be, 0)) << be;
  std::string map = "(unset)";
  for (const std::string& l : lines_of(be.out))
    if (l.starts_with("NVTASKSET_CLUSTER_MAP=")) map = l.substr(std::strlen("NVTASKSET_CLUSTER_MAP="));
  // Capable: TPCs 0-6 (bits 9,3,70,12,100,5,64); GPC 0 = TPCs 0,2,4,6, GPC 1 = 1,3,5.
  EXPECT_EQ(map, kStandInUuid + ":0x10000000410000000000001228:0x10000000410000000000000200/8:0x1028/4");
  holder.kill_group();
  holder.wait();
  Proc& holder2 = start({"/bin/sleep", "60"});
  const Result lc = run({kCli, "--no-mps", "--topology-file", topo, "--env-for", std::to_string(holder2.pid),
                         "--latency-critical", "-t", "0"},
                        env_);
  EXPECT_TRUE(ExitedWith(lc, 0)) << lc;
  // An LC task gets it too: its top-up keeps GPCs whole where it can.
  std::string lc_map = "(unset)";
  for (const std::string& l : lines_of(lc.out))
    if (l.starts_with("NVTASKSET_CLUSTER_MAP=")) lc_map = l.substr(std::strlen("NVTASKSET_CLUSTER_MAP="));
  EXPECT_EQ(lc_map, map) << lc.out;
  holder2.kill_group();
}

// A CUDA graph's kernels keep the mask they were encoded with until the
// graph is encoded again (docs/hardware.md), so an LC task's graphs must be
// re-encoded when its controller stops or resumes its burst. Before this was
// so, PyTorch's captured forward kept whichever mask it was first encoded
// with: on an H100 it ran on its reservation for whole runs while the task
// was idle and allowed to burst, or on the burst set while saturated, over
// the floor a best-effort task was sent to (docs/runs.md, run 26).
TEST_F(Roles, LatencyCriticalGraphFollowsItsBurst) {
  const std::string until = path("until.lc"), ready = path("ready.lc");
  // Without its top-up, which would widen its saturated replays after the
  // first probe (its kernels are held, so its probes time nothing).
  Env lc_env = env_;
  lc_env["NVTASKSET_LC_TOPUP"] = "off";
  Proc& p = start({kCli, "--no-mps", "-t", "0-1", "--latency-critical", kGraphLauncher, "--mode", "plain", "--nodes",
                   "2", "--until-file", until, "--interval-ms", "20", "--ready-file", ready},
                  lc_env);
  const long lc = wait_ready(ready, p);
  ASSERT_GT(lc, 0) << p.wait();
  // Idle between replays, allowed to burst: every replay on all 8 TPCs
  // (one replay, two kernel nodes, may have started before the check).
  ASSERT_TRUE(wait_state(lc, "idle"));
  std::size_t from = records().size();
  EXPECT_TRUE(AllOn(records_after(lc, from, 2, 4), kAll));

  // Its kernels held "on the GPU" for 100 ms: saturated, so its replays go
  // back to its reservation (TPCs 0-1).
  touch(hold_);
  ASSERT_TRUE(wait_state(lc, "saturated"));
  from = records().size();
  EXPECT_TRUE(AllOn(records_after(lc, from, 2, 4), on(0x03)));

  // Released and idle, it may burst again, and its graph with it.
  fs::remove(hold_);
  wait_task(lc, [](const nlohmann::json& t) { return state(t) == "idle" && t["controller"]["may_burst"] == true; },
            "idle and may burst");
  from = records().size();
  EXPECT_TRUE(AllOn(records_after(lc, from, 2, 4), kAll));
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0)) << p.command;
}

// Under MPS the role sets the client's priority (CUDA_MPS_CLIENT_PRIORITY:
// 1, below normal, for best-effort; 0 for latency-critical), replacing a
// user's value with one warning; a plain task and a --no-mps one keep theirs.
TEST_F(Roles, RoleSetsTheMpsClientPriority) {
  Env env = env_;
  env["NVTASKSET_MPS_CONTROL"] = kFakeMps;
  env["FAKE_MPS_IDLE_MS"] = "20000";
  const std::string prio = "CUDA_MPS_CLIENT_PRIORITY";
  auto launch = [&](std::vector<std::string> options, const Env& e) {
    std::vector<std::string> argv{kCli};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.insert(argv.end(), {kLauncher, "--print-env", prio});
    return run(argv, e);
  };
  Result r = launch({"--best-effort"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, prio).value_or("<unset>"), "1") << r;
  EXPECT_EQ(r.err.find("warn"), std::string::npos) << r;
  r = launch({"-t", "0-1", "--latency-critical"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, prio).value_or("<unset>"), "0") << r;
  r = launch({"-t", "0-1"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, prio).value_or("<unset>"), "<unset>") << r;

  // A user's value the role does not want: replaced, said in one line.
  env[prio] = "0";
  r = launch({"--best-effort"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, prio).value_or("<unset>"), "1") << r;
  EXPECT_NE(r.err.find("CUDA_MPS_CLIENT_PRIORITY=0 replaced by CUDA_MPS_CLIENT_PRIORITY=1"), std::string::npos) << r;
  env[prio] = "1";
  r = launch({"-t", "0-1", "--latency-critical"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, prio).value_or("<unset>"), "0") << r;
  EXPECT_NE(r.err.find("CUDA_MPS_CLIENT_PRIORITY=1 replaced by CUDA_MPS_CLIENT_PRIORITY=0"), std::string::npos) << r;
  // Outside MPS the priority means nothing: left as it is.
  r = launch({"--no-mps", "--best-effort"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, prio).value_or("<unset>"), "1") << r;
  env.erase(prio);
  r = launch({"--no-mps", "--best-effort"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, prio).value_or("<unset>"), "<unset>") << r;
  Proc& q = start({"sh", "-c", "echo quit | " + kFakeMps}, env);
  q.wait();
}

// ---- (c) roles in --status --------------------------------------------------------------

TEST_F(Roles, StatusShowsEachTasksRole) {
  Proc *pp = nullptr, *lp = nullptr, *bp = nullptr;
  const long plain = start_task({"-t", "6-7"}, "plain", &pp);
  const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", &lp, true);
  const long be = start_task({"--best-effort"}, "be", &bp);
  ASSERT_GT(plain, 0);
  ASSERT_GT(lc, 0);
  ASSERT_GT(be, 0);
  // An LC task that never launched has no beacon yet.
  Proc& unstarted = start({kCli, "--no-mps", "-t", "2", "--latency-critical", "sleep", "30"});
  wait_task(unstarted.pid, [](const nlohmann::json& t) { return !t.is_null(); }, "listed");

  ASSERT_TRUE(wait_state(lc, "idle"));
  // Its burst: everything no other partition but a BE one holds (the plain
  // task has 6-7, the unstarted LC task 2), as its controller sees them come.
  wait_task(lc, [](const nlohmann::json& t) { return t["controller"].value("burst_tpcs", "") == "0-1,3-5"; },
            "burst 0-1,3-5");
  const nlohmann::json st = status_json();
  const nlohmann::json tp = task_in(st, plain), tl = task_in(st, lc), tb = task_in(st, be),
                       tu = task_in(st, unstarted.pid);
  ASSERT_TRUE(tp.is_object() && tl.is_object() && tb.is_object() && tu.is_object()) << st.dump();
  EXPECT_TRUE(tp.contains("role") && tp["role"].is_null()) << tp.dump();
  EXPECT_FALSE(tp.contains("controller")) << tp.dump();
  EXPECT_EQ(tl["role"], "latency-critical");
  EXPECT_EQ(tb["role"], "best-effort");
  EXPECT_EQ(tu["role"], "latency-critical");
  EXPECT_EQ(state(tu), "unstarted") << tu.dump();
  // The LC controller's record.
  for (const char* k : {"state", "may_burst", "launches", "busy_periods", "busy_ms", "saturations", "burst_tpcs"})
    EXPECT_TRUE(tl["controller"].contains(k)) << k << ": " << tl.dump();
  EXPECT_EQ(tl["controller"]["launches"], 1) << tl.dump();
  EXPECT_EQ(tl["controller"]["may_burst"], true) << tl.dump();
  // The BE shim's counters.
  for (const char* k : {"state", "launches_held", "held_ms", "launches_on_floor", "queue_waits", "floor_skipped"})
    EXPECT_TRUE(tb["controller"].contains(k)) << k << ": " << tb.dump();
  EXPECT_EQ(state(tb), "running") << tb.dump();
  // BE and LC overlap by design; BE and the plain task do share TPCs 6-7.
  EXPECT_EQ(tl["shares_tpcs_with"], nlohmann::json::array()) << tl.dump();
  EXPECT_EQ(tb["shares_tpcs_with"], nlohmann::json::array({plain})) << tb.dump();
  EXPECT_EQ(tp["shares_tpcs_with"], nlohmann::json::array({be})) << tp.dump();
  // The table's ROLE column.
  EXPECT_EQ(role_column(plain), "-");
  EXPECT_EQ(role_column(lc), "lc:idle");
  EXPECT_EQ(role_column(be), "be:running");
  EXPECT_EQ(role_column(unstarted.pid), "lc:unstarted");
  stop("plain", *pp);
  stop("lc", *lp);
  stop("be", *bp);
}

// An LC task of another nvtaskset build (its beacon's layout another
// version; made here by rewriting the version of a live task's beacon): this
// build cannot read it, and says so rather than calling it unstarted, in
// --status and once in a BE task next to it, which cannot make way for it.
TEST_F(Roles, LatencyCriticalTaskOfAnotherBuildIsSaidNotSilentlyIgnored) {
  Proc* lp = nullptr;
  const long lc = start_idle_lc(&lp);
  ASSERT_GT(lc, 0);
  const auto files = beacons_of(lc);
  ASSERT_EQ(files.size(), 1u);
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    const std::uint32_t version = 2;  // the layout before the wake word (6194ff8)
    f.seekp(4);                       // after the magic
    f.write(reinterpret_cast<const char*>(&version), sizeof version);
  }
  const nlohmann::json t = task(lc);
  EXPECT_EQ(state(t), "other-build") << t.dump();
  EXPECT_EQ(t["controller"].value("beacon_version", 0), 2) << t.dump();
  EXPECT_EQ(role_column(lc), "lc:other-build");
  const Result r = run({kCli, "--status"});
  EXPECT_NE(r.out.find("pid " + std::to_string(lc) + " runs another nvtaskset build (beacon version 2"),
            std::string::npos)
      << r;
  // A BE task next to it: one line, and its kernels on every TPC (it
  // cannot see the reservation it would keep off).
  const Result be = run({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "3"});
  ASSERT_TRUE(ExitedWith(be, 0)) << be;
  const auto ls = lines_of(be.err);
  ASSERT_EQ(ls.size(), 1u) << be;
  EXPECT_NE(ls[0].find("best-effort: latency-critical task " + std::to_string(lc) + " runs another nvtaskset build"),
            std::string::npos)
      << be;
  EXPECT_TRUE(AllOn(records_of(printed_pid(be.out)), kAll));
  stop("lc", *lp);
}

// ---- (d) LC reservations are exclusive among LC tasks -----------------------------------

TEST_F(Roles, SecondLatencyCriticalTaskCannotTakeReservedTpcs) {
  Proc* lp = nullptr;
  const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", &lp, true);
  ASSERT_GT(lc, 0);
  const std::string marker = path("marker");
  const std::vector<std::vector<std::string>> refused{
      {"-t", "1-2", "--latency-critical"}, {"--latency-critical", "-t", "0"}, {"--latency-critical", "-t", "0-7"}};
  for (const auto& opts : refused) {
    std::vector<std::string> argv{kCli, "--no-mps"};
    argv.insert(argv.end(), opts.begin(), opts.end());
    argv.insert(argv.end(), {"touch", marker});
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find("held by pid " + std::to_string(lc)), std::string::npos) << r;
    EXPECT_FALSE(exists(marker)) << r;
  }
  // A mask as the first argument.
  Result r = run({kCli, "--no-mps", "--latency-critical", "0x3", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_FALSE(exists(marker));
  // -n beyond what is free (6 of 8).
  r = run({kCli, "--no-mps", "-n", "7", "--latency-critical", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("only 6 of 8 TPCs"), std::string::npos) << r;
  EXPECT_FALSE(exists(marker));
  // Nothing was started: only the first LC task is listed.
  const nlohmann::json st = status_json();
  ASSERT_TRUE(st.is_object());
  EXPECT_EQ(st["tasks"].size(), 1u) << st.dump();
  // What is free can be reserved: -n 6 takes 2-7.
  Proc& second = start({kCli, "--no-mps", "-n", "6", "--latency-critical", kLauncher, "--kernels", "1",
                        "--idle-until", path("until.second"), "--ready-file", path("ready.second")});
  const long sp = wait_ready(path("ready.second"), second);
  ASSERT_GT(sp, 0) << second.err();
  EXPECT_EQ(task(sp)["tpcs"], "2-7");
  stop("second", second);
  stop("lc", *lp);
}

// ---- (e) a BE task keeps a floor: LC reservations may not cover it ----------------------

TEST_F(Roles, ReservationsLeaveEveryBestEffortTaskAFloor) {
  const std::string marker = path("marker");
  Proc* bp = nullptr;
  const long be = start_task({"-t", "0-1", "--best-effort"}, "be", &bp);
  ASSERT_GT(be, 0);
  for (const std::string list : {"0-1", "0-7", "0,1"}) {
    const Result r = run({kCli, "--no-mps", "-t", list, "--latency-critical", "touch", marker});
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find("best-effort pid " + std::to_string(be)), std::string::npos) << r;
    EXPECT_FALSE(exists(marker)) << list;
  }
  // Leaving it TPC 1 is fine.
  Result r = run({kCli, "--no-mps", "-t", "0", "--latency-critical", "touch", marker});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(exists(marker));
  fs::remove(marker);
  stop("be", *bp);

  // The other way round: a BE partition inside a live reservation.
  Proc* lp = nullptr;
  const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", &lp, true);
  ASSERT_GT(lc, 0);
  for (const std::vector<std::string>& opts :
       std::vector<std::vector<std::string>>{{"-t", "0-1"}, {"-t", "1"}, {"0x3"}}) {
    std::vector<std::string> argv{kCli, "--no-mps", "--best-effort"};
    argv.insert(argv.end(), opts.begin(), opts.end());
    argv.insert(argv.end(), {"touch", marker});
    r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find("reserved by a latency-critical task"), std::string::npos) << r;
    EXPECT_FALSE(exists(marker)) << r;
  }
  r = run({kCli, "--no-mps", "--best-effort", "-t", "1-2", "touch", marker});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(exists(marker));
  stop("lc", *lp);
}

// A task's role holds under -p as at its launch: a latency-critical task
// may not be moved onto another's reservation nor over a best-effort
// task's last TPCs, and a best-effort task not into a reservation. Before,
// -p applied no role: an LC task moved onto another's reserved TPCs shared
// them while --status listed both as reservations.
TEST_F(Roles, ChangeKeepsTheRolesRules) {
  Proc *ap = nullptr, *bp = nullptr, *ep = nullptr;
  const long a = start_task({"-t", "0-1", "--latency-critical"}, "a", &ap, true);
  const long b = start_task({"-t", "2-3", "--latency-critical"}, "b", &bp, true);
  const long be = start_task({"-t", "4-5", "--best-effort"}, "be", &ep);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  ASSERT_GT(be, 0);
  struct Case {
    std::vector<std::string> args;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {{"-t", "0-3", std::to_string(a)}, "held by pid " + std::to_string(b)},
           {{"-t", "0-1,4-5", std::to_string(a)}, "best-effort pid " + std::to_string(be) + " would have no TPC"},
           {{"-t", "2", std::to_string(be)}, "reserved by a latency-critical task"}}) {
    std::vector<std::string> argv{kCli, "-p"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find(c.why), std::string::npos) << r;
  }
  EXPECT_EQ(task(a)["tpcs"], "0-1");
  EXPECT_EQ(task(be)["tpcs"], "4-5");
  // What the rules allow still changes.
  Result r = run({kCli, "-p", "-t", "0-1,4", std::to_string(a)});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(task(a)["tpcs"], "0-1,4");
  r = run({kCli, "-p", "-t", "4-7", std::to_string(be)});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(task(be)["tpcs"], "4-7");
  stop("be", *ep);
  stop("b", *bp);
  stop("a", *ap);
}

// As -p refuses a partition that cannot host the clusters a task has
// launched, a reservation is refused that would leave a best-effort task a
// floor that cannot host its clusters: they would run over the reservation.
// Hopper layout: clusters of 8 fit only GPC 0 (TPCs 0,2,4,6) whole.
TEST_F(Roles, ReservationKeepsWhatABestEffortTaskLaunchedOnItsFloor) {
  env_["FAKECUDA_CC"] = "9.0";
  const std::string topo = path("topology.json");
  std::ofstream(topo) << hopper_topology_json();
  const std::string until = path("until.be"), ready = path("ready.be"), marker = path("marker");
  Proc& bep = start({kCli, "--no-mps", "--topology-file", topo, "--best-effort", kGraphLauncher, "--mode", "eager",
                     "--cluster", "8", "--nodes", "1", "--until-file", until, "--interval-ms", "20", "--ready-file",
                     ready},
                    env_);
  const long be = wait_ready(ready, bep);
  ASSERT_GT(be, 0) << bep.err();
  Result r = run({kCli, "--no-mps", "--topology-file", topo, "-t", "0", "--latency-critical", "touch", marker}, env_);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("best-effort pid " + std::to_string(be) + "'s floor (TPCs 1-7 of device 0) hosts thread-block "
                       "clusters of at most 6 SMs, but it has launched clusters of 8"),
            std::string::npos)
      << r;
  EXPECT_FALSE(exists(marker));
  // TPC 1 is of GPC 1: GPC 0 stays whole on the floor.
  r = run({kCli, "--no-mps", "--topology-file", topo, "-t", "1", "--latency-critical", "touch", marker}, env_);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(exists(marker));
  touch(until);
  EXPECT_TRUE(ExitedWith(bep.wait(), 0)) << bep.command;
}

// ---- (f) a dead LC task holds nothing back ---------------------------------------------

// Held on the CPU (NVTASKSET_BE_YIELD=hold): the BE task's launches are
// made once the LC task is dead. The gate's case is the next test.
TEST_F(Roles, KilledLatencyCriticalTaskReleasesEverything) {
  env_["NVTASKSET_BE_YIELD"] = "hold";
  Proc* lp = nullptr;
  const long lc = start_bursting_lc(&lp);
  ASSERT_GT(lc, 0);
  Proc& be = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "2"});
  ASSERT_TRUE(wait_state(be.pid, "holding"));
  EXPECT_EQ(beacons_of(lc).size(), 1u);
  EXPECT_TRUE(records_of(be.pid).empty());

  // Killed while busy (its kernels still "running"): its beacon stays behind.
  lp->kill_group();
  const Result r = be.wait();
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  const auto recs = records_of(be.pid);
  EXPECT_EQ(recs.size(), 2u);
  EXPECT_TRUE(AllOn(recs, kAll));
  // --status forgets the task and removes its beacon.
  const nlohmann::json st = status_json();
  EXPECT_TRUE(task_in(st, lc).is_null()) << st.dump();
  EXPECT_TRUE(beacons_of(lc).empty());
  // Its TPCs can be reserved again.
  const std::string marker = path("marker");
  const Result again = run({kCli, "--no-mps", "-t", "0-1", "--latency-critical", "touch", marker});
  EXPECT_TRUE(ExitedWith(again, 0)) << again;
  EXPECT_TRUE(exists(marker));
}

// Under the gate (the default) the BE task's launches are made while the LC
// task bursts, on its floor, behind a gate its gatekeeper closed; once the
// LC task is dead the gatekeeper sees it (its liveness check) and opens the
// gate, and the task's launches run on every TPC again.
TEST_F(Roles, KilledLatencyCriticalTaskOpensTheGate) {
  // The stand-in keeps every kernel running while the hold file exists, the
  // BE's own too: a queue this deep never waits for them.
  env_["NVTASKSET_BE_DEPTH"] = "1024";
  Proc* lp = nullptr;
  const long lc = start_bursting_lc(&lp);
  ASSERT_GT(lc, 0);
  Proc* bp = nullptr;
  const long be = start_task({"--best-effort"}, "be", &bp);
  ASSERT_GT(be, 0);
  ASSERT_TRUE(wait_state(be, "holding"));
  EXPECT_TRUE(AllOn(records_of(be), on(0xfc)));
  // Closed, and never opened yet: its time closed is counted when it opens.
  EXPECT_EQ(task(be)["controller"].value("held_ms", -1.0), 0.0);

  lp->kill_group();
  const nlohmann::json t = wait_task(
      be, [](const nlohmann::json& x) { return state(x) == "running" && x["controller"].value("held_ms", 0.0) > 0; },
      "running, with the gate opened");
  EXPECT_GE(counter(t, "launches_held"), 1u) << t.dump();
  const std::size_t from = records().size();
  EXPECT_TRUE(AllOn(records_after(be, from, 0, 2), kAll));
  stop("be", *bp);
  EXPECT_EQ(bp->err().find("NVTASKSET_BE"), std::string::npos) << bp->err();
}

// ---- (g) a stopped LC task is stale: BE tasks keep off it without waiting ----------------

TEST_F(Roles, StoppedLatencyCriticalTaskIsStaleAndBestEffortRunsOnItsFloor) {
  // The stand-in keeps every kernel launched while the hold file exists
  // running, the BE's own too: with a short queue the BE would wait for its
  // own kernels (queue_waits) and never launch again to be held.
  env_["NVTASKSET_BE_DEPTH"] = "1024";
  // An LC task of one kernel, held "running" (busy, bursting) until hold_
  // goes, then idle for good: one that kept launching would be busy again
  // now and then, and a BE launch then would rightly go on the floor.
  Proc* lp = nullptr;
  const long lc = start_bursting_lc(&lp, true);
  ASSERT_GT(lc, 0);
  ASSERT_EQ(::kill(-lc, SIGSTOP), 0);
  ASSERT_TRUE(wait_state(lc, "stale"));
  const Result text = run({kCli, "--status"});
  EXPECT_NE(text.out.find("pid " + std::to_string(lc) + "'s controller has not run for"), std::string::npos) << text;

  // Its beacon still says "busy, bursting", and the BE task is told to
  // hold for 600 s: it runs on its floor instead.
  const Result r = run({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "2"});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  const auto recs = records_of(printed_pid(r.out));
  EXPECT_EQ(recs.size(), 2u);
  EXPECT_TRUE(AllOn(recs, on(0xfc)));

  // A BE task that stays: "floor" in --status, its launches counted.
  Proc* bp = nullptr;
  const long be = start_task({"--best-effort"}, "be", &bp);
  ASSERT_GT(be, 0);
  EXPECT_TRUE(AllOn(wait_records(be, 2), on(0xfc)));
  const nlohmann::json tb = wait_task(be, [](const nlohmann::json& t) { return counter(t, "launches_on_floor") >= 2; },
                                      "2 launches on its floor");
  EXPECT_EQ(state(tb), "floor") << tb.dump();
  EXPECT_EQ(counter(tb, "launches_held"), 0u) << tb.dump();

  // Resumed, it bursts again and the BE task holds; its work done, it is
  // idle and the BE task runs on everything.
  ASSERT_EQ(::kill(-lc, SIGCONT), 0);
  ASSERT_TRUE(wait_state(lc, "bursting"));
  ASSERT_TRUE(wait_state(be, "holding"));
  fs::remove(hold_);
  ASSERT_TRUE(wait_state(lc, "idle"));
  // (The first launch after `from` may have been decided just before.)
  const std::size_t from = records().size();
  EXPECT_TRUE(AllOn(records_after(be, from, 1, 2), kAll));
  stop("be", *bp);
  stop("lc", *lp);
}

// ---- (h) the burst set leaves out what plain partitions hold -----------------------------

TEST_F(Roles, BurstLeavesOutPlainPartitionsWhileTheyLive) {
  Proc* pp = nullptr;
  const long plain = start_task({"-t", "6-7"}, "plain", &pp);
  ASSERT_GT(plain, 0);
  Proc* lp = nullptr;
  const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", &lp);
  ASSERT_GT(lc, 0);
  // Every LC kernel on 0-5: its reservation and what no one else holds.
  const auto recs = wait_records(lc, 3);
  EXPECT_TRUE(AllOn(recs, on(0x3f)));
  const nlohmann::json tl = task(lc);
  EXPECT_EQ(tl["controller"]["burst_tpcs"], "0-5") << tl.dump();
  // The plain task's kernels keep to its own TPCs.
  EXPECT_TRUE(AllOn(records_of(plain), on(0xc0)));
  // Once it ends, the LC task bursts onto its TPCs too.
  stop("plain", *pp);
  const std::size_t from = records().size();
  bool widened = wait_until(
      [&] {
        const auto r = records();
        for (std::size_t i = from; i < r.size(); ++i)
          if (r[i].pid == lc && r[i].mask == kAll) return true;
        return false;
      },
      kStateWait);
  EXPECT_TRUE(widened) << "the LC task's kernels never took TPCs 6-7 back";
  stop("lc", *lp);
}

// A plain task that dies without cleaning up (SIGKILL leaves its status
// entry behind) gives its TPCs back to the burst too, without anyone
// running --status.
TEST_F(Roles, BurstTakesBackTheTpcsOfAKilledPlainTask) {
  Proc* pp = nullptr;
  const long plain = start_task({"-t", "6-7"}, "plain", &pp);
  ASSERT_GT(plain, 0);
  Proc* lp = nullptr;
  const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", &lp);
  ASSERT_GT(lc, 0);
  EXPECT_TRUE(AllOn(wait_records(lc, 2), on(0x3f)));
  pp->kill_group();
  const std::size_t from = records().size();
  bool widened = wait_until(
      [&] {
        const auto r = records();
        for (std::size_t i = from; i < r.size(); ++i)
          if (r[i].pid == lc && r[i].mask == kAll) return true;
        return false;
      },
      5s);
  EXPECT_TRUE(widened) << "the LC task's kernels never took the dead task's TPCs 6-7";
  stop("lc", *lp);
}

// ---- (i) the BE queue depth ---------------------------------------------------------------

TEST_F(Roles, BestEffortKeepsAtMostDepthLaunchesQueued) {
  Proc* lp = nullptr;
  ASSERT_GT(start_idle_lc_then_hold(&lp), 0);
  Env env = env_;
  env["NVTASKSET_BE_DEPTH"] = "4";
  Proc* bp = nullptr;
  const nlohmann::json t = be_waiting_at_four(env, &bp);
  Proc& be = *bp;
  EXPECT_EQ(state(t), "running") << t.dump();
  EXPECT_TRUE(be.running());
  fs::remove(hold_);
  const Result r = be.wait();
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(r.err, "");
  const auto recs = records_of(be.pid);
  EXPECT_EQ(recs.size(), 10u);
  // The LC task is idle: every kernel on all TPCs.
  EXPECT_TRUE(AllOn(recs, kAll));

  // A depth of 16 queues all 10 without waiting.
  touch(hold_);
  env["NVTASKSET_BE_DEPTH"] = "16";
  Proc& deep = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "10", "--idle-until",
                      path("until.deep"), "--ready-file", path("ready.deep")},
                     env);
  ASSERT_GT(wait_ready(path("ready.deep"), deep), 0);
  EXPECT_EQ(wait_records(deep.pid, 10).size(), 10u);
  const nlohmann::json td = wait_task(deep.pid, [](const nlohmann::json& x) { return x.value("kernels_launched", 0) == 10; },
                                      "10 launches");
  EXPECT_EQ(counter(td, "queue_waits"), 0u) << td.dump();
  fs::remove(hold_);
  stop("deep", deep);
  stop("lc", *lp);
}

// On the floor (every busy LC task saturated) the queue may be deeper:
// NVTASKSET_BE_FLOOR_DEPTH launches (default 16) instead of
// NVTASKSET_BE_DEPTH. The kernels held "running", a BE task of 10 launches
// next to a saturated LC task queues all 10 on its floor without a wait; at
// a floor depth of 4 it waits once 4 are queued.
TEST_F(Roles, BestEffortOnItsFloorQueuesFloorDepthLaunches) {
  touch(hold_);
  Proc* lcp = nullptr;
  Env lc_env = env_;
  lc_env["NVTASKSET_LC_TOPUP"] = "off";  // no probes: the BE task never holds
  const long lc = start_task({"-t", "0-1", "--latency-critical"}, "lc", &lcp, false, &lc_env);
  ASSERT_GT(lc, 0) << lcp->err();
  ASSERT_TRUE(wait_state(lc, "saturated"));
  Env env = env_;
  env["NVTASKSET_BE_DEPTH"] = "4";
  Proc& deep = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "10", "--idle-until",
                      path("until.deep"), "--ready-file", path("ready.deep")},
                     env);
  ASSERT_GT(wait_ready(path("ready.deep"), deep), 0);
  const auto recs = wait_records(deep.pid, 10);
  EXPECT_EQ(recs.size(), 10u);
  EXPECT_TRUE(AllOn(recs, on(0xfc)));
  const nlohmann::json td = wait_task(
      deep.pid, [](const nlohmann::json& x) { return x.value("kernels_launched", 0) == 10; }, "10 launches");
  EXPECT_EQ(counter(td, "queue_waits"), 0u) << td.dump();
  EXPECT_EQ(state(td), "floor") << td.dump();

  env["NVTASKSET_BE_FLOOR_DEPTH"] = "4";
  Proc* sp = nullptr;
  be_waiting_at_four(env, &sp);
  Proc& shallow = *sp;
  ASSERT_EQ(state(task(lc)), "saturated");
  fs::remove(hold_);
  EXPECT_TRUE(ExitedWith(shallow.wait(), 0));
  stop("deep", deep);
  stop("lc", *lcp);
}

// A bad NVTASKSET_BE_FLOOR_DEPTH: one warning, and the default (64 under
// the gate, 16 under the hold).
TEST_F(Roles, BadFloorDepthIsOneWarningAndTheTaskRuns) {
  EXPECT_TRUE(one_warning_and_runs({{"NVTASKSET_BE_FLOOR_DEPTH", "0"}},
                                   "NVTASKSET_BE_FLOOR_DEPTH: not a number from 1 to 1024; using 64"));
  EXPECT_TRUE(one_warning_and_runs({{"NVTASKSET_BE_YIELD", "hold"}, {"NVTASKSET_BE_FLOOR_DEPTH", "0"}},
                                   "NVTASKSET_BE_FLOOR_DEPTH: not a number from 1 to 1024; using 16"));
}

// Under the gate (the default) an LC request waits behind the kernels
// before the next gate, not behind the queue, so the queue is 64 launches
// deep by default (next to an idle LC task a queue of 16 cost GPT-2-medium
// training 12%, 64 4%: docs/results.md, run 76). Under the hold the queue is
// the give-back, 4 launches. The kernels held "running", next to an idle LC task:
// 40 launches queue without a wait behind the gate; under the hold the task
// waits once 4 are queued.
TEST_F(Roles, BestEffortQueueIsDeepBehindItsGateAndShallowUnderTheHold) {
  Proc* lp = nullptr;
  ASSERT_GT(start_idle_lc_then_hold(&lp), 0);
  Proc& gated = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "40", "--idle-until",
                       path("until.gated"), "--ready-file", path("ready.gated")});
  ASSERT_GT(wait_ready(path("ready.gated"), gated), 0);
  EXPECT_EQ(wait_records(gated.pid, 40).size(), 40u);
  const nlohmann::json tg = wait_task(
      gated.pid, [](const nlohmann::json& x) { return x.value("kernels_launched", 0) == 40; }, "40 launches");
  EXPECT_EQ(counter(tg, "queue_waits"), 0u) << tg.dump();
  EXPECT_GE(counter(tg, "gates_queued"), 20u) << tg.dump();  // one every 2 launches

  Env env = env_;
  env["NVTASKSET_BE_YIELD"] = "hold";
  Proc* hp = nullptr;
  const nlohmann::json th = be_waiting_at_four(env, &hp);
  Proc& held = *hp;
  EXPECT_EQ(counter(th, "gates_queued"), 0u) << th.dump();
  fs::remove(hold_);
  EXPECT_TRUE(ExitedWith(held.wait(), 0));
  EXPECT_TRUE(AllOn(records_of(held.pid), kAll));
  stop("gated", gated);
  EXPECT_TRUE(AllOn(records_of(gated.pid), kAll));
  stop("lc", *lp);
}

// NVTASKSET_BE_GATE_US: a stream's gates are spaced by the work its own
// launches timed (the stand-in's kernels take FAKECUDA_KERNEL_US on its
// virtual GPU clock; no timing in the test). 200 launches of one kernel next
// to an idle LC task: until the timer reads its first pair (at the 17th
// launch, after its gate) the kernel is unknown and each launch gets a gate,
// and the launch after them; then 10-us kernels share one gate in 10 (100
// us): 17 + 19. (The gate is created closed, until the task's gatekeeper
// first decides, and the pair's end event waits behind it: on a loaded
// machine the kernel may be learned at a later reading, 16 launches on, so
// the launches are 1 ms apart and up to two readings later are allowed.)
// 1-ms kernels, longer than the bound, get one each (timed with no borrow
// limit too: NVTASKSET_BE_BORROW_US=0); NVTASKSET_BE_GATE_EVERY=2, or
// NVTASKSET_BE_GATE_US=0, gives one every 2 launches, as before.
TEST_F(Roles, BestEffortGatesAreSpacedByLearnedWork) {
  Proc* lp = nullptr;
  ASSERT_GT(start_idle_lc(&lp), 0);
  struct Case {
    const char* tag;
    const char* kernel_us;
    Env extra;
    std::uint64_t least, most;  // gates queued
  };
  for (const Case& c : {Case{"short", "10", {}, 17 + 19, 49 + 16},
                        Case{"long", "1000", {{"NVTASKSET_BE_BORROW_US", "0"}}, 200, 200},
                        Case{"every", "10", {{"NVTASKSET_BE_GATE_EVERY", "2"}}, 100, 100},
                        Case{"zero", "10", {{"NVTASKSET_BE_GATE_US", "0"}}, 100, 100}}) {
    SCOPED_TRACE(c.tag);
    Env env = env_;
    env["FAKECUDA_KERNEL_US"] = c.kernel_us;
    for (const auto& [k, v] : c.extra) env[k] = v;
    Proc& be = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "200", "--interval-ms", "1", "--idle-until",
                      path(std::string("until.") + c.tag), "--ready-file", path(std::string("ready.") + c.tag)},
                     env);
    ASSERT_GT(wait_ready(path(std::string("ready.") + c.tag), be), 0);
    const nlohmann::json t = wait_task(
        be.pid, [](const nlohmann::json& x) { return x.value("kernels_launched", 0) == 200; }, "200 launches");
    EXPECT_GE(counter(t, "gates_queued"), c.least) << t.dump();
    EXPECT_LE(counter(t, "gates_queued"), c.most) << t.dump();
    stop(c.tag, be);
    EXPECT_EQ(be.err(), "");
    EXPECT_TRUE(AllOn(records_of(be.pid), kAll)) << "the LC task idle throughout: every kernel borrowed";
  }
  stop("lc", *lp);
}

// A bad NVTASKSET_BE_GATE_US: one warning, and the default.
TEST_F(Roles, BadGateUsIsOneWarningAndTheTaskRuns) {
  EXPECT_TRUE(one_warning_and_runs({{"NVTASKSET_BE_GATE_US", "100001"}},
                                   "NVTASKSET_BE_GATE_US: not a number from 0 to 100000; using 100"));
}

// A gate that cannot be made (here: no mapped host memory, which is pinned
// and can run out) gives one warning that says so, and the hold with the
// hold's queue: the queue is then what an LC request waits behind. The
// kernels held "running", next to an idle LC task, the task waits once 4
// are queued, and queues no gate.
TEST_F(Roles, GateThatCannotBeMadeFallsBackToTheHoldWithItsQueue) {
  Proc* lp = nullptr;
  ASSERT_GT(start_idle_lc_then_hold(&lp), 0);
  Env env = env_;
  env["FAKECUDA_HOST_ALLOC"] = "fail";
  Proc* bp = nullptr;
  const nlohmann::json t = be_waiting_at_four(env, &bp);
  Proc& be = *bp;
  EXPECT_EQ(counter(t, "gates_queued"), 0u) << t.dump();
  fs::remove(hold_);
  const Result r = be.wait();
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  const auto ls = lines_of(r.err);
  ASSERT_EQ(ls.size(), 1u) << r;
  EXPECT_NE(ls[0].find("--best-effort: cannot allocate mapped host memory; its launches wait on the CPU instead of "
                       "behind a gate (NVTASKSET_BE_YIELD=hold)"),
            std::string::npos)
      << r;
  EXPECT_EQ(records_of(be.pid).size(), 10u);
  EXPECT_TRUE(AllOn(records_of(be.pid), kAll));
  stop("lc", *lp);
}

// NVTASKSET_BE_QUEUE_US: the queue is also bounded in time. With the BE's
// kernels held "running", a launch every 20 ms, room for 64 and a bound of
// 200 ms, the task waits once its first launch was queued 200 ms ago (about
// 10 launches), not at 64.
TEST_F(Roles, BestEffortQueueIsBoundedInTime) {
  Proc* lp = nullptr;
  Proc* bp = start_be_next_to_idle_lc({{"NVTASKSET_BE_DEPTH", "64"}, {"NVTASKSET_BE_QUEUE_US", "200000"}}, &lp);
  ASSERT_NE(bp, nullptr);
  Proc& be = *bp;
  const auto t0 = std::chrono::steady_clock::now();
  const nlohmann::json t =
      wait_task(be.pid, [](const nlohmann::json& x) { return counter(x, "queue_waits") >= 1; }, "a queue wait");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms) << "waited before its oldest launch was 200 ms old";
  const std::size_t queued = records_of(be.pid).size();
  EXPECT_GE(queued, 2u);
  EXPECT_LE(queued, 16u) << "20 ms apart, 200 ms of queue: about 10";
  // It stays waiting while its oldest launch runs.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(records_of(be.pid).size(), queued);
  EXPECT_EQ(counter(task(be.pid), "queue_waits"), 1u);
  fs::remove(hold_);
  wait_until([&] { return records_of(be.pid).size() > queued + 2; }, kStateWait);
  EXPECT_GT(records_of(be.pid).size(), queued + 2) << "it went on once its launches ran";
  stop("be", be);
  EXPECT_EQ(be.err(), "");

  // NVTASKSET_BE_YIELD=floor bounds no queue by itself, but a time bound
  // asked for is one: the queue is bounded (at the default 4 launches).
  touch(hold_);
  Env env = env_;
  env["NVTASKSET_BE_QUEUE_US"] = "200000";
  env["NVTASKSET_BE_YIELD"] = "floor";
  Proc& fl = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "10"}, env);
  const nlohmann::json tf =
      wait_task(fl.pid, [](const nlohmann::json& x) { return counter(x, "queue_waits") >= 1; }, "a queue wait");
  EXPECT_LE(records_of(fl.pid).size(), 5u) << tf.dump();
  fs::remove(hold_);
  EXPECT_TRUE(ExitedWith(fl.wait(), 0));
  EXPECT_EQ(records_of(fl.pid).size(), 10u);
  stop("lc", *lp);
}

// NVTASKSET_BE_WORK_US: the queue bounded in the kernels' durations as the
// GPU timed them. The stand-in's kernels take 100 us on its virtual GPU
// clock (FAKECUDA_KERNEL_US; no timing in the test). Held from its first
// launch, the task's kernel is not known yet and counts as the whole bound
// (500 us): one launch goes, one queues behind it, the third waits.
// Released, the queue learns 100 us; held again, one launch and 500 us
// behind it go (6), and the 7th waits.
TEST_F(Roles, BestEffortQueueIsBoundedInLearnedWork) {
  Proc* lp = nullptr;
  Proc* bp = start_be_next_to_idle_lc({{"NVTASKSET_BE_WORK_US", "500"}, {"FAKECUDA_KERNEL_US", "100"}}, &lp);
  ASSERT_NE(bp, nullptr);
  Proc& be = *bp;
  wait_task(be.pid, [](const nlohmann::json& x) { return counter(x, "queue_waits") >= 1; }, "a queue wait");
  EXPECT_EQ(records_of(be.pid).size(), 2u) << "an unknown kernel is the whole bound: one behind the first";
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(records_of(be.pid).size(), 2u) << "it waits while its oldest launch runs";
  fs::remove(hold_);
  wait_until([&] { return records_of(be.pid).size() >= 8; }, kStateWait);
  ASSERT_GE(records_of(be.pid).size(), 8u) << "it went on once its launches ran";
  const std::uint64_t waits = counter(task(be.pid), "queue_waits");
  const std::size_t before = records_of(be.pid).size();
  touch(hold_);
  wait_task(be.pid, [&](const nlohmann::json& x) { return counter(x, "queue_waits") > waits; }, "a second queue wait");
  std::this_thread::sleep_for(200ms);
  const std::size_t held = records_of(be.pid).size() - before;
  // 6 held (one running, 5 x 100 us behind it), plus the one launch that
  // may have found the file not yet there.
  EXPECT_GE(held, 6u);
  EXPECT_LE(held, 7u);
  fs::remove(hold_);
  stop("be", be);
  EXPECT_EQ(be.err(), "");
  stop("lc", *lp);
}

// ---- kernels too long to borrow the reservations (NVTASKSET_BE_BORROW_US) ----

// Next to an idle LC task (TPCs 0-1), a BE task of 1-ms kernels (the
// stand-in's virtual clock) borrows the reservation until its own launches
// have timed one (the first, read once in 16 launches), and from then on
// keeps off it, the LC task still idle; --status counts those (kept_off)
// and says "running". Kernels of 100 us keep borrowing, and so do 1-ms ones
// with NVTASKSET_BE_BORROW_US=0.
TEST_F(Roles, BestEffortKernelsTimedTooLongKeepOffAnIdleReservation) {
  Proc* lcp = nullptr;
  const long lc = start_idle_lc(&lcp);
  ASSERT_GT(lc, 0);
  struct Case {
    const char* tag;
    const char* kernel_us;
    const char* borrow_us;  // nullptr: the default
    bool keep_off;
  };
  for (const Case& c : {Case{"long", "1000", nullptr, true}, Case{"short", "100", nullptr, false},
                        Case{"zero", "1000", "0", false}, Case{"edge", "300", "300", true}}) {
    SCOPED_TRACE(c.tag);
    Env env = env_;
    env["FAKECUDA_KERNEL_US"] = c.kernel_us;
    if (c.borrow_us != nullptr) env["NVTASKSET_BE_BORROW_US"] = c.borrow_us;
    Proc* bp = nullptr;
    ASSERT_GT(start_task({"--best-effort"}, c.tag, &bp, false, &env), 0);
    Proc& be = *bp;
    // A launch every 20 ms until 3 kept off (or, borrowing, 8 launches).
    const std::string floor = on(0xfc);
    auto off = [&](const std::vector<Record>& rs) {
      return std::count_if(rs.begin(), rs.end(), [&](const Record& r) { return r.mask == floor; });
    };
    std::vector<Record> recs;
    wait_until([&] { return c.keep_off ? off(recs = records_of(be.pid)) >= 3 : (recs = records_of(be.pid)).size() >= 8; },
               kStateWait);
    const nlohmann::json t = task(be.pid);
    EXPECT_EQ(state(t), "running") << t.dump();
    EXPECT_EQ(counter(t, "launches_on_floor"), 0u) << "the LC task was idle throughout: " << t.dump();
    if (c.keep_off) EXPECT_GE(counter(t, "kept_off"), 3u) << t.dump();
    else EXPECT_EQ(counter(t, "kept_off"), 0u) << t.dump();
    touch(path(std::string("until.") + c.tag));
    EXPECT_TRUE(ExitedWith(be.wait(), 0)) << be.err();
    EXPECT_EQ(be.err(), "");
    recs = records_of(be.pid);
    ASSERT_FALSE(recs.empty());
    if (c.keep_off) {
      // Borrowing until the first timing was read, off the reservation from then on.
      EXPECT_TRUE(AllOn({recs[0]}, kAll)) << "not timed yet: it borrows";
      const auto first_off =
          std::find_if(recs.begin(), recs.end(), [&](const Record& r) { return r.mask == floor; });
      ASSERT_NE(first_off, recs.end());
      EXPECT_TRUE(AllOn({recs.begin(), first_off}, kAll));
      EXPECT_TRUE(AllOn({first_off, recs.end()}, floor)) << "timed too long: off the reservation";
      EXPECT_GE(off(recs), 3);
    } else {
      EXPECT_GE(recs.size(), 8u);
      EXPECT_TRUE(AllOn(recs, kAll));
    }
  }
  EXPECT_EQ(state(task(lc)), "idle");
  stop("lc", *lcp);
}

// A BE task's own driver calls beside an idle LC task (its queue's
// events every few launches, the borrow limit's timing of its 1-ms kernels)
// never break a stream capture that another of its threads makes in CUDA's
// global mode, where the stand-in, like the GPU, breaks a capture at any
// other thread's event call: the calls are counted against captures
// (OwnCalls), so a capture begins during none of them.
TEST_F(Roles, BestEffortOwnCallsNeverBreakAnotherThreadsCapture) {
  Proc* lcp = nullptr;
  ASSERT_GT(start_idle_lc(&lcp), 0);
  Env env = env_;
  env["FAKECUDA_KERNEL_US"] = "1000";
  const Result r = run({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "1", "--capture-thread", "300"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("captures 300 invalidated 0"), std::string::npos) << r;
  const auto recs = records_of(printed_pid(r.out));
  EXPECT_GT(recs.size(), 1000u) << "it launched while the captures went on";
  EXPECT_TRUE(std::any_of(recs.begin(), recs.end(), [](const Record& x) { return x.mask == on(0xfc); }))
      << "its kernels were timed (and kept off the reservation)";
  stop("lc", *lcp);
}

TEST_F(Roles, BadBorrowLimitIsOneWarningAndTheTaskRuns) {
  EXPECT_TRUE(one_warning_and_runs({{"NVTASKSET_BE_BORROW_US", "1000001"}},
                                   "NVTASKSET_BE_BORROW_US: not a number from 0 to 1000000; using 500"));
}

TEST_F(Roles, BadWorkBoundIsOneWarningAndTheTaskRuns) {
  EXPECT_TRUE(one_warning_and_runs({{"NVTASKSET_BE_WORK_US", "2000000"}}, "NVTASKSET_BE_WORK_US: not a number from 0 to 1000000"));
}

TEST_F(Roles, BestEffortWithNoLatencyCriticalTaskQueuesFreely) {
  // No LC task: nothing would wait behind the queue, so it is not bounded
  // (a BE task alone gets everything, its throughput too). The same launches
  // with an idle LC task wait at 4 (the test above).
  touch(hold_);
  Env env = env_;
  env["NVTASKSET_BE_DEPTH"] = "4";
  Proc& be = start({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "10", "--idle-until", path("until.free"),
                    "--ready-file", path("ready.free")},
                   env);
  ASSERT_GT(wait_ready(path("ready.free"), be), 0);
  const auto recs = wait_records(be.pid, 10);
  EXPECT_EQ(recs.size(), 10u);
  EXPECT_TRUE(AllOn(recs, kAll));
  const nlohmann::json t =
      wait_task(be.pid, [](const nlohmann::json& x) { return x.value("kernels_launched", 0) == 10; }, "10 launches");
  EXPECT_EQ(counter(t, "queue_waits"), 0u) << t.dump();
  EXPECT_EQ(state(t), "running") << t.dump();
  fs::remove(hold_);
  stop("free", be);
}

TEST_F(Roles, BadQueueDepthIsOneWarningAndTheTaskRuns) {
  for (const std::string bad : {"0", "abc", "1025", "-3"}) {
    Env env = env_;
    env["NVTASKSET_BE_DEPTH"] = bad;
    const std::size_t from = records().size();
    const Result r = run({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "3"}, env);
    ASSERT_TRUE(ExitedWith(r, 0)) << bad << r;
    const auto ls = lines_of(r.err);
    ASSERT_EQ(ls.size(), 1u) << bad << r;
    EXPECT_NE(ls[0].find("NVTASKSET_BE_DEPTH"), std::string::npos) << r;
    EXPECT_NE(ls[0].find("not a number from 1 to 1024"), std::string::npos) << r;
    const long pid = printed_pid(r.out);
    const auto all = records();
    std::size_t n = 0;
    for (std::size_t i = from; i < all.size(); ++i) n += all[i].pid == pid ? 1 : 0;
    EXPECT_EQ(n, 3u) << bad;
  }
  // A good value says nothing.
  Env env = env_;
  env["NVTASKSET_BE_DEPTH"] = "1";
  const Result r = run({kCli, "--no-mps", "--best-effort", kLauncher, "--kernels", "3"}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(records_of(printed_pid(r.out)).size(), 3u);
}

// ---- (j) option errors --------------------------------------------------------------------

TEST_F(Roles, RoleOptionErrorsAreOneLine) {
  Proc* pp = nullptr;
  const long plain = start_task({"-t", "3"}, "plain", &pp, true);
  ASSERT_GT(plain, 0);
  const std::string marker = path("marker");
  const std::string p = std::to_string(plain);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--latency-critical", "touch", marker}, "needs the TPCs to reserve"},
      {{"--latency-critical", "--best-effort", "-t", "0", "touch", marker}, "exclude each other"},
      {{"--best-effort", "--latency-critical", "touch", marker}, "exclude each other"},
      {{"--best-effort", "--exclusive", "touch", marker}, "exclude each other"},
      {{"--best-effort", "--exclusive", "-t", "0-3", "touch", marker}, "exclude each other"},
      {{"-p", "--best-effort", p}, "goes with a launch"},
      // After the PID, --best-effort is no option of nvtaskset's: refused all the same.
      {{"-p", p, "--best-effort"}, ""},
      {{"-p", "-t", "0-1", "--latency-critical", p}, "goes with a launch"},
      {{"--status", "--best-effort"}, "goes with a launch"},
  };
  for (const auto& [args, what] : cases) {
    std::vector<std::string> argv{kCli, "--no-mps"};
    argv.insert(argv.end(), args.begin(), args.end());
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find(what), std::string::npos) << r;
    EXPECT_FALSE(exists(marker)) << r;
  }
  // -p changed nothing.
  EXPECT_EQ(run({kCli, "-p", p}).out, pid_line(plain, "current TPC list", "3"));
  EXPECT_TRUE(task(plain)["role"].is_null());
  stop("plain", *pp);
}

}  // namespace
