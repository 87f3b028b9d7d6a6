// SPDX-License-Identifier: Apache-2.0
// nvtaskset -p [-a] [LIST] PID: a query or a live change of a running task
// (and with -a of every process it started under nvtaskset). The pipeline:
//   1. parse: the requests arrive parsed (cli.cpp); here the first
//      positional becomes the mask or the PID;
//   2. plan: each task's region is attached, checked and read, and each
//      request becomes its new partition (planner.hpp); writes nothing;
//   3. claim: with every writer lock held, each task's entry is published
//      as the claim of the change (the TPCs it has and those it gets) and
//      settled against racing choosers (claim.hpp);
//   4. deliver: each region is written;
//   5. read back: what each region holds after the write is printed, as
//      taskset prints what the kernel holds, and published as the task's
//      entry.
// A query stops after 2, repairs what a killed change left, and prints.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "command.hpp"
#include "nvtaskset/claim.hpp"
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/devices.hpp"
#include "nvtaskset/idlist.hpp"
#include "nvtaskset/proc.hpp"
#include "nvtaskset/sharing.hpp"
#include "nvtaskset/status.hpp"
#include "nvtaskset/task_driver.hpp"
#include "nvtaskset/trusted_file.hpp"

namespace nvtaskset::cli {
namespace fs = std::filesystem;
namespace {

using planner::Choice;
using planner::device_label;
using planner::describe_device;
using planner::Request;
using planner::RequestKind;

// How a partition is shown in the form the user asked about: a GPC list
// only for a partition that was set as one; anything else as TPCs.
SpecKind shown_form(const Partition& p, SpecKind form) {
  return form == SpecKind::kGpcList && p.kind != SpecKind::kGpcList ? SpecKind::kTpcList : form;
}

// The partition in the form the user asked about, for `-p` output.
std::string describe(const Partition& p, SpecKind form, const topo::DeviceInfo& dev, Devices& devices) {
  form = shown_form(p, form);
  if (form == SpecKind::kPhysical) {
    if (p.active()) return p.enabled.bits.to_hex();
    const topo::Topology* t = devices.known_topology(dev);
    return t ? t->working_bits().bits.to_hex() : std::string("all");
  }
  if (form == SpecKind::kGpcList && p.kind == SpecKind::kGpcList) return format_list(p.gpcs.bits);
  LogicalTpcSet tpcs = p.tpcs;
  if (!p.active()) {
    tpcs.bits = Bits128::first(dev.tpc_count());
  } else if (p.kind == SpecKind::kPhysical && tpcs.empty()) {
    return "physical mask " + p.enabled.bits.to_hex();
  }
  return form == SpecKind::kTpcMask ? tpcs.bits.to_hex() : format_list(tpcs.bits);
}

// What the shim reports about a task, beyond its partition.
struct TaskStats {
  std::uint64_t kernels_launched, graphs_following, graphs_not_following, stale_reads, kernels_unmasked;
  std::uint32_t max_cluster;
};

TaskStats task_stats(const ctl::Header& h) {
  auto r64 = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  return {r64(h.kernels_launched), r64(h.graphs_following), r64(h.graphs_not_following), r64(h.stale_reads),
          r64(h.kernels_unmasked), h.max_cluster_launched.load(std::memory_order_relaxed)};
}

// A new partition must host every cluster size the task has launched:
// otherwise its next clustered launch stops (or, without nvtaskset's check,
// would wait forever).
void check_hosts_clusters(pid_t pid, const Partition& next, std::uint32_t launched) {
  if (launched <= 1 || next.max_cluster == kClusterUnchecked || next.max_cluster >= launched) return;
  throw Failure("pid " + std::to_string(pid) + " has launched thread-block clusters of " + std::to_string(launched) +
                " SMs, but " + planner::phrase(next) + " can host at most " + std::to_string(next.max_cluster) +
                " SMs of one GPC; not changed");
}

// NVTASKSET_TEST_DIE_AT (options.hpp, for tests only): a -p change kills
// itself at `step`, as a user or the OOM killer could, so the tests can
// check that no step leaves the status entry and the region disagreeing.
void test_die_at(const char* step) {
  const char* at = option_value(Option::kTestDieAt);
  if (at == nullptr || std::strcmp(at, step) != 0) return;
  std::fflush(nullptr);
  ::raise(SIGKILL);
}

// One task's part of a -p: its region, what it has, what it gets.
struct Step {
  const topo::DeviceInfo* dev;
  Partition cur, next;
  SpecKind form;
  bool change;
};
struct TaskPlan {
  pid_t pid;
  std::unique_ptr<ctl::Region> region;
  TaskStats stats;
  std::vector<Step> steps;
  planner::Notes notes;  // warnings printed once every check passed
};

// The descendants of `pid` (children, their children, ...) from /proc, in
// the order found; those that end meanwhile simply drop out later.
std::vector<pid_t> descendants(pid_t pid) {
  std::map<pid_t, std::vector<pid_t>> children;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::optional<pid_t> child = ctl::parse_pid(e.path().filename().string());
    if (!child) continue;
    if (const pid_t ppid = ctl::parent_pid(*child); ppid > 0) children[ppid].push_back(*child);
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo{pid};
  std::set<pid_t> seen{pid};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p])
      if (seen.insert(c).second) {
        out.push_back(c);
        todo.push_back(c);
      }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The form a query answers in: --show's, else the one the partition was set
// in (GPCs and physical masks as such, anything else as a TPC list).
SpecKind query_form(const std::string& show, const Partition& cur) {
  if (!show.empty())
    return show == "mask"       ? SpecKind::kTpcMask
           : show == "gpcs"     ? SpecKind::kGpcList
           : show == "physical" ? SpecKind::kPhysical
                                : SpecKind::kTpcList;
  return cur.kind == SpecKind::kPhysical || cur.kind == SpecKind::kGpcList ? cur.kind : SpecKind::kTpcList;
}

// Checks one task and works out its change; writes nothing. With `like`,
// the task gets `like`'s new partitions (-a: the family follows its root).
TaskPlan plan_task(const Options& o, pid_t pid, std::unique_ptr<ctl::Region> region,
                   const std::vector<Request>& requests, Devices& devices, planner::Sharing& sh,
                   const TaskPlan* like) {
  TaskPlan plan{pid, std::move(region), {}, {}, {}};
  const std::string corrupt = "control region of pid " + std::to_string(pid) + " is corrupt: ";
  if (const std::string why = ctl::validate(plan.region->header()); !why.empty()) throw Failure(corrupt + why);
  const std::vector<DevicePartition> current = plan.region->read_all();
  plan.stats = task_stats(plan.region->header());
  // A partition the task cannot apply must never be reported (or set) as if
  // it held.
  if (const std::string why = ctl::cannot_apply(plan.region->header()); !why.empty())
    throw Failure("pid " + std::to_string(pid) + " runs on all TPCs: " + why);
  const std::uint32_t hook = plan.region->header().callback_registered.load(std::memory_order_acquire);
  if (const ctl::DriverUse use = ctl::task_driver_use(pid, hook != 0 && hook != ctl::kHookFailed);
      use.state == ctl::DriverUse::State::kBypassed)
    throw Failure("pid " + std::to_string(pid) + " runs on all TPCs: " + use.why);

  // Without -d: the device the task was partitioned on, if exactly one.
  auto default_device = [&]() -> const topo::DeviceInfo& {
    std::vector<const DevicePartition*> specific;
    for (const auto& dp : current)
      if (dp.device != kAnyDevice) specific.push_back(&dp);
    if (specific.size() == 1) {
      // Fast path: what the task's region says about its GPU is enough to
      // translate with a cached or identity topology, without cuInit.
      if (const topo::DeviceInfo* d = devices.from_region(*specific[0])) return *d;
      return devices.by_uuid(specific[0]->device, pid);
    }
    return devices.select("");
  };
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    const topo::DeviceInfo& dev =
        like != nullptr ? *like->steps[i].dev : r.device.empty() ? default_device() : devices.select(r.device);
    // A change answers in the terms of the new value, a query in the terms
    // the partition was set in.
    Step st{&dev, {}, {}, planner::spec_kind(r.kind), r.changes()};
    if (const DevicePartition* dp = ctl::applied_to(current, dev.uuid)) st.cur = dp->partition;
    // What is shown must be what the kernels get: the logical view the
    // region carries must translate to the mask the shim applies.
    const bool logical = st.cur.kind == SpecKind::kTpcList || st.cur.kind == SpecKind::kTpcMask ||
                         st.cur.kind == SpecKind::kGpcList;
    if (logical) {
      const topo::Topology* t = devices.known_topology(dev);
      std::string mismatch;
      try {
        if (t && topo::to_physical(*t, st.cur.tpcs) != st.cur.enabled)
          mismatch = "its TPC list " + format_list(st.cur.tpcs.bits) + " does not match the mask its kernels get (" +
                     st.cur.enabled.bits.to_hex() + ")";
      } catch (const std::exception& e) {
        mismatch = std::string("its TPC list does not fit the GPU: ") + e.what();
      }
      if (!mismatch.empty()) throw Failure(corrupt + mismatch);
    }
    if (!st.change) st.form = query_form(o.show, st.cur);
    if (st.change) {
      if (like != nullptr) {
        st.next = like->steps[i].next;
      } else {
        // -n on a live task keeps what it can of its current TPCs.
        if (st.cur.active()) sh.keep[dev.uuid] = st.cur.tpcs;
        st.next = plan_partition(o, r, dev, devices, sh, &plan.notes);
      }
      check_hosts_clusters(pid, st.next, plan.stats.max_cluster);
    }
    plan.steps.push_back(st);
  }
  return plan;
}

