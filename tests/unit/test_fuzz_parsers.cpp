// SPDX-License-Identifier: Apache-2.0
// Seeded random tests of the parsers that read user input: TPC/GPC lists,
// hex masks, PIDs and topology files. They check meaning, not only survival:
// each list or mask is also decoded by a small reference written here, with
// no shared code, and the two must agree on accepting it and on the IDs.
//
// Deterministic: fixed seeds, std::mt19937_64 (whose output the standard
// fixes) reduced with %, and fixed iteration counts, so a failure reproduces
// on every machine. A failure prints the input (escaped) and the seed.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nvtaskset/idlist.hpp"
#include "nvtaskset/topology.hpp"
#include "nvtaskset/topology_json.hpp"

namespace {

using namespace nvtaskset;
using nlohmann::json;

// The documented limits (idlist.hpp), restated: the reference must not read
// them from the code under test.
constexpr std::size_t kRefMaxText = 4096;
constexpr std::size_t kRefMaxElements = 1024;
constexpr unsigned kRefMaxId = 4095;
constexpr long kRefMaxPid = 4194304;

// Stop reporting after this many mismatches: one bug gives thousands.
constexpr int kMaxReports = 8;

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  std::uint64_t operator()() { return g_(); }
  // 0 <= result < n.
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(g_() % n); }
  bool one_in(std::size_t n) { return below(n) == 0; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  std::mt19937_64 g_;
};

std::string escaped(std::string_view s, std::size_t max = 160) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

// An error message must be one short line.
::testing::AssertionResult IsOneLine(const std::string& msg) {
  if (msg.empty()) return ::testing::AssertionFailure() << "empty message";
  for (char c : msg)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return ::testing::AssertionFailure() << "control character in message: " << escaped(msg, 400);
  if (msg.size() > 400) return ::testing::AssertionFailure() << "message of " << msg.size() << " bytes";
  return ::testing::AssertionSuccess();
}

// --- the reference decoders ----------------------------------------------------

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Decimal value of a digit string, saturated far above every bound checked
// here (no overflow whatever the length: __int128 and an early cap).
__int128 decimal(std::string_view s) {
  __int128 v = 0;
  for (char c : s) {
    v = v * 10 + (c - '0');
    if (v > (__int128{1} << 100)) v = __int128{1} << 100;
  }
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    const auto at = s.find(sep);
    out.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return out;
    s.remove_prefix(at + 1);
  }
}

// taskset's list syntax, decoded the obvious way: nullopt = must be rejected.
std::optional<std::set<unsigned>> reference_list(std::string_view text) {
  if (text.empty() || text.size() > kRefMaxText) return std::nullopt;
  const auto elements = split(text, ',');
  if (elements.size() > kRefMaxElements) return std::nullopt;
  std::set<unsigned> ids;
  for (std::string_view e : elements) {
    const auto colon = split(e, ':');
    if (colon.size() > 2) return std::nullopt;
    const auto range = split(colon[0], '-');
    if (range.size() > 2) return std::nullopt;
    if (colon.size() == 2 && range.size() != 2) return std::nullopt;  // a stride needs a range
    for (auto part : range)
      if (!all_digits(part)) return std::nullopt;
    if (colon.size() == 2 && !all_digits(colon[1])) return std::nullopt;
    const __int128 first = decimal(range[0]);
    const __int128 last = range.size() == 2 ? decimal(range[1]) : first;
    const __int128 stride = colon.size() == 2 ? decimal(colon[1]) : 1;
    if (first > kRefMaxId || last > kRefMaxId || stride > kRefMaxId || stride < 1 || last < first)
      return std::nullopt;
    for (__int128 id = first; id <= last; id += stride) ids.insert(static_cast<unsigned>(id));
  }
  return ids;
}

