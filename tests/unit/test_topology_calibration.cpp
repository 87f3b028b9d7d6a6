// SPDX-License-Identifier: Apache-2.0
// Calibration without a GPU.
//
// 1. topology_from_observations (the pure part) on synthetic observations,
//    consistent and inconsistent.
// 2. calibrate() end to end against a simulated driver: CudaDriver resolves
//    its cu* symbols to the functions below, which model a GPU from an
//    HwModel. Launches call the subscribed TMD callback with a real TMD
//    buffer, read back the mask it wrote (tmd::read_disable_mask), and run
//    the kernel on the enabled TPCs only. A launch whose mask leaves no
//    working TPC never completes, as on real hardware (docs/hardware.md): the tests
//    check calibration never causes one.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>

#include "nvtaskset/calibration.hpp"
#include "nvtaskset/cuda_driver.hpp"
#include "nvtaskset/cuda_driver_api.hpp"
#include "nvtaskset/launch_hook.hpp"
#include "nvtaskset/tmd.hpp"
#include "nvtaskset/topology_json.hpp"
#include "nvtaskset/topology_source.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::topo {
namespace {

using namespace testing;
namespace fs = std::filesystem;


void expect_same_layout(const Topology& got, const Topology& want) {
  ASSERT_EQ(got.tpcs.size(), want.tpcs.size());
  for (std::size_t k = 0; k < got.tpcs.size(); ++k) {
    EXPECT_EQ(got.tpcs[k].bit, want.tpcs[k].bit) << "TPC " << k;
    EXPECT_EQ(got.tpcs[k].gpc, want.tpcs[k].gpc) << "TPC " << k;
    EXPECT_EQ(got.tpcs[k].cluster_capable, want.tpcs[k].cluster_capable) << "TPC " << k;
  }
  ASSERT_EQ(got.gpcs.size(), want.gpcs.size());
  for (std::size_t g = 0; g < got.gpcs.size(); ++g) {
    EXPECT_EQ(got.gpcs[g].tpcs, want.gpcs[g].tpcs) << "GPC " << g;
    EXPECT_EQ(got.gpcs[g].max_cluster, want.gpcs[g].max_cluster) << "GPC " << g;
  }
}

// ---------------------------------------------------------------------------
// Observations a perfect measurement of `m` would give.

CalibrationObservations perfect_observations(const HwModel& m, bool clusters = true) {
  CalibrationObservations o;
  o.device = m.dev;
  o.probed_bits = m.dev.mask_bits_are_logical() ? m.dev.tpc_count() : 128;
  for (unsigned b = 0; b < o.probed_bits; ++b) {
    BitObservation bo;
    bo.bit = PhysicalTpcBit{b};
    for (unsigned k = 0; k < m.bit_of_tpc.size(); ++k)
      if (m.bit_of_tpc[k] == b) bo.vanished = {SmId{2 * k}, SmId{2 * k + 1}};
    o.bits.push_back(bo);
  }
  if (!clusters) return o;
  o.clusters_probed = true;
  // Per hardware GPC, clusters over sliding windows of its capable SMs.
  for (unsigned c : {2u, 4u, 8u, 16u}) {
    ClusterObservation run;
    run.cluster_size = c;
    for (unsigned g = 0; g < m.hw_gpcs; ++g) {
      std::vector<unsigned> sms;
      for (unsigned k = 0; k < m.bit_of_tpc.size(); ++k)
        if (m.hw_gpc_of_tpc[k] == g && m.cluster_capable[k]) {
          sms.push_back(2 * k);
          sms.push_back(2 * k + 1);
        }
      if (sms.size() < c) continue;
      for (unsigned start = 0; start < sms.size(); start += c / 2 + 1) {
        std::vector<SmId> cl;
        for (unsigned j = 0; j < c; ++j) cl.push_back(SmId{sms[(start + j) % sms.size()]});
        run.clusters.push_back(cl);
      }
    }
    o.cluster_runs.push_back(run);
  }
  return o;
}

TEST(CalibrationObservations, PerfectHopperObservationsGiveTheModel) {
  const HwModel m = h200_model();
  const Topology t = topology_from_observations(perfect_observations(m));
  EXPECT_EQ(t.source, "calibration");
  expect_same_layout(t, expected_topology(m));
  // TPCs that never hosted a cluster are reported, not guessed.
  std::vector<unsigned> unplaced;
  for (unsigned k = 0; k < 66; ++k)
    if (!m.cluster_capable[k]) unplaced.push_back(k);
  EXPECT_EQ(t.gpc_note, "TPCs " + format_ranges(unplaced) +
                            " never hosted a thread-block-cluster block, so their GPC is unknown");
}

TEST(CalibrationObservations, GpcsAreNumberedByLowestTpc) {
  // Two groups observed in the "wrong" order: {5, 6} first, then {0, 9}.
  CalibrationObservations o;
  o.device = h200_device();
  o.device.sm_count = 20;  // 10 TPCs
  for (unsigned k = 0; k < 10; ++k) o.bits.push_back({PhysicalTpcBit{20 + k}, {SmId{2 * k}, SmId{2 * k + 1}}});
  o.clusters_probed = true;
  o.cluster_runs.push_back({2, {{SmId{12}, SmId{10}}}});   // TPCs 6 and 5
  o.cluster_runs.push_back({4, {{SmId{19}, SmId{0}, SmId{1}, SmId{18}}}});  // TPCs 9 and 0
  o.cluster_runs.push_back({2, {{SmId{13}, SmId{11}}}});
  const Topology t = topology_from_observations(o);
  ASSERT_EQ(t.gpcs.size(), 2u);
  EXPECT_EQ(ids_of([&] { LogicalTpcSet s; for (auto k : t.gpcs[0].tpcs) s.insert(k); return s; }()),
            (std::vector<unsigned>{0, 9}));
  EXPECT_EQ(t.gpcs[0].max_cluster, 4u);
  EXPECT_EQ(t.gpcs[1].tpcs, (std::vector<LogicalTpcId>{LogicalTpcId{5}, LogicalTpcId{6}}));
  EXPECT_EQ(t.gpcs[1].max_cluster, 2u);
  EXPECT_FALSE(t.tpcs[1].gpc);
  EXPECT_FALSE(t.tpcs[1].cluster_capable);
}

TEST(CalibrationObservations, ClustersLinkAcrossRuns) {
  CalibrationObservations o;
  o.device = h200_device();
  o.device.sm_count = 8;
  for (unsigned k = 0; k < 4; ++k) o.bits.push_back({PhysicalTpcBit{k}, {SmId{2 * k}, SmId{2 * k + 1}}});
  o.clusters_probed = true;
  o.cluster_runs.push_back({2, {{SmId{0}, SmId{2}}, {SmId{4}, SmId{6}}}});
  EXPECT_EQ(topology_from_observations(o).gpcs.size(), 2u);
  o.cluster_runs.push_back({2, {{SmId{3}, SmId{5}}}});  // links the two groups
  const Topology t = topology_from_observations(o);
  ASSERT_EQ(t.gpcs.size(), 1u);
  EXPECT_EQ(t.gpcs[0].tpcs.size(), 4u);
  EXPECT_TRUE(t.gpc_note.empty());
}

// As on a real H200: a TPC whose two SMs only ever held size-2 clusters
// (which fit in one TPC) never shared a cluster with another TPC, so nothing
// says which GPC it is in. It gets no GPC, not a one-TPC GPC of its own, and
// still counts for size-2 clusters.
TEST(CalibrationObservations, TpcThatNeverSharedAClusterGetsNoGpc) {
  CalibrationObservations o;
  o.device = h200_device();
  o.device.sm_count = 8;  // 4 TPCs
  for (unsigned k = 0; k < 4; ++k) o.bits.push_back({PhysicalTpcBit{k}, {SmId{2 * k}, SmId{2 * k + 1}}});
  o.clusters_probed = true;
  o.cluster_runs.push_back({2, {{SmId{0}, SmId{2}}, {SmId{6}, SmId{7}}}});  // TPCs 0+1; TPC 3 alone
  o.cluster_runs.push_back({4, {{SmId{0}, SmId{1}, SmId{2}, SmId{3}}}});
  const Topology t = topology_from_observations(o);
  ASSERT_EQ(t.gpcs.size(), 1u);
  EXPECT_EQ(t.gpcs[0].tpcs, (std::vector<LogicalTpcId>{LogicalTpcId{0}, LogicalTpcId{1}}));
  EXPECT_EQ(t.gpcs[0].max_cluster, 4u);
  EXPECT_FALSE(t.tpcs[3].gpc);
  EXPECT_TRUE(t.tpcs[3].cluster_capable);
  EXPECT_FALSE(t.tpcs[2].cluster_capable);
  EXPECT_EQ(t.gpc_note,
            "TPC 2 never hosted a thread-block-cluster block, so its GPC is unknown; "
            "TPC 3 never shared a thread-block cluster with another TPC, so its GPC is unknown");
  LogicalTpcSet lone;
  lone.insert(LogicalTpcId{3});
  EXPECT_EQ(cluster_capability(t, lone).sizes, std::vector<unsigned>{2});
  LogicalTpcSet none;
  none.insert(LogicalTpcId{2});
  EXPECT_TRUE(cluster_capability(t, none).sizes.empty());
}

TEST(CalibrationObservations, PreHopperHasNoClusterGpcs) {
  const HwModel m = a100_model();
  const Topology t = topology_from_observations(perfect_observations(m, /*clusters=*/false));
  EXPECT_FALSE(t.gpcs_known());
  EXPECT_NE(t.gpc_note.find("before Hopper"), std::string::npos);
  for (unsigned k = 0; k < 54; ++k) EXPECT_EQ(t.tpcs[k].bit->value, k);
}

TEST(CalibrationObservations, NoClusterRanMeansUnknownGpcs) {
  CalibrationObservations o = perfect_observations(h200_model(), false);
  o.clusters_probed = true;
  o.refused_cluster_sizes = {2, 4, 8, 16};
  const Topology t = topology_from_observations(o);
  EXPECT_FALSE(t.gpcs_known());
  EXPECT_EQ(t.gpc_note, "no thread-block cluster ran during calibration (the device refused cluster sizes 2,4,8,16)");
  EXPECT_TRUE(t.bits_known());
}

TEST(CalibrationObservations, BitHidingOneSmOnlyIsAnError) {
  CalibrationObservations o = perfect_observations(h200_model());
  o.bits[17].vanished = {SmId{34}};
  o.bits[17].launches = 6;
  EXPECT_EQ(error_of([&] { topology_from_observations(o); }),
            "calibration of device 0: disabling mask bit 17 hid SM 34 (expected no SM, or both SMs of one TPC) in 6 "
            "launches");
}

TEST(CalibrationObservations, BitHidingTwoTpcsOrAMisalignedPairIsAnError) {
  CalibrationObservations o = perfect_observations(h200_model());
  o.bits[1].vanished = {SmId{4}, SmId{5}, SmId{6}, SmId{7}};
  EXPECT_NE(error_of([&] { topology_from_observations(o); }).find("mask bit 1 hid SMs 4 5 6 7"), std::string::npos);
  o = perfect_observations(h200_model());
  o.bits[1].vanished = {SmId{5}, SmId{6}};  // two SMs, but of two TPCs
  EXPECT_NE(error_of([&] { topology_from_observations(o); }).find("mask bit 1 hid SMs 5 6"), std::string::npos);
}

TEST(CalibrationObservations, TwoBitsForOneTpcIsAnError) {
  const HwModel m = h200_model();
  CalibrationObservations o = perfect_observations(m);
  // Bit 1 is a hole in the model; let it also "control" TPC 0.
  ASSERT_TRUE(o.bits[1].vanished.empty());
  o.bits[1].vanished = {SmId{0}, SmId{1}};
  const unsigned first = std::min(1u, m.bit_of_tpc[0]), second = std::max(1u, m.bit_of_tpc[0]);
  EXPECT_EQ(error_of([&] { topology_from_observations(o); }),
            fmt::format("calibration of device 0: logical TPC 0 (SMs 0-1) is controlled by both mask bit {} and mask "
                        "bit {}",
                        first, second));
}

TEST(CalibrationObservations, TpcWithoutBitIsAnError) {
  const HwModel m = h200_model();
  CalibrationObservations o = perfect_observations(m);
  o.bits[m.bit_of_tpc[7]].vanished.clear();
  o.bits[m.bit_of_tpc[9]].vanished.clear();
  EXPECT_EQ(error_of([&] { topology_from_observations(o); }),
            "calibration of device 0: logical TPCs 7,9 are controlled by no mask bit among the 128 probed");
}

TEST(CalibrationObservations, OutOfRangeAndMalformedInputsAreErrors) {
  CalibrationObservations o = perfect_observations(h200_model());
  o.bits[3].vanished = {SmId{132}, SmId{133}};
  EXPECT_NE(error_of([&] { topology_from_observations(o); }).find("hid SM 132, but the device has SMs 0-131"),
            std::string::npos);
  o = perfect_observations(h200_model());
  o.bits.push_back(o.bits[3]);
  EXPECT_NE(error_of([&] { topology_from_observations(o); }).find("mask bit 3 was observed twice"), std::string::npos);
  o = perfect_observations(h200_model());
  o.cluster_runs[1].clusters[0].pop_back();
  EXPECT_NE(error_of([&] { topology_from_observations(o); }).find("a cluster of size 4 recorded 3 blocks"),
            std::string::npos);
  o = perfect_observations(h200_model());
  o.cluster_runs[0].clusters[0][0] = SmId{500};
  EXPECT_NE(error_of([&] { topology_from_observations(o); }).find("a cluster block ran on SM 500"), std::string::npos);
}

// ---------------------------------------------------------------------------
// The simulated driver.

namespace fake {

struct Allocation {
  std::vector<std::uint32_t> words;
};

struct State {
  std::vector<HwModel> devices;
  unsigned char tmd_version = 0x40;  // QMD V04 (Hopper)
  bool fire_callback = true;
  int fail_init = 0;                   // CUresult cuInit returns
  bool allow_16 = true;                // the device accepts non-portable size 16
  unsigned hang_at_launch = 0;         // 1-based launch that never completes (0: none)
  double drop_probability = 0;         // a launch misses one random SM
  int never_sm = -1;                   // this SM never runs a block
  std::mt19937 rng{1234};

