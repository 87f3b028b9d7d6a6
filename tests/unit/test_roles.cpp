// SPDX-License-Identifier: Apache-2.0
// The latency-critical / best-effort protocol (roles/include/nvtaskset/):
// the burst budget on recorded traces of (time, busy) samples, the
// best-effort decision, the floor, and the beacons as files: created,
// read back, found by another process's scan, and refused when they are
// not what a live latency-critical task would have written.
#include "nvtaskset/beacon.hpp"
#include "nvtaskset/best_effort_policy.hpp"
#include "nvtaskset/burst_budget.hpp"
#include "nvtaskset/gate_lane.hpp"
#include "nvtaskset/kernel_timer.hpp"
#include "nvtaskset/topup.hpp"
#include "nvtaskset/work_queue.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nvtaskset/control_region.hpp"

namespace fs = std::filesystem;

namespace nvtaskset::roles {
namespace {

constexpr std::uint64_t kMs = 1'000'000;
// Traces start well after 0, as CLOCK_MONOTONIC does.
constexpr std::uint64_t kT0 = 10'000 * kMs;

// ---- names ---------------------------------------------------------------------------

TEST(RoleNames, RoundTrip) {
  for (Role r : {Role::kNone, Role::kLatencyCritical, Role::kBestEffort}) {
    const auto back = parse_role(role_name(r));
    ASSERT_TRUE(back.has_value()) << role_name(r);
    EXPECT_EQ(*back, r);
  }
  EXPECT_STREQ(role_name(Role::kLatencyCritical), "latency-critical");
  EXPECT_STREQ(role_name(Role::kBestEffort), "best-effort");
  EXPECT_FALSE(parse_role("lc").has_value());
  EXPECT_FALSE(parse_role("Best-Effort").has_value());
}

// ---- the burst budget ----------------------------------------------------------------

// A recorded trace: the controller's passes, each saying whether the task
// was busy since the previous one.
struct Sample {
  std::uint64_t t;
  bool busy;
};

// Busy for `busy_ms`, then idle for `idle_ms`, repeated `periods` times,
// sampled every millisecond from `start`.
std::vector<Sample> duty_cycle(std::uint64_t start, unsigned busy_ms, unsigned idle_ms, unsigned periods) {
  std::vector<Sample> out;
  std::uint64_t t = start;
  for (unsigned p = 0; p < periods; ++p) {
    for (unsigned i = 0; i < busy_ms; ++i) out.push_back({t += kMs, true});
    for (unsigned i = 0; i < idle_ms; ++i) out.push_back({t += kMs, false});
  }
  return out;
}

// Feeds `samples` to `b` until it stops the burst: when it did (0: never).
std::uint64_t first_stop(BurstBudget& b, const std::vector<Sample>& samples) {
  for (const Sample& s : samples) {
    b.advance(s.t, s.busy);
    if (!b.may_burst()) return s.t;
  }
  return 0;
}

TEST(BurstBudget, LightLoadKeepsBursting) {
  // 5 ms of work every 50 ms (10%) for 4 s: never stopped.
  BurstBudget b;
  b.advance(kT0, false);
  for (const Sample& s : duty_cycle(kT0, 5, 45, 80)) {
    b.advance(s.t, s.busy);
    ASSERT_TRUE(b.may_burst()) << "stopped at t=" << (s.t - kT0) / kMs << " ms, share " << b.share();
  }
  EXPECT_EQ(b.saturations(), 0u);
  EXPECT_LT(b.share(), 0.2);
  EXPECT_GT(b.share(), 0.0);
}

TEST(BurstBudget, ShortBurstsBelowTheLimitNeverStop) {
  // Busy for 10 ms less than the 250-ms limit, then idle for 760 ms: no
  // period reaches the limit, and once settled the share peaks at
  // (1 - exp(-0.24)) / (1 - exp(-1)) = 0.34, under the stop share.
  const BudgetParams p;
  const unsigned busy_ms = static_cast<unsigned>(p.max_burst_ns / kMs) - 10;
  const unsigned idle_ms = 760;
  BurstBudget b;
  b.advance(kT0, false);
  double peak = 0;
  for (const Sample& s : duty_cycle(kT0, busy_ms, idle_ms, 10)) {
    b.advance(s.t, s.busy);
    ASSERT_TRUE(b.may_burst()) << "stopped at t=" << (s.t - kT0) / kMs << " ms";
    peak = std::fmax(peak, b.share());
  }
  EXPECT_EQ(b.saturations(), 0u);
  const double tau_ms = static_cast<double>(p.tau_ns) / kMs;
  const double settled = (1 - std::exp(-static_cast<double>(busy_ms) / tau_ms)) /
                         (1 - std::exp(-static_cast<double>(busy_ms + idle_ms) / tau_ms));
  EXPECT_NEAR(peak, settled, 0.01);
  EXPECT_LT(peak, p.stop_share);
}

TEST(BurstBudget, OneBusyPeriodOfMaxBurstStopsItOnce) {
  const BudgetParams p;
  const std::uint64_t max_ms = p.max_burst_ns / kMs;
  BurstBudget b;
  b.advance(kT0, false);
  // Busy from kT0 on: the period began at the previous pass.
  for (std::uint64_t ms = 1; ms < max_ms; ++ms) {
    b.advance(kT0 + ms * kMs, true);
    ASSERT_TRUE(b.may_burst()) << ms << " ms busy";
  }
  // The share is only 1 - exp(-250 ms / 1 s) = 0.22 here: the period's
  // length stops it.
  EXPECT_LT(b.share(), p.stop_share);
  b.advance(kT0 + max_ms * kMs, true);
  EXPECT_FALSE(b.may_burst());
  EXPECT_EQ(b.saturations(), 1u);
  // Still busy, for 5 s in all: stays stopped, counted once, the share
  // 1 - exp(-5) = 0.993.
  for (std::uint64_t ms = max_ms + 1; ms <= 5000; ++ms) b.advance(kT0 + ms * kMs, true);
  EXPECT_FALSE(b.may_burst());
  EXPECT_EQ(b.saturations(), 1u);
  EXPECT_GT(b.share(), 0.99);
}

TEST(BurstBudget, OneLongSampleCountsAsOneBusyPeriod) {
  // A controller that did not pass for 300 ms (more than the 250-ms limit)
  // finds the task busy: the whole interval was one busy period. The share,
  // 1 - exp(-0.3) = 0.26, would not have stopped it.
  const BudgetParams p;
  BurstBudget b;
  b.advance(kT0, false);
  b.advance(kT0 + 300 * kMs, true);
  EXPECT_FALSE(b.may_burst());
  EXPECT_EQ(b.saturations(), 1u);
  EXPECT_LT(b.share(), p.stop_share);
  // One sample shorter than the limit does not.
  BurstBudget c;
  c.advance(kT0, false);
  c.advance(kT0 + p.max_burst_ns - 10 * kMs, true);
  EXPECT_TRUE(c.may_burst());
  EXPECT_EQ(c.saturations(), 0u);
}

TEST(BurstBudget, AHighShareStopsItWithoutALongPeriod) {
  // 60 ms busy, 20 ms idle: no period reaches 250 ms, but the share tends
  // to 0.75 and passes the stop share (after about 1.1 s).
  BurstBudget b;
  b.advance(kT0, false);
  bool stopped = false;
  for (const Sample& s : duty_cycle(kT0, 60, 20, 40)) {
    b.advance(s.t, s.busy);
    if (!b.may_burst()) {
      stopped = true;
      EXPECT_TRUE(s.busy) << "stopped while idle";
      EXPECT_GT(b.share(), BudgetParams{}.stop_share);
      break;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(b.saturations(), 1u);
}

TEST(BurstBudget, ResumesOnlyWhenIdleAndTheShareIsBelowResume) {
  // The share's rule alone (the time-out is tested below: here it would
  // come first, 1 s after the stop).
  BudgetParams p;
  p.resume_after_ns = 0;
  BurstBudget b(p);
  b.advance(kT0, false);
  std::uint64_t t = kT0;
  for (unsigned ms = 0; ms < 5000; ++ms) b.advance(t += kMs, true);  // share 1 - exp(-5) = 0.993
  ASSERT_FALSE(b.may_burst());
  ASSERT_GT(b.share(), 0.99);
  // Idle: the share decays as exp(-t / 1 s) and falls below 0.35 after
  // 1 s * ln(0.993 / 0.35) = 1043 ms, not before.
  const double tau_ms = static_cast<double>(p.tau_ns) / kMs;
  const double below_ms = tau_ms * std::log(b.share() / p.resume_share);
  unsigned idle_ms = 0;
  while (!b.may_burst() && idle_ms < 5000) {
    ASSERT_GE(b.share(), p.resume_share) << idle_ms << " ms idle, still stopped";
    b.advance(t += kMs, false);
    ++idle_ms;
  }
  EXPECT_TRUE(b.may_burst()) << "share " << b.share();
  EXPECT_GE(idle_ms, below_ms) << "resumed before the share fell below the resume share";
  EXPECT_LE(idle_ms, below_ms + 2) << "resumed late";
  EXPECT_LT(b.share(), p.resume_share);
  EXPECT_EQ(b.saturations(), 1u);
  // A second long busy period stops it again, counted: from just under the
  // resume share, the share would pass the stop share only after
  // 1 s * ln(0.65 / 0.5) = 262 ms, so the period's length (250 ms) does.
  unsigned busy_ms = 0;
  while (b.may_burst() && busy_ms < 5000) {
    b.advance(t += kMs, true);
    ++busy_ms;
  }
  EXPECT_FALSE(b.may_burst());
  EXPECT_EQ(busy_ms, p.max_burst_ns / kMs);
  EXPECT_EQ(b.saturations(), 2u);
}

TEST(BurstBudget, BusyNeverResumesEvenWithALowShare) {
  // A short limit stops bursting with the share still low (1 - exp(-10/1000)
  // = 0.01, below the resume share): while busy it stays stopped; the first
  // idle pass lets it burst again.
  BudgetParams p;
  p.max_burst_ns = 10 * kMs;
  BurstBudget b(p);
  b.advance(kT0, false);
  std::uint64_t t = kT0;
  for (unsigned ms = 0; ms < 10; ++ms) b.advance(t += kMs, true);
  ASSERT_FALSE(b.may_burst());
  ASSERT_LT(b.share(), p.resume_share);
  for (unsigned ms = 0; ms < 5; ++ms) {
    b.advance(t += kMs, true);
    ASSERT_FALSE(b.may_burst());
  }
  b.advance(t += kMs, false);
  EXPECT_TRUE(b.may_burst());
  EXPECT_EQ(b.saturations(), 1u);
  // And a new busy period is measured from its own start.
  for (unsigned ms = 1; ms < 10; ++ms) {
    b.advance(t += kMs, true);
    ASSERT_TRUE(b.may_burst()) << ms;
  }
  b.advance(t += kMs, true);
  EXPECT_FALSE(b.may_burst());
  EXPECT_EQ(b.saturations(), 2u);
}

TEST(BurstBudget, AStoppedTaskBurstsAgainAfterTheTimeOut) {
  // The trace of an LC task whose load is light while it bursts (2 ms of
  // work every 10 ms) but heavy on its reservation alone (6 ms of every
  // 10 ms: docs/results.md, GPT-2 at 87 requests/s on 16 TPCs). Stopped,
  // its share stays above the resume share (it tends to 0.6) for ever;
  // the time-out lets it try again, and bursting, it stays light.
  for (const bool timeout : {false, true}) {
    BudgetParams p;
    if (!timeout) p.resume_after_ns = 0;
    BurstBudget b(p);
    b.advance(kT0, false);
    std::uint64_t t = kT0;
    // One long request of 600 ms: its length stops it at 250 ms, and it
    // leaves the share at 1 - exp(-0.6) = 0.45, above the resume share.
    std::uint64_t stopped = 0;
    for (unsigned ms = 0; ms < 600; ++ms) {
      b.advance(t += kMs, true);
      if (stopped == 0 && !b.may_burst()) stopped = t;
    }
    ASSERT_FALSE(b.may_burst());
    ASSERT_EQ(stopped - kT0, p.max_burst_ns);
    ASSERT_GT(b.share(), p.resume_share);
    const std::vector<Sample> reserved = duty_cycle(t, 6, 4, 300);  // 3 s on the reservation
    std::uint64_t resumed = 0;
    for (const Sample& s : reserved) {
      b.advance(s.t, s.busy);
      if (b.may_burst()) {
        resumed = s.t;
        EXPECT_FALSE(s.busy) << "resumed in the middle of a request";
        break;
      }
      EXPECT_GT(b.share(), p.resume_share) << "at " << (s.t - stopped) / kMs << " ms";
    }
    if (!timeout) {
      EXPECT_EQ(resumed, 0u) << "the share alone never lets it resume";
      continue;
    }
    ASSERT_NE(resumed, 0u);
    // The first idle pass once the time-out has run.
    std::uint64_t first_idle_pass = 0;
    for (const Sample& s : reserved)
      if (!s.busy && s.t - stopped >= p.resume_after_ns) {
        first_idle_pass = s.t;
        break;
      }
    EXPECT_EQ(resumed, first_idle_pass) << "resumed " << (resumed - stopped) / kMs << " ms after the stop";
    EXPECT_LE(b.share(), p.resume_share);
    // Bursting, the same requests take 2 ms: it keeps bursting.
    for (const Sample& s : duty_cycle(resumed, 2, 8, 300)) {
      b.advance(s.t, s.busy);
      ASSERT_TRUE(b.may_burst()) << (s.t - resumed) / kMs << " ms after resuming, share " << b.share();
    }
    EXPECT_EQ(b.saturations(), 1u);
  }
}

TEST(BurstBudget, AClosedLoopsProbesBackOff) {
  // A closed loop: busy but for a 1 ms gap every 20 ms, at any speed; its
  // shares tend to 0.95. No busy period reaches the limit: the fast share
  // stops it first. Each time-out then lets it probe from the fast resume
  // share (0.9), and the fast share passes its stop share again within
  // 0.1 s * ln((0.95 - 0.9) / (0.95 - 0.93)) = 92 ms (the slow one, from the
  // resume share, would take 0.29 s), within 2 tau of the probe: a failed
  // probe, so the next time-out doubles, up to 8 s. The probes come 1, 2,
  // 4, 8, 8, ... s after each stop.
  const BudgetParams p;
  BurstBudget b;
  b.advance(kT0, false);
  const double loop_share = 19.0 / 20.0;
  const double probe_ns = static_cast<double>(p.fast_tau_ns) *
                          std::log((loop_share - p.fast_resume_share) / (loop_share - p.fast_stop_share));
  // Some slack: the share rises and falls within each 20-ms period (by
  // 0.05 over the 1-ms gap and the 19 ms after, a fifth of the way here).
  const auto probe_min = static_cast<std::uint64_t>(probe_ns * 0.7);
  const auto probe_max = static_cast<std::uint64_t>(probe_ns * 1.1);
  constexpr std::uint64_t kPeriod = 20 * kMs;  // a resume waits for the next idle pass
  std::vector<std::uint64_t> stops, timeouts, resumes;
  std::uint64_t allowed_busy_ms = 0, busy_ms = 0;
  bool allowed = true;
  for (const Sample& s : duty_cycle(kT0, 19, 1, 1500)) {  // 30 s
    b.advance(s.t, s.busy);
    if (allowed && !b.may_burst()) {
      stops.push_back(s.t);
      timeouts.push_back(b.resume_timeout());
    } else if (!allowed && b.may_burst()) {
      EXPECT_FALSE(s.busy) << "resumed while busy";
      resumes.push_back(s.t);
    }
    allowed = b.may_burst();
    if (stops.empty() || !s.busy) continue;
    ++busy_ms;
    if (b.may_burst()) ++allowed_busy_ms;
  }
  // Stops at about 0.39 s (the fast share), then 1.29, 2.29, 4.29, 8.29
  // and 8.29 s apart: 6 in 30 s.
  ASSERT_EQ(stops.size(), 6u);
  ASSERT_GE(resumes.size(), stops.size() - 1);
  ASSERT_LE(resumes.size(), stops.size());
  EXPECT_EQ(timeouts[0], p.resume_after_ns) << "the first stop was no probe";
  for (std::size_t i = 0; i + 1 < stops.size(); ++i) {
    SCOPED_TRACE("probe " + std::to_string(i + 1));
    // The time-out in force after stop i: 1, 2, 4, 8, 8 s.
    const std::uint64_t timeout = std::min(p.resume_after_ns << i, p.max_resume_after_ns);
    EXPECT_EQ(timeouts[i], timeout);
    EXPECT_GE(resumes[i] - stops[i], timeout);
    EXPECT_LT(resumes[i] - stops[i], timeout + kPeriod);
    // The probe is stopped by the share, quickly.
    EXPECT_GE(stops[i + 1] - resumes[i], probe_min);
    EXPECT_LE(stops[i + 1] - resumes[i], probe_max);
    const std::uint64_t gap = stops[i + 1] - stops[i];
    EXPECT_LE(gap, p.max_resume_after_ns + probe_max + kPeriod);
    if (i > 0) {
      const std::uint64_t previous = stops[i] - stops[i - 1];
      if (timeout > timeouts[i - 1])
        EXPECT_GT(gap, previous) << "the gap between stops grows while the time-out does";
      else
        EXPECT_NEAR(static_cast<double>(gap), static_cast<double>(previous), 2.0 * kPeriod) << "capped";
    }
  }
  EXPECT_EQ(b.resume_timeout(), p.max_resume_after_ns);
  // After the first stop it bursts only in its probes: 5 of at most 0.1 s
  // of a 30-s trace, under 2% of its busy time.
  EXPECT_LE(allowed_busy_ms * kMs, resumes.size() * probe_max);
  EXPECT_LT(static_cast<double>(allowed_busy_ms) / static_cast<double>(busy_ms), 0.02);
}

TEST(BurstBudget, AClosedLoopIsStoppedByTheFastShareAndAnOpenLoopIsNot) {
  // A closed loop from idle, busy but for a 1-ms gap every 20 ms: no busy
  // period reaches 250 ms, and the 1-s share would pass 0.5 only after
  // about 0.73 s; the fast share (100 ms) passes 0.93 after
  // 0.1 s * ln(0.95 / (0.95 - 0.93)) = 0.39 s.
  const BudgetParams p;
  BurstBudget b;
  b.advance(kT0, false);
  const std::uint64_t stopped = first_stop(b, duty_cycle(kT0, 19, 1, 100));
  ASSERT_NE(stopped, 0u);
  EXPECT_GE(stopped - kT0, 350 * kMs);
  EXPECT_LE(stopped - kT0, 420 * kMs);
  EXPECT_LT(b.share(), p.stop_share) << "the slow share had not stopped it yet";
  EXPECT_GT(b.fast_share(), p.fast_stop_share);
  // Without the fast share, the slow one stops it, 0.3 s later.
  BudgetParams slow = p;
  slow.fast_tau_ns = 0;
  BurstBudget c(slow);
  c.advance(kT0, false);
  const std::uint64_t slow_stop = first_stop(c, duty_cycle(kT0, 19, 1, 100));
  ASSERT_NE(slow_stop, 0u);
  EXPECT_GE(slow_stop - kT0, 700 * kMs);
  // An open loop of GPT-2's bursts at 87 requests/s (2.3 ms a request, 20%
  // busy), with 50-ms stretches of back-to-back requests twice a second:
  // the fast share peaks near 0.5, never 0.93.
  BurstBudget o;
  o.advance(kT0, false);
  double peak = 0;
  for (const Sample& s : duty_cycle(kT0, 50, 450, 20)) {
    o.advance(s.t, s.busy);
    ASSERT_TRUE(o.may_burst()) << (s.t - kT0) / kMs << " ms";
    peak = std::fmax(peak, o.fast_share());
  }
  EXPECT_LT(peak, 0.5);
  EXPECT_EQ(o.saturations(), 0u);
}

TEST(BurstBudget, AResumeByTheShareOrALongProbeResetsTheBackOff) {
  const BudgetParams p;
  BurstBudget b;
  std::uint64_t t = kT0;
  b.advance(t, false);
  // Runs `busy_ms` busy, `idle_ms` idle, ... until may_burst() is `want`:
  // how long that took (0: not within `limit`).
  const auto run_until = [&](unsigned busy_ms, unsigned idle_ms, bool want, std::uint64_t limit) -> std::uint64_t {
    const std::uint64_t from = t;
    while (t - from < limit)
      for (unsigned ms = 0; ms < busy_ms + idle_ms; ++ms) {
        b.advance(t += kMs, ms < busy_ms);
        if (b.may_burst() == want) return t - from;
      }
    return 0;
  };
  // A closed loop (19 ms busy, 1 ms idle) until a failed probe doubles the
  // time-out.
  const auto fail_a_probe = [&] {
    ASSERT_NE(run_until(19, 1, false, 5 * p.tau_ns), 0u);
    ASSERT_EQ(b.resume_timeout(), p.resume_after_ns);
    const std::uint64_t waited = run_until(19, 1, true, 5 * p.resume_after_ns);
    ASSERT_GE(waited, p.resume_after_ns);
    const std::uint64_t probe = run_until(19, 1, false, 2 * p.tau_ns);
    ASSERT_NE(probe, 0u);
    ASSERT_LT(probe, 2 * p.tau_ns);
    ASSERT_EQ(b.resume_timeout(), 2 * p.resume_after_ns);
  };

  // Then idle: the share falls below the resume share (from 0.5, after
  // 1 s * ln(0.5 / 0.35) = 0.36 s) before either time-out: the next one is
  // resume_after_ns again.
  ASSERT_NO_FATAL_FAILURE(fail_a_probe());
  const std::uint64_t idle = run_until(0, 1, true, 5 * p.tau_ns);
  ASSERT_NE(idle, 0u);
  EXPECT_LT(idle, p.resume_after_ns) << "resumed by the share";
  EXPECT_LT(b.share(), p.resume_share);
  EXPECT_EQ(b.resume_timeout(), p.resume_after_ns);

  // A probe that keeps bursting (the load light while it bursts, for 3 s)
  // and is stopped only more than 2 tau after it began did not fail: the
  // next time-out is resume_after_ns again, not 4 s.
  b = BurstBudget();
  b.advance(t, false);
  ASSERT_NO_FATAL_FAILURE(fail_a_probe());
  const std::uint64_t waited = run_until(19, 1, true, 5 * b.resume_timeout());
  ASSERT_GE(waited, 2 * p.resume_after_ns);
  const std::uint64_t probed = t;
  ASSERT_EQ(run_until(2, 8, false, 3 * p.tau_ns), 0u) << "a light load keeps bursting";
  ASSERT_NE(run_until(19, 1, false, 5 * p.tau_ns), 0u);
  EXPECT_GE(t - probed, 2 * p.tau_ns);
  EXPECT_EQ(b.resume_timeout(), p.resume_after_ns);
  // And the next probe comes after it: the first idle pass of the loop
  // once resume_after_ns has run.
  const std::uint64_t next = run_until(19, 1, true, 5 * p.max_resume_after_ns);
  EXPECT_GE(next, p.resume_after_ns);
  EXPECT_LT(next, p.resume_after_ns + 20 * kMs);
}

TEST(BurstBudget, TheHoldBudgetHasNoTimeOut) {
  // A BE task held half its time or more stays unheld until its own share
  // falls: an LC task cannot win the hold back by waiting.
  BurstBudget b(kHoldBudget);
  b.advance(kT0, false);
  std::uint64_t t = kT0;
  for (unsigned ms = 0; ms < 100; ++ms) b.advance(t += kMs, true);
  ASSERT_FALSE(b.may_burst());
  for (const Sample& s : duty_cycle(t, 6, 4, 300)) {
    b.advance(s.t, s.busy);
    ASSERT_FALSE(b.may_burst()) << (s.t - t) / kMs << " ms after the stop";
  }
}

TEST(BurstBudget, TheHoldBudgetBoundsAWaitingBestEffortTask) {
  // The budget a best-effort task holds under: at most 100 ms in a row.
  BurstBudget b(kHoldBudget);
  b.advance(kT0, false);
  std::uint64_t t = kT0;
  unsigned held = 0;
  while (b.may_burst() && held < 1000) {
    b.advance(t += kMs, true);
    ++held;
  }
  EXPECT_EQ(held, 100u);
}

TEST(BurstBudget, TimeGoingBackCountsAsNoTime) {
  BurstBudget b;
  b.advance(kT0, true);
  b.advance(kT0 + 50 * kMs, true);
  const double s = b.share();
  b.advance(kT0 + 10 * kMs, true);  // earlier than the last pass
  EXPECT_DOUBLE_EQ(b.share(), s);
  EXPECT_TRUE(b.may_burst());
}

// ---- the best-effort decision ------------------------------------------------------

constexpr std::uint64_t kNow = 50'000 * kMs;

LcSnapshot idle() { return {7, 7, kNow - kMs, true}; }
LcSnapshot bursting() { return {8, 7, kNow - kMs, true}; }
LcSnapshot saturated() { return {8, 7, kNow - kMs, false}; }
LcSnapshot stale_of(LcSnapshot s) {
  s.heartbeat_ns = kNow - kStaleNs - kMs;
  return s;
}

TEST(BeAction, OneLatencyCriticalTask) {
  EXPECT_EQ(be_action(std::vector<LcSnapshot>{}, kNow), BeAction::kRun);
  EXPECT_EQ(be_action({idle()}, kNow), BeAction::kRun);
  // An idle task that may not burst (it used its budget earlier) is idle.
  LcSnapshot idle_stopped = idle();
  idle_stopped.may_burst = false;
  EXPECT_EQ(be_action({idle_stopped}, kNow), BeAction::kRun);
  EXPECT_EQ(be_action({bursting()}, kNow), BeAction::kHold);
  EXPECT_EQ(be_action({saturated()}, kNow), BeAction::kFloor);
}

TEST(BeAction, AStaleControllerMeansTheFloorWhateverItSays) {
  EXPECT_EQ(be_action({stale_of(bursting())}, kNow), BeAction::kFloor);
  EXPECT_EQ(be_action({stale_of(saturated())}, kNow), BeAction::kFloor);
  EXPECT_EQ(be_action({stale_of(idle())}, kNow), BeAction::kFloor);
  // A controller that never passed (heartbeat 0) is stale too.
  LcSnapshot never = bursting();
  never.heartbeat_ns = 0;
  EXPECT_EQ(be_action({never}, kNow), BeAction::kFloor);
  // Exactly kStaleNs old is not stale yet; a heartbeat "ahead" of the
  // reader's clock (read just before it was written) is fresh.
  LcSnapshot edge = bursting();
  edge.heartbeat_ns = kNow - kStaleNs;
  EXPECT_EQ(be_action({edge}, kNow), BeAction::kHold);
  LcSnapshot ahead = bursting();
  ahead.heartbeat_ns = kNow + kMs;
  EXPECT_EQ(be_action({ahead}, kNow), BeAction::kHold);
}

TEST(BeAction, SeveralLatencyCriticalTasksHoldWins) {
  EXPECT_EQ(be_action({idle(), idle()}, kNow), BeAction::kRun);
  EXPECT_EQ(be_action({idle(), saturated()}, kNow), BeAction::kFloor);
  EXPECT_EQ(be_action({saturated(), bursting()}, kNow), BeAction::kHold);
  EXPECT_EQ(be_action({bursting(), saturated()}, kNow), BeAction::kHold);
  EXPECT_EQ(be_action({stale_of(bursting()), bursting()}, kNow), BeAction::kHold);
  EXPECT_EQ(be_action({bursting(), stale_of(idle())}, kNow), BeAction::kHold);
  EXPECT_EQ(be_action({idle(), stale_of(idle())}, kNow), BeAction::kFloor);
  EXPECT_EQ(be_action({stale_of(idle()), idle()}, kNow), BeAction::kFloor);
  EXPECT_EQ(be_action({idle(), saturated(), idle()}, kNow), BeAction::kFloor);
}

TEST(BeAction, AHoldForProbesOnlyIsTold) {
  LcSnapshot probing = bursting();
  probing.probing = true;
  EXPECT_EQ(be_action({probing}, kNow), BeAction::kHold);
  EXPECT_TRUE(hold_is_probe({probing}, kNow));
  EXPECT_TRUE(hold_is_probe({probing, saturated(), idle()}, kNow));
  EXPECT_TRUE(hold_is_probe({probing, probing}, kNow));
  // Another task's burst makes it a hold like any other.
  EXPECT_FALSE(hold_is_probe({probing, bursting()}, kNow));
  EXPECT_FALSE(hold_is_probe({bursting()}, kNow));
  EXPECT_FALSE(hold_is_probe({saturated()}, kNow));
  EXPECT_FALSE(hold_is_probe(std::vector<LcSnapshot>{}, kNow));
  // A stale or idle prober makes nobody hold.
  EXPECT_FALSE(hold_is_probe({stale_of(probing)}, kNow));
  LcSnapshot idle_probing = idle();
  idle_probing.probing = true;
  EXPECT_FALSE(hold_is_probe({idle_probing}, kNow));
}

TEST(BurstBudget, TheProbeHoldBudgetBoundsAnLcTaskThatProbesForEver) {
  // A probe of 80 ms every 500 ms (probes that time nothing) is let
  // through every time; probing without end is held at most 100 ms in a
  // row and, over 10 s, a fifth of the time or so.
  BurstBudget b(kProbeHoldBudget);
  b.advance(kT0, false);
  for (const Sample& s : duty_cycle(kT0, 80, 420, 40)) {
    b.advance(s.t, s.busy);
    ASSERT_TRUE(b.may_burst()) << (s.t - kT0) / kMs << " ms, share " << b.share();
  }
  BurstBudget c(kProbeHoldBudget);
  std::uint64_t t = kT0, held = 0, in_a_row = 0, most_in_a_row = 0;
  c.advance(t, false);
  for (unsigned ms = 0; ms < 10'000; ++ms) {
    // The BE task holds whenever the budget lets it, and launches otherwise.
    const bool hold = c.may_burst();
    c.advance(t += kMs, hold);
    held += hold;
    in_a_row = hold ? in_a_row + 1 : 0;
    most_in_a_row = std::max(most_in_a_row, in_a_row);
  }
  EXPECT_LE(most_in_a_row, 100u);
  EXPECT_LT(held, 3'000u);
}

TEST(BeAction, SnapshotReadsTheBeacon) {
  alignas(64) static unsigned char page[kBeaconBytes] = {};
  auto* b = reinterpret_cast<Beacon*>(page);
  b->launches.store(12);
  b->completed.store(11);
  b->heartbeat_ns.store(kNow);
  b->may_burst.store(1);
  const LcSnapshot s = snapshot(*b);
  EXPECT_EQ(s.launches, 12u);
  EXPECT_EQ(s.completed, 11u);
  EXPECT_EQ(s.heartbeat_ns, kNow);
  EXPECT_TRUE(s.may_burst);
  EXPECT_FALSE(s.probing);
  EXPECT_EQ(be_action({s}, kNow), BeAction::kHold);
  b->probing.store(1);
  EXPECT_TRUE(snapshot(*b).probing);
  b->probing.store(0);
  b->may_burst.store(0);
  EXPECT_EQ(be_action({snapshot(*b)}, kNow), BeAction::kFloor);
  b->completed.store(12);
  EXPECT_EQ(be_action({snapshot(*b)}, kNow), BeAction::kRun);
}

TEST(FloorOf, PartitionMinusReservations) {
  EXPECT_EQ(floor_of(Bits128{0xff, 0}, Bits128{0x03, 0}), (Bits128{0xfc, 0}));
  EXPECT_EQ(floor_of(Bits128{0xff, 0x1}, Bits128{0x0, 0x1}), (Bits128{0xff, 0}));
  EXPECT_EQ(floor_of(Bits128{0xf0, 0}, Bits128{0x0f, 0}), (Bits128{0xf0, 0}));
  EXPECT_TRUE(floor_of(Bits128{0x3, 0}, Bits128{0xff, 0}).none());
  EXPECT_EQ(floor_of(Bits128{~0ull, ~0ull}, Bits128{}), (Bits128{~0ull, ~0ull}));
  // What reserved_on answers for an unreadable slot leaves no floor.
  EXPECT_TRUE(floor_of(Bits128{~0ull, ~0ull}, Bits128{~0ull, ~0ull}).none());
}

// ---- beacons ----------------------------------------------------------------------------

class Beacons : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvtaskset-roles-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 01777);  // as /dev/shm
    if (const char* old = std::getenv("NVTASKSET_STATUS_DIR")) old_ = old;
    ::setenv("NVTASKSET_STATUS_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    for (pid_t c : children_) {
      ::kill(c, SIGKILL);
      ::waitpid(c, nullptr, 0);
    }
    if (old_.empty()) ::unsetenv("NVTASKSET_STATUS_DIR");
    else ::setenv("NVTASKSET_STATUS_DIR", old_.c_str(), 1);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::vector<std::string> beacon_names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().starts_with("nvtaskset-beacon.")) out.push_back(e.path().filename().string());
    return out;
  }

