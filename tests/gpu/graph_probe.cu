// SPDX-License-Identifier: Apache-2.0
// An ordinary CUDA runtime program (it knows nothing of nvtaskset) that
// replays a CUDA graph every few milliseconds and records, per replay, the
// logical TPCs (%smid / 2) its kernels' blocks ran on. Used on a real GPU to
// check that graph replays follow `nvtaskset -p` (docs/verification.md).
// Outside MPS %smid is the real SM ID; run the exact-TPC checks with --no-mps.
//
//   graph_probe --mode MODE [--duration-ms D] [--interval-ms I] [--until-file F]
//               [--out FILE] [--update-every N] [--blocks-per-sm B] [--spin-us U]
//
// MODE:
//   plain      a graph of 2 kernel nodes (A -> B), built node by node;
//   child      the kernel nodes live in child graphs: parent -> child(A -> grandchild(B));
//   destroyed  the graph is stream-captured, instantiated, and the source graph destroyed
//              at once (as PyTorch does);
//   update     two topologically identical graphs (their kernel arguments differ);
//              cudaGraphExecUpdate switches the exec between them every N replays;
//   disabled   A -> B where B also counts its runs in a marker; after replay 0 the
//              program disables B (cudaGraphNodeSetEnabled); B must never run again
//              until the program re-enables it for one final replay at the end;
//   threads    two host threads, each replaying its own graph exec (as plain) on its
//              own stream;
//   eager      the same two kernels launched without a graph (the comparison).
//
// Output (stdout or --out), one line per replay:
//   <replay index> <CLOCK_MONOTONIC ns just before the launch> <sorted TPC list, a,b,c-d> [t<thread>]
// The TPC list is the union over the replay's kernels. Other lines start with a
// word: "pid ...", "ready" (flushed after the first replay), "marker ..." (mode
// disabled), "updates ..." (mode update), "done ...". Exit status 0 on success,
// 2 on a CUDA error, 3 when the disabled node ran while disabled.
#include <cuda_runtime.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kWords = 8;  // bitmap of up to 256 TPCs per kernel node

__global__ void record_tpcs(unsigned* bits, long long spin_cycles, int* marker) {
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    // Stay resident a few microseconds so the scheduler spreads blocks over
    // every SM it may use (one block per SM fits: see the shared memory size).
    const long long start = clock64();
    while (clock64() - start < spin_cycles) {
    }
    const unsigned tpc = smid / 2;
    if (tpc < 32 * kWords) atomicOr(&bits[tpc / 32], 1u << (tpc % 32));
    if (marker != nullptr && blockIdx.x == 0) atomicAdd(marker, 1);
  }
}

long long now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string ranges(const std::set<unsigned>& s) {
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
  return out.empty() ? "none" : out;
}

[[noreturn]] void die(const char* what, cudaError_t e) {
  std::fprintf(stderr, "graph_probe: %s: %s\n", what, cudaGetErrorString(e));
  std::fflush(nullptr);
  std::_Exit(2);
}

