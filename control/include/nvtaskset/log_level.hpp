// SPDX-License-Identifier: Apache-2.0
// NVTASKSET_LOG, parsed once for both the CLI and the shim, so that the same
// value means the same thing on both sides of the exec (they used to differ:
// the CLI turned logging off on "INFO" or a typo, the shim warned).
//
// Header-only and free of spdlog: each side maps LogLevel to its own logger.
// The enumerators have spdlog::level::level_enum's values (trace = 0 ...
// off = 6), so the mapping is a static_cast; the users static_assert that.
#pragma once

#include "nvtaskset/options.hpp"

#include <cstddef>
#include <optional>
#include <string_view>

namespace nvtaskset {

enum class LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4, kCritical = 5, kOff = 6 };

inline constexpr const char* kLogLevelEnv = option(Option::kLog).name;
inline constexpr LogLevel kDefaultLogLevel = LogLevel::kWarn;
// For messages about an unknown value.
inline constexpr const char* kLogLevelNames = "trace, debug, info, warn, error, off";

// A level name, case-insensitive: trace, debug, info, warn or warning, error
// or err, critical, off. nullopt for anything else, the empty string included.
constexpr std::optional<LogLevel> parse_log_level(std::string_view s) noexcept {
  struct Name {
    std::string_view name;
    LogLevel level;
  };
  constexpr Name kNames[] = {{"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug},
                             {"info", LogLevel::kInfo},   {"warn", LogLevel::kWarn},
                             {"warning", LogLevel::kWarn}, {"error", LogLevel::kError},
                             {"err", LogLevel::kError},   {"critical", LogLevel::kCritical},
                             {"off", LogLevel::kOff}};
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  for (const Name& n : kNames) {
    if (n.name.size() != s.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < s.size() && same; ++i) same = lower(s[i]) == n.name[i];
    if (same) return n.level;
  }
  return std::nullopt;
}

// What NVTASKSET_LOG's value (getenv's result) asks for. Unset or empty: the
// default, silently. Unknown: the default, and `unknown` is set so that the
// caller warns (once) instead of silently logging more or less than asked.
struct LogSetting {
  LogLevel level = kDefaultLogLevel;
  bool unknown = false;
};
constexpr LogSetting log_setting(const char* value) noexcept {
  if (value == nullptr || *value == '\0') return {};
  if (auto l = parse_log_level(value)) return {*l, false};
  return {kDefaultLogLevel, true};
}

}  // namespace nvtaskset