  // A child that stays alive until killed; with `with_beacon` it creates
  // its own beacon first (in this test's directory) and writes its path
  // to us. Returns its pid; `path` gets the beacon's path.
  pid_t start_child(bool with_beacon, std::string* path = nullptr) {
    int fds[2];
    if (::pipe(fds) != 0) return -1;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      std::string msg = "-";
      std::unique_ptr<BeaconFile> f;
      if (with_beacon) {
        try {
          f = BeaconFile::create();
          f->beacon().launches.store(5);
          msg = f->path();
        } catch (const std::exception& e) {
          msg = std::string("error ") + e.what();
        }
      }
      msg += "\n";
      if (::write(fds[1], msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) ::_exit(1);
      ::close(fds[1]);
      for (;;) ::pause();
    }
    ::close(fds[1]);
    if (pid > 0) children_.push_back(pid);
    std::string got;
    char c;
    while (::read(fds[0], &c, 1) == 1 && c != '\n') got += c;
    ::close(fds[0]);
    if (path) *path = got;
    return pid;
  }

  // Kills a child and waits until it is a zombie, without reaping it.
  static void kill_to_zombie(pid_t pid) {
    ::kill(pid, SIGKILL);
    siginfo_t si{};
    ::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOWAIT);
  }

  void reap(pid_t pid) {
    ::waitpid(pid, nullptr, 0);
    std::erase(children_, pid);
  }

