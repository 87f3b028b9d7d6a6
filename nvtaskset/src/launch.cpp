// SPDX-License-Identifier: Apache-2.0
// nvtaskset [options] LIST COMMAND: a launch. The pipeline:
//   1. parse: the requests arrive parsed (cli.cpp); here the first
//      positional becomes the mask or the command;
//   2. plan: each request becomes a partition of its GPU (planner.hpp);
//   3. claim: the choice is published as this process's status entry and
//      settled against racing choosers (claim.hpp), before exec, which keeps
//      the PID;
//   4. deliver: the partition travels to the task in NVTASKSET_PARTITION,
//      and the command is exec'd with the shim in its environment.
// (A launch has nothing to read back: the task's shim makes its control
// region from what it was given.)
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include "command.hpp"
#include "nvtaskset/claim.hpp"
#include "nvtaskset/cli.hpp"
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/devices.hpp"
#include "nvtaskset/driver_locate.hpp"
#include "nvtaskset/exec_check.hpp"
#include "nvtaskset/idlist.hpp"
#include "nvtaskset/mps.hpp"
#include "nvtaskset/planner.hpp"
#include "nvtaskset/proc.hpp"
#include "nvtaskset/sharing.hpp"
#include "nvtaskset/spawn.hpp"
#include "nvtaskset/status.hpp"

