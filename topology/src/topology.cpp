// SPDX-License-Identifier: Apache-2.0
// Topology invariants, translation of logical lists to physical mask bits,
// cluster capability and the text rendering.
#include "nvtaskset/topology.hpp"


#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

namespace nvtaskset::topo {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

std::string tpc_range(const Topology& t) {
  const unsigned n = static_cast<unsigned>(t.tpcs.size());
  return n == 0 ? "none" : fmt::format("TPCs 0-{}", n - 1);
}

std::string gpc_range(const Topology& t) {
  const unsigned n = static_cast<unsigned>(t.gpcs.size());
  return n == 0 ? "none" : fmt::format("GPCs 0-{}", n - 1);
}

std::vector<unsigned> values(const std::vector<LogicalTpcId>& ids) {
  std::vector<unsigned> out;
  out.reserve(ids.size());
  for (auto id : ids) out.push_back(id.value);
  return out;
}

}  // namespace

std::string format_id_list(const std::vector<unsigned>& ids) {
  std::string out;
  for (unsigned v : ids) {
    if (!out.empty()) out += ' ';
    out += std::to_string(v);
  }
  return out;
}


bool Topology::bits_known() const {
  if (tpcs.empty()) return false;
  return std::all_of(tpcs.begin(), tpcs.end(), [](const TpcInfo& t) { return t.bit.has_value(); });
}

PhysicalTpcMask Topology::working_bits() const {
  PhysicalTpcMask m;
  for (const auto& t : tpcs)
    if (t.bit) m.insert(*t.bit);
  return m;
}

unsigned Topology::max_cluster() const {
  unsigned m = 0;
  for (const auto& g : gpcs) m = std::max(m, g.max_cluster);
  return m;
}

std::optional<Topology> identity_topology(const DeviceInfo& dev) {
  // One element per TPC: never more than a mask names, whatever a device
  // description (possibly another user's status entry) claims.
  if (!dev.mask_bits_are_logical() || dev.tpc_count() > Bits128::kSize) return std::nullopt;
  Topology t;
  t.device = dev;
  t.source = "identity";
  // Before Hopper, TMD mask bit k controls logical TPC k (docs/hardware.md); the
  // pre-Hopper TMD mask has 64 bits (V01_06..V03_xx).
  for (unsigned k = 0; k < dev.tpc_count(); ++k) {
    TpcInfo ti;
    ti.id = LogicalTpcId{k};
    if (k < 64) ti.bit = PhysicalTpcBit{k};
    t.tpcs.push_back(ti);
  }
  t.gpc_note = "GPUs before Hopper have no thread-block clusters to find GPCs with; GPC lists need the nvdebug kernel module";
  return t;
}