  // Observed.
  std::string mps_dir_at_init;
  bool mps_dir_empty_at_init = false;
  int current_device = -1;
  int ctx_refs = 0;
  int modules = 0;
  int streams = 0;
  int device_allocs = 0;
  int host_allocs = 0;
  unsigned launches = 0;
  unsigned hangs_caused = 0;   // launches whose mask enabled no working TPC
  unsigned max_disabled_working = 0;
  bool nonportable_set = false;
  std::set<std::string> module_names;

  // Simulated state.
  bool stream_stuck = false;
  std::map<CUdeviceptr, Allocation> mem;
  CUdeviceptr next = 0x10000000;
  std::map<unsigned, unsigned> rotation;  // per hw GPC: where the next cluster starts
};

State* g = nullptr;
// The driver keeps subscriptions for the life of the process (so does ours).
hook::Callback g_cb = nullptr;
void* g_ud = nullptr;
bool g_enabled = false;

const HwModel& model() { return g->devices.at(static_cast<std::size_t>(g->current_device)); }

CUresult cuInit(unsigned) {
  if (const char* d = std::getenv("CUDA_MPS_PIPE_DIRECTORY")) {
    g->mps_dir_at_init = d;
    std::error_code ec;
    g->mps_dir_empty_at_init = fs::is_directory(d, ec) && fs::is_empty(d, ec);
  }
  return static_cast<CUresult>(g->fail_init);
}
CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult r, const char** s) {
  static const std::map<int, const char*> names = {{0, "CUDA_SUCCESS"},
                                                   {1, "CUDA_ERROR_INVALID_VALUE"},
                                                   {100, "CUDA_ERROR_NO_DEVICE"},
                                                   {600, "CUDA_ERROR_NOT_READY"},
                                                   {912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"}};
  auto it = names.find(static_cast<int>(r));
  if (it == names.end()) return CUDA_ERROR_INVALID_VALUE;
  *s = it->second;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int* n) {
  *n = static_cast<int>(g->devices.size());
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* d, int i) {
  if (i < 0 || i >= static_cast<int>(g->devices.size())) return CUDA_ERROR_INVALID_VALUE;
  *d = i;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char* buf, int len, CUdevice d) {
  std::snprintf(buf, static_cast<std::size_t>(len), "%s", g->devices.at(d).dev.name.c_str());
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(CUuuid* u, CUdevice d) {
  std::memcpy(u->bytes, g->devices.at(d).dev.uuid.data(), 16);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  const DeviceInfo& dev = g->devices.at(d).dev;
  const unsigned bus = static_cast<unsigned>(std::stoul(dev.pci_bus_id.substr(5, 2), nullptr, 16));
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = dev.cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = dev.cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = static_cast<int>(dev.sm_count); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = static_cast<int>(bus); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *v = 0; break;
    // H100/H200 values: 227 KiB per block opt-in, 228 KiB per SM.
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: *v = dev.cc_major >= 9; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  *c = reinterpret_cast<CUcontext>(static_cast<std::uintptr_t>(0x1000 + d));
  ++g->ctx_refs;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice) {
  --g->ctx_refs;
  return CUDA_SUCCESS;
}
CUresult cuCtxPushCurrent(CUcontext c) {
  g->current_device = static_cast<int>(reinterpret_cast<std::uintptr_t>(c) - 0x1000);
  return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent(CUcontext* c) {
  if (c) *c = nullptr;
  g->current_device = -1;
  return CUDA_SUCCESS;
}

// Module handles: 1 = SM-ID kernel, 2 = cluster kernel.
CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned, CUjit_option*, void**) {
  const std::string ptx = static_cast<const char*>(image);
  if (ptx.find(".entry nvtaskset_record_smid") != std::string::npos) {
    *m = reinterpret_cast<CUmodule>(1);
  } else if (ptx.find(".entry nvtaskset_record_cluster") != std::string::npos) {
    if (model().dev.cc_major < 9) return CUDA_ERROR_INVALID_PTX;
    *m = reinterpret_cast<CUmodule>(2);
  } else {
    return CUDA_ERROR_INVALID_PTX;
  }
  ++g->modules;
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule) {
  --g->modules;
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  const auto id = reinterpret_cast<std::uintptr_t>(m);
  const std::string want = id == 1 ? "nvtaskset_record_smid" : "nvtaskset_record_cluster";
  if (name != want) return CUDA_ERROR_NOT_FOUND;
  g->module_names.insert(name);
  *f = reinterpret_cast<CUfunction>(id);
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute a, int v) {
  if (a == CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) g->nonportable_set = v != 0;
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction, int, size_t smem) {
  *n = smem > 233472 / 2 ? 1 : 2;
  return CUDA_SUCCESS;
}
CUresult cuMemAlloc(CUdeviceptr* p, size_t bytes) {
  *p = g->next;
  g->next += 0x100000;
  g->mem[*p].words.assign((bytes + 3) / 4, 0xdeadbeef);
  ++g->device_allocs;
  return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr p) {
  g->mem.erase(p);
  --g->device_allocs;
  return CUDA_SUCCESS;
}
// Pinned host memory belongs to the driver, as with the real one: the blocks
// stay listed here until freed. Calibration deliberately leaks its buffers
// after a timeout (tearing down would block on a wedged stream); kept
// reachable here, LeakSanitizer (NVTASKSET_SANITIZE) does not report them.
std::set<void*>& host_blocks() {
  static auto* blocks = new std::set<void*>;  // never destroyed: the leak check runs after static destructors
  return *blocks;
}
CUresult cuMemAllocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes);
  host_blocks().insert(*p);
  ++g->host_allocs;
  return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void* p) {
  host_blocks().erase(p);
  std::free(p);
  --g->host_allocs;
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void* h, size_t bytes, CUstream) {
  if (g->stream_stuck) return CUDA_SUCCESS;  // queued behind a kernel that never finishes
  std::memcpy(g->mem.at(d).words.data(), h, bytes);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync(void* h, CUdeviceptr d, size_t bytes, CUstream) {
  if (g->stream_stuck) return CUDA_SUCCESS;
  std::memcpy(h, g->mem.at(d).words.data(), bytes);
  return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream* s, unsigned) {
  *s = reinterpret_cast<CUstream>(0x5);
  ++g->streams;
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream) {
  --g->streams;
  return CUDA_SUCCESS;
}
CUresult cuStreamQuery(CUstream) { return g->stream_stuck ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS; }

// Builds a TMD, lets the subscribed callback edit it, and returns the mask of
// TPCs the hardware would run on (docs/hardware.md: set bit = disabled; V04 needs its
// valid bit).
std::vector<bool> enabled_tpcs_after_callback() {
  ++g->launches;
  alignas(8) unsigned char tmd_buf[512] = {};
  if (g->tmd_version == 0x50)
    tmd_buf[58] = 0x50;
  else
    tmd_buf[72] = g->tmd_version;
  void* params[8] = {};
  const std::uint32_t size = 0x40;
  std::memcpy(&params[0], &size, 4);
  params[4] = tmd_buf;
  if (g_cb && g_enabled && g->fire_callback) g_cb(g_ud, hook::kDomainLaunch, hook::kCbidTmdUpload, params);
  const tmd::Layout layout = tmd::detect(tmd_buf);
  Bits128 disable;
  if (layout != tmd::Layout::kUnknown && tmd::mask_valid(tmd_buf, layout)) disable = tmd::read_disable_mask(tmd_buf, layout);
  const HwModel& m = model();
  std::vector<bool> en(m.bit_of_tpc.size());
  unsigned working = 0, disabled_working = 0;
  for (std::size_t k = 0; k < en.size(); ++k) {
    en[k] = !disable.test(m.bit_of_tpc[k]);
    working += en[k];
    disabled_working += !en[k];
  }
  g->max_disabled_working = std::max(g->max_disabled_working, disabled_working);
  if (working == 0) {
    ++g->hangs_caused;
    g->stream_stuck = true;
  }
  if (g->hang_at_launch && g->launches == g->hang_at_launch) g->stream_stuck = true;
  return en;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned, unsigned, unsigned bx, unsigned, unsigned, unsigned smem,
                        CUstream, void** params, void**) {
  if (reinterpret_cast<std::uintptr_t>(f) != 1) return CUDA_ERROR_INVALID_HANDLE;
  const HwModel& m = model();
  EXPECT_GE(gx, m.dev.sm_count) << "a grid smaller than the SM count cannot cover every SM";
  EXPECT_EQ(bx, 32u);
  EXPECT_GT(smem, 233472u / 2) << "one block per SM needs more than half an SM's shared memory";
  const std::vector<bool> en = enabled_tpcs_after_callback();
  if (g->stream_stuck) return CUDA_SUCCESS;
  auto& out = g->mem.at(*static_cast<CUdeviceptr*>(params[0])).words;
  std::vector<unsigned> sms;
  for (unsigned k = 0; k < en.size(); ++k)
    if (en[k])
      for (unsigned s : {2 * k, 2 * k + 1})
        if (static_cast<int>(s) != g->never_sm) sms.push_back(s);
  if (g->drop_probability > 0 && std::uniform_real_distribution<>(0, 1)(g->rng) < g->drop_probability)
    sms.erase(sms.begin() + static_cast<long>(g->rng() % sms.size()));
  for (unsigned s : sms) out[s / 32] |= 1u << (s % 32);
  out[32] = std::max(out[32], m.dev.sm_count);
  return CUDA_SUCCESS;
}

unsigned cluster_dim(const CUlaunchConfig* cfg) {
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) return cfg->attrs[i].value.clusterDim.x;
  return 1;
}

// Per hardware GPC, the SMs that can host cluster blocks among `en`.
std::map<unsigned, std::vector<unsigned>> cluster_sms(const std::vector<bool>& en) {
  const HwModel& m = model();
  std::map<unsigned, std::vector<unsigned>> out;
  for (unsigned k = 0; k < m.bit_of_tpc.size(); ++k)
    if (en[k] && m.cluster_capable[k]) {
      out[m.hw_gpc_of_tpc[k]].push_back(2 * k);
      out[m.hw_gpc_of_tpc[k]].push_back(2 * k + 1);
    }
  return out;
}

bool size_allowed(unsigned c) { return c <= 8 || (c <= 16 && g->nonportable_set && g->allow_16); }

CUresult cuOccupancyMaxActiveClusters(int* n, CUfunction f, const CUlaunchConfig* cfg) {
  if (reinterpret_cast<std::uintptr_t>(f) != 2) return CUDA_ERROR_INVALID_HANDLE;
  const unsigned c = cluster_dim(cfg);
  if (!size_allowed(c)) return static_cast<CUresult>(912);
  *n = 0;
  for (const auto& [gpc, sms] : cluster_sms(std::vector<bool>(model().bit_of_tpc.size(), true)))
    *n += static_cast<int>(sms.size() / c);
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* cfg, CUfunction f, void** params, void**) {
  if (reinterpret_cast<std::uintptr_t>(f) != 2) return CUDA_ERROR_INVALID_HANDLE;
  const unsigned c = cluster_dim(cfg);
  if (!size_allowed(c)) return static_cast<CUresult>(912);
  if (cfg->gridDimX % c) return CUDA_ERROR_INVALID_VALUE;
  const std::vector<bool> en = enabled_tpcs_after_callback();
  if (g->stream_stuck) return CUDA_SUCCESS;
  std::vector<std::pair<unsigned, std::vector<unsigned>>> eligible;
  for (auto& [gpc, sms] : cluster_sms(en))
    if (sms.size() >= c) eligible.emplace_back(gpc, sms);
  if (eligible.empty()) {  // no GPC can host the cluster: it never runs
    ++g->hangs_caused;
    g->stream_stuck = true;
    return CUDA_SUCCESS;
  }
  auto& out = g->mem.at(*static_cast<CUdeviceptr*>(params[0])).words;
  for (unsigned i = 0; i < cfg->gridDimX / c; ++i) {
    const auto& [gpc, sms] = eligible[i % eligible.size()];
    unsigned& rot = g->rotation[gpc];
    for (unsigned j = 0; j < c; ++j) {
      const unsigned b = i * c + j;
      out[2 * b] = sms[(rot + j) % sms.size()] + 1;
      out[2 * b + 1] = i + 1;
    }
    rot = (rot + c / 2 + 1) % static_cast<unsigned>(sms.size());
  }
  return CUDA_SUCCESS;
}

int subscribe(std::uint32_t* handle, hook::Callback cb, void* ud) {
  g_cb = cb;
  g_ud = ud;
  *handle = 7;
  return 0;
}
int enable(std::uint32_t on, std::uint32_t handle, int domain, int cbid) {
  if (handle != 7) return 1;
  if (domain == hook::kDomainLaunch && cbid == hook::kCbidTmdUpload) g_enabled = on != 0;
  return 0;
}
void* g_table[8] = {nullptr, nullptr, nullptr, reinterpret_cast<void*>(&subscribe), nullptr, nullptr,
                    reinterpret_cast<void*>(&enable), nullptr};
int cuGetExportTable(const void** table, const void* uuid) {
  if (std::memcmp(uuid, hook::kCallbackTableUuid, 16) != 0) return CUDA_ERROR_INVALID_VALUE;
  *table = g_table;
  return 0;
}

void* resolve(const char* name) {
  static const std::map<std::string, void*> table = {
      {"cuInit", reinterpret_cast<void*>(&cuInit)},
      {"cuDriverGetVersion", reinterpret_cast<void*>(&cuDriverGetVersion)},
      {"cuGetErrorName", reinterpret_cast<void*>(&cuGetErrorName)},
      {"cuDeviceGetCount", reinterpret_cast<void*>(&cuDeviceGetCount)},
      {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
      {"cuDeviceGetName", reinterpret_cast<void*>(&cuDeviceGetName)},
      {"cuDeviceGetUuid_v2", reinterpret_cast<void*>(&cuDeviceGetUuid)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&cuDeviceGetAttribute)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&cuDevicePrimaryCtxRetain)},
      {"cuDevicePrimaryCtxRelease_v2", reinterpret_cast<void*>(&cuDevicePrimaryCtxRelease)},
      {"cuCtxPushCurrent_v2", reinterpret_cast<void*>(&cuCtxPushCurrent)},
      {"cuCtxPopCurrent_v2", reinterpret_cast<void*>(&cuCtxPopCurrent)},
      {"cuModuleLoadDataEx", reinterpret_cast<void*>(&cuModuleLoadDataEx)},
      {"cuModuleUnload", reinterpret_cast<void*>(&cuModuleUnload)},
      {"cuModuleGetFunction", reinterpret_cast<void*>(&cuModuleGetFunction)},
      {"cuFuncSetAttribute", reinterpret_cast<void*>(&cuFuncSetAttribute)},
      {"cuOccupancyMaxActiveBlocksPerMultiprocessor", reinterpret_cast<void*>(&cuOccupancyMaxActiveBlocksPerMultiprocessor)},
      {"cuMemAlloc_v2", reinterpret_cast<void*>(&cuMemAlloc)},
      {"cuMemFree_v2", reinterpret_cast<void*>(&cuMemFree)},
      {"cuMemAllocHost_v2", reinterpret_cast<void*>(&cuMemAllocHost)},
      {"cuMemFreeHost", reinterpret_cast<void*>(&cuMemFreeHost)},
      {"cuMemcpyHtoDAsync_v2", reinterpret_cast<void*>(&cuMemcpyHtoDAsync)},
      {"cuMemcpyDtoHAsync_v2", reinterpret_cast<void*>(&cuMemcpyDtoHAsync)},
      {"cuStreamCreate", reinterpret_cast<void*>(&cuStreamCreate)},
      {"cuStreamDestroy_v2", reinterpret_cast<void*>(&cuStreamDestroy)},
      {"cuStreamQuery", reinterpret_cast<void*>(&cuStreamQuery)},
      {"cuLaunchKernel", reinterpret_cast<void*>(&cuLaunchKernel)},
      {"cuLaunchKernelEx", reinterpret_cast<void*>(&cuLaunchKernelEx)},
      {"cuOccupancyMaxActiveClusters", reinterpret_cast<void*>(&cuOccupancyMaxActiveClusters)},
      {"cuGetExportTable", reinterpret_cast<void*>(&cuGetExportTable)},
  };
  auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace fake

class SimulatedGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = std::make_unique<fake::State>();
    fake::g = state_.get();
    state_->devices = {h200_model(0), h200_model(1)};
    opts_.resolver = &fake::resolve;
    opts_.library_path = "/fake/lib/libcuda.so.580.159.04";
    copts_.wait_timeout = std::chrono::milliseconds(2000);
  }
  // The callback subscription (fake::g_cb) outlives each test, as a real
  // driver's does: calibration subscribes once per process.
  void TearDown() override { fake::g = nullptr; }
  // Everything calibration took, it gave back.
  void expect_no_leaks() {
    EXPECT_EQ(state_->ctx_refs, 0);
    EXPECT_EQ(state_->modules, 0);
    EXPECT_EQ(state_->streams, 0);
    EXPECT_EQ(state_->device_allocs, 0);
    EXPECT_EQ(state_->host_allocs, 0);
    EXPECT_EQ(state_->current_device, -1);
  }
  std::unique_ptr<fake::State> state_;
  DriverOptions opts_;
  CalibrationOptions copts_;
};

