#include <gtest/gtest.h>

#include "nvtaskset/idlist.hpp"

using namespace nvtaskset;
using namespace nvtaskset::cli;

TEST(IdList, TasksetSyntax) {
  EXPECT_EQ(parse_list("0-7,12,20-31:2", "TPC"),
            (std::vector<unsigned>{0, 1, 2, 3, 4, 5, 6, 7, 12, 20, 22, 24, 26, 28, 30}));
  EXPECT_EQ(parse_list("5", "TPC"), std::vector<unsigned>{5});
  EXPECT_EQ(parse_list("3,1,3,2", "TPC"), (std::vector<unsigned>{1, 2, 3}));
  EXPECT_EQ(parse_list("4-4", "TPC"), std::vector<unsigned>{4});
  EXPECT_EQ(parse_list("0-9:4", "GPC"), (std::vector<unsigned>{0, 4, 8}));
}

TEST(IdList, EveryMalformedFormIsRejected) {
  for (const char* bad : {"", ",", "1,", ",1", "0,,1", "1-", "-1", "a", "1a", "3-1", "0-7:0", "0-7:", "0-7:x",
                          "1:2", " 1", "1 ", "0x1", "1.5", "+1", "0--1", "4096", "0-5000", "99999999999999999999"}) {
    EXPECT_THROW(parse_list(bad, "TPC"), ParseError) << "'" << bad << "'";
  }
}

TEST(IdList, MessagesAreOneLineAndNameTheInput) {
  try {
    parse_list("3-1", "TPC");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), "invalid TPC list '3-1': range 3-1 is reversed");
  }
  try {
    parse_list("0-9000", "GPC");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("GPC 9000 does not exist"), std::string::npos);
  }
}

TEST(IdList, Masks) {
  EXPECT_EQ(parse_mask("0xff00", "TPC"), (Bits128{0xff00, 0}));
  EXPECT_EQ(parse_mask("ff00", "TPC"), (Bits128{0xff00, 0}));
  EXPECT_EQ(parse_mask("0XF", "TPC"), (Bits128{0xf, 0}));
  // 128-bit masks.
  EXPECT_EQ(parse_mask("0x10000000000000000", "TPC"), (Bits128{0, 1}));
  EXPECT_EQ(parse_mask("0xffffffffffffffffffffffffffffffff", "TPC"), (Bits128{~0ull, ~0ull}));
  EXPECT_EQ(parse_mask("0x000000000000000000000000000000000001", "TPC"), (Bits128{1, 0}));  // leading zeros ok
  for (const char* bad : {"", "0x", "0x0", "0", "000", "0xzz", "g", "0x1ffffffffffffffffffffffffffffffff", "-1", "0x 1"}) {
    EXPECT_THROW(parse_mask(bad, "TPC"), ParseError) << "'" << bad << "'";
  }
}

TEST(IdList, FormatLikeTaskset) {
  EXPECT_EQ(format_list(std::vector<unsigned>{0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_list(std::vector<unsigned>{}), "");
  EXPECT_EQ(format_list(Bits128{0, 1}), "64");
  EXPECT_EQ(format_list(Bits128{~0ull, ~0ull}), "0-127");
  EXPECT_EQ(format_list(parse_list("0-7,12,20-31:2", "TPC")), "0-7,12,20,22,24,26,28,30");
}

TEST(IdList, ToBits) {
  EXPECT_EQ(to_bits({0, 64, 127}, "TPC"), (Bits128{1, (1ull << 63) | 1}));
  EXPECT_THROW(to_bits({128}, "TPC"), ParseError);
}

TEST(Bits128, Basics) {
  EXPECT_EQ(Bits128::first(0), (Bits128{0, 0}));
  EXPECT_EQ(Bits128::first(64), (Bits128{~0ull, 0}));
  EXPECT_EQ(Bits128::first(66), (Bits128{~0ull, 3}));
  EXPECT_EQ(Bits128::first(128), (Bits128{~0ull, ~0ull}));
  EXPECT_EQ((Bits128{0, 0x100}).width(), 73u);
  EXPECT_EQ((Bits128{5, 0}).to_hex(), "0x5");
  EXPECT_EQ((Bits128{1, 2}).to_hex(), "0x20000000000000001");
  EXPECT_EQ((Bits128{0, 0}).to_hex(), "0x0");
  EXPECT_EQ((~Bits128{0xf, 0}).count(), 124u);
}
