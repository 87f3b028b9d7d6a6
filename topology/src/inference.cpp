// SPDX-License-Identifier: Apache-2.0
// Calibration, the pure half: from what the calibration kernels observed
// (which SMs vanished per disabled mask bit, which SMs shared clusters) to a
// Topology. No GPU here; tests/unit/test_topology_calibration.cpp feeds it
// observations. The GPU half, which makes the observations, is calibration.cpp.
#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "calibration_util.hpp"
#include "nvtaskset/calibration.hpp"

namespace nvtaskset::topo {

using detail::fail;
using detail::is_tpc_pair;
using detail::sm_list;
using detail::sorted_unique;

namespace {

struct UnionFind {
  std::vector<unsigned> parent;
  explicit UnionFind(unsigned n) : parent(n) { std::iota(parent.begin(), parent.end(), 0u); }
  unsigned find(unsigned x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  void unite(unsigned a, unsigned b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
};

}  // namespace

Topology topology_from_observations(const CalibrationObservations& obs) {
  const DeviceInfo& d = obs.device;
  if (d.sm_count == 0 || d.sm_count % 2 != 0)
    fail(fmt::format("calibration of device {}: {} SMs is not a positive even number", d.ordinal, d.sm_count));
  const unsigned n = d.tpc_count();
  if (n > Bits128::kSize) fail(fmt::format("calibration of device {}: {} TPCs do not fit a 128-bit mask", d.ordinal, n));
  const std::string who = fmt::format("calibration of device {}", d.ordinal);

  Topology t;
  t.device = d;
  t.source = "calibration";
  t.tpcs.resize(n);
  for (unsigned k = 0; k < n; ++k) t.tpcs[k].id = LogicalTpcId{k};

  // Bits: each must hide nothing, or exactly the SM pair of one TPC.
  std::vector<int> bit_of(n, -1);
  std::set<unsigned> seen_bits;
  for (const BitObservation& b : obs.bits) {
    if (b.bit.value >= Bits128::kSize) fail(fmt::format("{}: mask bit {} is beyond the 128-bit TMD mask", who, b.bit.value));
    if (!seen_bits.insert(b.bit.value).second) fail(fmt::format("{}: mask bit {} was observed twice", who, b.bit.value));
    const std::vector<unsigned> v = sorted_unique(b.vanished);
    for (unsigned sm : v)
      if (sm >= d.sm_count)
        fail(fmt::format("{}: disabling mask bit {} hid SM {}, but the device has SMs 0-{}", who, b.bit.value, sm,
                         d.sm_count - 1));
    if (v.empty()) continue;
    if (!is_tpc_pair(v))
      fail(fmt::format("{}: disabling mask bit {} hid {} (expected no SM, or both SMs of one TPC) in {} launch{}", who,
                       b.bit.value, sm_list(v), b.launches, b.launches == 1 ? "" : "es"));
    const unsigned k = v[0] / 2;
    if (bit_of[k] >= 0)
      fail(fmt::format("{}: logical TPC {} (SMs {}-{}) is controlled by both mask bit {} and mask bit {}", who, k, 2 * k,
                       2 * k + 1, bit_of[k], b.bit.value));
    bit_of[k] = static_cast<int>(b.bit.value);
  }
  std::vector<unsigned> orphans;
  for (unsigned k = 0; k < n; ++k) {
    if (bit_of[k] < 0)
      orphans.push_back(k);
    else
      t.tpcs[k].bit = PhysicalTpcBit{static_cast<unsigned>(bit_of[k])};
  }
  if (!orphans.empty())
    fail(fmt::format("{}: logical TPC{} {} {} controlled by no mask bit among the {} probed", who,
                     orphans.size() == 1 ? "" : "s", format_ranges(orphans), orphans.size() == 1 ? "is" : "are",
                     obs.probed_bits ? obs.probed_bits : static_cast<unsigned>(obs.bits.size())));

  // GPCs: SMs that shared a cluster share a GPC; a TPC's two SMs always do.
  if (!obs.clusters_probed) {
    t.gpc_note = d.has_clusters() ? "GPCs were not probed" : "GPUs before Hopper have no thread-block clusters to find GPCs with";
    validate(t);
    return t;
  }
  UnionFind uf(n);
  std::vector<bool> capable(n, false);
  for (const ClusterObservation& run : obs.cluster_runs) {
    if (run.cluster_size == 0) fail(fmt::format("{}: a cluster launch of size 0", who));
    for (const auto& cluster : run.clusters) {
      if (cluster.size() != run.cluster_size)
        fail(fmt::format("{}: a cluster of size {} recorded {} block{}", who, run.cluster_size, cluster.size(),
                         cluster.size() == 1 ? "" : "s"));
      const unsigned first = cluster.front().value / 2;
      for (SmId sm : cluster) {
        if (sm.value >= d.sm_count)
          fail(fmt::format("{}: a cluster block ran on SM {}, but the device has SMs 0-{}", who, sm.value,
                           d.sm_count - 1));
        const unsigned k = sm.value / 2;
        if (k >= n) continue;
        capable[k] = true;
        uf.unite(first, k);
      }
    }
  }
  // A TPC whose SMs only ever shared clusters with each other (size 2 fits
  // in one TPC) tells nothing about its GPC: it gets no GPC rather than a
  // made-up one-TPC GPC. Seen on an H200: four such TPCs next to 8 real
  // GPCs (docs/verification.md); docs/hardware.md: report them honestly.
  std::map<unsigned, unsigned> group_size;
  for (unsigned k = 0; k < n; ++k)
    if (capable[k]) ++group_size[uf.find(k)];
  std::vector<unsigned> lone;
  // Number the groups in order of their lowest logical TPC; the union-find
  // keeps the lowest member as the root, so roots ascend with that order.
  std::map<unsigned, unsigned> gpc_of_root;
  for (unsigned k = 0; k < n; ++k) {
    if (!capable[k]) continue;
    if (group_size[uf.find(k)] < 2) {
      lone.push_back(k);
      continue;
    }
    gpc_of_root.emplace(uf.find(k), static_cast<unsigned>(gpc_of_root.size()));
  }
  if (gpc_of_root.empty()) {
    std::string refused;
    if (!obs.refused_cluster_sizes.empty()) {
      std::vector<unsigned> r = obs.refused_cluster_sizes;
      refused = fmt::format(" (the device refused cluster sizes {})", format_ranges(r));
    }
    t.gpc_note = "no thread-block cluster ran during calibration" + refused;
    validate(t);
    return t;
  }
  t.gpcs.resize(gpc_of_root.size());
  for (unsigned g = 0; g < t.gpcs.size(); ++g) t.gpcs[g].id = GpcId{g};
  std::vector<unsigned> unplaced;
  for (unsigned k = 0; k < n; ++k) {
    if (!capable[k]) {
      unplaced.push_back(k);
      continue;
    }
    if (group_size[uf.find(k)] < 2) {
      t.tpcs[k].cluster_capable = true;  // it ran clusters of its own two SMs
      continue;
    }
    const unsigned g = gpc_of_root.at(uf.find(k));
    t.tpcs[k].gpc = GpcId{g};
    t.tpcs[k].cluster_capable = true;
    t.gpcs[g].tpcs.push_back(LogicalTpcId{k});
  }
  for (const ClusterObservation& run : obs.cluster_runs)
    for (const auto& cluster : run.clusters) {
      const auto it = gpc_of_root.find(uf.find(cluster.front().value / 2));
      if (it == gpc_of_root.end()) continue;  // a lone TPC's cluster
      const unsigned g = it->second;
      t.gpcs[g].max_cluster = std::max(t.gpcs[g].max_cluster, run.cluster_size);
    }
  std::vector<std::string> notes;
  if (!unplaced.empty())
    notes.push_back(fmt::format("TPC{} {} never hosted a thread-block-cluster block, so {} GPC is unknown",
                                unplaced.size() == 1 ? "" : "s", format_ranges(unplaced),
                                unplaced.size() == 1 ? "its" : "their"));
  if (!lone.empty())
    notes.push_back(fmt::format("TPC{} {} never shared a thread-block cluster with another TPC, so {} GPC is unknown",
                                lone.size() == 1 ? "" : "s", format_ranges(lone), lone.size() == 1 ? "its" : "their"));
  for (const auto& note : notes) t.gpc_note += (t.gpc_note.empty() ? "" : "; ") + note;
  validate(t);
  return t;
}

}  // namespace nvtaskset::topo