  // A beacon page as a live task `pid` would have written it, with
  // `marker` in its launch count to tell the copies apart.
  static std::vector<unsigned char> page_for(pid_t pid, std::uint64_t marker) {
    std::vector<unsigned char> page(kBeaconBytes, 0);
    alignas(64) unsigned char buf[kBeaconBytes] = {};
    auto* b = reinterpret_cast<Beacon*>(buf);
    b->version = kBeaconVersion;
    b->size = sizeof(Beacon);
    b->pid = pid;
    b->start_time = ctl::process_start_time(pid);
    b->uid = ::geteuid();
    b->launches.store(marker);
    b->magic.store(kBeaconMagic);
    std::memcpy(page.data(), buf, kBeaconBytes);
    return page;
  }

  std::string write_file(const std::string& name, const std::vector<unsigned char>& bytes, mode_t mode) {
    const std::string p = dir_ + "/" + name;
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd, 0) << p;
    if (fd < 0) return p;
    EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::fchmod(fd, mode);
    ::close(fd);
    return p;
  }

  static std::string name_for(pid_t pid, const std::string& hex16) {
    return "nvtaskset-beacon." + std::to_string(pid) + "." + hex16;
  }

  // The peers whose beacons carry `marker`.
  static unsigned count_marker(const std::vector<Peer>& peers, std::uint64_t marker) {
    unsigned n = 0;
    for (const Peer& p : peers) n += p.beacon->launches.load() == marker ? 1 : 0;
    return n;
  }

  std::string dir_, old_;
  std::vector<pid_t> children_;
};

