// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/request.hpp"

#include "nvtaskset/idlist.hpp"

namespace nvtaskset::planner {

Request parse_request(std::string device, RequestKind kind, std::string_view text) {
  Request r;
  r.device = std::move(device);
  r.kind = kind;
  r.text = std::string(text);
  switch (kind) {
    case RequestKind::kTpcList: r.ids = parse_list(text, "TPC"); break;
    case RequestKind::kTpcMask: r.ids = parse_mask(text, "TPC").indices(); break;
    case RequestKind::kGpcList: r.ids = parse_list(text, "GPC"); break;
    case RequestKind::kCount: r.count = parse_count(text); break;
    case RequestKind::kPhysical: r.mask = parse_mask(text, "physical"); break;
    case RequestKind::kNone:
    case RequestKind::kAllTpcs: break;
  }
  return r;
}

SpecKind spec_kind(RequestKind kind) noexcept {
  switch (kind) {
    case RequestKind::kTpcMask: return SpecKind::kTpcMask;
    case RequestKind::kGpcList: return SpecKind::kGpcList;
    case RequestKind::kPhysical: return SpecKind::kPhysical;
    case RequestKind::kTpcList:
    case RequestKind::kCount:
    case RequestKind::kAllTpcs: return SpecKind::kTpcList;
    case RequestKind::kNone: break;
  }
  return SpecKind::kNone;
}

const char* form_name(SpecKind kind) noexcept {
  switch (kind) {
    case SpecKind::kTpcMask: return "TPC mask";
    case SpecKind::kGpcList: return "GPC list";
    case SpecKind::kPhysical: return "physical mask";
    default: return "TPC list";
  }
}

}  // namespace nvtaskset::planner