TEST_F(SimulatedGpu, QueriesDevices) {
  CudaDriver drv(opts_);
  EXPECT_EQ(drv.driver_version(), 13000);
  EXPECT_EQ(drv.driver_release(), "580.159.04");
  const auto devs = drv.query_devices();
  ASSERT_EQ(devs.size(), 2u);
  EXPECT_EQ(devs[1].ordinal, 1u);
  EXPECT_EQ(devs[1].name, "NVIDIA H200");
  EXPECT_EQ(devs[1].uuid, h200_device(1).uuid);
  EXPECT_EQ(devs[1].pci_bus_id, "0000:5c:00.0");
  EXPECT_EQ(devs[1].cc_major, 9);
  EXPECT_EQ(devs[1].sm_count, 132u);
  EXPECT_EQ(devs[1].driver_version, 13000);
  EXPECT_EQ(devs[1].driver_release, "580.159.04");
  EXPECT_EQ(select_device(devs, "0000:5c:00.0").ordinal, 1u);
}

TEST_F(SimulatedGpu, IsNeverAnMpsClient) {
  const char* before = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string saved = before ? before : "";
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps-test", 1);
  std::string dir;
  {
    CudaDriver drv(opts_);
    dir = drv.private_mps_pipe_dir();
    EXPECT_FALSE(dir.empty());
    EXPECT_EQ(state_->mps_dir_at_init, dir) << "set before cuInit";
    EXPECT_TRUE(state_->mps_dir_empty_at_init);
    EXPECT_EQ(std::string(std::getenv("CUDA_MPS_PIPE_DIRECTORY")), dir);
    drv.restore_environment();
    EXPECT_EQ(std::string(std::getenv("CUDA_MPS_PIPE_DIRECTORY")), "/tmp/nvidia-mps-test");
  }
  EXPECT_FALSE(fs::exists(dir)) << "the private directory is removed";
  ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  {
    CudaDriver drv(opts_);
  }
  EXPECT_EQ(std::getenv("CUDA_MPS_PIPE_DIRECTORY"), nullptr) << "unset again when it was unset";
  if (before) ::setenv("CUDA_MPS_PIPE_DIRECTORY", saved.c_str(), 1);
}

