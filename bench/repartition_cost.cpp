// SPDX-License-Identifier: Apache-2.0
// Repartition cost: wall time of `nvtaskset -p -t LIST PID` against a live
// partitioned task, next to the time of `nvtaskset --version` (the cost of
// starting the CLI at all), in alternating runs, printed with their ratio.
// Target: under 10 ms per repartition.
//
//   bench_repartition [--nvtaskset PATH] [--runs N] [--lists A,B]
// The task is this program in --idle mode started under `nvtaskset --no-mps`;
// it dlopen()s libcuda.so.1 (so the shim and its control region exist) and
// waits. Set NVTASKSET_REAL_LIBCUDA as for any nvtaskset run.
#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

pid_t spawn(const std::vector<std::string>& args, bool quiet) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 0x1 /*O_WRONLY*/, 0);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

double timed_ms(const std::vector<std::string>& args) {
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = spawn(args, true);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 2;
  std::string exe = self;
  std::string nvtaskset = exe.substr(0, exe.rfind('/')) + "/../bin/nvtaskset";
  int runs = 21;
  std::string list_a = "0", list_b = "1";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--idle") {
      // The task: load the driver (through the shim) and wait to be killed.
      if (!dlopen("libcuda.so.1", RTLD_NOW)) {
        std::fprintf(stderr, "idle: %s\n", dlerror());
        return 2;
      }
      if (i + 1 < argc) {
        if (FILE* f = std::fopen(argv[i + 1], "w")) std::fclose(f);
      }
      for (;;) pause();
    }
    const char* v = i + 1 < argc ? argv[++i] : "";
    if (a == "--nvtaskset") nvtaskset = v;
    else if (a == "--runs") runs = std::atoi(v);
    else if (a == "--lists") {
      const std::string s = v;
      list_a = s.substr(0, s.find(','));
      list_b = s.substr(s.find(',') + 1);
    } else {
      std::fprintf(stderr, "usage: %s [--nvtaskset PATH] [--runs N] [--lists A,B]\n", argv[0]);
      return 2;
    }
  }
  const std::string ready = "/tmp/nvtaskset-bench-ready." + std::to_string(getpid());
  const pid_t task = spawn({nvtaskset, "--no-mps", "-t", list_a, exe, "--idle", ready}, false);
  struct stat st {};
  for (int i = 0; i < 500 && stat(ready.c_str(), &st) != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  unlink(ready.c_str());
  if (task < 0 || stat("/proc", &st) != 0) return 1;
  const std::string pid = std::to_string(task);
  std::vector<double> repart, version;
  bool ok = true;
  for (int r = 0; r < runs && ok; ++r) {
    const double v = timed_ms({nvtaskset, "--version"});
    const double p = timed_ms({nvtaskset, "-p", "-t", r % 2 ? list_a : list_b, pid});
    ok = v > 0 && p > 0;
    version.push_back(v);
    repart.push_back(p);
  }
  kill(task, SIGKILL);
  waitpid(task, nullptr, 0);
  if (!ok) {
    std::fprintf(stderr, "bench_repartition: a run failed (is the task partitioned? NVTASKSET_REAL_LIBCUDA?)\n");
    return 1;
  }
  std::printf("runs: %d (alternating)\n", runs);
  std::printf("nvtaskset --version:        %.2f ms (median)\n", median(version));
  std::printf("nvtaskset -p -t LIST PID:   %.2f ms (median; target < 10 ms)\n", median(repart));
  std::printf("repartition / CLI start:    %.2fx\n", median(repart) / median(version));
  return 0;
}
