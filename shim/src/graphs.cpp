// SPDX-License-Identifier: Apache-2.0
// CUDA graphs under a partition: see graphs.hpp for the mechanism.
#include "graphs.hpp"
#include "role_hooks.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include "nvtaskset/cuda_driver_api.hpp"

namespace nvtaskset::graphs {
namespace {

// ---- the real functions ------------------------------------------------------

enum Fn : unsigned {
  kInstantiate,            // cuGraphInstantiate (5 arguments, before CUDA 11)
  kInstantiateV2,          // cuGraphInstantiate_v2 (5 arguments)
  kInstantiateWithFlags,   // cuGraphInstantiateWithFlags ("cuGraphInstantiate" from CUDA 12)
  kInstantiateWithParams,  // cuGraphInstantiateWithParams
  kInstantiateWithParamsPtsz,
  kLaunch,
  kLaunchPtsz,
  kUpload,
  kUploadPtsz,
  kExecUpdate,    // cuGraphExecUpdate (4 arguments, before CUDA 12)
  kExecUpdateV2,  // cuGraphExecUpdate_v2
  kExecDestroy,
  kNodeSetEnabled,
  kGraphDestroy,
  kGetProcAddress,    // 4 arguments, before CUDA 12
  kGetProcAddressV2,  // 5 arguments
  kFnCount
};

// The driver exports wrapped, in Fn order. Constant-initialised: the shim's
// init (a load-time constructor) may run before this file's dynamic
// initialisers, so wrapper addresses are taken at call time (wrapper_of).
constexpr const char* kNames[kFnCount] = {
    "cuGraphInstantiate",   "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams",
    "cuGraphInstantiateWithParams_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz", "cuGraphUpload",
    "cuGraphUpload_ptsz",   "cuGraphExecUpdate",     "cuGraphExecUpdate_v2",        "cuGraphExecDestroy",
    "cuGraphNodeSetEnabled", "cuGraphDestroy",       "cuGetProcAddress",            "cuGetProcAddress_v2",
};
void* wrapper_of(unsigned f) noexcept;

std::atomic<void*> g_real[kFnCount];

template <class F>
F real(Fn f) {
  return reinterpret_cast<F>(g_real[f].load(std::memory_order_acquire));
}

// Helpers the wrappers call on the real driver (not wrapped).
using GetNodesFn = CUresult (*)(CUgraph, CUgraphNode*, size_t*);
using NodeGetTypeFn = CUresult (*)(CUgraphNode, CUgraphNodeType*);
using ChildGetGraphFn = CUresult (*)(CUgraphNode, CUgraph*);
using NodeGetEnabledFn = CUresult (*)(CUgraphExec, CUgraphNode, unsigned*);
using NodeSetEnabledFn = CUresult (*)(CUgraphExec, CUgraphNode, unsigned);
using GraphDestroyFn = CUresult (*)(CUgraph);
std::atomic<GetNodesFn> g_get_nodes{nullptr};
std::atomic<NodeGetTypeFn> g_node_get_type{nullptr};
std::atomic<ChildGetGraphFn> g_child_get_graph{nullptr};
std::atomic<NodeGetEnabledFn> g_node_get_enabled{nullptr};

std::atomic<std::atomic<ctl::Header*>*> g_header_src{nullptr};
std::atomic<HandOutFn> g_hand_out_hook{nullptr};

ctl::Header* header() noexcept {
  auto* src = g_header_src.load(std::memory_order_acquire);
  return src ? src->load(std::memory_order_acquire) : nullptr;
}

std::uint64_t current_epoch() noexcept {
  const ctl::Header* h = header();
  return h ? h->epoch.load(std::memory_order_acquire) : 0;
}

// ---- what is known of each exec ---------------------------------------------

struct ExecInfo {
  CUgraph source = nullptr;            // kept alive while the exec lives
  std::vector<CUgraphNode> kernels;    // kernel nodes, child graphs' included
  std::atomic<std::uint64_t> epoch{0};  // the partition epoch its TMDs carry
  bool follows = true;                 // false: it cannot follow partition changes
  bool warned = false;
  const char* why = nullptr;           // why it cannot
};

// exec -> ExecInfo, for the launch path without a lock: open addressing,
// written under g_mu, read lock-free. A grown table replaces the old one,
// which is leaked (readers may still hold it; geometric growth bounds the
// waste). Erased keys become tombstones.
constexpr std::uintptr_t kEmpty = 0, kTomb = 1;
struct Table {
  std::size_t mask;
  std::unique_ptr<std::atomic<std::uintptr_t>[]> keys;
  std::unique_ptr<std::atomic<ExecInfo*>[]> infos;
  explicit Table(std::size_t cap)
      : mask(cap - 1), keys(new std::atomic<std::uintptr_t>[cap]), infos(new std::atomic<ExecInfo*>[cap]) {
    for (std::size_t i = 0; i < cap; ++i) {
      keys[i].store(kEmpty, std::memory_order_relaxed);
      infos[i].store(nullptr, std::memory_order_relaxed);
    }
  }
};
std::atomic<Table*> g_table{nullptr};
std::size_t g_used = 0;  // live + tombstones, under g_mu

std::size_t slot_of(std::uintptr_t key, std::size_t mask) {
  key ^= key >> 17;
  key *= 0x9e3779b97f4a7c15ull;
  return static_cast<std::size_t>(key >> 20) & mask;
}

ExecInfo* lookup(CUgraphExec exec) noexcept {
  const Table* t = g_table.load(std::memory_order_acquire);
  if (t == nullptr || exec == nullptr) return nullptr;
  const auto key = reinterpret_cast<std::uintptr_t>(exec);
  for (std::size_t i = slot_of(key, t->mask), n = 0; n <= t->mask; i = (i + 1) & t->mask, ++n) {
    const std::uintptr_t k = t->keys[i].load(std::memory_order_acquire);
    if (k == key) return t->infos[i].load(std::memory_order_acquire);
    if (k == kEmpty) return nullptr;
  }
  return nullptr;
}

// Everything that changes the maps, the counters and the deferred graphs.
std::mutex g_mu;
// Source graphs: how many live execs need each, and whether the program
// already asked to destroy it.
struct GraphRef {
  unsigned execs = 0;
  bool destroy_pending = false;
};
// Built on first use and never destroyed: a wrapper may run before this
// file's dynamic initialisers (another library's constructor) or after its
// destructors (an atexit handler).
std::unordered_map<CUgraph, GraphRef>& graphs_map() {
  static auto* m = new std::unordered_map<CUgraph, GraphRef>;
  return *m;
}
std::uint64_t g_following = 0, g_not_following = 0;

void publish_counts() {
  if (ctl::Header* h = header()) {
    h->graphs_following.store(g_following, std::memory_order_relaxed);
    h->graphs_not_following.store(g_not_following, std::memory_order_relaxed);
  }
}

void insert_locked(CUgraphExec exec, ExecInfo* info) {
  Table* t = g_table.load(std::memory_order_relaxed);
  if (t == nullptr || 2 * (g_used + 1) > t->mask + 1) {
    std::size_t cap = t ? t->mask + 1 : 256;
    std::size_t live = 0;
    if (t)
      for (std::size_t i = 0; i <= t->mask; ++i) live += t->keys[i].load(std::memory_order_relaxed) > kTomb;
    while (4 * (live + 1) > cap) cap *= 2;
    auto* fresh = new Table(cap);
    if (t)
      for (std::size_t i = 0; i <= t->mask; ++i) {
        const std::uintptr_t k = t->keys[i].load(std::memory_order_relaxed);
        if (k <= kTomb) continue;
        std::size_t j = slot_of(k, fresh->mask);
        while (fresh->keys[j].load(std::memory_order_relaxed) != kEmpty) j = (j + 1) & fresh->mask;
        fresh->infos[j].store(t->infos[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
        fresh->keys[j].store(k, std::memory_order_relaxed);
      }
    g_used = live;
    g_table.store(fresh, std::memory_order_release);  // the old table is leaked on purpose
    t = fresh;
  }
  const auto key = reinterpret_cast<std::uintptr_t>(exec);
  std::size_t i = slot_of(key, t->mask);
  while (t->keys[i].load(std::memory_order_relaxed) > kTomb && t->keys[i].load(std::memory_order_relaxed) != key)
    i = (i + 1) & t->mask;
  if (t->keys[i].load(std::memory_order_relaxed) == kEmpty) ++g_used;
  t->infos[i].store(info, std::memory_order_release);
  t->keys[i].store(key, std::memory_order_release);
}

ExecInfo* erase_locked(CUgraphExec exec) {
  Table* t = g_table.load(std::memory_order_relaxed);
  if (t == nullptr) return nullptr;
  const auto key = reinterpret_cast<std::uintptr_t>(exec);
  for (std::size_t i = slot_of(key, t->mask), n = 0; n <= t->mask; i = (i + 1) & t->mask, ++n) {
    const std::uintptr_t k = t->keys[i].load(std::memory_order_relaxed);
    if (k == kEmpty) return nullptr;
    if (k != key) continue;
    ExecInfo* info = t->infos[i].load(std::memory_order_relaxed);
    t->keys[i].store(kTomb, std::memory_order_release);
    t->infos[i].store(nullptr, std::memory_order_release);
    return info;
  }
  return nullptr;
}

// ---- logging (the shim's logger; see shim.cpp) --------------------------------

std::atomic<WarnFn> g_warn{nullptr};

void warn(const std::string& msg) {
  if (const WarnFn w = g_warn.load(std::memory_order_acquire)) w(msg.c_str());
  else std::fprintf(stderr, "nvtaskset[%d]: warning: %s\n", static_cast<int>(::getpid()), msg.c_str());
}

// ---- tracking -------------------------------------------------------------------

// Collects the kernel nodes of `g` and of its child graphs. Returns why the
// exec cannot follow, or nullptr.
const char* collect(CUgraph g, std::vector<CUgraphNode>& kernels, unsigned depth) {
  const GetNodesFn get_nodes = g_get_nodes.load(std::memory_order_acquire);
  const NodeGetTypeFn get_type = g_node_get_type.load(std::memory_order_acquire);
  const ChildGetGraphFn get_child = g_child_get_graph.load(std::memory_order_acquire);
  if (!get_nodes || !get_type || !get_child) return "the driver lacks the graph query functions";
  if (depth > 64) return "child graphs nested too deeply";
  std::size_t n = 0;
  if (get_nodes(g, nullptr, &n) != CUDA_SUCCESS) return "its nodes cannot be listed";
  std::vector<CUgraphNode> nodes(n);
  if (n && get_nodes(g, nodes.data(), &n) != CUDA_SUCCESS) return "its nodes cannot be listed";
  nodes.resize(n);
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type;
    if (get_type(node, &type) != CUDA_SUCCESS) return "a node's type cannot be read";
    if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
      kernels.push_back(node);
    } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
      CUgraph child = nullptr;
      if (get_child(node, &child) != CUDA_SUCCESS) return "a child graph cannot be read";
      if (const char* why = collect(child, kernels, depth + 1)) return why;
    } else if (type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
      return "it has conditional nodes";
    }
  }
  return nullptr;
}

void track(CUgraphExec exec, CUgraph graph, unsigned long long flags) {
  auto info = std::make_unique<ExecInfo>();
  info->source = graph;
  info->epoch.store(current_epoch(), std::memory_order_relaxed);
  if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) info->why = "it is launched from the device";
  else info->why = collect(graph, info->kernels, 0);
  info->follows = info->why == nullptr;
  std::lock_guard lock(g_mu);
  if (ExecInfo* old = erase_locked(exec)) {  // a handle the driver reused without a destroy we saw
    (old->follows ? g_following : g_not_following)--;
    delete old;
  }
  ++graphs_map()[graph].execs;
  (info->follows ? g_following : g_not_following)++;
  insert_locked(exec, info.release());
  publish_counts();
}