// A hex mask of at most 128 significant bits, optional 0x, not zero.
std::optional<Bits128> reference_mask(std::string_view text) {
  if (text.size() > kRefMaxText) return std::nullopt;
  if (text.starts_with("0x") || text.starts_with("0X")) text.remove_prefix(2);
  if (text.empty()) return std::nullopt;
  std::string digits;
  for (char c : text) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
    if (digits.empty() && c == '0') continue;  // leading zero
    digits += c;
  }
  if (digits.empty() || digits.size() > 32) return std::nullopt;
  Bits128 b;
  // Nibble k from the right is bits 4k..4k+3.
  for (std::size_t k = 0; k < digits.size(); ++k) {
    const char c = digits[digits.size() - 1 - k];
    const unsigned v = static_cast<unsigned>(std::stoi(std::string(1, c), nullptr, 16));
    for (unsigned bit = 0; bit < 4; ++bit)
      if ((v >> bit) & 1) b.set(static_cast<unsigned>(4 * k + bit));
  }
  return b;
}

std::optional<long> reference_pid(std::string_view text) {
  if (!all_digits(text)) return std::nullopt;
  const __int128 v = decimal(text);
  if (v < 1 || v > kRefMaxPid) return std::nullopt;
  return static_cast<long>(v);
}

// --- generators ------------------------------------------------------------------

const std::vector<std::string> kNastyNumbers = {
    "18446744073709551615", "18446744073709551616", "4294967295", "4294967296", "2147483648", "4096", "4095",
    "4094", "40959", "65535", "65536", "99999999999999999999999999999", "0", "00", "0000000000000000000000001",
    "-1", "+1", "1e3", "0x10", "1.5", "", " 1", "1 ", "\t1", "1\n", "\xd9\xa3" /* Arabic-Indic 3 */, "١"};

std::string number(Rng& r) {
  switch (r.below(8)) {
    case 0: return r.pick(kNastyNumbers);
    case 1: return std::string(r.below(4), '0') + std::to_string(r.below(kRefMaxId + 1));  // leading zeros
    case 2: return std::to_string(kRefMaxId - r.below(3) + r.below(3));  // around the bound
    case 3: return std::to_string(r.below(128));
    default: return std::to_string(r.below(70));
  }
}

std::string list_element(Rng& r) {
  switch (r.below(10)) {
    case 0: return number(r);
    case 1: return number(r) + "-" + number(r) + ":" + number(r);
    case 2: {  // a stride near 2^64: the old wrap-around
      const unsigned a = static_cast<unsigned>(r.below(100));
      return std::to_string(a) + "-" + std::to_string(a + r.below(8)) + ":" +
             r.pick(std::vector<std::string>{"18446744073709551615", "18446744073709551614", "9223372036854775808",
                                             "4294967295", "4096", "4095"});
    }
    case 3: return r.pick(std::vector<std::string>{"", "-", ":", "-:", "1-", "-1", "1:", "1:2", "1-2:", "1--2",
                                                    "1-2-3", "1-2:3:4", "1-2::3", " ", ",", "a", "1-a", "0-7:0"});
    default: {
      const unsigned a = static_cast<unsigned>(r.below(130));
      const unsigned b = a + static_cast<unsigned>(r.below(40));
      std::string e = std::to_string(a);
      if (r.below(3)) e += "-" + std::to_string(b);
      if (r.below(3) == 0) e += ":" + std::to_string(1 + r.below(9));
      return e;
    }
  }
}

std::string mutate_text(Rng& r, std::string s, const std::string& alphabet) {
  const std::size_t edits = 1 + r.below(3);
  for (std::size_t i = 0; i < edits; ++i) {
    const char c = r.one_in(8) ? static_cast<char>(r.below(256)) : alphabet[r.below(alphabet.size())];
    const std::size_t at = s.empty() ? 0 : r.below(s.size() + 1);
    switch (r.below(3)) {
      case 0: s.insert(at, 1, c); break;
      case 1: if (at < s.size()) s.erase(at, 1); break;
      default: if (at < s.size()) s[at] = c; break;
    }
  }
  return s;
}

