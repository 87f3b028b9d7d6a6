// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/claim.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <thread>

#include "nvtaskset/options.hpp"

namespace nvtaskset::planner {
namespace {

// Milliseconds to wait before the first publish (tests widen the race with it).
int claim_delay_ms() {
  const char* v = option_value(Option::kClaimDelayMs);
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long ms = std::strtol(v, &end, 10);
  return *end == '\0' && ms > 0 && ms <= 10000 ? static_cast<int>(ms) : 0;
}

// The entries in `fresh` that share TPCs or GPCs with `chosen`.
Overlap raced_with(const std::vector<Choice>& chosen, const std::vector<ctl::StatusEntry>& fresh, const Sharing& sh,
                   Layouts& layouts) {
  Overlap all;
  for (const Choice& c : chosen) {
    const topo::Topology* t = layouts.known_topology(*c.dev);
    const std::vector<Holder> others = holders_on(fresh, *c.dev, t, sh.exclude);
    const Overlap o = overlap_with(t, logical_view(c.partition, t), others);
    all.share_tpcs.insert(all.share_tpcs.end(), o.share_tpcs.begin(), o.share_tpcs.end());
    all.share_gpcs.insert(all.share_gpcs.end(), o.share_gpcs.begin(), o.share_gpcs.end());
  }
  return all;
}

}  // namespace

ClaimWorld system_world() {
  return {[] { return ctl::read_status(); }, [](std::chrono::milliseconds ms) { std::this_thread::sleep_for(ms); }};
}

std::vector<Choice> settle(Sharing& sh, Layouts& layouts, const Claim& c, std::vector<Choice> chosen,
                           std::vector<std::string>* warnings, const ClaimWorld& world) {
  if (const int ms = claim_delay_ms()) world.sleep(std::chrono::milliseconds(ms));
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    c.publish(chosen);
    const Overlap raced =
        raced_with(chosen, changed_since(sh.status, visible_to(sh.role, world.read_status())), sh, layouts);
    if (raced.share_tpcs.empty() && raced.share_gpcs.empty()) return chosen;
    spdlog::debug("choice {} raced with pid {} {}", attempt, pid_list(raced.share_tpcs), pid_list(raced.share_gpcs));
    if (attempt == kClaimTries) {
      if (sh.exclusive && !raced.share_tpcs.empty()) {
        c.take_back();
        throw Refusal("pid " + pid_list(raced.share_tpcs) + " took the same TPCs at the same moment, " +
                      std::to_string(kClaimTries) + " times in a row; --exclusive refuses to share them (try again)");
      }
      warnings->push_back("pid " + pid_list(raced.share_tpcs.empty() ? raced.share_gpcs : raced.share_tpcs) +
                          " chose TPCs at the same moment, " + std::to_string(kClaimTries) +
                          " times in a row: the tasks share " + (raced.share_tpcs.empty() ? "a GPC" : "TPCs") +
                          " (see --status)");
      return chosen;
    }
    c.take_back();
    // Random, growing waits: two racers rarely meet twice.
    std::uniform_int_distribution<int> wait_ms(1, 2 << attempt);
    world.sleep(std::chrono::milliseconds(wait_ms(rng)));
    sh.status = visible_to(sh.role, world.read_status());
    warnings->clear();
    chosen = c.plan();
  }
}

Partition claim_union(const Partition& now, const Partition& next) {
  if (!now.active()) return next;
  if (!next.active()) return now;
  Partition u = next;
  u.enabled.bits = now.enabled.bits | next.enabled.bits;
  u.widened.bits = now.widened.bits | next.widened.bits;
  u.max_cluster = std::max(now.max_cluster, next.max_cluster);
  u.widened_max_cluster = std::max(now.widened_max_cluster, next.widened_max_cluster);
  if (now.kind == SpecKind::kGpcList && next.kind == SpecKind::kGpcList) {
    u.gpcs.bits = now.gpcs.bits | next.gpcs.bits;
  } else {
    u.gpcs = {};
    u.kind = SpecKind::kTpcList;
  }
  if (!now.tpcs.empty() && !next.tpcs.empty()) {
    u.tpcs.bits = now.tpcs.bits | next.tpcs.bits;
  } else {
    // One side is known only as a mask: the union is one too.
    u.kind = SpecKind::kPhysical;
    u.tpcs = {};
    u.gpcs = {};
  }
  return u;
}

bool repair_entry(ctl::StatusEntry& e, ctl::Region& region) {
  std::vector<DevicePartition> truth;
  try {
    truth = region.read_all();
  } catch (const std::exception&) {
    return false;  // corrupt: -p says so; the entry stays as it is
  }
  if (truth == e.partitions) return false;
  const bool held = region.locked();
  if (!held && !region.try_lock()) return false;  // a writer is under way
  bool repaired = false;
  try {
    truth = region.read_all();  // as it is under the lock
    if (truth != e.partitions && ctl::publish_status(e.pid, truth, e.role).empty()) {
      e.partitions = truth;
      repaired = true;
    }
  } catch (const std::exception&) {
  }
  if (!held) region.unlock();
  return repaired;
}

roles::Role role_in(const ctl::Region& region) {
  const std::uint32_t r = region.header().role.load(std::memory_order_relaxed);
  return r <= static_cast<std::uint32_t>(roles::Role::kBestEffort) ? static_cast<roles::Role>(r) : roles::Role::kNone;
}

}  // namespace nvtaskset::planner
