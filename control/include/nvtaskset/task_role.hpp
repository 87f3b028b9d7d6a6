// SPDX-License-Identifier: Apache-2.0
// A task's role (docs/design.md, "Roles"): the vocabulary the control
// region, the status entries and the CLI share. What the roles do is the
// roles library's (../../roles).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace nvtaskset::roles {

enum class Role : std::uint32_t { kNone = 0, kLatencyCritical = 1, kBestEffort = 2 };

// "latency-critical", "best-effort" or "none": the names of the CLI options
// and of "role" in `--status --json`.
const char* role_name(Role r) noexcept;
std::optional<Role> parse_role(std::string_view s) noexcept;

}  // namespace nvtaskset::roles