// Drops an exec; returns a source graph that may now be destroyed.
CUgraph untrack(CUgraphExec exec) {
  std::lock_guard lock(g_mu);
  ExecInfo* info = erase_locked(exec);
  if (info == nullptr) return nullptr;
  (info->follows ? g_following : g_not_following)--;
  publish_counts();
  CUgraph destroy = nullptr;
  if (auto it = graphs_map().find(info->source); it != graphs_map().end() && --it->second.execs == 0) {
    if (it->second.destroy_pending) destroy = it->first;
    graphs_map().erase(it);
  }
  delete info;
  return destroy;
}

void give_up(ExecInfo& info, const char* why) {
  std::lock_guard lock(g_mu);
  if (info.follows) {
    info.follows = false;
    info.why = why;
    --g_following;
    ++g_not_following;
    publish_counts();
  }
}

// Serialises re-encodes: the callback counts builds for one thread at a time.
std::mutex g_refresh_mu;

// Runs `op` (the real launch or upload) on `exec`, first making the driver
// rebuild its kernels' TMDs when the partition changed since they were
// built, and checking that it did.
template <class Op>
CUresult run_fresh(CUgraphExec exec, Op op) {
  ExecInfo* info = lookup(exec);
  if (info == nullptr) return op();
  const std::uint64_t epoch = current_epoch();
  if (info->epoch.load(std::memory_order_relaxed) == epoch) [[likely]]
    return op();
  if (!info->follows) {
    if (!info->warned) {
      info->warned = true;
      warn("a CUDA graph keeps the TPCs it was encoded with after a partition change (" +
           std::string(info->why ? info->why : "unknown reason") +
           "); instantiate it again to apply the new partition");
    }
    info->epoch.store(epoch, std::memory_order_relaxed);
    return op();
  }
  std::lock_guard lock(g_refresh_mu);
  const auto set_enabled = real<NodeSetEnabledFn>(kNodeSetEnabled);
  const NodeGetEnabledFn get_enabled = g_node_get_enabled.load(std::memory_order_acquire);
  const char* failed = (set_enabled && get_enabled) ? nullptr : "the driver lacks cuGraphNodeGetEnabled";
  std::uint64_t expected = 0;
  for (CUgraphNode node : info->kernels) {
    if (failed) break;
    unsigned on = 0;
    if (get_enabled(exec, node, &on) != CUDA_SUCCESS) {
      failed = "the driver refused to query a kernel node's state";
      break;
    }
    if (!on) continue;  // disabled by the program: it runs nothing; enabling it re-encodes it
    if (set_enabled(exec, node, 0) != CUDA_SUCCESS) {
      failed = "the driver refused to toggle a kernel node";
      break;
    }
    // The node must never stay disabled: the program's kernel would silently not run.
    if (set_enabled(exec, node, 1) != CUDA_SUCCESS && set_enabled(exec, node, 1) != CUDA_SUCCESS) {
      warn("a kernel node of a CUDA graph could not be enabled again: it will not run");
      failed = "the driver refused to enable a kernel node again";
      break;
    }
    ++expected;
  }
  g_builds.store(0, std::memory_order_relaxed);
  g_counting_thread.store(::pthread_self(), std::memory_order_relaxed);
  g_counting.store(true, std::memory_order_seq_cst);
  const CUresult rc = op();
  g_counting.store(false, std::memory_order_seq_cst);
  const std::uint64_t built = g_builds.load(std::memory_order_relaxed);
  if (rc != CUDA_SUCCESS) return rc;  // stays stale: the next launch tries again
  if (failed == nullptr && built < expected) failed = "the driver did not re-encode its kernels";
  if (failed) {
    give_up(*info, failed);
    info->warned = true;
    warn("a CUDA graph cannot follow partition changes (" + std::string(failed) + "; " + std::to_string(built) +
         " of " + std::to_string(expected) + " kernels re-encoded): its kernels keep the TPCs they were encoded with");
  }
  info->epoch.store(epoch, std::memory_order_relaxed);
  return rc;
}

