// SPDX-License-Identifier: Apache-2.0
// Diagnostic: which driver calls make a CUDA graph exec rebuild the TMDs of
// its kernel nodes (so that the hidden TMD-upload callback, domain 0xb cbid 1,
// fires again and a new TPC mask reaches replays), and where the cluster
// shape sits in a V04 TMD. Subscribes the callback as docs/hardware.md describes and
// counts how often it fires for each launch. Prints one line per fact:
//   FACT <name> rc=<CUresult> callbacks=<n>
// Also times the toggle (disable + enable) per kernel node.
//
// Build: nvcc -arch=sm_90 -o graph_facts graph_facts.cu -lcuda
#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static const unsigned char kUuid[16] = {0x2c, 0x8e, 0x0a, 0xd8, 0x07, 0x10, 0xab, 0x4e,
                                        0x90, 0xdd, 0x54, 0x71, 0x9f, 0xe5, 0xf7, 0x4b};
static const char* kPtx =
    ".version 7.8\n.target sm_90\n.address_size 64\n"
    ".visible .entry empty()\n{\nret;\n}\n";

static int g_cb1 = 0;
static unsigned char g_last_tmd[512];

static void cb(void*, int domain, int cbid, const void* params) {
  if (domain != 0xb || cbid != 1) return;
  ++g_cb1;
  const void* t = static_cast<void* const*>(params)[4];
  std::memcpy(g_last_tmd, t, 384);
}

