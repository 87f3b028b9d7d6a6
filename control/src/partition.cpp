// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/partition.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <stdexcept>

#include "nvtaskset/control_region.hpp"

namespace nvtaskset {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Strict "0x..." parser for the machine-written encoding (at most 32 digits).
Bits128 parse_hex128(std::string_view s) {
  if (s.size() < 3 || s[0] != '0' || s[1] != 'x' || s.size() > 34)
    throw std::invalid_argument("bad hex field '" + std::string(s) + "'");
  Bits128 b;
  for (char c : s.substr(2)) {
    const int v = hex_value(c);
    if (v < 0) throw std::invalid_argument("bad hex field '" + std::string(s) + "'");
    b.hi = (b.hi << 4) | (b.lo >> 60);
    b.lo = (b.lo << 4) | static_cast<unsigned>(v);
  }
  return b;
}

std::uint32_t parse_uint(std::string_view s) {
  if (s.empty() || s.size() > 9) throw std::invalid_argument("bad number '" + std::string(s) + "'");
  std::uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') throw std::invalid_argument("bad number '" + std::string(s) + "'");
    v = v * 10 + static_cast<std::uint32_t>(c - '0');
  }
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

}  // namespace

std::string uuid_to_string(const DeviceUuid& u) {
  char buf[48];
  std::snprintf(buf, sizeof buf,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return buf;
}

std::optional<DeviceUuid> uuid_from_string(std::string_view s) {
  if (s.substr(0, 4) == "GPU-") s.remove_prefix(4);
  DeviceUuid u{};
  unsigned nibbles = 0;
  for (char c : s) {
    if (c == '-') continue;
    const int v = hex_value(c);
    if (v < 0 || nibbles >= 32) return std::nullopt;
    u[nibbles / 2] = static_cast<std::uint8_t>(u[nibbles / 2] | (v << (nibbles % 2 ? 0 : 4)));
    ++nibbles;
  }
  if (nibbles != 32) return std::nullopt;
  return u;
}

namespace {

// The device field of the text forms: '*' for any device, else a UUID.
std::string device_field(const DeviceUuid& d) { return d == kAnyDevice ? std::string("*") : uuid_to_string(d); }
DeviceUuid parse_device_field(std::string_view f) {
  if (f == "*") return kAnyDevice;
  const auto u = uuid_from_string(f);
  if (!u) throw std::invalid_argument("bad device '" + std::string(f.substr(0, 80)) + "'");
  return *u;
}

// The ';'-separated entries of a text form, one per device: no more than a
// control region holds (kMaxDevices).
std::vector<std::string_view> device_entries(std::string_view text, const char* what) {
  if (text.empty()) return {};
  std::vector<std::string_view> entries = split(text, ';');
  if (entries.size() > ctl::kMaxDevices)
    throw std::invalid_argument("more than " + std::to_string(ctl::kMaxDevices) + " " + what);
  return entries;
}

}  // namespace

std::string encode_partitions(const std::vector<DevicePartition>& parts) {
  std::string out;
  for (const auto& dp : parts) {
    if (!out.empty()) out += ';';
    out += device_field(dp.device);
    out += ',' + std::to_string(static_cast<unsigned>(dp.partition.kind));
    out += ',' + dp.partition.enabled.bits.to_hex();
    out += ',' + dp.partition.tpcs.bits.to_hex();
    out += ',' + dp.partition.gpcs.bits.to_hex();
    out += ',' + std::to_string(dp.desc.sm_count) + ',' + std::to_string(dp.desc.cc_major) + ',' +
           std::to_string(dp.desc.cc_minor) + ',' + std::to_string(dp.desc.driver_version);
    out += ',' + std::to_string(dp.partition.max_cluster) + ',' + dp.partition.widened.bits.to_hex() + ',' +
           std::to_string(dp.partition.widened_max_cluster);
  }
  return out;
}

std::string partition_problem(const DevicePartition& dp) {
  const Partition& p = dp.partition;
  if (!p.active() || !dp.desc.known()) return "";
  const unsigned tpcs = dp.desc.sm_count / 2;
  const Bits128 real = Bits128::first(tpcs < 128 ? tpcs : 128);
  const std::string gpu = (dp.device == kAnyDevice ? std::string("a GPU") : uuid_to_string(dp.device)) + " with " +
                          std::to_string(tpcs) + " TPCs";
  const bool logical = p.kind == SpecKind::kTpcList || p.kind == SpecKind::kTpcMask || p.kind == SpecKind::kGpcList;
  if (logical && (p.tpcs.bits & ~real).any())
    return "partition names TPCs " + format_ranges(p.tpcs.bits & ~real) + ", which " + gpu + " does not have";
  if (dp.desc.cc_major < 9 && (p.enabled.bits & real).none())
    return "partition mask " + p.enabled.bits.to_hex() + " enables no TPC of " + gpu +
           ": its kernels would never run";
  return "";
}

std::vector<DevicePartition> decode_partitions(std::string_view text) {
  std::vector<DevicePartition> out;
  // The text may come from another user (a status entry): no count or size
  // in it may exceed what a control region holds (control_region.cpp,
  // validate: kMaxDevices entries, at most 256 SMs, cc up to 99.9), or a
  // reader sizes its work by it (one entry claiming 999999998 SMs made
  // every user's --status allocate gigabytes).
  for (std::string_view entry : device_entries(text, "device partitions")) {
    const auto f = split(entry, ',');
    if (f.size() != 12) throw std::invalid_argument("bad partition entry '" + std::string(entry) + "'");
    DevicePartition dp;
    dp.device = parse_device_field(f[0]);
    if (f[1].size() != 1 || f[1][0] < '0' || f[1][0] > '4')
      throw std::invalid_argument("bad partition kind '" + std::string(f[1]) + "'");
    dp.partition.kind = static_cast<SpecKind>(f[1][0] - '0');
    dp.partition.enabled.bits = parse_hex128(f[2]);
    dp.partition.tpcs.bits = parse_hex128(f[3]);
    dp.partition.gpcs.bits = parse_hex128(f[4]);
    dp.desc.sm_count = parse_uint(f[5]);
    dp.desc.cc_major = parse_uint(f[6]);
    dp.desc.cc_minor = parse_uint(f[7]);
    dp.desc.driver_version = static_cast<std::int32_t>(parse_uint(f[8]));
    dp.partition.max_cluster = parse_uint(f[9]);
    dp.partition.widened.bits = parse_hex128(f[10]);
    dp.partition.widened_max_cluster = parse_uint(f[11]);
    constexpr std::uint32_t kMaxSms = 2 * Bits128::kSize;  // a TPC mask names at most 128 TPCs of 2 SMs
    if (dp.desc.sm_count > kMaxSms || dp.desc.sm_count % 2 != 0 || dp.desc.cc_major > 99 || dp.desc.cc_minor > 9)
      throw std::invalid_argument("impossible GPU (" + std::to_string(dp.desc.sm_count) + " SMs, compute capability " +
                                  std::to_string(dp.desc.cc_major) + "." + std::to_string(dp.desc.cc_minor) + ")");
    // A cluster runs on SMs of one GPC, so no more than the GPU has.
    if (dp.partition.max_cluster > kMaxSms || dp.partition.widened_max_cluster > kMaxSms)
      throw std::invalid_argument("impossible cluster size");
    if (dp.partition.active() && dp.partition.enabled.empty())
      throw std::invalid_argument("partition enables no TPC");
    if (const std::string why = partition_problem(dp); !why.empty()) throw std::invalid_argument(why);
    for (const auto& prev : out)
      if (prev.device == dp.device) throw std::invalid_argument("device given twice");
    out.push_back(dp);
  }
  return out;
}

std::uint32_t hostable_cluster(const ClusterMap& m, const Bits128& set) noexcept {
  std::uint32_t best = (set & m.capable.bits).any() ? 2 : 1;
  for (const ClusterMap::Gpc& g : m.gpcs) {
    std::uint32_t sms = 2 * (set & g.capable.bits).count();
    if (g.max_cluster != 0) sms = std::min(sms, g.max_cluster);
    best = std::max(best, sms);
  }
  return best;
}

std::string encode_cluster_maps(const std::vector<ClusterMap>& maps) {
  std::string out;
  for (const ClusterMap& m : maps) {
    if (!out.empty()) out += ';';
    out += device_field(m.device);
    out += ':' + m.capable.bits.to_hex();
    for (const ClusterMap::Gpc& g : m.gpcs) out += ':' + g.capable.bits.to_hex() + '/' + std::to_string(g.max_cluster);
  }
  return out;
}

std::vector<ClusterMap> decode_cluster_maps(std::string_view text) {
  std::vector<ClusterMap> out;
  for (std::string_view entry : device_entries(text, "cluster maps")) {
    const auto f = split(entry, ':');
    if (f.size() < 2 || f.size() > 2 + kMaxMapGpcs)
      throw std::invalid_argument("bad cluster map '" + std::string(entry.substr(0, 80)) + "'");
    ClusterMap m;
    m.device = parse_device_field(f[0]);
    m.capable.bits = parse_hex128(f[1]);
    for (std::size_t i = 2; i < f.size(); ++i) {
      const auto g = split(f[i], '/');
      if (g.size() != 2) throw std::invalid_argument("bad GPC '" + std::string(f[i].substr(0, 80)) + "'");
      ClusterMap::Gpc gpc;
      gpc.capable.bits = parse_hex128(g[0]);
      gpc.max_cluster = parse_uint(g[1]);
      // A GPC's capable TPCs are capable TPCs, and a cluster runs on one
      // GPC's SMs, so no more than a mask's TPCs have.
      if ((gpc.capable.bits & ~m.capable.bits).any() || gpc.max_cluster > 2 * Bits128::kSize)
        throw std::invalid_argument("impossible GPC '" + std::string(f[i].substr(0, 80)) + "'");
      m.gpcs.push_back(gpc);
    }
    for (const ClusterMap& prev : out)
      if (prev.device == m.device) throw std::invalid_argument("device given twice");
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace nvtaskset