nlohmann::json plan_json(const TaskPlan& p, Devices& devices) {
  const Step& st = p.steps[0];
  nlohmann::json j;
  j["pid"] = p.pid;
  j["device"] = uuid_to_string(st.dev->uuid);
  j["partitioned"] = st.cur.active();
  j["kind"] = planner::form_name(shown_form(st.cur, st.form));
  j["tpcs"] = describe(st.cur, SpecKind::kTpcList, *st.dev, devices);
  if (st.cur.kind == SpecKind::kGpcList) j["gpcs"] = format_list(st.cur.gpcs.bits);
  j["physical_mask"] = describe(st.cur, SpecKind::kPhysical, *st.dev, devices);
  j["max_cluster_hosted"] = st.cur.max_cluster;
  j["max_cluster"] = p.stats.max_cluster;
  j["kernels_launched"] = p.stats.kernels_launched;
  j["graphs_following"] = p.stats.graphs_following;
  j["graphs_not_following"] = p.stats.graphs_not_following;
  j["stale_reads"] = p.stats.stale_reads;
  j["kernels_unmasked"] = p.stats.kernels_unmasked;
  return j;
}

// Prints a planned query, or delivers a planned change and prints what the
// region holds after it (the read-back), taskset's way.
void carry_out(const TaskPlan& plan, bool query, Devices& devices) {
  const pid_t pid = plan.pid;
  for (const Step& st : plan.steps) {
    const std::string dev_note = plan.steps.size() > 1 ? " on " + device_label(*st.dev) : std::string();
    const std::string before = describe(st.cur, st.form, *st.dev, devices);
    std::string now;
    if (st.change) {
      // 4. Deliver.
      plan.region->write({st.dev->uuid, st.next, describe_device(*st.dev)});
      // 5. Read back: what the shim applies to this GPU's kernels from now on.
      const std::vector<DevicePartition> held = plan.region->read_all();
      const DevicePartition* dp = ctl::applied_to(held, st.dev->uuid);
      if (dp == nullptr || !dp->partition.active())
        throw Failure("pid " + std::to_string(pid) + "'s control region holds no partition for " +
                      device_label(*st.dev) + " after the change");
      now = describe(dp->partition, st.form, *st.dev, devices);
    }
    std::printf("pid %d's current %s%s: %s\n", pid, planner::form_name(shown_form(st.cur, st.form)), dev_note.c_str(),
                before.c_str());
    if (st.change) std::printf("pid %d's new %s%s: %s\n", pid, planner::form_name(st.form), dev_note.c_str(), now.c_str());
  }
  if (!query) {
    test_die_at("written");
    // The public entry follows the region. Should that fail, the claim
    // published before the change stays: it holds the old and the new TPCs,
    // so no chooser takes either, and the next reader that can attach the
    // region repairs it (repair_entry).
    if (const std::string why = ctl::publish_status(pid, plan.region->read_all(), planner::role_in(*plan.region));
        !why.empty())
      spdlog::warn("pid {}: its status entry still lists its TPCs before and after the change: {}", pid,
                   printable(why, 160));
  }
  // A query says more only when there is more to say, so a plain task's
  // answer stays taskset's one line.
  const TaskStats& stats = plan.stats;
  if (query && stats.graphs_following + stats.graphs_not_following > 0)
    std::printf("pid %d's CUDA graphs: %llu follow the partition, %llu cannot\n", pid,
                static_cast<unsigned long long>(stats.graphs_following),
                static_cast<unsigned long long>(stats.graphs_not_following));
  if (query && stats.max_cluster > 0) std::printf("pid %d's largest thread-block cluster: %u\n", pid, stats.max_cluster);
  if (stats.graphs_not_following > 0)
    spdlog::warn("pid {} has {} CUDA graph exec(s) that cannot follow partition changes: their kernels keep the TPCs "
                 "they were encoded with until the program instantiates them again",
                 pid, stats.graphs_not_following);
}

}  // namespace

