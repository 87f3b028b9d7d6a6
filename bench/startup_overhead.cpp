// SPDX-License-Identifier: Apache-2.0
// Start-up overhead (paper Fig. 11a): the time from exec to the first kernel
// running, for a plain process, an MPS client, `nvtaskset --no-mps -t LIST`,
// `nvtaskset -t LIST` with the MPS daemon warm, and with it cold (stopped
// before the run, so nvtaskset starts it); optionally (mps-client-q) an MPS
// client given the hardware queues nvtaskset gives its tasks, which splits
// nvtaskset's own cost from the queues'. The sharing issue's target,
// start-up under nvtaskset (MPS warm, cached topology) <= 1.05x plain, is the
// ratio this prints last.
//
//   bench_startup --child first_kernel --nvtaskset PATH [--list 0-32] [--rounds 100]
//                 [--configs plain,nvt-nomps,nvt-cold,mps-client,nvt-warm[,mps-client-q]] [--csv FILE]
//                 [--summary-csv FILE] [--log FILE] [--budget-s S] [--timeout-s T] [--seed N]
//                 [--mps-control nvidia-cuda-mps-control]
//
// How a run is timed: this program reads CLOCK_MONOTONIC, then posix_spawn()s
// the child (bench/cuda/first_kernel.cu), directly or behind nvtaskset, which
// execs it. The child's first CUDA call launches a kernel that stamps
// %globaltimer; the child then measures the offset of %globaltimer to
// CLOCK_MONOTONIC (bench/cuda/common.cuh: NTP-style bounds through
// host-mapped memory, a few microseconds wide) and prints the kernel's start
// on CLOCK_MONOTONIC. CLOCK_MONOTONIC is one clock for every process on the
// machine and is never stepped, so the difference is exec -> first kernel
// running, nvtaskset's own work (its cuInit, the topology, MPS) included.
// Microsecond-level uncertainty is far below what start-up costs (hundreds
// of milliseconds).
//
// Each round runs every configuration once, in an order shuffled per round:
// first those outside MPS with no MPS daemon running at all, then the cold
// run (daemon stopped, nvtaskset starts it, its first client starts the
// server), then the warm ones (the daemon and server the cold run left
// behind), then the daemon is stopped again. The daemon is always stopped at
// the end, on SIGINT/SIGTERM and on errors.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "nvtaskset/mps.hpp"
#include "run_capture.hpp"

