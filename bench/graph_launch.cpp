// SPDX-License-Identifier: Apache-2.0
// Host cost of cuGraphLaunch with the shim, which (to make graph replays
// follow `nvtaskset -p`) looks at every graph launch whether the partition
// changed and, after a change, re-encodes the exec's kernel nodes.
//
//   bench_graph_launch --real /path/to/libcuda.so.1 --shim-dir DIR [--uuid GPU-...]
//                      [--nvtaskset PATH] [--lists A,B] [--rounds R] [--launches N] [--changes K]
//
// 1. Steady state, side by side as bench_launch_overhead does: each round runs
//    this program again as a worker that dlopen()s "libcuda.so.1" (the real
//    driver's directory first in LD_LIBRARY_PATH, or the shim's with a
//    partition enabling every mask bit, keyed by --uuid as the CLI sets it, or
//    "any GPU" without --uuid), builds a chain of empty-kernel nodes, and
//    times cuGraphLaunch in batches that never fill the GPU's queue (each
//    batch's synchronize is untimed). Graphs of 1 and 100 nodes; configurations
//    interleaved in every round; medians of per-round ratios. Target <= 1.01x.
// 2. The one-off cost after a change: a worker started as
//    `nvtaskset --no-mps -t A bench_graph_launch ...` builds graphs of 1, 100
//    and 1000 nodes and, K times each, runs `nvtaskset -p -t B|A <its own pid>`
//    then times the next cuGraphLaunch (the shim re-encodes every kernel node
//    there). Control: the first launch after running `nvtaskset --version`
//    (same cold caches, no change), and a steady launch right after.
//
// The graph functions are taken through cuGetProcAddress as the CUDA runtime
// (and so PyTorch) does; BENCH_DLSYM=1 takes them with dlsym instead. The
// kernel comes from PTX text: building needs no CUDA toolkit.
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nvtaskset/cuda_driver_api.hpp"
#include "all_bits_partition.hpp"

extern char** environ;

