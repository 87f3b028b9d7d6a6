// SPDX-License-Identifier: Apache-2.0
// The body shared by `launcher` (linked against libcuda.so.1) and
// `launcher_dlopen` (which finds the driver the way cudart and PyTorch do).
// Both are ordinary CUDA programs from the shim's point of view: they know
// nothing about nvtaskset.
//
//   --kernels N          launches (default 1); with --until-file, the minimum
//   --interval-ms M      pause between launches (default 0)
//   --until-file F       keep launching until F exists (at most 120 s: a
//                        forgotten launcher ends by itself, with status 5)
//   --ready-file F       after the first launch, write our pid to F (a forked
//                        child writes F.child)
//   --idle-until F       after the loop, launch nothing more until F exists
//                        (at most 120 s, then status 5): a task that stays
//                        alive with no work on the GPU
//   --launch-when F      while idle (--idle-until), launch one more kernel
//                        once F exists: a task that turns busy on cue
//   --threads T          launch from T threads at once (default 1)
//   --print-env NAME     print "env NAME=value" or "env NAME unset" (repeatable)
//   --print-libcuda      print "libcuda <path>" for each mapped libcuda* file,
//                        before touching the driver
//   --fork               after the first launch, fork; the child prints
//                        "child <pid>", calls cuInit again and runs the same loop
//   --exec-child         after the loop, fork and exec this program again with
//                        "--kernels N"; prints "child <pid>"
//   --device N           launch on device N (default 0)
//   --print-sms          print "sms N", cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)
//                        of that device, after cuInit and again ("sms-end N")
//                        after the loop
//   --spawn CMD...       (last) after the loop, fork and exec CMD (searched on
//                        PATH) and wait for it, as a program that starts
//                        another tool would
//   --spawn-via HOW      how --spawn starts CMD: fork (default), vfork,
//                        posix_spawn, or system (through /bin/sh, which runs
//                        no fork handler, as system() and popen() do)
//   --captures N         right after the first launch, N stream captures in
//                        CUDA's global mode (1 ms each, of nothing); prints
//                        "captures N invalidated K"
//   --capture-thread N   the same N captures, 1 ms apart, on a thread of their
//                        own, while the launches go on (at least until the
//                        captures end)
//   --print-regions      after the loop, print "region-fd <link>" for each
//                        descriptor and "region-map <line>" for each mapping
//                        of a control region (memfd:nvtaskset.*) this
//                        process holds
// Prints "pid <pid>" first. Exit status: 0, or 2 (bad usage), 3 (driver
// error), 4 (a child failed), 5 (--until-file or --idle-until never appeared).
#pragma once

#include <dlfcn.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "nvtaskset/cuda_driver_api.hpp"

namespace launcher {

struct Driver {
  CUresult (*init)(unsigned int);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*launch_kernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                            unsigned int, unsigned int, CUstream, void**, void**);
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice);
};

struct Options {
  long kernels = 1;
  long interval_ms = 0;
  long threads = 1;
  long device = 0;
  std::string until_file;
  std::string ready_file;
  std::string idle_until;
  std::string launch_when;
  std::vector<std::string> print_env;
  bool print_libcuda = false;
  bool fork_child = false;
  bool exec_child = false;
  bool print_sms = false;
  std::vector<std::string> spawn;
  std::string spawn_via = "fork";
  bool print_regions = false;
  long captures = 0;
  long capture_thread = 0;
};

inline bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

[[noreturn]] inline void usage(const char* why) {
  std::fprintf(stderr, "launcher: %s\n", why);
  std::exit(2);
}

inline long number(const char* opt, const char* v) {
  char* end = nullptr;
  const long x = v ? std::strtol(v, &end, 10) : -1;
  if (!v || end == v || *end || x < 0) usage((std::string("bad value for ") + opt).c_str());
  return x;
}

inline Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--kernels") o.kernels = number("--kernels", value());
    else if (a == "--interval-ms") o.interval_ms = number("--interval-ms", value());
    else if (a == "--threads") o.threads = number("--threads", value());
    else if (a == "--device") o.device = number("--device", value());
    else if (a == "--until-file") { const char* v = value(); if (!v) usage("--until-file needs a path"); o.until_file = v; }
    else if (a == "--ready-file") { const char* v = value(); if (!v) usage("--ready-file needs a path"); o.ready_file = v; }
    else if (a == "--idle-until") { const char* v = value(); if (!v) usage("--idle-until needs a path"); o.idle_until = v; }
    else if (a == "--launch-when") { const char* v = value(); if (!v) usage("--launch-when needs a path"); o.launch_when = v; }
    else if (a == "--print-env") { const char* v = value(); if (!v) usage("--print-env needs a name"); o.print_env.push_back(v); }
    else if (a == "--print-libcuda") o.print_libcuda = true;
    else if (a == "--fork") o.fork_child = true;
    else if (a == "--exec-child") o.exec_child = true;
    else if (a == "--print-sms") o.print_sms = true;
    else if (a == "--spawn-via") { const char* v = value(); if (!v) usage("--spawn-via needs a method"); o.spawn_via = v; }
    else if (a == "--print-regions") o.print_regions = true;
    else if (a == "--captures") o.captures = number("--captures", value());
    else if (a == "--capture-thread") o.capture_thread = number("--capture-thread", value());
    else if (a == "--spawn") {
      for (++i; i < argc; ++i) o.spawn.push_back(argv[i]);
      if (o.spawn.empty()) usage("--spawn needs a command");
    }
    else usage(("unknown option " + a).c_str());
  }
  if (o.threads < 1) usage("--threads must be at least 1");
  if (o.spawn_via != "fork" && o.spawn_via != "vfork" && o.spawn_via != "posix_spawn" && o.spawn_via != "system")
    usage("--spawn-via takes fork, vfork, posix_spawn or system");
  return o;
}

