// SPDX-License-Identifier: Apache-2.0
// A task's role, by name (task_role.hpp).
#include "nvtaskset/task_role.hpp"

namespace nvtaskset::roles {

const char* role_name(Role r) noexcept {
  switch (r) {
    case Role::kLatencyCritical: return "latency-critical";
    case Role::kBestEffort: return "best-effort";
    case Role::kNone: break;
  }
  return "none";
}

std::optional<Role> parse_role(std::string_view s) noexcept {
  if (s == "latency-critical") return Role::kLatencyCritical;
  if (s == "best-effort") return Role::kBestEffort;
  if (s == "none" || s.empty()) return Role::kNone;
  return std::nullopt;
}

}  // namespace nvtaskset::roles
