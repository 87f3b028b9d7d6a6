// SPDX-License-Identifier: Apache-2.0
// A CUDA program that replays graphs, for the end-to-end tests. Like cudart
// (and so PyTorch), it opens libcuda.so.1 with dlopen and gets every driver
// function through cuGetProcAddress. It knows nothing about nvtaskset.
//
//   --mode M          plain: a graph of --nodes kernel nodes (grid widths 1..N)
//                     child: the same kernels inside a child graph node
//                     destroyed: the source graph is destroyed right after
//                       instantiation (as PyTorch does)
//                     update: before every replay, cuGraphExecUpdate from a
//                       second graph with the same kernels
//                     disabled: node 2 is disabled on the exec after the first
//                       replay and must never run again
//                     upload: cuGraphUpload before every replay
//                     eager: no graph: each kernel is a cuLaunchKernelEx
//   --nodes N         kernels per graph (default 2)
//   --cluster C       launch every kernel with clusters of C blocks (along x)
//   --threads T       T threads, each replaying its own exec (default 1)
//   --replays R       at least R replays per thread (default 1)
//   --until-file F    keep replaying until F exists (at most 120 s, then exit 5)
//   --interval-ms M   pause between replays (default 0)
//   --ready-file F    after the first replay, write our pid to F
// Prints "pid <pid>". Exit status 0; 2 bad usage; 3 a driver call failed
// (the message names it); 5 --until-file never appeared.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "nvtaskset/cuda_driver_api.hpp"

namespace {

struct Api {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*launch_ex)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*graph_create)(CUgraph*, unsigned);
  CUresult (*graph_destroy)(CUgraph);
  CUresult (*add_kernel)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_KERNEL_NODE_PARAMS*);
  CUresult (*set_attr)(CUgraphNode, CUkernelNodeAttrID, const CUkernelNodeAttrValue*);
  CUresult (*add_child)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraph);
  CUresult (*instantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*exec_destroy)(CUgraphExec);
  CUresult (*upload)(CUgraphExec, CUstream);
  CUresult (*launch)(CUgraphExec, CUstream);
  CUresult (*set_enabled)(CUgraphExec, CUgraphNode, unsigned);
  CUresult (*exec_update)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo*);
};
Api g;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "graph_launcher: %s\n", why.c_str());
  std::exit(2);
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "graph_launcher: %s failed: %d\n", what, static_cast<int>(r));
    std::fflush(nullptr);
    std::_Exit(3);
  }
}

template <class F>
void get(F& f, const char* name, cuuint64_t flags = 0) {
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  static GetProc get_proc = [] {
    void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) usage(std::string("dlopen libcuda.so.1: ") + ::dlerror());
    auto p = reinterpret_cast<GetProc>(::dlsym(h, "cuGetProcAddress_v2"));
    if (!p) usage("no cuGetProcAddress_v2");
    // What cudart does first: get cuGetProcAddress itself through it.
    void* self = nullptr;
    CUdriverProcAddressQueryResult st;
    if (p("cuGetProcAddress", &self, 13000, 0, &st) == CUDA_SUCCESS && self) p = reinterpret_cast<GetProc>(self);
    return p;
  }();
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st;
  if (get_proc(name, &fn, 13000, flags, &st) != CUDA_SUCCESS || !fn) usage(std::string("no driver function ") + name);
  f = reinterpret_cast<F>(fn);
}

struct Options {
  std::string mode = "plain";
  unsigned nodes = 2, cluster = 0;
  long threads = 1, replays = 1, interval_ms = 0;
  std::string until_file, ready_file;
};

bool exists(const std::string& p) {
  struct stat st;
  return !p.empty() && ::stat(p.c_str(), &st) == 0;
}

CUgraph make_graph(const Options& o, std::vector<CUgraphNode>* kernels) {
  CUgraph graph;
  check(g.graph_create(&graph, 0), "cuGraphCreate");
  for (unsigned i = 1; i <= o.nodes; ++i) {
    CUDA_KERNEL_NODE_PARAMS p{};
    p.gridDimX = i;  // the stand-in records graph kernels by grid width
    p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 32;
    p.blockDimY = p.blockDimZ = 1;
    CUgraphNode n;
    check(g.add_kernel(&n, graph, nullptr, 0, &p), "cuGraphAddKernelNode");
    if (o.cluster) {
      CUkernelNodeAttrValue v{};
      v.clusterDim.x = o.cluster;
      v.clusterDim.y = v.clusterDim.z = 1;
      check(g.set_attr(n, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v), "cuGraphKernelNodeSetAttribute");
    }
    if (kernels) kernels->push_back(n);
  }
  if (o.mode != "child") return graph;
  CUgraph parent;
  check(g.graph_create(&parent, 0), "cuGraphCreate");
  CUgraphNode child;
  check(g.add_child(&child, parent, nullptr, 0, graph), "cuGraphAddChildGraphNode");
  check(g.graph_destroy(graph), "cuGraphDestroy");  // the child node holds its own copy
  if (kernels) kernels->clear();
  return parent;
}