inline void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "launcher: %s failed: %d\n", what, static_cast<int>(r));
    std::fflush(nullptr);
    std::_Exit(3);
  }
}

inline void print_libcuda_maps() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> seen;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("/libcuda") != std::string::npos && seen.insert(path).second)
      std::printf("libcuda %s\n", path.c_str());
  }
}

inline void write_ready(const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << ::getpid() << "\n";
  }
  // rename: the test never sees a half-written file.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::perror("launcher: rename");
    std::_Exit(3);
  }
}

// The device --device names (set once in main, before any thread starts).
inline long g_device = 0;

// One launch from the calling thread, on that device's primary context.
inline void launch_once(const Driver& d) {
  CUdevice dev;
  CUcontext ctx;
  check(d.device_get(&dev, static_cast<int>(g_device)), "cuDeviceGet");
  check(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(d.ctx_set_current(ctx), "cuCtxSetCurrent");
  check(d.launch_kernel(nullptr, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr), "cuLaunchKernel");
}

inline void print_sms(const Driver& d, const char* label) {
  CUdevice dev;
  int sms = -1;
  check(d.device_get(&dev, static_cast<int>(g_device)), "cuDeviceGet");
  check(d.device_get_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute");
  std::printf("%s %d\n", label, sms);
  std::fflush(stdout);
}

inline void sleep_ms(long ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// Launches until `--kernels` are done and, with --until-file, until the file
// exists. `after_first` runs once, right after the first launch.
inline void capture_loop(long n, long gap_ms = 0);

// --capture-thread: whether its captures are still under way.
inline std::atomic<bool> g_capturing{false};

template <class F>
void run_loop(const Driver& d, const Options& o, F&& after_first) {
  launch_once(d);
  after_first();
  std::thread capturer;
  if (o.capture_thread > 0) {
    g_capturing = true;
    capturer = std::thread([&] {
      capture_loop(o.capture_thread, 1);
      g_capturing = false;
    });
  }
  std::atomic<long> launched{1};
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::atomic<bool> expired{false};
  auto more = [&] {
    if (g_capturing.load()) return true;
    if (launched.load() < o.kernels) return true;
    if (o.until_file.empty() || exists(o.until_file)) return false;
    if (std::chrono::steady_clock::now() < give_up) return true;
    expired = true;
    return false;
  };
  auto worker = [&] {
    while (more()) {
      sleep_ms(o.interval_ms);
      if (!more()) break;
      launch_once(d);
      ++launched;
    }
  };
  std::vector<std::thread> extra;
  for (long t = 1; t < o.threads; ++t) extra.emplace_back(worker);
  worker();
  for (auto& t : extra) t.join();
  if (capturer.joinable()) capturer.join();
  if (expired) {
    std::fprintf(stderr, "launcher: %s did not appear within 120 s\n", o.until_file.c_str());
    std::fflush(nullptr);
    std::_Exit(5);
  }
}

inline int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 4;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  std::fprintf(stderr, "launcher: child %d failed (status 0x%x)\n", static_cast<int>(pid), status);
  return 4;
}

// fork, then exec `cmd[0]` (searched on PATH) with argv cmd[1..]. Returns the
// child's pid, or -1 with a message.
inline pid_t start_child(const std::vector<std::string>& cmd) {
  std::fflush(nullptr);
  const pid_t c = ::fork();
  if (c < 0) {
    std::perror("launcher: fork");
    return -1;
  }
  if (c == 0) {
    std::vector<char*> args;
    for (std::size_t i = 1; i < cmd.size(); ++i) args.push_back(const_cast<char*>(cmd[i].c_str()));
    args.push_back(nullptr);
    ::execvp(cmd[0].c_str(), args.data());
    std::perror("launcher: exec");
    std::_Exit(127);
  }
  return c;
}

inline void print_regions() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code ec2;
    const std::string link = std::filesystem::read_symlink(e.path(), ec2).string();
    if (link.find("memfd:nvtaskset.") != std::string::npos) std::printf("region-fd %s\n", link.c_str());
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("memfd:nvtaskset.") != std::string::npos) std::printf("region-map %s\n", line.c_str());
}

