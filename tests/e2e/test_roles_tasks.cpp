// SPDX-License-Identifier: Apache-2.0
// Roles, several tasks: latency-critical reservations exclude each other,
// and a killed latency-critical task holds nothing back. Fixture:
// roles_fixture.hpp.
#include "roles_fixture.hpp"

namespace {
using namespace roles_e2e;

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

}  // namespace
