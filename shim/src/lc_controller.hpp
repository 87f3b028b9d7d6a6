// SPDX-License-Identifier: Apache-2.0
// The latency-critical task's part of the shim: its beacon, and the
// controller thread that marks it busy, decides whether it may burst
// (roles::BurstBudget), sizes its top-up (roles::TopUp) and publishes its
// burst set to the launch callback (role_masks.cpp).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "nvtaskset/beacon.hpp"
#include "nvtaskset/burst_budget.hpp"
#include "nvtaskset/topup.hpp"
#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

constexpr unsigned kRing = 64;
// A slot's sequence with this bit: the launch was in a context without the
// ring's events; it is not waited for.
constexpr std::uint64_t kNoEvent = 1ull << 63;

// The controller's state, shared with the launching threads.
struct LcController {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  roles::BeaconFile* file = nullptr;  // leaked: threads may read it until exit
  std::atomic<roles::Beacon*> beacon{nullptr};
  std::atomic<std::uint64_t> launches{0};
  std::atomic<std::uint32_t> wake{0};
  std::atomic<std::uint32_t> sleeping{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> started{false};
  std::atomic<bool> failed{false};
  CUcontext ctx = nullptr;
  CUevent events[kRing] = {};
  std::atomic<std::uint64_t> slot_seq[kRing] = {};
  // The base of the burst set: every working TPC of each GPU (NVTASKSET_BURST_POOL).
  std::vector<DevicePartition>* pool = nullptr;
  // The top-up (roles::TopUp; nullptr: NVTASKSET_LC_TOPUP=off). While the
  // controller saturates (timing != 0: its generation), each launch records
  // a second event before it, so that the controller can time it.
  roles::TopUp* topup = nullptr;
  std::vector<ClusterMap>* maps = nullptr;  // which TPCs host clusters together (NVTASKSET_CLUSTER_MAP)
  std::uint32_t test_topup = 0;             // NVTASKSET_TEST_TOPUP: a fixed top-up, no probes (tests)
  std::atomic<std::uint64_t> timing{0};
  CUevent starts[kRing] = {};
  std::atomic<std::uint64_t> start_seq[kRing] = {};
  std::atomic<std::uint64_t> start_key[kRing] = {}, start_gen[kRing] = {}, start_ns[kRing] = {};
};
extern LcController g_lc;

// The budgets, unless a test stretches them (NVTASKSET_TEST_BURST_MS).
roles::BudgetParams budget_params(roles::BudgetParams p) noexcept;

// Before a latency-critical launch: the task is busy from now on. While
// the controller saturates, an event before the launch times it. Returns
// the launch's sequence number (0: not counted).
std::uint64_t lc_before(CUstream s, bool per_thread, std::uint64_t key) noexcept;
// After it: an event the controller waits for.
void lc_after(std::uint64_t seq, CUstream s, bool per_thread) noexcept;

}  // namespace nvtaskset::roles_shim
