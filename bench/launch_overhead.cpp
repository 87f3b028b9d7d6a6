// Launch overhead of the shim: host enqueue time of empty kernels with the
// shim loaded and a partition set, against the plain driver, measured in
// alternating rounds in one run (the machines are noisy) and printed as a
// ratio. Target: <= 1.01x on a GPU.
//
//   bench_launch_overhead --real /path/to/libcuda.so.1 --shim-dir DIR [--launches N] [--rounds R]
//
// Each round runs this program again as a worker that dlopen()s
// "libcuda.so.1" the way the CUDA runtime does: once with the real driver's
// directory first in LD_LIBRARY_PATH (plain), once with the shim's (shim),
// and the partition enabling all 128 mask bits, so every launch takes the
// full masking path without changing where kernels run.
#include <cuda.h>
#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

const char* kPtx = ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry empty()\n{\nret;\n}\n";

template <class F>
F sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (!p) {
    std::fprintf(stderr, "worker: %s missing\n", name);
    std::exit(2);
  }
  return reinterpret_cast<F>(p);
}

int worker(long launches) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) {
    std::fprintf(stderr, "worker: %s\n", dlerror());
    return 2;
  }
  auto init = sym<CUresult (*)(unsigned)>(h, "cuInit");
  auto dev_get = sym<CUresult (*)(CUdevice*, int)>(h, "cuDeviceGet");
  auto retain = sym<CUresult (*)(CUcontext*, CUdevice)>(h, "cuDevicePrimaryCtxRetain");
  auto set_cur = sym<CUresult (*)(CUcontext)>(h, "cuCtxSetCurrent");
  auto load = sym<CUresult (*)(CUmodule*, const void*)>(h, "cuModuleLoadData");
  auto get_fn = sym<CUresult (*)(CUfunction*, CUmodule, const char*)>(h, "cuModuleGetFunction");
  auto launch = sym<CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 CUstream, void**, void**)>(h, "cuLaunchKernel");
  auto sync = sym<CUresult (*)()>(h, "cuCtxSynchronize");
  CUdevice dev{};
  CUcontext ctx{};
  if (init(0) || dev_get(&dev, 0)) return 3;
  retain(&ctx, dev);
  set_cur(ctx);
  CUmodule mod{};
  CUfunction fn{};
  // The stand-in driver runs no kernels (no module); it still takes launches.
  if (load(&mod, kPtx) == CUDA_SUCCESS) get_fn(&fn, mod, "empty");
  for (int i = 0; i < 1000; ++i) launch(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr);
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < launches; ++i)
    if (launch(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr) != CUDA_SUCCESS) return 4;
  const auto t1 = std::chrono::steady_clock::now();
  sync();
  std::printf("%.2f\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / launches);
  return 0;
}

double run_worker(const std::string& self, long launches, const std::vector<std::string>& extra_env) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string s = *e;
    bool overridden = false;
    for (const auto& x : extra_env)
      if (s.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0) overridden = true;
    if (!overridden) env.push_back(s);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string n = std::to_string(launches);
  char* argv[] = {const_cast<char*>(self.c_str()), const_cast<char*>("--worker"), const_cast<char*>(n.c_str()),
                  nullptr};
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), &fa, nullptr, argv, envp.data()) != 0) return -1;
  close(fds[1]);
  char buf[64] = {};
  const ssize_t got = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return std::atof(buf);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string real, shim_dir;
  long launches = 100000;
  int rounds = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--worker") return worker(std::atol(v));
    if (a == "--real") real = v, ++i;
    else if (a == "--shim-dir") shim_dir = v, ++i;
    else if (a == "--launches") launches = std::atol(v), ++i;
    else if (a == "--rounds") rounds = std::atoi(v), ++i;
    else {
      std::fprintf(stderr, "usage: %s --real LIBCUDA --shim-dir DIR [--launches N] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  if (real.empty() || shim_dir.empty()) {
    std::fprintf(stderr, "usage: %s --real LIBCUDA --shim-dir DIR [--launches N] [--rounds R]\n", argv[0]);
    return 2;
  }
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 2;
  const std::string real_dir = real.substr(0, real.rfind('/'));
  const std::vector<std::string> plain{"LD_LIBRARY_PATH=" + real_dir};
  const std::vector<std::string> shim{"LD_LIBRARY_PATH=" + shim_dir + ":" + real_dir,
                                      "NVTASKSET_REAL_LIBCUDA=" + real,
                                      "NVTASKSET_PARTITION=*,4,0xffffffffffffffffffffffffffffffff,0x0,0x0"};
  std::vector<double> a, b, ratios;
  for (int r = 0; r < rounds; ++r) {
    const double x = run_worker(self, launches, plain);
    const double y = run_worker(self, launches, shim);
    if (x <= 0 || y <= 0) {
      std::fprintf(stderr, "bench_launch_overhead: a worker failed\n");
      return 1;
    }
    a.push_back(x);
    b.push_back(y);
    ratios.push_back(y / x);
  }
  std::printf("launches per round: %ld, rounds: %d (alternating)\n", launches, rounds);
  std::printf("plain driver:           %.1f ns/launch (median)\n", median(a));
  std::printf("shim + partition:       %.1f ns/launch (median)\n", median(b));
  std::printf("launch overhead ratio:  %.3fx (median of per-round ratios; target <= 1.01x on a GPU)\n",
              median(ratios));
  return 0;
}