std::string random_list(Rng& r) {
  std::size_t n;
  switch (r.below(20)) {
    case 0: n = 0; break;
    case 1: n = kRefMaxElements - 1 + r.below(3); break;  // around the element limit
    case 2: n = 300 + r.below(900); break;                // around the length limit
    default: n = 1 + r.below(6); break;
  }
  std::string s;
  const bool simple = r.below(2);  // many short elements reach the limits
  for (std::size_t i = 0; i < n; ++i) {
    if (i) s += r.one_in(50) ? ",," : ",";
    s += simple && n > 100 ? std::to_string(r.below(10)) : list_element(r);
  }
  if (r.one_in(12)) s += ",";
  if (r.one_in(40)) s = std::string(r.below(5000), '0') + "1";  // a long number
  if (r.one_in(4)) s = mutate_text(r, s, "0123456789-:, +x\t\n");
  return s;
}

std::string random_mask(Rng& r) {
  static const std::string hex = "0123456789abcdefABCDEF";
  std::string s = r.below(3) ? "0x" : r.one_in(2) ? "0X" : "";
  s += std::string(r.one_in(6) ? r.below(kRefMaxText + 8) : r.below(3), '0');  // leading zeros, to the limit
  const std::size_t digits = r.one_in(5) ? 30 + r.below(5) : r.below(20);   // around 128 bits
  for (std::size_t i = 0; i < digits; ++i) s += hex[r.below(hex.size())];
  if (r.one_in(4)) s = mutate_text(r, s, "0123456789abcdefxX -+gG\n");
  return s;
}

std::string random_pid(Rng& r) {
  std::string s;
  switch (r.below(5)) {
    case 0: s = r.pick(kNastyNumbers); break;
    case 1: s = std::to_string(kRefMaxPid - 2 + static_cast<long>(r.below(5))); break;
    case 2: s = std::to_string(r()); break;
    default: s = std::to_string(r.below(100000)); break;
  }
  if (r.one_in(4)) s = mutate_text(r, s, "0123456789 +-x\n");
  return s;
}

// --- lists, masks, PIDs --------------------------------------------------------------

TEST(FuzzParsers, ListsAgreeWithTheReference) {
  constexpr std::uint64_t kSeed = 0x6c697374;
  Rng r(kSeed);
  int reports = 0, accepted = 0, rejected = 0;
  for (int i = 0; i < 30000 && reports < kMaxReports; ++i) {
    const std::string text = i == 0 ? "50-53:18446744073709551615" : random_list(r);
    const auto want = reference_list(text);
    std::optional<std::vector<unsigned>> got;
    std::string error;
    try {
      got = cli::parse_list(text, "TPC");
    } catch (const cli::ParseError& e) {
      error = e.what();
    }
    if (want.has_value() != got.has_value() ||
        (want && std::vector<unsigned>(want->begin(), want->end()) != *got)) {
      ++reports;
      ADD_FAILURE() << "seed " << kSeed << " iteration " << i << ": '" << escaped(text) << "'\n  reference: "
                    << (want ? "{" + cli::format_list(std::vector<unsigned>(want->begin(), want->end())) + "}"
                             : std::string("rejected"))
                    << "\n  parse_list: " << (got ? "{" + cli::format_list(*got) + "}" : "rejected: " + error);
      continue;
    }
    if (got) {
      ++accepted;
    } else {
      ++rejected;
      EXPECT_TRUE(IsOneLine(error)) << "'" << escaped(text) << "'";
    }
  }
  // The generator must exercise both sides, or the comparison proves little.
  std::printf("lists: %d accepted, %d rejected\n", accepted, rejected);
  EXPECT_GT(accepted, 4000);
  EXPECT_GT(rejected, 15000);
}

TEST(FuzzParsers, MasksAgreeWithTheReference) {
  constexpr std::uint64_t kSeed = 0x6d61736b;
  Rng r(kSeed);
  int reports = 0, accepted = 0, rejected = 0;
  for (int i = 0; i < 30000 && reports < kMaxReports; ++i) {
    const std::string text = random_mask(r);
    const auto want = reference_mask(text);
    std::optional<Bits128> got;
    std::string error;
    try {
      got = cli::parse_mask(text, "TPC");
    } catch (const cli::ParseError& e) {
      error = e.what();
    }
    if (want.has_value() != got.has_value() || (want && *want != *got)) {
      ++reports;
      ADD_FAILURE() << "seed " << kSeed << " iteration " << i << ": '" << escaped(text)
                    << "'\n  reference: " << (want ? want->to_hex() : std::string("rejected"))
                    << "\n  parse_mask: " << (got ? got->to_hex() : "rejected: " + error);
      continue;
    }
    if (got) {
      ++accepted;
    } else {
      ++rejected;
      EXPECT_TRUE(IsOneLine(error)) << "'" << escaped(text) << "'";
    }
  }
  std::printf("masks: %d accepted, %d rejected\n", accepted, rejected);
  EXPECT_GT(accepted, 15000);
  EXPECT_GT(rejected, 4000);
}

