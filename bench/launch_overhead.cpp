// SPDX-License-Identifier: Apache-2.0
// Launch overhead of the shim: host enqueue time of empty kernels with the
// shim loaded and a partition set, against the plain driver, measured in
// interleaved rounds in one run (the machines are noisy) and printed as
// ratios. Target: <= 1.01x on a GPU.
//
//   bench_launch_overhead --real /path/to/libcuda.so.1 --shim-dir DIR [--uuid GPU-...]
//                         [--launches N] [--rounds R]
//
// Each round runs this program again as a worker that dlopen()s
// "libcuda.so.1" the way the CUDA runtime does, in each configuration:
//   plain         the real driver's directory first in LD_LIBRARY_PATH;
//   shim, none    the shim loaded, no partition (system-wide mode);
//   shim, any     a partition for "any device" enabling all 128 mask bits,
//                 so every launch takes the full masking path without
//                 changing where kernels run;
//   shim, uuid    the same partition keyed by the GPU's UUID (--uuid), as the
//                 CLI sets it, which adds the per-launch device lookup;
//   driver hook   no shim: the worker itself subscribes an empty callback to
//                 the same driver hook, which isolates what the driver's
//                 callback dispatch costs from what the shim adds.
#include <cstdint>
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

#include "nvtaskset/cuda_driver_api.hpp"
#include "all_bits_partition.hpp"

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

void noop_callback(void*, int, int, const void*) {}

int worker(long launches, bool self_hook) {
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
  if (self_hook) {
    // The hook of docs/hardware.md / launch_hook.hpp, with a callback that does nothing.
    static const unsigned char uuid[16] = {0x2c, 0x8e, 0x0a, 0xd8, 0x07, 0x10, 0xab, 0x4e,
                                           0x90, 0xdd, 0x54, 0x71, 0x9f, 0xe5, 0xf7, 0x4b};
    auto get_table = sym<CUresult (*)(const void**, const CUuuid*)>(h, "cuGetExportTable");
    const void* table = nullptr;
    if (get_table(&table, reinterpret_cast<const CUuuid*>(uuid)) != CUDA_SUCCESS || !table) return 5;
    auto sub = reinterpret_cast<int (*)(std::uint32_t*, void (*)(void*, int, int, const void*), void*)>(
        static_cast<void* const*>(table)[3]);
    auto en = reinterpret_cast<int (*)(std::uint32_t, std::uint32_t, int, int)>(static_cast<void* const*>(table)[6]);
    std::uint32_t handle = 0;
    if (sub(&handle, noop_callback, nullptr) != 0 || en(1, handle, 0xb, 1) != 0) return 5;
  }
  retain(&ctx, dev);
  set_cur(ctx);
  CUmodule mod{};
  CUfunction fn{};
  // The stand-in driver runs no kernels (no module); it still takes launches.
  if (load(&mod, kPtx) == CUDA_SUCCESS) get_fn(&fn, mod, "empty");
  for (int i = 0; i < 1000; ++i) launch(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr);
  sync();
  // Host enqueue time only: launches go in batches small enough never to fill
  // the GPU's queue (a full queue makes cuLaunchKernel wait for the GPU, which
  // would time the GPU instead), with an untimed synchronize between batches.
  constexpr long kBatch = 256;
  double ns = 0;
  for (long done = 0; done < launches; done += kBatch) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kBatch; ++i)
      if (launch(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr) != CUDA_SUCCESS) return 4;
    const auto t1 = std::chrono::steady_clock::now();
    ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
    sync();
  }
  std::printf("%.2f\n", ns / ((launches + kBatch - 1) / kBatch * kBatch));
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
  std::string real, shim_dir, uuid;
  long launches = 100000;
  int rounds = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--worker") {
      const char* hook = std::getenv("BENCH_SELF_HOOK");
      return worker(std::atol(v), hook != nullptr && *hook != '\0');
    }
    if (a == "--real") real = v, ++i;
    else if (a == "--shim-dir") shim_dir = v, ++i;
    else if (a == "--uuid") uuid = v, ++i;
    else if (a == "--launches") launches = std::atol(v), ++i;
    else if (a == "--rounds") rounds = std::atoi(v), ++i;
    else {
      std::fprintf(stderr, "usage: %s --real LIBCUDA --shim-dir DIR [--uuid GPU-...] [--launches N] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  if (real.empty() || shim_dir.empty()) {
    std::fprintf(stderr, "usage: %s --real LIBCUDA --shim-dir DIR [--uuid GPU-...] [--launches N] [--rounds R]\n", argv[0]);
    return 2;
  }
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 2;
  const std::string real_dir = real.substr(0, real.rfind('/'));
  const std::vector<std::string> plain{"LD_LIBRARY_PATH=" + real_dir};
  struct Config {
    const char* name;
    std::vector<std::string> env;
    std::vector<double> ns, ratio;
  };
  std::vector<Config> configs;
  configs.push_back({"plain driver", plain, {}, {}});
  std::vector<std::string> hooked = plain;
  hooked.push_back("BENCH_SELF_HOOK=1");
  configs.push_back({"driver hook, empty callback", hooked, {}, {}});
  auto shim_env = [&](const std::string& partition) {
    std::vector<std::string> env{"LD_LIBRARY_PATH=" + shim_dir + ":" + real_dir, "NVTASKSET_REAL_LIBCUDA=" + real,
                                 "BENCH_SELF_HOOK=",
                                 "NVTASKSET_PARTITION=" + partition, "NVTASKSET_PARTITION_PID="};
    return env;
  };
  configs.push_back({"shim, no partition", shim_env(""), {}, {}});
  configs.push_back({"shim, any-GPU partition", shim_env(all_bits_partition("*")), {}, {}});
  if (!uuid.empty()) configs.push_back({"shim, per-GPU partition", shim_env(all_bits_partition(uuid)), {}, {}});
  for (int r = 0; r < rounds; ++r) {
    for (auto& c : configs) {
      const double x = run_worker(self, launches, c.env);
      if (x <= 0) {
        std::fprintf(stderr, "bench_launch_overhead: a worker failed (%s)\n", c.name);
        return 1;
      }
      c.ns.push_back(x);
      c.ratio.push_back(x / configs[0].ns.back());
    }
  }
  std::printf("launches per round: %ld, rounds: %d (configurations interleaved in each round)\n", launches, rounds);
  for (const auto& c : configs)
    std::printf("%-26s %8.1f ns/launch (median)   ratio to plain %.3fx (median of per-round ratios)\n", c.name,
                median(c.ns), median(c.ratio));
  std::printf("launch overhead ratio: %.3fx (%s; target <= 1.01x on a GPU)\n", median(configs.back().ratio),
              configs.back().name);
  return 0;
}
