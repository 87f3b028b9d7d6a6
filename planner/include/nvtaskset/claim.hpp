// SPDX-License-Identifier: Apache-2.0
// The claim: choosing TPCs without a lock (docs/design.md, "Sharing a
// GPU"). Two launches choosing at once (-n, or an exclusive claim) must not
// take the same TPCs unseen. A lock file would serialise them, but in
// /dev/shm any user can create and hold it forever. So a choice is
// optimistic: plan from a snapshot of the public status, publish the plan
// as the task's entry, read the status again. An entry that is new since
// the snapshot (a task that appeared, or one that changed) and shares a TPC
// or a GPC with the plan raced with it: take the entry back, wait a random,
// growing moment, and plan again from the status as it is now, which shows
// the other choice. Each side reads again only once its own entry is
// complete, so of two racing choices the later reader always sees the
// other: two overlapping choices never both stand unseen. After kClaimTries
// races in a row an exclusive claim fails in one line; otherwise the last
// plan stands and the sharing is said.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "nvtaskset/control_region.hpp"
#include "nvtaskset/planner.hpp"
#include "nvtaskset/task_role.hpp"
#include "nvtaskset/status.hpp"

namespace nvtaskset::planner {

inline constexpr int kClaimTries = 8;

// The caller's three steps. A launch publishes its own entry and withdraws
// it; a live change publishes the claim of each task it changes (the TPCs
// it has and those it gets, claim_union) and republishes what the regions
// hold.
struct Claim {
  std::function<std::vector<Choice>()> plan;  // (re)plans from the Sharing's status; may throw
  std::function<void(const std::vector<Choice>&)> publish;  // may throw: nothing is claimed then
  std::function<void()> take_back;  // restores the entries as they were
};

// What the protocol reads and how it waits. The defaults are the machine's
// (ctl::read_status, sleeping); tests give their own, so that no test of
// the protocol depends on timing.
struct ClaimWorld {
  std::function<std::vector<ctl::StatusEntry>()> read_status;
  std::function<void(std::chrono::milliseconds)> sleep;
};
ClaimWorld system_world();

// Publishes `chosen` (planned from sh.status) and settles it as above;
// returns the choice that stands, and refreshes sh.status to the status it
// was last planned from. `warnings` holds the plan's warnings: a replan
// replaces them, and a choice that kept racing adds why it shares. Waits
// NVTASKSET_CLAIM_DELAY_MS (tests) before the first publish. Throws
// Refusal (an exclusive claim that kept racing, after taking it back), or
// whatever the caller's steps throw.
std::vector<Choice> settle(Sharing& sh, Layouts& layouts, const Claim& c, std::vector<Choice> chosen,
                           std::vector<std::string>* warnings, const ClaimWorld& world = system_world());

// The partition a live change's claim publishes for one GPU before it
// writes the region: every TPC of `now` and of `next`, as other choosers
// read an entry (its TPC list, else its mask through the layout).
Partition claim_union(const Partition& now, const Partition& next);

// An entry that disagrees with its task's region (a -p killed between
// publishing its claim and publishing the region's new partition) is
// republished from the region, unless a writer holds the region's lock (a
// change under way: it publishes the final entry itself). `e.partitions`
// then says what the region holds. Returns whether the entry was repaired.
// Only the task's user and root can attach a region, so only they repair;
// every other reader sees the claim, which holds the old and the new TPCs,
// and so chooses around both.
bool repair_entry(ctl::StatusEntry& e, ctl::Region& region);

// The role a task's shim runs (its region's header), kNone when unknown.
roles::Role role_in(const ctl::Region& region);

}  // namespace nvtaskset::planner
