// SPDX-License-Identifier: Apache-2.0
// Vocabulary types shared by every layer of nvtaskset.
//
// Three different numberings meet in this project and must never be mixed up:
//   * a logical TPC ID k names the SMs whose %smid (outside MPS) is 2k and 2k+1;
//   * a physical TPC bit is a bit position in the TMD's TPC-disable mask. Before
//     Hopper it equals the logical TPC ID; on Hopper (QMD V04) it is a physical
//     TPC slot, floorswept slots included (docs/hardware.md);
//   * an SM ID is what %smid reports.
// Each gets its own strong type; sets of them are 128-bit because the widest
// TMD mask (Hopper, Blackwell) has 128 bits.
#pragma once

#include <bit>
#include <compare>
#include <cstdint>
#include <string>
#include <vector>

namespace nvtaskset {

// A plain 128-bit set. Bit i lives in w[i / 64].
struct Bits128 {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;

  static constexpr unsigned kSize = 128;

  constexpr bool test(unsigned i) const noexcept {
    return i < 64 ? (lo >> i) & 1u : i < 128 ? (hi >> (i - 64)) & 1u : false;
  }
  constexpr void set(unsigned i, bool v = true) noexcept {
    if (i >= 128) return;
    std::uint64_t& w = i < 64 ? lo : hi;
    const std::uint64_t b = std::uint64_t{1} << (i % 64);
    w = v ? (w | b) : (w & ~b);
  }
  constexpr unsigned count() const noexcept {
    return static_cast<unsigned>(std::popcount(lo) + std::popcount(hi));
  }
  constexpr bool none() const noexcept { return (lo | hi) == 0; }
  constexpr bool any() const noexcept { return !none(); }
  // Index of the highest set bit + 1 (0 when empty).
  constexpr unsigned width() const noexcept {
    return hi ? 128u - static_cast<unsigned>(std::countl_zero(hi))
              : 64u - static_cast<unsigned>(std::countl_zero(lo));
  }
  // The first n bits set (n <= 128).
  static constexpr Bits128 first(unsigned n) noexcept {
    Bits128 b;
    b.lo = n >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
    b.hi = n >= 128 ? ~std::uint64_t{0} : n > 64 ? (std::uint64_t{1} << (n - 64)) - 1 : 0;
    return b;
  }
  constexpr Bits128 operator|(Bits128 o) const noexcept { return {lo | o.lo, hi | o.hi}; }
  constexpr Bits128 operator&(Bits128 o) const noexcept { return {lo & o.lo, hi & o.hi}; }
  constexpr Bits128 operator^(Bits128 o) const noexcept { return {lo ^ o.lo, hi ^ o.hi}; }
  constexpr Bits128 operator~() const noexcept { return {~lo, ~hi}; }
  constexpr bool operator==(const Bits128&) const noexcept = default;

  // Set bit indices in increasing order.
  std::vector<unsigned> indices() const;
  // "0x" followed by minimal lowercase hex ("0x0" when empty).
  std::string to_hex() const;
};

// "0-3,8,10-11": IDs as taskset prints a cpu list (sorted, duplicates
// dropped; "" when empty). The one list formatter of the CLI and topology/
// (the launch callback has its own, which allocates nothing).
std::string format_ranges(std::vector<unsigned> ids);
inline std::string format_ranges(const Bits128& ids) { return format_ranges(ids.indices()); }

// A Bits128 whose bit positions mean one kind of ID.
template <class Id>
struct IdSet {
  Bits128 bits;

  constexpr bool contains(Id id) const noexcept { return bits.test(id.value); }
  constexpr void insert(Id id) noexcept { bits.set(id.value); }
  constexpr void erase(Id id) noexcept { bits.set(id.value, false); }
  constexpr unsigned size() const noexcept { return bits.count(); }
  constexpr bool empty() const noexcept { return bits.none(); }
  std::vector<Id> ids() const {
    std::vector<Id> out;
    for (unsigned i : bits.indices()) out.push_back(Id{i});
    return out;
  }
  constexpr bool operator==(const IdSet&) const noexcept = default;
};

// Strong integer IDs: constructing one says what the number means.
template <class Tag>
struct StrongId {
  unsigned value = 0;
  constexpr StrongId() = default;
  constexpr explicit StrongId(unsigned v) : value(v) {}
  constexpr auto operator<=>(const StrongId&) const = default;
};

using LogicalTpcId = StrongId<struct LogicalTpcTag>;
using PhysicalTpcBit = StrongId<struct PhysicalTpcTag>;
using GpcId = StrongId<struct GpcTag>;
using SmId = StrongId<struct SmTag>;

// Logical TPCs a task may use.
using LogicalTpcSet = IdSet<LogicalTpcId>;
// TMD mask bits a task may use (an ENABLE set; the TMD stores its complement).
using PhysicalTpcMask = IdSet<PhysicalTpcBit>;
using GpcSet = IdSet<GpcId>;

// The SMs of logical TPC k are 2k and 2k+1 (docs/hardware.md; true for every NVIDIA
// GPU since Volta, where a TPC holds two SMs).
constexpr SmId first_sm_of(LogicalTpcId t) { return SmId{2 * t.value}; }
constexpr LogicalTpcId tpc_of_sm(SmId s) { return LogicalTpcId{s.value / 2}; }

}  // namespace nvtaskset
