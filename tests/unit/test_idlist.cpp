// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <chrono>
#include <string>

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

std::string error_of(std::string_view text) {
  try {
    parse_list(text, "TPC");
  } catch (const ParseError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(IdList, NumbersAreBoundedBeforeAnyArithmetic) {
  // A stride of 2^64-1 used to wrap id += stride and select TPCs 0-50.
  EXPECT_EQ(error_of("50-53:18446744073709551615"),
            "invalid TPC list '50-53:18446744073709551615': stride 18446744073709551615 is larger than 4095");
  for (const char* bad : {"50-53:4096", "0-1:99999999999999999999999999", "18446744073709551615",
                          "0-18446744073709551616", "18446744073709551615-1", "4294967296", "4294967297-4294967298"}) {
    EXPECT_THROW(parse_list(bad, "TPC"), ParseError) << "'" << bad << "'";
  }
  EXPECT_EQ(error_of("4294967296"), "TPC 4294967296 does not exist (IDs go up to 4095 at most)");
  // The largest values still work, and strides up to the bound keep their meaning.
  EXPECT_EQ(parse_list("4095", "TPC"), std::vector<unsigned>{4095});
  EXPECT_EQ(parse_list("0-4095:4095", "TPC"), (std::vector<unsigned>{0, 4095}));
  EXPECT_EQ(parse_list("50-53:4095", "TPC"), std::vector<unsigned>{50});
  EXPECT_EQ(parse_list("4094-4095:3", "TPC"), std::vector<unsigned>{4094});
  EXPECT_EQ(parse_list("0-4095", "TPC").size(), 4096u);
  EXPECT_EQ(parse_list("007-0009:02", "TPC"), (std::vector<unsigned>{7, 9}));  // leading zeros, as taskset
}

TEST(IdList, OverlongInputIsRefusedEarlyWithOneShortLine) {
  // 120 KB of ranges took seconds and hundreds of MB before it was checked.
  std::string huge;
  while (huge.size() < 120 * 1024) huge += "0-4095,";
  huge += "0";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of(huge);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(e.find("longer than 4096 characters"), std::string::npos) << e;
  EXPECT_LT(e.size(), 200u) << "the message echoes the whole input";
  EXPECT_LT(ms, 1000) << "refusing an overlong list should not take long";

  // At the length limit, but more elements than any TPC list needs.
  std::string many = "0";
  for (std::size_t i = 1; i < kMaxListElements; ++i) many += ",0";
  EXPECT_EQ(parse_list(many, "TPC"), std::vector<unsigned>{0});  // exactly kMaxListElements: fine
  EXPECT_NE(error_of(many + ",1").find("more than 1024 elements"), std::string::npos);

  // The worst list that passes the limits: every element the full range.
  std::string wide = "0-4095";
  while (wide.size() + 7 <= kMaxListText) wide += ",0-4095";
  EXPECT_EQ(parse_list(wide, "TPC").size(), 4096u);
  EXPECT_THROW(parse_list(wide + ",0-4095", "TPC"), ParseError);

  // Masks are bounded the same way; leading zeros up to the limit are fine.
  EXPECT_EQ(parse_mask("0x" + std::string(kMaxListText - 3, '0') + "1", "TPC"), (Bits128{1, 0}));
  EXPECT_THROW(parse_mask("0x" + std::string(kMaxListText, '0') + "1", "TPC"), ParseError);
}

TEST(IdList, MessagesNeverSpanLines) {
  for (const char* bad : {"1\n2", "0-3\r", "\x1b[2J", "1,\n", "0-7:\t"}) {
    const std::string e = error_of(bad);
    EXPECT_EQ(e.find_first_of("\n\r\x1b\t"), std::string::npos) << e;
    EXPECT_NE(e, "(accepted)");
  }
  EXPECT_EQ(error_of("1\n2"), "invalid TPC list '1\\x0a2': unexpected '\\x0a2'");
  try {
    parse_mask("0x1\n", "TPC");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), "invalid TPC mask '0x1\\x0a': '\\x0a' is not a hex digit");
  }
  EXPECT_EQ(printable(std::string(100, '7')), std::string(48, '7') + "...");
}

TEST(IdList, Pids) {
  EXPECT_EQ(parse_pid("1"), 1);
  EXPECT_EQ(parse_pid("4242"), 4242);
  EXPECT_EQ(parse_pid("004242"), 4242);
  EXPECT_EQ(parse_pid("4194304"), 4194304);
  for (const char* bad : {"", "0", "000", "-1", "+1", " 1", "1 ", "1\n", "0x10", "1e3", "abc", "12abc", "4194305",
                          "2147483648", "4294967297", "99999999999999999999", "18446744073709551617"}) {
    EXPECT_THROW(parse_pid(bad), ParseError) << "'" << bad << "'";
  }
  try {
    parse_pid("99999999999999999999");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), "invalid pid '99999999999999999999': larger than any pid (4194304)");
  }
  try {
    parse_pid("4\n2");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), "invalid pid '4\\x0a2': not a decimal number");
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