TEST(FuzzParsers, PidsAgreeWithTheReference) {
  constexpr std::uint64_t kSeed = 0x706964;
  Rng r(kSeed);
  int reports = 0, accepted = 0, rejected = 0;
  for (int i = 0; i < 10000 && reports < kMaxReports; ++i) {
    const std::string text = random_pid(r);
    const auto want = reference_pid(text);
    std::optional<long> got;
    std::string error;
    try {
      got = cli::parse_pid(text);
    } catch (const cli::ParseError& e) {
      error = e.what();
    }
    if (want != got) {
      ++reports;
      ADD_FAILURE() << "seed " << kSeed << " iteration " << i << ": '" << escaped(text) << "'\n  reference: "
                    << (want ? std::to_string(*want) : "rejected")
                    << "\n  parse_pid: " << (got ? std::to_string(*got) : "rejected: " + error);
      continue;
    }
    got ? ++accepted : ++rejected;
    if (!got) EXPECT_TRUE(IsOneLine(error)) << "'" << escaped(text) << "'";
  }
  std::printf("pids: %d accepted, %d rejected\n", accepted, rejected);
  EXPECT_GT(accepted, 3000);
  EXPECT_GT(rejected, 3000);
}

// --- topology files ------------------------------------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json random_value(Rng& r) {
  switch (r.below(12)) {
    case 0: return nullptr;
    case 1: return r.one_in(2);
    case 2: return -static_cast<std::int64_t>(r.below(1000)) - 1;
    case 3: return r();  // up to 2^64-1
    case 4: return std::numeric_limits<std::int64_t>::min();
    case 5: return static_cast<double>(r.below(1000)) / 7.0;
    case 6: return r.pick(std::vector<std::string>{"", "9.0", "10.0", "99.99", "GPU-\n", "x\ty", "nvtaskset-topology/1",
                                                   "GPU-00000000-0000-0000-0000-000000000000", "\x01\x7f"});
    case 7: return json::array();
    case 8: return json::object();
    case 9: return json::array({r.below(70), r.below(70), r.below(70)});
    default: return r.below(140);  // plausible IDs, bits, counts
  }
}

// Replaces, removes or adds one thing somewhere in `j`.
void mutate_json(Rng& r, json& j) {
  json* node = &j;
  // Walk down a random path, stopping at a random depth.
  while (node->is_structured() && !node->empty() && !r.one_in(4)) {
    json& next = node->is_object() ? std::next(node->begin(), static_cast<long>(r.below(node->size())))
                                         .value()
                                   : (*node)[r.below(node->size())];
    if (!next.is_structured() || r.one_in(3)) {
      // Act on `next` as a child of `node`.
      switch (r.below(4)) {
        case 0:
          next = random_value(r);
          return;
        case 1:  // remove it
          if (node->is_object()) {
            const std::string key = std::next(node->begin(), static_cast<long>(r.below(node->size()))).key();
            node->erase(key);
          } else {
            node->erase(r.below(node->size()));
          }
          return;
        case 2:  // duplicate an array element (TPC or GPC listed twice)
          if (node->is_array()) node->push_back(next);
          else next = random_value(r);
          return;
        default:
          if (next.is_number_integer())  // off by one, wrapping in unsigned arithmetic (no signed overflow)
            next = static_cast<std::int64_t>(static_cast<std::uint64_t>(next.get<std::int64_t>()) +
                                             (r.one_in(2) ? 1u : ~std::uint64_t{0}));
          else next = random_value(r);
          return;
      }
    }
    node = &next;
  }
  if (node->is_object()) (*node)[r.pick(std::vector<std::string>{"extra", "bit", "gpc", "tpcs", "devices"})] =
      random_value(r);
  else if (node->is_array()) node->push_back(random_value(r));
}

