// SPDX-License-Identifier: Apache-2.0
// Roles, status: each task's role and state in --status, an LC task of
// another build said rather than ignored, and the role options' errors.
// Fixture: roles_fixture.hpp.
#include "roles_fixture.hpp"

namespace {
using namespace roles_e2e;

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
