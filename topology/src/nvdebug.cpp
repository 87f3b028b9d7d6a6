// SPDX-License-Identifier: Apache-2.0
// Reading nvdebug's topology registers (see nvdebug.hpp for the files).
#include "nvtaskset/nvdebug.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "nvtaskset/cuda_driver.hpp"

namespace nvtaskset::topo {

namespace fs = std::filesystem;

namespace {

// nvdebug prints registers as hex text, with or without "0x", one per file.
std::uint64_t read_hex_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("nvdebug file {} cannot be read: {}", path, std::strerror(errno)));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto b = text.find_first_not_of(" \t\r\n");
  auto e = text.find_last_not_of(" \t\r\n");
  std::string s = b == std::string::npos ? "" : text.substr(b, e - b + 1);
  std::string digits = s;
  if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) digits = digits.substr(2);
  if (digits.empty() || digits.size() > 16 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
    std::string shown = s.size() > 24 ? s.substr(0, 24) + "..." : s;
    throw std::runtime_error(fmt::format("nvdebug file {}: expected a hex number, got '{}'", path, shown));
  }
  return std::stoull(digits, nullptr, 16);
}

}  // namespace

std::optional<NvdebugLayout> read_nvdebug(const std::string& root, unsigned gpu_index) {
  NvdebugLayout nv;
  nv.dir = (fs::path(root) / fmt::format("gpu{}", gpu_index)).string();
  std::error_code ec;
  if (!fs::is_directory(nv.dir, ec)) return std::nullopt;
  auto file = [&](const std::string& name) { return (fs::path(nv.dir) / name).string(); };

  const std::uint64_t num_gpcs = read_hex_file(file("num_gpcs"));
  // gpc_mask is read as a 64-bit word: no GPU has more GPC slots.
  if (num_gpcs == 0 || num_gpcs > 64)
    throw std::runtime_error(fmt::format("nvdebug file {}: {} GPCs is not plausible", file("num_gpcs"), num_gpcs));
  nv.num_gpcs = static_cast<unsigned>(num_gpcs);
  nv.gpc_mask = read_hex_file(file("gpc_mask"));
  const std::uint64_t per_gpc = read_hex_file(file("num_tpc_per_gpc"));
  if (per_gpc == 0 || per_gpc > 64)
    throw std::runtime_error(
        fmt::format("nvdebug file {}: {} TPCs per GPC is not plausible", file("num_tpc_per_gpc"), per_gpc));
  nv.tpcs_per_gpc = static_cast<unsigned>(per_gpc);

  // Enabled TPCs per enabled physical GPC. Bits of gpc_mask and of
  // gpc<i>_tpc_mask above the slot counts do not name hardware; ignore them.
  const std::uint64_t tpc_slots = nv.tpcs_per_gpc == 64 ? ~0ull : (1ull << nv.tpcs_per_gpc) - 1;
  unsigned total = 0;
  for (unsigned i = 0; i < nv.num_gpcs; ++i) {
    if ((nv.gpc_mask >> i) & 1) continue;  // set bit = GPC disabled
    const std::uint64_t disabled = read_hex_file(file(fmt::format("gpc{}_tpc_mask", i))) & tpc_slots;
    const unsigned enabled = nv.tpcs_per_gpc - static_cast<unsigned>(std::popcount(disabled));
    nv.enabled_tpcs_per_gpc.push_back(enabled);
    total += enabled;
  }
  if (nv.enabled_tpcs_per_gpc.empty())
    throw std::runtime_error(fmt::format("nvdebug {}: gpc_mask {:#x} disables every GPC", nv.dir, nv.gpc_mask));
  if (total == 0 || total > Bits128::kSize)
    throw std::runtime_error(fmt::format("nvdebug {}: the TPC masks enable {} TPCs", nv.dir, total));

  // CWD_GPC_TPC_ID<k>: the upper nibble of byte j is the GPC of logical TPC
  // 4k+j (docs/hardware.md).
  std::uint64_t any = 0, reg = 0;
  for (unsigned t = 0; t < total; ++t) {
    if (t % 4 == 0) {
      reg = read_hex_file(file(fmt::format("CWD_GPC_TPC_ID{}", t / 4)));
      if (reg > 0xffffffffull)
        throw std::runtime_error(fmt::format("nvdebug file {}: {:#x} is wider than a 32-bit register",
                                             file(fmt::format("CWD_GPC_TPC_ID{}", t / 4)), reg));
      any |= reg;
    }
    nv.gpc_of_tpc.push_back(GpcId{static_cast<unsigned>((reg >> (8 * (t % 4) + 4)) & 0xf)});
  }
  const unsigned gpcs = nv.gpc_count();
  // Registers that read all zero put every TPC in GPC 0: the GPU is powered
  // off (libsmctrl draws the same conclusion).
  if (any == 0 && gpcs > 1)
    throw std::runtime_error(
        fmt::format("nvdebug {}: the CWD_GPC_TPC_ID registers read all zero (is the GPU powered on?)", nv.dir));
  std::vector<unsigned> per_logical(gpcs, 0);
  for (unsigned t = 0; t < total; ++t) {
    const unsigned g = nv.gpc_of_tpc[t].value;
    if (g >= gpcs)
      throw std::runtime_error(fmt::format("nvdebug {}: CWD_GPC_TPC_ID{} puts TPC {} in GPC {}, but only {} GPCs are enabled",
                                           nv.dir, t / 4, t, g, gpcs));
    ++per_logical[g];
  }
  // The registers' GPC numbers are logical; the masks are per physical GPC.
  // The two must agree on how many TPCs each GPC holds, numbering aside.
  std::vector<unsigned> a = per_logical, b = nv.enabled_tpcs_per_gpc;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != b) {
    auto show = [](const std::vector<unsigned>& v) {
      std::string s;
      for (unsigned x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
      return s;
    };
    throw std::runtime_error(fmt::format(
        "nvdebug {}: CWD_GPC_TPC_ID registers give GPCs of {} TPCs but the gpc*_tpc_mask files enable {}", nv.dir,
        show(a), show(b)));
  }
  spdlog::debug("nvdebug {}: {} GPC slots (mask {:#x}), {} TPC slots per GPC, {} TPCs in {} GPCs", nv.dir, nv.num_gpcs,
                nv.gpc_mask, nv.tpcs_per_gpc, total, gpcs);
  return nv;
}