TEST_F(Beacons, CreateMakesAOnePagePublicFileNamedForTheTask) {
  std::string path;
  {
    const auto f = BeaconFile::create();
    path = f->path();
    const std::string name = fs::path(path).filename().string();
    const std::string prefix = "nvtaskset-beacon." + std::to_string(::getpid()) + ".";
    ASSERT_TRUE(name.starts_with(prefix)) << name;
    const std::string hex = name.substr(prefix.size());
    EXPECT_EQ(hex.size(), 16u) << name;
    EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos) << name;
    EXPECT_EQ(fs::path(path).parent_path().string(), dir_);
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0644u);
    EXPECT_EQ(st.st_size, static_cast<off_t>(kBeaconBytes));
    EXPECT_EQ(st.st_uid, ::geteuid());
    const Beacon& b = f->beacon();
    EXPECT_EQ(b.magic.load(), kBeaconMagic);
    EXPECT_EQ(b.version, kBeaconVersion);
    EXPECT_EQ(b.size, sizeof(Beacon));
    EXPECT_EQ(b.pid, ::getpid());
    EXPECT_EQ(b.uid, ::geteuid());
    EXPECT_EQ(b.start_time, ctl::process_start_time(::getpid()));
    EXPECT_NE(b.start_time, 0u);
    EXPECT_EQ(b.launches.load(), 0u);
    std::vector<DeviceView> views;
    ASSERT_TRUE(read_devices(b, views));
    EXPECT_TRUE(views.empty());
    // Two beacons of one process do not collide.
    const auto g = BeaconFile::create();
    EXPECT_NE(g->path(), path);
    EXPECT_EQ(beacon_names().size(), 2u);
  }
  EXPECT_FALSE(fs::exists(path)) << "the beacon outlived its object";
  EXPECT_TRUE(beacon_names().empty());
}

TEST_F(Beacons, ForgetLeavesTheFileToItsOwner) {
  std::string path;
  {
    const auto f = BeaconFile::create();
    path = f->path();
    f->forget();
  }
  EXPECT_TRUE(fs::exists(path));
}

TEST_F(Beacons, CreateRefusesAnUnsafeDirectoryInOneLine) {
  const std::string open_dir = dir_ + "/open";
  fs::create_directory(open_dir);
  ::chmod(open_dir.c_str(), 0777);  // writable by all, not sticky
  ::setenv("NVTASKSET_STATUS_DIR", open_dir.c_str(), 1);
  try {
    BeaconFile::create();
    ADD_FAILURE() << "created a beacon in a world-writable, non-sticky directory";
  } catch (const ctl::Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not sticky"), std::string::npos) << e.what();
  }
  ::setenv("NVTASKSET_STATUS_DIR", (dir_ + "/missing").c_str(), 1);
  EXPECT_THROW(BeaconFile::create(), ctl::Error);
  EXPECT_TRUE(fs::is_empty(open_dir));
}

TEST_F(Beacons, DevicesRoundTrip) {
  const auto f = BeaconFile::create();
  Beacon& b = f->beacon();
  DeviceUuid a{}, other{};
  a[0] = 0xa1;
  a[15] = 0x5a;
  other[0] = 0x0b;
  set_device(b, 0, a, Bits128{0x3, 0}, Bits128{0xff, 0x10});
  set_device(b, 1, kAnyDevice, Bits128{0x0, 0x4}, Bits128{0x0, 0xf});
  set_device(b, kBeaconDevices, a, Bits128{~0ull, ~0ull}, Bits128{~0ull, ~0ull});  // out of range: ignored
  std::vector<DeviceView> views;
  ASSERT_TRUE(read_devices(b, views));
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].uuid, a);
  EXPECT_EQ(views[0].reserved, (Bits128{0x3, 0}));
  EXPECT_EQ(views[0].burst, (Bits128{0xff, 0x10}));
  EXPECT_EQ(views[1].uuid, kAnyDevice);
  EXPECT_EQ(views[1].reserved, (Bits128{0x0, 0x4}));
  EXPECT_EQ(views[1].burst, (Bits128{0x0, 0xf}));
  std::uint8_t ua[16], uo[16];
  std::memcpy(ua, a.data(), 16);
  std::memcpy(uo, other.data(), 16);
  // Its own GPU's reservation plus the one on any GPU; another GPU only that.
  EXPECT_EQ(reserved_on(b, ua), (Bits128{0x3, 0x4}));
  EXPECT_EQ(reserved_on(b, uo), (Bits128{0x0, 0x4}));
  // Rewriting a slot replaces it.
  set_device(b, 0, a, Bits128{0xc, 0}, Bits128{0xfc, 0});
  EXPECT_EQ(reserved_on(b, ua), (Bits128{0xc, 0x4}));
  ASSERT_TRUE(read_devices(b, views));
  EXPECT_EQ(views[0].burst, (Bits128{0xfc, 0}));
  // A slot taken out of use no longer counts.
  b.devices[1].in_use.store(0);
  EXPECT_EQ(reserved_on(b, uo), Bits128{});
  ASSERT_TRUE(read_devices(b, views));
  EXPECT_EQ(views.size(), 1u);
}

// A writer the scheduler stopped half-way holds its slot odd for
// milliseconds: the reader waits it out and reads the reservation (taking
// all of it left a best-effort task no floor). A slot that stays odd (a
// writer that died there, or corruption) is the safe side: all of it.
TEST_F(Beacons, ASlotCaughtMidWriteIsWaitedOutThenTheSafeSide) {
  const auto f = BeaconFile::create();
  Beacon& b = f->beacon();
  DeviceUuid a{};
  a[0] = 1;
  set_device(b, 0, a, Bits128{0x3, 0}, Bits128{0xff, 0});
  std::uint8_t ua[16];
  std::memcpy(ua, a.data(), 16);
  const std::uint64_t even = b.devices[0].seq.load();
  b.devices[0].seq.store(even + 1);  // mid-write
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    b.devices[0].seq.store(even + 2, std::memory_order_release);  // the write ends
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(reserved_on(b, ua), (Bits128{0x3, 0}));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(5));  // it did wait
  writer.join();
  b.devices[2].seq.store(7);  // stays odd
  std::vector<DeviceView> views;
  EXPECT_FALSE(read_devices(b, views));
  EXPECT_EQ(reserved_on(b, ua), (Bits128{~0ull, ~0ull}));
}

TEST_F(Beacons, ScanFindsAnotherTasksBeaconAndNotItsOwn) {
  std::string child_path;
  const pid_t child = start_child(true, &child_path);
  ASSERT_GT(child, 0);
  ASSERT_FALSE(child_path.starts_with("error")) << child_path;
  ASSERT_TRUE(fs::exists(child_path)) << child_path;
  const auto mine = BeaconFile::create();
  mine->beacon().launches.store(9);

  const std::vector<Peer> peers = scan_beacons(::getpid(), {});
  ASSERT_EQ(peers.size(), 1u);
  EXPECT_EQ(peers[0].pid, child);
  EXPECT_EQ(peers[0].start_time, ctl::process_start_time(child));
  EXPECT_EQ(peers[0].uid, ::geteuid());
  ASSERT_NE(peers[0].beacon, nullptr);
  EXPECT_EQ(peers[0].beacon->pid, child);
  EXPECT_EQ(peers[0].beacon->launches.load(), 5u);
  EXPECT_TRUE(peer_alive(peers[0]));
  // The mapping is shared: what the task writes, the reader sees.
  EXPECT_EQ(mine->beacon().launches.load(), 9u);

  // Mappings known from an earlier scan are reused.
  const std::vector<Peer> again = scan_beacons(::getpid(), peers);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].beacon, peers[0].beacon);

  // A reader that is no task (--status passes 0) sees both.
  const std::vector<Peer> all = scan_beacons(0, {});
  EXPECT_EQ(all.size(), 2u);
  EXPECT_EQ(count_marker(all, 9), 1u);
  EXPECT_EQ(count_marker(all, 5), 1u);
  // Seen from the child's side, ours is another task's.
  EXPECT_EQ(count_marker(scan_beacons(child, {}), 9), 1u);
}