void validate(const Topology& t) {
  const DeviceInfo& d = t.device;
  if (d.sm_count == 0 || d.sm_count % 2 != 0)
    fail(fmt::format("device.sm_count: {} is not a positive even number (a TPC holds 2 SMs)", d.sm_count));
  if (d.tpc_count() > Bits128::kSize)
    fail(fmt::format("device.sm_count: {} SMs is more than the {} TPCs a mask can name", d.sm_count,
                     Bits128::kSize));
  if (t.tpcs.size() != d.tpc_count())
    fail(fmt::format("tpcs: {} entries, but sm_count {} means {} TPCs", t.tpcs.size(), d.sm_count,
                     d.tpc_count()));
  // The pre-Hopper TMD mask has 64 bits, Hopper's and Blackwell's 128 (tmd.hpp).
  const unsigned bit_limit = d.mask_bits_are_logical() ? 64 : 128;
  std::map<unsigned, unsigned> owner;  // bit -> TPC
  for (unsigned i = 0; i < t.tpcs.size(); ++i) {
    const TpcInfo& ti = t.tpcs[i];
    if (ti.id.value != i) fail(fmt::format("tpcs[{}].tpc: expected {}, got {}", i, i, ti.id.value));
    if (ti.bit) {
      if (ti.bit->value >= bit_limit)
        fail(fmt::format("tpcs[{}].bit: {} is not below {} (the TMD mask width of cc {}.{})", i, ti.bit->value,
                         bit_limit, d.cc_major, d.cc_minor));
      auto [it, fresh] = owner.emplace(ti.bit->value, i);
      if (!fresh) fail(fmt::format("tpcs[{}].bit: bit {} already controls TPC {}", i, ti.bit->value, it->second));
    }
    if (ti.gpc) {
      if (ti.gpc->value >= t.gpcs.size())
        fail(fmt::format("tpcs[{}].gpc: GPC {} is not in gpcs ({})", i, ti.gpc->value, gpc_range(t)));
    }
  }
  std::vector<int> listed(t.tpcs.size(), -1);
  for (unsigned g = 0; g < t.gpcs.size(); ++g) {
    const GpcInfo& gi = t.gpcs[g];
    if (gi.id.value != g) fail(fmt::format("gpcs[{}].gpc: expected {}, got {}", g, g, gi.id.value));
    if (gi.tpcs.empty()) fail(fmt::format("gpcs[{}].tpcs: a GPC needs at least one TPC", g));
    for (std::size_t k = 0; k < gi.tpcs.size(); ++k) {
      const unsigned tpc = gi.tpcs[k].value;
      if (tpc >= t.tpcs.size())
        fail(fmt::format("gpcs[{}].tpcs[{}]: TPC {} does not exist ({})", g, k, tpc, tpc_range(t)));
      if (k > 0 && gi.tpcs[k - 1].value >= tpc)
        fail(fmt::format("gpcs[{}].tpcs[{}]: TPC lists must be ascending without repeats", g, k));
      if (listed[tpc] >= 0) fail(fmt::format("gpcs[{}].tpcs[{}]: TPC {} is already in GPC {}", g, k, tpc, listed[tpc]));
      listed[tpc] = static_cast<int>(g);
      if (!t.tpcs[tpc].gpc || t.tpcs[tpc].gpc->value != g)
        fail(fmt::format("gpcs[{}].tpcs[{}]: TPC {} is listed in GPC {} but tpcs[{}].gpc says {}", g, k, tpc, g,
                         tpc, t.tpcs[tpc].gpc ? std::to_string(t.tpcs[tpc].gpc->value) : "null"));
    }
    if (gi.max_cluster > 64) fail(fmt::format("gpcs[{}].max_cluster: {} is not a cluster size", g, gi.max_cluster));
  }
  for (unsigned i = 0; i < t.tpcs.size(); ++i)
    if (t.tpcs[i].gpc && listed[i] < 0)
      fail(fmt::format("tpcs[{}].gpc: TPC {} says GPC {} but gpcs[{}].tpcs does not list it", i, i,
                       t.tpcs[i].gpc->value, t.tpcs[i].gpc->value));
}

PhysicalTpcMask to_physical(const Topology& t, const LogicalTpcSet& tpcs) {
  const unsigned dev = t.device.ordinal;
  if (tpcs.empty()) fail(fmt::format("empty TPC list: a partition of device {} needs at least one TPC", dev));
  PhysicalTpcMask out;
  std::vector<unsigned> unknown;
  for (LogicalTpcId id : tpcs.ids()) {
    if (id.value >= t.tpcs.size())
      fail(fmt::format("TPC {} does not exist on device {} ({})", id.value, dev, tpc_range(t)));
    const auto& bit = t.tpcs[id.value].bit;
    if (!bit) {
      unknown.push_back(id.value);
      continue;
    }
    out.insert(*bit);
  }
  if (!unknown.empty())
    fail(fmt::format("the mask bit of TPC {} on device {} is unknown (topology from {}); run nvtaskset --calibrate",
                     format_ranges(unknown), dev, t.source.empty() ? "nowhere" : t.source));
  // Every bit above controls a working TPC by construction; check anyway: a
  // mask enabling no working TPC makes every kernel wait forever (docs/hardware.md).
  if ((out.bits & t.working_bits().bits).none())
    fail(fmt::format("TPC list for device {} enables no working TPC", dev));
  return out;
}