void mark_stale(CUgraphExec exec) {
  if (ExecInfo* info = lookup(exec)) info->epoch.store(~std::uint64_t{0}, std::memory_order_relaxed);
}

// ---- the wrappers ---------------------------------------------------------------

CUresult w_instantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* err_node, char* log, size_t log_size) {
  using F = CUresult (*)(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
  const CUresult rc = real<F>(kInstantiate)(exec, graph, err_node, log, log_size);
  if (rc == CUDA_SUCCESS && exec) track(*exec, graph, 0);
  return rc;
}

CUresult w_instantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* err_node, char* log, size_t log_size) {
  using F = CUresult (*)(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
  const CUresult rc = real<F>(kInstantiateV2)(exec, graph, err_node, log, log_size);
  if (rc == CUDA_SUCCESS && exec) track(*exec, graph, 0);
  return rc;
}

CUresult w_instantiate_with_flags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  using F = CUresult (*)(CUgraphExec*, CUgraph, unsigned long long);
  const CUresult rc = real<F>(kInstantiateWithFlags)(exec, graph, flags);
  if (rc == CUDA_SUCCESS && exec) track(*exec, graph, flags);
  return rc;
}

CUresult instantiate_with_params(Fn f, CUgraphExec* exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  using F = CUresult (*)(CUgraphExec*, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS*);
  const CUresult rc = real<F>(f)(exec, graph, p);
  if (rc == CUDA_SUCCESS && exec) track(*exec, graph, p ? p->flags : 0);
  return rc;
}
CUresult w_instantiate_with_params(CUgraphExec* exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return instantiate_with_params(kInstantiateWithParams, exec, graph, p);
}
CUresult w_instantiate_with_params_ptsz(CUgraphExec* exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return instantiate_with_params(kInstantiateWithParamsPtsz, exec, graph, p);
}