namespace nvtaskset::cli {
namespace {

using planner::Choice;
using planner::Request;
using planner::RequestKind;

// The separators ld.so splits its lists at (glibc's rtld and dl-load; no
// escape exists): LD_PRELOAD at ' ' and ':', LD_LIBRARY_PATH at ':' and ';'.
constexpr std::string_view kPreloadSeparators = " :";
constexpr std::string_view kLibraryPathSeparators = ":;";

// The items of a loader list, as ld.so reads them; empty items dropped.
std::vector<std::string> loader_list(std::string_view value, std::string_view separators) {
  std::vector<std::string> out;
  std::string item;
  for (std::size_t i = 0; i <= value.size(); ++i) {
    if (i < value.size() && separators.find(value[i]) == std::string_view::npos) {
      item += value[i];
    } else if (!item.empty()) {
      out.push_back(std::move(item));
      item.clear();
    }
  }
  return out;
}

std::string_view separators_of(std::string_view var) {
  return var == "LD_PRELOAD" ? kPreloadSeparators : kLibraryPathSeparators;
}

// What LD_PRELOAD names the shim by: its path, or, where the path holds a
// character LD_PRELOAD splits at, its name, which ld.so looks up in
// LD_LIBRARY_PATH, where the shim's directory comes first. (A wrapper that
// replaces LD_LIBRARY_PATH then loses the shim, and --status says the task
// runs UNPARTITIONED.)
std::string shim_preload(const std::string& shim_dir) {
  return shim_dir.find_first_of(kPreloadSeparators) == std::string::npos ? shim_dir + "/libcuda.so.1"
                                                                        : std::string("libcuda.so.1");
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
    const std::string preload = shim_preload(shim_dir);
    for (const std::string& item : loader_list(v, separators_of(var))) {
      const bool shim = item == shim_dir || item.rfind(shim_dir + "/", 0) == 0 || item == preload;
      if (!shim) kept += (kept.empty() ? "" : ":") + item;
    }
    if (kept.empty()) ::unsetenv(var);
    else ::setenv(var, kept.c_str(), 1);
  }
}

// A CUDA driver named in LD_PRELOAD is loaded before anything else, so the
// task would bind libcuda.so.1 to it and never load the shim: every kernel
// on all TPCs while nvtaskset said otherwise. Refused, not silently fixed:
// the user asked for that preload. (The shim itself may be preloaded.)
void refuse_preloaded_driver(const std::vector<std::string>& env) {
  for (const auto& e : env) {
    if (!e.starts_with("LD_PRELOAD=")) continue;
    for (const std::string& item :
         loader_list(std::string_view(e).substr(std::strlen("LD_PRELOAD=")), kPreloadSeparators)) {
      // A bare name is searched like any library, and finds the shim first.
      // A path is judged by what the file is (its DT_SONAME), not its name:
      // a symlink or renamed copy of the driver is the driver.
      if (item.find('/') != std::string::npos && library_kind(item) == LibraryKind::kDriver)
        throw Failure("LD_PRELOAD names the CUDA driver (" + printable(item, 200) +
                      "): the task would load it instead of nvtaskset's shim and run on all TPCs; remove it");
    }
  }
}

// One MPS server serves one Unix user at a time: a client of another user
// waits, silently, until every client of the served user has exited
// (docs/hardware.md, "MPS"). Never silently: say so in one line, then wait
// or fail (NVTASKSET_MPS_OTHER_USER).
void check_mps_user(mps::OtherUsersCheck& check) {
  const OptionDesc& opt = option(Option::kMpsOtherUser);
  const auto policy = choice_of<Option::kMpsOtherUser>();
  if (policy.unknown)
    spdlog::warn("{}={}: unknown value ({}); using {}", opt.name, printable(policy.text), opt.choices,
                 default_choice_name<Option::kMpsOtherUser>());
  const bool fail = policy.value == MpsOtherUser::kFail;
  for (const mps::Server& sv : check.servers()) {
    if (sv.clients == 0) continue;
    // A daemon that serves every user (-M), found running without
    // --mps-multi-user, makes nobody wait: its one server is root's. Asked
    // only here, so a launch beside a single-user daemon is unchanged; a mode
    // that cannot be told keeps the line.
    if (mps::serves_every_user(mps::pipe_directory())) return;
    const std::string who = "the MPS server (pid " + std::to_string(sv.pid) + ") serves user " + user_name(sv.uid) +
                            " with " + std::to_string(sv.clients) + " client" + (sv.clients == 1 ? "" : "s");
    if (fail)
      throw Failure(who + ": this task would wait until they exit; not started (" + std::string(opt.name) +
                    "=fail; --no-mps runs it time-sliced instead)");
    spdlog::warn("{}: this task waits until they exit ({}=fail refuses instead, --no-mps runs it time-sliced)", who,
                 opt.name);
    return;
  }
}

[[noreturn]] void exec_task(const std::vector<std::string>& cmd, const std::vector<std::string>& env) {
  const process::ExecArgs args(cmd, env);
  std::fflush(nullptr);
  const int err = process::exec(args, /*search_path=*/true);
  std::fprintf(stderr, "nvtaskset: failed to execute %s: %s\n", printable(cmd[0], 200).c_str(), std::strerror(err));
  std::exit(err == ENOENT ? 127 : 126);
}

// --env-for: the process the claim is for. It must be alive, and ours
// unless we are root (a claim for another user's process would let one user
// take TPCs in another's name).
pid_t env_holder(pid_t pid) {
  const std::optional<uid_t> uid = ctl::process_uid(pid);
  if (pid <= 0 || !uid || ctl::process_is_zombie_or_dead(pid))
    throw Failure("--env-for " + std::to_string(pid) + ": no such process");
  if (::geteuid() != 0 && *uid != ::geteuid())
    throw Failure("--env-for " + std::to_string(pid) + ": the process belongs to another user; only its owner and root "
                  "can claim TPCs for it");
  return pid;
}

// CUDA's own variables for the number of hardware queues (connections), and
// an MPS client's priority (0 normal, 1 below normal; NVIDIA's MPS guide).
constexpr const char* kConnectionsEnv = "CUDA_DEVICE_MAX_CONNECTIONS";
constexpr const char* kCopyConnectionsEnv = "CUDA_DEVICE_MAX_COPY_CONNECTIONS";
constexpr const char* kClientPriorityEnv = "CUDA_MPS_CLIENT_PRIORITY";

// The MPS client priority of a task with a role.
const char* client_priority(roles::Role r) noexcept { return r == roles::Role::kBestEffort ? "1" : "0"; }

// The entry NAME=VALUE of variable `name` in `env`, or env.end().
auto entry_of(auto& env, std::string_view name) {
  return std::find_if(env.begin(), env.end(), [name](const std::string& e) {
    return e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=';
  });
}

// The value of variable `name` in `env`, if set.
std::optional<std::string_view> variable(const std::vector<std::string>& env, std::string_view name) {
  const auto e = entry_of(env, name);
  if (e == env.end()) return std::nullopt;
  return std::string_view(*e).substr(name.size() + 1);
}

// --env-for's output: each variable the task environment adds or changes,
// as NAME=VALUE, one a line (a value with a newline cannot be printed so).
void print_environment(const std::vector<std::string>& before, const std::vector<std::string>& after) {
  for (const std::string& e : after) {
    if (std::find(before.begin(), before.end(), e) != before.end()) continue;
    if (e.find('\n') != std::string::npos) throw Failure("a variable of the task environment spans lines");
    std::printf("%s\n", e.c_str());
  }
  std::fflush(stdout);
}

// --env-for --json: the same variables as an object, and the TPCs chosen on
// each GPU as `--status` lists them (logical IDs), for a launcher that must
// claim exactly those TPCs again later (the Kubernetes plugin, when the
// process holding a claim had to be replaced).
void print_environment_json(const std::vector<std::string>& before, const std::vector<std::string>& after,
                            const std::vector<Choice>& chosen, Devices& devices) {
  nlohmann::json vars = nlohmann::json::object();
  for (const std::string& e : after) {
    if (std::find(before.begin(), before.end(), e) != before.end()) continue;
    const auto eq = e.find('=');
    vars[e.substr(0, eq)] = eq == std::string::npos ? "" : e.substr(eq + 1);
  }
  nlohmann::json parts = nlohmann::json::array();
  for (const Choice& c : chosen) {
    const topo::Topology* t = devices.known_topology(*c.dev);
    if (t == nullptr) throw Failure("the TPC layout of " + planner::device_label(*c.dev) + " is unknown");
    parts.push_back({{"device", uuid_to_string(c.dev->uuid)},
                     {"gpu", c.dev->ordinal},
                     {"tpcs", format_list(topo::logical_of_physical(*t, c.partition.enabled).bits)}});
  }
  std::printf("%s\n", nlohmann::json({{"environment", vars}, {"partitions", parts}})
                             .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                             .c_str());
  std::fflush(stdout);
}

}  // namespace