#define CK(x)                       \
  do {                              \
    cudaError_t e_ = (x);           \
    if (e_ != cudaSuccess) die(#x, e_); \
  } while (0)

struct Config {
  std::string mode = "plain";
  long duration_ms = 3000;
  int interval_ms = 3;
  const char* until_file = nullptr;
  const char* out = nullptr;
  int update_every = 5;
  int blocks_per_sm = 4;
  int spin_us = 4;
};

struct Shared {
  FILE* out = stdout;
  std::mutex mu;
  std::atomic<long> replays{0};
  std::atomic<bool> ready{false};
  int blocks = 0;
  int smem = 0;
  long long spin = 0;
  long long deadline_ns = 0;
  const char* until_file = nullptr;
};

bool stop_now(const Shared& sh) {
  if (now_ns() >= sh.deadline_ns) return true;
  struct stat st;
  return sh.until_file != nullptr && stat(sh.until_file, &st) == 0;
}

// Kernel-node parameters for record_tpcs.
struct NodeArgs {
  unsigned* bits;
  long long spin;
  int* marker;
  void* params[3];
  cudaKernelNodeParams p{};
  void init(const Shared& sh, unsigned* b, long long s, int* m) {
    bits = b;
    spin = s;
    marker = m;
    params[0] = &bits;
    params[1] = &spin;
    params[2] = &marker;
    p.func = reinterpret_cast<void*>(record_tpcs);
    p.gridDim = dim3(sh.blocks);
    p.blockDim = dim3(128);
    p.sharedMemBytes = sh.smem;
    p.kernelParams = params;
    p.extra = nullptr;
  }
};

// One replayer: its stream, device buffers and (for graph modes) graph exec.
struct Replayer {
  int id = 0;
  cudaStream_t stream{};
  unsigned* d_bits = nullptr;  // 2 nodes x kWords
  unsigned* h_bits = nullptr;  // pinned
  int* d_marker = nullptr;
  cudaGraphExec_t exec{};
  cudaGraph_t graphs[2]{};  // mode update: the two graphs
  cudaGraphNode_t node_b{};  // mode disabled: the node the user disables
  NodeArgs a, b;
};

void build(const Config& c, Shared& sh, Replayer& r) {
  CK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  CK(cudaMalloc(&r.d_bits, sizeof(unsigned) * 2 * kWords));
  CK(cudaMallocHost(&r.h_bits, sizeof(unsigned) * 2 * kWords + sizeof(int)));
  CK(cudaMalloc(&r.d_marker, sizeof(int)));
  CK(cudaMemset(r.d_marker, 0, sizeof(int)));
  r.a.init(sh, r.d_bits, sh.spin, nullptr);
  r.b.init(sh, r.d_bits + kWords, sh.spin, c.mode == "disabled" ? r.d_marker : nullptr);
  if (c.mode == "eager") return;

  auto two_nodes = [&](cudaGraph_t g, NodeArgs& na, NodeArgs& nb, cudaGraphNode_t* out_b) {
    cudaGraphNode_t na_node, nb_node;
    CK(cudaGraphAddKernelNode(&na_node, g, nullptr, 0, &na.p));
    CK(cudaGraphAddKernelNode(&nb_node, g, &na_node, 1, &nb.p));
    if (out_b) *out_b = nb_node;
  };
  cudaGraph_t g{};
  if (c.mode == "plain" || c.mode == "threads" || c.mode == "disabled") {
    CK(cudaGraphCreate(&g, 0));
    two_nodes(g, r.a, r.b, &r.node_b);
    CK(cudaGraphInstantiate(&r.exec, g, 0));
    // The source graph stays alive (node handles are valid) in these modes.
  } else if (c.mode == "child") {
    cudaGraph_t grandchild, child;
    CK(cudaGraphCreate(&grandchild, 0));
    cudaGraphNode_t bn;
    CK(cudaGraphAddKernelNode(&bn, grandchild, nullptr, 0, &r.b.p));
    CK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t an, gcn;
    CK(cudaGraphAddKernelNode(&an, child, nullptr, 0, &r.a.p));
    CK(cudaGraphAddChildGraphNode(&gcn, child, &an, 1, grandchild));
    CK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t cn;
    CK(cudaGraphAddChildGraphNode(&cn, g, nullptr, 0, child));
    CK(cudaGraphInstantiate(&r.exec, g, 0));
    CK(cudaGraphDestroy(child));       // the parent holds clones
    CK(cudaGraphDestroy(grandchild));
  } else if (c.mode == "destroyed") {
    CK(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal));
    record_tpcs<<<sh.blocks, 128, sh.smem, r.stream>>>(r.a.bits, r.a.spin, nullptr);
    record_tpcs<<<sh.blocks, 128, sh.smem, r.stream>>>(r.b.bits, r.b.spin, nullptr);
    CK(cudaStreamEndCapture(r.stream, &g));
    CK(cudaGraphInstantiate(&r.exec, g, 0));
    CK(cudaGraphDestroy(g));  // as torch.cuda.CUDAGraph does after instantiation
    g = nullptr;
  } else if (c.mode == "update") {
    // Same topology, other kernel arguments (spin + 1 cycle): an update that
    // changes arguments only, which the driver applies without rebuilding TMDs.
    static NodeArgs a2, b2;
    a2.init(sh, r.d_bits, sh.spin + 1, nullptr);
    b2.init(sh, r.d_bits + kWords, sh.spin + 1, nullptr);
    CK(cudaGraphCreate(&r.graphs[0], 0));
    two_nodes(r.graphs[0], r.a, r.b, nullptr);
    CK(cudaGraphCreate(&r.graphs[1], 0));
    two_nodes(r.graphs[1], a2, b2, nullptr);
    CK(cudaGraphInstantiate(&r.exec, r.graphs[0], 0));
  } else {
    std::fprintf(stderr, "graph_probe: unknown mode %s\n", c.mode.c_str());
    std::exit(2);
  }
}

