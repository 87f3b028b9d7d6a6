// SPDX-License-Identifier: Apache-2.0
// The nvdebug reader on fake /proc trees (tests/data/nvdebug/), its
// cross-check with calibration, and nvdebug's GPU numbering.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "nvtaskset/nvdebug.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::topo {
namespace {

using namespace testing;
namespace fs = std::filesystem;

const std::string kData = std::string(NVTASKSET_TEST_DATA_DIR) + "/nvdebug";

std::string error_reading(const std::string& root, unsigned idx = 0) {
  try {
    read_nvdebug(root, idx);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// A writable copy of a data tree, to derive variants from.
class NvdebugTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "nvtaskset_nvdebug_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void copy_from(const std::string& name) {
    fs::copy(kData + "/" + name, root_, fs::copy_options::recursive);
  }
  void write(const std::string& file, const std::string& text) {
    std::ofstream(root_ + "/gpu0/" + file) << text;
  }
  std::string root_;
};

TEST(Nvdebug, ReadsHopperTree) {
  auto nv = read_nvdebug(kData + "/h200", 0);
  ASSERT_TRUE(nv);
  const HwModel m = h200_model();
  EXPECT_EQ(nv->dir, kData + "/h200/gpu0");
  EXPECT_EQ(nv->num_gpcs, 8u);
  EXPECT_EQ(nv->tpcs_per_gpc, 9u);
  EXPECT_EQ(nv->gpc_count(), 8u);
  EXPECT_EQ(nv->enabled_tpcs_per_gpc, (std::vector<unsigned>{9, 9, 8, 9, 4, 9, 9, 9}));
  ASSERT_EQ(nv->tpc_count(), 66u);
  for (unsigned k = 0; k < 66; ++k) EXPECT_EQ(nv->gpc_of_tpc[k].value, m.hw_gpc_of_tpc[k]) << "TPC " << k;
}

TEST(Nvdebug, ReadsTreeWithDisabledGpcAndBareHex) {
  // a100: 8 GPC slots, slot 7 disabled; hex without 0x, upper case.
  auto nv = read_nvdebug(kData + "/a100", 0);
  ASSERT_TRUE(nv);
  EXPECT_EQ(nv->gpc_mask, 0x80u);
  EXPECT_EQ(nv->gpc_count(), 7u);
  ASSERT_EQ(nv->tpc_count(), 54u);
  for (unsigned k = 0; k < 54; ++k) EXPECT_EQ(nv->gpc_of_tpc[k].value, k % 7);
}

TEST(Nvdebug, AbsentDirectoryIsNotAvailable) {
  EXPECT_FALSE(read_nvdebug(kData + "/h200", 1).has_value());
  EXPECT_FALSE(read_nvdebug(kData + "/no-such-root", 0).has_value());
}

TEST(Nvdebug, MalformedFileIsAClearError) {
  const std::string e = error_reading(kData + "/malformed");
  EXPECT_EQ(e, "nvdebug file " + kData + "/malformed/gpu0/gpc_mask: expected a hex number, got 'zz'");
}

TEST(Nvdebug, MissingFileIsAClearError) {
  const std::string e = error_reading(kData + "/missing");
  EXPECT_NE(e.find("nvdebug file " + kData + "/missing/gpu0/CWD_GPC_TPC_ID3 cannot be read"), std::string::npos) << e;
}

TEST_F(NvdebugTree, EmptyOrGarbageRegisters) {
  copy_from("h200");
  write("num_gpcs", "");
  EXPECT_NE(error_reading(root_).find("num_gpcs: expected a hex number, got ''"), std::string::npos);
  write("num_gpcs", "0x8 junk");
  EXPECT_NE(error_reading(root_).find("expected a hex number, got '0x8 junk'"), std::string::npos);
  write("num_gpcs", "0x0");
  EXPECT_NE(error_reading(root_).find("0 GPCs is not plausible"), std::string::npos);
  write("num_gpcs", "0x8\n");
  write("num_tpc_per_gpc", "0x100");
  EXPECT_NE(error_reading(root_).find("256 TPCs per GPC is not plausible"), std::string::npos);
  write("num_tpc_per_gpc", "0x9");
  write("CWD_GPC_TPC_ID2", "0x1ffffffff");
  EXPECT_NE(error_reading(root_).find("wider than a 32-bit register"), std::string::npos);
}

TEST_F(NvdebugTree, RegistersThatContradictTheMasks) {
  copy_from("h200");
  // Move a TPC from GPC 0 to GPC 4 in the masks only: still 66 TPCs, but the
  // masks now say 8 and 5 where the registers say 9 and 4.
  write("gpc0_tpc_mask", "0x100");
  write("gpc4_tpc_mask", "0x1e0");
  const std::string e = error_reading(root_);
  EXPECT_NE(e.find("CWD_GPC_TPC_ID registers give GPCs of"), std::string::npos) << e;
}

TEST_F(NvdebugTree, GpcNumberBeyondTheEnabledGpcs) {
  copy_from("h200");
  write("CWD_GPC_TPC_ID0", "0x00000090");  // TPC 0 in GPC 9
  const std::string e = error_reading(root_);
  EXPECT_NE(e.find("puts TPC 0 in GPC 9, but only 8 GPCs are enabled"), std::string::npos) << e;
}

TEST_F(NvdebugTree, AllZeroRegistersMeanPoweredOff) {
  copy_from("h200");
  for (unsigned k = 0; k < 17; ++k) write("CWD_GPC_TPC_ID" + std::to_string(k), "0x0");
  EXPECT_NE(error_reading(root_).find("read all zero (is the GPU powered on?)"), std::string::npos);
}

TEST_F(NvdebugTree, CrossCheckAgreesModuloNumbering) {
  copy_from("h200");
  // Renumber nvdebug's GPCs g -> 7-g: same partition, other numbers.
  for (unsigned r = 0; r < 17; ++r) {
    std::ifstream in(root_ + "/gpu0/CWD_GPC_TPC_ID" + std::to_string(r));
    std::string s;
    in >> s;
    std::uint32_t v = static_cast<std::uint32_t>(std::stoul(s, nullptr, 16)), out = 0;
    for (unsigned j = 0; j < 4; ++j) {
      const std::uint32_t byte = (v >> (8 * j)) & 0xff;
      const std::uint32_t g = byte >> 4;
      out |= ((((7 - g) & 0xf) << 4) | (byte & 0xf)) << (8 * j);
    }
    if (r == 16) out &= 0xffff;  // only TPCs 64 and 65 exist in the last register
    write("CWD_GPC_TPC_ID" + std::to_string(r), fmt::format("{:#x}", out));
  }
  auto nv = read_nvdebug(root_, 0);
  ASSERT_TRUE(nv);
  Topology t = h200_topology();
  EXPECT_EQ(cross_check_nvdebug(t, *nv), std::nullopt);

  // Merging adopts nvdebug's numbers and places the TPCs calibration could
  // not, keeping what calibration learnt about clusters.
  const Topology before = t;
  EXPECT_EQ(merge_nvdebug(t, *nv), std::nullopt);
  EXPECT_EQ(t.source, "calibration+nvdebug");
  EXPECT_TRUE(t.gpc_note.empty());
  const HwModel m = h200_model();
  for (unsigned k = 0; k < 66; ++k) {
    ASSERT_TRUE(t.tpcs[k].gpc) << k;
    EXPECT_EQ(t.tpcs[k].gpc->value, 7 - m.hw_gpc_of_tpc[k]);
    EXPECT_EQ(t.tpcs[k].cluster_capable, before.tpcs[k].cluster_capable);
    EXPECT_EQ(t.tpcs[k].bit, before.tpcs[k].bit);
  }
  // hw GPC 4 (4 TPCs) is nvdebug GPC 3: max cluster 8 came along.
  EXPECT_EQ(t.gpcs[3].tpcs.size(), 4u);
  EXPECT_EQ(t.gpcs[3].max_cluster, 8u);
  EXPECT_NO_THROW(validate(t));
}

TEST_F(NvdebugTree, CrossCheckReportsDisagreement) {
  copy_from("h200");
  auto nv = read_nvdebug(root_, 0);
  ASSERT_TRUE(nv);
  Topology t = h200_topology();
  // Calibration claims TPCs 1 and 2 share a GPC; nvdebug says otherwise.
  ASSERT_TRUE(t.tpcs[1].gpc && t.tpcs[2].gpc);
  const GpcId g1 = *t.tpcs[1].gpc, g2 = *t.tpcs[2].gpc;
  ASSERT_NE(g1, g2);
  auto& from = t.gpcs[g2.value].tpcs;
  from.erase(std::find(from.begin(), from.end(), LogicalTpcId{2}));
  auto& to = t.gpcs[g1.value].tpcs;
  to.insert(std::upper_bound(to.begin(), to.end(), LogicalTpcId{2}), LogicalTpcId{2});
  t.tpcs[2].gpc = g1;
  ASSERT_NO_THROW(validate(t));
  auto w = cross_check_nvdebug(t, *nv);
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("nvdebug and calibration disagree on GPCs: TPC 2"), std::string::npos) << *w;
  const Topology before = t;
  EXPECT_EQ(merge_nvdebug(t, *nv), w);
  EXPECT_EQ(t.source, "calibration");  // calibration kept
  EXPECT_EQ(t.tpcs[2].gpc, before.tpcs[2].gpc);
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_EQ(t.warnings[0], *w);
}

