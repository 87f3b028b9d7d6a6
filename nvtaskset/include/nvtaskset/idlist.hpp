// The parsing library of the CLI: taskset's cpu-list and mask syntax, for
// TPC and GPC IDs. Kept apart from main() (as util-linux keeps cpuset.c apart
// from taskset.c) so it can be tested on its own.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "nvtaskset/bits.hpp"

namespace nvtaskset::cli {

// A user-input error; what() is one line, without the "nvtaskset: " prefix.
struct ParseError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Largest ID a list may name. Lists are validated against the device later;
// this bound only keeps "0-4000000000" from allocating gigabytes.
inline constexpr unsigned kMaxListId = 4095;

// Parses "0-7,12,20-31:2" (taskset's cpu-list syntax: comma-separated IDs or
// ranges a-b with an optional stride :s). Returns the sorted, de-duplicated
// IDs. `what` names the IDs in messages ("TPC", "GPC").
std::vector<unsigned> parse_list(std::string_view text, std::string_view what);

// Parses a hexadecimal enable mask, with or without "0x", of at most 128
// significant bits. Bit k set = ID k selected. A zero mask is an error.
Bits128 parse_mask(std::string_view text, std::string_view what);

// Formats IDs as taskset prints them: "0-3,8,10-11" ("" when empty).
std::string format_list(const std::vector<unsigned>& ids);
std::string format_list(const Bits128& ids);

// IDs as a Bits128; throws ParseError when one is >= 128.
Bits128 to_bits(const std::vector<unsigned>& ids, std::string_view what);

}  // namespace nvtaskset::cli