TEST_F(SimulatedGpu, DriverErrorsAreOneLine) {
  state_->fail_init = 100;
  const char* before = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string saved = before ? before : "";
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps-test", 1);
  EXPECT_EQ(error_of([&] { CudaDriver drv(opts_); }), "cuInit failed: CUDA_ERROR_NO_DEVICE (100)");
  EXPECT_EQ(std::string(std::getenv("CUDA_MPS_PIPE_DIRECTORY")), "/tmp/nvidia-mps-test") << "restored after failure";
  EXPECT_FALSE(state_->mps_dir_at_init.empty());
  EXPECT_FALSE(fs::exists(state_->mps_dir_at_init)) << "private directory removed after failure";
  if (before)
    ::setenv("CUDA_MPS_PIPE_DIRECTORY", saved.c_str(), 1);
  else
    ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  state_->fail_init = 0;
  DriverOptions missing = opts_;
  missing.resolver = [](const char* n) { return std::string(n) == "cuLaunchKernel" ? nullptr : fake::resolve(n); };
  EXPECT_EQ(error_of([&] { CudaDriver drv(missing); }),
            "CUDA driver /fake/lib/libcuda.so.580.159.04 lacks cuLaunchKernel (driver too old?)");
  DriverOptions none;
  none.locate.use_env = false;
  none.locate.ld_cache_path = "/nonexistent/ld.so.cache";
  none.locate.search_dirs = {"/nonexistent"};
  const std::string e = error_of([&] { CudaDriver drv(none); });
  EXPECT_EQ(e.rfind("no CUDA driver found: ", 0), 0u) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST_F(SimulatedGpu, CalibratesHopperLayoutExactly) {
  CudaDriver drv(opts_);
  const DeviceInfo dev = drv.query_devices()[1];
  std::vector<std::pair<unsigned, unsigned>> progress;
  const auto t0 = std::chrono::steady_clock::now();
  const Topology t = calibrate(drv, dev, [&](unsigned d, unsigned n) { progress.emplace_back(d, n); }, copts_);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  expect_same_layout(t, expected_topology(h200_model(1)));
  EXPECT_EQ(t.source, "calibration");
  EXPECT_EQ(t.device.ordinal, 1u);
  EXPECT_EQ(t.calibrated_at.size(), 20u);  // 2025-06-01T12:00:00Z
  ASSERT_TRUE(t.calibration_ms);
  EXPECT_LE(*t.calibration_ms, ms + 1);
  EXPECT_EQ(state_->hangs_caused, 0u) << "a launch enabled no working TPC";
  // Only the verification launches disable more than one working TPC; never all.
  EXPECT_LT(state_->max_disabled_working, 66u);
  EXPECT_EQ(state_->module_names, (std::set<std::string>{"nvtaskset_record_smid", "nvtaskset_record_cluster"}));
  // Progress: 1 baseline + 128 bits + 1 check + 4 cluster sizes, in order.
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), std::make_pair(134u, 134u));
  for (std::size_t i = 1; i < progress.size(); ++i) EXPECT_GT(progress[i].first, progress[i - 1].first);
  expect_no_leaks();
  EXPECT_NO_THROW(validate(t));
  EXPECT_FALSE(drv.wedged());
}