using StreamOpFn = CUresult (*)(CUgraphExec, CUstream);
// A graph launch is a launch for the roles (role_hooks.hpp): a latency-critical
// task is busy until it completes; a best-effort one waits its turn first.
CUresult w_launch(CUgraphExec e, CUstream s) {
  const std::uint64_t t = roles_shim::before_graph_launch(e, s, false);
  const CUresult rc = run_fresh(e, [&] { return real<StreamOpFn>(kLaunch)(e, s); });
  roles_shim::after_graph_launch(t, e, s, false);
  return rc;
}
CUresult w_launch_ptsz(CUgraphExec e, CUstream s) {
  const std::uint64_t t = roles_shim::before_graph_launch(e, s, true);
  const CUresult rc = run_fresh(e, [&] { return real<StreamOpFn>(kLaunchPtsz)(e, s); });
  roles_shim::after_graph_launch(t, e, s, true);
  return rc;
}
CUresult w_upload(CUgraphExec e, CUstream s) {
  return run_fresh(e, [&] { return real<StreamOpFn>(kUpload)(e, s); });
}
CUresult w_upload_ptsz(CUgraphExec e, CUstream s) {
  return run_fresh(e, [&] { return real<StreamOpFn>(kUploadPtsz)(e, s); });
}

CUresult w_exec_update(CUgraphExec e, CUgraph g, CUgraphNode* err_node, CUgraphExecUpdateResult* result) {
  using F = CUresult (*)(CUgraphExec, CUgraph, CUgraphNode*, CUgraphExecUpdateResult*);
  const CUresult rc = real<F>(kExecUpdate)(e, g, err_node, result);
  if (rc == CUDA_SUCCESS) mark_stale(e);
  return rc;
}
CUresult w_exec_update_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo* info) {
  using F = CUresult (*)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo*);
  const CUresult rc = real<F>(kExecUpdateV2)(e, g, info);
  if (rc == CUDA_SUCCESS) mark_stale(e);
  return rc;
}

