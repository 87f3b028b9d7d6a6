// SPDX-License-Identifier: Apache-2.0
// Calibration, the GPU half: the session that launches the calibration
// kernels, one mask bit disabled at a time and then in clusters, and records
// what ran where. The pure half (observations -> Topology) is inference.cpp.
// See calibration.hpp for the method and docs/hardware.md for the hardware
// facts behind it.
#include "nvtaskset/calibration.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "calibration_util.hpp"
#include "cuda_api.hpp"
#include "gpu_context.hpp"
#include "nvtaskset/launch_hook.hpp"
#include "nvtaskset/seqlock.hpp"
#include "nvtaskset/tmd.hpp"

namespace nvtaskset::topo {

#include "kernels_ptx.inc"

const char* smid_kernel_ptx() { return kSmidKernelPtx; }
const char* cluster_kernel_ptx() { return kClusterKernelPtx; }
const char* block_smid_kernel_ptx() { return kBlockSmidKernelPtx; }

using detail::fail;
using detail::is_tpc_pair;
using detail::sm_list;

// ---------------------------------------------------------------------------
// The GPU part.

namespace {

// The launch callback's state. Process-global: the driver keeps calling the
// callback for the life of the process (there is no unsubscribe), so its
// userdata must never dangle. Disarmed, the callback leaves TMDs alone.
struct HookState {
  std::atomic<bool> armed{false};
  // The disable mask, published with a sequence lock so the callback (which
  // may run on any launching thread) never reads a torn 128-bit value.
  std::atomic<std::uint32_t> seq{0};
  std::atomic<std::uint64_t> lo{0}, hi{0};
  std::atomic<std::uint64_t> calls{0};          // armed callbacks that wrote a mask
  std::atomic<std::uint64_t> unknown_layout{0};  // armed callbacks with a TMD we cannot edit
  std::atomic<std::uint64_t> unreadable{0};      // armed callbacks that could not read the mask
  std::atomic<int> layout{static_cast<int>(tmd::Layout::kUnknown)};
  std::atomic<std::uint32_t> version_byte{0};