TEST_F(SimulatedGpu, BlackwellLayoutToo) {
  state_->tmd_version = 0x50;
  state_->devices[0].dev.cc_major = 10;
  CudaDriver drv(opts_);
  const Topology t = calibrate(drv, drv.query_devices()[0], {}, copts_);
  HwModel m = h200_model(0);
  m.dev.cc_major = 10;
  expect_same_layout(t, expected_topology(m));
}

TEST_F(SimulatedGpu, RidesOutFlakyCoverage) {
  state_->drop_probability = 0.3;
  CudaDriver drv(opts_);
  const Topology t = calibrate(drv, drv.query_devices()[0], {}, copts_);
  expect_same_layout(t, expected_topology(h200_model(0)));
  EXPECT_EQ(state_->hangs_caused, 0u);
}

TEST_F(SimulatedGpu, WithoutSize16ClustersGpcsCapAt8) {
  state_->allow_16 = false;
  CudaDriver drv(opts_);
  const Topology t = calibrate(drv, drv.query_devices()[0], {}, copts_);
  ASSERT_EQ(t.gpcs.size(), 8u);
  for (const auto& g : t.gpcs) EXPECT_EQ(g.max_cluster, 8u);
  EXPECT_EQ(cluster_capability(t, all_tpcs(t)).gpu_largest, 8u);
}

