// SPDX-License-Identifier: Apache-2.0
// The launch callback and its last-good copy of each partition
// (launch_callback.hpp): the shim's hot path.
#include "launch_callback.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/launch_hook.hpp"
#include "nvtaskset/partition.hpp"
#include "nvtaskset/seqlock.hpp"
#include "nvtaskset/tmd.hpp"
#include "graphs.hpp"
#include "role_hooks.hpp"

namespace nvtaskset::launch {

constinit std::atomic<ctl::Header*> g_header{nullptr};
constinit std::atomic<bool> g_warn_unsupported{false};
constinit std::atomic<bool> g_widen_clusters{false};

namespace {

// Each message of the cold paths is written once per process.
constinit std::atomic<bool> g_unsupported_reported{false};
constinit std::atomic<bool> g_widen_reported{false};
constinit std::atomic<bool> g_unmasked_reported{false};
constinit std::atomic<bool> g_stale_reported{false};
constinit std::atomic<bool> g_corrupt_reported{false};

// ---- which device a launch is for ---------------------------------------------
// A partition is per GPU: its mask bits are physical slots of THAT chip, so a
// mask must never reach a kernel of another GPU. The CLI keys entries by GPU
// UUID; the callback finds the launching context's device with
// cuCtxGetDevice (the launch runs in the current context, and the call works
// inside this callback: checked on H200, driver 580.159.04, see
// docs/verification.md) and its UUID from a per-ordinal cache filled on the
// first launch on each device. Both are plain driver calls, no system call;
// they are skipped entirely when the only entry is "any device".
std::atomic<CtxGetDeviceFn> g_ctx_get_device{nullptr};
std::atomic<DeviceGetUuidFn> g_device_get_uuid{nullptr};

constexpr int kMaxOrdinals = 64;
struct UuidCacheEntry {
  std::atomic<std::uint32_t> state;  // 0 empty, 1 being filled, 2 ready
  std::uint8_t uuid[16];
};
constinit UuidCacheEntry g_uuid_cache[kMaxOrdinals]{};

// The launching device's UUID into `out`; false when it cannot be told.
bool launch_device_uuid(std::uint8_t (&out)[16]) noexcept {
  const CtxGetDeviceFn get_dev = g_ctx_get_device.load(std::memory_order_acquire);
  const DeviceGetUuidFn get_uuid = g_device_get_uuid.load(std::memory_order_acquire);
  int dev = -1;
  if (get_dev == nullptr || get_uuid == nullptr || get_dev(&dev) != 0 || dev < 0) return false;
  if (dev >= kMaxOrdinals) return get_uuid(out, dev) == 0;
  UuidCacheEntry& c = g_uuid_cache[dev];
  if (c.state.load(std::memory_order_acquire) == 2) {
    std::memcpy(out, c.uuid, 16);
    return true;
  }
  if (get_uuid(out, dev) != 0) return false;
  // First thread to get here publishes; the others just use their own copy.
  std::uint32_t expected = 0;
  if (c.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    std::memcpy(c.uuid, out, 16);
    c.state.store(2, std::memory_order_release);
  }
  return true;
}

// The entry whose partition applies to this launch (control_region.hpp).
inline const ctl::DeviceEntry* select_entry(const ctl::Header& h) noexcept {
  return ctl::entry_for_device(h, [](std::uint8_t (&uuid)[16]) { return launch_device_uuid(uuid); });
}

// Appends text to a fixed buffer (no allocation on the fatal path).
struct Msg {
  char buf[256];
  std::size_t n = 0;
  void add(std::string_view s) {
    for (char c : s)
      if (n < sizeof buf) buf[n++] = c;
  }
  void add_uint(std::uint64_t v, unsigned base) {
    char tmp[24];
    int i = 0;
    do {
      tmp[i++] = "0123456789abcdef"[v % base];
      v /= base;
    } while (v != 0 && i < 24);
    while (i > 0)
      if (n < sizeof buf) buf[n++] = tmp[--i];
      else --i;
  }
};


// Counter increments in the callback are a relaxed load and store, not
// fetch_add: a locked instruction is a full fence on x86, which also drains
// the write-combining buffers holding the driver's half-written pushbuffer.
// Measured on an H200 (tests/gpu/callback_cost.cu, docs/verification.md):
// two fetch_adds per launch cost 3-6% of the enqueue time, the whole TMD edit
// nothing measurable. The counters are diagnostics; when several threads
// launch at once an increment can be lost.
inline void bump(std::atomic<std::uint64_t>& c) noexcept {
  c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// Writes a one-line message once per flag (cold paths only: a system call).
void say_once(std::atomic<bool>& flag, const Msg& m) noexcept {
  if (!flag.exchange(true, std::memory_order_acq_rel)) {
    [[maybe_unused]] const ssize_t r = ::write(2, m.buf, m.n);
  }
}

Msg prefix(std::string_view level) noexcept {
  Msg m;
  m.add("nvtaskset[");
  m.add_uint(static_cast<std::uint64_t>(::getpid()), 10);
  m.add("]: ");
  m.add(level);
  return m;
}

// "0-3,8" of a 128-bit set, into `m` (no allocation).
void add_list(Msg& m, std::uint64_t lo, std::uint64_t hi) noexcept {
  bool first = true;
  for (unsigned i = 0; i < 128;) {
    auto test = [&](unsigned k) { return k < 64 ? (lo >> k) & 1u : (hi >> (k - 64)) & 1u; };
    if (!test(i)) {
      ++i;
      continue;
    }
    unsigned j = i;
    while (j + 1 < 128 && test(j + 1)) ++j;
    if (!first) m.add(",");
    first = false;
    m.add_uint(i, 10);
    if (j > i) {
      m.add("-");
      m.add_uint(j, 10);
    }
    i = j + 1;
  }
}

[[gnu::cold, gnu::noinline]] void unsupported_layout(ctl::Header& h, std::uint32_t version) noexcept {
  h.kernels_unsupported.fetch_add(1, std::memory_order_relaxed);
  const bool warn = g_warn_unsupported.load(std::memory_order_relaxed);
  if (warn) h.kernels_unmasked.fetch_add(1, std::memory_order_relaxed);
  Msg m = prefix(warn ? "warning: " : "error: ");
  m.add("unknown TMD layout (QMD version byte 0x");
  m.add_uint(version, 16);
  m.add(warn ? "): kernels run unpartitioned (NVTASKSET_ON_UNSUPPORTED=warn)\n"
             : "): cannot apply the TPC partition; aborting (NVTASKSET_ON_UNSUPPORTED=warn runs unpartitioned)\n");
  say_once(g_unsupported_reported, m);
  // Every thread that meets such a TMD aborts, not just the first: a kernel
  // must not run unmasked while the first one is still writing its message.
  if (!warn) std::abort();
}

// ---- a consistent partition, or the last good one --------------------------
// A reader gives up after seqlock::kReadTries (a corrupt region must not make
// a launch spin). It then applies the last partition this process read
// consistently from that entry, which the callback remembers once per
// partition change. The copy is a process-local seqlock whose writer takes
// it with a compare-exchange only when the entry's generation moved (not on
// every launch: see bump()), and skips when another thread holds it.
struct LastGood {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> generation;  // the entry generation + 1 it holds; 0 = none yet
  std::atomic<std::uint64_t> words[6];
};
constinit LastGood g_last_good[ctl::kMaxDevices]{};

void remember(unsigned slot, std::uint64_t generation, const ctl::LaunchView& v) noexcept {
  LastGood& g = g_last_good[slot];
  if (g.generation.load(std::memory_order_relaxed) == generation + 1) return;
  std::uint64_t s = g.seq.load(std::memory_order_relaxed);
  if ((s & 1) || !g.seq.compare_exchange_strong(s, s + 1, std::memory_order_acquire)) return;
  const std::uint64_t w[6] = {v.enabled_lo, v.enabled_hi, v.max_cluster, v.widened_lo, v.widened_hi,
                              v.widened_max_cluster};
  for (int i = 0; i < 6; ++i) g.words[i].store(w[i], std::memory_order_relaxed);
  g.generation.store(generation + 1, std::memory_order_relaxed);
  g.seq.store(s + 2, std::memory_order_release);
}

bool recall(unsigned slot, ctl::LaunchView& v) noexcept;

// With the whole header corrupt, the slot is unknown too: the last good
// partition stands only when this process ever read exactly one.
bool recall_only(ctl::LaunchView& v) noexcept {
  int found = -1;
  for (unsigned i = 0; i < ctl::kMaxDevices; ++i)
    if (g_last_good[i].generation.load(std::memory_order_relaxed) != 0) {
      if (found >= 0) return false;
      found = static_cast<int>(i);
    }
  return found >= 0 && recall(static_cast<unsigned>(found), v);
}

bool recall(unsigned slot, ctl::LaunchView& v) noexcept {
  const LastGood& g = g_last_good[slot];
  bool have = false;
  std::uint64_t w[6];
  const bool ok = seqlock::read(g.seq, [&]() noexcept {
    have = g.generation.load(std::memory_order_relaxed) != 0;
    for (int i = 0; i < 6; ++i) w[i] = g.words[i].load(std::memory_order_relaxed);
  });
  if (!ok) return false;
  v = {w[0], w[1], w[2], w[3], w[4], w[5]};
  return have;
}

// ---- thread-block clusters ----------------------------------------------------
// A kernel with clusters of C blocks needs C SMs of ONE GPC inside its
// partition, or it never runs: the launch is accepted and the process hangs
// in its next synchronize; under MPS, killing it then wedged the server for
// every client (docs/hardware.md). The CLI stores the largest cluster each
// partition hosts; a launch that does not fit is stopped here, before its
// TMD reaches the GPU, or (widen) moved to the partition's whole GPCs.

void note_cluster(ctl::Header& h, std::uint32_t blocks) noexcept {
  bump(h.cluster_launches[blocks < ctl::kClusterSlots ? blocks : ctl::kClusterSlots - 1]);
  if (blocks > h.max_cluster_launched.load(std::memory_order_relaxed))
    h.max_cluster_launched.store(blocks, std::memory_order_relaxed);
}

// Returns the enable mask to write (the widened one), or stops the process.
// `e` is null when the header is corrupt (the last good partition applies):
// the message then names the physical bits.
[[gnu::cold, gnu::noinline]] Bits128 cluster_misfit(ctl::Header& h, const ctl::DeviceEntry* e,
                                                    const ctl::LaunchView& v, std::uint32_t blocks) noexcept {
  bump(h.cluster_misfits);
  std::uint64_t tlo = 0, thi = 0;
  if (e != nullptr) {
    const ctl::MaskBuffer& b = e->buffer[e->generation.load(std::memory_order_acquire) & 1];
    tlo = b.tpcs[0].load(std::memory_order_relaxed);
    thi = b.tpcs[1].load(std::memory_order_relaxed);
  }
  const bool widen = g_widen_clusters.load(std::memory_order_relaxed);
  const bool widened_fits = (v.widened_lo | v.widened_hi) != 0 && v.widened_max_cluster >= blocks;
  Msg m = prefix(widen && widened_fits ? "warning: " : "");
  m.add("kernel with clusters of ");
  m.add_uint(blocks, 10);
  m.add(widen && widened_fits ? " does not fit " : " cannot run on ");
  if ((tlo | thi) != 0) {
    m.add("TPCs ");
    add_list(m, tlo, thi);
  } else {
    m.add("physical mask bits ");
    add_list(m, v.enabled_lo, v.enabled_hi);
  }
  m.add(" (at most ");
  m.add_uint(v.max_cluster, 10);
  m.add(" SMs of one GPC)");
  if (widen && widened_fits) {
    m.add("; running such kernels on the partition's whole GPCs (NVTASKSET_ON_CLUSTER_MISFIT=widen)\n");
    say_once(g_widen_reported, m);
    bump(h.clusters_widened);
    return Bits128{v.widened_lo, v.widened_hi};
  }
  if (widen) {
    m.add(", nor on its whole GPCs (at most ");
    m.add_uint(v.widened_max_cluster, 10);
    m.add(")");
  }
  m.add("; stopping\n");
  [[maybe_unused]] const ssize_t r = ::write(2, m.buf, m.n);
  std::abort();
}

// A header whose magic is gone: the last good partition, said once and
// counted; false (and counted as unmasked) when there is none to fall back on.
[[gnu::cold, gnu::noinline]] bool corrupt_header(ctl::Header& h, ctl::LaunchView& view) noexcept {
  if (recall_only(view)) {
    bump(h.stale_reads);
    Msg m = prefix("warning: ");
    m.add("the control region is corrupt; using the last partition read\n");
    say_once(g_corrupt_reported, m);
    return true;
  }
  bump(h.kernels_unmasked);
  Msg m = prefix("warning: ");
  m.add("the control region is corrupt and no partition was read before; kernels run on all TPCs\n");
  say_once(g_unmasked_reported, m);
  return false;
}

// For an unpartitioned launch: its cluster size, if it has clusters.
inline void note_clusters_only(ctl::Header& h, const void* t) noexcept {
  const tmd::VersionBytes v = tmd::read_version(t);
  const tmd::Layout layout = tmd::detect(v);
  if (layout != tmd::Layout::kV04 && layout != tmd::Layout::kV05) return;  // no clusters before Hopper
  const std::uint32_t blocks = tmd::cluster_blocks(t, layout, v);
  if (blocks != 0 && blocks != tmd::kClusterShapeUnknown) [[unlikely]]
    note_cluster(h, blocks);
}

}  // namespace

void on_launch(void* /*userdata*/, int domain, int cbid, const void* params) noexcept {
  void* t = hook::tmd_of(domain, cbid, params);
  if (t == nullptr) return;
  graphs::note_tmd_built();
  ctl::Header* h = g_header.load(std::memory_order_acquire);
  if (h == nullptr) return;
  bump(h->kernels_launched);
  ctl::LaunchView view;
  const ctl::DeviceEntry* e = nullptr;
  if (h->magic.load(std::memory_order_relaxed) != ctl::kMagic) [[unlikely]] {
    // Overwritten by someone (only the task's own user can): nothing in it
    // can be trusted, not even which entry is ours.
    if (!corrupt_header(*h, view)) return;
  } else {
    e = select_entry(*h);
    if (e == nullptr) {
      note_clusters_only(*h, t);  // no partition for this GPU (see below)
      return;
    }
  }
  const auto slot = e ? static_cast<unsigned>(e - h->devices) : 0;
  switch (e ? ctl::read_launch_view(*e, view) : ctl::ReadResult::kOk) {
    case ctl::ReadResult::kNone:
      // Unpartitioned (system-wide mode): still note its clusters, so that a
      // later -p refuses a partition that could not host them.
      note_clusters_only(*h, t);
      return;
    case ctl::ReadResult::kOk:
      // The CLI never writes a partition without a TPC; such a mask hangs
      // every kernel, so it can only be corruption.
      if ((view.enabled_lo | view.enabled_hi) != 0) [[likely]] {
        if (e) remember(slot, e->generation.load(std::memory_order_relaxed), view);
        break;
      }
      [[fallthrough]];
    case ctl::ReadResult::kInconsistent:
      if (!(e ? recall(slot, view) : recall_only(view))) {
        bump(h->kernels_unmasked);
        Msg m = prefix("warning: ");
        m.add("the control region holds no readable partition; kernels run on all TPCs\n");
        say_once(g_unmasked_reported, m);
        return;
      }
      bump(h->stale_reads);
      {
        Msg m = prefix("warning: ");
        m.add("the control region cannot be read consistently; using the last partition read\n");
        say_once(g_stale_reported, m);
      }
      break;
  }
  const tmd::VersionBytes v = tmd::read_version(t);
  const tmd::Layout layout = tmd::detect(v);
  const std::uint32_t version = tmd::version_byte(v);
  h->last_tmd_version.store(version, std::memory_order_relaxed);
  if (layout == tmd::Layout::kUnknown) {
    unsupported_layout(*h, version);
    return;
  }
  Bits128 enabled{view.enabled_lo, view.enabled_hi};
  const std::uint32_t blocks = tmd::cluster_blocks(t, layout, v);
  // A role widens a latency-critical kernel to its burst set, or keeps a
  // best-effort one on its floor (role_masks.cpp): a flag and a seqlocked copy.
  if (e) roles_shim::adjust(slot, enabled, blocks);
  if (blocks != 0 && blocks != tmd::kClusterShapeUnknown) [[unlikely]] {
    note_cluster(*h, blocks);
    if (view.max_cluster != kClusterUnchecked && blocks > view.max_cluster)
      enabled = cluster_misfit(*h, e, view, blocks);
  }
  // The TMD takes the complement: a set bit disables a TPC (docs/hardware.md).
  tmd::write_disable_mask(t, layout, ~enabled);
  bump(h->kernels_masked);
}

void set_device_lookup(CtxGetDeviceFn ctx_get_device, DeviceGetUuidFn get_uuid) noexcept {
  g_ctx_get_device.store(ctx_get_device, std::memory_order_release);
  g_device_get_uuid.store(get_uuid, std::memory_order_release);
}

DeviceGetUuidFn device_get_uuid() noexcept { return g_device_get_uuid.load(std::memory_order_acquire); }

}  // namespace nvtaskset::launch
