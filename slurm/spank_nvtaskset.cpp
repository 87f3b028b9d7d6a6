// SPDX-License-Identifier: Apache-2.0
// spank_nvtaskset: Slurm job steps on hardware TPC partitions (docs/slurm.md).
//
//   srun --gres=shard:2 ./infer        # 2 of the GPU's shards: that fraction of its TPCs
//   srun --gpu-tpcs=16 ./detector      # 16 TPCs, as nvtaskset -n 16 --exclusive
//   srun --gpu-tpcs=16 --gpu-role=latency-critical ./server   # as nvtaskset -n 16 --latency-critical
//   srun --gpu-role=best-effort ./train                       # as nvtaskset --best-effort
//
// plugstack.conf:  required /usr/lib/slurm/spank_nvtaskset.so [no-mps | mps-multi-user] [nvtaskset=PATH] [shards=N]
//
// How (docs/slurm.md, "How the plugin works"):
//  - srun's option callbacks check the values, so a bad one fails srun at
//    once, before anything is allocated, with one line naming it.
//  - In slurmstepd, once per step on the node (init_post_opt, as root), the
//    plugin runs `nvtaskset --env-for <slurmstepd's PID> -d I -n N
//    --exclusive` for each GPU the step sees, with the job's environment:
//    the same parse -> plan -> claim as a launch, with its status entry on
//    slurmstepd, which lives exactly as long as the step (however it ends:
//    its entry names a dead process afterwards, which every reader ignores
//    and removes), and owned by root, which every reader trusts. The CLI
//    prints the environment a task needs.
//  - In each task (task_init, as the user, before exec), the plugin puts that
//    environment into the task's: the shim reaches the task as with
//    `nvtaskset CMD`. A failure found earlier is reported here, one line, and
//    fails the task, so srun exits non-zero: Slurm 22.05 ignores a failing
//    init_post_opt or user_init in srun's exit status.
// A step with no --gpu-tpcs, no shard and no --gpu-role is left untouched:
// no variable set.
#include <poll.h>
#include <pwd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "nvtaskset/spawn.hpp"

extern "C" {
#include <slurm/spank.h>
}

// The plugin is built with hidden visibility; what Slurm looks up is not.
#pragma GCC visibility push(default)
// SPANK_PLUGIN(nvtaskset, 1), spelt out: in C++ a const at namespace scope
// has internal linkage unless declared extern, and Slurm looks these up.
extern "C" const char plugin_name[] = "nvtaskset";
extern "C" const char plugin_type[] = "spank";
extern "C" const unsigned int plugin_version = SLURM_VERSION_NUMBER;
extern "C" const unsigned int spank_plugin_version = 1;
#pragma GCC visibility pop