TEST_F(SimulatedGpu, SmThatNeverRunsIsAnError) {
  state_->never_sm = 5;
  CudaDriver drv(opts_);
  const std::string e = error_of([&] { calibrate(drv, drv.query_devices()[0], {}, copts_); });
  EXPECT_EQ(e, "calibration of device 0: SM 5 never ran a block in 16 launches with every TPC enabled");
  expect_no_leaks();
}

TEST_F(SimulatedGpu, CallbackThatNeverFiresIsAnError) {
  state_->fire_callback = false;
  CudaDriver drv(opts_);
  const std::string e = error_of([&] { calibrate(drv, drv.query_devices()[0], {}, copts_); });
  EXPECT_NE(e.find("launch callback did not fire"), std::string::npos) << e;
  expect_no_leaks();
}

TEST_F(SimulatedGpu, UnknownTmdLayoutIsAnError) {
  state_->tmd_version = 0x99;
  CudaDriver drv(opts_);
  const std::string e = error_of([&] { calibrate(drv, drv.query_devices()[0], {}, copts_); });
  EXPECT_NE(e.find("layout nvtaskset cannot edit (version byte 0x99)"), std::string::npos) << e;
}

TEST_F(SimulatedGpu, BitControllingTwoTpcsIsAnError) {
  state_->devices[0].bit_of_tpc[10] = state_->devices[0].bit_of_tpc[11];
  CudaDriver drv(opts_);
  const std::string e = error_of([&] { calibrate(drv, drv.query_devices()[0], {}, copts_); });
  EXPECT_NE(e.find("hid SMs 20 21 22 23"), std::string::npos) << e;
  EXPECT_EQ(state_->hangs_caused, 0u);
}