// Launches one replay; returns the TPC union and the marker value.
std::set<unsigned> replay(const Config& c, Shared& sh, Replayer& r, long long* t_launch, int* marker) {
  CK(cudaMemsetAsync(r.d_bits, 0, sizeof(unsigned) * 2 * kWords, r.stream));
  *t_launch = now_ns();
  if (c.mode == "eager") {
    record_tpcs<<<sh.blocks, 128, sh.smem, r.stream>>>(r.a.bits, r.a.spin, nullptr);
    record_tpcs<<<sh.blocks, 128, sh.smem, r.stream>>>(r.b.bits, r.b.spin, nullptr);
    CK(cudaGetLastError());
  } else {
    CK(cudaGraphLaunch(r.exec, r.stream));
  }
  CK(cudaMemcpyAsync(r.h_bits, r.d_bits, sizeof(unsigned) * 2 * kWords, cudaMemcpyDeviceToHost, r.stream));
  CK(cudaMemcpyAsync(r.h_bits + 2 * kWords, r.d_marker, sizeof(int), cudaMemcpyDeviceToHost, r.stream));
  CK(cudaStreamSynchronize(r.stream));
  std::set<unsigned> tpcs;
  for (int w = 0; w < 2 * kWords; ++w)
    for (int b = 0; b < 32; ++b)
      if (r.h_bits[w] >> b & 1u) tpcs.insert(static_cast<unsigned>((w % kWords) * 32 + b));
  std::memcpy(marker, r.h_bits + 2 * kWords, sizeof(int));
  return tpcs;
}

void emit(Shared& sh, long idx, long long t, const std::set<unsigned>& tpcs, int thread, bool threads) {
  std::lock_guard<std::mutex> lock(sh.mu);
  if (threads) std::fprintf(sh.out, "%ld %lld %s t%d\n", idx, t, ranges(tpcs).c_str(), thread);
  else std::fprintf(sh.out, "%ld %lld %s\n", idx, t, ranges(tpcs).c_str());
  std::fflush(sh.out);
}

void mark_ready(Shared& sh) {
  bool expected = false;
  if (sh.ready.compare_exchange_strong(expected, true)) {
    std::lock_guard<std::mutex> lock(sh.mu);
    std::fprintf(sh.out, "ready\n");
    std::fflush(sh.out);
    if (sh.out != stdout) {
      std::printf("ready\n");
      std::fflush(stdout);
    }
  }
}

