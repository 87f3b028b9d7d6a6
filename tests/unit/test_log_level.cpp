// SPDX-License-Identifier: Apache-2.0
// NVTASKSET_LOG's one parser (log_level.hpp), used by the CLI and the shim.
#include <gtest/gtest.h>

#include "nvtaskset/log_level.hpp"

namespace nvtaskset {
namespace {

TEST(LogLevel, NamesAreCaseInsensitive) {
  EXPECT_EQ(parse_log_level("trace"), LogLevel::kTrace);
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("info"), LogLevel::kInfo);
  EXPECT_EQ(parse_log_level("INFO"), LogLevel::kInfo);  // spdlog's from_str made this "off"
  EXPECT_EQ(parse_log_level("Info"), LogLevel::kInfo);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::kWarn);
  EXPECT_EQ(parse_log_level("WARNING"), LogLevel::kWarn);
  EXPECT_EQ(parse_log_level("error"), LogLevel::kError);
  EXPECT_EQ(parse_log_level("err"), LogLevel::kError);
  EXPECT_EQ(parse_log_level("critical"), LogLevel::kCritical);
  EXPECT_EQ(parse_log_level("OFF"), LogLevel::kOff);
}

TEST(LogLevel, UnknownValuesAreErrors) {
  for (const char* bad : {"", "bogus", "inf", "infos", " info", "info ", "warn\n", "3", "0", "of", "offf", "tracE2",
                          "wärn"}) {
    EXPECT_EQ(parse_log_level(bad), std::nullopt) << "'" << bad << "'";
  }
}

TEST(LogLevel, SettingFromTheEnvironmentValue) {
  // Unset and empty: the default, no complaint.
  EXPECT_EQ(log_setting(nullptr).level, LogLevel::kWarn);
  EXPECT_FALSE(log_setting(nullptr).unknown);
  EXPECT_EQ(log_setting("").level, LogLevel::kWarn);
  EXPECT_FALSE(log_setting("").unknown);
  EXPECT_EQ(log_setting("Debug").level, LogLevel::kDebug);
  EXPECT_FALSE(log_setting("Debug").unknown);
  // Unknown: warn level (never off, which hid every error), and flagged.
  EXPECT_EQ(log_setting("bogus").level, LogLevel::kWarn);
  EXPECT_TRUE(log_setting("bogus").unknown);
  static_assert(log_setting("off").level == LogLevel::kOff);  // usable at compile time
}

TEST(LogLevel, ValuesAreSpdlogs) {
  // Both users static_cast to spdlog::level::level_enum (trace = 0 ... off = 6).
  EXPECT_EQ(static_cast<int>(LogLevel::kTrace), 0);
  EXPECT_EQ(static_cast<int>(LogLevel::kDebug), 1);
  EXPECT_EQ(static_cast<int>(LogLevel::kInfo), 2);
  EXPECT_EQ(static_cast<int>(LogLevel::kWarn), 3);
  EXPECT_EQ(static_cast<int>(LogLevel::kError), 4);
  EXPECT_EQ(static_cast<int>(LogLevel::kCritical), 5);
  EXPECT_EQ(static_cast<int>(LogLevel::kOff), 6);
}

}  // namespace
}  // namespace nvtaskset