TEST_F(SimulatedGpu, EveryWaitIsBounded) {
  state_->hang_at_launch = 40;
  copts_.wait_timeout = std::chrono::milliseconds(200);
  CudaDriver drv(opts_);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { calibrate(drv, drv.query_devices()[0], {}, copts_); });
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_NE(e.find("did not finish within 200 ms"), std::string::npos) << e;
  EXPECT_LT(waited, std::chrono::seconds(3));
  EXPECT_TRUE(drv.wedged());
  // Nothing is torn down behind a stuck kernel, and the GPU is not touched again.
  EXPECT_EQ(state_->ctx_refs, 1);
  const unsigned launches = state_->launches;
  EXPECT_NE(error_of([&] { calibrate(drv, drv.query_devices()[0], {}, copts_); }).find("timed out"), std::string::npos);
  EXPECT_EQ(state_->launches, launches);
}

TEST_F(SimulatedGpu, PreHopperIdentityIsVerified) {
  state_->devices = {a100_model()};
  state_->tmd_version = 0x30;  // a V03 QMD
  CudaDriver drv(opts_);
  std::pair<unsigned, unsigned> last{};
  const Topology t = calibrate(drv, drv.query_devices()[0], [&](unsigned d, unsigned n) { last = {d, n}; }, copts_);
  for (unsigned k = 0; k < 54; ++k) EXPECT_EQ(t.tpcs[k].bit->value, k);
  EXPECT_FALSE(t.gpcs_known());
  EXPECT_EQ(last, std::make_pair(56u, 56u)) << "1 baseline + 54 bits + 1 check, no clusters";
  EXPECT_EQ(state_->module_names, std::set<std::string>{"nvtaskset_record_smid"});
  expect_no_leaks();
}

