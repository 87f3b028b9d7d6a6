// SPDX-License-Identifier: Apache-2.0
// The roles' two tables (docs/design.md, "Roles"): the budget's states and
// transitions (burst_budget.hpp, kBurstTransitions), which BurstBudget is
// driven from, and the role options (role_options.hpp, kRoleOptions). The
// doc shows both as the code renders them here; the transitions behave as
// the budget did before it was a table (a model of that code below); the
// options' defaults are those the registry states and the shim applies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "nvtaskset/best_effort_policy.hpp"
#include "nvtaskset/burst_budget.hpp"
#include "nvtaskset/options.hpp"
#include "nvtaskset/role_options.hpp"

namespace nvtaskset::roles {
namespace {

std::string design_md() {
  std::ifstream f(std::string(NVTASKSET_TEST_DATA_DIR) + "/../../docs/design.md");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string transitions_markdown() {
  std::string out = "| state | event | next state | action |\n| --- | --- | --- | --- |\n";
  for (const BurstTransition& t : kBurstTransitions)
    out += std::string("| ") + state_name(t.state) + " | " + event_name(t.event) + " | " + state_name(t.next) +
           " | " + action_name(t.action) + " |\n";
  return out;
}

std::string options_markdown() {
  std::string out = "| option | read by | default | unit |\n| --- | --- | --- | --- |\n";
  for (const RoleOption& o : kRoleOptions)
    out += std::string("| `") + option(o.id).name + "` | " + reader_name(o.reader) + " | " +
           std::string(default_of(o)) + " | " + o.unit + " |\n";
  return out;
}

TEST(RoleTables, DesignDocShowsTheStatesAndTransitions) {
  const std::string doc = design_md();
  ASSERT_FALSE(doc.empty()) << "docs/design.md not found";
  EXPECT_NE(doc.find(transitions_markdown()), std::string::npos)
      << "docs/design.md's table of states and transitions differs from kBurstTransitions; it should read:\n"
      << transitions_markdown();
}

TEST(RoleTables, DesignDocShowsTheRoleOptions) {
  const std::string doc = design_md();
  ASSERT_FALSE(doc.empty()) << "docs/design.md not found";
  EXPECT_NE(doc.find(options_markdown()), std::string::npos)
      << "docs/design.md's table of role options differs from kRoleOptions; it should read:\n"
      << options_markdown();
}

// Every option of the roles is in the table, once: the BE_ and LC_ ones and
// those the CLI hands a task with a role, and the tests' knobs of the roles.
TEST(RoleTables, EveryRoleOptionIsInTheTable) {
  std::set<std::string> want;
  for (const OptionDesc& d : kOptions) {
    const std::string n = d.name;
    if (n.starts_with("NVTASKSET_BE_") || n.starts_with("NVTASKSET_LC_")) want.insert(n);
  }
  for (const char* n : {"NVTASKSET_ROLE", "NVTASKSET_BURST_POOL", "NVTASKSET_CLUSTER_MAP", "NVTASKSET_TEST_BURST_MS",
                        "NVTASKSET_TEST_TOPUP", "NVTASKSET_TEST_GATE_SLEEP_MS"})
    want.insert(n);
  std::set<std::string> have;
  for (const RoleOption& o : kRoleOptions) EXPECT_TRUE(have.insert(option(o.id).name).second) << option(o.id).name;
  EXPECT_EQ(have, want);
  EXPECT_EQ(std::size(kRoleOptions), 15u);
  for (const RoleOption& o : kRoleOptions) {
    EXPECT_FALSE(default_of(o).empty()) << option(o.id).name;
    EXPECT_NE(std::string(o.unit), "") << option(o.id).name;
  }
}

// The defaults the shim applies are the ones the registry (and so --help
// and the man page) states.
TEST(RoleTables, DefaultsAgreeWithTheRegistry) {
  auto def = [](Option id) {
    for (const RoleOption& o : kRoleOptions)
      if (o.id == id) return std::string(default_of(o));
    return std::string("(not in the table)");
  };
  EXPECT_EQ(def(Option::kBeDepth),
            std::to_string(kDefaultGateDepth) + " (" + std::to_string(kDefaultBeDepth) + " under hold)");
  EXPECT_EQ(def(Option::kBeFloorDepth),
            std::to_string(kDefaultGateDepth) + " (" + std::to_string(kDefaultBeFloorDepth) + " under hold)");
  EXPECT_EQ(def(Option::kBeGateEvery), std::to_string(kDefaultGateEvery));
  EXPECT_EQ(def(Option::kBeGateUs), std::to_string(kDefaultGateUs));
  EXPECT_EQ(def(Option::kBeBorrowUs), std::to_string(kDefaultBorrowUs));
  EXPECT_EQ(def(Option::kTestGateSleepMs), std::to_string(kDefaultGateSleepMs));
  EXPECT_NE(std::string(option(Option::kTestGateSleepMs).help).find("(instead of " +
                                                                    std::to_string(kDefaultGateSleepMs) + " ms)"),
            std::string::npos);
  EXPECT_EQ(def(Option::kBeQueueUs), "0");
  EXPECT_EQ(def(Option::kBeWorkUs), "0");
  EXPECT_EQ(def(Option::kBeYield), "gate");
  EXPECT_EQ(def(Option::kLcTopup), "on");
}

// ---- the transitions behave as the budget did before it was a table ---------------------

// BurstBudget::advance as it was written before the table (a flag for
// "may burst" and the conditions inline), kept here as the model the table
// must match pass for pass.
class ModelBudget {
 public:
  explicit ModelBudget(BudgetParams p) : p_(p) {}
  void advance(std::uint64_t now, bool busy) {
    if (!started_) {
      started_ = true;
      last_ = now;
    }
    const std::uint64_t dt = now > last_ ? now - last_ : 0;
    last_ = now;
    const double keep = std::exp(-static_cast<double>(dt) / static_cast<double>(p_.tau_ns));
    share_ = share_ * keep + (busy ? 1.0 - keep : 0.0);
    if (p_.fast_tau_ns != 0) {
      const double fast_keep = std::exp(-static_cast<double>(dt) / static_cast<double>(p_.fast_tau_ns));
      fast_share_ = fast_share_ * fast_keep + (busy ? 1.0 - fast_keep : 0.0);
    }
    if (busy) {
      if (busy_since_ == 0) busy_since_ = now - dt;
      const bool fast = p_.fast_tau_ns != 0 && fast_share_ > p_.fast_stop_share;
      if (allowed_ && (share_ > p_.stop_share || fast || now - busy_since_ >= p_.max_burst_ns)) {
        allowed_ = false;
        stopped_at_ = now;
        ++saturations_;
        const bool failed_probe = probed_at_ != 0 && now - probed_at_ < 2 * p_.tau_ns;
        timeout_ns_ = failed_probe
                          ? std::min(2 * resume_timeout(), std::max(p_.max_resume_after_ns, p_.resume_after_ns))
                          : p_.resume_after_ns;
        probed_at_ = 0;
      }
    } else {
      busy_since_ = 0;
      if (!allowed_ && share_ < p_.resume_share && (p_.fast_tau_ns == 0 || fast_share_ < p_.resume_share)) {
        allowed_ = true;
        timeout_ns_ = 0;
        probed_at_ = 0;
      } else if (!allowed_ && p_.resume_after_ns != 0 && now - stopped_at_ >= resume_timeout()) {
        allowed_ = true;
        share_ = std::min(share_, p_.resume_share);
        fast_share_ = std::min(fast_share_, p_.fast_resume_share);
        probed_at_ = now;
      }
    }
  }
  bool may_burst() const { return allowed_; }
  double share() const { return share_; }
  double fast_share() const { return fast_share_; }
  std::uint64_t saturations() const { return saturations_; }
  std::uint64_t resume_timeout() const { return timeout_ns_ != 0 ? timeout_ns_ : p_.resume_after_ns; }

 private:
  BudgetParams p_;
  std::uint64_t last_ = 0, busy_since_ = 0, stopped_at_ = 0, probed_at_ = 0, timeout_ns_ = 0;
  double share_ = 0, fast_share_ = 0;
  bool allowed_ = true, started_ = false;
  std::uint64_t saturations_ = 0;
};

// Random traces of busy and idle passes (a few us to tens of ms apart, at
// times hundreds; in runs of either, from light loads to closed loops),
// under the default budget, the best-effort hold bounds and a budget
// without a fast share or time-out: the same answer at every pass, and
// every move the table allows made.
TEST(RoleTables, TransitionsBehaveAsTheBudgetDidBeforeTheTable) {
  BudgetParams no_fast;
  no_fast.fast_tau_ns = 0;
  no_fast.resume_after_ns = 0;
  std::set<std::pair<BurstState, BurstState>> moves;
  std::mt19937_64 rng(20261128);
  for (const BudgetParams& p : {BudgetParams{}, kHoldBudget, kProbeHoldBudget, no_fast}) {
    for (int trace = 0; trace < 40; ++trace) {
      BurstBudget b(p);
      ModelBudget m(p);
      std::uint64_t now = 1'000'000'000;
      const double busy_odds = std::uniform_real_distribution<double>(0.05, 0.99)(rng);
      bool busy = false;
      for (int pass = 0; pass < 4000; ++pass) {
        if (std::uniform_real_distribution<double>(0, 1)(rng) < 0.1)
          busy = std::uniform_real_distribution<double>(0, 1)(rng) < busy_odds;
        // Mostly the controller's pace, at times a long gap (a stopped task).
        const bool gap = std::uniform_real_distribution<double>(0, 1)(rng) < 0.02;
        now += std::uniform_int_distribution<std::uint64_t>(5'000, gap ? 400'000'000 : 30'000'000)(rng);
        const BurstState before = b.state();
        b.advance(now, busy);
        m.advance(now, busy);
        moves.insert({before, b.state()});
        ASSERT_EQ(b.may_burst(), m.may_burst()) << "trace " << trace << " pass " << pass;
        ASSERT_EQ(b.saturations(), m.saturations()) << "trace " << trace << " pass " << pass;
        ASSERT_EQ(b.resume_timeout(), m.resume_timeout()) << "trace " << trace << " pass " << pass;
        ASSERT_DOUBLE_EQ(b.share(), m.share()) << "trace " << trace << " pass " << pass;
        ASSERT_DOUBLE_EQ(b.fast_share(), m.fast_share()) << "trace " << trace << " pass " << pass;
        // Busy after a busy pass, idle after an idle one.
        ASSERT_EQ(b.state() == BurstState::kBursting || b.state() == BurstState::kSaturated, busy);
      }
    }
  }
  // Every move the table allows was made (no row the traces cannot reach
  // hides a difference).
  std::set<std::pair<BurstState, BurstState>> allowed;
  for (const BurstTransition& t : kBurstTransitions) allowed.insert({t.state, t.next});
  EXPECT_EQ(moves, allowed);
}

}  // namespace
}  // namespace nvtaskset::roles