namespace {

using bench::g_stop;
using bench::mono_ns;
using bench::on_signal;
using bench::run_capture;

struct RunResult {
  bool ok = false;
  int status = -1;  // exit status, 124 on timeout, -1 when it could not start
  double spawn_to_main_ms = NAN, spawn_to_kernel_ms = NAN, spawn_to_sync_ms = NAN, halfwidth_us = NAN;
  std::string why;
};

RunResult run_child(const std::vector<std::string>& argv, int log_fd, double timeout_s) {
  RunResult r;
  std::string out;
  std::uint64_t spawn = 0;
  r.status = run_capture(argv, log_fd, timeout_s, &out, &spawn);
  const size_t at = out.find("first_kernel ");
  unsigned long long main_ns = 0, sync_ns = 0;
  long long kernel_ns = 0, hw = 0;
  int ok = 0;
  if (at == std::string::npos ||
      std::sscanf(out.c_str() + at, "first_kernel main_ns %llu kernel_ns %lld sync_ns %llu halfwidth_ns %lld ok %d",
                  &main_ns, &kernel_ns, &sync_ns, &hw, &ok) != 5) {
    r.why = r.status == 124 ? "timeout" : "no first_kernel line (status " + std::to_string(r.status) + ")";
    return r;
  }
  const double s = static_cast<double>(spawn);
  r.spawn_to_main_ms = (static_cast<double>(main_ns) - s) / 1e6;
  r.spawn_to_kernel_ms = (static_cast<double>(kernel_ns) - s) / 1e6;
  r.spawn_to_sync_ms = (static_cast<double>(sync_ns) - s) / 1e6;
  r.halfwidth_us = static_cast<double>(hw) / 1e3;
  // The kernel starts after main and before its synchronize returns; a stamp
  // outside that window means the clock calibration went wrong.
  const bool ordered = r.spawn_to_main_ms <= r.spawn_to_kernel_ms + r.halfwidth_us / 1e3 &&
                       r.spawn_to_kernel_ms <= r.spawn_to_sync_ms + r.halfwidth_us / 1e3;
  r.ok = r.status == 0 && ok == 1 && ordered;
  if (!r.ok) r.why = !ordered ? "kernel stamp outside main..sync (calibration)" : "status " + std::to_string(r.status);
  return r;
}

// The MPS control daemon and server processes of our pipe directory: their
// CUDA_MPS_PIPE_DIRECTORY (the default when unset) names it. Those of another
// pipe directory (another user's daemon, a test's) are not ours to wait for.
void mps_processes(bool* control, bool* server) {
  *control = *server = false;
  const std::string ours = nvtaskset::mps::pipe_directory();
  DIR* d = opendir("/proc");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const std::string dir = std::string("/proc/") + e->d_name;
    auto slurp = [&](const char* file) {
      std::string s;
      if (FILE* f = std::fopen((dir + file).c_str(), "r")) {
        char buf[4096];
        for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
        std::fclose(f);
      }
      return s;
    };
    const std::string cmdline = slurp("/cmdline");
    const std::string arg0 = cmdline.substr(0, cmdline.find('\0'));
    const std::string base = arg0.substr(arg0.rfind('/') == std::string::npos ? 0 : arg0.rfind('/') + 1);
    if (base != "nvidia-cuda-mps-control" && base != "nvidia-cuda-mps-server") continue;
    std::string pipe = nvtaskset::mps::kDefaultPipeDirectory;
    const std::string env = slurp("/environ");
    for (size_t at = 0; at < env.size();) {
      const size_t end = env.find('\0', at);
      const std::string kv = env.substr(at, end == std::string::npos ? std::string::npos : end - at);
      constexpr std::string_view kVar = "CUDA_MPS_PIPE_DIRECTORY=";
      if (kv.size() > kVar.size() && kv.compare(0, kVar.size(), kVar) == 0) pipe = kv.substr(kVar.size());
      if (end == std::string::npos) break;
      at = end + 1;
    }
    if (pipe != ours) continue;
    if (base == "nvidia-cuda-mps-control") *control = true;
    else *server = true;
  }
  closedir(d);
}

bool mps_down() {
  bool c, s;
  mps_processes(&c, &s);
  return !c && !s && !nvtaskset::mps::daemon_running(nvtaskset::mps::pipe_directory());
}