CUresult w_exec_destroy(CUgraphExec e) {
  const CUresult rc = real<CUresult (*)(CUgraphExec)>(kExecDestroy)(e);
  if (rc == CUDA_SUCCESS) {
    if (CUgraph g = untrack(e)) real<GraphDestroyFn>(kGraphDestroy)(g);
  }
  return rc;
}

// The program's own enable/disable: it re-encodes that node; the next
// launch re-encodes the rest if the partition changed meanwhile.
CUresult w_node_set_enabled(CUgraphExec e, CUgraphNode n, unsigned on) {
  const CUresult rc = real<NodeSetEnabledFn>(kNodeSetEnabled)(e, n, on);
  if (rc == CUDA_SUCCESS) mark_stale(e);
  return rc;
}

CUresult w_graph_destroy(CUgraph g) {
  {
    std::lock_guard lock(g_mu);
    if (auto it = graphs_map().find(g); it != graphs_map().end() && it->second.execs > 0) {
      // Live execs are identified by this graph's node handles: it is
      // destroyed when the last of them is.
      it->second.destroy_pending = true;
      return CUDA_SUCCESS;
    }
  }
  return real<GraphDestroyFn>(kGraphDestroy)(g);
}

// The export a cuGetProcAddress request resolves to, when the pointer the
// driver returned is none of the exports the shim knows (normally it is, and
// hand_out_wrapper goes by the pointer). cuGraphExecUpdate and
// cuGetProcAddress are _v2 from CUDA 12.0; "cuGraphInstantiate" is the
// 5-argument cuGraphInstantiate_v2 from CUDA 11.0 on, also for CUDA 13.0
// (measured on H100, driver 580.159.04: docs/hardware.md), although cuda.h
// maps the name to cuGraphInstantiateWithFlags at compile time; _ptsz with
// the per-thread default stream flag.
int variant_for(std::string_view sym, int cuda_version, cuuint64_t flags) {
  const bool ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (sym == "cuGraphInstantiate") return cuda_version >= 11000 ? kInstantiateV2 : kInstantiate;
  if (sym == "cuGraphExecUpdate") return cuda_version >= 12000 ? kExecUpdateV2 : kExecUpdate;
  if (sym == "cuGetProcAddress") return cuda_version >= 12000 ? kGetProcAddressV2 : kGetProcAddress;
  if (sym == "cuGraphLaunch") return ptsz ? kLaunchPtsz : kLaunch;
  if (sym == "cuGraphUpload") return ptsz ? kUploadPtsz : kUpload;
  if (sym == "cuGraphInstantiateWithParams") return ptsz ? kInstantiateWithParamsPtsz : kInstantiateWithParams;
  for (unsigned f = 0; f < kFnCount; ++f)
    if (sym == kNames[f]) return static_cast<int>(f);
  return -1;
}

