// SPDX-License-Identifier: Apache-2.0
// Roles, queue: what a best-effort task keeps queued (depth, floor depth,
// behind its gate, in time, in learned work), where its gates go, and its
// kernels too long to borrow an idle reservation. Fixture: roles_fixture.hpp.
#include "roles_fixture.hpp"

namespace {
using namespace roles_e2e;

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
  Proc* lcp = nullptr;
  const long lc = start_saturated_lc(&lcp);  // no probes: the BE task never holds
  ASSERT_GT(lc, 0);
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

}  // namespace
