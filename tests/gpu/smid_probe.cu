// SPDX-License-Identifier: Apache-2.0
// An ordinary CUDA runtime program (it knows nothing of nvtaskset) that
// reports which SMs and logical TPCs its kernels ran on. Used on a real GPU to
// check that nvtaskset's partition is what the hardware obeys
// (docs/verification.md). Outside MPS, %smid is the real SM ID; under MPS it
// is renumbered (docs/hardware.md), so checks of exact TPCs run with --no-mps.
//
//   smid_probe [--iters N] [--interval-ms M] [--blocks B] [--until-file F] [--ready-file F]
//              [--device D | --all-devices] [--fork]
// prints one line per kernel: "iter <i> sms <count> tpcs <list>", prefixed
// with "dev <d> " when --all-devices runs the kernel on every GPU in turn.
// --fork: fork before any CUDA call (no exec), and parent and child each run
// the loop, their lines prefixed with "pid <pid> "; the parent waits for the
// child and fails if it failed.
#include <cuda_runtime.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

__global__ void record_smid(unsigned* out, long long spin_cycles) {
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    // Stay resident for a while so the block scheduler spreads blocks over
    // every SM it may use instead of reusing the first ones.
    const long long start = clock64();
    while (clock64() - start < spin_cycles) {
    }
    out[blockIdx.x] = smid;
  }
}

static std::string ranges(const std::set<unsigned>& s) {
  std::string out;
  for (auto it = s.begin(); it != s.end();) {
    unsigned a = *it, b = a;
    auto jt = std::next(it);
    while (jt != s.end() && *jt == b + 1) b = *jt++;
    if (!out.empty()) out += ",";
    out += std::to_string(a);
    if (b > a) out += "-" + std::to_string(b);
    it = jt;
  }
  return out;
}

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::fprintf(stderr, "smid_probe: %s: %s\n", #x, cudaGetErrorString(e));     \
      return 2;                                                                    \
    }                                                                              \
  } while (0)

int main(int argc, char** argv) {
  int iters = 1, interval_ms = 0, blocks = 0;
  const char* until_file = nullptr;
  const char* ready_file = nullptr;
  int device = 0;
  bool all_devices = false, fork_first = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), ""); };
    if (a == "--iters") iters = std::atoi(next());
    else if (a == "--interval-ms") interval_ms = std::atoi(next());
    else if (a == "--blocks") blocks = std::atoi(next());
    else if (a == "--until-file") until_file = next();
    else if (a == "--ready-file") ready_file = next();
    else if (a == "--device") device = std::atoi(next());
    else if (a == "--all-devices") all_devices = true;
    else if (a == "--fork") fork_first = true;
    else { std::fprintf(stderr, "smid_probe: unknown argument %s\n", a.c_str()); return 2; }
  }
  pid_t child = -1;
  if (fork_first) {
    std::fflush(stdout);
    child = fork();
    if (child < 0) { std::perror("smid_probe: fork"); return 2; }
  }
  int ndev = 0;
  CHECK(cudaGetDeviceCount(&ndev));
  std::vector<int> devs;
  if (all_devices) for (int d = 0; d < ndev; ++d) devs.push_back(d);
  else devs.push_back(device);
  struct Dev { int id; int blocks; unsigned* d_out; long long spin; };
  std::vector<Dev> ds;
  for (int d : devs) {
    CHECK(cudaSetDevice(d));
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, d));
    Dev x{d, blocks ? blocks : prop.multiProcessorCount * 8, nullptr, 0};
    CHECK(cudaMalloc(&x.d_out, sizeof(unsigned) * x.blocks));
    int clock_khz = 0;  // cudaDeviceProp::clockRate is gone in CUDA 13
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, d));
    x.spin = static_cast<long long>(clock_khz) * 20 / 1000;  // ~20 us
    std::printf("pid %d device %d %s sms %d\n", getpid(), d, prop.name, prop.multiProcessorCount);
    ds.push_back(x);
  }
  std::fflush(stdout);
  for (int it = 0; until_file ? true : it < iters; ++it) {
    if (until_file) {
      struct stat st;
      if (stat(until_file, &st) == 0) break;
    }
    for (const Dev& x : ds) {
      CHECK(cudaSetDevice(x.id));
      std::vector<unsigned> h(x.blocks);
      CHECK(cudaMemset(x.d_out, 0xff, sizeof(unsigned) * x.blocks));
      record_smid<<<x.blocks, 32>>>(x.d_out, x.spin);
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemcpy(h.data(), x.d_out, sizeof(unsigned) * x.blocks, cudaMemcpyDeviceToHost));
      std::set<unsigned> sms, tpcs;
      for (unsigned s : h) {
        sms.insert(s);
        tpcs.insert(s / 2);
      }
      if (fork_first) std::printf("pid %d ", getpid());
      if (all_devices) std::printf("dev %d ", x.id);
      std::printf("iter %d sms %zu tpcs %s\n", it, sms.size(), ranges(tpcs).c_str());
    }
    std::fflush(stdout);
    if (ready_file && it == 0) {
      if (FILE* f = std::fopen(ready_file, "w")) { std::fprintf(f, "%d\n", getpid()); std::fclose(f); }
    }
    if (interval_ms) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
  }
  if (child > 0) {
    int st = 0;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 3;
  }
  return 0;
}