#define CK(x)                                                 \
  do {                                                        \
    CUresult r_ = (x);                                        \
    if (r_ != CUDA_SUCCESS) {                                 \
      std::printf("FAIL %s -> %d line %d\n", #x, (int)r_, __LINE__); \
      return 1;                                               \
    }                                                         \
  } while (0)

static CUfunction g_fn;
static CUstream g_st;

static CUgraphNode add_kernel(CUgraph g, unsigned grid = 1) {
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = g_fn;
  p.gridDimX = grid;
  p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = 32;
  p.blockDimY = p.blockDimZ = 1;
  CUgraphNode n = nullptr;
  CUresult r = cuGraphAddKernelNode(&n, g, nullptr, 0, &p);
  if (r != CUDA_SUCCESS) std::printf("add_kernel rc=%d\n", (int)r);
  return n;
}

static int launch_count(CUgraphExec e) {
  const int before = g_cb1;
  CUresult r = cuGraphLaunch(e, g_st);
  if (r != CUDA_SUCCESS) std::printf("  cuGraphLaunch rc=%d\n", (int)r);
  cuStreamSynchronize(g_st);
  return g_cb1 - before;
}

static void fact(const char* name, CUresult rc, int callbacks) {
  std::printf("FACT %-48s rc=%d callbacks=%d\n", name, (int)rc, callbacks);
}

int main() {
  CK(cuInit(0));
  const void* table = nullptr;
  CK(cuGetExportTable(&table, reinterpret_cast<const CUuuid*>(kUuid)));
  auto sub = reinterpret_cast<int (*)(uint32_t*, void (*)(void*, int, int, const void*), void*)>(
      static_cast<void* const*>(table)[3]);
  auto en = reinterpret_cast<int (*)(uint32_t, uint32_t, int, int)>(static_cast<void* const*>(table)[6]);
  uint32_t h = 0;
  if (sub(&h, cb, nullptr) != 0 || en(1, h, 0xb, 1) != 0) {
    std::printf("FAIL subscribe\n");
    return 1;
  }
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmodule m;
  CK(cuModuleLoadData(&m, kPtx));
  CK(cuModuleGetFunction(&g_fn, m, "empty"));
  CK(cuStreamCreate(&g_st, CU_STREAM_NON_BLOCKING));

  // --- 1. plain graph: 2 kernel nodes --------------------------------------------
  {
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUgraphNode a = add_kernel(g), b = add_kernel(g);
    CUgraphExec e;
    CK(cuGraphInstantiate(&e, g, 0));
    fact("plain.first_launch", CUDA_SUCCESS, launch_count(e));
    fact("plain.replay", CUDA_SUCCESS, launch_count(e));
    unsigned en_a = 9;
    CUresult r = cuGraphNodeGetEnabled(e, a, &en_a);
    std::printf("FACT plain.get_enabled rc=%d value=%u\n", (int)r, en_a);
    r = cuGraphNodeSetEnabled(e, a, 0);
    CUresult r2 = cuGraphNodeSetEnabled(e, a, 1);
    fact("plain.toggle_one_node", r ? r : r2, launch_count(e));
    r = cuGraphNodeSetEnabled(e, b, 0);
    fact("plain.disabled_b_launch", r, launch_count(e));
    r = cuGraphNodeSetEnabled(e, b, 1);
    fact("plain.reenabled_b_launch", r, launch_count(e));
    r = cuGraphUpload(e, g_st);
    cuStreamSynchronize(g_st);
    fact("plain.upload_again(callbacks at upload)", r, 0);
    cuGraphNodeSetEnabled(e, a, 0);
    cuGraphNodeSetEnabled(e, a, 1);
    int before = g_cb1;
    r = cuGraphUpload(e, g_st);
    cuStreamSynchronize(g_st);
    fact("plain.toggle_then_upload: callbacks at upload", r, g_cb1 - before);
    fact("plain.toggle_then_upload: then launch", CUDA_SUCCESS, launch_count(e));
    // exec update with the same graph
    CUgraphExecUpdateResultInfo info{};
    r = cuGraphExecUpdate(e, g, &info);
    fact("plain.exec_update_same_graph", r, launch_count(e));
    // exec update with a second graph whose kernel has a different grid
    CUgraph g2;
    CK(cuGraphCreate(&g2, 0));
    add_kernel(g2, 2);
    add_kernel(g2, 1);
    r = cuGraphExecUpdate(e, g2, &info);
    fact("plain.exec_update_other_grid", r, launch_count(e));
    // after the update, do node handles of the ORIGINAL graph still toggle?
    r = cuGraphNodeSetEnabled(e, a, 0);
    r2 = cuGraphNodeSetEnabled(e, a, 1);
    fact("plain.after_update_toggle_original_handle", r ? r : r2, launch_count(e));
    // kernel node set params with the same params
    CUDA_KERNEL_NODE_PARAMS kp{};
    r = cuGraphKernelNodeGetParams(a, &kp);
    r2 = cuGraphExecKernelNodeSetParams(e, a, &kp);
    fact("plain.exec_kernel_set_same_params", r ? r : r2, launch_count(e));
    cuGraphExecDestroy(e);
    cuGraphDestroy(g2);
    cuGraphDestroy(g);
  }

  // --- 2. child graph ------------------------------------------------------------
  {
    CUgraph child, parent;
    CK(cuGraphCreate(&child, 0));
    CUgraphNode inner = add_kernel(child);
    CK(cuGraphCreate(&parent, 0));
    CUgraphNode cn;
    CK(cuGraphAddChildGraphNode(&cn, parent, nullptr, 0, child));
    CUgraph embedded;
    CK(cuGraphChildGraphNodeGetGraph(cn, &embedded));
    size_t nn = 0;
    CK(cuGraphGetNodes(embedded, nullptr, &nn));
    std::vector<CUgraphNode> en_nodes(nn);
    CK(cuGraphGetNodes(embedded, en_nodes.data(), &nn));
    std::printf("FACT child.embedded_graph_is_clone=%d embedded_nodes=%zu same_handle=%d\n", embedded != child, nn,
                nn ? en_nodes[0] == inner : -1);
    CUgraphExec e;
    CK(cuGraphInstantiate(&e, parent, 0));
    fact("child.first_launch", CUDA_SUCCESS, launch_count(e));
    fact("child.replay", CUDA_SUCCESS, launch_count(e));
    unsigned v = 9;
    CUresult r = cuGraphNodeGetEnabled(e, en_nodes[0], &v);
    std::printf("FACT child.get_enabled_embedded_node rc=%d value=%u\n", (int)r, v);
    r = cuGraphNodeSetEnabled(e, en_nodes[0], 0);
    CUresult r2 = cuGraphNodeSetEnabled(e, en_nodes[0], 1);
    fact("child.toggle_embedded_node", r ? r : r2, launch_count(e));
    r = cuGraphNodeSetEnabled(e, inner, 0);
    r2 = cuGraphNodeSetEnabled(e, inner, 1);
    fact("child.toggle_user_child_node(original)", r ? r : r2, launch_count(e));
    r = cuGraphNodeSetEnabled(e, cn, 0);
    r2 = cuGraphNodeSetEnabled(e, cn, 1);
    fact("child.toggle_child_graph_node_itself", r ? r : r2, launch_count(e));
    r = cuGraphExecChildGraphNodeSetParams(e, cn, embedded);
    fact("child.exec_child_set_params_same", r, launch_count(e));
    CUDA_KERNEL_NODE_PARAMS kp{};
    cuGraphKernelNodeGetParams(en_nodes[0], &kp);
    kp.gridDimX = 2;
    r = cuGraphExecKernelNodeSetParams(e, en_nodes[0], &kp);
    fact("child.exec_kernel_set_params_embedded_grid2", r, launch_count(e));
    cuGraphExecDestroy(e);
    cuGraphDestroy(parent);
    cuGraphDestroy(child);
  }

  // --- 3. source graph destroyed after instantiation --------------------------------
  {
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUgraphNode a = add_kernel(g);
    CUgraphExec e;
    CK(cuGraphInstantiate(&e, g, 0));
    fact("destroyed.first_launch", CUDA_SUCCESS, launch_count(e));
    CK(cuGraphDestroy(g));
    CUresult r = cuGraphNodeSetEnabled(e, a, 0);
    CUresult r2 = cuGraphNodeSetEnabled(e, a, 1);
    fact("destroyed.toggle_dangling_handle", r ? r : r2, launch_count(e));
    cuGraphExecDestroy(e);
  }

  // --- 4. cost of a toggle on a 1000-node graph ---------------------------------------
  {
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    std::vector<CUgraphNode> ns;
    for (int i = 0; i < 1000; ++i) ns.push_back(add_kernel(g));
    CUgraphExec e;
    CK(cuGraphInstantiate(&e, g, 0));
    launch_count(e);
    auto t0 = std::chrono::steady_clock::now();
    for (auto n : ns) {
      unsigned v;
      cuGraphNodeGetEnabled(e, n, &v);
      cuGraphNodeSetEnabled(e, n, 0);
      cuGraphNodeSetEnabled(e, n, v);
    }
    auto t1 = std::chrono::steady_clock::now();
    const int c = launch_count(e);
    auto t2 = std::chrono::steady_clock::now();
    launch_count(e);
    auto t3 = std::chrono::steady_clock::now();
    std::printf("FACT toggle1000: get+toggle %.1f us total (%.3f us/node); relaunch %.1f us (callbacks %d); plain "
                "replay %.1f us\n",
                std::chrono::duration<double, std::micro>(t1 - t0).count(),
                std::chrono::duration<double, std::micro>(t1 - t0).count() / 1000,
                std::chrono::duration<double, std::micro>(t2 - t1).count(), c,
                std::chrono::duration<double, std::micro>(t3 - t2).count());
    cuGraphExecDestroy(e);
    cuGraphDestroy(g);
  }

  // --- 5. cluster shape in the TMD ---------------------------------------------------
  {
    const unsigned dims[][3] = {{0, 0, 0}, {1, 1, 1}, {2, 1, 1}, {4, 1, 1}, {8, 1, 1}, {2, 2, 1}, {2, 2, 2}};
    for (auto& d : dims) {
      CUlaunchConfig cfg{};
      cfg.gridDimX = d[0] ? d[0] * d[1] * d[2] * 2 : 2;
      cfg.gridDimY = d[0] ? 1 : 1;
      cfg.gridDimZ = 1;
      if (d[0]) {
        cfg.gridDimX = d[0] * 2;
        cfg.gridDimY = d[1];
        cfg.gridDimZ = d[2];
      }
      cfg.blockDimX = 32;
      cfg.blockDimY = cfg.blockDimZ = 1;
      cfg.hStream = g_st;
      CUlaunchAttribute at{};
      at.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      at.value.clusterDim.x = d[0];
      at.value.clusterDim.y = d[1];
      at.value.clusterDim.z = d[2];
      cfg.attrs = d[0] ? &at : nullptr;
      cfg.numAttrs = d[0] ? 1 : 0;
      std::memset(g_last_tmd, 0, sizeof g_last_tmd);
      CUresult r = cuLaunchKernelEx(&cfg, g_fn, nullptr, nullptr);
      cuStreamSynchronize(g_st);
      std::printf("FACT cluster %ux%ux%u rc=%d ver72=0x%02x bytes264-276:", d[0], d[1], d[2], (int)r, g_last_tmd[72]);
      for (int i = 264; i <= 276; ++i) std::printf(" %02x", g_last_tmd[i]);
      std::printf("\n");
    }
    // The same inside a graph kernel node with a cluster attribute.
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUgraphNode n = add_kernel(g, 4);
    CUlaunchAttributeValue v{};
    v.clusterDim.x = 4;
    v.clusterDim.y = 1;
    v.clusterDim.z = 1;
    CUresult r = cuGraphKernelNodeSetAttribute(n, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v);
    CUgraphExec e;
    CK(cuGraphInstantiate(&e, g, 0));
    std::memset(g_last_tmd, 0, sizeof g_last_tmd);
    const int c = launch_count(e);
    std::printf("FACT cluster graph-node 4x1x1 setattr rc=%d callbacks=%d bytes264-276:", (int)r, c);
    for (int i = 264; i <= 276; ++i) std::printf(" %02x", g_last_tmd[i]);
    std::printf("\n");
  }
  std::printf("DONE\n");
  return 0;
}
