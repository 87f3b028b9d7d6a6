// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/planner.hpp"

#include <spdlog/spdlog.h>

#include "nvtaskset/control_region.hpp"
#include "nvtaskset/idlist.hpp"
#include "nvtaskset/placement.hpp"
#include "nvtaskset/task_driver.hpp"

namespace nvtaskset::planner {
namespace {

// -n COUNT: the TPCs chosen for the request, avoiding those other live
// partitions hold when enough are free.
// `all_held`: for a role's claim, what every task holds, the other role's
// included (`others` leaves those out).
LogicalTpcSet choose_by_count(const Request& r, const topo::DeviceInfo& dev, const topo::Topology& t,
                              const Sharing& sh, const std::vector<Holder>& others, const LogicalTpcSet& all_held,
                              Notes* notes) {
  const unsigned n = r.count;
  if (n > dev.tpc_count())
    throw Refusal("-n " + r.text + ": " + device_label(dev) + " has " + std::to_string(dev.tpc_count()) + " TPCs");
  PlacementRequest req;
  req.count = n;
  req.how = sh.spread ? Placement::kSpread : Placement::kPacked;
  req.pool = topo::all_tpcs(t);
  const LogicalTpcSet taken = held_by(others);
  req.pool.bits = req.pool.bits & ~taken.bits;
  if (auto it = sh.keep.find(dev.uuid); it != sh.keep.end()) req.keep = it->second;
  // A role's count keeps off the other role's TPCs too while enough others
  // are free: a best-effort floor is its TPCs minus the reservations, so a
  // best-effort -n 16 chosen over a reservation of 8 had a floor of 8, not
  // the 16 a Kubernetes share of 16 TPCs is (found by tests/k8s, Tier B).
  if (sh.role != roles::Role::kNone) {
    LogicalTpcSet apart = topo::all_tpcs(t);
    apart.bits = apart.bits & ~all_held.bits;
    if (apart.size() >= n) req.pool = apart;
  }
  if (req.pool.size() < n) {
    std::vector<pid_t> holders;
    for (const Holder& h : others) holders.push_back(h.pid);
    const std::string free = std::to_string(req.pool.size()) + " of " + std::to_string(dev.tpc_count()) +
                             " TPCs of " + device_label(dev) + " are free (held by pid " + pid_list(holders) + ")";
    if (sh.exclusive) throw Refusal("-n " + r.text + " " + sh.claim_name + ": only " + free);
    notes->warnings.push_back("-n " + r.text + ": only " + free + "; sharing TPCs with them");
    req.pool = topo::all_tpcs(t);
  }
  const auto chosen = choose_tpcs(t, req);
  if (!chosen) throw Refusal("-n " + r.text + ": no choice of TPCs on " + device_label(dev));
  if (!chosen->note.empty()) notes->warnings.push_back(chosen->note);
  notes->choices.push_back("-n " + r.text + " on " + device_label(dev) + ": TPCs " + format_list(chosen->tpcs.bits));
  return chosen->tpcs;
}

// Refuses (exclusive) or warns about a partition that shares TPCs or GPCs
// with other live partitions on its GPU. Tasks that share a GPC split its
// SMs, so neither hosts thread-block clusters as large as the GPC
// (docs/hardware.md); whether they slow each other more than tasks on
// separate GPCs was measured only for an SGEMM without clusters, which they
// did not (docs/results.md, Fig. 12).
void check_sharing(const Partition& p, const topo::DeviceInfo& dev, const topo::Topology* t, const Sharing& sh,
                   const std::vector<Holder>& others, Notes* notes) {
  if (p.tpcs.empty()) return;
  const Overlap o = overlap_with(t, p.tpcs, others);
  if (!o.share_tpcs.empty()) {
    const std::string what = "TPCs " + format_list(o.common_tpcs.bits) + " of " + device_label(dev) +
                             " are held by pid " + pid_list(o.share_tpcs);
    if (sh.exclusive) throw Refusal(what + "; " + sh.claim_name + " refuses a partition that overlaps another");
    notes->warnings.push_back(what + ": the tasks share them");
    return;
  }
  if (o.share_gpcs.empty() || t == nullptr) return;
  // A suggestion of the same size inside GPCs no other partition touches.
  std::string alt;
  PlacementRequest req;
  req.count = p.tpcs.size();
  for (const topo::GpcInfo& g : t->gpcs) {
    bool used = false;
    for (LogicalTpcId x : g.tpcs)
      for (const Holder& h : others) used = used || h.tpcs.contains(x);
    if (!used)
      for (LogicalTpcId x : g.tpcs) req.pool.insert(x);
  }
  if (const auto c = choose_tpcs(*t, req))
    alt = "; GPCs no other task uses hold the same size: -t " + format_list(c->tpcs.bits);
  const bool many = o.common_gpcs.size() > 1;
  notes->warnings.push_back(phrase(p) + " of " + device_label(dev) + (many ? " share GPCs " : " share GPC ") +
                            format_list(o.common_gpcs.bits) + " with pid " + pid_list(o.share_gpcs) +
                            ": partitions that share a GPC host smaller thread-block clusters than whole GPCs" + alt);
}

LogicalTpcSet checked_tpcs(const std::vector<unsigned>& ids, const topo::DeviceInfo& dev) {
  const unsigned n = dev.tpc_count();
  for (unsigned id : ids)
    if (id >= n)
      throw Refusal("TPC " + std::to_string(id) + " does not exist on " + device_label(dev) + " (TPCs 0-" +
                    std::to_string(n - 1) + ")");
  LogicalTpcSet s;
  s.bits = to_bits(ids, "TPC");
  return s;
}

}  // namespace

std::vector<ctl::StatusEntry> visible_to(roles::Role role, std::vector<ctl::StatusEntry> status) {
  if (role == roles::Role::kNone) return status;
  const roles::Role other =
      role == roles::Role::kLatencyCritical ? roles::Role::kBestEffort : roles::Role::kLatencyCritical;
  std::erase_if(status, [&](const ctl::StatusEntry& e) { return e.role == other; });
  return status;
}

Sharing sharing_from(const SharingOptions& o, std::set<pid_t> exclude, std::vector<ctl::StatusEntry> all) {
  Sharing sh;
  sh.role = o.role;
  sh.all = std::move(all);
  sh.status = visible_to(sh.role, sh.all);
  sh.exclude = std::move(exclude);
  sh.spread = o.spread;
  sh.exclusive = o.exclusive || o.role == roles::Role::kLatencyCritical;
  if (o.role == roles::Role::kLatencyCritical) sh.claim_name = "--latency-critical";
  return sh;
}

Sharing read_sharing(const SharingOptions& o, std::set<pid_t> exclude) {
  Sharing sh = sharing_from(o, std::move(exclude), ctl::read_status());
  // Read from each task's maps (task_driver.hpp): only for an exclusive
  // claim, which must refuse them, and only where this user may read them.
  if (sh.exclusive)
    for (const ctl::StatusEntry& e : sh.status)
      if (!sh.exclude.count(e.pid))
        if (const ctl::DriverUse u = ctl::task_driver_use(e.pid, std::nullopt);
            u.state == ctl::DriverUse::State::kBypassed)
          sh.everywhere[e.pid] = u.why;
  if (o.role == roles::Role::kLatencyCritical)
    for (const ctl::StatusEntry& e : sh.all)
      if (e.role == roles::Role::kBestEffort && !sh.exclude.count(e.pid)) {
        try {
          const auto region = ctl::Region::attach(e.pid);
          const std::uint32_t c = region->header().max_cluster_launched.load(std::memory_order_relaxed);
          if (c > 1) sh.clusters_launched[e.pid] = c;
        } catch (const ctl::Error&) {
          // Another user's task (or gone): its clustered kernels that the
          // floor cannot host run on its whole partition, counted, and
          // --status says so.
        }
      }
  return sh;
}

Partition plan_partition(const Request& r, const topo::DeviceInfo& dev, Layouts& layouts, const Sharing& sh,
                         Notes* notes) {
  Partition p;
  p.kind = spec_kind(r.kind);
  for (const auto& [pid, why] : sh.everywhere)
    for (const ctl::StatusEntry& e : sh.status)
      if (e.pid == pid)
        for (const DevicePartition& dp : e.partitions)
          if (dp.partition.active() && (dp.device == dev.uuid || dp.device == kAnyDevice))
            throw Refusal("pid " + std::to_string(pid) + " runs on all TPCs of " + device_label(dev) + " (" + why +
                          "); --exclusive cannot keep any to itself");
  const std::vector<Holder> others = holders_on(sh.status, dev, layouts.known_topology(dev), sh.exclude);
  switch (r.kind) {
    case RequestKind::kAllTpcs: {
      const topo::Topology& t = layouts.topology(dev);
      p.tpcs = topo::all_tpcs(t);
      p.enabled = topo::to_physical(t, p.tpcs);
      break;
    }
    case RequestKind::kCount: {
      const topo::Topology& t = layouts.topology(dev);
      const LogicalTpcSet all_held = sh.role == roles::Role::kNone
                                         ? LogicalTpcSet{}
                                         : held_by(holders_on(sh.all, dev, layouts.known_topology(dev), sh.exclude));
      p.tpcs = choose_by_count(r, dev, t, sh, others, all_held, notes);
      p.enabled = topo::to_physical(t, p.tpcs);
      break;
    }
    case RequestKind::kTpcList:
    case RequestKind::kTpcMask: {
      p.tpcs = checked_tpcs(r.ids, dev);
      const topo::Topology& t = layouts.topology(dev);
      p.enabled = topo::to_physical(t, p.tpcs);
      break;
    }
    case RequestKind::kGpcList: {
      const topo::Topology& t = layouts.topology(dev);
      p.gpcs.bits = to_bits(r.ids, "GPC");
      p.tpcs = topo::tpcs_of_gpcs(t, p.gpcs);
      p.enabled = topo::to_physical(t, p.tpcs);
      break;
    }
    case RequestKind::kPhysical: {
      p.enabled.bits = r.mask;
      if (const topo::Topology* t = layouts.known_topology(dev)) {
        // An enable mask with no working TPC makes every kernel wait forever
        // (docs/hardware.md): refuse it whenever the layout is known.
        if ((p.enabled.bits & t->working_bits().bits).none())
          throw Refusal("physical mask " + p.enabled.bits.to_hex() + " enables no working TPC on " +
                        device_label(dev) + ": its kernels would never run");
        p.tpcs = topo::logical_of_physical(*t, p.enabled);
      } else {
        spdlog::warn("the layout of {} is unknown, so physical mask {} is not checked: a mask with no working "
                     "TPC hangs every kernel",
                     device_label(dev), p.enabled.bits.to_hex());
      }
      break;
    }
    case RequestKind::kNone:
      break;
  }
  // The layout the checks below read: every kind but a physical mask asked
  // for it above (so this calibrates nothing more); a physical mask is
  // checked only where the layout is known.
  const bool physical = r.kind == RequestKind::kPhysical;
  const topo::Topology* t = physical ? layouts.known_topology(dev) : &layouts.topology(dev);
  if (!physical && r.changes())
    if (std::string w = cluster_warning(*t, p.tpcs); !w.empty()) notes->warnings.push_back(w);
  check_sharing(p, dev, t, sh, others, notes);
  // What the shim checks clustered launches against (never computed in the
  // launch callback). A --physical mask on an unknown layout stays unchecked.
  if (t != nullptr && !p.tpcs.empty()) {
    const topo::ClusterLimits c = topo::cluster_limits(*t, p.tpcs);
    p.max_cluster = c.max_cluster;
    if (c.max_cluster != kClusterUnchecked) {
      p.widened = topo::to_physical(*t, c.widened);
      p.widened_max_cluster = c.widened_max_cluster;
    }
  }
  return p;
}

void check_roles(roles::Role role, const std::vector<Choice>& chosen, const Sharing& sh, Layouts& layouts) {
  if (role == roles::Role::kNone) return;
  for (const Choice& c : chosen) {
    const topo::Topology* t = layouts.known_topology(*c.dev);
    const LogicalTpcSet mine = logical_view(c.partition, t);
    LogicalTpcSet reserved;  // every latency-critical reservation on the GPU
    std::vector<const ctl::StatusEntry*> best_effort;
    for (const ctl::StatusEntry& e : sh.all) {
      if (sh.exclude.count(e.pid)) continue;
      for (const DevicePartition& dp : e.partitions) {
        if (!dp.partition.active() || (dp.device != c.dev->uuid && dp.device != kAnyDevice)) continue;
        if (e.role == roles::Role::kLatencyCritical) reserved.bits = reserved.bits | logical_view(dp.partition, t).bits;
        if (e.role == roles::Role::kBestEffort) best_effort.push_back(&e);
      }
    }
    if (role == roles::Role::kBestEffort) {
      if ((mine.bits & ~reserved.bits).none())
        throw Refusal("--best-effort: every TPC of " + format_list(mine.bits) + " of " + device_label(*c.dev) +
                      " is reserved by a latency-critical task: it would have nowhere to run while they are busy");
      continue;
    }
    reserved.bits = reserved.bits | mine.bits;
    for (const ctl::StatusEntry* e : best_effort)
      for (const DevicePartition& dp : e->partitions) {
        if (!dp.partition.active() || (dp.device != c.dev->uuid && dp.device != kAnyDevice)) continue;
        const LogicalTpcSet floor{logical_view(dp.partition, t).bits & ~reserved.bits};
        if (floor.empty())
          throw Refusal("--latency-critical: with TPCs " + format_list(mine.bits) + " reserved, best-effort pid " +
                        std::to_string(e->pid) + " would have no TPC of " + device_label(*c.dev) +
                        " left while latency-critical tasks are busy");
        const auto launched = sh.clusters_launched.find(e->pid);
        if (t == nullptr || launched == sh.clusters_launched.end()) continue;
        const std::uint32_t hosts = topo::largest_hostable_cluster(*t, floor);
        if (hosts != kClusterUnchecked && hosts < launched->second)
          throw Refusal("--latency-critical: with TPCs " + format_list(mine.bits) + " reserved, best-effort pid " +
                        std::to_string(e->pid) + "'s floor (TPCs " + format_list(floor.bits) + " of " +
                        device_label(*c.dev) + ") hosts thread-block clusters of at most " + std::to_string(hosts) +
                        " SMs, but it has launched clusters of " + std::to_string(launched->second) +
                        ": they would run over the reservation");
      }
  }
}

std::optional<ClusterMap> cluster_map_of(const topo::Topology& t, const DeviceUuid& device) {
  if (!t.device.has_clusters() || !t.gpcs_known() || !t.bits_known()) return std::nullopt;
  ClusterMap m;
  m.device = device;
  LogicalTpcSet capable;
  for (const topo::TpcInfo& tpc : t.tpcs)
    if (tpc.cluster_capable) capable.insert(tpc.id);
  if (!capable.empty()) m.capable = topo::to_physical(t, capable);
  for (const topo::GpcInfo& g : t.gpcs) {
    if (m.gpcs.size() == kMaxMapGpcs) return std::nullopt;
    LogicalTpcSet in;
    for (LogicalTpcId tpc : g.tpcs)
      if (capable.contains(tpc)) in.insert(tpc);
    m.gpcs.push_back({in.empty() ? PhysicalTpcMask{} : topo::to_physical(t, in), g.max_cluster});
  }
  return m;
}

Partition whole_gpu(const topo::Topology& t) {
  Partition whole;
  whole.kind = SpecKind::kTpcList;
  whole.tpcs = topo::all_tpcs(t);
  whole.enabled = topo::to_physical(t, whole.tpcs);
  return whole;
}

std::string device_label(const topo::DeviceInfo& d) {
  return d.pci_bus_id.empty() ? uuid_to_string(d.uuid) : "device " + std::to_string(d.ordinal);
}

DeviceDesc describe_device(const topo::DeviceInfo& d) {
  return {d.sm_count, static_cast<std::uint32_t>(d.cc_major), static_cast<std::uint32_t>(d.cc_minor),
          d.driver_version};
}

std::string phrase(const Partition& p) {
  if (p.kind == SpecKind::kGpcList) return "GPCs " + format_list(p.gpcs.bits);
  if (!p.tpcs.empty()) return "TPCs " + format_list(p.tpcs.bits);
  return "physical mask " + p.enabled.bits.to_hex();
}

std::string pid_list(const std::vector<pid_t>& pids) {
  std::string s;
  for (pid_t p : pids) s += (s.empty() ? "" : ", ") + std::to_string(p);
  return s;
}

std::string cluster_warning(const topo::Topology& t, const LogicalTpcSet& tpcs) {
  const topo::ClusterCapability cap = topo::cluster_capability(t, tpcs);
  std::string w = cap.warning;
  // The portable cluster size is 8 (CUDA guarantees it on every sm_90+ GPU,
  // and libraries use it without asking): when a list of at least 4 TPCs
  // cannot host it, a GPC-aligned list of the same size usually can.
  constexpr unsigned kPortable = 8;
  if (cap.known && cap.gpu_largest >= kPortable && cap.largest < kPortable && tpcs.size() >= kPortable / 2) {
    if (const auto alt = gpc_aligned(t, tpcs.size()); alt && topo::largest_hostable_cluster(t, *alt) >= kPortable)
      w += "; a GPC-aligned list of the same size hosts clusters of " +
           std::to_string(topo::largest_hostable_cluster(t, *alt)) + ": -t " + format_list(alt->bits);
  }
  return w;
}

}  // namespace nvtaskset::planner
