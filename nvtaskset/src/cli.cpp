// SPDX-License-Identifier: Apache-2.0
// nvtaskset: the command line. Data flows top-down:
//   1. parse the command line (CLI11, idlist.hpp);
//   2. ask topology/ for the device and translate logical TPC/GPC lists into
//      physical TMD mask bits (the only place that knows the chip);
//   3. hand the partition to the task through NVTASKSET_PARTITION (launch) or
//      its control region (-p);
//   4. the shim, loaded as libcuda.so.1 in the task, applies it to each kernel.
#include "nvtaskset/cli.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "nvtaskset/control_region.hpp"
#include "nvtaskset/cuda_driver_api.hpp"
#include "nvtaskset/driver_locate.hpp"
#include "nvtaskset/exec_check.hpp"
#include "nvtaskset/task_driver.hpp"
#include "nvtaskset/trusted_file.hpp"
#include "nvtaskset/proc.hpp"
#include "nvtaskset/devices.hpp"
#include "nvtaskset/idlist.hpp"
#include "nvtaskset/log_level.hpp"
#include "nvtaskset/mps.hpp"
#include "nvtaskset/partition.hpp"
#include "nvtaskset/placement.hpp"
#include "nvtaskset/sharing.hpp"
#include "nvtaskset/status.hpp"
#include "nvtaskset/system_wide.hpp"
#include "nvtaskset/topology.hpp"
#include "nvtaskset/verify.hpp"

extern char** environ;