namespace {

namespace process = nvtaskset::process;

#ifndef NVTASKSET_SLURM_CLI
#define NVTASKSET_SLURM_CLI "nvtaskset"
#endif

// plugstack.conf arguments, the options' values, and what the step decided.
struct State {
  std::string cli = NVTASKSET_SLURM_CLI;  // nvtaskset=PATH
  bool no_mps = false;                    // no-mps: as nvtaskset --no-mps
  bool mps_multi_user = false;            // mps-multi-user: as nvtaskset --mps-multi-user
  unsigned shards_total = 0;              // shards=N; else gres.conf's
  unsigned tpcs = 0;                      // --gpu-tpcs
  bool spread = false;                    // --gpu-tpcs-mode=spread
  std::string role;                       // --gpu-role: "", "latency-critical" or "best-effort"
  bool active = false;                    // the step asked for a partition
  std::string error;                      // why it cannot have one: each task fails with it
  std::vector<std::pair<std::string, std::string>> env;  // what each task gets
} g;

constexpr unsigned kMaxTpcs = 4096;
constexpr int kCliTimeoutS = 120;  // calibration of a new GPU takes about a second; a hung driver must not hang the step

// A count as the options take it: digits only, 1..kMaxTpcs.
std::optional<unsigned> parse_count(const char* s) {
  if (s == nullptr || *s == '\0' || std::strlen(s) > 6) return std::nullopt;
  unsigned v = 0;
  for (const char* p = s; *p; ++p) {
    if (*p < '0' || *p > '9') return std::nullopt;
    v = v * 10 + static_cast<unsigned>(*p - '0');
  }
  if (v == 0 || v > kMaxTpcs) return std::nullopt;
  return v;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

int opt_tpcs(int, const char* optarg, int) {
  const auto v = parse_count(optarg);
  if (!v) {
    slurm_error("nvtaskset: --gpu-tpcs=%s: not a count of TPCs (1 to %u)", printable(optarg ? optarg : "").c_str(),
                kMaxTpcs);
    return -1;
  }
  g.tpcs = *v;
  return 0;
}

int opt_mode(int, const char* optarg, int) {
  const std::string_view m = optarg ? optarg : "";
  if (m != "packed" && m != "spread") {
    slurm_error("nvtaskset: --gpu-tpcs-mode=%s: packed or spread", printable(m).c_str());
    return -1;
  }
  g.spread = m == "spread";
  return 0;
}

// The role names are nvtaskset's long options (docs/design.md, "Roles").
int opt_role(int, const char* optarg, int) {
  const std::string_view r = optarg ? optarg : "";
  if (r != "latency-critical" && r != "best-effort") {
    slurm_error("nvtaskset: --gpu-role=%s: latency-critical or best-effort", printable(r).c_str());
    return -1;
  }
  g.role = std::string(r);
  return 0;
}

struct spank_option g_options[] = {
    {const_cast<char*>("gpu-tpcs"), const_cast<char*>("N"),
     const_cast<char*>("run the step's tasks on N TPCs of each GPU they use, no other step's (nvtaskset -n N "
                       "--exclusive); without it a shard allocation sets the share"),
     1, 0, opt_tpcs},
    {const_cast<char*>("gpu-tpcs-mode"), const_cast<char*>("packed|spread"),
     const_cast<char*>("with --gpu-tpcs or shards: whole GPCs first (packed, the default) or spread over the GPCs"),
     1, 0, opt_mode},
    {const_cast<char*>("gpu-role"), const_cast<char*>("latency-critical|best-effort"),
     const_cast<char*>("latency-critical: reserve the step's TPCs (--gpu-tpcs or shards), onto the whole GPU while "
                       "it has work (nvtaskset --latency-critical); best-effort: run on them (without either, on "
                       "every TPC) while every latency-critical task is idle, and make way while one has work"),
     1, 0, opt_role},
    SPANK_OPTIONS_TABLE_END};

// ---- the job's environment -------------------------------------------------------------

std::optional<std::string> job_getenv(spank_t sp, const char* name) {
  char buf[4096];
  if (spank_getenv(sp, name, buf, sizeof buf) != ESPANK_SUCCESS) return std::nullopt;
  return std::string(buf);
}

std::vector<std::string> job_environment(spank_t sp) {
  std::vector<std::string> out;
  char** env = nullptr;
  if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || env == nullptr) return out;
  for (char** e = env; *e; ++e) {
    const std::string_view kv(*e);
    // nvtaskset runs as root here: it must not read or write the user's
    // caches and configuration in the user's name (its own defaults, root's).
    if (kv.starts_with("HOME=") || kv.starts_with("XDG_")) continue;
    out.emplace_back(kv);
  }
  // Root's own home instead, so that its device cache is found again by
  // the next step (without one, every step would calibrate the GPU anew).
  if (const passwd* pw = ::getpwuid(::geteuid()); pw != nullptr && pw->pw_dir != nullptr)
    out.push_back(std::string("HOME=") + pw->pw_dir);
  return out;
}

// The shard count of one of the node's GPUs: plugstack.conf's shards=N,
// else gres.conf next to slurm.conf: the first "Name=shard Count=N File=F"
// line's N over the number of GPUs F names ("/dev/nvidia[0-3]": 4).
unsigned shards_total() {
  if (g.shards_total != 0) return g.shards_total;
  const char* conf = std::getenv("SLURM_CONF");
  std::string dir = conf && *conf ? std::string(conf) : std::string("/etc/slurm/slurm.conf");
  dir = dir.substr(0, dir.rfind('/') == std::string::npos ? 0 : dir.rfind('/'));
  std::ifstream f((dir.empty() ? std::string(".") : dir) + "/gres.conf");
  std::string line;
  while (std::getline(f, line)) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string w;
    bool shard = false;
    unsigned count = 0, files = 1;
    while (words >> w) {
      if (w == "Name=shard") shard = true;
      if (w.starts_with("Count=")) count = parse_count(w.c_str() + 6).value_or(0);
      if (w.starts_with("File=")) {
        unsigned a = 0, b = 0;
        if (const auto lb = w.find('['); lb != std::string::npos &&
                                         std::sscanf(w.c_str() + lb, "[%u-%u]", &a, &b) == 2 && b >= a)
          files = b - a + 1;
      }
    }
    if (shard && count != 0) return count / files;
  }
  return 0;
}

// ---- running nvtaskset -------------------------------------------------------------------

struct Run {
  int status = -1;
  std::string out, err;
};

