// SPDX-License-Identifier: Apache-2.0
// Roles, burst: a latency-critical task bursts, saturates and takes its
// top-up; its graphs follow the burst, its controller never breaks a
// capture, the burst set leaves out plain partitions, and the role sets the
// MPS client priority. Fixture: roles_fixture.hpp.
#include "roles_fixture.hpp"

namespace {
using namespace roles_e2e;

// ---- (b) an LC task busy too long stops bursting: BE kernels run on the floor ----------

TEST_F(Roles, SaturatedLatencyCriticalTaskPutsBestEffortOnItsFloor) {
  Proc* lcp = nullptr;
  const long lc = start_saturated_lc(&lcp);
  ASSERT_GT(lc, 0);
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
// ... best-effort tasks then run on their floor next to it"; burst_budget.hpp: "A
// task that keeps the GPU busy ... then runs on its reservation next to BE
// tasks on their floors").
TEST_F(Roles, SaturatedLatencyCriticalTaskRunsOnItsReservation) {
  Proc* lcp = nullptr;
  // Without its top-up: its probes time nothing here (its kernel is held),
  // and after the first its top-up is its most (ATopUpWithNothingMeasuredIsItsMost).
  const long lc = start_saturated_lc(&lcp);
  ASSERT_GT(lc, 0);
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

// The top-up (topup.hpp, TopUp): a saturated LC task takes TPCs beyond its
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
  Proc& q = start({"sh", "-c", "echo quit | \"$0\"", kFakeMps}, env);
  q.wait();
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

}  // namespace
