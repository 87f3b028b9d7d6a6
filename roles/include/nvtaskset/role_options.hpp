// SPDX-License-Identifier: Apache-2.0
// The roles' options in one table: who reads each, its default and its unit.
// Their names, the values they take and what they do are the option
// registry's (options.hpp, kOptions); the defaults the shim applies are the
// constants below, which the registry's texts state. docs/design.md
// ("Roles") shows this table; a unit test fails when the table, the
// registry, these constants and the doc disagree.
#pragma once

#include <cstdint>
#include <string_view>

#include "nvtaskset/options.hpp"

namespace nvtaskset::roles {

// The defaults the shim applies (why these values: docs/design.md, "Roles").
inline constexpr unsigned kDefaultGateDepth = 64;     // NVTASKSET_BE_DEPTH and _FLOOR_DEPTH under the gate
inline constexpr unsigned kDefaultBeDepth = 4;        // NVTASKSET_BE_DEPTH under the hold
inline constexpr unsigned kDefaultBeFloorDepth = 16;  // NVTASKSET_BE_FLOOR_DEPTH under the hold
inline constexpr unsigned kDefaultGateEvery = 2;      // NVTASKSET_BE_GATE_EVERY
inline constexpr unsigned kDefaultGateUs = 100;       // NVTASKSET_BE_GATE_US
inline constexpr unsigned kDefaultBorrowUs = 500;     // NVTASKSET_BE_BORROW_US
inline constexpr unsigned kDefaultGateSleepMs = 2;    // NVTASKSET_TEST_GATE_SLEEP_MS: the gatekeeper's sleep

enum class Reader : std::uint8_t { kLatencyCritical, kBestEffort, kBoth };

struct RoleOption {
  Option id;
  Reader reader;
  // nullptr: the registry's (a number's "default D", a choice's first value).
  const char* default_value;
  const char* unit;
};

// In the registry's order.
inline constexpr RoleOption kRoleOptions[] = {
    {Option::kRole, Reader::kBoth, "set by nvtaskset", "latency-critical or best-effort"},
    {Option::kBurstPool, Reader::kLatencyCritical, "set by nvtaskset", "TPC mask bits per GPU"},
    {Option::kBeDepth, Reader::kBestEffort, nullptr, "launches"},
    {Option::kTestBurstMs, Reader::kBoth, "unset: by the shares", "ms"},
    {Option::kBeYield, Reader::kBestEffort, nullptr, "gate, hold, floor or run"},
    {Option::kBeQueueUs, Reader::kBestEffort, nullptr, "us"},
    {Option::kClusterMap, Reader::kBoth, "set by nvtaskset", "TPC mask bits per GPC"},
    {Option::kBeWorkUs, Reader::kBestEffort, nullptr, "us"},
    {Option::kLcTopup, Reader::kLatencyCritical, nullptr, "on or off"},
    {Option::kTestTopup, Reader::kLatencyCritical, "unset: measured", "TPCs"},
    {Option::kBeFloorDepth, Reader::kBestEffort, nullptr, "launches"},
    {Option::kBeGateEvery, Reader::kBestEffort, nullptr, "launches"},
    {Option::kBeBorrowUs, Reader::kBestEffort, nullptr, "us"},
    {Option::kTestGateSleepMs, Reader::kBestEffort, "2", "ms"},
    {Option::kBeGateUs, Reader::kBestEffort, nullptr, "us"},
};
static_assert([] {
  for (std::size_t i = 1; i < std::size(kRoleOptions); ++i)
    if (static_cast<unsigned>(kRoleOptions[i - 1].id) >= static_cast<unsigned>(kRoleOptions[i].id)) return false;
  return true;
}(), "kRoleOptions must be in the registry's order");

constexpr const char* reader_name(Reader r) noexcept {
  return r == Reader::kLatencyCritical ? "latency-critical" : r == Reader::kBestEffort ? "best-effort" : "both";
}

// The default as the table shows it.
constexpr std::string_view default_of(const RoleOption& o) noexcept {
  if (o.default_value != nullptr) return o.default_value;
  const OptionDesc& d = option(o.id);
  const std::string_view c = d.choices;
  if (d.kind == OptionKind::kChoice) return c.substr(0, c.find('|'));
  constexpr std::string_view kMark = "default ";
  const std::size_t at = c.find(kMark);
  return at == std::string_view::npos ? std::string_view() : c.substr(at + kMark.size());
}

}  // namespace nvtaskset::roles