void eager_launch(const Options& o) {
  for (unsigned i = 1; i <= o.nodes; ++i) {
    CUlaunchConfig cfg{};
    cfg.gridDimX = i;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32;
    cfg.blockDimY = cfg.blockDimZ = 1;
    CUlaunchAttribute at{};
    at.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    at.value.clusterDim.x = o.cluster;
    at.value.clusterDim.y = at.value.clusterDim.z = 1;
    cfg.attrs = o.cluster ? &at : nullptr;
    cfg.numAttrs = o.cluster ? 1 : 0;
    check(g.launch_ex(&cfg, nullptr, nullptr, nullptr), "cuLaunchKernelEx");
  }
}

void write_ready(const std::string& path) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << ::getpid() << "\n";
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::_Exit(3);
}

std::atomic<bool> g_expired{false};

void replay_loop(const Options& o, bool first_thread) {
  CUdevice dev;
  CUcontext ctx;
  check(g.device_get(&dev, 0), "cuDeviceGet");
  check(g.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(g.ctx_set_current(ctx), "cuCtxSetCurrent");
  CUgraphExec exec = nullptr;
  CUgraph graph = nullptr, twin = nullptr;
  std::vector<CUgraphNode> kernels;
  if (o.mode != "eager") {
    graph = make_graph(o, &kernels);
    check(g.instantiate(&exec, graph, 0), "cuGraphInstantiate");
    if (o.mode == "destroyed") {
      check(g.graph_destroy(graph), "cuGraphDestroy");
      graph = nullptr;
    }
    if (o.mode == "update") twin = make_graph(o, nullptr);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (long n = 0;; ++n) {
    if (o.mode == "eager") {
      eager_launch(o);
    } else {
      if (o.mode == "update") {
        CUgraphExecUpdateResultInfo info{};
        check(g.exec_update(exec, twin, &info), "cuGraphExecUpdate");
      }
      if (o.mode == "upload") check(g.upload(exec, nullptr), "cuGraphUpload");
      check(g.launch(exec, nullptr), "cuGraphLaunch");
    }
    if (n == 0) {
      if (o.mode == "disabled") {
        if (kernels.size() < 2) usage("--mode disabled needs --nodes 2 or more");
        check(g.set_enabled(exec, kernels[1], 0), "cuGraphNodeSetEnabled");
      }
      if (first_thread && !o.ready_file.empty()) write_ready(o.ready_file);
    }
    if (n + 1 >= o.replays && (o.until_file.empty() || exists(o.until_file))) break;
    if (!o.until_file.empty() && std::chrono::steady_clock::now() > give_up) {
      g_expired = true;
      break;
    }
    if (o.interval_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  }
  if (exec) check(g.exec_destroy(exec), "cuGraphExecDestroy");
  if (twin) check(g.graph_destroy(twin), "cuGraphDestroy");
  if (graph) check(g.graph_destroy(graph), "cuGraphDestroy");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    auto num = [&](long lo) {
      const std::string v = value();
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || x < lo) usage("bad value for " + a);
      return x;
    };
    if (a == "--mode") o.mode = value();
    else if (a == "--nodes") o.nodes = static_cast<unsigned>(num(1));
    else if (a == "--cluster") o.cluster = static_cast<unsigned>(num(0));
    else if (a == "--threads") o.threads = num(1);
    else if (a == "--replays") o.replays = num(1);
    else if (a == "--interval-ms") o.interval_ms = num(0);
    else if (a == "--until-file") o.until_file = value();
    else if (a == "--ready-file") o.ready_file = value();
    else usage("unknown option " + a);
  }
  const std::string modes[] = {"plain", "child", "destroyed", "update", "disabled", "upload", "eager"};
  bool known = false;
  for (const auto& m : modes) known = known || m == o.mode;
  if (!known) usage("unknown mode " + o.mode);
  std::printf("pid %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);

  get(g.init, "cuInit");
  get(g.device_get, "cuDeviceGet");
  get(g.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  get(g.ctx_set_current, "cuCtxSetCurrent");
  get(g.launch_ex, "cuLaunchKernelEx");
  get(g.graph_create, "cuGraphCreate");
  get(g.graph_destroy, "cuGraphDestroy");
  get(g.add_kernel, "cuGraphAddKernelNode");
  get(g.set_attr, "cuGraphKernelNodeSetAttribute");
  get(g.add_child, "cuGraphAddChildGraphNode");
  // By its own name, as cudart does: "cuGraphInstantiate" resolves to the
  // 5-argument _v2 (docs/hardware.md).
  get(g.instantiate, "cuGraphInstantiateWithFlags");
  get(g.exec_destroy, "cuGraphExecDestroy");
  get(g.upload, "cuGraphUpload");
  get(g.launch, "cuGraphLaunch");
  get(g.set_enabled, "cuGraphNodeSetEnabled");
  get(g.exec_update, "cuGraphExecUpdate");
  check(g.init(0), "cuInit");

  std::vector<std::thread> extra;
  for (long t = 1; t < o.threads; ++t) extra.emplace_back([&o] { replay_loop(o, false); });
  replay_loop(o, true);
  for (auto& t : extra) t.join();
  if (g_expired) {
    std::fprintf(stderr, "graph_launcher: %s did not appear within 120 s\n", o.until_file.c_str());
    return 5;
  }
  return 0;
}
