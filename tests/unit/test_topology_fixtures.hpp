// SPDX-License-Identifier: Apache-2.0
// Synthetic GPUs for the topology tests.
//
// HwModel is "the hardware": which mask bit controls each logical TPC, which
// hardware GPC holds it, and whether it can host cluster blocks. The H200-like
// model follows docs/hardware.md: 66 TPCs (132 SMs) in 8 GPCs of 8, 16 or 18 SMs,
// logical TPCs striped across GPCs (SMs 2-3 are not in SMs 0-1's GPC), mask
// bits that are physical slots (12 per GPC, 0..95) with floorswept holes, not
// monotone in the logical TPC, many above 63; and a few TPCs that never host
// a cluster block.
#pragma once

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo::testing {

struct HwModel {
  DeviceInfo dev;
  std::vector<unsigned> bit_of_tpc;  // index = logical TPC
  std::vector<unsigned> hw_gpc_of_tpc;
  std::vector<bool> cluster_capable;
  unsigned hw_gpcs = 0;
};

inline DeviceUuid make_uuid(unsigned char seed) {
  DeviceUuid u{};
  for (unsigned i = 0; i < 16; ++i) u[i] = static_cast<unsigned char>(seed * 17 + i * 13 + 1);
  return u;
}

inline DeviceInfo h200_device(unsigned ordinal = 0) {
  DeviceInfo d;
  d.ordinal = ordinal;
  d.name = "NVIDIA H200";
  d.uuid = make_uuid(static_cast<unsigned char>(0x20 + ordinal));
  d.pci_bus_id = ordinal == 0 ? "0000:3b:00.0" : "0000:5c:00.0";
  d.cc_major = 9;
  d.cc_minor = 0;
  d.sm_count = 132;
  d.driver_version = 13000;
  d.driver_release = "580.159.04";
  return d;
}

inline DeviceInfo a100_device(unsigned ordinal = 0) {
  DeviceInfo d;
  d.ordinal = ordinal;
  d.name = "NVIDIA A100-SXM4-40GB";
  d.uuid = make_uuid(static_cast<unsigned char>(0x80 + ordinal));
  d.pci_bus_id = "0000:07:00.0";
  d.cc_major = 8;
  d.cc_minor = 0;
  d.sm_count = 108;
  d.driver_version = 12040;
  d.driver_release = "550.54.15";
  return d;
}

// 8 GPCs holding 9, 9, 8, 9, 4, 9, 9, 9 TPCs (18, 18, 16, 18, 8, 18, 18, 18
// SMs) = 66 TPCs.
inline HwModel h200_model(unsigned ordinal = 0) {
  HwModel m;
  m.dev = h200_device(ordinal);
  m.hw_gpcs = 8;
  const unsigned sizes[8] = {9, 9, 8, 9, 4, 9, 9, 9};
  const unsigned n = 66;
  // Stripe logical TPCs across GPCs, skipping full ones.
  unsigned filled[8] = {};
  m.hw_gpc_of_tpc.resize(n);
  unsigned g = 0;
  for (unsigned k = 0; k < n; ++k) {
    while (filled[g % 8] >= sizes[g % 8]) ++g;
    m.hw_gpc_of_tpc[k] = g % 8;
    ++filled[g % 8];
    ++g;
  }
  // Physical slots: GPC g owns bits 12g..12g+11. Its working slots skip a
  // few (floorswept) and are handed to its logical TPCs in a scrambled order.
  m.bit_of_tpc.resize(n);
  for (unsigned gpc = 0; gpc < 8; ++gpc) {
    std::vector<unsigned> slots;
    for (unsigned s = 0; s < 12 && slots.size() < sizes[gpc]; ++s) {
      // Holes: slot 1 in even GPCs, slot 4 in GPCs 1 and 5, slot 0 in GPC 3.
      if ((gpc % 2 == 0 && s == 1) || ((gpc == 1 || gpc == 5) && s == 4) || (gpc == 3 && s == 0)) continue;
      slots.push_back(12 * gpc + s);
    }
    std::vector<unsigned> members;
    for (unsigned k = 0; k < n; ++k)
      if (m.hw_gpc_of_tpc[k] == gpc) members.push_back(k);
    // Scramble: reverse, then rotate by the GPC index.
    std::reverse(slots.begin(), slots.end());
    std::rotate(slots.begin(), slots.begin() + (gpc % slots.size()), slots.end());
    for (unsigned i = 0; i < members.size(); ++i) m.bit_of_tpc[members[i]] = slots[i];
  }
  // One TPC in each 9-TPC GPC never hosts a cluster block, leaving 16 SMs
  // there for clusters. Logical TPC 0 is one of them, so GPC numbering (by
  // lowest placed TPC) does not simply follow the hardware's.
  m.cluster_capable.assign(n, true);
  for (unsigned gpc = 0; gpc < 8; ++gpc) {
    if (sizes[gpc] != 9) continue;
    std::vector<unsigned> members;
    for (unsigned k = 0; k < n; ++k)
      if (m.hw_gpc_of_tpc[k] == gpc) members.push_back(k);
    m.cluster_capable[members[(gpc * 4) % members.size()]] = false;
  }
  return m;
}

// Pre-Hopper: identity bits, GPCs of 7 and 8 TPCs striped.
inline HwModel a100_model() {
  HwModel m;
  m.dev = a100_device();
  const unsigned n = m.dev.tpc_count();
  m.hw_gpcs = 7;
  for (unsigned k = 0; k < n; ++k) {
    m.bit_of_tpc.push_back(k);
    m.hw_gpc_of_tpc.push_back(k % 7);
    m.cluster_capable.push_back(false);
  }
  return m;
}

// The largest power-of-two cluster size (2..16) that fits `sms` SMs.
inline unsigned largest_cluster(unsigned sms) {
  unsigned best = 0;
  for (unsigned c : {2u, 4u, 8u, 16u})
    if (c <= sms) best = c;
  return best;
}

// What a correct calibration of `m` must produce: bits as modelled, GPCs =
// hardware GPCs restricted to cluster-capable TPCs, numbered by their lowest
// logical TPC, max cluster from their capable SMs.
inline Topology expected_topology(const HwModel& m) {
  Topology t;
  t.device = m.dev;
  t.source = "calibration";
  const unsigned n = m.dev.tpc_count();
  std::map<unsigned, unsigned> gpc_id;  // hw GPC -> numbered GPC
  for (unsigned k = 0; k < n; ++k)
    if (m.cluster_capable[k] && !gpc_id.count(m.hw_gpc_of_tpc[k]))
      gpc_id.emplace(m.hw_gpc_of_tpc[k], static_cast<unsigned>(gpc_id.size()));
  t.gpcs.resize(gpc_id.size());
  for (unsigned g = 0; g < t.gpcs.size(); ++g) t.gpcs[g].id = GpcId{g};
  for (unsigned k = 0; k < n; ++k) {
    TpcInfo ti;
    ti.id = LogicalTpcId{k};
    ti.bit = PhysicalTpcBit{m.bit_of_tpc[k]};
    if (m.cluster_capable[k]) {
      const unsigned g = gpc_id.at(m.hw_gpc_of_tpc[k]);
      ti.gpc = GpcId{g};
      ti.cluster_capable = true;
      t.gpcs[g].tpcs.push_back(LogicalTpcId{k});
    }
    t.tpcs.push_back(ti);
  }
  for (auto& g : t.gpcs) g.max_cluster = largest_cluster(2 * static_cast<unsigned>(g.tpcs.size()));
  return t;
}

inline Topology h200_topology(unsigned ordinal = 0) { return expected_topology(h200_model(ordinal)); }

inline LogicalTpcSet tpc_set(std::initializer_list<unsigned> ids) {
  LogicalTpcSet s;
  for (unsigned i : ids) s.insert(LogicalTpcId{i});
  return s;
}

inline GpcSet gpc_set(std::initializer_list<unsigned> ids) {
  GpcSet s;
  for (unsigned i : ids) s.insert(GpcId{i});
  return s;
}

inline std::vector<unsigned> ids_of(const LogicalTpcSet& s) { return s.bits.indices(); }

// The message of the std::runtime_error `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace nvtaskset::topo::testing