std::optional<unsigned> nvdebug_index_of(const std::string& pci_bus_id, const std::string& sysfs_pci_root) {
  auto want = normalize_pci_bus_id(pci_bus_id);
  if (!want) return std::nullopt;
  std::vector<std::string> gpus;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(sysfs_pci_root, ec)) {
    auto read = [&](const char* name) {
      std::ifstream in(e.path() / name);
      std::string s;
      in >> s;
      return s;
    };
    // NVIDIA's PCI vendor ID; class 0x0300 (VGA) or 0x0302 (3D controller).
    if (read("vendor") != "0x10de") continue;
    const std::string cls = read("class");
    if (cls.rfind("0x0300", 0) != 0 && cls.rfind("0x0302", 0) != 0) continue;
    if (auto id = normalize_pci_bus_id(e.path().filename().string())) gpus.push_back(*id);
  }
  std::sort(gpus.begin(), gpus.end());
  for (unsigned i = 0; i < gpus.size(); ++i)
    if (gpus[i] == *want) return i;
  return std::nullopt;
}

namespace {

void check_count(const Topology& t, const NvdebugLayout& nv) {
  if (nv.tpc_count() != t.tpcs.size())
    throw std::runtime_error(fmt::format("nvdebug {} describes {} TPCs, but device {} ({}) has {}", nv.dir,
                                         nv.tpc_count(), t.device.ordinal, uuid_to_string(t.device.uuid),
                                         t.tpcs.size()));
}

// Rebuilds t.gpcs from the per-TPC GPCs (IDs must be dense 0..n-1).
void rebuild_gpc_lists(Topology& t, unsigned gpc_count, const std::vector<unsigned>& max_cluster) {
  t.gpcs.assign(gpc_count, {});
  for (unsigned g = 0; g < gpc_count; ++g) {
    t.gpcs[g].id = GpcId{g};
    t.gpcs[g].max_cluster = g < max_cluster.size() ? max_cluster[g] : 0;
  }
  for (const auto& ti : t.tpcs)
    if (ti.gpc) t.gpcs[ti.gpc->value].tpcs.push_back(ti.id);
}

}  // namespace

void apply_nvdebug_gpcs(Topology& t, const NvdebugLayout& nv) {
  check_count(t, nv);
  for (unsigned k = 0; k < t.tpcs.size(); ++k) t.tpcs[k].gpc = nv.gpc_of_tpc[k];
  rebuild_gpc_lists(t, nv.gpc_count(), {});
  t.gpc_note.clear();
  t.source += "+nvdebug";
  validate(t);
}

std::optional<std::string> cross_check_nvdebug(const Topology& t, const NvdebugLayout& nv) {
  if (nv.tpc_count() != t.tpcs.size())
    return fmt::format("nvdebug {} describes {} TPCs but calibration found {}", nv.dir, nv.tpc_count(),
                       t.tpcs.size());
  // Same partition of the TPCs both sources place, numbering aside: the map
  // calibration GPC -> nvdebug GPC must be a bijection on those TPCs.
  std::map<unsigned, unsigned> cal_to_nv, nv_to_cal;
  for (const auto& ti : t.tpcs) {
    if (!ti.gpc) continue;
    const unsigned c = ti.gpc->value, n = nv.gpc_of_tpc[ti.id.value].value;
    auto [i1, f1] = cal_to_nv.emplace(c, n);
    auto [i2, f2] = nv_to_cal.emplace(n, c);
    if (i1->second != n || i2->second != c)
      return fmt::format(
          "nvdebug and calibration disagree on GPCs: TPC {} is in calibration GPC {} with TPCs nvdebug puts in GPC {}, "
          "but nvdebug puts it in GPC {}",
          ti.id.value, c, i1->second, n);
  }
  return std::nullopt;
}

std::optional<std::string> merge_nvdebug(Topology& t, const NvdebugLayout& nv) {
  if (auto w = cross_check_nvdebug(t, nv)) {
    spdlog::warn("{}", *w);
    t.warnings.push_back(*w);
    return w;
  }
  // Agreement: adopt nvdebug's (hardware) GPC numbers, and its GPC for TPCs
  // that never hosted a cluster block.
  std::vector<unsigned> max_cluster(nv.gpc_count(), 0);
  for (const auto& g : t.gpcs)
    for (auto k : g.tpcs) {
      unsigned n = nv.gpc_of_tpc[k.value].value;
      max_cluster[n] = std::max(max_cluster[n], g.max_cluster);
    }
  for (unsigned k = 0; k < t.tpcs.size(); ++k) t.tpcs[k].gpc = nv.gpc_of_tpc[k];
  rebuild_gpc_lists(t, nv.gpc_count(), max_cluster);
  t.gpc_note.clear();
  t.source += "+nvdebug";
  validate(t);
  spdlog::debug("nvdebug {} agrees with calibration; using its GPC numbers", nv.dir);
  return std::nullopt;
}

}  // namespace nvtaskset::topo
