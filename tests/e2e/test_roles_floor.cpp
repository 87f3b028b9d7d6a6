// SPDX-License-Identifier: Apache-2.0
// Roles, floor: every best-effort task keeps a floor that the reservations
// may not cover, under -p too, and runs on it next to a stale
// latency-critical task. Fixture: roles_fixture.hpp.
#include "roles_fixture.hpp"

namespace {
using namespace roles_e2e;

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

}  // namespace
