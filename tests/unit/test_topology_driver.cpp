// SPDX-License-Identifier: Apache-2.0
// Choosing a device by index, UUID or PCI bus ID (-d).
#include <gtest/gtest.h>

#include <stdexcept>

#include "nvtaskset/cuda_driver.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::topo {
namespace {

using namespace testing;

std::vector<DeviceInfo> two_gpus() {
  DeviceInfo a = h200_device(0), b = h200_device(1);
  // Same first 8 hex digits, so short prefixes are ambiguous.
  b.uuid = a.uuid;
  b.uuid[15] ^= 0xff;
  return {a, b};
}

std::string error_selecting(const std::vector<DeviceInfo>& d, std::string_view spec) {
  try {
    select_device(d, spec);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(SelectDevice, ByIndex) {
  const auto d = two_gpus();
  EXPECT_EQ(select_device(d, "0").uuid, d[0].uuid);
  EXPECT_EQ(select_device(d, "1").uuid, d[1].uuid);
  EXPECT_EQ(select_device(d, " 1 ").uuid, d[1].uuid);
  const std::string e = error_selecting(d, "2");
  EXPECT_EQ(e.rfind("no device with index '2': devices are 0: NVIDIA H200 GPU-", 0), 0u) << e;
  EXPECT_NE(e.find("; 1: NVIDIA H200 " + uuid_to_string(d[1].uuid) + " 0000:5c:00.0"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  EXPECT_FALSE(error_selecting(d, "99999999999999999999").empty());
}

TEST(SelectDevice, ByUuid) {
  const auto d = two_gpus();
  const std::string u1 = uuid_to_string(d[1].uuid);
  EXPECT_EQ(select_device(d, u1).ordinal, 1u);
  // Upper case, without "GPU-", without dashes.
  std::string upper = u1;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(select_device(d, "GPU-" + upper.substr(4)).ordinal, 1u);
  std::string bare;
  for (char c : u1.substr(4))
    if (c != '-') bare += c;
  EXPECT_EQ(select_device(d, bare).ordinal, 1u);
  // An unambiguous prefix (differs only in the last byte) ...
  EXPECT_EQ(select_device(d, u1.substr(0, u1.size() - 1)).ordinal, 1u);
  // ... and an ambiguous one.
  const std::string e = error_selecting(d, u1.substr(0, 12));
  EXPECT_NE(e.find("is ambiguous (devices 0 and 1)"), std::string::npos) << e;
  EXPECT_NE(error_selecting(d, "GPU-ffff").find("no device with UUID 'GPU-ffff'"), std::string::npos);
  EXPECT_NE(error_selecting(d, "MIG-1234").find("MIG"), std::string::npos);
  EXPECT_NE(error_selecting(d, "banana").find("no device matches 'banana'"), std::string::npos);
  EXPECT_NE(error_selecting(d, "").find("no device"), std::string::npos);
}

TEST(SelectDevice, ByPciBusId) {
  const auto d = two_gpus();
  EXPECT_EQ(select_device(d, "0000:5c:00.0").ordinal, 1u);
  EXPECT_EQ(select_device(d, "5c:00.0").ordinal, 1u);
  EXPECT_EQ(select_device(d, "00000000:5C:00.0").ordinal, 1u);  // nvidia-smi's form
  EXPECT_EQ(select_device(d, "3b:00.0").ordinal, 0u);
  EXPECT_NE(error_selecting(d, "0000:5d:00.0").find("no device at PCI bus ID '0000:5d:00.0'"), std::string::npos);
  EXPECT_NE(error_selecting(d, "5c:00").find("malformed PCI bus ID"), std::string::npos);
}

TEST(SelectDevice, NoDevices) {
  EXPECT_NE(error_selecting({}, "0").find("no CUDA device is visible"), std::string::npos);
}

TEST(PciBusId, Normalizes) {
  EXPECT_EQ(normalize_pci_bus_id("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("00000001:3b:1f.7"), "0001:3b:1f.7");
  EXPECT_EQ(normalize_pci_bus_id("3b:0.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("3b:00"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("3b:00.8"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("zz:00.0"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id(""), std::nullopt);
  // Field widths and separators are exact: a longer field or a stray
  // character is not an id.
  EXPECT_EQ(normalize_pci_bus_id(" 0000:3B:00.0\n"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("3b:000.0"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("13b:00.0"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("000000001:3b:00.0"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id(":3b:00.0"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00.0x"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00.10"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00:0"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("0:0:3b:00.0"), std::nullopt);
}

}  // namespace
}  // namespace nvtaskset::topo