int launch(const Options& o, const Requests& rq, const std::vector<std::string>& env) {
  const bool env_mode = o.env_for.has_value();
  const pid_t holder = env_mode ? env_holder(*o.env_for) : ::getpid();
  // 1. Parse: which positional is the mask. (--best-effort and
  // --latency-critical take one only when it starts with 0x.)
  std::vector<Request> requests = rq.lists;
  std::size_t first_cmd = 0;
  const bool mask_first = !o.positionals.empty() && o.positionals.size() > 1 &&
                          (o.positionals[0].starts_with("0x") || o.positionals[0].starts_with("0X"));
  auto lead_mask = [&](const std::string& device) {
    if (!rq.lead_mask) throw Failure("no TPC mask or list given (see --help)");
    Request m = *rq.lead_mask;
    m.device = device;
    return m;
  };
  if (requests.empty() && o.role == roles::Role::kBestEffort && !mask_first) {
    // Best-effort without a list: every TPC, from which it makes way.
    requests.push_back(planner::parse_request("", RequestKind::kAllTpcs, ""));
  } else if (requests.empty() && o.role == roles::Role::kLatencyCritical && !mask_first) {
    throw Failure("--latency-critical needs the TPCs to reserve: -n COUNT, -t LIST, -g LIST or a MASK");
  } else if (requests.empty()) {
    if (o.positionals.empty()) throw Failure("no TPC mask or list given (see --help)");
    requests.push_back(lead_mask(""));
    first_cmd = 1;
  } else if (requests.back().kind == RequestKind::kNone) {
    // "-d X" last, with the mask as the first positional.
    if (o.positionals.empty()) throw Failure("no TPC mask or list given for device " + printable(requests.back().device));
    requests.back() = lead_mask(requests.back().device);
    first_cmd = 1;
  }
  std::vector<std::string> cmd(o.positionals.begin() + static_cast<long>(first_cmd), o.positionals.end());
  if (cmd.empty() && !env_mode) throw Failure("no command given (see --help)");
  if (!cmd.empty() && env_mode) throw Failure("--env-for runs no command: it prints the environment of PID's tasks");
  // Up front, before anything is planned or published: a program the shim
  // cannot be loaded into (exec_check.hpp). One that cannot be found is
  // left to exec, whose error (and 127) is the user's.
  if (!cmd.empty())
    if (const std::string prog = resolve_command(cmd[0], env); !prog.empty())
      if (const std::string why = secure_execution_reason(prog); !why.empty()) throw Failure(why);

  const std::string& shim_dir = o.shim_dir;
  if (shim_dir.empty())
    throw Failure("cannot find the shim libcuda.so.1 (looked in ../" NVTASKSET_SHIM_RELDIR
                  " next to nvtaskset; set NVTASKSET_SHIM_DIR)");
  // LD_LIBRARY_PATH cannot name a directory that holds one of its
  // separators: the task would find the real driver and run on all TPCs.
  if (shim_dir.find_first_of(kLibraryPathSeparators) != std::string::npos)
    throw Failure("nvtaskset's shim directory " + printable(shim_dir, 200) +
                  " holds a ':' or ';', which LD_LIBRARY_PATH cannot name; "
                  "install nvtaskset under a path without them");
  refuse_preloaded_driver(env);
  // Whom the MPS server serves is asked now and read once the partition is
  // planned: the control program's run overlaps the planning (which hid most
  // of its 0.7 ms on an H100 and an H200; docs/results.md, Fig. 11a).
  // The environment it inherits is the daemon's: without the shim, and
  // before the driver query changes CUDA_MPS_PIPE_DIRECTORY.
  std::optional<mps::OtherUsersCheck> users_check;  // not needed where the daemon serves every user
  if (!o.no_mps) {
    scrub_shim_environment(shim_dir);
    if (!o.mps_multi_user) users_check.emplace();
  }
  Devices devices(shim_copies(shim_dir), o.topology_file);
  if (requests.size() > ctl::kMaxDevices)
    throw Failure("at most " + std::to_string(ctl::kMaxDevices) + " GPUs can be partitioned per task");

  // 2. Plan, against the public status of every other task.
  planner::Sharing sh = planner::read_sharing({o.spread, o.exclusive, o.role}, {holder});
  planner::Notes notes;  // warnings printed once every check passed
  auto plan = [&] {
    std::vector<Choice> chosen;
    for (const Request& r : requests) {
      if (!r.changes()) throw Failure("-d " + printable(r.device) + " has no TPC or GPC list");
      const topo::DeviceInfo& dev = devices.select(r.device);
      for (const Choice& prev : chosen)
        if (prev.dev->uuid == dev.uuid) throw Failure("two partitions given for " + planner::device_label(dev));
      chosen.push_back({&dev, plan_partition(o, r, dev, devices, sh, &notes)});
    }
    return chosen;
  };
  std::vector<Choice> chosen = plan();
  planner::check_roles(o.role, chosen, sh, devices);
  devices.restore_environment();
  if (!o.no_mps) {
    mps::Options mo;
    mo.multi_user = o.mps_multi_user;
    const mps::EnsureResult r = mps::ensure_daemon(mo);
    if (r.started) std::fprintf(stderr, "%s\n", mps::started_message(r).c_str());
    if (users_check) check_mps_user(*users_check);
  }

  // 3. Claim: the public entry, before exec (which keeps the PID and start
  // time): the next `-n` must see these TPCs taken even before the task
  // loads CUDA.
  auto entry = [](const std::vector<Choice>& c) {
    std::vector<DevicePartition> parts;
    for (const Choice& x : c) parts.push_back({x.dev->uuid, x.partition, planner::describe_device(*x.dev)});
    return parts;
  };
  // Without its entry the task is invisible to every other chooser, which
  // may then take its TPCs (any user can fill /dev/shm). --exclusive
  // promises TPCs no one else takes, so it fails closed; other launches run
  // and say once that they are unlisted.
  std::string unlisted;
  const planner::Claim claim{plan,
                             [&](const std::vector<Choice>& c) {
                               const std::string why = ctl::publish_status(holder, entry(c), o.role);
                               if (why.empty()) {
                                 unlisted.clear();
                                 return;
                               }
                               if (o.exclusive)
                                 throw Failure("cannot publish the status entry that shows other choosers these TPCs (" +
                                               printable(why, 160) + "); --exclusive starts no task they cannot see");
                               unlisted = why;
                             },
                             [&] { ctl::withdraw_status(holder); }};
  chosen = planner::settle(sh, devices, claim, std::move(chosen), &notes.warnings);
  // Warnings only once nothing can refuse the launch any more: a refusal
  // stays one line.
  for (const std::string& w : notes.warnings) spdlog::warn("{}", w);
  if (!unlisted.empty())
    spdlog::warn("this task has no status entry ({}): --status does not list it, and other -n or --exclusive "
                 "launches may choose its TPCs",
                 printable(unlisted, 160));

  // 4. Deliver: the partition and the role in the task's environment.
  TaskRole tr;
  tr.role = o.role;
  if (o.role == roles::Role::kLatencyCritical) {
    // What it may burst onto: every working TPC of each of its GPUs (the
    // shim takes away what other partitions hold, as they come and go).
    std::vector<DevicePartition> pool;
    for (const Choice& c : chosen)
      pool.push_back({c.dev->uuid, planner::whole_gpu(devices.topology(*c.dev)), planner::describe_device(*c.dev)});
    tr.burst_pool = encode_partitions(pool);
  }
  if (o.role != roles::Role::kNone) {
    // Which TPCs host clusters together: a best-effort shim keeps a
    // clustered kernel on its floor only where it fits (shim/src/role_masks.cpp, adjust),
    // a latency-critical one chooses its top-up to keep GPCs whole.
    std::vector<ClusterMap> maps;
    for (const Choice& c : chosen)
      if (const topo::Topology* t = devices.known_topology(*c.dev))
        if (auto m = planner::cluster_map_of(*t, c.dev->uuid)) maps.push_back(std::move(*m));
    tr.cluster_map = encode_cluster_maps(maps);
  }
  const std::vector<std::string> task_env = task_environment(
      env, shim_dir, encode_partitions(entry(chosen)), devices.driver_path(), o.partition_sm_count, !o.no_mps, tr, holder);
  // A client priority of the user's that the role replaced (task_environment) is said.
  const std::optional<std::string_view> asked = variable(env, kClientPriorityEnv);
  if (const std::optional<std::string_view> set = variable(task_env, kClientPriorityEnv); asked && set && *asked != *set)
    spdlog::warn("{}={} replaced by {}={}: a {} task is a{} MPS client", kClientPriorityEnv, printable(*asked, 80),
                 kClientPriorityEnv, *set, roles::role_name(o.role),
                 o.role == roles::Role::kBestEffort ? " below-normal priority" : " normal priority");
  if (env_mode && o.json) {
    print_environment_json(env, task_env, chosen, devices);
    return 0;
  }
  if (env_mode) {
    print_environment(env, task_env);
    return 0;
  }
  exec_task(cmd, task_env);
}