// argv with env, stdout and stderr captured, at most kCliTimeoutS (started
// through process/, the project's one way to start a child).
Run run_cli(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  Run r;
  pid_t pid = -1;
  process::Pipe out, err;
  try {
    out = process::make_pipe();
    err = process::make_pipe();
    process::SpawnOptions so;
    so.in = process::Stream::null();
    so.out = process::Stream::fd(out.write.get());
    so.err = process::Stream::fd(err.write.get());
    pid = process::spawn(process::ExecArgs(argv, env), so);
  } catch (const process::SpawnError& e) {
    r.err = std::string("nvtaskset: the Slurm plugin cannot run ") + argv.front() + ": " + e.what() + "\n";
    return r;
  }
  out.write.reset();
  err.write.reset();
  timespec start{};
  ::clock_gettime(CLOCK_MONOTONIC, &start);
  pollfd fds[2] = {{out.read.get(), POLLIN, 0}, {err.read.get(), POLLIN, 0}};
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0) {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    const long left_ms = (start.tv_sec + kCliTimeoutS - now.tv_sec) * 1000;
    if (left_ms <= 0) {
      process::kill_and_reap(pid);
      r.err += "nvtaskset: did not answer within " + std::to_string(kCliTimeoutS) + " s\n";
      return r;  // status stays -1: a failure
    }
    if (::poll(fds, 2, static_cast<int>(left_ms)) < 0 && errno != EINTR) break;
    for (pollfd& p : fds) {
      if (p.fd < 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::read(p.fd, buf, sizeof buf);
      if (n > 0) {
        (p.fd == out.read.get() ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        p.fd = -1;  // the pipe stays open until `out`/`err` go
        --open_fds;
      }
    }
  }
  r.status = process::wait_for(pid);
  return r;
}

// The last line nvtaskset wrote to stderr (its one-line error).
std::string last_line(const std::string& text) {
  std::string s = text;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const auto nl = s.rfind('\n');
  s = nl == std::string::npos ? s : s.substr(nl + 1);
  return s.empty() ? "nvtaskset failed without a message" : s;
}

// How many TPCs each visible GPU has (nvtaskset --topology --json).
std::optional<std::vector<unsigned>> tpc_counts(const std::vector<std::string>& env, std::string* why) {
  const Run r = run_cli({g.cli, "--topology", "--json"}, env);
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0) {
    *why = last_line(r.err);
    return std::nullopt;
  }
  try {
    std::vector<unsigned> out;
    const nlohmann::json topology = nlohmann::json::parse(r.out);  // kept: the loop walks into it
    for (const auto& d : topology.at("devices")) out.push_back(static_cast<unsigned>(d.at("tpcs").size()));
    return out;
  } catch (const std::exception& e) {
    *why = std::string("nvtaskset: cannot read nvtaskset --topology --json: ") + e.what();
    return std::nullopt;
  }
}

// What the step asks for on this node, and the environment its tasks get.
void plan_step(spank_t sp) {
  const std::optional<std::string> shards_s = job_getenv(sp, "SLURM_SHARDS_ON_NODE");
  const unsigned shards = shards_s ? parse_count(shards_s->c_str()).value_or(0) : 0;
  if (g.tpcs == 0 && shards == 0 && g.role.empty()) return;  // untouched
  g.active = true;
  // The count: --gpu-tpcs, else the shards' share, else (best-effort with
  // neither) every TPC, as nvtaskset --best-effort runs; a reservation must
  // say how much it reserves.
  const bool by_shards = g.tpcs == 0 && shards != 0;
  if (g.tpcs == 0 && !by_shards && g.role == "latency-critical") {
    g.error = "nvtaskset: --gpu-role=latency-critical needs --gpu-tpcs or shards: what the step reserves";
    return;
  }
  // Slurm's own MPS gres sets a thread percentage for an MPS server it runs;
  // nvtaskset partitions by TPC: one or the other, never both silently.
  if (job_getenv(sp, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) {
    g.error = "nvtaskset: this step has Slurm's gres/mps (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and a TPC partition: "
              "use --gpu-tpcs or shards without gres/mps";
    return;
  }
  const std::vector<std::string> env = job_environment(sp);
  std::string why;
  const auto counts = tpc_counts(env, &why);
  if (!counts || counts->empty()) {
    g.error = counts ? "nvtaskset: the step sees no GPU" : why;
    return;
  }
  const unsigned total = by_shards ? shards_total() : 0;
  if (by_shards && total == 0) {
    g.error = "nvtaskset: the node's shard count is unknown (no Name=shard Count= in gres.conf; set shards=N in "
              "plugstack.conf)";
    return;
  }
  if (by_shards && shards > total) {
    g.error = "nvtaskset: " + std::to_string(shards) + " shards on a GPU of " + std::to_string(total);
    return;
  }
  uint32_t job = 0, step = 0;
  spank_get_item(sp, S_JOB_ID, &job);
  spank_get_item(sp, S_JOB_STEPID, &step);
  std::vector<std::string> argv = {g.cli, "--env-for", std::to_string(::getpid()),
                                   g.role.empty() ? std::string("--exclusive") : "--" + g.role};
  if (g.no_mps) argv.push_back("--no-mps");
  if (g.mps_multi_user) argv.push_back("--mps-multi-user");
  // The step's GPUs are what CUDA_VISIBLE_DEVICES lets it see: devices 0..k-1
  // to nvtaskset, which runs with the job's environment. A step Slurm gave
  // GPUs (a gpu or shard gres: SLURM_STEP_GPUS) gets a partition on each; a
  // step given none gets GPU 0 of what it sees, and sees only that GPU, so
  // that none of its kernels runs on a GPU without its partition.
  unsigned devices = static_cast<unsigned>(counts->size());
  std::string only_gpu;
  if (!job_getenv(sp, "SLURM_STEP_GPUS") && shards == 0 && devices > 1) {
    devices = 1;
    const std::string seen = job_getenv(sp, "CUDA_VISIBLE_DEVICES").value_or("");
    only_gpu = seen.empty() ? "0" : seen.substr(0, seen.find(','));
  }
  for (unsigned d = 0; d < devices; ++d) {
    // A shard's share of the TPCs, rounded down, never none.
    const unsigned n = g.tpcs != 0 ? g.tpcs : by_shards ? std::max(1u, (*counts)[d] * shards / total) : (*counts)[d];
    argv.insert(argv.end(), {"-d", std::to_string(d), "-n", std::to_string(n)});
  }
  if (g.spread) argv.push_back("--spread");
  const Run r = run_cli(argv, env);
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0) {
    g.error = last_line(r.err) + " (Slurm step " + std::to_string(job) + "." + std::to_string(step) + ")";
    return;
  }
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0) {
      g.error = "nvtaskset: --env-for printed '" + printable(line) + "'";
      return;
    }
    g.env.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  if (!only_gpu.empty()) g.env.emplace_back("CUDA_VISIBLE_DEVICES", only_gpu);
  bool partition = false;
  for (const auto& [k, v] : g.env) partition = partition || k == "NVTASKSET_PARTITION";
  if (!partition) g.error = "nvtaskset: --env-for gave no NVTASKSET_PARTITION";
}

}  // namespace