namespace nvtaskset::cli {
namespace fs = std::filesystem;

namespace {

// A user-facing failure: printed as one line "nvtaskset: <what>", exit 1.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> snapshot_environ() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  return env;
}

// LogLevel mirrors spdlog's numbering (log_level.hpp).
static_assert(static_cast<int>(LogLevel::kTrace) == spdlog::level::trace &&
              static_cast<int>(LogLevel::kWarn) == spdlog::level::warn &&
              static_cast<int>(LogLevel::kOff) == spdlog::level::off);

void setup_logging() {
  auto logger = spdlog::stderr_color_mt("nvtaskset");
  logger->set_pattern("nvtaskset: %^%l%$: %v");
  // The shim reads the same variable with the same parser; spdlog's own
  // from_str() turned "INFO" or a typo into "off", silently.
  const char* value = std::getenv(kLogLevelEnv);
  const LogSetting setting = log_setting(value);
  logger->set_level(static_cast<spdlog::level::level_enum>(setting.level));
  spdlog::set_default_logger(logger);
  if (setting.unknown)
    logger->warn("{}={}: unknown level ({}); using warn", kLogLevelEnv, printable(value), kLogLevelNames);
}

// A message as one line: control bytes (a newline, an escape sequence from
// user text) as \xNN; UTF-8 and length are left as they are.
std::string one_line(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

// Longest -d value: a UUID with its "GPU-" or "MIG-" prefix and dashes is 40
// characters, a PCI bus id 12.
constexpr std::size_t kMaxDeviceSpec = 64;

// A -d value is checked before it reaches any message or the driver query:
// printable ASCII only (a selector holds digits, hex, ':', '.', '-'), so
// nothing later (topology/ quotes it as given) can echo a control character.
void check_device_spec(const std::string& spec) {
  if (spec.empty()) throw Failure("-d: empty device (give an index, UUID or PCI bus id)");
  if (spec.size() > kMaxDeviceSpec)
    throw Failure("-d " + printable(spec) + ": longer than " + std::to_string(kMaxDeviceSpec) + " characters");
  for (const char c : spec)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      throw Failure("-d " + printable(spec) + ": not a device index, UUID or PCI bus id");
}

// One requested partition: on which device, and what the user typed.
struct Request {
  std::string device;  // "" = the default device
  SpecKind kind = SpecKind::kNone;
  std::string text;
  std::string count;  // -n COUNT (kind kTpcList, chosen by placement.hpp)
  bool all = false;   // every TPC of the GPU (--best-effort without a list)
};

// What a new partition is checked and chosen against: the other live
// partitions (the public status), and the user's sharing options.
struct Sharing {
  std::vector<ctl::StatusEntry> status;
  std::set<pid_t> exclude;  // the task being changed (and, with -a, its family)
  std::map<DeviceUuid, LogicalTpcSet> keep;  // -p -n: the TPCs a task has now
  bool spread = false;
  bool exclusive = false;
  bool verbose = false;
  // The launch's role (roles.hpp). A latency-critical reservation is
  // exclusive but for best-effort tasks, which make way for it; a
  // best-effort partition may overlap latency-critical reservations.
  roles::Role role = roles::Role::kNone;
  // Every entry as read, the roles' own included (check_roles).
  std::vector<ctl::StatusEntry> all;
  // --exclusive, or --latency-critical: what a refusal names.
  const char* claim_name = "--exclusive";
  // --exclusive: live tasks whose kernels reach the driver around their
  // shim, and why; they run on every TPC whatever their entries say.
  std::map<pid_t, std::string> everywhere;
};

const char* form_name(SpecKind k) {
  switch (k) {
    case SpecKind::kTpcMask: return "TPC mask";
    case SpecKind::kGpcList: return "GPC list";
    case SpecKind::kPhysical: return "physical mask";
    default: return "TPC list";
  }
}

// A device known only from a task's control region has no ordinal here.
std::string device_label(const topo::DeviceInfo& d) {
  return d.pci_bus_id.empty() ? uuid_to_string(d.uuid) : "device " + std::to_string(d.ordinal);
}

DeviceDesc describe_device(const topo::DeviceInfo& d) {
  return {d.sm_count, static_cast<std::uint32_t>(d.cc_major), static_cast<std::uint32_t>(d.cc_minor),
          d.driver_version};
}

std::string phrase_of(const Partition& p);

// "42, 43": PIDs as messages name them.
std::string pid_list(const std::vector<pid_t>& pids) {
  std::string s;
  for (pid_t p : pids) s += (s.empty() ? "" : ", ") + std::to_string(p);
  return s;
}

// -n COUNT: the TPCs chosen for the request, avoiding those other live
// partitions hold when enough are free.
LogicalTpcSet choose_by_count(const Request& r, const topo::DeviceInfo& dev, const topo::Topology& t,
                              const Sharing& sh, const std::vector<Holder>& others,
                              std::vector<std::string>* warnings) {
  const unsigned n = parse_count(r.count);
  if (n > dev.tpc_count())
    throw Failure("-n " + r.count + ": " + device_label(dev) + " has " + std::to_string(dev.tpc_count()) + " TPCs");
  topo::PlacementRequest req;
  req.count = n;
  req.how = sh.spread ? topo::Placement::kSpread : topo::Placement::kPacked;
  req.pool = topo::all_tpcs(t);
  const LogicalTpcSet taken = held_by(others);
  req.pool.bits = req.pool.bits & ~taken.bits;
  if (auto it = sh.keep.find(dev.uuid); it != sh.keep.end()) req.keep = it->second;
  if (req.pool.size() < n) {
    std::vector<pid_t> holders;
    for (const Holder& h : others) holders.push_back(h.pid);
    const std::string free = std::to_string(req.pool.size()) + " of " + std::to_string(dev.tpc_count()) +
                             " TPCs of " + device_label(dev) + " are free (held by pid " + pid_list(holders) + ")";
    if (sh.exclusive) throw Failure("-n " + r.count + " " + sh.claim_name + ": only " + free);
    warnings->push_back("-n " + r.count + ": only " + free + "; sharing TPCs with them");
    req.pool = topo::all_tpcs(t);
  }
  const auto chosen = topo::choose_tpcs(t, req);
  if (!chosen) throw Failure("-n " + r.count + ": no choice of TPCs on " + device_label(dev));
  if (!chosen->note.empty()) warnings->push_back(chosen->note);
  if (sh.verbose)
    std::fprintf(stderr, "nvtaskset: -n %s on %s: TPCs %s\n", r.count.c_str(), device_label(dev).c_str(),
                 format_list(chosen->tpcs.bits).c_str());
  return chosen->tpcs;
}

// Refuses (--exclusive) or warns about a partition that shares TPCs or GPCs
// with other live partitions on its GPU: tasks that share a GPC do not
// isolate each other (docs/hardware.md).
void check_sharing(const Partition& p, const topo::DeviceInfo& dev, const topo::Topology* t, const Sharing& sh,
                   const std::vector<Holder>& others, std::vector<std::string>* warnings) {
  if (p.tpcs.empty()) return;
  const Overlap o = overlap_with(t, p.tpcs, others);
  if (!o.share_tpcs.empty()) {
    const std::string what = "TPCs " + format_list(o.common_tpcs.bits) + " of " + device_label(dev) +
                             " are held by pid " + pid_list(o.share_tpcs);
    if (sh.exclusive) throw Failure(what + "; " + sh.claim_name + " refuses a partition that overlaps another");
    warnings->push_back(what + ": the tasks share them");
    return;
  }
  if (o.share_gpcs.empty() || t == nullptr) return;
  // A suggestion of the same size inside GPCs no other partition touches.
  std::string alt;
  topo::PlacementRequest req;
  req.count = p.tpcs.size();
  for (const topo::GpcInfo& g : t->gpcs) {
    bool used = false;
    for (LogicalTpcId x : g.tpcs)
      for (const Holder& h : others) used = used || h.tpcs.contains(x);
    if (!used)
      for (LogicalTpcId x : g.tpcs) req.pool.insert(x);
  }
  if (const auto c = topo::choose_tpcs(*t, req)) alt = "; GPCs no other task uses hold the same size: -t " +
                                                       format_list(c->tpcs.bits);
  const bool many = o.common_gpcs.size() > 1;
  warnings->push_back(phrase_of(p) + " of " + device_label(dev) + (many ? " share GPCs " : " share GPC ") +
                      format_list(o.common_gpcs.bits) + " with pid " + pid_list(o.share_gpcs) +
                      ": partitions that share a GPC do not isolate each other" + alt);
}

LogicalTpcSet checked_tpcs(const std::vector<unsigned>& ids, const topo::DeviceInfo& dev) {
  const unsigned n = dev.tpc_count();
  for (unsigned id : ids)
    if (id >= n)
      throw Failure("TPC " + std::to_string(id) + " does not exist on " + device_label(dev) + " (TPCs 0-" +
                    std::to_string(n - 1) + ")");
  LogicalTpcSet s;
  s.bits = to_bits(ids, "TPC");
  return s;
}

// Turns a request into a partition for `dev`. Every check happens here,
// before anything is started or changed. A warning about the partition (the
// cluster sizes it cannot host, the TPCs or GPCs it shares) go to *warnings,
// for the caller to print
// once the change is certain.
Partition build_partition(const Request& r, const topo::DeviceInfo& dev, Devices& devices,
                          std::vector<std::string>* warnings, const Sharing& sh) {
  Partition p;
  p.kind = r.kind;
  for (const auto& [pid, why] : sh.everywhere)
    for (const ctl::StatusEntry& e : sh.status)
      if (e.pid == pid)
        for (const DevicePartition& dp : e.partitions)
          if (dp.partition.active() && (dp.device == dev.uuid || dp.device == kAnyDevice))
            throw Failure("pid " + std::to_string(pid) + " runs on all TPCs of " + device_label(dev) + " (" + why +
                          "); --exclusive cannot keep any to itself");
  const std::vector<Holder> others = holders_on(sh.status, dev, devices.known_topology(dev), sh.exclude);
  switch (r.kind) {
    case SpecKind::kTpcList:
      if (r.all) {
        const topo::Topology& t = devices.topology(dev);
        p.tpcs = topo::all_tpcs(t);
        p.enabled = topo::to_physical(t, p.tpcs);
        break;
      }
      if (!r.count.empty()) {
        const topo::Topology& t = devices.topology(dev);
        p.tpcs = choose_by_count(r, dev, t, sh, others, warnings);
        p.enabled = topo::to_physical(t, p.tpcs);
        break;
      }
      [[fallthrough]];
    case SpecKind::kTpcMask: {
      const std::vector<unsigned> ids =
          r.kind == SpecKind::kTpcList ? parse_list(r.text, "TPC") : parse_mask(r.text, "TPC").indices();
      p.tpcs = checked_tpcs(ids, dev);
      const topo::Topology& t = devices.topology(dev);
      p.enabled = topo::to_physical(t, p.tpcs);
      break;
    }
    case SpecKind::kGpcList: {
      const std::vector<unsigned> ids = parse_list(r.text, "GPC");
      const topo::Topology& t = devices.topology(dev);
      p.gpcs.bits = to_bits(ids, "GPC");
      p.tpcs = topo::tpcs_of_gpcs(t, p.gpcs);
      p.enabled = topo::to_physical(t, p.tpcs);
      break;
    }
    case SpecKind::kPhysical: {
      p.enabled.bits = parse_mask(r.text, "physical");
      if (const topo::Topology* t = devices.known_topology(dev)) {
        // An enable mask with no working TPC makes every kernel wait forever
        // (docs/hardware.md): refuse it whenever the layout is known.
        if ((p.enabled.bits & t->working_bits().bits).none())
          throw Failure("physical mask " + p.enabled.bits.to_hex() + " enables no working TPC on " +
                        device_label(dev) + ": its kernels would never run");
        p.tpcs = topo::logical_of_physical(*t, p.enabled);
      } else {
        spdlog::warn("the layout of {} is unknown, so physical mask {} is not checked: a mask with no working "
                     "TPC hangs every kernel",
                     device_label(dev), p.enabled.bits.to_hex());
      }
      break;
    }
    case SpecKind::kNone:
      break;
  }
  if (r.kind != SpecKind::kPhysical && r.kind != SpecKind::kNone)
    if (std::string w = devices.cluster_warning(dev, p.tpcs); !w.empty()) warnings->push_back(w);
  check_sharing(p, dev, r.kind == SpecKind::kPhysical ? devices.known_topology(dev) : &devices.topology(dev), sh,
                others, warnings);
  // What the shim checks clustered launches against (never computed in the
  // launch callback). A --physical mask on an unknown layout stays unchecked.
  const topo::Topology* t =
      r.kind == SpecKind::kPhysical ? devices.known_topology(dev) : &devices.topology(dev);
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

// "TPCs 0-3" / "GPCs 1-2" / "physical mask 0x..": the partition in a phrase.
std::string phrase(const Partition& p) {
  if (p.kind == SpecKind::kGpcList) return "GPCs " + format_list(p.gpcs.bits);
  if (!p.tpcs.empty()) return "TPCs " + format_list(p.tpcs.bits);
  return "physical mask " + p.enabled.bits.to_hex();
}
std::string phrase_of(const Partition& p) { return phrase(p); }

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

// The shim file the driver search must skip (none when there is no shim).
std::vector<std::string> shim_copies(const std::string& shim_dir) {
  if (shim_dir.empty()) return {};
  return {shim_dir + "/libcuda.so.1"};
}

std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

[[noreturn]] void exec_task(const std::vector<std::string>& cmd, const std::vector<std::string>& env) {
  std::vector<char*> argv, envp;
  for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::fflush(nullptr);
  ::execvpe(argv[0], argv.data(), envp.data());
  const int err = errno;
  std::fprintf(stderr, "nvtaskset: failed to execute %s: %s\n", printable(cmd[0], 200).c_str(), std::strerror(err));
  std::exit(err == ENOENT ? 127 : 126);
}

// The items of a loader list (LD_LIBRARY_PATH, LD_PRELOAD): separated by
// ':' or ' ', as ld.so reads them; empty items dropped.
std::vector<std::string> loader_list(std::string_view value) {
  std::vector<std::string> out;
  std::string item;
  for (std::size_t i = 0; i <= value.size(); ++i) {
    if (i < value.size() && value[i] != ':' && value[i] != ' ') {
      item += value[i];
    } else if (!item.empty()) {
      out.push_back(std::move(item));
      item.clear();
    }
  }
  return out;
}

// The MPS daemon inherits our environment. It must never load the shim nor
// carry a partition, which it would when nvtaskset itself runs inside a
// partitioned task.
void scrub_shim_environment(const std::string& shim_dir) {
  ::unsetenv(kPartitionEnv);
  for (const char* var : {"LD_LIBRARY_PATH", "LD_PRELOAD"}) {
    const char* v = std::getenv(var);
    if (!v) continue;
    std::string kept;
    for (const std::string& item : loader_list(v)) {
      const bool shim = item == shim_dir || item.rfind(shim_dir + "/", 0) == 0;
      if (!shim) kept += (kept.empty() ? "" : ":") + item;
    }
    if (kept.empty()) ::unsetenv(var);
    else ::setenv(var, kept.c_str(), 1);
  }
}

struct Options {
  std::string shim_dir;  // find_shim_dir() of this executable; "" when absent
  std::vector<Request> requests;
  std::vector<std::string> positionals;
  bool pid_mode = false;
  bool no_mps = false;
  bool show_topology = false;
  bool json = false;
  std::string show;  // -p query: list, mask, gpcs or physical ("" = the form it was set in)
  bool calibrate = false;
  std::string topology_file;
  std::string system_wide;
  bool spread = false;     // -n: spread over GPCs instead of packing
  bool exclusive = false;  // refuse overlapping other live partitions
  bool verbose = false;
  bool status = false;
  bool all_tasks = false;  // -a: with -p, the task and its descendants
  bool verify = false;
  bool partition_sm_count = false;  // the task's MULTIPROCESSOR_COUNT is its partition's SMs
  std::optional<std::string> seed;  // --seed, with --verify
  bool latency_critical = false;
  bool best_effort = false;
  roles::Role role = roles::Role::kNone;
};

// The entries a launch or change of role `role` counts as holders: a
// latency-critical reservation does not count best-effort tasks (they make
// way), and a best-effort partition does not count latency-critical ones
// (it makes way for them). Everyone else counts everyone.
std::vector<ctl::StatusEntry> visible_to(roles::Role role, std::vector<ctl::StatusEntry> status) {
  if (role == roles::Role::kNone) return status;
  const roles::Role other =
      role == roles::Role::kLatencyCritical ? roles::Role::kBestEffort : roles::Role::kLatencyCritical;
  std::erase_if(status, [&](const ctl::StatusEntry& e) { return e.role == other; });
  return status;
}

// The sharing context of a launch or change: the public status of the other
// tasks, as it was when the choice was made.
Sharing sharing_for(const Options& o, std::set<pid_t> exclude) {
  Sharing sh;
  sh.role = o.role;
  sh.all = ctl::read_status();
  sh.status = visible_to(sh.role, sh.all);
  sh.exclude = std::move(exclude);
  sh.spread = o.spread;
  sh.exclusive = o.exclusive || o.role == roles::Role::kLatencyCritical;
  if (o.role == roles::Role::kLatencyCritical) sh.claim_name = "--latency-critical";
  sh.verbose = o.verbose;
  // Read from each task's maps (task_driver.hpp): only for --exclusive,
  // which must refuse them, and only where this user may read them.
  if (sh.exclusive)
    for (const ctl::StatusEntry& e : sh.status)
      if (!sh.exclude.count(e.pid))
        if (const ctl::DriverUse u = ctl::task_driver_use(e.pid, std::nullopt);
            u.state == ctl::DriverUse::State::kBypassed)
          sh.everywhere[e.pid] = u.why;
  return sh;
}

// What a launch or a change chose: a partition per GPU, to publish.
struct Choice {
  const topo::DeviceInfo* dev;
  Partition partition;
};

// Choosing without a lock. Two launches choosing at once (`-n`, or
// `--exclusive`) must not take the same TPCs unseen. A lock file would
// serialise them, but in /dev/shm any user can create and hold it forever.
// So a choice is optimistic: plan from a snapshot of the public status
// (`sh`), publish the plan as the task's entry, read the status again. An
// entry that is new since the snapshot (a task that appeared, or one that
// changed) and shares a TPC or a GPC with the plan raced with it: take the
// entry back, wait a random moment, and plan again from the status as it is
// now, which shows the other choice. Each side reads again only once its own
// entry is complete, so of two racing choices the later reader always sees
// the other: two overlapping choices never both stand unseen. After
// kClaimTries races in a row, --exclusive fails in one line; otherwise the
// last plan stands and the sharing is said.
constexpr int kClaimTries = 8;

struct Claim {
  std::function<std::vector<Choice>()> plan;  // (re)plans from `sh`; may throw Failure
  std::function<void(const std::vector<Choice>&)> publish;
  std::function<void()> take_back;  // restores the entries as they were
};

// Milliseconds to sleep before the first publish (tests widen the race with it).
int claim_delay_ms() {
  const char* v = option_value(Option::kClaimDelayMs);
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long ms = std::strtol(v, &end, 10);
  return *end == '\0' && ms > 0 && ms <= 10000 ? static_cast<int>(ms) : 0;
}

// The entries in `fresh` that share TPCs or GPCs with `chosen`.
Overlap raced_with(const std::vector<Choice>& chosen, const std::vector<ctl::StatusEntry>& fresh, const Sharing& sh,
                   Devices& devices) {
  Overlap all;
  for (const Choice& c : chosen) {
    const topo::Topology* t = devices.known_topology(*c.dev);
    const std::vector<Holder> others = holders_on(fresh, *c.dev, t, sh.exclude);
    const Overlap o = overlap_with(t, logical_view(c.partition, t), others);
    all.share_tpcs.insert(all.share_tpcs.end(), o.share_tpcs.begin(), o.share_tpcs.end());
    all.share_gpcs.insert(all.share_gpcs.end(), o.share_gpcs.begin(), o.share_gpcs.end());
  }
  return all;
}

// Publishes `first` (planned from `sh`) and settles it as above; returns the
// choice that stands. `warnings` is the plan's (replanning replaces it).
std::vector<Choice> settle(Sharing& sh, Devices& devices, const Claim& c, std::vector<Choice> chosen,
                           std::vector<std::string>* warnings) {
  if (const int ms = claim_delay_ms()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    c.publish(chosen);
    const Overlap raced =
        raced_with(chosen, changed_since(sh.status, visible_to(sh.role, ctl::read_status())), sh, devices);
    if (raced.share_tpcs.empty() && raced.share_gpcs.empty()) return chosen;
    spdlog::debug("choice {} raced with pid {} {}", attempt, pid_list(raced.share_tpcs), pid_list(raced.share_gpcs));
    if (attempt == kClaimTries) {
      if (sh.exclusive && !raced.share_tpcs.empty()) {
        c.take_back();
        throw Failure("pid " + pid_list(raced.share_tpcs) + " took the same TPCs at the same moment, " +
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
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms(rng)));
    sh.status = visible_to(sh.role, ctl::read_status());
    warnings->clear();
    chosen = c.plan();
  }
}

// A CUDA driver named in LD_PRELOAD is loaded before anything else, so the
// task would bind libcuda.so.1 to it and never load the shim: every kernel
// on all TPCs while nvtaskset said otherwise. Refused, not silently fixed:
// the user asked for that preload. (The shim itself may be preloaded.)
void refuse_preloaded_driver(const std::vector<std::string>& env) {
  for (const auto& e : env) {
    if (!e.starts_with("LD_PRELOAD=")) continue;
    for (const std::string& item : loader_list(std::string_view(e).substr(std::strlen("LD_PRELOAD=")))) {
      // A bare name is searched like any library, and finds the shim first.
      // A path is judged by what the file is (its DT_SONAME), not its name:
      // a symlink or renamed copy of the driver is the driver.
      if (item.find('/') != std::string::npos && library_kind(item) == LibraryKind::kDriver)
        throw Failure("LD_PRELOAD names the CUDA driver (" + printable(item, 200) +
                      "): the task would load it instead of nvtaskset's shim and run on all TPCs; remove it");
    }
  }
}

// Checks the syntax of every list and mask before anything touches a device
// or the driver, so that a typo is reported as such even where the driver is
// missing or broken. build_partition parses them again, against the device.
void check_syntax(const Options& o) {
  auto check = [](SpecKind kind, const std::string& text) {
    if (kind == SpecKind::kTpcList) parse_list(text, "TPC");
    else if (kind == SpecKind::kGpcList) parse_list(text, "GPC");
    else if (kind == SpecKind::kTpcMask) parse_mask(text, "TPC");
    else if (kind == SpecKind::kPhysical) parse_mask(text, "physical");
  };
  for (const Request& r : o.requests) {
    if (!r.count.empty()) parse_count(r.count);
    else check(r.kind, r.text);
  }
  // A mask given as the first positional, where do_launch and do_pid take one.
  // (--best-effort and --latency-critical take one only when it starts with 0x.)
  const bool role_without_mask = o.role != roles::Role::kNone && o.requests.empty() && !o.positionals.empty() &&
                                 !o.positionals[0].starts_with("0x") && !o.positionals[0].starts_with("0X");
  const bool wants_mask = !role_without_mask && (o.requests.empty() || o.requests.back().kind == SpecKind::kNone);
  if (wants_mask && (o.pid_mode ? o.positionals.size() == 2 : !o.positionals.empty()))
    check(SpecKind::kTpcMask, o.positionals[0]);
}

// One MPS server serves one Unix user at a time: a client of another user
// waits, silently, until every client of the served user has exited (13 s
// instead of 0.25 s in one run; docs/hardware.md, "MPS"). Never silently:
// say so in one line, then wait or fail (NVTASKSET_MPS_OTHER_USER).
void check_mps_user(mps::OtherUsersCheck& check) {
  const ChoiceValue policy = choice(Option::kMpsOtherUser);
  if (policy.unknown)
    spdlog::warn("{}={}: unknown value ({}); using wait", option(Option::kMpsOtherUser).name, printable(policy.value),
                 option(Option::kMpsOtherUser).choices);
  for (const mps::Server& sv : check.servers()) {
    if (sv.clients == 0) continue;
    const std::string who = "the MPS server (pid " + std::to_string(sv.pid) + ") serves user " + user_name(sv.uid) +
                            " with " + std::to_string(sv.clients) + " client" + (sv.clients == 1 ? "" : "s");
    if (policy.index == 1)
      throw Failure(who + ": this task would wait until they exit; not started (" +
                    option(Option::kMpsOtherUser).name + "=fail; --no-mps runs it time-sliced instead)");
    spdlog::warn("{}: this task waits until they exit ({}=fail refuses instead, --no-mps runs it time-sliced)", who,
                 option(Option::kMpsOtherUser).name);
    return;
  }
}

// What is left to a best-effort task while latency-critical tasks are
// busy (its floor) must not be empty: it would have nowhere to run. So a
// reservation that would leave a live best-effort task no TPC is refused,
// and so is a best-effort partition inside the reservations.
void check_roles(roles::Role role, const std::vector<Choice>& chosen, const Sharing& sh, Devices& devices) {
  if (role == roles::Role::kNone) return;
  const std::vector<ctl::StatusEntry>& all = sh.all;
  for (const Choice& c : chosen) {
    const topo::Topology* t = devices.known_topology(*c.dev);
    const LogicalTpcSet mine = logical_view(c.partition, t);
    LogicalTpcSet reserved;  // every latency-critical reservation on the GPU
    std::vector<const ctl::StatusEntry*> best_effort;
    for (const ctl::StatusEntry& e : all) {
      if (sh.exclude.count(e.pid)) continue;
      for (const DevicePartition& dp : e.partitions) {
        if (!dp.partition.active() || (dp.device != c.dev->uuid && dp.device != kAnyDevice)) continue;
        if (e.role == roles::Role::kLatencyCritical) reserved.bits = reserved.bits | logical_view(dp.partition, t).bits;
        if (e.role == roles::Role::kBestEffort) best_effort.push_back(&e);
      }
    }
    if (role == roles::Role::kBestEffort) {
      if ((mine.bits & ~reserved.bits).none())
        throw Failure("--best-effort: every TPC of " + format_list(mine.bits) + " of " + device_label(*c.dev) +
                      " is reserved by a latency-critical task: it would have nowhere to run while they are busy");
      continue;
    }
    reserved.bits = reserved.bits | mine.bits;
    for (const ctl::StatusEntry* e : best_effort)
      for (const DevicePartition& dp : e->partitions)
        if (dp.partition.active() && (dp.device == c.dev->uuid || dp.device == kAnyDevice) &&
            (logical_view(dp.partition, t).bits & ~reserved.bits).none())
          throw Failure("--latency-critical: with TPCs " + format_list(mine.bits) + " reserved, best-effort pid " +
                        std::to_string(e->pid) + " would have no TPC of " + device_label(*c.dev) +
                        " left while latency-critical tasks are busy");
  }
}

int do_launch(const Options& o, const std::vector<std::string>& env) {
  std::vector<Request> requests = o.requests;
  std::size_t first_cmd = 0;
  const bool mask_first = !o.positionals.empty() && o.positionals.size() > 1 &&
                          (o.positionals[0].starts_with("0x") || o.positionals[0].starts_with("0X"));
  if (requests.empty() && o.role == roles::Role::kBestEffort && !mask_first) {
    // Best-effort without a list: every TPC, from which it makes way.
    requests.push_back({"", SpecKind::kTpcList, "", "", true});
  } else if (requests.empty() && o.role == roles::Role::kLatencyCritical && !mask_first) {
    throw Failure("--latency-critical needs the TPCs to reserve: -n COUNT, -t LIST, -g LIST or a MASK");
  } else if (requests.empty()) {
    if (o.positionals.empty()) throw Failure("no TPC mask or list given (see --help)");
    requests.push_back({"", SpecKind::kTpcMask, o.positionals[0], ""});
    first_cmd = 1;
  } else if (requests.back().kind == SpecKind::kNone) {
    // "-d X" last, with the mask as the first positional.
    if (o.positionals.empty()) throw Failure("no TPC mask or list given for device " + printable(requests.back().device));
    requests.back().kind = SpecKind::kTpcMask;
    requests.back().text = o.positionals[0];
    first_cmd = 1;
  }
  std::vector<std::string> cmd(o.positionals.begin() + static_cast<long>(first_cmd), o.positionals.end());
  if (cmd.empty()) throw Failure("no command given (see --help)");
  // Up front, before anything is planned or published: a program the shim
  // cannot be loaded into (exec_check.hpp). One that cannot be found is
  // left to exec, whose error (and 127) is the user's.
  if (const std::string prog = resolve_command(cmd[0], env); !prog.empty())
    if (const std::string why = secure_execution_reason(prog); !why.empty()) throw Failure(why);

  const std::string& shim_dir = o.shim_dir;
  if (shim_dir.empty())
    throw Failure("cannot find the shim libcuda.so.1 (looked in ../" NVTASKSET_SHIM_RELDIR
                  " next to nvtaskset; set NVTASKSET_SHIM_DIR)");
  refuse_preloaded_driver(env);
  // Whom the MPS server serves is asked now and read once the partition is
  // planned: the control program's run overlaps the planning (which hid most
  // of its 0.7 ms on an H100 and an H200; docs/results.md, Fig. 11a).
  // The environment it inherits is the daemon's: without the shim, and
  // before the driver query changes CUDA_MPS_PIPE_DIRECTORY.
  std::optional<mps::OtherUsersCheck> users_check;
  if (!o.no_mps) {
    scrub_shim_environment(shim_dir);
    users_check.emplace();
  }
  Devices devices(shim_copies(shim_dir), o.topology_file);
  if (requests.size() > ctl::kMaxDevices)
    throw Failure("at most " + std::to_string(ctl::kMaxDevices) + " GPUs can be partitioned per task");
  Sharing sh = sharing_for(o, {::getpid()});
  std::vector<std::string> warnings;  // printed once every check passed
  auto plan = [&] {
    std::vector<Choice> chosen;
    for (const Request& r : requests) {
      if (r.kind == SpecKind::kNone) throw Failure("-d " + printable(r.device) + " has no TPC or GPC list");
      const topo::DeviceInfo& dev = devices.select(r.device);
      for (const Choice& prev : chosen)
        if (prev.dev->uuid == dev.uuid) throw Failure("two partitions given for " + device_label(dev));
      chosen.push_back({&dev, build_partition(r, dev, devices, &warnings, sh)});
    }
    return chosen;
  };
  std::vector<Choice> chosen = plan();
  check_roles(o.role, chosen, sh, devices);
  devices.restore_environment();
  if (users_check) {
    const mps::EnsureResult r = mps::ensure_daemon();
    if (r.started) std::fprintf(stderr, "%s\n", mps::started_message(r).c_str());
    check_mps_user(*users_check);
  }
  // The public entry, before exec (which keeps the PID and start time): the
  // next `-n` must see these TPCs taken even before the task loads CUDA.
  auto entry = [](const std::vector<Choice>& c) {
    std::vector<DevicePartition> parts;
    for (const Choice& x : c) parts.push_back({x.dev->uuid, x.partition, describe_device(*x.dev)});
    return parts;
  };
  // Without its entry the task is invisible to every other chooser, which
  // may then take its TPCs (any user can fill /dev/shm). --exclusive
  // promises TPCs no one else takes, so it fails closed; other launches run
  // and say once that they are unlisted.
  std::string unlisted;
  const Claim claim{plan,
                    [&](const std::vector<Choice>& c) {
                      const std::string why = ctl::publish_status(::getpid(), entry(c), o.role);
                      if (why.empty()) {
                        unlisted.clear();
                        return;
                      }
                      if (o.exclusive)
                        throw Failure("cannot publish the status entry that shows other choosers these TPCs (" +
                                      printable(why, 160) + "); --exclusive starts no task they cannot see");
                      unlisted = why;
                    },
                    [] { ctl::withdraw_status(::getpid()); }};
  chosen = settle(sh, devices, claim, std::move(chosen), &warnings);
  const std::vector<DevicePartition> parts = entry(chosen);
  // Warnings only once nothing can refuse the launch any more: a refusal
  // stays one line.
  for (const std::string& w : warnings) spdlog::warn("{}", w);
  if (!unlisted.empty())
    spdlog::warn("this task has no status entry ({}): --status does not list it, and other -n or --exclusive "
                 "launches may choose its TPCs",
                 printable(unlisted, 160));
  TaskRole tr;
  tr.role = o.role;
  if (o.role == roles::Role::kLatencyCritical) {
    // What it may burst onto: every working TPC of each of its GPUs (the
    // shim takes away what other partitions hold, as they come and go).
    std::vector<DevicePartition> pool;
    for (const Choice& c : chosen) {
      const topo::Topology& t = devices.topology(*c.dev);
      Partition whole;
      whole.kind = SpecKind::kTpcList;
      whole.tpcs = topo::all_tpcs(t);
      whole.enabled = topo::to_physical(t, whole.tpcs);
      pool.push_back({c.dev->uuid, whole, describe_device(*c.dev)});
    }
    tr.burst_pool = encode_partitions(pool);
  }
  exec_task(cmd, task_environment(env, shim_dir, encode_partitions(parts), devices.driver_path(),
                                  o.partition_sm_count, !o.no_mps, tr));
}

// --verify (verify.hpp) checks partitions of its own on one GPU.
int do_verify(const Options& o) {
  if (o.pid_mode || o.show_topology || o.calibrate || o.json || !o.system_wide.empty() || !o.positionals.empty() ||
      o.status || o.all_tasks || o.exclusive || o.spread)
    throw Failure("--verify takes only -d, --seed and --topology-file");
  if (o.requests.size() > 1 || (o.requests.size() == 1 && o.requests[0].kind != SpecKind::kNone))
    throw Failure("--verify checks partitions of its own: give it no TPC or GPC list or mask");
  return verify::run({o.requests.empty() ? "" : o.requests[0].device, o.seed, o.topology_file, o.shim_dir});
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
                " SMs, but " + phrase(next) + " can host at most " + std::to_string(next.max_cluster) +
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
  std::vector<std::string> warnings;  // printed once every check passed
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

// The parent of `pid`, its parent, ... up to (not including) init.
std::vector<pid_t> ancestors(pid_t pid) {
  std::vector<pid_t> out;
  for (int depth = 0; depth < 64; ++depth) {
    pid = ctl::parent_pid(pid);
    if (pid <= 1) break;
    out.push_back(pid);
  }
  return out;
}

// Checks one task and works out its change; writes nothing. With `like`,
// the task gets `like`'s new partitions (-a: the family follows its root).
TaskPlan plan_task(const Options& o, pid_t pid, std::unique_ptr<ctl::Region> region,
                   const std::vector<Request>& requests, Devices& devices, Sharing& sh, const TaskPlan* like) {
  TaskPlan plan{pid, std::move(region), {}, {}};
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
    Step st{&dev, {}, {}, r.kind, r.kind != SpecKind::kNone};
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
    // A query answers in the terms the partition was set in; a change in
    // the terms of the new value.
    if (st.form == SpecKind::kNone && !o.show.empty())
      st.form = o.show == "mask"       ? SpecKind::kTpcMask
                : o.show == "gpcs"     ? SpecKind::kGpcList
                : o.show == "physical" ? SpecKind::kPhysical
                                       : SpecKind::kTpcList;
    if (st.form == SpecKind::kNone)
      st.form = st.cur.kind == SpecKind::kPhysical || st.cur.kind == SpecKind::kGpcList ? st.cur.kind
                                                                                         : SpecKind::kTpcList;
    if (st.change) {
      if (like != nullptr) {
        st.next = like->steps[i].next;
      } else {
        // -n on a live task keeps what it can of its current TPCs.
        if (st.cur.active()) sh.keep[dev.uuid] = st.cur.tpcs;
        st.next = build_partition(r, dev, devices, &plan.warnings, sh);
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
  j["kind"] = form_name(shown_form(st.cur, st.form));
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

// Prints a planned query or applies a planned change, taskset's way.
void carry_out(const TaskPlan& plan, bool query, Devices& devices) {
  const pid_t pid = plan.pid;
  for (const Step& st : plan.steps) {
    const std::string dev_note = plan.steps.size() > 1 ? " on " + device_label(*st.dev) : std::string();
    if (!st.change) {
      std::printf("pid %d's current %s%s: %s\n", pid, form_name(shown_form(st.cur, st.form)), dev_note.c_str(),
                  describe(st.cur, st.form, *st.dev, devices).c_str());
      continue;
    }
    const std::string before = describe(st.cur, st.form, *st.dev, devices);
    plan.region->write({st.dev->uuid, st.next, describe_device(*st.dev)});
    std::printf("pid %d's current %s%s: %s\n", pid, form_name(shown_form(st.cur, st.form)), dev_note.c_str(),
                before.c_str());
    std::printf("pid %d's new %s%s: %s\n", pid, form_name(st.form), dev_note.c_str(),
                describe(st.next, st.form, *st.dev, devices).c_str());
  }
  if (!query) {
    test_die_at("written");
    // The public entry follows the region. Should that fail, the claim
    // published before the change stays: it holds the old and the new TPCs,
    // so no chooser takes either, and the next reader that can attach the
    // region repairs it (repair_entry).
    if (const std::string why = ctl::publish_status(pid, plan.region->read_all(), role_in(*plan.region)); !why.empty())
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

int do_pid(const Options& o) {
  std::vector<Request> requests = o.requests;
  std::vector<std::string> pos = o.positionals;
  if (requests.empty() && pos.size() == 2) {
    requests.push_back({"", SpecKind::kTpcMask, pos[0], ""});
    pos.erase(pos.begin());
  } else if (!requests.empty() && requests.back().kind == SpecKind::kNone && pos.size() == 2) {
    requests.back().kind = SpecKind::kTpcMask;
    requests.back().text = pos[0];
    pos.erase(pos.begin());
  }
  if (pos.size() != 1) throw Failure("-p takes [MASK | -t LIST | -g LIST | -n COUNT | --physical MASK] PID (see --help)");
  const pid_t pid = parse_pid(pos[0]);
  if (requests.empty()) requests.push_back({"", SpecKind::kNone, "", ""});
  const bool query = requests.size() == 1 && requests[0].kind == SpecKind::kNone;
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
    for (pid_t a : ancestors(pid)) family_pids.insert(a);
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
  Sharing sh = query ? Sharing{} : sharing_for(o, family_pids);
  Devices devices(shim_copies(o.shim_dir), o.topology_file);

  // Every task and every request is checked before anything is written: a
  // change is all or nothing.
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
  // A task's entry as its region has it, or (planned) the claim of the
  // change: on each GPU it changes, the TPCs it has AND those it gets. The
  // claim goes out before the region is written, so at every step the entry
  // covers what the task runs on: a -p killed before it publishes the final
  // entry leaves other choosers avoiding both, never taking the old TPCs the
  // task still runs on (docs/design.md, "Sharing a GPU"). "" or why not.
  auto republish = [&](const TaskPlan& p, bool planned) {
    std::vector<DevicePartition> parts = p.region->read_all();
    for (const Step& st : p.steps) {
      if (!planned || !st.change) continue;
      DevicePartition next{st.dev->uuid, st.next, describe_device(*st.dev)};
      auto it = std::find_if(parts.begin(), parts.end(), [&](const DevicePartition& d) { return d.device == next.device; });
      if (it != parts.end()) {
        next.partition = claim_union(it->partition, st.next);
        *it = next;
      } else {
        parts.push_back(next);
      }
    }
    return ctl::publish_status(p.pid, parts, role_in(*p.region));
  };
  std::vector<std::string> raced;  // said when choices kept racing
  if (!query) {
    const Claim claim{plan,
                      [&](const std::vector<Choice>&) {
                        for (std::size_t i = 0; i < plans.size(); ++i) {
                          const std::string why = republish(plans[i], true);
                          if (why.empty()) continue;
                          // Fail closed: a change other choosers cannot see is not made.
                          for (std::size_t j = 0; j < i; ++j) republish(plans[j], false);
                          throw Failure("pid " + std::to_string(plans[i].pid) +
                                        ": cannot publish its status entry, so other choosers could not see the "
                                        "change (" + printable(why, 160) + "); not changed");
                        }
                      },
                      [&] {
                        for (const TaskPlan& p : plans) republish(p, false);
                      }};
    chosen = settle(sh, devices, claim, std::move(chosen), &raced);
    test_die_at("claimed");
  } else {
    // A query by the task's user or root also repairs what a killed -p left.
    for (ctl::StatusEntry& e : ctl::read_status())
      for (TaskPlan& p : plans)
        if (e.pid == p.pid) repair_entry(e, *p.region);
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
    for (const std::string& w : p.warnings) spdlog::warn("{}", w);
  for (const std::string& w : raced) spdlog::warn("{}", w);
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

// --help, as taskset's usage(): one usage block, what the arguments mean,
// the options (CLI11 formats those), examples that teach, the environment.
const char* kUsage =
    "Usage:\n"
    "  nvtaskset [options] MASK COMMAND [ARG...]\n"
    "  nvtaskset [options] -t LIST COMMAND [ARG...]\n"
    "  nvtaskset [options] -g LIST COMMAND [ARG...]\n"
    "  nvtaskset [options] -n COUNT [--spread] [--exclusive] COMMAND [ARG...]\n"
    "  nvtaskset [options] (-n COUNT | -t LIST | -g LIST) --latency-critical COMMAND [ARG...]\n"
    "  nvtaskset [options] [-n COUNT | -t LIST | -g LIST] --best-effort COMMAND [ARG...]\n"
    "  nvtaskset -p [-a] [MASK | -t LIST | -g LIST | -n COUNT | --physical MASK] PID\n"
    "  nvtaskset -p [-a] [--show list|mask|gpcs|physical | --json] PID\n"
    "  nvtaskset --status [--json]\n"
    "  nvtaskset --topology [--json] | --calibrate [--json] | --system-wide enable|disable|status\n"
    "  nvtaskset --verify [-d DEV] [--seed N]\n";

const char* kDescription =
    "Run a command on a chosen set of GPU TPCs, or change the TPCs of a running process.\n"
    "\n"
    "MASK is a hexadecimal enable mask over logical TPC IDs (0xff00 = TPCs 8-15).\n"
    "LIST uses taskset's syntax: 0-7,12,20-31:2. Logical TPC k is the pair of SMs\n"
    "whose %smid is 2k and 2k+1. The command runs as an MPS client (nvtaskset starts\n"
    "the MPS control daemon if none runs) with CUDA_DEVICE_MAX_CONNECTIONS=8 (the\n"
    "kernel queues of a plain process) and CUDA_DEVICE_MAX_COPY_CONNECTIONS=2.\n";

const char* kExamples =
    "Examples:\n"
    "  nvtaskset -t 0-7 ./detector           run on TPCs 0-7\n"
    "  nvtaskset 0xff00 ./planner            a hex mask over TPC IDs: TPCs 8-15\n"
    "  nvtaskset -g 1-2 python3 train.py     every TPC of GPCs 1 and 2\n"
    "  nvtaskset -n 16 ./detector            16 TPCs chosen for you: whole GPCs first\n"
    "  nvtaskset -n 16 --exclusive ./planner 16 TPCs no other live partition holds, or fail\n"
    "  nvtaskset -n 16 --partition-sm-count ./gemm\n"
    "                                        the task sees 32 SMs, so persistent grids fit them\n"
    "  nvtaskset -n 16 --latency-critical ./server\n"
    "                                        16 TPCs reserved; the whole GPU while it has work\n"
    "  nvtaskset --best-effort python3 train.py\n"
    "                                        every TPC, making way while the server has work\n"
    "  nvtaskset --status                    every partitioned task: who holds which TPCs\n"
    "  nvtaskset -d 1 -t 0-15 ./task         on GPU 1 (index, UUID or PCI bus id)\n"
    "  nvtaskset -p 4242                     show pid 4242's TPCs\n"
    "  nvtaskset -p -t 0-3 4242              move pid 4242 to TPCs 0-3, live\n"
    "  nvtaskset -p -n 8 4242                shrink pid 4242 to 8 TPCs, keeping TPCs it has\n"
    "  nvtaskset -a -p -t 0-7 4242           pid 4242 and every process it started\n"
    "  nvtaskset -p --show mask 4242         the same, as a hex mask over TPC IDs\n"
    "  nvtaskset -p --json 4242              the same query as JSON, with graph and cluster counts\n"
    "  nvtaskset --topology                  GPCs, TPCs and mask bits of each GPU\n"
    "  nvtaskset --verify                    check on GPU 0 that kernels run on exactly their TPCs\n";

// The environment block of --help, from the one table of options.
std::string environment_help() {
  std::string out = "Environment (see nvtaskset(1)):\n";
  for (const OptionDesc& d : kOptions) {
    if (!d.for_users || d.kind == OptionKind::kInternal) continue;
    out += std::string("  ") + d.name;
    if (d.kind == OptionKind::kChoice) out += std::string("=") + d.choices;
    if (d.kind == OptionKind::kNumber) out += std::string("=N (") + d.choices + ")";
    out += std::string("\n      ") + d.help + "\n";
  }
  return out + "  CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY\n      where the MPS daemon is looked for and started\n";
}

// Usage block first, then the description, the options and the examples.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode mode) const override {
    return std::string(kUsage) + "\n" + kDescription + "\n" + make_groups(app, mode) + "\n" + kExamples + "\n" +
           environment_help();
  }
};

// What a bug report needs: the version, the CUDA driver API version it was
// built against (its own declarations, cudaapi/), and the control-region
// protocol it speaks.
std::string version_text() {
  const int cuda = CUDA_VERSION;
  return std::string("nvtaskset ") + NVTASKSET_VERSION + "\nbuilt against CUDA driver API " + std::to_string(cuda / 1000) +
         "." + std::to_string(cuda % 1000 / 10) + " (CUDA_VERSION " + std::to_string(cuda) +
         "), control region version " + std::to_string(ctl::kVersion);
}

}  // namespace

std::string find_shim_dir(const std::string& exe_path) {
  if (const char* d = option_value(Option::kShimDir)) {
    return fs::exists(fs::path(d) / "libcuda.so.1") ? std::string(d) : std::string();
  }
  if (exe_path.empty()) return "";
  const fs::path dir = fs::path(exe_path).parent_path().parent_path() / NVTASKSET_SHIM_RELDIR;
  std::error_code ec;
  if (!fs::exists(dir / "libcuda.so.1", ec)) return "";
  return fs::weakly_canonical(dir, ec).string();
}

// CUDA's own variables for the number of hardware queues (connections).
constexpr const char* kConnectionsEnv = "CUDA_DEVICE_MAX_CONNECTIONS";
constexpr const char* kCopyConnectionsEnv = "CUDA_DEVICE_MAX_COPY_CONNECTIONS";

std::vector<std::string> task_environment(std::vector<std::string> env, const std::string& shim_dir,
                                          const std::string& partitions, const std::string& real_driver,
                                          bool partition_sm_count, bool mps_client, const TaskRole& role) {
  auto find = [&](const std::string& name) -> std::string* {
    for (auto& e : env)
      if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=') return &e;
    return nullptr;
  };
  auto set = [&](const std::string& name, const std::string& value) {
    if (std::string* e = find(name)) *e = name + "=" + value;
    else env.push_back(name + "=" + value);
  };
  set(kPartitionEnv, partitions);
  set(kPartitionPidEnv, std::to_string(::getpid()));  // exec keeps our PID
  std::erase_if(env, [](const std::string& e) {
    for (const Option o : {Option::kRole, Option::kBurstPool}) {
      const std::string name = std::string(option(o).name) + "=";
      if (e.starts_with(name)) return true;
    }
    return false;
  });
  if (role.role != roles::Role::kNone) set(option(Option::kRole).name, roles::role_name(role.role));
  if (!role.burst_pool.empty()) set(option(Option::kBurstPool).name, role.burst_pool);
  // Prepend, never overwrite: the task may need its own library path.
  if (std::string* e = find("LD_LIBRARY_PATH"); e && e->size() > std::strlen("LD_LIBRARY_PATH=")) {
    *e = "LD_LIBRARY_PATH=" + shim_dir + ":" + e->substr(std::strlen("LD_LIBRARY_PATH="));
  } else {
    set("LD_LIBRARY_PATH", shim_dir);
  }
  // And preload it: a wrapper script, a conda activation or a container
  // entry point that replaces LD_LIBRARY_PATH would otherwise drop the shim,
  // and the task would find the real driver and run on all TPCs. The
  // preloaded shim registers the soname libcuda.so.1, so the program's own
  // libcuda.so.1 (linked or dlopen()ed) is the shim; in a process that never
  // calls the driver it does nothing (shim.cpp, shim_constructor).
  const std::string shim = shim_dir + "/libcuda.so.1";
  if (std::string* e = find("LD_PRELOAD"); e && e->size() > std::strlen("LD_PRELOAD=")) {
    const std::vector<std::string> items = loader_list(std::string_view(*e).substr(std::strlen("LD_PRELOAD=")));
    if (std::find(items.begin(), items.end(), shim) == items.end())
      *e = "LD_PRELOAD=" + shim + ":" + e->substr(std::strlen("LD_PRELOAD="));
  } else {
    set("LD_PRELOAD", shim);
  }
  // An AddressSanitizer-instrumented program refuses to start when any
  // library precedes its runtime in the load order ("ASan runtime does not
  // come first in initial library list"), as a preloaded one does: every
  // such program under nvtaskset stopped (seen in CI's sanitizer build). The
  // check guards against a library that interposes what ASan intercepts
  // (malloc, ...); the shim exports only the driver's cu* names, so it is
  // turned off, unless the user chose otherwise.
  if (std::string* e = find("ASAN_OPTIONS"); e && e->size() > std::strlen("ASAN_OPTIONS=")) {
    if (e->find("verify_asan_link_order") == std::string::npos) *e += ":verify_asan_link_order=0";
  } else {
    set("ASAN_OPTIONS", "verify_asan_link_order=0");
  }
  // An MPS client's kernels share 2 hardware queues by default, so its
  // streams falsely wait for each other; CUDA_DEVICE_MAX_CONNECTIONS=8 gives it
  // the 8 a plain process has. That variable alone also sets 8 copy queues.
  // Each queue costs an MPS client 5-12 ms of start-up in the kernel driver
  // (RM allocations and UVM channel registration; strace on an H100, run
  // 17), more than it costs a plain process. With the GPU held open, a task
  // given 4 copy queues (a plain process's) started at 1.07-1.12x a plain
  // process, with 2 at 0.93-0.95x (H100 and H200, runs 15-17). Copy
  // pipelines overlapping kernels on 2-16 streams ran as fast with 2 copy
  // queues as with 4, or 1 (run 17); only a copy stuck behind a wait for
  // another stream's event holds up more of the others (docs/hardware.md
  // "MPS"). A user's choice of either is kept:
  // CUDA_DEVICE_MAX_CONNECTIONS alone then sets the copy queues too, as in
  // CUDA. Outside MPS, CUDA's default already gives 8 kernel queues (and the
  // 4 copy queues any plain process has), so a --no-mps task is left as it
  // is: it starts and runs as the same program would alone.
  if (mps_client) {
    const bool chose_connections = find(kConnectionsEnv) != nullptr;
    const bool chose_copy = find(kCopyConnectionsEnv) != nullptr;
    if (!chose_connections) set(kConnectionsEnv, "8");
    if (!chose_connections && !chose_copy) set(kCopyConnectionsEnv, "2");
  }
  if (!real_driver.empty()) set(kRealDriverEnv, real_driver);
  if (partition_sm_count) set(option(Option::kSmCount).name, "partition");
  return env;
}

int run(int argc, char** argv) {
  // The environment the task gets is the one we were started with, before
  // anything here (the driver query sets CUDA_MPS_PIPE_DIRECTORY) touches it.
  const std::vector<std::string> env = snapshot_environ();
  setup_logging();

  CLI::App app{kDescription, "nvtaskset"};
  app.set_version_flag("-V,--version", version_text());
  Options o;
  std::vector<std::string> tpc_lists, gpc_lists, physicals, device_specs, counts;
  auto one_each = [](CLI::Option* opt) {
    return opt->allow_extra_args(false)->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  };
  auto* opt_t = one_each(app.add_option("-t,--tpc-list", tpc_lists, "logical TPC list, e.g. 0-7,12"))->type_name("LIST");
  auto* opt_g = one_each(app.add_option("-g,--gpc-list", gpc_lists, "GPC list: all TPCs of these GPCs"))->type_name("LIST");
  auto* opt_n = one_each(app.add_option("-n,--count", counts,
                                        "COUNT TPCs chosen for you: whole GPCs first (see --spread), avoiding TPCs "
                                        "other live partitions hold"))
                    ->type_name("COUNT");
  app.add_flag("--spread", o.spread, "with -n: spread the TPCs evenly over the GPCs instead of packing them");
  app.add_flag("--exclusive", o.exclusive,
               "fail if the partition would share TPCs with another live partition on the GPU, or if its "
               "status entry cannot be written (other launches could not see it)");
  app.add_flag("--latency-critical", o.latency_critical,
               "reserve the TPCs given (-n, -t, -g or a mask) for the command, exclusively but for best-effort "
               "tasks, which make way while it has work; it may use every TPC no other partition holds while it "
               "has work");
  app.add_flag("--best-effort", o.best_effort,
               "run the command on all TPCs (or those given) while every latency-critical task is idle; while one "
               "has work, its new kernels wait, or run on the TPCs no reservation holds; it keeps at most "
               "NVTASKSET_BE_DEPTH launches queued");
  app.add_flag("-a,--all-tasks", o.all_tasks, "with -p: the task and every process it started that runs under nvtaskset");
  app.add_flag("--status", o.status, "list every partitioned task on this machine (with --json: as JSON)");
  app.add_flag("-v,--verbose", o.verbose, "say which TPCs -n chose");
  app.add_flag("--partition-sm-count,--hide-unallocated", o.partition_sm_count,
               "the task's cuDeviceGetAttribute(MULTIPROCESSOR_COUNT) reports its partition's SMs, not the GPU's, so "
               "grids sized by SM count fit the partition (read once by most libraries: a later -p does not change "
               "what the task already read)");
  auto* opt_phys = one_each(app.add_option("--physical", physicals,
                                           "UNSAFE expert mode: enable mask over raw TMD mask bits, untranslated; a "
                                           "mask that enables no working TPC hangs every kernel"))
                       ->type_name("MASK");
  auto* opt_d = one_each(app.add_option("-d,--device", device_specs,
                                        "GPU by index, UUID or PCI bus id (default 0); applies to the list after it"))
                    ->type_name("DEV");
  app.add_flag("-p,--pid", o.pid_mode, "query or change the TPCs of the running process PID");
  app.add_flag("--no-mps", o.no_mps, "do not start or require the MPS control daemon");
  app.add_flag("--topology", o.show_topology, "print each GPU's GPCs, TPCs, SMs and mask bits");
  app.add_flag("--json", o.json, "with --topology, --calibrate, --status or a -p query: print JSON");
  app.add_flag("--calibrate", o.calibrate, "(re)discover the layout of every visible GPU");
  app.add_option("--show", o.show,
                 "with a -p query: print the TPCs as a list, a hex mask, GPCs (when set as GPCs) or physical "
                 "mask bits, whatever form the partition was set in")
      ->type_name("list|mask|gpcs|physical")
      ->check(CLI::IsMember({"list", "mask", "gpcs", "physical"}));
  app.add_option("--topology-file", o.topology_file, "use this topology JSON instead of calibrating")
      ->type_name("FILE")
      ->envname(option(Option::kTopology).name);
  app.add_option("--system-wide", o.system_wide,
                 "enable: make every CUDA process load the shim with no partition, so -p can move it; "
                 "disable: undo; status: show")
      ->type_name("enable|disable|status")
      ->check(CLI::IsMember({"enable", "disable", "status"}));
  app.add_flag("--verify", o.verify,
               "check on the GPU, through the shim, that kernels run on exactly their TPCs (20 random TPC lists, "
               "each GPC); exit 2 if not");
  app.add_option("--seed", o.seed, "with --verify: seed of the random TPC lists (default: random, printed)")
      ->type_name("N");
  app.formatter(std::make_shared<HelpFormatter>());
  app.prefix_command();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11 quotes the offending argument as typed.
    std::fprintf(stderr, "nvtaskset: %s\n", one_line(e.what()).c_str());
    return 1;
  }

  try {
    // Pair each list with the -d that precedes it.
    std::size_t it = 0, ig = 0, ip = 0, id = 0, in = 0;
    std::string device;
    for (const CLI::Option* opt : app.parse_order()) {
      if (opt == opt_d) {
        if (!o.requests.empty() && o.requests.back().kind == SpecKind::kNone)
          throw Failure("-d " + printable(o.requests.back().device) + " has no TPC or GPC list");
        device = device_specs[id++];
        check_device_spec(device);
        o.requests.push_back({device, SpecKind::kNone, "", ""});
        continue;
      }
      Request r{device, SpecKind::kNone, "", ""};
      if (opt == opt_t) r = {device, SpecKind::kTpcList, tpc_lists[it++], ""};
      else if (opt == opt_g) r = {device, SpecKind::kGpcList, gpc_lists[ig++], ""};
      else if (opt == opt_phys) r = {device, SpecKind::kPhysical, physicals[ip++], ""};
      else if (opt == opt_n) r = {device, SpecKind::kTpcList, "", counts[in++]};
      else continue;
      if (!o.requests.empty() && o.requests.back().kind == SpecKind::kNone && o.requests.back().device == device)
        o.requests.back() = r;
      else
        o.requests.push_back(r);
    }
    o.positionals = app.remaining();
    // prefix_command() passes unknown options through with the command;
    // one before the first positional is a mistake, not the command.
    if (!o.positionals.empty() && o.positionals.front() == "--") {
      o.positionals.erase(o.positionals.begin());
    } else if (!o.positionals.empty() && o.positionals.front().size() > 1 && o.positionals.front()[0] == '-') {
      throw Failure("unrecognized option '" + printable(o.positionals.front()) + "' (see --help)");
    }

    if (o.latency_critical && o.best_effort) throw Failure("--latency-critical and --best-effort exclude each other");
    o.role = o.latency_critical ? roles::Role::kLatencyCritical
             : o.best_effort    ? roles::Role::kBestEffort
                                : roles::Role::kNone;
    if (o.role != roles::Role::kNone &&
        (o.pid_mode || o.status || o.verify || o.show_topology || o.calibrate || !o.system_wide.empty()))
      throw Failure(std::string("--") + roles::role_name(o.role) + " goes with a launch: a task's role is set when "
                    "it starts");
    if (o.role == roles::Role::kBestEffort && o.exclusive)
      throw Failure("--best-effort and --exclusive exclude each other: a best-effort task shares its TPCs");
    if (!o.show.empty() && !o.pid_mode) throw Failure("--show goes with -p");
    if (o.seed && !o.verify) throw Failure("--seed goes with --verify");
    if (o.all_tasks && !o.pid_mode) throw Failure("-a goes with -p");
    if (o.spread && counts.empty()) throw Failure("--spread goes with -n");
    if (o.partition_sm_count && (o.pid_mode || o.status || o.verify || o.show_topology || o.calibrate ||
                                 !o.system_wide.empty()))
      throw Failure("--partition-sm-count goes with a launch: a running task has already read its SM count");
    if (o.status) {
      if (o.pid_mode || !o.requests.empty() || !o.positionals.empty())
        throw Failure("--status takes no list, PID or command");
      Devices devices(shim_copies(find_shim_dir(self_exe())), o.topology_file);
      return print_status(devices, o.json);
    }
    o.shim_dir = find_shim_dir(self_exe());
    if (o.verify) return do_verify(o);
    if (!o.system_wide.empty()) return system_wide(o.system_wide, o.shim_dir);
    if (o.show_topology || o.calibrate) {
      Devices devices(shim_copies(o.shim_dir), o.topology_file);
      return o.calibrate ? devices.calibrate_all(o.json) : devices.print(o.json);
    }
    check_syntax(o);
    if (o.pid_mode) return do_pid(o);
    if (o.json) throw Failure("--json goes with --topology, --calibrate, --status or -p");
    return do_launch(o, env);
  } catch (const std::exception& e) {
    // The last guard of the one-line contract: a message that quotes user
    // text (a device selector as topology/ echoes it, a path) never spans
    // lines or reaches the terminal raw.
    std::fprintf(stderr, "nvtaskset: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}

}  // namespace nvtaskset::cli