namespace {

const char* kPtx = ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry empty()\n{\nret;\n}\n";

using Clock = std::chrono::steady_clock;

double ns_since(Clock::time_point t0) { return std::chrono::duration<double, std::nano>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- the worker's driver ------------------------------------------------------------------------

struct Driver {
  void* h = nullptr;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*dev_get)(CUdevice*, int) = nullptr;
  CUresult (*retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*set_cur)(CUcontext) = nullptr;
  CUresult (*load)(CUmodule*, const void*) = nullptr;
  CUresult (*get_fn)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*stream_create)(CUstream*, unsigned) = nullptr;
  CUresult (*stream_sync)(CUstream) = nullptr;
  CUresult (*graph_create)(CUgraph*, unsigned) = nullptr;
  CUresult (*add_kernel)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_KERNEL_NODE_PARAMS*) = nullptr;
  CUresult (*instantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*upload)(CUgraphExec, CUstream) = nullptr;
  CUresult (*launch)(CUgraphExec, CUstream) = nullptr;
  CUfunction fn{};
  CUstream stream{};

  template <class F>
  void sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(h, name));
    if (!f) {
      std::fprintf(stderr, "worker: %s missing\n", name);
      std::exit(2);
    }
  }
  // As the CUDA runtime gets its entry points.
  // `name` for cuGetProcAddress (which picks the version matching CUDA_VERSION),
  // `versioned` for dlsym (the plain symbol is the oldest ABI).
  template <class F>
  void proc(F& f, const char* name, const char* versioned) {
    static auto gpa = reinterpret_cast<CUresult (*)(const char*, void**, int, cuuint64_t,
                                                    CUdriverProcAddressQueryResult*)>(
        dlsym(h, "cuGetProcAddress_v2"));
    const char* d = std::getenv("BENCH_DLSYM");
    if (gpa == nullptr || (d != nullptr && *d != '\0')) return sym(f, versioned);
    void* p = nullptr;
    CUdriverProcAddressQueryResult st{};
    if (gpa(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || p == nullptr) {
      std::fprintf(stderr, "worker: cuGetProcAddress(%s) failed\n", name);
      std::exit(2);
    }
    f = reinterpret_cast<F>(p);
  }

  void open() {
    h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
      std::fprintf(stderr, "worker: %s\n", dlerror());
      std::exit(2);
    }
    sym(init, "cuInit");
    sym(dev_get, "cuDeviceGet");
    sym(retain, "cuDevicePrimaryCtxRetain");
    sym(set_cur, "cuCtxSetCurrent");
    sym(load, "cuModuleLoadData");
    sym(get_fn, "cuModuleGetFunction");
    sym(stream_create, "cuStreamCreate");
    sym(stream_sync, "cuStreamSynchronize");
    proc(graph_create, "cuGraphCreate", "cuGraphCreate");
    proc(add_kernel, "cuGraphAddKernelNode", "cuGraphAddKernelNode_v2");
    // By its own name: "cuGraphInstantiate" resolves to the 5-argument
    // cuGraphInstantiate_v2 even for CUDA 13.0 (docs/hardware.md).
    proc(instantiate, "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags");
    proc(upload, "cuGraphUpload", "cuGraphUpload");
    proc(launch, "cuGraphLaunch", "cuGraphLaunch");
    CUdevice dev{};
    CUcontext ctx{};
    CUmodule mod{};
    must(init(0), "cuInit");
    must(dev_get(&dev, 0), "cuDeviceGet");
    must(retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    must(set_cur(ctx), "cuCtxSetCurrent");
    must(load(&mod, kPtx), "cuModuleLoadData");
    must(get_fn(&fn, mod, "empty"), "cuModuleGetFunction");
    must(stream_create(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }

  // A chain of `nodes` empty-kernel nodes, instantiated and uploaded.
  CUgraphExec graph(int nodes) {
    CUgraph g{};
    must(graph_create(&g, 0), "cuGraphCreate");
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = fn;
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 32;
    p.blockDimY = p.blockDimZ = 1;
    CUgraphNode prev{};
    for (int i = 0; i < nodes; ++i) {
      CUgraphNode n{};
      must(add_kernel(&n, g, i ? &prev : nullptr, i ? 1 : 0, &p), "cuGraphAddKernelNode");
      prev = n;
    }
    CUgraphExec e{};
    must(instantiate(&e, g, 0), "cuGraphInstantiate");
    must(upload(e, stream), "cuGraphUpload");
    return e;
  }

  void must(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "worker: %s -> %d\n", what, static_cast<int>(r));
      std::exit(4);
    }
  }
};

// A worker that dies of a signal says where (stderr is the bench's), so a
// failed run names its cause instead of "a worker failed".
void crash_report(int sig) {
  void* frames[32];
  const int n = backtrace(frames, 32);
  char msg[64];
  const int len = std::snprintf(msg, sizeof msg, "worker: signal %d; backtrace:\n", sig);
  (void)!::write(2, msg, static_cast<size_t>(len));
  backtrace_symbols_fd(frames, n, 2);
  std::_Exit(128 + sig);
}

void install_crash_report() {
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) std::signal(sig, crash_report);
}

// A worker's result is complete once printed: flushed before it returns.
int finish_worker() {
  std::fflush(stdout);
  return 0;
}

// Steady state: ns per cuGraphLaunch of a graph of `nodes` nodes.
int worker_steady(int nodes, long launches) {
  Driver d;
  d.open();
  CUgraphExec e = d.graph(nodes);
  for (int i = 0; i < 50; ++i) d.must(d.launch(e, d.stream), "cuGraphLaunch");
  d.must(d.stream_sync(d.stream), "sync");
  // At most ~512 kernels in flight per batch: the queue never fills.
  const long batch = std::max(1, std::min(256, 512 / nodes));
  double ns = 0;
  long done = 0;
  while (done < launches) {
    const auto t0 = Clock::now();
    for (long i = 0; i < batch; ++i) d.must(d.launch(e, d.stream), "cuGraphLaunch");
    ns += ns_since(t0);
    done += batch;
    d.must(d.stream_sync(d.stream), "sync");
  }
  std::printf("%.2f\n", ns / done);
  return finish_worker();
}

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& env, int out_fd) {
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  else posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

bool run_quiet(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  const pid_t pid = spawn(args, env, -1);
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The environment for the CLI run from inside the task: the task's own, less
// what nvtaskset gave the task (the CLI needs no shim and no partition).
std::vector<std::string> cli_env() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string s = *e;
    if (s.rfind("NVTASKSET_PARTITION", 0) == 0 || s.rfind("LD_LIBRARY_PATH=", 0) == 0) continue;
    env.push_back(s);
  }
  return env;
}

