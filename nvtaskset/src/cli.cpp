// SPDX-License-Identifier: Apache-2.0
// nvtaskset: the command line, a thin layer over the planner (../planner),
// as taskset.c sits over cpuset.c. Here: the options and how they pair (each
// list with the -d before it), the one-time parse of the requests, the
// dispatch to a command, and --help. The commands run one pipeline, parse ->
// plan -> claim -> deliver -> read back: a launch (launch.cpp) and a live
// change of a running task (-p, live.cpp); --status (sharing.cpp), --verify
// (verify.cpp), --topology and --calibrate (devices.cpp), --system-wide
// (system_wide.cpp) stand beside them.
#include "nvtaskset/cli.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "command.hpp"
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/cuda_driver_api.hpp"
#include "nvtaskset/devices.hpp"
#include "nvtaskset/idlist.hpp"
#include "nvtaskset/log_level.hpp"
#include "nvtaskset/sharing.hpp"
#include "nvtaskset/spawn.hpp"
#include "nvtaskset/system_wide.hpp"
#include "nvtaskset/verify.hpp"

namespace nvtaskset::cli {
namespace fs = std::filesystem;

namespace {

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

}  // namespace

std::vector<std::string> shim_copies(const std::string& shim_dir) {
  if (shim_dir.empty()) return {};
  return {shim_dir + "/libcuda.so.1"};
}

namespace {

std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

// Parse, once: every list and mask is parsed before anything touches a
// device or the driver, so that a typo is reported as such even where the
// driver is missing or broken. The first positional is parsed as a TPC mask
// where a launch or -p takes one there (launch.cpp and live.cpp place it).
Requests parse_requests(const Options& o) {
  Requests rq;
  for (const Given& g : o.given) rq.lists.push_back(planner::parse_request(g.device, g.kind, g.text));
  // (--best-effort and --latency-critical take a mask only when it starts
  // with 0x.)
  const bool role_without_mask = o.role != roles::Role::kNone && o.given.empty() && !o.positionals.empty() &&
                                 !o.positionals[0].starts_with("0x") && !o.positionals[0].starts_with("0X");
  const bool wants_mask =
      !role_without_mask && (o.given.empty() || o.given.back().kind == planner::RequestKind::kNone);
  if (wants_mask && (o.mode == Mode::kPid ? o.positionals.size() == 2 : !o.positionals.empty()))
    rq.lead_mask = planner::parse_request("", planner::RequestKind::kTpcMask, o.positionals[0]);
  return rq;
}

constexpr const char* kVerifyTakes = "--verify takes only -d, --seed and --topology-file";
constexpr const char* kStatusTakes = "--status takes no list, PID or command";

// The options that choose a mode, in the order one_mode() names them.
struct ModeOption {
  Mode mode;
  const char* name;
};
constexpr ModeOption kModeOptions[] = {
    {Mode::kPid, "-p"},           {Mode::kStatus, "--status"},       {Mode::kVerify, "--verify"},
    {Mode::kTopology, "--topology"}, {Mode::kCalibrate, "--calibrate"}, {Mode::kSystemWide, "--system-wide"},
};
static_assert([] {
  for (std::size_t i = 0; i < std::size(kModeOptions); ++i)
    if (static_cast<std::size_t>(kModeOptions[i].mode) != i + 1) return false;
  return true;
}(), "kModeOptions is in Mode's order, from the first after kLaunch");

// The one check that the modes exclude each other: `given[m]` says whether
// mode m's option was given; none is a launch. Two given keep the messages
// --verify and --status have always had for them.
Mode one_mode(const bool (&given)[std::size(kModeOptions)]) {
  std::vector<ModeOption> on;
  for (std::size_t i = 0; i < std::size(kModeOptions); ++i)
    if (given[i]) on.push_back(kModeOptions[i]);
  if (on.empty()) return Mode::kLaunch;
  if (on.size() == 1) return on[0].mode;
  for (const ModeOption& m : on)
    if (m.mode == Mode::kVerify) throw Failure(kVerifyTakes);
  if (on[0].mode == Mode::kPid && on[1].mode == Mode::kStatus && on.size() == 2) throw Failure(kStatusTakes);
  throw Failure(std::string(on[0].name) + " and " + on[1].name + " exclude each other");
}

// --verify (verify.hpp) checks partitions of its own on one GPU.
int do_verify(const Options& o) {
  if (o.json || !o.positionals.empty() || o.all_tasks || o.exclusive || o.spread) throw Failure(kVerifyTakes);
  if (o.given.size() > 1 || (o.given.size() == 1 && o.given[0].kind != planner::RequestKind::kNone))
    throw Failure("--verify checks partitions of its own: give it no TPC or GPC list or mask");
  return verify::run({o.given.empty() ? "" : o.given[0].device, o.seed, o.topology_file, o.shim_dir});
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

int run(int argc, char** argv) {
  // The environment the task gets is the one we were started with, before
  // anything here (the driver query sets CUDA_MPS_PIPE_DIRECTORY) touches it.
  const std::vector<std::string> env = process::current_environment();
  setup_logging();

  CLI::App app{kDescription, "nvtaskset"};
  app.set_version_flag("-V,--version", version_text());
  Options o;
  bool mode_given[std::size(kModeOptions)] = {};  // one_mode()'s input
  auto mode_flag = [&](Mode m) -> bool& { return mode_given[static_cast<std::size_t>(m) - 1]; };
  bool latency_critical = false, best_effort = false;
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
  app.add_flag("--latency-critical", latency_critical,
               "reserve the TPCs given (-n, -t, -g or a mask) for the command, exclusively but for best-effort "
               "tasks, which make way while it has work; it may use every TPC no other partition holds while it "
               "has work");
  app.add_flag("--best-effort", best_effort,
               "run the command on all TPCs (or those given) while every latency-critical task is idle, but for "
               "kernels it timed at NVTASKSET_BE_BORROW_US (500) or more, which keep off the reservations; while one "
               "has work, its stream stops on the GPU at its next gate (one per NVTASKSET_BE_GATE_US of its work, 100) and its new kernels "
               "go on the TPCs no reservation holds; while one exists, it keeps at most NVTASKSET_BE_DEPTH "
               "launches queued (64); under MPS it is a below-normal priority client (CUDA_MPS_CLIENT_PRIORITY=1)");
  app.add_flag("-a,--all-tasks", o.all_tasks, "with -p: the task and every process it started that runs under nvtaskset");
  app.add_flag("--status", mode_flag(Mode::kStatus), "list every partitioned task on this machine (with --json: as JSON)");
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
  app.add_flag("-p,--pid", mode_flag(Mode::kPid), "query or change the TPCs of the running process PID");
  app.add_flag("--no-mps", o.no_mps, "do not start or require the MPS control daemon");
  app.add_flag("--mps-multi-user", o.mps_multi_user,
               "the MPS control daemon must serve every user at once (nvidia-cuda-mps-control -d -M): start it so "
               "if none runs (root only), refuse one that serves one user at a time; every user's clients are then "
               "root's clients to MPS (docs/security.md)");
  std::optional<pid_t> env_for;
  app.add_option("--env-for", env_for,
                 "instead of running a command: plan and claim the TPCs for the running process PID, whose children "
                 "are the tasks (a launcher's, such as the Slurm plugin's), and print the environment those tasks need, "
                 "NAME=VALUE a line")
      ->type_name("PID");
  app.add_flag("--topology", mode_flag(Mode::kTopology), "print each GPU's GPCs, TPCs, SMs and mask bits");
  app.add_flag("--json", o.json,
               "with --topology, --calibrate, --status, a -p query or --env-for (its environment and the TPCs "
               "chosen): print JSON");
  app.add_flag("--calibrate", mode_flag(Mode::kCalibrate), "(re)discover the layout of every visible GPU");
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
  app.add_flag("--verify", mode_flag(Mode::kVerify),
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
    using planner::RequestKind;
    std::size_t it = 0, ig = 0, ip = 0, id = 0, in = 0;
    std::string device;
    for (const CLI::Option* opt : app.parse_order()) {
      if (opt == opt_d) {
        if (!o.given.empty() && o.given.back().kind == RequestKind::kNone)
          throw Failure("-d " + printable(o.given.back().device) + " has no TPC or GPC list");
        device = device_specs[id++];
        check_device_spec(device);
        o.given.push_back({device, RequestKind::kNone, ""});
        continue;
      }
      Given g{device, RequestKind::kNone, ""};
      if (opt == opt_t) g = {device, RequestKind::kTpcList, tpc_lists[it++]};
      else if (opt == opt_g) g = {device, RequestKind::kGpcList, gpc_lists[ig++]};
      else if (opt == opt_phys) g = {device, RequestKind::kPhysical, physicals[ip++]};
      else if (opt == opt_n) g = {device, RequestKind::kCount, counts[in++]};
      else continue;
      if (!o.given.empty() && o.given.back().kind == RequestKind::kNone && o.given.back().device == device)
        o.given.back() = g;
      else
        o.given.push_back(g);
    }
    o.positionals = app.remaining();
    // prefix_command() passes unknown options through with the command;
    // one before the first positional is a mistake, not the command.
    if (!o.positionals.empty() && o.positionals.front() == "--") {
      o.positionals.erase(o.positionals.begin());
    } else if (!o.positionals.empty() && o.positionals.front().size() > 1 && o.positionals.front()[0] == '-') {
      throw Failure("unrecognized option '" + printable(o.positionals.front()) + "' (see --help)");
    }
    mode_flag(Mode::kSystemWide) = !o.system_wide.empty();
    o.mode = one_mode(mode_given);

    if (latency_critical && best_effort) throw Failure("--latency-critical and --best-effort exclude each other");
    o.role = latency_critical ? roles::Role::kLatencyCritical
             : best_effort    ? roles::Role::kBestEffort
                              : roles::Role::kNone;
    if (o.role != roles::Role::kNone && o.mode != Mode::kLaunch)
      throw Failure(std::string("--") + roles::role_name(o.role) + " goes with a launch: a task's role is set when "
                    "it starts");
    if (o.role == roles::Role::kBestEffort && o.exclusive)
      throw Failure("--best-effort and --exclusive exclude each other: a best-effort task shares its TPCs");
    if (!o.show.empty() && o.mode != Mode::kPid) throw Failure("--show goes with -p");
    if (o.seed && o.mode != Mode::kVerify) throw Failure("--seed goes with --verify");
    if (o.all_tasks && o.mode != Mode::kPid) throw Failure("-a goes with -p");
    if (o.spread && counts.empty()) throw Failure("--spread goes with -n");
    o.env_for = env_for;
    if (o.env_for && o.mode != Mode::kLaunch)
      throw Failure("--env-for goes with a launch's list, in place of its command");
    if (o.no_mps && o.mps_multi_user) throw Failure("--no-mps and --mps-multi-user exclude each other");
    if (o.mps_multi_user && o.mode != Mode::kLaunch)
      throw Failure("--mps-multi-user goes with a launch or --env-for: it chooses the MPS daemon a task starts under");
    if (o.partition_sm_count && o.mode != Mode::kLaunch)
      throw Failure("--partition-sm-count goes with a launch: a running task has already read its SM count");
    if (o.mode == Mode::kStatus) {
      if (!o.given.empty() || !o.positionals.empty()) throw Failure(kStatusTakes);
      Devices devices(shim_copies(find_shim_dir(self_exe())), o.topology_file);
      return print_status(devices, o.json);
    }
    o.shim_dir = find_shim_dir(self_exe());
    switch (o.mode) {
      case Mode::kVerify:
        return do_verify(o);
      case Mode::kSystemWide:
        return system_wide(o.system_wide, o.shim_dir);
      case Mode::kTopology:
      case Mode::kCalibrate: {
        Devices devices(shim_copies(o.shim_dir), o.topology_file);
        return o.mode == Mode::kCalibrate ? devices.calibrate_all(o.json) : devices.print(o.json);
      }
      case Mode::kPid:
        return live(o, parse_requests(o));
      case Mode::kLaunch:
      case Mode::kStatus:
        break;
    }
    const Requests requests = parse_requests(o);
    if (o.json && !o.env_for) throw Failure("--json goes with --topology, --calibrate, --status, -p or --env-for");
    return launch(o, requests, env);
  } catch (const std::exception& e) {
    // The last guard of the one-line contract: a message that quotes user
    // text (a device selector as topology/ echoes it, a path) never spans
    // lines or reaches the terminal raw.
    std::fprintf(stderr, "nvtaskset: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}

}  // namespace nvtaskset::cli