std::string mutate_bytes(Rng& r, std::string s) {
  static const std::string alphabet = "{}[]\":,0123456789-.eE+ tfnul\\\n";
  const std::size_t edits = 1 + r.below(4);
  for (std::size_t e = 0; e < edits && !s.empty(); ++e) {
    const std::size_t at = r.below(s.size());
    const char c = r.one_in(6) ? static_cast<char>(r.below(256)) : alphabet[r.below(alphabet.size())];
    switch (r.below(5)) {
      case 0: s[at] = c; break;
      case 1: s.insert(at, 1, c); break;
      case 2: s.erase(at, 1 + r.below(8)); break;
      case 3: s.resize(at); break;  // truncated
      default: {                    // a span copied elsewhere (repeated keys, nested garbage)
        const std::size_t len = 1 + r.below(std::min<std::size_t>(40, s.size() - at));
        s.insert(r.below(s.size() + 1), s.substr(at, len));
        break;
      }
    }
  }
  return s;
}

TEST(FuzzParsers, TopologyFilesRejectCleanlyOrValidate) {
  constexpr std::uint64_t kSeed = 0x746f706f;
  const std::string data = std::string(NVTASKSET_TEST_DATA_DIR) + "/topology/";
  std::vector<std::string> originals;
  for (const char* f : {"h200.json", "a100.json", "two_gpus.json"}) {
    originals.push_back(slurp(data + f));
    ASSERT_FALSE(originals.back().empty()) << f;
    ASSERT_NO_THROW(topo::topologies_from_text(originals.back())) << f << " must be valid to start from";
  }
  Rng r(kSeed);
  int reports = 0, accepted = 0, rejected = 0;
  for (int i = 0; i < 2500 && reports < kMaxReports; ++i) {
    const std::string& original = r.pick(originals);
    std::string text;
    if (r.below(3)) {
      // Structural: valid JSON with a wrong value, a missing or an extra
      // field, reaching the schema checks behind the JSON syntax.
      json j = json::parse(original);
      for (std::size_t k = 1 + r.below(3); k > 0; --k) mutate_json(r, j);
      text = j.dump(r.one_in(2) ? 2 : -1);
    } else {
      text = mutate_bytes(r, original);
    }
    try {
      const std::vector<topo::Topology> topos = topo::topologies_from_text(text);
      ++accepted;
      ASSERT_FALSE(topos.empty());
      for (const auto& t : topos) {
        // What was accepted must hold up: its own validation, and the same
        // topology after writing and reading it again.
        EXPECT_NO_THROW(topo::validate(t)) << "iteration " << i;
        EXPECT_EQ(t.tpcs.size(), t.device.sm_count / 2);
        const json again = topo::topology_to_json(t);
        std::vector<topo::Topology> back;
        EXPECT_NO_THROW(back = topo::topologies_from_text(again.dump())) << "iteration " << i;
        if (back.size() == 1) {
          EXPECT_EQ(topo::topology_to_json(back[0]), again) << "iteration " << i;
        }
      }
    } catch (const std::runtime_error& e) {
      ++rejected;
      if (!IsOneLine(e.what())) {
        ++reports;
        ADD_FAILURE() << "seed " << kSeed << " iteration " << i << ": " << IsOneLine(e.what()).message()
                      << "\n  input: " << escaped(text, 2000);
      }
    } catch (const std::exception& e) {
      // Anything but the documented std::runtime_error (a json::type_error,
      // std::out_of_range...) is a check the loader forgot.
      ++reports;
      ADD_FAILURE() << "seed " << kSeed << " iteration " << i << ": unexpected exception: " << e.what()
                    << "\n  input: " << escaped(text, 2000);
    }
  }
  // Every byte mutation of these files is rejected, and most structural ones;
  // some (a changed name, an extra unknown key) are harmless and accepted.
  std::printf("topology files: %d accepted, %d rejected\n", accepted, rejected);
  EXPECT_GT(accepted, 120);
  EXPECT_GT(rejected, 1800);
}

}  // namespace