TEST(Nvdebug, CrossCheckReportsTpcCountMismatch) {
  auto nv = read_nvdebug(kData + "/a100", 0);
  ASSERT_TRUE(nv);
  auto w = cross_check_nvdebug(h200_topology(), *nv);
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("describes 54 TPCs but calibration found 66"), std::string::npos) << *w;
}

TEST(Nvdebug, GivesIdentityTopologyItsGpcs) {
  auto nv = read_nvdebug(kData + "/a100", 0);
  ASSERT_TRUE(nv);
  Topology t = *identity_topology(a100_device());
  apply_nvdebug_gpcs(t, *nv);
  EXPECT_EQ(t.source, "identity+nvdebug");
  ASSERT_EQ(t.gpcs.size(), 7u);
  EXPECT_TRUE(t.gpc_note.empty());
  for (unsigned k = 0; k < 54; ++k) EXPECT_EQ(t.tpcs[k].gpc->value, k % 7);
  EXPECT_EQ(ids_of(tpcs_of_gpcs(t, gpc_set({6}))), (std::vector<unsigned>{6, 13, 20, 27, 34, 41, 48}));
  // A tree for a GPU of another size is refused.
  Topology h = h200_topology();
  EXPECT_THROW(apply_nvdebug_gpcs(h, *nv), std::runtime_error);
}