// Whether thread `tid` of this process gets into system call `nr` (read
// from /proc) within 10 s: a waiter asleep where the test wants it.
bool gets_into_syscall(const std::atomic<pid_t>& tid, long nr) {
  const auto in = [&] {
    const pid_t t = tid.load();
    if (t == 0) return false;
    std::ifstream f("/proc/self/task/" + std::to_string(t) + "/syscall");
    long got = -1;
    return static_cast<bool>(f >> got) && got == nr;
  };
  for (int i = 0; i < 10'000 && !in(); ++i) ::usleep(1000);
  return in();
}

// A BE gatekeeper sleeps on an LC task's beacon through its own read-only
// mapping; the LC task wakes it through its read-write one (a shared futex:
// the key is the file's page, not the address).
TEST_F(Beacons, AWaitOnAReadOnlyMappingIsWokenThroughTheWritersMapping) {
  const auto f = BeaconFile::create();
  Beacon& mine = f->beacon();
  const std::vector<Peer> seen_by_reader = scan_beacons(0, {});
  ASSERT_EQ(seen_by_reader.size(), 1u);
  const Beacon& theirs = *seen_by_reader[0].beacon;
  ASSERT_NE(static_cast<const void*>(&theirs), static_cast<const void*>(&mine));  // two mappings

  // Nothing wakes it: it times out.
  EXPECT_EQ(await_wake(theirs, theirs.wake.load(), 1'000'000), Wake::kTimedOut);
  // The word changed since it was read: it does not sleep at all.
  const std::uint32_t old = theirs.wake.load();
  mine.wake.fetch_add(1);
  EXPECT_EQ(await_wake(theirs, old, 3'600'000'000'000ull), Wake::kWoken);

  // Asleep (in the futex call, as /proc says) for up to a minute, woken by
  // the writer.
  std::atomic<int> got{-1};
  std::atomic<pid_t> tid{0};
  const std::uint32_t now_seen = theirs.wake.load();
  std::thread waiter([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    got = static_cast<int>(await_wake(theirs, now_seen, 60'000'000'000ull));
  });
  EXPECT_TRUE(gets_into_syscall(tid, SYS_futex)) << "the waiter never slept";
  EXPECT_EQ(got.load(), -1);
  mine.wake.fetch_add(1);
  wake_best_effort(mine);
  waiter.join();
  EXPECT_EQ(got.load(), static_cast<int>(Wake::kWoken));
}

// Whether this kernel has futex_waitv (Linux 5.16): a call with no waiters
// is refused with EINVAL where it exists, ENOSYS where it does not.
bool kernel_has_futex_waitv() {
  errno = 0;
  return ::syscall(449, nullptr, 0, 0, nullptr, 0) == -1 && errno != ENOSYS;
}

// Asleep on several beacons at once, woken by any one of them; where the
// kernel lacks futex_waitv, refused (the gatekeeper then polls).
TEST_F(Beacons, AWaitOnSeveralBeaconsIsWokenByAnyOfThem) {
  const auto f1 = BeaconFile::create();
  const auto f2 = BeaconFile::create();
  const std::vector<Peer> peers = scan_beacons(0, {});
  ASSERT_EQ(peers.size(), 2u);
  const Beacon* on[2] = {peers[0].beacon, peers[1].beacon};
  // The second one's writer wakes it: told apart by a mark written through
  // the writers' mappings.
  f1->beacon().launches.store(1);
  f2->beacon().launches.store(2);
  Beacon& waker = on[1]->launches.load() == 1 ? f1->beacon() : f2->beacon();
  std::uint32_t seen[2] = {on[0]->wake.load(), on[1]->wake.load()};
  if (!kernel_has_futex_waitv()) {
    EXPECT_EQ(await_any_wake(on, seen, 1'000'000), Wake::kRefused);
    return;
  }
  EXPECT_EQ(await_any_wake(on, seen, 1'000'000), Wake::kTimedOut);
  std::atomic<int> got{-1};
  std::atomic<pid_t> tid{0};
  std::thread waiter([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    got = static_cast<int>(await_any_wake(on, seen, 60'000'000'000ull));
  });
  EXPECT_TRUE(gets_into_syscall(tid, 449)) << "the waiter never slept in futex_waitv";
  EXPECT_EQ(got.load(), -1);
  waker.wake.fetch_add(1);
  wake_best_effort(waker);
  waiter.join();
  EXPECT_EQ(got.load(), static_cast<int>(Wake::kWoken));
  // A word that changed since it was read: no sleep at all.
  EXPECT_EQ(await_any_wake(on, seen, 60'000'000'000ull), Wake::kWoken);
}

TEST_F(Beacons, ScanRemovesTheBeaconOfADeadTask) {
  std::string child_path;
  const pid_t child = start_child(true, &child_path);
  ASSERT_GT(child, 0);
  ASSERT_TRUE(fs::exists(child_path)) << child_path;
  const std::vector<Peer> before = scan_beacons(::getpid(), {});
  ASSERT_EQ(before.size(), 1u);
  // Killed (the beacon is left behind), a zombie not yet reaped: dead.
  kill_to_zombie(child);
  EXPECT_FALSE(peer_alive(before[0]));
  EXPECT_TRUE(fs::exists(child_path));
  EXPECT_TRUE(scan_beacons(::getpid(), before).empty());
  EXPECT_FALSE(fs::exists(child_path)) << "the dead task's beacon was not removed";
  reap(child);
  // A leftover named for a pid that is gone altogether goes too.
  const std::string left = write_file(name_for(child, "0123456789abcdef"), page_for(::getpid(), 1), 0644);
  EXPECT_TRUE(scan_beacons(::getpid(), {}).empty());
  EXPECT_FALSE(fs::exists(left));
}

TEST_F(Beacons, ScanIgnoresFilesALiveTaskWouldNotHaveWritten) {
  const pid_t child = start_child(false);
  ASSERT_GT(child, 0);
  const pid_t self = ::getpid();
  // The control: a page as the child would write it is found.
  const std::string good = write_file(name_for(child, "00000000000000a0"), page_for(child, 100), 0644);
  {
    const auto peers = scan_beacons(self, {});
    ASSERT_EQ(count_marker(peers, 100), 1u);
    EXPECT_EQ(peers.size(), 1u);
  }
  fs::remove(good);

  // Wrong sizes.
  auto small = page_for(child, 101);
  small.resize(100);
  write_file(name_for(child, "00000000000000a1"), small, 0644);
  auto big = page_for(child, 102);
  big.resize(2 * kBeaconBytes, 0);
  write_file(name_for(child, "00000000000000a2"), big, 0644);
  // Writable by group or others.
  const std::string gw = write_file(name_for(child, "00000000000000a3"), page_for(child, 103), 0664);
  write_file(name_for(child, "00000000000000a4"), page_for(child, 104), 0646);
  // A header naming another process than the file's name.
  write_file(name_for(child, "00000000000000a5"), page_for(self, 105), 0644);
  // A header with another start time (the pid was reused).
  {
    auto p = page_for(child, 106);
    alignas(64) unsigned char buf[kBeaconBytes];
    std::memcpy(buf, p.data(), kBeaconBytes);
    reinterpret_cast<Beacon*>(buf)->start_time += 1;
    std::memcpy(p.data(), buf, kBeaconBytes);
    write_file(name_for(child, "00000000000000a6"), p, 0644);
  }
  // No magic, or another version.
  {
    auto p = page_for(child, 107);
    alignas(64) unsigned char buf[kBeaconBytes];
    std::memcpy(buf, p.data(), kBeaconBytes);
    reinterpret_cast<Beacon*>(buf)->magic.store(0);
    std::memcpy(p.data(), buf, kBeaconBytes);
    write_file(name_for(child, "00000000000000a7"), p, 0644);
    reinterpret_cast<Beacon*>(buf)->magic.store(kBeaconMagic);
    reinterpret_cast<Beacon*>(buf)->version = kBeaconVersion + 1;
    reinterpret_cast<Beacon*>(buf)->launches.store(108);
    std::memcpy(p.data(), buf, kBeaconBytes);
    write_file(name_for(child, "00000000000000a8"), p, 0644);
  }
  // A name that is not a beacon's (the random part is not 16 characters).
  write_file(name_for(child, "a9"), page_for(child, 109), 0644);
  // A symbolic link to a good page, and a directory.
  const std::string target = dir_ + "/target";
  {
    const auto p = page_for(child, 110);
    std::ofstream(target, std::ios::binary).write(reinterpret_cast<const char*>(p.data()), kBeaconBytes);
    ::chmod(target.c_str(), 0644);
  }
  fs::create_symlink(target, dir_ + "/" + name_for(child, "00000000000000aa"));
  fs::create_directory(dir_ + "/" + name_for(child, "00000000000000ab"));

  std::vector<OtherBuild> other;
  const auto peers = scan_beacons(self, {}, &other);
  EXPECT_TRUE(peers.empty()) << peers.size() << " untrusted beacons taken, the first with marker "
                             << peers[0].beacon->launches.load();
  // Of them, only the trusted page of another version is another build's
  // LC task (said, not taken).
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(other[0].pid, child);
  EXPECT_EQ(other[0].version, kBeaconVersion + 1);
  // Nothing of a live task is removed.
  EXPECT_EQ(beacon_names().size(), 11u);
  // The same group-writable page, made owner-writable only, is trusted.
  ::chmod(gw.c_str(), 0644);
  EXPECT_EQ(count_marker(scan_beacons(self, {}), 103), 1u);
}


// ---- the BE queue bounded in work (NVTASKSET_BE_WORK_US): traces ---------------------------

constexpr std::uint64_t kUs = 1000;

TEST(KernelDurations, UnknownUntilLearnedThenTheLeastOfTheFirstThenAMovingAverage) {
  KernelDurations d;
  const std::uint64_t k = kernel_key(reinterpret_cast<const void*>(0x1000), 132);
  EXPECT_EQ(d.estimate(k, 777), 777u);
  EXPECT_EQ(d.samples(k), 0u);
  d.learn(k, 4 * kMs);  // a first launch that loaded its module
  EXPECT_EQ(d.estimate(k, 777), 4 * kMs);  // the first sample as it is
  EXPECT_EQ(d.samples(k), 1u);
  d.learn(k, 400 * kUs);
  EXPECT_EQ(d.estimate(k, 777), 400 * kUs) << "the least of the first kFirst, not a quarter of the way";
  EXPECT_EQ(d.samples(k), KernelDurations::kFirst);
  d.learn(k, 800 * kUs);
  EXPECT_EQ(d.estimate(k, 777), 500 * kUs);  // then a quarter weight
  d.learn(k, 5'000'000'000ull);               // a stall, not a kernel: at most a second
  EXPECT_EQ(d.estimate(k, 777), 375 * kUs + 250'000 * kUs);
  EXPECT_EQ(d.samples(k), 4u);
}

TEST(KernelDurations, TheLeastOfTheFirstSamplesEitherWay) {
  KernelDurations d;
  d.learn(1, 100 * kUs);
  d.learn(1, 900 * kUs);  // the second the slower: kept the first
  EXPECT_EQ(d.estimate(1, 0), 100 * kUs);
}

TEST(KernelDurations, TheGridSizeIsPartOfTheKernel) {
  const void* f = reinterpret_cast<const void*>(0x2000);
  EXPECT_NE(kernel_key(f, 1), kernel_key(f, 2));
  EXPECT_NE(kernel_key(f, 1), kernel_key(reinterpret_cast<const void*>(0x2008), 1));
  EXPECT_NE(kernel_key(nullptr, 0), 0u);
  KernelDurations d;
  d.learn(kernel_key(f, 1), 10 * kUs);
  d.learn(kernel_key(f, 2), 900 * kUs);
  EXPECT_EQ(d.estimate(kernel_key(f, 1), 0), 10 * kUs);
  EXPECT_EQ(d.estimate(kernel_key(f, 2), 0), 900 * kUs);
}

TEST(KernelDurations, AFullNeighbourhoodLearnsNothingAndForgetsNothing) {
  KernelDurations d;
  // Keys that all hash to the same first slot: kProbe of them fit.
  for (unsigned i = 0; i <= KernelDurations::kProbe; ++i) d.learn(1 + i * KernelDurations::kSlots, (i + 1) * kUs);
  for (unsigned i = 0; i < KernelDurations::kProbe; ++i)
    EXPECT_EQ(d.estimate(1 + i * KernelDurations::kSlots, 0), (i + 1) * kUs) << i;
  EXPECT_EQ(d.estimate(1 + KernelDurations::kProbe * KernelDurations::kSlots, 42), 42u);
}

// A recorded trace: a BE task's launches with the queue's answers, the
// shim's part played by hand (reap what completed, wait while a launch does
// not fit, record, push).
struct Trace {
  WorkQueue q;
  std::vector<std::uint64_t> done_at;  // per slot: the GPU clock when its launch completed
  Trace(std::uint64_t bound, unsigned max) : q(bound, max), done_at(WorkQueue::kRing, 0) {}
  // The oldest launch completed at `t` (ns on the GPU's clock).
  void complete_oldest() {
    const std::int64_t e =
        q.wants_sample() ? static_cast<std::int64_t>(done_at[q.oldest()] - done_at[q.prev_slot()]) : -1;
    q.pop(e);
  }
};

// ---- kernels too long to borrow the reservations (KernelTimer) ----

TEST(KernelTimer, AKernelBorrowsUntilTimedAtTheLimitOrMore) {
  KernelTimer t(500 * kUs);
  constexpr std::uint64_t kLong = 11, kShort = 12, kEdge = 13;
  EXPECT_TRUE(t.borrows(kLong)) << "not timed yet";
  const int p = t.start(kLong);
  ASSERT_GE(p, 0) << "a kernel not timed yet is timed";
  EXPECT_FALSE(t.pending(p)) << "its end event is not recorded yet";
  t.ended(p, true);
  EXPECT_TRUE(t.pending(p));
  EXPECT_TRUE(t.any_pending());
  t.finish(p, static_cast<std::int64_t>(3 * kMs));
  EXPECT_FALSE(t.any_pending());
  EXPECT_FALSE(t.borrows(kLong)) << "3 ms >= 500 us";
  const int q = t.start(kShort);
  ASSERT_GE(q, 0);
  t.ended(q, true);
  t.finish(q, static_cast<std::int64_t>(80 * kUs));
  EXPECT_TRUE(t.borrows(kShort));
  const int e = t.start(kEdge);
  ASSERT_GE(e, 0);
  t.ended(e, true);
  t.finish(e, static_cast<std::int64_t>(500 * kUs));
  EXPECT_FALSE(t.borrows(kEdge)) << "at the limit: keeps off";
}

TEST(KernelTimer, AMovingAverageDecides) {
  KernelTimer t(500 * kUs);
  auto time = [&](std::uint64_t key, std::uint64_t ns) {
    for (unsigned i = 0; i < KernelTimer::kEvery; ++i) {
      const int p = t.start(key);
      if (p < 0) continue;
      t.ended(p, true);
      t.finish(p, static_cast<std::int64_t>(ns));
      return true;
    }
    return false;
  };
  ASSERT_TRUE(time(7, 1000 * kUs));
  EXPECT_FALSE(t.borrows(7));
  ASSERT_TRUE(time(7, 1000 * kUs));  // a second sample at once (KernelDurations::kFirst)
  EXPECT_FALSE(t.borrows(7));
  // Timed again (one launch in kEvery) at 100 us: a quarter weight each.
  ASSERT_TRUE(time(7, 100 * kUs));  // 775 us
  EXPECT_FALSE(t.borrows(7));
  ASSERT_TRUE(time(7, 100 * kUs));  // 606
  EXPECT_FALSE(t.borrows(7));
  ASSERT_TRUE(time(7, 100 * kUs));  // 480
  EXPECT_TRUE(t.borrows(7));
}

TEST(KernelTimer, AKnownKernelIsTimedOnceInEveryAndAtMostPairsAtOnce) {
  KernelTimer t(500 * kUs);
  const int p = t.start(1);
  ASSERT_GE(p, 0);
  EXPECT_LT(t.start(1), 0) << "being timed now: not twice";
  t.ended(p, true);
  t.finish(p, static_cast<std::int64_t>(50 * kUs));
  // Timed once: its next launch is timed too (the first of a kernel may
  // have loaded its module).
  const int p2 = t.start(1);
  ASSERT_GE(p2, 0) << "a second sample before it is known";
  t.ended(p2, true);
  t.finish(p2, static_cast<std::int64_t>(60 * kUs));
  // Known: timed again on the kEvery-th launch only (3 launches so far).
  unsigned timed = 0;
  for (unsigned i = 0; i < 2 * KernelTimer::kEvery; ++i) {
    const int q = t.start(1);
    if (q < 0) continue;
    ++timed;
    t.ended(q, false);  // its launch failed: nothing learned, the pair free
  }
  EXPECT_EQ(timed, 2u);
  EXPECT_TRUE(t.borrows(1));
  // Unknown kernels: one pair each, kPairs at most, until one is free.
  int pairs[KernelTimer::kPairs];
  for (unsigned i = 0; i < KernelTimer::kPairs; ++i) {
    pairs[i] = t.start(100 + i);
    ASSERT_GE(pairs[i], 0) << i;
    t.ended(pairs[i], true);
  }
  EXPECT_LT(t.start(200), 0) << "every pair in use";
  t.finish(pairs[0], -1);  // could not be read: nothing learned, the pair free
  EXPECT_TRUE(t.borrows(100));
  const int r = t.start(200);
  EXPECT_EQ(r, pairs[0]);
  t.drop_pairs();
  EXPECT_FALSE(t.any_pending()) << "a forked child forgets the parent's events";
  EXPECT_GE(t.start(201), 0);
}

TEST(KernelTimer, PendingPairsAreReadOnceInPollEveryLaunches) {
  KernelTimer t(500 * kUs);
  EXPECT_FALSE(t.poll_due()) << "nothing pending: nothing to read";
  const int p = t.start(1);
  ASSERT_GE(p, 0);
  t.ended(p, true);
  unsigned due = 0;
  for (unsigned i = 0; i < 3 * KernelTimer::kPollEvery; ++i) due += t.poll_due() ? 1 : 0;
  EXPECT_EQ(due, 3u) << "once in kPollEvery launches, not at each";
  t.finish(p, static_cast<std::int64_t>(50 * kUs));
  for (unsigned i = 0; i < 2 * KernelTimer::kPollEvery; ++i) EXPECT_FALSE(t.poll_due()) << i;
}

TEST(KernelTimer, WithoutALimitEveryKernelBorrowsAndIsStillTimed) {
  KernelTimer t(0);
  const int p = t.start(5);
  ASSERT_GE(p, 0) << "timed for the gates' spacing";
  t.ended(p, true);
  t.finish(p, static_cast<std::int64_t>(3 * kMs));
  EXPECT_TRUE(t.borrows(5)) << "no limit: even 3 ms borrows";
  EXPECT_EQ(t.durations().estimate(5, 0), 3 * kMs);
}

// ---- where a best-effort stream's gates go (GateLane) ----

namespace {
// Which of `kernels` (durations; GateSpacing::kUnknown: not timed yet) get a gate before them.
std::string gates(const GateSpacing& s, const std::vector<std::uint64_t>& kernels) {
  GateLane lane;
  std::string out;
  for (const std::uint64_t k : kernels) out += lane.next(s, k) ? 'G' : '.';
  return out;
}
constexpr std::uint64_t kU = GateSpacing::kUnknown;
}  // namespace

TEST(GateLane, AFixedCountGatesEveryNthLaunch) {
  const std::vector<std::uint64_t> ks(7, 10 * kUs);
  EXPECT_EQ(gates({2, 0}, ks), "G.G.G.G");
  EXPECT_EQ(gates({1, 0}, ks), "GGGGGGG");
  EXPECT_EQ(gates({3, 0}, {kU, kU, kU, kU}), "G..G") << "a count learns nothing";
}

TEST(GateLane, LearnedWorkGroupsShortKernelsUpToTheBound) {
  const GateSpacing s{0, 100 * kUs};
  // 30-us kernels: three fit (90 us), the fourth would pass 100.
  EXPECT_EQ(gates(s, std::vector<std::uint64_t>(10, 30 * kUs)), "G..G..G..G");
  // Exactly the bound fits; a nanosecond more does not.
  EXPECT_EQ(gates(s, {50 * kUs, 50 * kUs, 1}), "G.G");
  // At most max_launches launches between two gates, however short.
  EXPECT_EQ(gates({0, 100 * kUs, 4}, std::vector<std::uint64_t>(9, 1 * kUs)), "G...G...G");
}

TEST(GateLane, AKernelLongerThanTheBoundOrUnknownHasAGateOfItsOwn) {
  const GateSpacing s{0, 100 * kUs};
  const std::uint64_t l = 3 * kMs, k = 20 * kUs;
  // A long kernel: a gate before it and before the next one, so that a
  // request never waits for it and the kernels after it.
  EXPECT_EQ(gates(s, {k, k, l, k, k, l, l, k}), "G.GG.GGG");
  // Not timed yet: it may be long; a gate before and after it.
  EXPECT_EQ(gates(s, {k, kU, k, k, kU, kU, k}), "GGG.GGG");
  // The lane's first launch always gets one.
  EXPECT_EQ(gates(s, {k}), "G");
}

TEST(GateLane, AGateThatCouldNotBeQueuedIsTriedAgainAtTheNextLaunch) {
  const GateSpacing s{0, 100 * kUs};
  GateLane lane;
  EXPECT_TRUE(lane.next(s, 10 * kUs));
  EXPECT_FALSE(lane.next(s, 10 * kUs));
  lane.reset();
  EXPECT_TRUE(lane.next(s, 10 * kUs));
  GateLane fixed;
  EXPECT_TRUE(fixed.next({4, 0}, kU));
  fixed.reset();
  EXPECT_TRUE(fixed.next({4, 0}, kU));
  EXPECT_FALSE(fixed.next({4, 0}, kU));
}

TEST(WorkQueue, AnUnknownKernelCountsAsTheWholeBound) {
  WorkQueue q(500 * kUs, 63);
  const std::uint64_t k = kernel_key(reinterpret_cast<const void*>(0x10), 1);
  EXPECT_TRUE(q.fits(k));  // empty: anything goes
  q.push(k);
  EXPECT_EQ(q.queued_ns(), 500 * kUs);
  EXPECT_TRUE(q.fits(k));  // nothing behind the oldest yet: one unknown fits
  q.push(k);
  EXPECT_FALSE(q.fits(k)) << "a second unknown behind the oldest is past the bound";
}

TEST(WorkQueue, LearnsOnlyFromLaunchesQueuedBehindTheOneBefore) {
  Trace t(500 * kUs, 63);
  const std::uint64_t k = kernel_key(reinterpret_cast<const void*>(0x20), 64);
  // Launch 1 into an empty queue, launch 2 behind it; 1 ends at 1000 us, 2 at 1100 us.
  t.done_at[t.q.next_slot()] = 1000 * kUs;
  t.q.push(k);
  t.done_at[t.q.next_slot()] = 1100 * kUs;
  t.q.push(k);
  EXPECT_FALSE(t.q.wants_sample()) << "launch 1 queued behind nothing: its start is not known";
  t.complete_oldest();
  EXPECT_TRUE(t.q.wants_sample());
  t.complete_oldest();
  EXPECT_TRUE(t.q.empty());
  EXPECT_EQ(t.q.durations().estimate(k, 0), 100 * kUs);
  EXPECT_EQ(t.q.queued_ns(), 0u);
  // A launch into the empty queue again: not behind, nothing learned.
  t.done_at[t.q.next_slot()] = 9000 * kUs;
  t.q.push(k);
  EXPECT_FALSE(t.q.wants_sample());
  t.complete_oldest();
  EXPECT_EQ(t.q.durations().estimate(k, 0), 100 * kUs);
}

TEST(WorkQueue, AGapBreaksTheChain) {
  Trace t(500 * kUs, 63);
  const std::uint64_t k = kernel_key(reinterpret_cast<const void*>(0x30), 1);
  t.done_at[t.q.next_slot()] = 100 * kUs;
  t.q.push(k);
  t.q.gap();  // a launch went unrecorded: the next one's time since the last recorded is two kernels
  t.done_at[t.q.next_slot()] = 300 * kUs;
  t.q.push(k);
  t.complete_oldest();
  EXPECT_FALSE(t.q.wants_sample());
  t.complete_oldest();
  EXPECT_EQ(t.q.durations().estimate(k, 1), 1u) << "nothing learned across the gap";
}

TEST(WorkQueue, TheBoundCountsTheWorkBehindTheOldest) {
  WorkQueue q(500 * kUs, 63);
  const std::uint64_t shortk = kernel_key(reinterpret_cast<const void*>(0x40), 1);
  const std::uint64_t longk = kernel_key(reinterpret_cast<const void*>(0x48), 1);
  q.durations().learn(shortk, 100 * kUs);
  q.durations().learn(longk, 6000 * kUs);
  // A long kernel running: short ones queue behind it up to the bound (its
  // remainder is what an LC request waits anyway).
  q.push(longk);
  unsigned behind = 0;
  while (q.fits(shortk)) {
    q.push(shortk);
    ++behind;
  }
  EXPECT_EQ(behind, 5u);
  EXPECT_EQ(q.queued_ns(), 6500 * kUs);
  // A long kernel goes only into an empty queue: never queued behind another.
  WorkQueue l(500 * kUs, 63);
  l.durations().learn(longk, 6000 * kUs);
  EXPECT_TRUE(l.fits(longk));
  l.push(longk);
  EXPECT_FALSE(l.fits(longk));
  l.pop(-1);
  EXPECT_TRUE(l.fits(longk));
}

TEST(WorkQueue, AtMostMaxLaunchesWhateverTheirWork) {
  WorkQueue q(1'000'000 * kUs, 3);
  const std::uint64_t k = kernel_key(reinterpret_cast<const void*>(0x50), 1);
  q.durations().learn(k, 1 * kUs);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(q.fits(k));
    q.push(k);
  }
  EXPECT_TRUE(q.full());
  EXPECT_FALSE(q.fits(k));
  // At most kRing - 1: while a launch may still be recorded, its slot is
  // never the one before the oldest, whose event its sample reads.
  WorkQueue big(1'000'000 * kUs, 1000);
  for (unsigned i = 0; i < WorkQueue::kRing - 1; ++i) {
    ASSERT_FALSE(big.full()) << i;
    EXPECT_NE(big.next_slot(), big.prev_slot()) << i;
    big.push(k);
  }
  EXPECT_TRUE(big.full());
}

TEST(WorkQueue, ClearForgetsTheQueueNotTheDurations) {
  WorkQueue q(500 * kUs, 63);
  const std::uint64_t k = kernel_key(reinterpret_cast<const void*>(0x70), 1);
  q.durations().learn(k, 300 * kUs);
  q.push(k);
  q.push(k);
  EXPECT_FALSE(q.fits(k));
  q.clear();
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.queued_ns(), 0u);
  EXPECT_TRUE(q.fits(k));
  q.push(k);
  EXPECT_FALSE(q.wants_sample()) << "the first launch after a clear was queued behind nothing";
  EXPECT_EQ(q.durations().estimate(k, 0), 300 * kUs);
}

// The trace of run 49's 6-ms matmuls after learning: one running, nothing
// queued behind it, so an LC request waits what is left of one kernel.
TEST(WorkQueue, LongKernelsQueueOneAtATime) {
  Trace t(500 * kUs, 63);
  const std::uint64_t k = kernel_key(reinterpret_cast<const void*>(0x60), 132);
  std::uint64_t clock = 0;
  unsigned waits = 0;
  for (int i = 0; i < 20; ++i) {
    while (!t.q.fits(k)) {
      clock += 6000 * kUs;
      t.done_at[t.q.oldest()] = clock;
      t.complete_oldest();
      ++waits;
    }
    t.q.push(k);
    EXPECT_LE(t.q.size(), i < 3 ? 2u : 1u) << "launch " << i;  // until the first sample lands
  }
  EXPECT_EQ(t.q.durations().estimate(k, 0), 6000 * kUs);
  EXPECT_GE(waits, 18u);
}


// ---- the top-up (TopUp): traces of a saturated LC task's launches ------------------------

// A closed loop played against a TopUp: one launch after another, each
// timed as `dur(probing, tpcs)` says the GPU ran it, sampled under the
// generation it was made in (the controller's part played by hand: it
// passes every millisecond).
struct Loop {
  TopUp& u;
  std::uint64_t now = kT0;
  std::function<std::uint64_t(bool, unsigned)> dur;
  std::uint64_t key = kernel_key(reinterpret_cast<const void*>(0x77), 48);
  // Saturates it and runs for `ms` (long enough for the top-up to settle).
  void settle(std::uint64_t ms = 1'100) {
    u.advance(now, true);
    run(ms);
  }
  // Runs for `ms`, saturated (or not); returns the top-ups seen at each pass.
  std::vector<unsigned> run(std::uint64_t ms, bool saturated = true) {
    std::vector<unsigned> seen;
    const std::uint64_t end = now + ms * kMs;
    std::uint64_t launched = now, gen = u.generation();
    std::uint64_t d = dur(u.probing(), u.tpcs());
    while (now < end) {
      now += kMs;
      if (saturated && now >= launched + d) {  // it completed; the next starts at once
        u.sample(key, d, gen, launched);
        launched = now;
        gen = u.generation();
        d = dur(u.probing(), u.tpcs());
      }
      u.advance(now, saturated);
      if (!saturated) {
        launched = now;
        gen = u.generation();
      }
      seen.push_back(u.tpcs());
    }
    return seen;
  }
};

// GPT-2 on 16 TPCs of an H200: 6.5 ms alone; next to the training on the
// other 50, 1.45x (run 56), less as its top-up takes TPCs from the training.
std::uint64_t contended(bool probing, unsigned tpcs) {
  if (probing) return 6'500 * kUs;
  return static_cast<std::uint64_t>(6'500.0 * 1.45 * 16.0 / (16.0 + tpcs)) * kUs;
}

// A closed loop next to the training whose top-up has settled (10 TPCs when
// it may take 16).
struct Settled {
  TopUp u;
  Loop l{u};

  explicit Settled(unsigned max) {
    u.set_max(max, 16);
    l.dur = contended;
    l.settle();
  }
};

// The same, settled at 10 TPCs of at most 16, as a test fixture.
class SettledTopUp : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(u.tpcs(), 10u); }
  Settled st{16};
  TopUp& u = st.u;
  Loop& l = st.l;
};

TEST(TopUp, ProbesFirstThenStartsAtItsMostAndShrinksToWhatItNeeds) {
  TopUp u;
  u.set_max(16, 16);
  Loop l{u};
  l.dur = contended;
  EXPECT_EQ(u.tpcs(), 0u);
  u.advance(l.now, true);
  EXPECT_TRUE(u.probing());  // nothing known alone yet: a probe first
  EXPECT_EQ(u.probes(), 1u);
  l.run(60);
  EXPECT_FALSE(u.probing()) << "3 launches after the first 15 ms end the probe";
  // Its first top-up is its most: 16, where it runs at 1.45 x 16 / 32 =
  // 0.725x of alone, below 0.85; after five windows (500 ms) it shrinks
  // to where that would be 0.95x: 32 x 0.725 / 0.95 = 24.4 TPCs, 25, 7
  // fewer, an even 6: a top-up
  // of 10 (0.89x), in one decision, and stays there.
  const std::vector<unsigned> seen = l.run(1'000);
  EXPECT_EQ(seen[0], 16u);
  EXPECT_EQ(seen[450], 16u);
  EXPECT_EQ(u.tpcs(), 10u);
  EXPECT_NEAR(u.last_ratio(), 1.45 * 16 / 26, 0.01);
  // And stays there (0.89x is inside [0.85, 1.0]) until the next probe, 4 s after the first.
  const std::vector<unsigned> later = l.run(2'800);
  for (unsigned t : later) EXPECT_TRUE(t == 10u) << t;
  EXPECT_EQ(u.probes(), 1u);
  l.run(300);
  EXPECT_EQ(u.probes(), 2u);
  EXPECT_EQ(u.tpcs(), 10u);
}

TEST_F(SettledTopUp, GrowsAtOnceWhenTheNeighbourGetsHeavier) {
  // The training's next phase slows it by 1.3 more: 0.89 x 1.3 = 1.16x at
  // 10. As soon as two of three launches are that slow, it grows by what
  // would pay that back: 26 x 0.16 = 4.2, 6 (an even number), to 16, its most.
  l.dur = [](bool probing, unsigned tpcs) {
    return probing ? 6'500 * kUs : static_cast<std::uint64_t>(6'500.0 * 1.45 * 1.3 * 16.0 / (16.0 + tpcs)) * kUs;
  };
  const std::vector<unsigned> seen = l.run(100);
  EXPECT_EQ(seen[5], 10u);
  EXPECT_EQ(u.tpcs(), 16u) << "within 100 ms";
}

TEST(TopUp, WithoutAReservationSizeItShrinksAStepADecision) {
  TopUp u;
  u.set_max(16);  // the reservation's size unknown: steps of 2
  Loop l{u};
  l.dur = contended;
  u.advance(l.now, true);
  l.run(60);
  // 0.725x at 16, 0.77x at 14, 0.83x at 12, 0.89x at 10: 2 every five
  // windows, until its slow launches are within [0.85, 1.0].
  const std::vector<unsigned> seen = l.run(2'200);
  EXPECT_EQ(seen[0], 16u);
  EXPECT_EQ(seen[700], 14u);
  EXPECT_EQ(u.tpcs(), 10u);
}

TEST_F(SettledTopUp, ShrinksWhenTheNeighbourLeaves) {
  // The training ended: alone with its top-up it runs 16/26 of its time
  // alone (0.62x), below 0.85. After five windows (500 ms) below, it
  // shrinks to where that would be 0.95x: 26 x 0.62 / 0.95 = 16.8 TPCs,
  // 17, 9 fewer, an even 8:
  // a top-up of 2 (0.89x), inside the band.
  l.dur = [](bool, unsigned tpcs) { return static_cast<std::uint64_t>(6'500.0 * 16.0 / (16.0 + tpcs)) * kUs; };
  const std::vector<unsigned> seen = l.run(700);
  EXPECT_EQ(seen[400], 10u) << "four windows below are not enough";
  EXPECT_EQ(u.tpcs(), 2u);
  l.run(1'000);
  EXPECT_EQ(u.tpcs(), 2u) << "0.89x: inside the band";
}

TEST_F(SettledTopUp, ATrainingStepsLightPhasesDoNotShrinkIt) {
  // Phases of a training step, each about a window long: three light
  // (0.6x at 10) and one as heavy as before (0.89x). Each light run of windows is
  // shorter than shrink_after, so the top-up stays sized for the heavy
  // phase instead of shrinking and growing back after two slow launches.
  std::uint64_t phase_start = l.now;
  l.dur = [&](bool probing, unsigned tpcs) {
    if (probing) return 6'500 * kUs;
    const bool heavy = (l.now - phase_start) / (100 * kMs) % 4 == 3;
    const double f = heavy ? 1.45 : 0.6 * 26.0 / 16.0;
    return static_cast<std::uint64_t>(6'500.0 * f * 16.0 / (16.0 + tpcs)) * kUs;
  };
  for (unsigned t : l.run(2'500)) ASSERT_EQ(t, 10u);
}

TEST(TopUp, TheSlowLaunchesDecideNotOneOutlier) {
  TopUpParams p;
  TopUp u(p);
  u.set_max(16);
  Loop l{u};
  l.dur = [](bool probing, unsigned) { return probing ? 5'000 * kUs : 4'750 * kUs; };  // 0.95x: steady
  u.advance(l.now, true);
  l.run(1'000);
  EXPECT_EQ(u.tpcs(), 16u) << "its start, and 0.95x is inside the band";
  u.set_max(32);  // room to grow
  // One launch in 50 is 1.5x: at the 0.9 quantile of a window's ~20
  // ratios (by nearest rank the slowest but two) it is not the one that decides.
  unsigned n = 0;
  l.dur = [&n](bool probing, unsigned) {
    if (probing) return 5'000 * kUs;
    return ++n % 50 == 0 ? 7'500 * kUs : 4'750 * kUs;
  };
  l.run(2'000);
  EXPECT_EQ(u.tpcs(), 16u);
  // Every third one is: that is the tail, and it grows.
  l.dur = [&n](bool probing, unsigned) {
    if (probing) return 5'000 * kUs;
    return ++n % 3 == 0 ? 7'500 * kUs : 4'750 * kUs;
  };
  l.run(300);
  EXPECT_GE(u.tpcs(), 18u);
}

TEST(TopUp, LaunchesOfAnotherGenerationOrBeforeTheProbeSettledAreNoSamples) {
  TopUp u;
  u.set_max(16);
  const std::uint64_t k = 42;
  u.advance(kT0, true);
  ASSERT_TRUE(u.probing());
  const std::uint64_t g = u.generation();
  // Launched 10 ms into the probe: it may have waited behind BE work queued before it.
  u.sample(k, 3 * kMs, g, kT0 + 10 * kMs);
  u.sample(k, 5 * kMs, g + 1, kT0 + 20 * kMs);  // another generation
  u.advance(kT0 + 30 * kMs, true);
  EXPECT_TRUE(u.probing()) << "no sample counted yet";
  for (int i = 0; i < 3; ++i) u.sample(k, (5 + i) * kMs, g, kT0 + 20 * kMs);
  u.advance(kT0 + 31 * kMs, true);
  ASSERT_FALSE(u.probing());
  // Alone it took 5 ms (the least); a launch of the probe's generation that
  // completes after it is not a sample of the new one.
  EXPECT_EQ(u.tpcs(), 16u);  // its start: its most
  u.set_max(2);              // (fewer, so that it can grow below)
  u.set_max(16);
  const std::uint64_t g2 = u.generation();
  EXPECT_NE(g2, g);
  for (int i = 0; i < 5; ++i) u.sample(k, 9 * kMs, g, kT0 + 40 * kMs);
  u.advance(kT0 + 200 * kMs, true);
  EXPECT_EQ(u.tpcs(), 2u);
  EXPECT_EQ(u.last_ratio(), 0.0);
  for (int i = 0; i < 5; ++i) u.sample(k, 6 * kMs, g2, kT0 + 210 * kMs);
  u.advance(kT0 + 400 * kMs, true);
  EXPECT_EQ(u.tpcs(), 4u);
  EXPECT_DOUBLE_EQ(u.last_ratio(), 6.0 / 5.0);
  // A kernel never timed alone is no measure: nothing to decide on.
  for (int i = 0; i < 5; ++i) u.sample(k + 1, 60 * kMs, u.generation(), kT0 + 410 * kMs);
  u.advance(kT0 + 600 * kMs, true);
  EXPECT_EQ(u.tpcs(), 4u);
}

TEST(TopUp, AProbeThatTimesNothingDecidesNothingAndIsRetriedAfterHalfASecond) {
  TopUp u;
  u.set_max(16);
  u.advance(kT0, true);
  ASSERT_TRUE(u.probing());
  u.advance(kT0 + 81 * kMs, true);  // its 80 ms are over
  EXPECT_FALSE(u.probing());
  EXPECT_FALSE(u.timed_alone());
  for (std::uint64_t t = 82; t < 581; t += 5) {
    u.advance(kT0 + t * kMs, true);
    ASSERT_FALSE(u.probing()) << t;
    ASSERT_EQ(u.tpcs(), 16u) << "nothing to size it by: its most";
  }
  u.advance(kT0 + 582 * kMs, true);
  EXPECT_TRUE(u.probing());
  EXPECT_EQ(u.probes(), 2u);
  // One that timed something: the next after 4 s.
  for (int i = 0; i < 3; ++i) u.sample(7, 5 * kMs, u.generation(), kT0 + 600 * kMs);
  u.advance(kT0 + 610 * kMs, true);
  EXPECT_FALSE(u.probing());
  EXPECT_TRUE(u.timed_alone());
  u.advance(kT0 + 4'600 * kMs, true);
  EXPECT_FALSE(u.probing());
  u.advance(kT0 + 4'611 * kMs, true);
  EXPECT_TRUE(u.probing());
}

TEST_F(SettledTopUp, NoneWhileBurstingOrIdleAndItsSizeIsKeptForTheNextSaturation) {
  const std::uint64_t g = u.generation();
  l.run(300, false);  // its burst resumed
  EXPECT_EQ(u.tpcs(), 0u);
  EXPECT_FALSE(u.probing());
  EXPECT_NE(u.generation(), g);
  u.advance(l.now + kMs, true);  // stopped again, within 4 s of the last probe
  EXPECT_FALSE(u.probing());
  EXPECT_EQ(u.tpcs(), 10u);
}

TEST(TopUp, TheBoundCapsItAndForgetProbesAgain) {
  Settled st(4);
  TopUp& u = st.u;
  Loop& l = st.l;
  EXPECT_EQ(u.tpcs(), 4u);
  const std::uint64_t g = u.generation();
  u.set_max(2);  // a new neighbour took TPCs: fewer left to take
  EXPECT_EQ(u.tpcs(), 2u);
  EXPECT_NE(u.generation(), g);
  u.forget();  // its reservation changed
  u.advance(l.now + kMs, true);
  EXPECT_TRUE(u.probing());
}

TEST(TopUp, ANewReservationIsProbedAtOnce) {
  // The controller passes the reservation's identity with every refresh:
  // the same one changes nothing, another (a `-p`) makes its durations
  // alone, measured on the old TPCs, void, and the next pass probes.
  TopUp u;
  u.set_max(16, 16, 0x1111);
  Loop l{u};
  l.dur = contended;
  l.settle();
  ASSERT_EQ(u.tpcs(), 10u);
  ASSERT_EQ(u.probes(), 1u);
  u.set_max(16, 16, 0x1111);
  l.run(100);
  EXPECT_EQ(u.probes(), 1u);
  EXPECT_FALSE(u.probing());
  u.set_max(12, 12, 0x2222);  // 12 TPCs now
  u.advance(l.now + kMs, true);
  EXPECT_TRUE(u.probing());
  EXPECT_EQ(u.probes(), 2u);
  // An identity of 0 (not known) is no change.
  l.run(200);
  u.set_max(12, 12, 0);
  u.advance(l.now + kMs, true);
  EXPECT_EQ(u.probes(), 2u);
}

TEST(ChooseTopup, WithoutAMapInMaskBitOrder) {
  const Bits128 free{0xf0, 0}, reserved{0x03, 0};
  EXPECT_EQ(choose_topup(free, reserved, nullptr, 2), (Bits128{0x30, 0}));
  EXPECT_EQ(choose_topup(free, reserved, nullptr, 9), free);  // fewer when there are fewer
  EXPECT_EQ(choose_topup(free, reserved, nullptr, 0), Bits128{});
}

TEST(ChooseTopup, NoClusterTpcsFirstThenTheReservationsGpcsThenWholeGpcs) {
  // GPC 0: bits 0-3, GPC 1: bits 4-7, GPC 2: bits 8-11; bit 12 hosts no cluster.
  ClusterMap m;
  m.capable = PhysicalTpcMask{Bits128{0xfff, 0}};
  m.gpcs = {{PhysicalTpcMask{Bits128{0x00f, 0}}, 16}, {PhysicalTpcMask{Bits128{0x0f0, 0}}, 16},
            {PhysicalTpcMask{Bits128{0xf00, 0}}, 16}};
  const Bits128 reserved{0x030, 0};  // two TPCs of GPC 1
  const Bits128 free{0x1fff & ~0x030ull, 0};
  EXPECT_EQ(choose_topup(free, reserved, &m, 1), (Bits128{0x1000, 0}));
  EXPECT_EQ(choose_topup(free, reserved, &m, 3), (Bits128{0x10c0, 0}));  // then GPC 1's other two
  EXPECT_EQ(choose_topup(free, reserved, &m, 5), (Bits128{0x10c3, 0}));  // then GPC 0, in bit order
  EXPECT_EQ(choose_topup(free, reserved, &m, 20), free);
}

}  // namespace
}  // namespace nvtaskset::roles
