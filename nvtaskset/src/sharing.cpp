// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/sharing.hpp"

#include <time.h>

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <nlohmann/json.hpp>

#include "nvtaskset/beacon.hpp"
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/idlist.hpp"
#include "nvtaskset/mps.hpp"
#include "nvtaskset/proc.hpp"
#include "nvtaskset/task_driver.hpp"

namespace nvtaskset::cli {
namespace {

// /proc/<pid>/cmdline, readable by every user as `ps` shows it: the task's
// argument vector. Bounded: a command line may be as long as the kernel's
// argument limit (megabytes); past kMaxCommandBytes it is cut.
constexpr std::size_t kMaxCommandBytes = 128 * 1024;

std::vector<std::string> argv_of(pid_t pid) {
  std::vector<std::string> argv;
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/cmdline").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return argv;
  std::string raw(kMaxCommandBytes, '\0');
  std::size_t got = 0;
  while (got < raw.size()) {
    const ssize_t n = ::read(fd, raw.data() + got, raw.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  raw.resize(got);
  for (std::size_t at = 0; at < raw.size();) {
    std::size_t end = raw.find('\0', at);
    if (end == std::string::npos) end = raw.size();
    argv.push_back(raw.substr(at, end - at));
    at = end + 1;
  }
  return argv;
}

// The whole command line, for --json (which escapes what it must).
std::string whole_command(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// The table's COMMAND column: the program's file name, then its arguments,
// cut at kCommandShown. As `ps` keeps the name visible: a task started by a
// long path (a build tree, a deep checkout) is still recognisable.
constexpr std::size_t kCommandShown = 60;

std::string table_command(const std::vector<std::string>& argv) {
  if (argv.empty()) return "-";
  std::string s = argv[0];
  if (const auto slash = s.find_last_of('/'); slash != std::string::npos && slash + 1 < s.size())
    s = s.substr(slash + 1);
  for (std::size_t i = 1; i < argv.size() && s.size() <= kCommandShown; ++i) s += " " + argv[i];
  return printable(s, kCommandShown);
}

}  // namespace

std::string user_name(uid_t uid) {
  struct passwd pw {};
  struct passwd* out = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &out) == 0 && out != nullptr) return out->pw_name;
  return std::to_string(uid);
}

int print_status(Devices& devices, bool json) {
  std::vector<ctl::StatusEntry> status = ctl::read_status();
  // Each task's region is attached once (attach scans the task's
  // descriptors: seconds for a process with tens of thousands), for its
  // counters and to repair an entry a killed -p left (repair_entry). Only
  // the task's user and root can attach; for others the map holds null.
  std::map<pid_t, std::unique_ptr<ctl::Region>> regions;
  std::set<pid_t> regionless;  // attach found no region at all
  for (ctl::StatusEntry& e : status) {
    std::unique_ptr<ctl::Region>& r = regions[e.pid];
    try {
      r = ctl::Region::attach(e.pid);
    } catch (const std::exception& x) {
      if (std::string_view(x.what()).find("not running under nvtaskset") != std::string_view::npos)
        regionless.insert(e.pid);
      continue;
    }
    repair_entry(e, *r);
  }
  // Whether each task's kernels can reach the GPU around its shim, from its
  // maps (task_driver.hpp), once per task: a task that can is never shown as
  // partitioned. Only the task's user and root may read its maps.
  std::map<pid_t, ctl::DriverUse> use;
  for (const ctl::StatusEntry& e : status) {
    if (use.count(e.pid)) continue;
    std::optional<bool> hooked;  // unknown for a region that cannot be attached
    if (const ctl::Region* region = regions[e.pid].get()) {
      const std::uint32_t hook = region->header().callback_registered.load(std::memory_order_acquire);
      hooked = hook != 0 && hook != ctl::kHookFailed;
    } else if (regionless.count(e.pid)) {
      hooked = false;
    }
    use[e.pid] = ctl::task_driver_use(e.pid, hooked);
  }
  // Device indices as this process sees them, when a driver answers; the
  // UUID otherwise (a status needs no GPU to be read).
  std::vector<topo::DeviceInfo> visible;
  try {
    visible = devices.all();
  } catch (const std::exception&) {
  }
  // The driver query may point CUDA_MPS_PIPE_DIRECTORY elsewhere; the MPS
  // servers are asked for below, at the user's pipe directory.
  devices.restore_environment();
  struct Row {
    const ctl::StatusEntry* e;
    const DevicePartition* dp;
    const topo::DeviceInfo* dev;  // nullptr: described by the entry only
    const topo::Topology* t;
    LogicalTpcSet tpcs;
  };
  std::vector<Row> rows;
  for (const auto& e : status) {
    for (const auto& dp : e.partitions) {
      if (!dp.partition.active()) continue;
      const topo::DeviceInfo* dev = nullptr;
      for (const auto& v : visible)
        if (v.uuid == dp.device) dev = &v;
      if (dev == nullptr) dev = devices.from_region(dp);
      const topo::Topology* t = dev ? devices.known_topology(*dev) : nullptr;
      rows.push_back({&e, &dp, dev, t, logical_view(dp.partition, t)});
    }
  }
  // The latency-critical tasks' beacons (beacon.hpp): their controllers' state.
  std::map<pid_t, roles::Peer> beacons;
  std::vector<roles::OtherBuild> other_builds;
  for (const roles::Peer& p : roles::scan_beacons(0, {}, &other_builds)) beacons[p.pid] = p;
  // Overlaps among rows on the same GPU. A best-effort task borrows the
  // reservations of latency-critical tasks by design: not an overlap.
  auto by_design = [](const ctl::StatusEntry& a, const ctl::StatusEntry& b) {
    return (a.role == roles::Role::kBestEffort && b.role == roles::Role::kLatencyCritical) ||
           (a.role == roles::Role::kLatencyCritical && b.role == roles::Role::kBestEffort);
  };
  // A task that runs on the partition its ancestor holds is that partition
  // at work, not a second one sharing it: a launcher's holder and its tasks
  // (--env-for: a Slurm step's slurmstepd and the step's tasks), a task and
  // the children that inherited its TPCs.
  // Each row's ancestors read once, not once per pair of rows.
  std::map<pid_t, std::vector<pid_t>> ancestry;
  for (const Row& r : rows)
    if (!ancestry.count(r.e->pid)) ancestry[r.e->pid] = ctl::ancestors(r.e->pid);
  auto family = [&](pid_t a, pid_t b) {
    auto has = [&](pid_t young, pid_t old) {
      const std::vector<pid_t>& up = ancestry[young];
      return std::find(up.begin(), up.end(), old) != up.end();
    };
    return has(a, b) || has(b, a);
  };
  std::map<std::size_t, std::vector<pid_t>> share_tpcs, share_gpcs;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::vector<Holder> others;
    for (std::size_t j = 0; j < rows.size(); ++j)
      if (j != i && rows[j].e->pid != rows[i].e->pid && !by_design(*rows[i].e, *rows[j].e) &&
          !(rows[j].dp->device == rows[i].dp->device &&
            rows[j].dp->partition.enabled.bits == rows[i].dp->partition.enabled.bits &&
            family(rows[i].e->pid, rows[j].e->pid)) &&
          (rows[j].dp->device == rows[i].dp->device || rows[j].dp->device == kAnyDevice ||
           rows[i].dp->device == kAnyDevice))
        others.push_back({rows[j].e->pid, rows[j].e->uid, rows[j].tpcs});
    const Overlap o = overlap_with(rows[i].t, rows[i].tpcs, others);
    share_tpcs[i] = o.share_tpcs;
    share_gpcs[i] = o.share_gpcs;
  }
  nlohmann::json jt = nlohmann::json::array();
  std::vector<std::vector<std::string>> table;
  table.push_back({"PID", "USER", "GPU", "TPCS", "GPCS", "SMS", "ROLE", "KERNELS", "GRAPHS", "CLUSTER", "COMMAND"});
  std::vector<std::string> notes;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const pid_t pid = r.e->pid;
    std::string gpu = r.dp->device == kAnyDevice ? "any" : uuid_to_string(r.dp->device).substr(0, 12);
    if (r.dev != nullptr && !r.dev->pci_bus_id.empty()) gpu = std::to_string(r.dev->ordinal);
    // GPCs touched, and how many of them whole.
    std::string gpcs = "-";
    unsigned touched = 0, whole = 0;
    if (r.t != nullptr && r.t->gpcs_known()) {
      GpcSet g;
      for (const topo::GpcInfo& gi : r.t->gpcs) {
        unsigned in = 0;
        for (LogicalTpcId x : gi.tpcs) in += r.tpcs.contains(x) ? 1 : 0;
        if (in == 0) continue;
        g.insert(gi.id);
        ++touched;
        whole += in == gi.tpcs.size() ? 1 : 0;
      }
      gpcs = format_list(g.bits) + " (" + std::to_string(whole) + "/" + std::to_string(touched) + ")";
    }
    // The counters live in the owner-only control region: shown to the
    // task's user and root, "-" to others (as `ps` hides another's environ).
    std::string kernels = "-", graphs = "-", cluster = "-";
    nlohmann::json counters = nullptr;
    if (const auto it = regions.find(pid); it != regions.end() && it->second != nullptr) {
      const ctl::Header& h = it->second->header();
      const auto k = h.kernels_launched.load(std::memory_order_relaxed);
      const auto gf = h.graphs_following.load(std::memory_order_relaxed);
      const auto gn = h.graphs_not_following.load(std::memory_order_relaxed);
      const auto mc = h.max_cluster_launched.load(std::memory_order_relaxed);
      kernels = std::to_string(k);
      graphs = gn ? std::to_string(gf) + "+" + std::to_string(gn) + "!" : std::to_string(gf);
      cluster = std::to_string(mc);
      counters = {{"kernels_launched", k}, {"graphs_following", gf}, {"graphs_not_following", gn},
                  {"max_cluster", mc}};
    }
    // The role, and what its controller (latency-critical: the beacon,
    // public) or its shim (best-effort: the region, owner-only) does now.
    std::string role = "-";
    std::string bursting_on;  // a bursting LC task's kernels run there, not only on its reservation
    std::string topped_up;    // a saturated LC task's kernels run there too
    nlohmann::json controller = nullptr;
    if (r.e->role == roles::Role::kLatencyCritical) {
      role = "lc";
      if (const auto b = beacons.find(pid); b != beacons.end()) {
        const roles::Beacon& bc = *b->second.beacon;
        const roles::LcSnapshot snap = roles::snapshot(bc);
        const std::uint64_t now = roles::monotonic_ns();
        const bool stale = now > snap.heartbeat_ns && now - snap.heartbeat_ns > roles::kStaleNs;
        const char* state = stale ? "stale"
                             : snap.launches == snap.completed
                                 ? "idle"
                                 : bc.state.load(std::memory_order_relaxed) ==
                                           static_cast<std::uint32_t>(roles::LcState::kSaturated)
                                       ? "saturated"
                                       : "bursting";
        role += std::string(":") + state;
        std::vector<roles::DeviceView> views;
        std::string burst, topup;
        auto list = [&](const Bits128& m) {
          const LogicalTpcSet l = r.t ? topo::logical_of_physical(*r.t, PhysicalTpcMask{m}) : LogicalTpcSet{};
          return l.empty() ? "physical " + m.to_hex() : format_list(l.bits);
        };
        if (roles::read_devices(bc, views))
          for (const roles::DeviceView& v : views)
            if (v.uuid == r.dp->device || r.dp->device == kAnyDevice) {
              burst = list(v.burst);
              if (v.topup.any()) topup = list(v.topup);
            }
        // A reference probe of the top-up: best-effort tasks hold as for a
        // burst, its own kernels stay on its reservation.
        const bool probing = bc.probing.load(std::memory_order_acquire) == 1;
        if (std::string_view(state) == "bursting" && !probing) bursting_on = burst;
        if (std::string_view(state) == "saturated" && !probing) topped_up = topup;
        controller = {{"state", state},
                      {"may_burst", snap.may_burst && !probing},
                      {"probing", probing},
                      {"launches", snap.launches},
                      {"completed", snap.completed},
                      {"heartbeat_age_ms", now > snap.heartbeat_ns ? (now - snap.heartbeat_ns) / 1'000'000 : 0},
                      {"busy_periods", bc.busy_periods.load(std::memory_order_relaxed)},
                      {"busy_ms", static_cast<double>(bc.busy_ns.load(std::memory_order_relaxed)) / 1e6},
                      {"saturations", bc.saturations.load(std::memory_order_relaxed)},
                      {"burst_tpcs", burst},
                      {"topup_tpcs", topup},
                      {"topup_size", bc.topup_tpcs.load(std::memory_order_relaxed)},
                      {"topup_ratio", bc.topup_ratio_milli.load(std::memory_order_relaxed) / 1000.0},
                      {"topup_probes", bc.topup_probes.load(std::memory_order_relaxed)}};
        if (stale)
          notes.push_back("pid " + std::to_string(pid) + "'s controller has not run for " +
                          std::to_string((now - snap.heartbeat_ns) / 1'000'000) +
                          " ms (stopped or hung): best-effort tasks keep off its reservation and do not wait for it");
      } else if (const auto o = std::find_if(other_builds.begin(), other_builds.end(),
                                             [&](const roles::OtherBuild& x) { return x.pid == pid; });
                 o != other_builds.end()) {
        // A beacon this build cannot read: not "unstarted", and no best-effort
        // task of this build makes way for it.
        role += ":other-build";
        controller = {{"state", "other-build"}, {"beacon_version", o->version}};
        notes.push_back("pid " + std::to_string(pid) + " runs another nvtaskset build (beacon version " +
                        std::to_string(o->version) + ", this one reads " + std::to_string(roles::kBeaconVersion) +
                        "): best-effort tasks of this build neither make way for it nor keep off its reservation");
      } else {
        role += ":unstarted";  // no beacon yet: the task has not launched a kernel
        controller = {{"state", "unstarted"}};
      }
    } else if (r.e->role == roles::Role::kBestEffort) {
      role = "be";
      if (const auto it = regions.find(pid); it != regions.end() && it->second != nullptr) {
        const ctl::Header& h = it->second->header();
        const std::uint32_t st = h.role_state.load(std::memory_order_relaxed);
        const char* state = st == 1 ? "holding" : st == 2 ? "floor" : "running";
        role += std::string(":") + state;
        auto r64 = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
        controller = {{"state", state},
                      {"launches_held", r64(h.launches_held)},
                      {"held_ms", static_cast<double>(r64(h.held_ns)) / 1e6},
                      {"launches_on_floor", r64(h.launches_on_floor)},
                      {"queue_waits", r64(h.queue_waits)},
                      {"floor_skipped", r64(h.floor_skipped)},
                      {"gates_queued", r64(h.gates_queued)},
                      {"kept_off", r64(h.kept_off)}};
        if (r64(h.floor_skipped) != 0 && (i == 0 || rows[i - 1].e->pid != pid))
          notes.push_back("pid " + std::to_string(pid) + " ran " + std::to_string(r64(h.floor_skipped)) +
                          " kernels on its whole partition that should have kept off the latency-critical reservations: their "
                          "thread-block clusters do not fit its floor (or its floor was empty)");
      }
    }
    const ctl::DriverUse& u = use[pid];
    const bool bypassed = u.state == ctl::DriverUse::State::kBypassed;
    const std::string tpcs = r.tpcs.empty() ? "physical " + r.dp->partition.enabled.bits.to_hex()
                                            : format_list(r.tpcs.bits);
    if (bypassed && (i == 0 || rows[i - 1].e->pid != pid))
      notes.push_back("pid " + std::to_string(pid) + " runs on all TPCs, not on " + tpcs + ": " + u.why);
    const unsigned sms = 2 * r.tpcs.size();
    const std::string user = user_name(r.e->uid);
    const std::vector<std::string> argv = argv_of(pid);
    table.push_back({std::to_string(pid), user, gpu,
                     bypassed              ? "UNPARTITIONED"
                     : !bursting_on.empty() ? tpcs + " (bursting on " + bursting_on + ")"
                     : !topped_up.empty()   ? tpcs + " (topped up with " + topped_up + ")"
                                            : tpcs,
                     gpcs, std::to_string(sms),
                     role, kernels, graphs, cluster, table_command(argv)});
    for (pid_t other : share_tpcs[i])
      if (other > pid) notes.push_back("pids " + std::to_string(pid) + " and " + std::to_string(other) + " share TPCs");
    for (pid_t other : share_gpcs[i])
      if (other > pid)
        notes.push_back("pids " + std::to_string(pid) + " and " + std::to_string(other) +
                        " share a GPC: each hosts smaller thread-block clusters than whole GPCs (docs/hardware.md)");
    nlohmann::json j = {{"pid", pid}, {"user", user}, {"uid", r.e->uid},
                        {"device", r.dp->device == kAnyDevice ? "any" : uuid_to_string(r.dp->device)},
                        {"tpcs", tpcs}, {"sms", sms}, {"command", whole_command(argv)}, {"argv", argv},
                        {"shares_tpcs_with", share_tpcs[i]}, {"shares_gpcs_with", share_gpcs[i]}};
    if (r.dev != nullptr && !r.dev->pci_bus_id.empty()) j["gpu"] = r.dev->ordinal;
    if (gpcs != "-") {
      j["gpcs"] = gpcs.substr(0, gpcs.find(' '));
      j["gpcs_whole"] = whole;
      j["gpcs_touched"] = touched;
    }
    if (!counters.is_null()) j.update(counters);
    // "role": the fixed names of the options, or null.
    j["role"] = r.e->role == roles::Role::kNone ? nlohmann::json(nullptr) : nlohmann::json(roles::role_name(r.e->role));
    if (!controller.is_null()) j["controller"] = controller;
    // "tpcs" is what nvtaskset set; "partitioned" says whether the task's
    // kernels get it, "verified" whether its maps could be read to tell.
    j["partitioned"] = !bypassed;
    j["verified"] = u.state != ctl::DriverUse::State::kUnknown;
    if (bypassed) j["unpartitioned_reason"] = u.why;
    jt.push_back(j);
  }
  // Which user each MPS server serves: another user's clients wait for it.
  // A multi-user daemon's (-M) one server is root's and serves everyone's clients at once.
  const std::vector<mps::Server> servers = mps::servers();
  const bool every_user = !servers.empty() && mps::serves_every_user(mps::pipe_directory());
  nlohmann::json js = nlohmann::json::array();
  for (const mps::Server& sv : servers)
    js.push_back({{"pid", sv.pid}, {"uid", sv.uid}, {"user", user_name(sv.uid)}, {"clients", sv.clients},
                  {"every_user", every_user}});
  if (json) {
    std::printf("%s\n", nlohmann::json({{"tasks", jt}, {"mps_servers", js}})
                               .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                               .c_str());
    return 0;
  }
  std::vector<std::size_t> width(table[0].size(), 0);
  for (const auto& row : table)
    for (std::size_t c = 0; c + 1 < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : table) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
  for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  for (const mps::Server& sv : servers)
    if (every_user)
      std::printf("mps: server pid %d serves every user (a multi-user daemon), %u client%s\n", sv.pid, sv.clients,
                  sv.clients == 1 ? "" : "s");
    else
      std::printf("mps: server pid %d serves user %s, %u client%s (another user's clients wait until they exit)\n",
                  sv.pid, user_name(sv.uid).c_str(), sv.clients, sv.clients == 1 ? "" : "s");
  return 0;
}

}  // namespace nvtaskset::cli
