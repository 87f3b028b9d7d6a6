#include "nvtaskset/idlist.hpp"

#include <algorithm>
#include <charconv>

namespace nvtaskset::cli {
namespace {

[[noreturn]] void fail(std::string_view what, std::string_view text, std::string_view why) {
  throw ParseError("invalid " + std::string(what) + " list '" + std::string(text) + "': " + std::string(why));
}

// Parses a decimal number at the front of `s`, advancing it.
bool take_number(std::string_view& s, unsigned long& out) {
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  if (ec != std::errc() || ptr == s.data()) return false;
  s.remove_prefix(static_cast<std::size_t>(ptr - s.data()));
  return true;
}

}  // namespace

std::vector<unsigned> parse_list(std::string_view text, std::string_view what) {
  if (text.empty()) fail(what, text, "empty");
  std::vector<unsigned> ids;
  std::string_view rest = text;
  for (;;) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    if (item.empty()) fail(what, text, "empty element");
    unsigned long first = 0, last = 0, stride = 1;
    if (!take_number(item, first)) fail(what, text, "'" + std::string(item) + "' is not a number or range");
    last = first;
    if (!item.empty() && item.front() == '-') {
      item.remove_prefix(1);
      if (!take_number(item, last)) fail(what, text, "range without an end");
      if (!item.empty() && item.front() == ':') {
        item.remove_prefix(1);
        if (!take_number(item, stride)) fail(what, text, "stride is not a number");
        if (stride == 0) fail(what, text, "stride must be at least 1");
      }
    }
    if (!item.empty()) fail(what, text, "unexpected '" + std::string(item) + "'");
    if (last < first) fail(what, text, "range " + std::to_string(first) + "-" + std::to_string(last) + " is reversed");
    if (last > kMaxListId)
      throw ParseError(std::string(what) + " " + std::to_string(last) + " does not exist (IDs go up to " +
                       std::to_string(kMaxListId) + " at most)");
    for (unsigned long id = first; id <= last; id += stride) ids.push_back(static_cast<unsigned>(id));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Bits128 parse_mask(std::string_view text, std::string_view what) {
  std::string_view digits = text;
  if (digits.size() >= 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) digits.remove_prefix(2);
  if (digits.empty()) throw ParseError("invalid " + std::string(what) + " mask '" + std::string(text) + "': no digits");
  Bits128 b;
  for (char c : digits) {
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    else throw ParseError("invalid " + std::string(what) + " mask '" + std::string(text) + "': '" + std::string(1, c) +
                          "' is not a hex digit");
    if (b.hi >> 60)
      throw ParseError("invalid " + std::string(what) + " mask '" + std::string(text) + "': more than 128 bits");
    b.hi = (b.hi << 4) | (b.lo >> 60);
    b.lo = (b.lo << 4) | static_cast<unsigned>(v);
  }
  if (b.none()) throw ParseError("invalid " + std::string(what) + " mask '" + std::string(text) + "': selects nothing");
  return b;
}

std::string format_list(const std::vector<unsigned>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ids[i]);
    if (j > i) out += '-' + std::to_string(ids[j]);
    i = j + 1;
  }
  return out;
}

std::string format_list(const Bits128& ids) { return format_list(ids.indices()); }

Bits128 to_bits(const std::vector<unsigned>& ids, std::string_view what) {
  Bits128 b;
  for (unsigned id : ids) {
    if (id >= Bits128::kSize)
      throw ParseError(std::string(what) + " " + std::to_string(id) + " does not exist (at most 128 are supported)");
    b.set(id);
  }
  return b;
}

}  // namespace nvtaskset::cli
