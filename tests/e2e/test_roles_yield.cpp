// SPDX-License-Identifier: Apache-2.0
// Roles, yield: how a best-effort task makes way for a bursting
// latency-critical one (hold on the CPU, floor, run, or the gate on the GPU
// and its gatekeeper). Fixture: roles_fixture.hpp.
#include "roles_fixture.hpp"

namespace {
using namespace roles_e2e;

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

}  // namespace