int loop(const Config& c, Shared& sh, Replayer& r, bool threads) {
  int bad_marker = 0;
  int marker = 0;
  long updates = 0;
  int current_graph = 0;
  for (long local = 0;; ++local) {
    if (local > 0 && stop_now(sh)) break;
    if (c.mode == "update" && local > 0 && local % c.update_every == 0) {
      current_graph ^= 1;
      cudaGraphExecUpdateResultInfo info{};
      CK(cudaGraphExecUpdate(r.exec, r.graphs[current_graph], &info));
      if (info.result != cudaGraphExecUpdateSuccess) {
        std::fprintf(stderr, "graph_probe: cudaGraphExecUpdate result %d\n", static_cast<int>(info.result));
        return 2;
      }
      ++updates;
    }
    long long t = 0;
    const long idx = sh.replays.fetch_add(1);
    std::set<unsigned> tpcs = replay(c, sh, r, &t, &marker);
    emit(sh, idx, t, tpcs, r.id, threads);
    if (c.mode == "disabled") {
      if (local == 0) {
        if (marker != 1) {
          std::fprintf(stderr, "graph_probe: node B did not run while enabled (marker %d)\n", marker);
          return 2;
        }
        CK(cudaGraphNodeSetEnabled(r.exec, r.node_b, 0));
      } else if (marker != 1) {
        bad_marker = marker;
      }
    }
    if (local == 0) mark_ready(sh);
    if (c.interval_ms) std::this_thread::sleep_for(std::chrono::milliseconds(c.interval_ms));
  }
  std::lock_guard<std::mutex> lock(sh.mu);
  if (c.mode == "update") std::fprintf(sh.out, "updates %ld\n", updates);
  if (c.mode == "disabled") {
    // While disabled, B's marker must have stayed at 1 (its run in replay 0).
    std::fprintf(sh.out, "marker while disabled: %d (expect 1)\n", bad_marker ? bad_marker : marker);
    std::fflush(sh.out);
    if (bad_marker) return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "graph_probe: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mode") c.mode = next();
    else if (a == "--duration-ms") c.duration_ms = std::atol(next());
    else if (a == "--interval-ms") c.interval_ms = std::atoi(next());
    else if (a == "--until-file") c.until_file = next();
    else if (a == "--out") c.out = next();
    else if (a == "--update-every") c.update_every = std::atoi(next());
    else if (a == "--blocks-per-sm") c.blocks_per_sm = std::atoi(next());
    else if (a == "--spin-us") c.spin_us = std::atoi(next());
    else {
      std::fprintf(stderr, "graph_probe: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const std::set<std::string> modes{"plain", "child", "destroyed", "update", "disabled", "threads", "eager"};
  if (!modes.count(c.mode) || c.update_every < 1 || c.blocks_per_sm < 1) {
    std::fprintf(stderr, "graph_probe: bad mode or option\n");
    return 2;
  }
  Shared sh;
  if (c.out) {
    sh.out = std::fopen(c.out, "w");
    if (!sh.out) {
      std::perror(c.out);
      return 2;
    }
  }
  sh.until_file = c.until_file;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0, smem_optin = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  CK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  sh.blocks = prop.multiProcessorCount * c.blocks_per_sm;
  // More than half an SM's shared memory: one block per SM, so the blocks of
  // each wave land on every SM the partition allows.
  sh.smem = static_cast<int>(prop.sharedMemPerMultiprocessor / 2 + 1024);
  if (sh.smem > smem_optin) sh.smem = smem_optin;
  CK(cudaFuncSetAttribute(record_tpcs, cudaFuncAttributeMaxDynamicSharedMemorySize, sh.smem));
  sh.spin = static_cast<long long>(clock_khz) * c.spin_us / 1000;
  std::fprintf(sh.out, "pid %d mode %s %s sms %d blocks %d smem %d\n", getpid(), c.mode.c_str(), prop.name,
               prop.multiProcessorCount, sh.blocks, sh.smem);
  std::fflush(sh.out);

  const bool threads = c.mode == "threads";
  std::vector<Replayer> rs(threads ? 2 : 1);
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].id = static_cast<int>(i);
    build(c, sh, rs[i]);
  }
  sh.deadline_ns = now_ns() + c.duration_ms * 1000000LL;
  int rc = 0;
  if (threads) {
    std::vector<int> rcs(rs.size(), 0);
    std::vector<std::thread> ts;
    for (size_t i = 0; i < rs.size(); ++i) ts.emplace_back([&, i] { rcs[i] = loop(c, sh, rs[i], true); });
    for (auto& t : ts) t.join();
    for (int x : rcs) rc = rc ? rc : x;
  } else {
    rc = loop(c, sh, rs[0], false);
  }
  if (rc == 0 && c.mode == "disabled") {
    // The user re-enables B: it must run again (once), on the current partition.
    Replayer& r = rs[0];
    CK(cudaGraphNodeSetEnabled(r.exec, r.node_b, 1));
    long long t = 0;
    int marker = 0;
    const long idx = sh.replays.fetch_add(1);
    std::set<unsigned> tpcs = replay(c, sh, r, &t, &marker);
    emit(sh, idx, t, tpcs, 0, false);
    std::fprintf(sh.out, "marker after re-enabling: %d (expect 2)\n", marker);
    if (marker != 2) rc = 3;
  }
  std::fprintf(sh.out, "done %ld replays rc %d\n", sh.replays.load(), rc);
  std::fflush(sh.out);
  if (sh.out != stdout) std::fclose(sh.out);
  return rc;
}