LogicalTpcSet tpcs_of_gpcs(const Topology& t, const GpcSet& gpcs) {
  const unsigned dev = t.device.ordinal;
  if (gpcs.empty()) fail(fmt::format("empty GPC list: a partition of device {} needs at least one GPC", dev));
  if (!t.gpcs_known())
    fail(fmt::format("GPC lists need the GPU's GPC layout: device {} has none ({})", dev,
                     t.gpc_note.empty() ? "no source could tell" : t.gpc_note));
  LogicalTpcSet out;
  for (GpcId g : gpcs.ids()) {
    if (g.value >= t.gpcs.size())
      fail(fmt::format("GPC {} does not exist on device {} ({})", g.value, dev, gpc_range(t)));
    for (LogicalTpcId tpc : t.gpcs[g.value].tpcs) out.insert(tpc);
  }
  if (out.empty()) fail(fmt::format("GPC list for device {} names no TPC", dev));
  return out;
}

LogicalTpcSet all_tpcs(const Topology& t) {
  LogicalTpcSet out;
  for (const auto& ti : t.tpcs) out.insert(ti.id);
  return out;
}

LogicalTpcSet logical_of_physical(const Topology& t, const PhysicalTpcMask& m) {
  LogicalTpcSet out;
  for (const auto& ti : t.tpcs)
    if (ti.bit && m.contains(*ti.bit)) out.insert(ti.id);
  return out;
}

ClusterCapability cluster_capability(const Topology& t, const LogicalTpcSet& tpcs) {
  ClusterCapability cap;
  if (!t.device.has_clusters()) return cap;  // no clusters before sm_90: nothing to warn about
  if (!t.gpcs_known()) {
    cap.warning = "cannot tell which thread-block cluster sizes this partition runs: the GPU's GPC layout is unknown";
    return cap;
  }
  cap.known = true;
  cap.gpu_largest = t.max_cluster();
  for (unsigned c : kClusterSizes) {
    // A cluster of 2 fits in one cluster-capable TPC, whatever its GPC.
    bool runs = false;
    if (c == 2)
      for (unsigned k : tpcs.bits.indices())
        if (k < t.tpcs.size() && t.tpcs[k].cluster_capable) runs = true;
    for (const GpcInfo& g : t.gpcs) {
      if (c > g.max_cluster) continue;
      unsigned capable = 0;
      for (LogicalTpcId tpc : g.tpcs)
        if (tpcs.contains(tpc) && t.tpcs[tpc.value].cluster_capable) ++capable;
      // A TPC holds 2 SMs; one cluster block per SM at most counts here.
      if (2 * capable >= c) {
        runs = true;
        break;
      }
    }
    if (runs) cap.sizes.push_back(c);
  }
  cap.largest = cap.sizes.empty() ? 0 : cap.sizes.back();
  if (cap.largest < cap.gpu_largest) {
    cap.warning = cap.largest == 0
                      ? fmt::format("this partition cannot run thread-block clusters (the GPU runs up to {})",
                                    cap.gpu_largest)
                      : fmt::format("this partition cannot run thread-block clusters larger than {} (the GPU runs up to {})",
                                    cap.largest, cap.gpu_largest);
  }
  return cap;
}

std::uint32_t largest_hostable_cluster(const Topology& t, const LogicalTpcSet& tpcs) {
  if (!t.device.has_clusters() || !t.gpcs_known()) return kClusterUnchecked;
  std::uint32_t best = 1;
  for (unsigned k : tpcs.bits.indices())
    if (k < t.tpcs.size() && t.tpcs[k].cluster_capable) best = 2;
  for (const GpcInfo& g : t.gpcs) {
    std::uint32_t capable = 0;
    for (LogicalTpcId tpc : g.tpcs)
      if (tpcs.contains(tpc) && t.tpcs[tpc.value].cluster_capable) ++capable;
    std::uint32_t sms = 2 * capable;
    if (g.max_cluster != 0) sms = std::min<std::uint32_t>(sms, g.max_cluster);
    best = std::max(best, sms);
  }
  return best;
}