TEST_F(SimulatedGpu, PreHopperNonIdentityIsAnError) {
  state_->devices = {a100_model()};
  std::swap(state_->devices[0].bit_of_tpc[3], state_->devices[0].bit_of_tpc[5]);
  state_->tmd_version = 0x30;
  CudaDriver drv(opts_);
  const std::string e = error_of([&] { calibrate(drv, drv.query_devices()[0], {}, copts_); });
  EXPECT_EQ(e, "calibration of device 0: mask bit 5 controls logical TPC 3; before Hopper it should control TPC 5");
}

TEST_F(SimulatedGpu, GetTopologyCalibratesOnceThenUsesTheCache) {
  const std::string dir = ::testing::TempDir() + "nvtaskset_calib_cache";
  fs::remove_all(dir);
  CudaDriver drv(opts_);
  const DeviceInfo dev = drv.query_devices()[0];
  TopologyOptions to;
  to.use_env = false;
  to.cache_dir = dir;
  to.nvdebug_root = dir + "/no-proc";
  to.nvdebug_index = 0;
  to.driver = &drv;
  to.calibration = copts_;
  unsigned steps = 0;
  to.progress = [&](unsigned, unsigned) { ++steps; };
  const Topology first = get_topology(dev, to);
  EXPECT_GT(steps, 0u);
  EXPECT_TRUE(fs::exists(dir + "/" + cache_file_name(dev)));
  const unsigned launches = state_->launches;
  const Topology second = get_topology(dev, to);
  EXPECT_EQ(state_->launches, launches) << "served from the cache";
  expect_same_layout(second, first);
  EXPECT_EQ(second.calibrated_at, first.calibrated_at);
  to.recalibrate = true;  // --calibrate measures again
  get_topology(dev, to);
  EXPECT_GT(state_->launches, launches);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace nvtaskset::topo