// After-a-change cost, run under nvtaskset: prints, per graph size,
// "<nodes> <change us> <control us> <steady us>" (medians over `changes`).
int worker_change(int changes, const std::string& nvtaskset, const std::string& list_a, const std::string& list_b) {
  Driver d;
  d.open();
  const std::vector<std::string> env = cli_env();
  const std::string self = std::to_string(getpid());
  int k = 0;
  for (int nodes : {1, 100, 1000}) {
    CUgraphExec e = d.graph(nodes);
    for (int i = 0; i < 5; ++i) d.must(d.launch(e, d.stream), "cuGraphLaunch");
    d.must(d.stream_sync(d.stream), "sync");
    std::vector<double> change, control, steady;
    for (int c = 0; c < changes; ++c) {
      if (!run_quiet({nvtaskset, "--version"}, env)) return 5;
      auto t0 = Clock::now();
      d.must(d.launch(e, d.stream), "cuGraphLaunch");
      control.push_back(ns_since(t0) / 1000);
      d.must(d.stream_sync(d.stream), "sync");

      // Alternate between the lists: every -p is a real change.
      const std::string& next = (k++ % 2 == 0) ? list_b : list_a;
      if (!run_quiet({nvtaskset, "-p", "-t", next, self}, env)) {
        std::fprintf(stderr, "worker: nvtaskset -p -t %s %s failed\n", next.c_str(), self.c_str());
        return 5;
      }
      t0 = Clock::now();
      d.must(d.launch(e, d.stream), "cuGraphLaunch");
      change.push_back(ns_since(t0) / 1000);
      d.must(d.stream_sync(d.stream), "sync");

      t0 = Clock::now();
      d.must(d.launch(e, d.stream), "cuGraphLaunch");
      steady.push_back(ns_since(t0) / 1000);
      d.must(d.stream_sync(d.stream), "sync");
    }
    std::printf("%d %.2f %.2f %.2f\n", nodes, median(change), median(control), median(steady));
  }
  return finish_worker();
}

// ---- the driver of the benchmark ----------------------------------------------------------------

std::vector<std::string> merged_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string s = *e;
    bool overridden = false;
    for (const auto& x : extra)
      if (s.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0) overridden = true;
    if (!overridden) env.push_back(s);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Runs argv with env; returns its stdout, or "" if it failed.
std::string capture(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  int fds[2];
  if (pipe(fds) != 0) return "";
  const pid_t pid = spawn(args, env, fds[1]);
  close(fds[1]);
  std::string out;
  char buf[512];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(got));
  close(fds[0]);
  int status = 0;
  if (pid <= 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return "";
  return out;
}

const char* kUsage =
    "usage: %s --real LIBCUDA --shim-dir DIR [--uuid GPU-...] [--nvtaskset PATH] [--lists A,B] [--rounds R] "
    "[--launches N] [--changes K]\n";

}  // namespace