#pragma GCC visibility push(default)
extern "C" {

int slurm_spank_init(spank_t sp, int ac, char** av) {
  for (int i = 0; i < ac; ++i) {
    const std::string_view a = av[i];
    if (a == "no-mps") {
      g.no_mps = true;
    } else if (a == "mps-multi-user") {
      g.mps_multi_user = true;
    } else if (a.starts_with("nvtaskset=") && a.size() > 10 && a[10] == '/') {
      g.cli = std::string(a.substr(10));
    } else if (a.starts_with("shards=") && parse_count(av[i] + 7)) {
      g.shards_total = *parse_count(av[i] + 7);
    } else {
      slurm_error("nvtaskset: plugstack.conf: unknown argument '%s' (no-mps, mps-multi-user, nvtaskset=/ABSOLUTE/PATH, "
                  "shards=N)",
                  printable(a).c_str());
      return -1;
    }
  }
  if (g.no_mps && g.mps_multi_user) {
    slurm_error("nvtaskset: plugstack.conf: no-mps and mps-multi-user exclude each other");
    return -1;
  }
  if (spank_context() == S_CTX_ALLOCATOR || spank_context() == S_CTX_LOCAL || spank_context() == S_CTX_REMOTE)
    for (struct spank_option* o = g_options; o->name != nullptr; ++o)
      if (spank_option_register(sp, o) != ESPANK_SUCCESS) return -1;
  return 0;
}

// In slurmstepd, as root, once per step on the node.
int slurm_spank_init_post_opt(spank_t sp, int, char**) {
  if (!spank_remote(sp)) return 0;
  try {
    plan_step(sp);
  } catch (const std::exception& e) {
    g.active = true;
    g.error = std::string("nvtaskset: ") + e.what();
  }
  return 0;  // a failure is reported by each task (task_init), which fails srun
}

// In each task, as the user, just before exec.
int slurm_spank_task_init(spank_t sp, int, char**) {
  if (!g.active) return 0;
  if (!g.error.empty()) {
    slurm_error("%s", g.error.c_str());
    return -1;
  }
  for (const auto& [k, v] : g.env) {
    // The task's own PID: the shim in it is the one nvtaskset delivered to.
    const std::string value = k == "NVTASKSET_PARTITION_PID" ? std::to_string(::getpid()) : v;
    if (spank_setenv(sp, k.c_str(), value.c_str(), 1) != ESPANK_SUCCESS) {
      slurm_error("nvtaskset: cannot set %s in the task's environment", k.c_str());
      return -1;
    }
  }
  return 0;
}

}  // extern "C"
#pragma GCC visibility pop