Partition plan_partition(const Options& o, const planner::Request& r, const topo::DeviceInfo& dev,
                         planner::Layouts& layouts, const planner::Sharing& sh, planner::Notes* notes) {
  // -v: which TPCs -n chose, as each plan chose them, refused or not.
  auto say = [&] {
    if (o.verbose)
      for (const std::string& c : notes->choices) std::fprintf(stderr, "nvtaskset: %s\n", c.c_str());
    notes->choices.clear();
  };
  try {
    Partition p = planner::plan_partition(r, dev, layouts, sh, notes);
    say();
    return p;
  } catch (...) {
    say();
    throw;
  }
}


std::vector<std::string> task_environment(std::vector<std::string> env, const std::string& shim_dir,
                                          const std::string& partitions, const std::string& real_driver,
                                          bool partition_sm_count, bool mps_client, const TaskRole& role,
                                          pid_t partition_pid) {
  auto find = [&](const std::string& name) -> std::string* {
    const auto e = entry_of(env, name);
    return e == env.end() ? nullptr : &*e;
  };
  auto set = [&](const std::string& name, const std::string& value) {
    if (std::string* e = find(name)) *e = name + "=" + value;
    else env.push_back(name + "=" + value);
  };
  set(kPartitionEnv, partitions);
  set(kPartitionPidEnv, std::to_string(partition_pid != 0 ? partition_pid : ::getpid()));  // exec keeps our PID
  std::erase_if(env, [](const std::string& e) {
    for (const Option o : {Option::kRole, Option::kBurstPool, Option::kClusterMap}) {
      const std::string name = std::string(option(o).name) + "=";
      if (e.starts_with(name)) return true;
    }
    return false;
  });
  if (role.role != roles::Role::kNone) set(option(Option::kRole).name, roles::role_name(role.role));
  if (!role.burst_pool.empty()) set(option(Option::kBurstPool).name, role.burst_pool);
  if (!role.cluster_map.empty()) set(option(Option::kClusterMap).name, role.cluster_map);
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
  const std::string shim = shim_preload(shim_dir);
  if (std::string* e = find("LD_PRELOAD"); e && e->size() > std::strlen("LD_PRELOAD=")) {
    const std::vector<std::string> items =
        loader_list(std::string_view(*e).substr(std::strlen("LD_PRELOAD=")), kPreloadSeparators);
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
  // Under MPS a best-effort task is a below-normal priority client and a
  // latency-critical one a normal one: MPS's client priority is a stream
  // priority, by which the GPU prefers the higher-priority work's blocks
  // when both wait for an SM. It shortens an LC task's tail next to
  // training, though not its wait behind BE kernels that hold their SMs
  // (docs/design.md, "The numbers, measured"). The role decides it: a
  // user's value is replaced (launch() says so). Outside MPS, contexts
  // time-slice and the priority means nothing.
  if (mps_client && role.role != roles::Role::kNone) set(kClientPriorityEnv, client_priority(role.role));
  // An MPS client's kernels share 2 hardware queues by default, so its
  // streams falsely wait for each other: it gets a plain process's 8 kernel
  // queues. Copy queues cost an MPS client start-up time, one by one, and 2
  // copy queues start faster than 4 without slowing copies that overlap
  // kernels (docs/hardware.md, "MPS", what each queue costs). A user's choice
  // of either is kept: CUDA_DEVICE_MAX_CONNECTIONS alone then sets the copy
  // queues too, as in CUDA. Outside MPS, CUDA's default already behaves like
  // 8 kernel and 4 copy queues, so a --no-mps task is left as it is: it
  // starts and runs as the same program would alone.
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

}  // namespace nvtaskset::cli