int main(int argc, char** argv) {
  std::string real, shim_dir, uuid, nvtaskset, list_a = "0-7", list_b = "8-15";
  long launches = 20000;
  int rounds = 7, changes = 15;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto v = [&](int k) -> std::string { return i + k < argc ? argv[i + k] : ""; };
    if (a.rfind("--worker", 0) == 0) install_crash_report();
    if (a == "--worker-steady") return worker_steady(std::atoi(v(1).c_str()), std::atol(v(2).c_str()));
    if (a == "--worker-change") return worker_change(std::atoi(v(1).c_str()), v(2), v(3), v(4));
    if (i + 1 >= argc) {
      std::fprintf(stderr, kUsage, argv[0]);
      return 2;
    }
    const std::string val = argv[++i];
    if (a == "--real") real = val;
    else if (a == "--shim-dir") shim_dir = val;
    else if (a == "--uuid") uuid = val;
    else if (a == "--nvtaskset") nvtaskset = val;
    else if (a == "--lists") list_a = val.substr(0, val.find(',')), list_b = val.substr(val.find(',') + 1);
    else if (a == "--rounds") rounds = std::atoi(val.c_str());
    else if (a == "--launches") launches = std::atol(val.c_str());
    else if (a == "--changes") changes = std::atoi(val.c_str());
    else {
      std::fprintf(stderr, kUsage, argv[0]);
      return 2;
    }
  }
  if (real.empty() || shim_dir.empty()) {
    std::fprintf(stderr, kUsage, argv[0]);
    return 2;
  }
  char selfbuf[4096] = {};
  if (readlink("/proc/self/exe", selfbuf, sizeof selfbuf - 1) <= 0) return 2;
  const std::string self = selfbuf;
  if (nvtaskset.empty()) nvtaskset = self.substr(0, self.rfind('/')) + "/../bin/nvtaskset";
  const std::string real_dir = real.substr(0, real.rfind('/'));
  const std::vector<std::string> plain{"LD_LIBRARY_PATH=" + real_dir};
  const std::vector<std::string> shim{"LD_LIBRARY_PATH=" + shim_dir + ":" + real_dir, "NVTASKSET_REAL_LIBCUDA=" + real,
                                      "NVTASKSET_PARTITION=" + all_bits_partition(uuid),
                                      "NVTASKSET_PARTITION_PID="};
  const char* shim_name = uuid.empty() ? "shim, any-GPU partition" : "shim, per-GPU partition";

  std::printf("part 1: host time per cuGraphLaunch, %ld launches per worker (1/10 of that for 100 nodes), %d rounds, "
              "configurations interleaved\n",
              launches, rounds);
  for (int nodes : {1, 100}) {
    std::vector<double> p_ns, s_ns, ratio;
    // A 100-node graph keeps the GPU busy ~100x longer per launch: 1/10 of the launches.
    const long n_launch = nodes == 1 ? launches : std::max(200L, launches / 10);
    const std::vector<std::string> args{self, "--worker-steady", std::to_string(nodes), std::to_string(n_launch)};
    for (int r = 0; r < rounds; ++r) {
      const double p = std::atof(capture(args, merged_env(plain)).c_str());
      const double s = std::atof(capture(args, merged_env(shim)).c_str());
      if (p <= 0 || s <= 0) {
        std::fprintf(stderr, "bench_graph_launch: the %s worker failed (graph of %d nodes)\n",
                     p <= 0 ? "plain-driver" : "shim", nodes);
        return 1;
      }
      p_ns.push_back(p);
      s_ns.push_back(s);
      ratio.push_back(s / p);
    }
    std::printf("graph of %d node%s: plain driver %.1f ns, %s (no change) %.1f ns per cuGraphLaunch (medians); "
                "ratio %.3fx (median of per-round ratios; target <= 1.01x)\n",
                nodes, nodes == 1 ? "" : "s", median(p_ns), shim_name, median(s_ns), median(ratio));
  }

  std::printf("part 2: first cuGraphLaunch after `nvtaskset -p` (lists %s and %s alternating), %d changes per size\n",
              list_a.c_str(), list_b.c_str(), changes);
  const std::string out = capture({nvtaskset, "--no-mps", "-t", list_a, self, "--worker-change", std::to_string(changes),
                                   nvtaskset, list_a, list_b},
                                  merged_env({"NVTASKSET_REAL_LIBCUDA=" + real}));
  if (out.empty()) {
    std::fprintf(stderr, "bench_graph_launch: the change worker failed (nvtaskset %s)\n", nvtaskset.c_str());
    return 1;
  }
  int nodes = 0;
  double change = 0, control = 0, steady = 0;
  const char* p = out.c_str();
  int used = 0;
  while (std::sscanf(p, "%d %lf %lf %lf%n", &nodes, &change, &control, &steady, &used) == 4) {
    std::printf("first launch after a change, %d nodes: %.2f us (control: first launch after `nvtaskset --version` "
                "%.2f us; steady %.2f us); re-encoding adds about %.2f us\n",
                nodes, change, control, steady, change - control);
    p += used;
  }
  return 0;
}