  void set_mask(const Bits128& m) {
    seq.fetch_add(1, std::memory_order_acq_rel);  // odd: writing
    lo.store(m.lo, std::memory_order_relaxed);
    hi.store(m.hi, std::memory_order_relaxed);
    seq.fetch_add(1, std::memory_order_release);  // even: stable
  }
  // False when no consistent copy was had within seqlock::kReadTries: the
  // session sets the mask before each launch on the launching thread, so
  // only a concurrent writer could cause it, and then no mask is written.
  bool mask(Bits128& m) const noexcept {
    return seqlock::read(seq, [&]() noexcept {
      m.lo = lo.load(std::memory_order_relaxed);
      m.hi = hi.load(std::memory_order_relaxed);
    });
  }
};

HookState g_hook;

void on_tmd_upload(void* userdata, int domain, int cbid, const void* params) {
  auto* h = static_cast<HookState*>(userdata);
  void* t = hook::tmd_of(domain, cbid, params);
  if (!t || !h->armed.load(std::memory_order_acquire)) return;
  const tmd::Layout layout = tmd::detect(t);
  h->layout.store(static_cast<int>(layout), std::memory_order_relaxed);
  h->version_byte.store(tmd::version_byte(t), std::memory_order_relaxed);
  Bits128 disable;
  if (!h->mask(disable)) {
    h->unreadable.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (!tmd::write_disable_mask(t, layout, disable)) {
    h->unknown_layout.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  h->calls.fetch_add(1, std::memory_order_release);
}

// Subscribes once per driver (per cuGetExportTable): the subscription lasts
// as long as the process.
void ensure_hook(const CudaDriver& drv) {
  static std::mutex mu;
  static std::set<void*> done;
  std::lock_guard lock(mu);
  void* key = reinterpret_cast<void*>(drv.api().cuGetExportTable);
  if (done.count(key)) return;
  std::string why;
  if (!hook::subscribe(reinterpret_cast<hook::GetExportTableFn>(drv.api().cuGetExportTable), &on_tmd_upload, &g_hook,
                       &why))
    fail("cannot subscribe to the driver's launch callback: " + why);
  done.insert(key);
}

std::string iso8601_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Word layout of the SM-ID kernel's output (topology/kernels/smid.cu).
constexpr unsigned kSmBitmapWords = 32;  // SM IDs 0..1023
constexpr unsigned kNsmidWord = 32;
constexpr unsigned kOverflowWord = 33;
constexpr unsigned kSmidWords = 34;

class GpuSession {
 public:
  GpuSession(CudaDriver& drv, const DeviceInfo& dev, const CalibrationOptions& opt)
      : ctx_(drv, dev, fmt::format("calibration of device {}", dev.ordinal)), dev_(dev), opt_(opt) {
    try {
      setup();
    } catch (...) {
      g_hook.armed.store(false, std::memory_order_release);
      throw;
    }
  }

  // The callback leaves TMDs alone from here on; ctx_ then tears down (or
  // leaks, after a timeout: the caller leaves with _exit()).
  ~GpuSession() { g_hook.armed.store(false, std::memory_order_release); }

 private:
  void setup() {
    const DeviceInfo& dev = dev_;
    const CalibrationOptions& opt = opt_;
    // One block per SM: ask for more dynamic shared memory than half an SM
    // has, so no second block fits beside the first. Then the first wave of a
    // grid of >= sm_count blocks lands on every enabled SM.
    smem_per_block_ = ctx_.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    const int smem_per_sm = ctx_.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    spdlog::debug("{}: {} B shared memory per block (opt-in), {} B per SM", who(), smem_per_block_, smem_per_sm);
    if (2 * smem_per_block_ <= smem_per_sm)
      spdlog::debug("{}: two blocks may share an SM; coverage then rests on retries", who());

    CUmodule smid_module = ctx_.load_module(smid_kernel_ptx(), "SM-ID kernel");
    check(a().cuModuleGetFunction(&smid_fn_, smid_module, "nvtaskset_record_smid"), "cuModuleGetFunction");
    check(a().cuFuncSetAttribute(smid_fn_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_per_block_),
          "cuFuncSetAttribute(dynamic shared memory)");
    int per_sm = 0;
    check(a().cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, smid_fn_, kThreads,
                                                          static_cast<size_t>(smem_per_block_)),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    spdlog::debug("{}: SM-ID kernel fits {} block(s) per SM", who(), per_sm);
    if (per_sm < 1) fail(fmt::format("{}: the SM-ID kernel cannot run on this device (occupancy 0)", who()));

    // Output buffers. Room for the SM-ID bitmap and for one (SM, cluster)
    // record per block of the largest cluster launch.
    cluster_block_cap_ = 4 * dev.sm_count * std::max(1u, opt.cluster_waves);
    buf_words_ = std::max<std::size_t>(kSmidWords, 2 * static_cast<std::size_t>(cluster_block_cap_));
    dbuf_ = ctx_.alloc_device(buf_words_ * 4);
    host_ = static_cast<std::uint32_t*>(ctx_.alloc_host(buf_words_ * 4));
    zero_ = static_cast<std::uint32_t*>(ctx_.alloc_host(buf_words_ * 4));
    std::memset(zero_, 0, buf_words_ * 4);
  }

 public:
  GpuSession(const GpuSession&) = delete;
  GpuSession& operator=(const GpuSession&) = delete;

  // One launch of the SM-ID kernel with `disable` written into its TMD.
  // Returns the SM IDs that ran a block, ascending.
  std::vector<unsigned> run_smid(const Bits128& disable, const std::string& what) {
    const unsigned grid = 2 * dev_.sm_count;
    const std::uint64_t before = g_hook.calls.load(std::memory_order_acquire);
    const std::uint64_t unknown_before = g_hook.unknown_layout.load(std::memory_order_relaxed);
    const std::uint64_t unreadable_before = g_hook.unreadable.load(std::memory_order_relaxed);
    g_hook.set_mask(disable);
    g_hook.armed.store(true, std::memory_order_release);
    check(a().cuMemcpyHtoDAsync(dbuf_, zero_, kSmidWords * 4, ctx_.stream()), "cuMemcpyHtoDAsync");
    unsigned long long spin = opt_.spin_ns;
    void* args[] = {&dbuf_, &spin};
    check(a().cuLaunchKernel(smid_fn_, grid, 1, 1, kThreads, 1, 1, static_cast<unsigned>(smem_per_block_),
                             ctx_.stream(), args, nullptr),
          "cuLaunchKernel");
    check(a().cuMemcpyDtoHAsync(host_, dbuf_, kSmidWords * 4, ctx_.stream()), "cuMemcpyDtoHAsync");
    wait(what);
    g_hook.armed.store(false, std::memory_order_release);
    ++launches_;
    if (g_hook.unknown_layout.load(std::memory_order_relaxed) != unknown_before)
      fail(fmt::format("{}: the TMD has a layout nvtaskset cannot edit (version byte {:#x})", who(),
                       g_hook.version_byte.load()));
    if (g_hook.unreadable.load(std::memory_order_relaxed) != unreadable_before)
      fail(fmt::format("{}: the launch callback could not read the calibration mask consistently", who()));
    if (g_hook.calls.load(std::memory_order_acquire) == before)
      fail(fmt::format("{}: the driver's launch callback did not fire for a calibration kernel, so TPC masks "
                       "cannot be applied with this driver",
                       who()));
    if (host_[kOverflowWord]) fail(fmt::format("{}: a block ran on an SM ID above 1023", who()));
    nsmid_ = std::max(nsmid_, host_[kNsmidWord]);
    std::vector<unsigned> seen;
    for (unsigned w = 0; w < kSmBitmapWords; ++w)
      for (unsigned b = 0; b < 32; ++b)
        if ((host_[w] >> b) & 1u) seen.push_back(32 * w + b);
    for (unsigned sm : seen)
      if (sm >= dev_.sm_count)
        fail(fmt::format("{}: a block ran on SM {}, but the device reports {} SMs (SM IDs are not 0..{})", who(), sm,
                         dev_.sm_count, dev_.sm_count - 1));
    return seen;
  }

  tmd::Layout layout() const { return static_cast<tmd::Layout>(g_hook.layout.load()); }
  std::uint32_t version_byte() const { return g_hook.version_byte.load(); }
  unsigned nsmid() const { return nsmid_; }
  unsigned launches() const { return launches_; }

  // Cluster probing (sm_90+). Returns false (with *why) when the driver or
  // device cannot launch clusters at all.
  bool prepare_clusters(std::string* why) {
    if (!a().cuLaunchKernelEx || !a().cuOccupancyMaxActiveClusters) {
      *why = "the driver has no cuLaunchKernelEx (CUDA 12.0+ needed for thread-block clusters)";
      return false;
    }
    if (ctx_.attribute(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH) != 1) {
      *why = "the device does not support cluster launch";
      return false;
    }
    CUmodule cluster_module = ctx_.load_module(cluster_kernel_ptx(), "cluster kernel");
    check(a().cuModuleGetFunction(&cluster_fn_, cluster_module, "nvtaskset_record_cluster"), "cuModuleGetFunction");
    check(a().cuFuncSetAttribute(cluster_fn_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_per_block_),
          "cuFuncSetAttribute(dynamic shared memory)");
    // Sizes above 8 are "non-portable" and must be allowed explicitly.
    if (CUresult r = a().cuFuncSetAttribute(cluster_fn_, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
        r != CUDA_SUCCESS)
      spdlog::debug("{}: non-portable cluster sizes not allowed: {}", who(), ctx_.driver().describe(r));
    return true;
  }

  // How many clusters of `size` can be resident at once (0 = refused).
  int max_active_clusters(unsigned size) {
    CUlaunchAttribute at{};
    CUlaunchConfig cfg = cluster_config(size, size, &at);
    int n = 0;
    CUresult r = a().cuOccupancyMaxActiveClusters(&n, cluster_fn_, &cfg);
    if (r != CUDA_SUCCESS) {
      spdlog::debug("{}: cluster size {}: cuOccupancyMaxActiveClusters: {}", who(), size, ctx_.driver().describe(r));
      return 0;
    }
    return n;
  }

  // One cluster launch; returns the SMs of each cluster, or nullopt when the
  // launch itself is refused.
  std::optional<std::vector<std::vector<SmId>>> run_clusters(unsigned size, unsigned grid, const std::string& what) {
    CUlaunchAttribute at{};
    CUlaunchConfig cfg = cluster_config(size, grid, &at);
    check(a().cuMemcpyHtoDAsync(dbuf_, zero_, 2ull * grid * 4, ctx_.stream()), "cuMemcpyHtoDAsync");
    g_hook.set_mask(Bits128{});  // every TPC enabled
    g_hook.armed.store(true, std::memory_order_release);
    unsigned long long spin = opt_.spin_ns;
    void* args[] = {&dbuf_, &spin};
    CUresult r = a().cuLaunchKernelEx(&cfg, cluster_fn_, args, nullptr);
    if (r != CUDA_SUCCESS) {
      g_hook.armed.store(false, std::memory_order_release);
      spdlog::debug("{}: cluster size {}: cuLaunchKernelEx: {}", who(), size, ctx_.driver().describe(r));
      return std::nullopt;
    }
    check(a().cuMemcpyDtoHAsync(host_, dbuf_, 2ull * grid * 4, ctx_.stream()), "cuMemcpyDtoHAsync");
    wait(what);
    g_hook.armed.store(false, std::memory_order_release);
    ++launches_;
    const unsigned clusters = grid / size;
    std::vector<std::vector<SmId>> out(clusters);
    for (unsigned b = 0; b < grid; ++b) {
      const std::uint32_t sm1 = host_[2 * b], cl1 = host_[2 * b + 1];
      if (sm1 == 0) fail(fmt::format("{}: block {} of a cluster launch (size {}) never ran", who(), b, size));
      if (cl1 == 0 || cl1 - 1 >= clusters)
        fail(fmt::format("{}: block {} reported cluster {} of {}", who(), b, cl1 - 1, clusters));
      // A 1-D cluster holds consecutive blocks; say so if the hardware disagrees.
      if (cl1 - 1 != b / size)
        spdlog::debug("{}: block {} is in cluster {}, expected {}", who(), b, cl1 - 1, b / size);
      out[cl1 - 1].push_back(SmId{sm1 - 1});
    }
    return out;
  }

  unsigned cluster_block_cap() const { return cluster_block_cap_; }

 private:
  static constexpr unsigned kThreads = 32;

  const CudaDriver::Api& a() const { return ctx_.api(); }
  const std::string& who() const { return ctx_.who(); }
  void check(CUresult r, const char* what) const { ctx_.check(r, what); }

  CUlaunchConfig cluster_config(unsigned size, unsigned grid, CUlaunchAttribute* at) {
    at->id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    at->value.clusterDim.x = size;
    at->value.clusterDim.y = 1;
    at->value.clusterDim.z = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = grid;
    cfg.gridDimY = 1;
    cfg.gridDimZ = 1;
    cfg.blockDimX = kThreads;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    cfg.sharedMemBytes = static_cast<unsigned>(smem_per_block_);
    cfg.hStream = ctx_.stream();
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
  }

  // Bounded (gpu_context.hpp); the callback is disarmed before a failure.
  void wait(const std::string& what) {
    const CUresult r = ctx_.wait(opt_.wait_timeout);
    if (r == CUDA_SUCCESS) return;
    g_hook.armed.store(false, std::memory_order_release);
    if (r == CUDA_ERROR_NOT_READY)
      fail(fmt::format("{}: {} did not finish within {} ms; the GPU may be stuck (this process may need to be killed)",
                       who(), what, opt_.wait_timeout.count()));
    fail(fmt::format("{}: {} failed: {}", who(), what, ctx_.driver().describe(r)));
  }

  GpuContext ctx_;  // declared first: torn down after everything above
  DeviceInfo dev_;
  CalibrationOptions opt_;
  CUfunction smid_fn_ = nullptr, cluster_fn_ = nullptr;
  int smem_per_block_ = 0;
  CUdeviceptr dbuf_ = 0;
  std::uint32_t* host_ = nullptr;
  std::uint32_t* zero_ = nullptr;
  std::size_t buf_words_ = 0;
  unsigned cluster_block_cap_ = 0;
  unsigned nsmid_ = 0;
  unsigned launches_ = 0;
};

std::vector<unsigned> minus(const std::vector<unsigned>& all, const std::vector<unsigned>& seen) {
  std::vector<unsigned> out;
  std::set_difference(all.begin(), all.end(), seen.begin(), seen.end(), std::back_inserter(out));
  return out;
}

std::vector<unsigned> intersect(const std::vector<unsigned>& a, const std::vector<unsigned>& b) {
  std::vector<unsigned> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

std::vector<SmId> to_sms(const std::vector<unsigned>& v) {
  std::vector<SmId> out;
  for (unsigned s : v) out.push_back(SmId{s});
  return out;
}

// Launches with `enable` (complement written as the disable mask, within the
// layout's width) until the SMs seen equal `expected`; any SM outside
// `expected` is a failure at once. Guards against launching a mask with no
// working TPC.
void verify_mask(GpuSession& s, const Topology& t, const PhysicalTpcMask& enable, unsigned mask_width,
                 const std::string& what, const CalibrationOptions& opt) {
  if ((enable.bits & t.working_bits().bits).none())
    fail(fmt::format("calibration of device {}: internal error: refusing to launch a mask with no working TPC",
                     t.device.ordinal));
  const Bits128 disable = ~enable.bits & Bits128::first(mask_width);
  std::vector<unsigned> expected;
  for (LogicalTpcId k : logical_of_physical(t, enable).ids()) {
    expected.push_back(2 * k.value);
    expected.push_back(2 * k.value + 1);
  }
  std::vector<unsigned> seen_union;
  for (unsigned attempt = 0; attempt < std::max(1u, opt.max_bit_launches); ++attempt) {
    auto seen = s.run_smid(disable, what);
    auto extra = minus(seen, expected);
    if (!extra.empty())
      fail(fmt::format("calibration of device {}: check failed: {} ran blocks on {}, which the measured map "
                       "says it disables",
                       t.device.ordinal, what, sm_list(extra)));
    std::vector<unsigned> u;
    std::set_union(seen_union.begin(), seen_union.end(), seen.begin(), seen.end(), std::back_inserter(u));
    seen_union = u;
    if (seen_union == expected) {
      spdlog::debug("calibration of device {}: check passed: {} ({} SMs)", t.device.ordinal, what, expected.size());
      return;
    }
  }
  fail(fmt::format("calibration of device {}: check failed: {} never ran blocks on {}", t.device.ordinal, what,
                   sm_list(minus(expected, seen_union))));
}

}  // namespace

Topology calibrate(CudaDriver& drv, const DeviceInfo& dev, const ProgressFn& progress, const CalibrationOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string who = fmt::format("calibration of device {}", dev.ordinal);
  if (drv.wedged()) fail(fmt::format("{}: an earlier GPU wait timed out in this process; not touching the GPU", who));
  if (dev.sm_count < 4 || dev.sm_count % 2)
    fail(fmt::format("{}: {} SMs; calibration needs at least 2 TPCs of 2 SMs", who, dev.sm_count));
  if (dev.tpc_count() > Bits128::kSize) fail(fmt::format("{}: {} TPCs do not fit a 128-bit mask", who, dev.tpc_count()));
  spdlog::debug("{}: {} {} cc {}.{} {} SMs", who, dev.name, uuid_to_string(dev.uuid), dev.cc_major, dev.cc_minor,
                dev.sm_count);

  ensure_hook(drv);
  GpuSession s(drv, dev, opt);
  const double setup_ms = ms_since(t0);

  std::vector<unsigned> all_sms(dev.sm_count);
  std::iota(all_sms.begin(), all_sms.end(), 0u);

  // 1. Baseline: with no bit disabled every SM must run a block, twice in a row.
  const auto t_base = std::chrono::steady_clock::now();
  unsigned in_a_row = 0;
  std::vector<unsigned> ever;
  for (unsigned i = 0; i < std::max(2u, opt.max_baseline_launches) && in_a_row < 2; ++i) {
    auto seen = s.run_smid(Bits128{}, "the baseline launch");
    std::vector<unsigned> u;
    std::set_union(ever.begin(), ever.end(), seen.begin(), seen.end(), std::back_inserter(u));
    ever = u;
    if (seen == all_sms) {
      ++in_a_row;
    } else {
      in_a_row = 0;
      spdlog::debug("{}: baseline launch {} missed {}", who, i, sm_list(minus(all_sms, seen)));
    }
  }
  if (ever != all_sms)
    fail(fmt::format("{}: {} never ran a block in {} launches with every TPC enabled", who,
                     sm_list(minus(all_sms, ever)), s.launches()));
  if (in_a_row < 2)
    fail(fmt::format("{}: launches with every TPC enabled did not reach every SM reliably in {} launches", who,
                     s.launches()));
  const tmd::Layout layout = s.layout();
  const unsigned width = tmd::mask_bits(layout);
  spdlog::debug("{}: baseline saw all {} SMs ({} launches, %nsmid {}); TMD version byte {:#x}, {}-bit mask", who,
                dev.sm_count, s.launches(), s.nsmid(), s.version_byte(), width);
  if (width == 0) fail(fmt::format("{}: unknown TMD layout (version byte {:#x})", who, s.version_byte()));
  const bool logical = dev.mask_bits_are_logical();
  if (!logical && layout == tmd::Layout::kV01toV03)
    fail(fmt::format("{}: a cc {}.{} device uses a pre-Hopper TMD layout (version byte {:#x}); not supported", who,
                     dev.cc_major, dev.cc_minor, s.version_byte()));
  // Before Hopper bit k is TPC k: only bits 0..tpc_count-1 exist to verify.
  // From Hopper on, bits are physical slots: probe the whole mask.
  const unsigned nbits = logical ? dev.tpc_count() : width;
  if (nbits > width)
    fail(fmt::format("{}: {} TPCs but the TMD mask has only {} bits", who, dev.tpc_count(), width));
  const bool clusters = dev.has_clusters() && opt.probe_clusters;
  const unsigned total = 1 + nbits + 1 + (clusters ? static_cast<unsigned>(std::size(kClusterSizes)) : 0);
  unsigned done = 1;
  auto step = [&] {
    if (progress) progress(done, total);
  };
  step();
  const double base_ms = ms_since(t_base);

  // 2. One bit at a time. Disabling a single bit leaves every other bit
  // enabled, so at least tpc_count-1 TPCs stay enabled: such a launch always
  // runs (docs/hardware.md, "Safe discovery").
  const auto t_bits = std::chrono::steady_clock::now();
  CalibrationObservations obs;
  obs.device = dev;
  obs.probed_bits = nbits;
  for (unsigned bit = 0; bit < nbits; ++bit) {
    Bits128 disable;
    disable.set(bit);
    std::vector<unsigned> inter;
    unsigned launches = 0;
    const std::string what = fmt::format("the launch with mask bit {} disabled", bit);
    for (unsigned a = 0; a < std::max(1u, opt.max_bit_launches); ++a) {
      auto vanished = minus(all_sms, s.run_smid(disable, what));
      ++launches;
      // An SM the mask disables can never run a block, so the true effect of
      // the bit is inside every launch's vanished set.
      inter = a == 0 ? vanished : intersect(inter, vanished);
      if (inter.empty()) break;  // nothing vanished for sure: the bit controls no TPC
      if (launches >= 2 && is_tpc_pair(inter) && vanished == inter) break;  // confirmed
    }
    if (!inter.empty())
      spdlog::debug("{}: mask bit {} -> {} ({} launches)", who, bit, sm_list(inter), launches);
    obs.bits.push_back({PhysicalTpcBit{bit}, to_sms(inter), launches});
    ++done;
    step();
  }
  Topology bits_only = topology_from_observations(obs);
  const double bits_ms = ms_since(t_bits);
  {
    std::string map;
    for (const auto& ti : bits_only.tpcs) map += fmt::format(" {}:{}", ti.id.value, ti.bit->value);
    spdlog::debug("{}: TPC:bit map ({} working bits of {}):{}", who, bits_only.working_bits().size(), nbits, map);
  }
  if (logical) {
    for (const auto& ti : bits_only.tpcs)
      if (ti.bit->value != ti.id.value)
        fail(fmt::format("{}: mask bit {} controls logical TPC {}; before Hopper it should control TPC {}", who,
                         ti.bit->value, ti.id.value, ti.bit->value));
  }

  // 3. Check the map with multi-bit masks, as the shim will write them:
  // every working bit; the bits of even TPCs; the bits of odd TPCs.
  const auto t_check = std::chrono::steady_clock::now();
  {
    verify_mask(s, bits_only, bits_only.working_bits(), width, "the launch enabling every working bit", opt);
    PhysicalTpcMask even, odd;
    for (const auto& ti : bits_only.tpcs) (ti.id.value % 2 ? odd : even).insert(*ti.bit);
    verify_mask(s, bits_only, even, width, "the launch enabling the bits of even TPCs", opt);
    verify_mask(s, bits_only, odd, width, "the launch enabling the bits of odd TPCs", opt);
  }
  ++done;
  step();
  const double check_ms = ms_since(t_check);

  // 4. GPCs from cluster co-residency (sm_90+).
  const auto t_clusters = std::chrono::steady_clock::now();
  if (clusters) {
    std::string why;
    if (!s.prepare_clusters(&why)) {
      spdlog::debug("{}: no cluster probing: {}", who, why);
      for (unsigned c : kClusterSizes) obs.refused_cluster_sizes.push_back(c);
      done += static_cast<unsigned>(std::size(kClusterSizes));
      step();
    } else {
      obs.clusters_probed = true;
      for (unsigned c : kClusterSizes) {
        const int active = s.max_active_clusters(c);
        if (active <= 0) {
          spdlog::debug("{}: cluster size {}: refused by the device", who, c);
          obs.refused_cluster_sizes.push_back(c);
        } else {
          // Several waves, so later clusters land wherever earlier ones left
          // room and the groups link up across each GPC.
          unsigned grid = c * static_cast<unsigned>(active) * std::max(1u, opt.cluster_waves);
          grid = std::min(grid, s.cluster_block_cap() / c * c);
          unsigned ran = 0;
          for (unsigned rep = 0; rep < std::max(1u, opt.cluster_launches_per_size); ++rep) {
            auto groups = s.run_clusters(c, grid, fmt::format("a cluster launch of size {}", c));
            if (!groups) {
              if (rep == 0) obs.refused_cluster_sizes.push_back(c);
              break;
            }
            ++ran;
            obs.cluster_runs.push_back({c, std::move(*groups)});
          }
          spdlog::debug("{}: cluster size {}: up to {} resident, {} launches of {} blocks", who, c, active, ran, grid);
        }
        ++done;
        step();
      }
    }
  }
  const double clusters_ms = ms_since(t_clusters);

  Topology t = topology_from_observations(obs);
  t.calibrated_at = iso8601_now();
  t.calibration_ms = ms_since(t0);
  for (const auto& g : t.gpcs) {
    std::vector<unsigned> ks;
    for (auto k : g.tpcs) ks.push_back(k.value);
    spdlog::debug("{}: GPC {} ({} TPCs, max cluster {}): TPCs {}", who, g.id.value, g.tpcs.size(), g.max_cluster,
                  format_ranges(ks));
  }
  if (!t.gpc_note.empty()) spdlog::debug("{}: {}", who, t.gpc_note);
  spdlog::debug("{}: {:.1f} ms in all ({} launches): setup {:.1f}, baseline {:.1f}, bits {:.1f}, check {:.1f}, "
                "clusters {:.1f}",
                who, *t.calibration_ms, s.launches(), setup_ms, base_ms, bits_ms, check_ms, clusters_ms);
  return t;
}

}  // namespace nvtaskset::topo
