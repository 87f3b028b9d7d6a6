// SPDX-License-Identifier: Apache-2.0
// What the launch callback applies for a role (adjust), from one seqlocked
// mask per region slot that the controller (latency-critical) or the
// refresh (best-effort) writes. adjust() is on the launch path: lock-free,
// allocation-free, no system call, no logging.
#include <sys/stat.h>

#include <cstring>
#include <exception>

#include "lc_controller.hpp"
#include "nvtaskset/best_effort_policy.hpp"
#include "nvtaskset/seqlock.hpp"
#include "nvtaskset/status.hpp"
#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

namespace {

struct SlotMask {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> lo, hi, xlo, xhi;
  std::atomic<std::uint32_t> valid;
  std::atomic<std::uint64_t> for_lo, for_hi;
  std::atomic<std::uint32_t> soft_cluster, hard_cluster;
};
constinit SlotMask g_mask[ctl::kMaxDevices]{};

}  // namespace

std::atomic<int> g_floor_users{0};

void store_mask(unsigned slot, const SlotView& v, bool valid) noexcept {
  SlotMask& s = g_mask[slot];
  const std::uint64_t q = s.seq.load(std::memory_order_relaxed);
  s.seq.store(q | 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.lo.store(v.m.lo, std::memory_order_relaxed);
  s.hi.store(v.m.hi, std::memory_order_relaxed);
  s.xlo.store(v.x.lo, std::memory_order_relaxed);
  s.xhi.store(v.x.hi, std::memory_order_relaxed);
  s.valid.store(valid ? 1 : 0, std::memory_order_relaxed);
  s.for_lo.store(v.partition.lo, std::memory_order_relaxed);
  s.for_hi.store(v.partition.hi, std::memory_order_relaxed);
  s.soft_cluster.store(v.soft_cluster, std::memory_order_relaxed);
  s.hard_cluster.store(v.hard_cluster, std::memory_order_relaxed);
  s.seq.store((q | 1) + 1, std::memory_order_release);
}

bool load_mask(unsigned slot, SlotView& v) noexcept {
  const SlotMask& s = g_mask[slot];
  bool valid = false;
  SlotView t;
  if (!seqlock::read(s.seq, [&]() noexcept {
        t.m = {s.lo.load(std::memory_order_relaxed), s.hi.load(std::memory_order_relaxed)};
        t.x = {s.xlo.load(std::memory_order_relaxed), s.xhi.load(std::memory_order_relaxed)};
        valid = s.valid.load(std::memory_order_relaxed) == 1;
        t.partition = {s.for_lo.load(std::memory_order_relaxed), s.for_hi.load(std::memory_order_relaxed)};
        t.soft_cluster = s.soft_cluster.load(std::memory_order_relaxed);
        t.hard_cluster = s.hard_cluster.load(std::memory_order_relaxed);
      }))
    return false;
  v = t;
  return valid;
}

std::vector<SlotPartition> region_slots() {
  std::vector<SlotPartition> out;
  const ctl::Header* h = header();
  if (h == nullptr) return out;
  for (unsigned i = 0; i < ctl::kMaxDevices; ++i) {
    const ctl::DeviceEntry& e = h->devices[i];
    if (e.in_use.load(std::memory_order_acquire) != 1) continue;
    try {
      const Partition p = ctl::read_partition(e);
      if (!p.active()) continue;
      DeviceUuid u;
      std::memcpy(u.data(), e.uuid, 16);
      out.push_back({i, u, p.enabled.bits});
    } catch (const std::exception&) {
    }
  }
  return out;
}

std::int64_t dir_stamp() noexcept {
  struct stat st {};
  if (::stat(ctl::status_dir().c_str(), &st) != 0) return 0;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

void adjust(unsigned slot, Bits128& enabled, std::uint32_t cluster_blocks) noexcept {
  if (slot >= ctl::kMaxDevices) return;
  switch (static_cast<Role>(g_role.load(std::memory_order_relaxed))) {
    case Role::kLatencyCritical: {
      // Bursting: its burst set. Saturated: its reservation and its top-up.
      // In a reference probe: its reservation alone.
      const roles::Beacon* b = g_lc.beacon.load(std::memory_order_acquire);
      if (b == nullptr || b->probing.load(std::memory_order_acquire) == 1) return;
      SlotView v;
      if (!load_mask(slot, v)) return;
      enabled = enabled | (b->may_burst.load(std::memory_order_relaxed) == 1 ? v.m : v.x);
      return;
    }
    case Role::kBestEffort: {
      if (g_floor_users.load(std::memory_order_acquire) == 0) return;
      SlotView v;
      if (!load_mask(slot, v)) return;
      // The floor: the partition without the LC reservations and, where it
      // hosts this kernel's clusters, without their top-ups too. A kernel
      // with clusters goes on a floor only where it hosts them (a misfit
      // would wait for ever, docs/hardware.md): bf16 cuBLAS matmuls launch
      // clusters of 2 and 4 on an H100, so most of a training step's time
      // is clustered kernels. A top-up never takes a BE kernel's clusters
      // from it: such a kernel runs beside the top-up, off the
      // reservations. The limits count only for the partition they were
      // worked out for (a -p since: not known).
      const Bits128 hard = roles::floor_of(enabled, v.m);
      const Bits128 soft = roles::floor_of(hard, v.x);
      auto fits = [&](std::uint32_t most) {
        return cluster_blocks <= 1 || (most != 0 && v.partition == enabled && cluster_blocks <= most);
      };
      if (soft.any() && fits(v.soft_cluster)) enabled = soft;
      else if (hard.any() && fits(v.hard_cluster)) enabled = hard;
      else if (ctl::Header* h = header()) bump(h->floor_skipped);
      return;
    }
    case Role::kNone: return;
  }
}

}  // namespace nvtaskset::roles_shim
