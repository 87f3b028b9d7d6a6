// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "nvtaskset/partition.hpp"

using namespace nvtaskset;

TEST(Partition, UuidRoundTrip) {
  DeviceUuid u{};
  for (unsigned i = 0; i < 16; ++i) u[i] = static_cast<std::uint8_t>(i * 17);
  const std::string s = uuid_to_string(u);
  EXPECT_EQ(s, "GPU-00112233-4455-6677-8899-aabbccddeeff");
  EXPECT_EQ(uuid_from_string(s), u);
  EXPECT_EQ(uuid_from_string("00112233445566778899AABBCCDDEEFF"), u);
  EXPECT_FALSE(uuid_from_string("GPU-0011"));
  EXPECT_FALSE(uuid_from_string("GPU-00112233-4455-6677-8899-aabbccddeeffaa"));
  EXPECT_FALSE(uuid_from_string("GPU-0011223x-4455-6677-8899-aabbccddeeff"));
}

TEST(Partition, EncodingRoundTrips) {
  DevicePartition a;
  a.partition.kind = SpecKind::kTpcList;
  a.partition.enabled.bits = {0x00ff00ff00ff00ffull, 0x1234};
  a.partition.tpcs.bits = {0xff, 0};
  a.desc = {132, 9, 0, 13000};
  a.partition.max_cluster = 4;
  a.partition.widened.bits = {0xffffffffffffffffull, 0x12345};
  a.partition.widened_max_cluster = 16;
  DevicePartition b;
  b.device = *uuid_from_string("GPU-00112233-4455-6677-8899-aabbccddeeff");
  b.partition.kind = SpecKind::kGpcList;
  b.partition.enabled.bits = {0, 1ull << 63};
  b.partition.gpcs.bits = {0x5, 0};
  DevicePartition none;  // kind none, nothing enabled: allowed (no partition)
  none.device = *uuid_from_string("GPU-ffffffff-4455-6677-8899-aabbccddeeff");
  const std::vector<DevicePartition> parts{a, b, none};
  const std::string text = encode_partitions(parts);
  EXPECT_EQ(decode_partitions(text), parts);
  EXPECT_TRUE(decode_partitions("").empty());
  const auto one = decode_partitions("*,1,0xf,0xf,0x0,16,8,6,13000,2,0xff,8");
  EXPECT_EQ(one[0].desc, (DeviceDesc{16, 8, 6, 13000}));
  EXPECT_EQ(one[0].partition.max_cluster, 2u);
  EXPECT_EQ(one[0].partition.widened.bits, (Bits128{0xff, 0}));
  EXPECT_EQ(one[0].partition.widened_max_cluster, 8u);
  // The form before cluster limits (9 fields) is refused, not half-read.
  EXPECT_THROW(decode_partitions("*,1,0xf,0xf,0x0,16,8,6,13000"), std::invalid_argument);
}

TEST(Partition, MalformedEncodingIsRejected) {
  for (const char* bad : {"*", "*,1,0xf,0xf", "*,1,0xf,0x0,0x0" /* no descriptor */, "*,9,0xf,0x0,0x0,0,0,0,0",
                          "*,1,f,0x0,0x0,0,0,0,0", "*,1,0xfg,0x0,0x0,0,0,0,0",
                          "*,1,0x0,0x0,0x0,0,0,0,0" /* active but enables nothing */, "GPU-12,1,0x1,0x1,0x0,0,0,0,0",
                          "*,1,0x1,0x1,0x0,0,0,0,0;*,1,0x1,0x1,0x0,0,0,0,0" /* same device twice */,
                          "*,1,0x111111111111111111111111111111111,0x0,0x0,0,0,0,0", "*,1,0x1,0x1,0x0,x,0,0,0",
                          "*,1,0x1,0x1,0x0,-1,0,0,0", "*,1,0x1,0x1,0x0,1234567890,0,0,0"}) {
    EXPECT_THROW(decode_partitions(bad), std::invalid_argument) << bad;
  }
}
