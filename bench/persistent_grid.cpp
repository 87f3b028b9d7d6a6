// SPDX-License-Identifier: Apache-2.0
// Persistent kernels and the SM count: what --partition-sm-count is for,
// measured side by side in one run.
//
//   bench_persistent [--rounds N] [--count C] [--nvtaskset PATH] [--no-mps] [--timeout-s T]
//                    [--csv FILE] [--log FILE] PROGRAM [ARGS...]
//
// PROGRAM is bench/cuda/persistent.cu (or anything that prints its line,
// "persistent sms=S props_sms=P grid=G occupancy=K tiles=N ms=M"): a kernel
// of SM count x occupancy blocks that walk a fixed number of tiles with a
// static schedule, timed inside the program. Each round runs it three ways:
//   A  nvtaskset [--no-mps] -n C PROGRAM ARGS                       reads the whole GPU's SM count
//   B  nvtaskset [--no-mps] -n C --partition-sm-count PROGRAM ARGS  reads its partition's 2*C SMs
//   C  PROGRAM ARGS                                                 the whole GPU, the reference
// A launches a whole GPU's worth of blocks into C TPCs, so its last wave runs
// on a few SMs while the rest idle; B's grid is what the partition runs at
// once. A/B is the result: how much slower the oversubscribed grid is.
//
// The order of the three is rotated and reversed from round to round (all
// six orders in turn), so drift (clocks, temperature) falls on every variant
// alike. The programs time their kernels themselves (CUDA events), so process
// start-up, nvtaskset's own work and MPS are outside the numbers. One
// untimed run of each comes first (topology calibration, MPS start, page
// cache). A child that fails, prints no line, or runs past --timeout-s
// (default 120; its process group is killed) is reported in one line and
// ends the run with status 1.
//
// nvtaskset defaults to ../bin/nvtaskset next to this binary: the layout of
// both a CMake build (build/bench, build/bin) and bench/build_eval.sh's
// directory (nvt/bench, nvt/bin).
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "run_capture.hpp"

