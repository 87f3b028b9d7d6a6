// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/idlist.hpp"

#include <bitset>
#include <cstdio>

namespace nvtaskset {

std::string printable(std::string_view text, std::size_t shown) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > shown) out += "...";
  return out;
}

namespace {

[[noreturn]] void fail(std::string_view what, std::string_view text, std::string_view why) {
  throw ParseError("invalid " + std::string(what) + " list '" + printable(text) + "': " + std::string(why));
}

[[noreturn]] void no_such_id(std::string_view what, std::string_view digits) {
  throw ParseError(std::string(what) + " " + printable(digits) + " does not exist (IDs go up to " +
                   std::to_string(kMaxListId) + " at most)");
}

// Parses the decimal number at the front of `s` into `out`, advancing `s`.
// Returns false when `s` does not start with a digit. Sets `too_big` (and
// leaves `out` above kMaxListId) when the number exceeds kMaxListId: the value
// stops growing once past the bound, so no digit string can overflow.
bool take_number(std::string_view& s, unsigned& out, std::string_view& digits) {
  std::size_t i = 0;
  unsigned v = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i)
    if (v <= kMaxListId) v = v * 10 + static_cast<unsigned>(s[i] - '0');  // <= 40959: no overflow
  if (i == 0) return false;
  out = v;
  digits = s.substr(0, i);
  s.remove_prefix(i);
  return true;
}

}  // namespace

std::vector<unsigned> parse_list(std::string_view text, std::string_view what) {
  if (text.empty()) fail(what, text, "empty");
  // Refused before any parsing: no TPC or GPC list is this long.
  if (text.size() > kMaxListText)
    fail(what, text, "longer than " + std::to_string(kMaxListText) + " characters");
  // Accumulated as a bitset: linear in the text, no allocation per ID, and
  // duplicates cost nothing (a vector + sort was quadratic in practice).
  std::bitset<kMaxListId + 1> ids;
  std::string_view rest = text;
  std::size_t elements = 0;
  for (;;) {
    if (++elements > kMaxListElements)
      fail(what, text, "more than " + std::to_string(kMaxListElements) + " elements");
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    if (item.empty()) fail(what, text, "empty element");
    const std::string_view whole = item;
    unsigned first = 0, last = 0, stride = 1;
    std::string_view digits;
    if (!take_number(item, first, digits)) fail(what, text, "'" + printable(whole) + "' is not a number or range");
    if (first > kMaxListId) no_such_id(what, digits);
    last = first;
    if (!item.empty() && item.front() == '-') {
      item.remove_prefix(1);
      if (!take_number(item, last, digits)) fail(what, text, "range without an end");
      if (last > kMaxListId) no_such_id(what, digits);
      if (!item.empty() && item.front() == ':') {
        item.remove_prefix(1);
        if (!take_number(item, stride, digits)) fail(what, text, "stride is not a number");
        if (stride > kMaxListId)
          fail(what, text, "stride " + printable(digits) + " is larger than " + std::to_string(kMaxListId));
        if (stride == 0) fail(what, text, "stride must be at least 1");
      }
    }
    if (!item.empty()) fail(what, text, "unexpected '" + printable(item) + "'");
    if (last < first) fail(what, text, "range " + std::to_string(first) + "-" + std::to_string(last) + " is reversed");
    // first <= last <= kMaxListId and stride <= kMaxListId: id + stride stays
    // below 2 * 4096, far from wrapping.
    for (unsigned id = first; id <= last; id += stride) ids.set(id);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::vector<unsigned> out;
  out.reserve(ids.count());
  for (unsigned id = 0; id <= kMaxListId; ++id)
    if (ids.test(id)) out.push_back(id);
  return out;
}

Bits128 parse_mask(std::string_view text, std::string_view what) {
  auto bad = [&](std::string_view why) {
    return ParseError("invalid " + std::string(what) + " mask '" + printable(text) + "': " + std::string(why));
  };
  if (text.size() > kMaxListText) throw bad("longer than " + std::to_string(kMaxListText) + " characters");
  std::string_view digits = text;
  if (digits.size() >= 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) digits.remove_prefix(2);
  if (digits.empty()) throw bad("no digits");
  Bits128 b;
  for (char c : digits) {
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    else throw bad("'" + printable(std::string_view(&c, 1)) + "' is not a hex digit");
    // The top nibble must be free before shifting, or bits would fall off.
    if (b.hi >> 60) throw bad("more than 128 bits");
    b.hi = (b.hi << 4) | (b.lo >> 60);
    b.lo = (b.lo << 4) | static_cast<unsigned>(v);
  }
  if (b.none()) throw bad("selects nothing");
  return b;
}

// A decimal number in [1, max]: digits only, bounded as they are read.
// strtol would accept " 12", "+12" and wrap "99999999999999999999" into
// errno. `what` names it in messages ("pid", "TPC count"); `zero` and `over`
// say why 0 and numbers above `max` are refused.
static long parse_positive(std::string_view text, long max, std::string_view what, std::string_view zero,
                    const std::string& over) {
  auto bad = [&](std::string_view why) {
    return ParseError("invalid " + std::string(what) + " '" + printable(text) + "': " + std::string(why));
  };
  if (text.empty()) throw bad("empty");
  long v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') throw bad("not a decimal number");
    if (v <= max) v = v * 10 + (c - '0');  // stops growing past the bound: no overflow
  }
  if (v == 0) throw bad(zero);
  if (v > max) throw bad(over);
  return v;
}

pid_t parse_pid(std::string_view text) {
  return static_cast<pid_t>(parse_positive(text, kMaxPid, "pid", "pid 0 is not a process",
                                           "larger than any pid (" + std::to_string(kMaxPid) + ")"));
}

unsigned parse_count(std::string_view text) {
  return static_cast<unsigned>(parse_positive(text, Bits128::kSize, "TPC count", "at least 1 TPC",
                                              "more than any GPU has (at most " + std::to_string(Bits128::kSize) +
                                                  ")"));
}

Bits128 to_bits(const std::vector<unsigned>& ids, std::string_view what) {
  Bits128 b;
  for (unsigned id : ids) {
    if (id >= Bits128::kSize)
      throw ParseError(std::string(what) + " " + std::to_string(id) + " does not exist (at most 128 are supported)");
    b.set(id);
  }
  return b;
}

}  // namespace nvtaskset