int live(const Options& o, const Requests& rq) {
  // 1. Parse: the first of two positionals is the mask, the last the PID.
  std::vector<Request> requests = rq.lists;
  std::vector<std::string> pos = o.positionals;
  if (requests.empty() && pos.size() == 2 && rq.lead_mask) {
    requests.push_back(*rq.lead_mask);
    pos.erase(pos.begin());
  } else if (!requests.empty() && !requests.back().changes() && pos.size() == 2 && rq.lead_mask) {
    Request m = *rq.lead_mask;
    m.device = requests.back().device;
    requests.back() = std::move(m);
    pos.erase(pos.begin());
  }
  if (pos.size() != 1) throw Failure("-p takes [MASK | -t LIST | -g LIST | -n COUNT | --physical MASK] PID (see --help)");
  const pid_t pid = parse_pid(pos[0]);
  if (requests.empty()) requests.push_back(planner::parse_request("", RequestKind::kNone, ""));
  const bool query = requests.size() == 1 && !requests[0].changes();
  if (o.json && !query) throw Failure("--json with -p only queries: give no new list");
  if (!o.show.empty() && !query) throw Failure("--show with -p only queries: give no new list");

  // The task first (its errors are the user's answer), then with -a every
  // descendant that runs under the shim; one that ended meanwhile, or never
  // loaded the shim, is not part of the family.
  std::vector<std::pair<pid_t, std::unique_ptr<ctl::Region>>> family;
  try {
    family.emplace_back(pid, ctl::Region::attach(pid));
  } catch (const ctl::Error& e) {
    // No region, but the driver in its maps: it reached the driver without
    // the shim (task_driver.hpp), whatever its status entry says.
    if (std::string_view(e.what()).find("not running under nvtaskset") != std::string_view::npos)
      if (const ctl::DriverUse use = ctl::task_driver_use(pid, false); use.state == ctl::DriverUse::State::kBypassed)
        throw Failure("pid " + std::to_string(pid) + " runs on all TPCs: " + use.why);
    throw;
  }
  std::set<pid_t> members{pid};
  if (o.all_tasks) {
    for (pid_t d : descendants(pid)) {
      try {
        family.emplace_back(d, ctl::Region::attach(d));
        members.insert(d);
      } catch (const ctl::Error& e) {
        const std::string why = e.what();
        if (why.find("not running under nvtaskset") == std::string::npos &&
            why.find("no such process") == std::string::npos)
          throw Failure(why);
      }
    }
  }
  // The task's own family (the processes it started, those that started it)
  // runs one job: their partitions are not "other" ones to avoid or warn
  // about (a PyTorch program's compile workers inherit its partition).
  std::set<pid_t> family_pids = members;
  if (!query) {
    for (pid_t d : descendants(pid)) family_pids.insert(d);
    for (pid_t a : ctl::ancestors(pid)) family_pids.insert(a);
  }
  // A change holds every family member's writer lock from its first step
  // (the claim in the status entry) to its last (the entry of the new
  // partition), so a reader that gets the lock knows no change is half done
  // (repair_entry). Bounded: a holder that never lets go (the task's own user
  // can flock its region) costs kLockTimeout and one line, never a hang.
  if (!query) {
    std::vector<std::size_t> order(family.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    // One order for every -p, so two that share tasks never wait on each
    // other in a circle.
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return family[a].first < family[b].first; });
    for (std::size_t i : order) family[i].second->lock(ctl::kLockTimeout);
    test_die_at("locked");
  }

  // 2. Plan. Every task and every request is checked before anything is
  // written: a change is all or nothing.
  // A task's role holds under -p as at its launch: a latency-critical
  // task's new TPCs are an exclusive reservation that leaves every
  // best-effort task a floor, and a best-effort task's may not lie inside
  // the reservations (planner::check_roles). With -a, a family with a
  // latency-critical task changes by its rules.
  roles::Role role = roles::Role::kNone;
  for (const auto& member : family)
    if (const roles::Role r = planner::role_in(*member.second); r == roles::Role::kLatencyCritical || role == roles::Role::kNone)
      role = r;
  planner::Sharing sh =
      query ? planner::Sharing{} : planner::read_sharing({o.spread, o.exclusive, role}, family_pids);
  Devices devices(shim_copies(o.shim_dir), o.topology_file);
  std::vector<TaskPlan> plans;
  auto plan = [&] {
    std::vector<std::unique_ptr<ctl::Region>> regions;
    if (plans.empty()) {
      for (auto& member : family) regions.push_back(std::move(member.second));
    } else {
      for (TaskPlan& p : plans) regions.push_back(std::move(p.region));
    }
    plans.clear();
    for (std::size_t i = 0; i < family.size(); ++i)
      plans.push_back(plan_task(o, family[i].first, std::move(regions[i]), requests, devices, sh,
                                plans.empty() ? nullptr : &plans[0]));
    std::vector<Choice> chosen;
    for (const TaskPlan& p : plans)
      for (const Step& st : p.steps)
        if (st.change) chosen.push_back({st.dev, st.next});
    return chosen;
  };
  std::vector<Choice> chosen = plan();
  if (!query) planner::check_roles(role, chosen, sh, devices);

  // 3. Claim. A task's entry as its region has it, or (planned) the claim
  // of the change: on each GPU it changes, the TPCs it has AND those it
  // gets. The claim goes out before the region is written, so at every step
  // the entry covers what the task runs on: a -p killed before it publishes
  // the final entry leaves other choosers avoiding both, never taking the
  // old TPCs the task still runs on (docs/design.md, "Sharing a GPU"). ""
  // or why not.
  auto republish = [&](const TaskPlan& p, bool planned) {
    std::vector<DevicePartition> parts = p.region->read_all();
    for (const Step& st : p.steps) {
      if (!planned || !st.change) continue;
      DevicePartition next{st.dev->uuid, st.next, describe_device(*st.dev)};
      auto it = std::find_if(parts.begin(), parts.end(), [&](const DevicePartition& d) { return d.device == next.device; });
      if (it != parts.end()) {
        next.partition = planner::claim_union(it->partition, st.next);
        *it = next;
      } else {
        parts.push_back(next);
      }
    }
    return ctl::publish_status(p.pid, parts, planner::role_in(*p.region));
  };
  std::vector<std::string> raced;  // said when choices kept racing
  if (!query) {
    const planner::Claim claim{plan,
                               [&](const std::vector<Choice>&) {
                                 for (std::size_t i = 0; i < plans.size(); ++i) {
                                   const std::string why = republish(plans[i], true);
                                   if (why.empty()) continue;
                                   // Fail closed: a change other choosers cannot see is not made.
                                   for (std::size_t j = 0; j < i; ++j) republish(plans[j], false);
                                   throw Failure("pid " + std::to_string(plans[i].pid) +
                                                 ": cannot publish its status entry, so other choosers could not "
                                                 "see the change (" + printable(why, 160) + "); not changed");
                                 }
                               },
                               [&] {
                                 for (const TaskPlan& p : plans) republish(p, false);
                               }};
    chosen = planner::settle(sh, devices, claim, std::move(chosen), &raced);
    test_die_at("claimed");
  } else {
    // A query by the task's user or root also repairs what a killed -p left.
    for (ctl::StatusEntry& e : ctl::read_status())
      for (TaskPlan& p : plans)
        if (e.pid == p.pid) planner::repair_entry(e, *p.region);
  }

  if (o.json) {
    if (!o.all_tasks) {
      std::printf("%s\n", plan_json(plans[0], devices).dump(2).c_str());
    } else {
      nlohmann::json a = nlohmann::json::array();
      for (const TaskPlan& p : plans) a.push_back(plan_json(p, devices));
      std::printf("%s\n", a.dump(2).c_str());
    }
    return 0;
  }
  for (const TaskPlan& p : plans)
    for (const std::string& w : p.notes.warnings) spdlog::warn("{}", w);
  for (const std::string& w : raced) spdlog::warn("{}", w);
  // 4. Deliver and 5. read back, task by task.
  try {
    for (const TaskPlan& p : plans) carry_out(p, query, devices);
  } catch (...) {
    // The entries say what the regions hold, whatever was written.
    if (!query)
      for (const TaskPlan& p : plans) republish(p, false);
    throw;
  }
  if (!query) test_die_at("published");
  return 0;
}

}  // namespace nvtaskset::cli