void hand_out_wrapper(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags) {
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr) return;
  int f = -1;
  for (unsigned i = 0; i < kFnCount && f < 0; ++i)
    if (*pfn == g_real[i].load(std::memory_order_acquire)) f = static_cast<int>(i);
  if (f < 0) f = variant_for(symbol, cuda_version, flags);
  if (f >= 0 && g_real[f].load(std::memory_order_acquire) != nullptr) *pfn = wrapper_of(static_cast<unsigned>(f));
  else if (const HandOutFn hook = g_hand_out_hook.load(std::memory_order_acquire)) hook(pfn);
}

CUresult w_get_proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags) {
  using F = CUresult (*)(const char*, void**, int, cuuint64_t);
  const CUresult rc = real<F>(kGetProcAddress)(symbol, pfn, cuda_version, flags);
  if (rc == CUDA_SUCCESS) hand_out_wrapper(symbol, pfn, cuda_version, flags);
  return rc;
}
CUresult w_get_proc_address_v2(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                               CUdriverProcAddressQueryResult* status) {
  using F = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  const CUresult rc = real<F>(kGetProcAddressV2)(symbol, pfn, cuda_version, flags, status);
  if (rc == CUDA_SUCCESS) hand_out_wrapper(symbol, pfn, cuda_version, flags);
  return rc;
}

template <class F>
void* addr(F* f) {
  return reinterpret_cast<void*>(f);
}

void* wrapper_of(unsigned f) noexcept {
  switch (f) {
    case kInstantiate: return addr(&w_instantiate);
    case kInstantiateV2: return addr(&w_instantiate_v2);
    case kInstantiateWithFlags: return addr(&w_instantiate_with_flags);
    case kInstantiateWithParams: return addr(&w_instantiate_with_params);
    case kInstantiateWithParamsPtsz: return addr(&w_instantiate_with_params_ptsz);
    case kLaunch: return addr(&w_launch);
    case kLaunchPtsz: return addr(&w_launch_ptsz);
    case kUpload: return addr(&w_upload);
    case kUploadPtsz: return addr(&w_upload_ptsz);
    case kExecUpdate: return addr(&w_exec_update);
    case kExecUpdateV2: return addr(&w_exec_update_v2);
    case kExecDestroy: return addr(&w_exec_destroy);
    case kNodeSetEnabled: return addr(&w_node_set_enabled);
    case kGraphDestroy: return addr(&w_graph_destroy);
    case kGetProcAddress: return addr(&w_get_proc_address);
    case kGetProcAddressV2: return addr(&w_get_proc_address_v2);
  }
  return nullptr;
}

}  // namespace

void set_header(std::atomic<ctl::Header*>* h) noexcept { g_header_src.store(h, std::memory_order_release); }
void set_warn(WarnFn fn) noexcept { g_warn.store(fn, std::memory_order_release); }
void set_hand_out_hook(HandOutFn fn) noexcept { g_hand_out_hook.store(fn, std::memory_order_release); }

void* wrap_export(const char* name, void* real_fn, void* driver) noexcept {
  if (g_get_nodes.load(std::memory_order_relaxed) == nullptr && driver != nullptr) {
    g_get_nodes.store(reinterpret_cast<GetNodesFn>(::dlsym(driver, "cuGraphGetNodes")), std::memory_order_release);
    g_node_get_type.store(reinterpret_cast<NodeGetTypeFn>(::dlsym(driver, "cuGraphNodeGetType")),
                          std::memory_order_release);
    g_child_get_graph.store(reinterpret_cast<ChildGetGraphFn>(::dlsym(driver, "cuGraphChildGraphNodeGetGraph")),
                            std::memory_order_release);
    g_node_get_enabled.store(reinterpret_cast<NodeGetEnabledFn>(::dlsym(driver, "cuGraphNodeGetEnabled")),
                             std::memory_order_release);
  }
  for (unsigned f = 0; f < kFnCount; ++f) {
    if (std::strcmp(name, kNames[f]) != 0) continue;
    if (real_fn == nullptr) return nullptr;  // the driver lacks it: the stub answers
    g_real[f].store(real_fn, std::memory_order_release);
    return wrapper_of(f);
  }
  return nullptr;
}

}  // namespace nvtaskset::graphs
