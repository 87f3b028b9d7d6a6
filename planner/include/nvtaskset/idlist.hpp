// SPDX-License-Identifier: Apache-2.0
// taskset's cpu-list and mask syntax, for TPC and GPC IDs: what the CLI and
// the planner (request.hpp) parse a request with. Kept apart from the command
// line (as util-linux keeps cpuset.c apart from taskset.c) so it can be
// tested on its own, and linked by whoever plans partitions.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "nvtaskset/bits.hpp"

namespace nvtaskset {

// A user-input error; what() is one line, without the "nvtaskset: " prefix.
struct ParseError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Largest number a list may hold, as an ID or as a stride. Lists are
// validated against the device later; this bound is checked digit by digit,
// before any arithmetic, so no number in a list can overflow or wrap.
inline constexpr unsigned kMaxListId = 4095;
// Longest list or mask text, and most comma-separated elements in a list. A
// GPU has at most 128 TPCs, so anything longer is not a TPC or GPC list; the
// bounds keep a pasted megabyte from costing seconds before it is refused.
inline constexpr std::size_t kMaxListText = 4096;
inline constexpr std::size_t kMaxListElements = 1024;
// Largest PID Linux can hand out (PID_MAX_LIMIT on 64-bit kernels).
inline constexpr long kMaxPid = 4194304;

// Parses "0-7,12,20-31:2" (taskset's cpu-list syntax: comma-separated IDs or
// ranges a-b with an optional stride :s; decimal digits only, no signs or
// spaces). Every number, strides included, is at most kMaxListId. Returns the
// sorted, de-duplicated IDs. `what` names the IDs in messages ("TPC", "GPC").
// Runs in time linear in the text (plus a fixed kMaxListId-bit scan).
std::vector<unsigned> parse_list(std::string_view text, std::string_view what);

// Parses a hexadecimal enable mask, with or without "0x", of at most 128
// significant bits (leading zeros allowed, kMaxListText characters at most).
// Bit k set = ID k selected. A zero mask is an error.
Bits128 parse_mask(std::string_view text, std::string_view what);

// Parses a PID: decimal digits only (no sign, no spaces), 1..kMaxPid.
pid_t parse_pid(std::string_view text);

// Parses a TPC count (-n): decimal digits only, 1..128 (the most TPCs a mask
// holds); whether the GPU has that many is checked against the device.
unsigned parse_count(std::string_view text);

// `text` for an error message: control and non-ASCII bytes as \xNN, and cut
// to a few dozen characters (`shown`, then "..."), so that a message stays one
// short line.
inline constexpr std::size_t kPrintableShown = 48;
std::string printable(std::string_view text, std::size_t shown = kPrintableShown);

// Formats IDs as taskset prints them: "0-3,8,10-11" ("" when empty).
// (format_ranges in bits.hpp, the one formatter topology/ uses too.)
inline std::string format_list(const std::vector<unsigned>& ids) { return format_ranges(ids); }
inline std::string format_list(const Bits128& ids) { return format_ranges(ids); }

// IDs as a Bits128; throws ParseError when one is >= 128.
Bits128 to_bits(const std::vector<unsigned>& ids, std::string_view what);

// The command line's names for them (nvtaskset::cli had them first).
namespace cli {
using nvtaskset::format_list;
using nvtaskset::parse_count;
using nvtaskset::parse_list;
using nvtaskset::parse_mask;
using nvtaskset::parse_pid;
using nvtaskset::ParseError;
using nvtaskset::printable;
using nvtaskset::to_bits;
}  // namespace cli

}  // namespace nvtaskset