LogicalTpcSet gpc_closure(const Topology& t, const LogicalTpcSet& tpcs) {
  LogicalTpcSet out = tpcs;
  for (const GpcInfo& g : t.gpcs) {
    bool touched = false;
    for (LogicalTpcId tpc : g.tpcs) touched = touched || tpcs.contains(tpc);
    if (touched)
      for (LogicalTpcId tpc : g.tpcs) out.insert(tpc);
  }
  return out;
}

ClusterLimits cluster_limits(const Topology& t, const LogicalTpcSet& tpcs) {
  ClusterLimits c;
  c.max_cluster = largest_hostable_cluster(t, tpcs);
  if (c.max_cluster == kClusterUnchecked) return c;
  c.widened = gpc_closure(t, tpcs);
  c.widened_max_cluster = largest_hostable_cluster(t, c.widened);
  return c;
}

std::string render_topology(const std::vector<Topology>& topos) {
  std::string out;
  auto line = [&](const std::string& s) {
    out += s;
    out += '\n';
  };
  line(fmt::format("available: {} GPU{}", topos.size(), topos.size() == 1 ? "" : "s"));
  for (const Topology& t : topos) {
    const DeviceInfo& d = t.device;
    std::string when = t.calibrated_at.empty() ? "" : fmt::format(", calibrated {}", t.calibrated_at);
    line(fmt::format("gpu {}: {}, {}, pci {}, cc {}.{}, {} SMs, {} TPCs (topology: {}{})", d.ordinal, d.name,
                     uuid_to_string(d.uuid), d.pci_bus_id.empty() ? "unknown" : d.pci_bus_id, d.cc_major, d.cc_minor,
                     d.sm_count, d.tpc_count(), t.source.empty() ? "unknown" : t.source, when));
    auto describe = [&](const std::string& label, const std::vector<unsigned>& tpcs) {
      std::vector<unsigned> sms, bits;
      std::vector<std::string> bit_text;
      for (unsigned k : tpcs) {
        sms.push_back(2 * k);
        sms.push_back(2 * k + 1);
        const auto& b = t.tpcs[k].bit;
        bit_text.push_back(b ? std::to_string(b->value) : "?");
      }
      std::string bits_joined;
      for (const auto& s : bit_text) bits_joined += (bits_joined.empty() ? "" : " ") + s;
      line(fmt::format("{} tpcs: {}", label, format_id_list(tpcs)));
      line(fmt::format("{} sms: {}", label, format_id_list(sms)));
      line(fmt::format("{} mask bits: {}", label, bits_joined));
    };
    if (t.gpcs_known()) {
      line(fmt::format("gpu {} gpcs: {}", d.ordinal, t.gpcs.size()));
      for (const GpcInfo& g : t.gpcs) {
        const std::string label = fmt::format("gpc {}", g.id.value);
        describe(label, values(g.tpcs));
        if (d.has_clusters()) {
          line(fmt::format("{} max cluster: {}", label, g.max_cluster));
          std::vector<unsigned> no_cluster;
          for (LogicalTpcId k : g.tpcs)
            if (!t.tpcs[k.value].cluster_capable) no_cluster.push_back(k.value);
          if (!no_cluster.empty()) line(fmt::format("{} tpcs without clusters: {}", label, format_id_list(no_cluster)));
        }
      }
      std::vector<unsigned> unknown;
      for (const TpcInfo& ti : t.tpcs)
        if (!ti.gpc) unknown.push_back(ti.id.value);
      if (!unknown.empty()) describe("gpc unknown", unknown);
    } else {
      line(fmt::format("gpu {} gpcs: unknown ({})", d.ordinal,
                       t.gpc_note.empty() ? "no source could tell" : t.gpc_note));
      std::vector<unsigned> all;
      for (const TpcInfo& ti : t.tpcs) all.push_back(ti.id.value);
      describe(fmt::format("gpu {}", d.ordinal), all);
    }
    if (t.gpcs_known() && !t.gpc_note.empty()) line(fmt::format("gpu {} note: {}", d.ordinal, t.gpc_note));
    for (const auto& w : t.warnings) line(fmt::format("gpu {} warning: {}", d.ordinal, w));
  }
  return out;
}

}  // namespace nvtaskset::topo