TEST(Nvdebug, IndexFollowsPciOrderOfNvidiaGpus) {
  const std::string sys = ::testing::TempDir() + "nvtaskset_sysfs";
  fs::remove_all(sys);
  auto dev = [&](const std::string& id, const std::string& vendor, const std::string& cls) {
    fs::create_directories(sys + "/" + id);
    std::ofstream(sys + "/" + id + "/vendor") << vendor << "\n";
    std::ofstream(sys + "/" + id + "/class") << cls << "\n";
  };
  dev("0000:00:02.0", "0x8086", "0x030000");  // Intel graphics: not NVIDIA
  dev("0000:5c:00.0", "0x10de", "0x030200");  // NVIDIA 3D controller
  dev("0000:3b:00.0", "0x10de", "0x030200");
  dev("0000:3b:00.1", "0x10de", "0x040300");  // NVIDIA audio function
  dev("0001:07:00.0", "0x10de", "0x030000");  // NVIDIA VGA, other domain
  EXPECT_EQ(nvdebug_index_of("0000:3b:00.0", sys), 0u);
  EXPECT_EQ(nvdebug_index_of("3B:00.0", sys), 0u);
  EXPECT_EQ(nvdebug_index_of("0000:5c:00.0", sys), 1u);
  EXPECT_EQ(nvdebug_index_of("0001:07:00.0", sys), 2u);
  EXPECT_EQ(nvdebug_index_of("0000:00:02.0", sys), std::nullopt);
  EXPECT_EQ(nvdebug_index_of("garbage", sys), std::nullopt);
  EXPECT_EQ(nvdebug_index_of("0000:3b:00.0", sys + "/nope"), std::nullopt);
  fs::remove_all(sys);
}

}  // namespace
}  // namespace nvtaskset::topo