// Starts `cmd` (argv, searched on PATH) the way `how` says and waits for it.
inline int spawn_and_wait(const std::vector<std::string>& cmd, const std::string& how) {
  std::fflush(nullptr);
  std::vector<char*> args;
  for (const auto& a : cmd) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t c = -1;
  if (how == "system") {
    std::string line;
    for (const auto& a : cmd) line += (line.empty() ? "'" : " '") + a + "'";
    const int st = std::system(line.c_str());
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    std::fprintf(stderr, "launcher: system(%s) failed (status 0x%x)\n", line.c_str(), st);
    return 4;
  }
  if (how == "posix_spawn") {
    if (::posix_spawnp(&c, args[0], nullptr, nullptr, args.data(), environ) != 0) c = -1;
  } else if (how == "vfork") {
    c = ::vfork();
    if (c == 0) {
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
  } else {
    c = ::fork();
    if (c == 0) {
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
  }
  if (c < 0) {
    std::perror("launcher: spawn");
    return 3;
  }
  return wait_child(c);
}

// --captures N: N stream captures in CUDA's global mode, one after another,
// each held open 1 ms (on a stream of its own, capturing nothing), right
// after the first launch; prints "captures N invalidated K". The capture
// functions are looked up where the program's libcuda.so.1 is (the shim
// under nvtaskset).
inline void capture_loop(long n, long gap_ms) {
  using BeginFn = CUresult (*)(CUstream, int);
  using EndFn = CUresult (*)(CUstream, CUgraph*);
  using CreateFn = CUresult (*)(CUstream*, unsigned);
  const auto begin = reinterpret_cast<BeginFn>(::dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2"));
  const auto end = reinterpret_cast<EndFn>(::dlsym(RTLD_DEFAULT, "cuStreamEndCapture"));
  const auto create = reinterpret_cast<CreateFn>(::dlsym(RTLD_DEFAULT, "cuStreamCreate"));
  if (!begin || !end || !create) usage("--captures: the driver has no stream capture");
  CUstream s = nullptr;
  check(create(&s, 0), "cuStreamCreate");
  long invalidated = 0;
  for (long i = 0; i < n; ++i) {
    check(begin(s, 0), "cuStreamBeginCapture_v2");
    sleep_ms(1);
    CUgraph g = nullptr;
    const CUresult r = end(s, &g);
    if (r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) ++invalidated;
    else check(r, "cuStreamEndCapture");
    sleep_ms(gap_ms);
  }
  std::printf("captures %ld invalidated %ld\n", n, invalidated);
  std::fflush(stdout);
}

inline int main(int argc, char** argv, const Driver& d) {
  const Options o = parse(argc, argv);
  g_device = o.device;
  std::printf("pid %d\n", static_cast<int>(::getpid()));
  for (const auto& name : o.print_env) {
    const char* v = std::getenv(name.c_str());
    if (v) std::printf("env %s=%s\n", name.c_str(), v);
    else std::printf("env %s unset\n", name.c_str());
  }
  if (o.print_libcuda) print_libcuda_maps();
  std::fflush(stdout);

  check(d.init(0), "cuInit");
  if (o.print_sms) print_sms(d, "sms");
  pid_t forked = -1;
  run_loop(d, o, [&] {
    if (o.captures > 0) capture_loop(o.captures);
    if (!o.ready_file.empty()) write_ready(o.ready_file);
    if (!o.fork_child) return;
    std::fflush(nullptr);
    forked = ::fork();
    if (forked < 0) {
      std::perror("launcher: fork");
      std::_Exit(3);
    }
    if (forked == 0) {
      std::printf("child %d\n", static_cast<int>(::getpid()));
      std::fflush(stdout);
      // A forked CUDA program initialises the driver again in the child.
      check(d.init(0), "cuInit (child)");
      launch_once(d);
      if (!o.ready_file.empty()) write_ready(o.ready_file + ".child");
    }
  });
  // The forked child ends normally (exit(), as a program's child would), so
  // whatever the shim does at exit happens.
  if (forked == 0) std::exit(0);
  if (!o.idle_until.empty()) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    bool woke = o.launch_when.empty();
    while (!exists(o.idle_until)) {
      if (!woke && exists(o.launch_when)) {
        launch_once(d);
        woke = true;
      }
      if (std::chrono::steady_clock::now() > give_up) {
        std::fprintf(stderr, "launcher: %s did not appear within 120 s\n", o.idle_until.c_str());
        std::fflush(nullptr);
        std::_Exit(5);
      }
      sleep_ms(2);
    }
  }
  int rc = 0;
  if (forked > 0) rc = wait_child(forked);
  if (o.print_sms) print_sms(d, "sms-end");

  if (o.exec_child) {
    const pid_t c = start_child({"/proc/self/exe", argv[0], "--kernels", std::to_string(o.kernels)});
    if (c < 0) return 3;
    std::printf("child %d\n", static_cast<int>(c));
    std::fflush(stdout);
    if (int r = wait_child(c)) rc = r;
  }
  if (o.print_regions) print_regions();
  if (!o.spawn.empty()) {
    if (int r = spawn_and_wait(o.spawn, o.spawn_via)) rc = r;
  }
  return rc;
}

}  // namespace launcher