namespace {

using bench::g_stop;
using bench::on_signal;
using bench::run_capture;  // 124 when past the time limit or interrupted, -1 when it could not start

// One run's "persistent ..." line.
struct Sample {
  long sms = -1, props_sms = -1, grid = -1, occupancy = -1, tiles = -1;
  double ms = NAN;
};

// Parses the first line that starts with "persistent " in out; the keys may
// come in any order, unknown ones are ignored, sms, grid, tiles and ms are
// required.
bool parse_line(const std::string& out, Sample* s, std::string* why) {
  size_t at = 0;
  while (at < out.size() && out.compare(at, 11, "persistent ") != 0) {
    const size_t nl = out.find('\n', at);
    at = nl == std::string::npos ? out.size() : nl + 1;
  }
  if (at >= out.size()) {
    *why = "no \"persistent ...\" line on its stdout";
    return false;
  }
  const size_t end = out.find('\n', at);
  std::istringstream line(out.substr(at, end == std::string::npos ? std::string::npos : end - at));
  std::string tok;
  line >> tok;  // "persistent"
  while (line >> tok) {
    const size_t eq = tok.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
    char* e = nullptr;
    if (k == "ms") {
      s->ms = std::strtod(v.c_str(), &e);
      if (e == v.c_str() || *e || !(s->ms >= 0)) s->ms = NAN;
      continue;
    }
    long* dst = k == "sms" ? &s->sms
                : k == "props_sms" ? &s->props_sms
                : k == "grid" ? &s->grid
                : k == "occupancy" ? &s->occupancy
                : k == "tiles" ? &s->tiles
                               : nullptr;
    if (!dst) continue;
    const long x = std::strtol(v.c_str(), &e, 10);
    *dst = (e == v.c_str() || *e || x < 0) ? -1 : x;
  }
  if (s->sms < 0 || s->grid < 0 || s->tiles < 0 || std::isnan(s->ms)) {
    *why = "its \"persistent\" line lacks a valid sms=, grid=, tiles= or ms=";
    return false;
  }
  return true;
}

struct Variant {
  char tag;
  std::string name;
  std::vector<std::string> argv;
  std::vector<Sample> samples;
  std::vector<int> rounds;
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// The distinct values of one field over a variant's runs, "132" or "132/32"
// (a program whose SM count changed between runs should not look steady).
std::string values(const Variant& v, long Sample::*m) {
  std::vector<long> seen;
  for (const auto& s : v.samples)
    if (std::find(seen.begin(), seen.end(), s.*m) == seen.end()) seen.push_back(s.*m);
  std::string r;
  for (long x : seen) r += (r.empty() ? "" : "/") + (x < 0 ? std::string("-") : std::to_string(x));
  return r.empty() ? "-" : r;
}

// nvtaskset next to this binary: DIR/bench/bench_persistent -> DIR/bin/nvtaskset.
std::string default_nvtaskset() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "";
  std::string p(self, static_cast<size_t>(n));
  p = p.substr(0, p.rfind('/'));
  p = p.substr(0, p.rfind('/'));
  p += "/bin/nvtaskset";
  return access(p.c_str(), X_OK) == 0 ? p : "";
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_persistent [--rounds N] [--count C] [--nvtaskset PATH] [--no-mps] [--timeout-s T]\n"
               "                        [--csv FILE] [--log FILE] PROGRAM [ARGS...]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, count = 16;
  double timeout_s = 120;
  bool no_mps = false;
  std::string nv, csv, log;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--no-mps") {
      no_mps = true;
      continue;
    }
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    char* end = nullptr;
    if (a == "--rounds") rounds = static_cast<int>(std::strtol(v.c_str(), &end, 10));
    else if (a == "--count") count = static_cast<int>(std::strtol(v.c_str(), &end, 10));
    else if (a == "--timeout-s") timeout_s = std::strtod(v.c_str(), &end);
    else if (a == "--nvtaskset") nv = v;
    else if (a == "--csv") csv = v;
    else if (a == "--log") log = v;
    else return usage();
    if (end && (end == v.c_str() || *end)) return usage();
  }
  if (i >= argc || rounds < 1 || count < 1 || !(timeout_s > 0)) return usage();
  const std::vector<std::string> program(argv + i, argv + argc);
  if (nv.empty()) nv = default_nvtaskset();
  if (nv.empty()) {
    std::fprintf(stderr, "bench_persistent: no nvtaskset next to this program (../bin/nvtaskset); give --nvtaskset PATH\n");
    return 2;
  }
  // The children's stderr: the log when one is named (nvtaskset's notes on
  // shared GPCs, MPS), else ours, so that a failure's reason is seen.
  const int err_fd = log.empty() ? 2 : open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    std::fprintf(stderr, "bench_persistent: cannot open %s: %s\n", log.c_str(), std::strerror(errno));
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<std::string> nvt{nv};
  if (no_mps) nvt.push_back("--no-mps");
  nvt.insert(nvt.end(), {"-n", std::to_string(count)});
  std::vector<std::string> a_argv = nvt, b_argv = nvt;
  b_argv.push_back("--partition-sm-count");
  a_argv.insert(a_argv.end(), program.begin(), program.end());
  b_argv.insert(b_argv.end(), program.begin(), program.end());
  std::array<Variant, 3> vs{{{'A', "nvtaskset -n " + std::to_string(count), a_argv, {}, {}},
                             {'B', "nvtaskset -n " + std::to_string(count) + " --partition-sm-count", b_argv, {}, {}},
                             {'C', "whole GPU, no nvtaskset", program, {}, {}}}};

  FILE* f = nullptr;
  if (!csv.empty()) {
    f = std::fopen(csv.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "bench_persistent: cannot write %s: %s\n", csv.c_str(), std::strerror(errno));
      return 2;
    }
    std::fprintf(f, "round,variant,position,sms,props_sms,grid,occupancy,tiles,ms\n");
  }
  // Runs one variant; on failure says so in one line.
  auto run_one = [&](Variant& v, int round, Sample* s) {
    std::string out, why;
    const int st = run_capture(v.argv, err_fd, timeout_s, &out);
    if (st == 0 && parse_line(out, s, &why)) return true;
    if (g_stop) why = "interrupted";
    else if (st == -1) why = "cannot be started";
    else if (st == 124) why = "ran past " + std::to_string(static_cast<long>(timeout_s)) + " s; killed";
    else if (st != 0) why = "exit status " + std::to_string(st);
    std::fprintf(stderr, "bench_persistent: %s %c (%s) failed: %s\n",
                 round < 0 ? "warm-up run" : ("round " + std::to_string(round)).c_str(), v.tag, joined(v.argv).c_str(),
                 why.c_str());
    return false;
  };

  int rc = 0;
  for (auto& v : vs) {
    Sample s;
    if (!run_one(v, -1, &s)) {
      rc = 1;
      break;
    }
  }
  // All six orders of A, B, C in turn: each variant as often first as last.
  static const int kOrders[6][3] = {{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {0, 2, 1}, {2, 0, 1}, {1, 0, 2}};
  int done = 0;
  for (int r = 0; r < rounds && rc == 0; ++r) {
    for (int pos = 0; pos < 3 && rc == 0; ++pos) {
      Variant& v = vs[static_cast<size_t>(kOrders[r % 6][pos])];
      Sample s;
      if (!run_one(v, r, &s)) {
        rc = 1;
        break;
      }
      v.samples.push_back(s);
      v.rounds.push_back(r);
      if (f)
        std::fprintf(f, "%d,%c,%d,%ld,%ld,%ld,%ld,%ld,%.4f\n", r, v.tag, pos, s.sms, s.props_sms, s.grid, s.occupancy,
                     s.tiles, s.ms);
    }
    if (rc == 0) ++done;
  }
  if (f) std::fclose(f);
  if (rc != 0) return rc;

  std::printf("persistent grid under nvtaskset -n %d%s: %d rounds, variants interleaved (order rotated per round); ms = "
              "the program's median per launch\n",
              count, no_mps ? " --no-mps" : "", done);
  std::printf("%-2s %-40s %5s %7s %9s %7s %4s %7s %9s %9s %9s\n", "", "variant", "runs", "sms", "props_sms", "grid",
              "occ", "tiles", "min_ms", "median_ms", "max_ms");
  std::map<char, double> med;
  for (const auto& v : vs) {
    std::vector<double> ms;
    for (const auto& s : v.samples) ms.push_back(s.ms);
    med[v.tag] = median(ms);
    std::printf("%-2c %-40s %5zu %7s %9s %7s %4s %7s %9.4f %9.4f %9.4f\n", v.tag, v.name.c_str(), v.samples.size(),
                values(v, &Sample::sms).c_str(), values(v, &Sample::props_sms).c_str(),
                values(v, &Sample::grid).c_str(), values(v, &Sample::occupancy).c_str(),
                values(v, &Sample::tiles).c_str(), *std::min_element(ms.begin(), ms.end()), med[v.tag],
                *std::max_element(ms.begin(), ms.end()));
  }
  // A/B per round too: A and B of one round ran minutes apart at most.
  std::vector<double> paired;
  for (size_t k = 0; k < vs[0].samples.size() && k < vs[1].samples.size(); ++k)
    if (vs[1].samples[k].ms > 0) paired.push_back(vs[0].samples[k].ms / vs[1].samples[k].ms);
  std::printf("ratio A/B=%.3f A/C=%.3f B/C=%.3f (medians; A/B per round, median %.3f: how much slower the grid sized by "
              "the whole GPU's SM count is than the one sized by the partition's)\n",
              med['A'] / med['B'], med['A'] / med['C'], med['B'] / med['C'], median(paired));
  // What makes the comparison meaningless, said rather than hidden in the table.
  for (const auto& v : vs)
    for (const auto& s : v.samples)
      if (s.props_sms >= 0 && s.props_sms != s.sms) {
        std::printf("warning: %c read %ld SMs from the attribute but %ld from the properties\n", v.tag, s.sms,
                    s.props_sms);
        break;
      }
  if (values(vs[0], &Sample::sms) == values(vs[1], &Sample::sms))
    std::printf("warning: A and B read the same SM count (%s): --partition-sm-count changed nothing\n",
                values(vs[0], &Sample::sms).c_str());
  if (values(vs[0], &Sample::tiles) != values(vs[1], &Sample::tiles) ||
      values(vs[0], &Sample::tiles) != values(vs[2], &Sample::tiles))
    std::printf("warning: the variants did not all run the same number of tiles\n");
  return 0;
}
