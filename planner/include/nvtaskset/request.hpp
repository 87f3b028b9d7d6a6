// SPDX-License-Identifier: Apache-2.0
// One requested partition, parsed once: on which GPU, in which form the user
// gave it (a TPC list, a hex mask over TPC IDs, a GPC list, a count for the
// planner to choose, every TPC, or raw mask bits), and the parsed IDs. The
// form decides how the partition is planned (planner.hpp) and how `-p`
// shows it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/partition.hpp"

namespace nvtaskset::planner {

enum class RequestKind {
  kNone,      // no partition given: a -p query (of `device`)
  kTpcList,   // -t LIST
  kTpcMask,   // MASK: hex enable mask over logical TPC IDs
  kGpcList,   // -g LIST: every TPC of these GPCs
  kCount,     // -n COUNT: TPCs the planner chooses
  kAllTpcs,   // every TPC of the GPU (--best-effort without a list)
  kPhysical,  // --physical MASK: raw TMD mask bits, untranslated
};

struct Request {
  std::string device;  // "" = the default device
  RequestKind kind = RequestKind::kNone;
  std::string text;           // as given, for messages ("-n 16: ...")
  std::vector<unsigned> ids;  // kTpcList, kTpcMask: TPC IDs; kGpcList: GPC IDs (sorted, checked against
                              // the GPU only when planned)
  Bits128 mask;               // kPhysical: the raw bits
  unsigned count = 0;         // kCount

  // Whether it asks for a partition (anything but a query).
  bool changes() const noexcept { return kind != RequestKind::kNone; }
};

// Parses `text` as a request of `kind` for `device`: the syntax only (the
// GPU is not consulted). Throws ParseError (idlist.hpp) with a one-line
// reason. kNone and kAllTpcs take no text.
Request parse_request(std::string device, RequestKind kind, std::string_view text);

// The form a partition planned from a request of `kind` records, which is
// the form `-p` shows it in: a count and "every TPC" are TPC lists.
SpecKind spec_kind(RequestKind kind) noexcept;

// "TPC list", "TPC mask", "GPC list" or "physical mask": a form as messages
// and `-p` name it (kNone reads as a TPC list).
const char* form_name(SpecKind kind) noexcept;

}  // namespace nvtaskset::planner