// echo quit | nvidia-cuda-mps-control, then waits (bounded) until neither
// the daemon nor a server is left.
bool stop_mps(const std::string& control, int log_fd) {
  if (mps_down()) return true;
  std::string out;
  std::uint64_t t;
  run_capture({control}, log_fd, 30, &out, &t, "quit\n");
  const std::uint64_t deadline = mono_ns() + 20000000000ull;
  while (mono_ns() < deadline) {
    if (mps_down()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool start_mps(const std::string& control, int log_fd) {
  std::string out;
  std::uint64_t t;
  // The daemon may keep its stdout open for life: give it the log, not a pipe.
  if (run_capture({control, "-d"}, log_fd, 30, &out, &t, "", true) != 0) return false;
  const std::uint64_t deadline = mono_ns() + 10000000000ull;
  while (mono_ns() < deadline) {
    if (nvtaskset::mps::daemon_running(nvtaskset::mps::pipe_directory())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

struct Config {
  std::string name;
  bool mps = false;   // runs as an MPS client
  bool cold = false;  // the daemon is stopped before it
  std::vector<std::string> prefix;
  std::vector<std::pair<std::string, std::string>> env;  // set for its runs only
  std::vector<RunResult> runs;
  std::vector<int> rounds;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double k = std::ceil(p * static_cast<double>(v.size()));
  return v[static_cast<size_t>(std::clamp(k, 1.0, static_cast<double>(v.size()))) - 1];
}

double median(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_startup --child FIRST_KERNEL --nvtaskset PATH [--list LIST] [--rounds N]\n"
               "                     [--configs plain,nvt-nomps,nvt-cold,mps-client,nvt-warm[,mps-client-q]] [--csv FILE]\n"
               "                     [--summary-csv FILE] [--log FILE] [--budget-s S] [--timeout-s T] [--seed N]\n"
               "                     [--mps-control PROGRAM]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string child, nv, list = "0-3", csv, summary_csv, log = "/dev/null", control = "nvidia-cuda-mps-control";
  std::string wanted = "plain,nvt-nomps,nvt-cold,mps-client,nvt-warm";
  int rounds = 100;
  double budget_s = 1e9, timeout_s = 60;
  unsigned seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--child") child = v;
    else if (a == "--nvtaskset") nv = v;
    else if (a == "--list") list = v;
    else if (a == "--rounds") rounds = std::atoi(v.c_str());
    else if (a == "--configs") wanted = v;
    else if (a == "--csv") csv = v;
    else if (a == "--summary-csv") summary_csv = v;
    else if (a == "--log") log = v;
    else if (a == "--budget-s") budget_s = std::atof(v.c_str());
    else if (a == "--timeout-s") timeout_s = std::atof(v.c_str());
    else if (a == "--seed") seed = static_cast<unsigned>(std::atoi(v.c_str()));
    else if (a == "--mps-control") control = v;
    else return usage();
  }
  if (child.empty() || nv.empty() || rounds < 1 || !(timeout_s > 0)) return usage();
  const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    std::fprintf(stderr, "bench_startup: cannot open %s\n", log.c_str());
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<Config> configs;
  auto want = [&](const std::string& n) { return ("," + wanted + ",").find("," + n + ",") != std::string::npos; };
  if (want("plain")) configs.push_back({"plain", false, false, {}, {}, {}, {}});
  if (want("nvt-nomps")) configs.push_back({"nvt-nomps", false, false, {nv, "--no-mps", "-t", list}, {}, {}, {}});
  if (want("nvt-cold")) configs.push_back({"nvt-cold", true, true, {nv, "-t", list}, {}, {}, {}});
  if (want("mps-client")) configs.push_back({"mps-client", true, false, {}, {}, {}, {}});
  if (want("nvt-warm")) configs.push_back({"nvt-warm", true, false, {nv, "-t", list}, {}, {}, {}});
  // An MPS client with the queues nvtaskset gives its tasks (docs/hardware.md,
  // "MPS"): nvt-warm against it is nvtaskset's own cost (CLI and shim),
  // mps-client against it the cost of the queues.
  if (want("mps-client-q"))
    configs.push_back({"mps-client-q", true, false, {},
                       {{"CUDA_DEVICE_MAX_CONNECTIONS", "8"}, {"CUDA_DEVICE_MAX_COPY_CONNECTIONS", "2"}}, {}, {}});
  if (configs.empty()) return usage();
  auto argv_of = [&](const Config& c) {
    std::vector<std::string> a = c.prefix;
    a.push_back(child);
    return a;
  };

  int rc = 0;
  if (!stop_mps(control, log_fd)) {
    std::fprintf(stderr, "bench_startup: an MPS daemon or server is still running after quit; stop it first\n");
    return 1;
  }
  // Untimed warm-up: the driver and the programs in the page cache, and the
  // topology cached (nvtaskset calibrates a GPU on first use).
  for (const auto& w : {std::vector<std::string>{child}, std::vector<std::string>{nv, "--no-mps", "-t", list, child}}) {
    const RunResult r = run_child(w, log_fd, 180);
    if (!r.ok) {
      std::fprintf(stderr, "bench_startup: warm-up run of %s failed: %s (see %s)\n", w[0].c_str(), r.why.c_str(),
                   log.c_str());
      return 1;
    }
  }
  std::mt19937 rng(seed);
  FILE* f = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (f) std::fprintf(f, "round,config,position,ok,status,spawn_to_main_ms,spawn_to_kernel_ms,spawn_to_sync_ms,"
                         "halfwidth_us,mps_server_alive_before\n");
  const std::uint64_t t_start = mono_ns();
  int done_rounds = 0, server_missing = 0;
  for (int r = 0; r < rounds && !g_stop; ++r) {
    if (r > 0 && static_cast<double>(mono_ns() - t_start) / 1e9 > budget_s) break;
    std::vector<size_t> plain, warm;
    int cold = -1;
    for (size_t i = 0; i < configs.size(); ++i) {
      if (!configs[i].mps) plain.push_back(i);
      else if (configs[i].cold) cold = static_cast<int>(i);
      else warm.push_back(i);
    }
    std::shuffle(plain.begin(), plain.end(), rng);
    std::shuffle(warm.begin(), warm.end(), rng);
    if (!stop_mps(control, log_fd)) {
      std::fprintf(stderr, "bench_startup: MPS did not stop (round %d)\n", r);
      rc = 1;
      break;
    }
    std::vector<size_t> order = plain;
    if (cold >= 0) order.push_back(static_cast<size_t>(cold));
    const size_t first_warm = order.size();
    order.insert(order.end(), warm.begin(), warm.end());
    int pos = 0;
    for (size_t k = 0; k < order.size() && !g_stop; ++k) {
      Config& c = configs[order[k]];
      if (k == first_warm && cold < 0) {
        // No cold run to bring MPS up: start the daemon and its server here.
        if (!start_mps(control, log_fd) || !run_child({child}, log_fd, timeout_s).ok) {
          std::fprintf(stderr, "bench_startup: could not start MPS for the warm runs\n");
          rc = 1;
          break;
        }
      }
      bool ctl = false, srv = false;
      mps_processes(&ctl, &srv);
      if (c.mps && !c.cold && !srv) ++server_missing;
      std::vector<std::optional<std::string>> saved;
      for (const auto& [k, v] : c.env) {
        const char* was = std::getenv(k.c_str());
        saved.push_back(was ? std::optional<std::string>(was) : std::nullopt);
        ::setenv(k.c_str(), v.c_str(), 1);
      }
      const RunResult res = run_child(argv_of(c), log_fd, timeout_s);
      for (size_t i = 0; i < c.env.size(); ++i) {
        if (saved[i]) ::setenv(c.env[i].first.c_str(), saved[i]->c_str(), 1);
        else ::unsetenv(c.env[i].first.c_str());
      }
      c.runs.push_back(res);
      c.rounds.push_back(r);
      if (f)
        std::fprintf(f, "%d,%s,%d,%d,%d,%.3f,%.3f,%.3f,%.2f,%d\n", r, c.name.c_str(), pos, res.ok ? 1 : 0, res.status,
                     res.spawn_to_main_ms, res.spawn_to_kernel_ms, res.spawn_to_sync_ms, res.halfwidth_us, srv ? 1 : 0);
      if (!res.ok) std::fprintf(stderr, "bench_startup: round %d %s failed: %s\n", r, c.name.c_str(), res.why.c_str());
      ++pos;
    }
    if (rc) break;
    ++done_rounds;
  }
  const bool stopped = stop_mps(control, log_fd);
  if (f) std::fclose(f);
  if (!stopped) {
    std::fprintf(stderr, "bench_startup: MPS did not stop at the end\n");
    rc = 1;
  }

  // Summary.
  auto ok_values = [](const Config& c, double RunResult::*m) {
    std::vector<double> v;
    for (const auto& r : c.runs)
      if (r.ok) v.push_back(r.*m);
    return v;
  };
  const Config* plain_c = nullptr;
  for (const auto& c : configs)
    if (c.name == "plain") plain_c = &c;
  std::map<int, double> plain_by_round;
  if (plain_c)
    for (size_t i = 0; i < plain_c->runs.size(); ++i)
      if (plain_c->runs[i].ok) plain_by_round[plain_c->rounds[i]] = plain_c->runs[i].spawn_to_kernel_ms;
  const double plain_med = plain_c ? median(ok_values(*plain_c, &RunResult::spawn_to_kernel_ms)) : NAN;
  std::printf("startup: exec -> first kernel running, in ms; %d rounds, configurations interleaved (order shuffled "
              "per round; outside-MPS runs with no MPS daemon at all)\n",
              done_rounds);
  std::printf("%-12s %5s %5s %9s %9s %9s %9s %8s %8s %12s %13s\n", "config", "n", "fails", "min", "median", "p99",
              "max", "x plain", "paired", "exec->main", "main->kernel");
  FILE* sf = summary_csv.empty() ? nullptr : std::fopen(summary_csv.c_str(), "w");
  if (sf)
    std::fprintf(sf, "config,n,failures,min_ms,median_ms,p99_ms,max_ms,ratio_to_plain,paired_ratio_to_plain,"
                     "exec_to_main_median_ms,main_to_kernel_median_ms\n");
  std::map<std::string, double> ratio, paired_ratio, med_of;
  for (const auto& c : configs) {
    const auto v = ok_values(c, &RunResult::spawn_to_kernel_ms);
    std::vector<double> m2k, paired;
    for (size_t i = 0; i < c.runs.size(); ++i) {
      const auto& r = c.runs[i];
      if (!r.ok) continue;
      m2k.push_back(r.spawn_to_kernel_ms - r.spawn_to_main_ms);
      const auto p = plain_by_round.find(c.rounds[i]);
      if (p != plain_by_round.end()) paired.push_back(r.spawn_to_kernel_ms / p->second);
    }
    const size_t fails = c.runs.size() - v.size();
    const double med = median(v);
    med_of[c.name] = med;
    ratio[c.name] = med / plain_med;
    paired_ratio[c.name] = median(paired);
    const double e2m = median(ok_values(c, &RunResult::spawn_to_main_ms));
    std::printf("%-12s %5zu %5zu %9.2f %9.2f %9.2f %9.2f %7.3fx %7.3fx %12.2f %13.2f\n", c.name.c_str(), v.size(), fails,
                pct(v, 0), med, pct(v, 0.99), pct(v, 1), ratio[c.name], paired_ratio[c.name], e2m, median(m2k));
    if (sf)
      std::fprintf(sf, "%s,%zu,%zu,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%.3f,%.3f\n", c.name.c_str(), v.size(), fails, pct(v, 0),
                   med, pct(v, 0.99), pct(v, 1), ratio[c.name], paired_ratio[c.name], e2m, median(m2k));
    if (fails) rc = rc ? rc : 3;
  }
  if (sf) std::fclose(sf);
  std::printf("(exec->main: before the program's main, i.e. the loader and, under nvtaskset, the CLI; main->kernel: "
              "CUDA initialisation to the first kernel)\n");
  if (server_missing) std::printf("note: %d warm runs found no MPS server process running before them\n", server_missing);
  if (ratio.count("nvt-warm") && ratio.count("mps-client"))
    std::printf("nvtaskset (MPS warm) / MPS client: %.3fx\n", med_of["nvt-warm"] / med_of["mps-client"]);
  if (ratio.count("nvt-warm") && ratio.count("mps-client-q"))
    std::printf("nvtaskset (MPS warm) / MPS client with its queues: %.3fx (nvtaskset's own cost: CLI and shim)\n",
                med_of["nvt-warm"] / med_of["mps-client-q"]);
  if (ratio.count("nvt-warm") && plain_c)
    std::printf("startup under nvtaskset (MPS warm, cached topology) / plain: %.3fx (medians; median of per-round "
                "ratios %.3fx; target <= 1.05x)\n",
                ratio["nvt-warm"], paired_ratio["nvt-warm"]);
  if (g_stop) rc = rc ? rc : 130;
  return rc;
}
