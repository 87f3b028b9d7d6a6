// SPDX-License-Identifier: Apache-2.0
// Editing the TPC-disable mask of a Task Metadata Descriptor (TMD, a.k.a. QMD).
//
// Layouts, from NVIDIA open-gpu-doc classes/compute/cl*qmd.h and
// docs/hardware.md. A SET bit DISABLES a TPC.
//   V01_06..V03_xx (Kepler2..Ada): version byte 72 in [0x16, 0x40);
//       mask words at bytes 84 (bits 0-31) and 88 (bits 32-63).
//   V04_00 (Hopper): byte 72 == 0x40; mask words at bytes 304, 308, 312, 316;
//       TPC_DISABLE_MASK_VALID is bit 31 of 32-bit word 0 (clcbc0qmd.h MW(31:31)).
//   V05_00/V05_01 (Blackwell): byte 58 == 0x50 (byte 72 reads 0); mask words
//       at bytes 280, 284, 288, 292; valid bit is bit 31 of 32-bit word 4.
//       From the headers only: no Blackwell GPU was available to test.
// This header is used by the launch callback: everything here is allocation-
// free, lock-free and syscall-free.
#pragma once

#include <cstdint>
#include <cstring>

#include "nvtaskset/bits.hpp"

namespace nvtaskset::tmd {

enum class Layout : std::uint8_t { kUnknown = 0, kV01toV03 = 1, kV04 = 2, kV05 = 3 };

// Bytes that must be readable for detection and editing of every layout.
inline constexpr std::size_t kMinTmdBytes = 320;

inline std::uint32_t load32(const unsigned char* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian hosts only (x86-64, aarch64)
  return v;
}
inline void store32(unsigned char* p, std::uint32_t v) noexcept { std::memcpy(p, &v, 4); }

// The bytes that identify a layout. The launch callback reads them exactly
// once per TMD: the TMD may sit in memory the CPU reads slowly.
struct VersionBytes {
  std::uint8_t v72 = 0;  // QMD major/minor version nibbles on V01..V04
  std::uint8_t v58 = 0;  // the same on V05 (read only when byte 72 is 0)
};

inline VersionBytes read_version(const void* tmd) noexcept {
  const auto* b = static_cast<const volatile unsigned char*>(tmd);
  VersionBytes v;
  v.v72 = b[72];
  if (v.v72 == 0) v.v58 = b[58];
  return v;
}

// The QMD version byte used for detection (byte 72, or byte 58 on V05).
constexpr std::uint32_t version_byte(VersionBytes v) noexcept { return v.v72 ? v.v72 : v.v58; }
inline std::uint32_t version_byte(const void* tmd) noexcept { return version_byte(read_version(tmd)); }

constexpr Layout detect(VersionBytes v) noexcept {
  if (v.v72 >= 0x16 && v.v72 < 0x40) return Layout::kV01toV03;
  if (v.v72 == 0x40) return Layout::kV04;
  if (v.v72 == 0 && (v.v58 == 0x50 || v.v58 == 0x51)) return Layout::kV05;
  return Layout::kUnknown;
}
inline Layout detect(const void* tmd) noexcept { return detect(read_version(tmd)); }

// Number of mask bits a layout can express.
constexpr unsigned mask_bits(Layout l) noexcept {
  return l == Layout::kV01toV03 ? 64 : (l == Layout::kV04 || l == Layout::kV05) ? 128 : 0;
}

// Writes `disable` into the TMD's mask. Returns false (and writes nothing)
// for an unknown layout.
inline bool write_disable_mask(void* tmd, Layout layout, const Bits128& disable) noexcept {
  auto* b = static_cast<unsigned char*>(tmd);
  const std::uint32_t w[4] = {static_cast<std::uint32_t>(disable.lo),
                              static_cast<std::uint32_t>(disable.lo >> 32),
                              static_cast<std::uint32_t>(disable.hi),
                              static_cast<std::uint32_t>(disable.hi >> 32)};
  switch (layout) {
    case Layout::kV01toV03:
      store32(b + 84, w[0]);
      store32(b + 88, w[1]);
      return true;
    case Layout::kV04:
      for (int i = 0; i < 4; ++i) store32(b + 304 + 4 * i, w[i]);
      store32(b + 0, load32(b + 0) | 0x80000000u);
      return true;
    case Layout::kV05:
      for (int i = 0; i < 4; ++i) store32(b + 280 + 4 * i, w[i]);
      store32(b + 16, load32(b + 16) | 0x80000000u);
      return true;
    case Layout::kUnknown:
      break;
  }
  return false;
}

// Thread-block cluster shape (GPC_CGA_WIDTH/HEIGHT/DEPTH, 6 bits each, one
// byte apart), from NVIDIA open-gpu-doc:
//   V04_00 (clcbc0qmd.h): MW(2149:2144), MW(2157:2152), MW(2165:2160) =
//       low 6 bits of bytes 268, 269, 270. Checked on an H200 (docs/hardware.md):
//       0 0 0 without clusters; 2/4/8/16 1 1 for clusters of 2..16 along x.
//   V05_00 (clcdc0qmd.h): MW(2053:2048), MW(2061:2056), MW(2069:2064) =
//       bytes 256, 257, 258. From the header only (no Blackwell GPU here).
// V05_01 does not declare the fields: its shape is unknown.
inline constexpr std::size_t kClusterOffsetV04 = 268;
inline constexpr std::size_t kClusterOffsetV05 = 256;
// Returned when a layout's cluster shape is not known.
inline constexpr std::uint32_t kClusterShapeUnknown = 0xffffffffu;

// Blocks per cluster (width x height x depth; 0 when the kernel has no
// clusters), or kClusterShapeUnknown. Reads 3 bytes: callback-safe.
inline std::uint32_t cluster_blocks(const void* tmd, Layout layout, VersionBytes v) noexcept {
  std::size_t off;
  if (layout == Layout::kV04) off = kClusterOffsetV04;
  else if (layout == Layout::kV05 && v.v58 == 0x50) off = kClusterOffsetV05;
  else if (layout == Layout::kV01toV03) return 0;  // no clusters before Hopper
  else return kClusterShapeUnknown;
  const auto* b = static_cast<const volatile unsigned char*>(tmd);
  const std::uint32_t w = b[off] & 0x3fu, h = b[off + 1] & 0x3fu, d = b[off + 2] & 0x3fu;
  if (w == 0 && h == 0 && d == 0) return 0;
  return (w ? w : 1) * (h ? h : 1) * (d ? d : 1);
}

// Writes a cluster shape (for the stand-in driver and tests).
inline void write_cluster_shape(void* tmd, Layout layout, unsigned w, unsigned h, unsigned d) noexcept {
  const std::size_t off = layout == Layout::kV04 ? kClusterOffsetV04 : kClusterOffsetV05;
  if (layout != Layout::kV04 && layout != Layout::kV05) return;
  auto* b = static_cast<unsigned char*>(tmd);
  b[off] = static_cast<unsigned char>(w & 0x3f);
  b[off + 1] = static_cast<unsigned char>(h & 0x3f);
  b[off + 2] = static_cast<unsigned char>(d & 0x3f);
}

// Reads the mask back (for tests and the stand-in driver).
inline Bits128 read_disable_mask(const void* tmd, Layout layout) noexcept {
  const auto* b = static_cast<const unsigned char*>(tmd);
  auto pack = [&](std::size_t off, unsigned words) {
    Bits128 m;
    std::uint32_t w[4] = {};
    for (unsigned i = 0; i < words; ++i) w[i] = load32(b + off + 4 * i);
    m.lo = w[0] | (std::uint64_t{w[1]} << 32);
    m.hi = w[2] | (std::uint64_t{w[3]} << 32);
    return m;
  };
  switch (layout) {
    case Layout::kV01toV03: return pack(84, 2);
    case Layout::kV04: return pack(304, 4);
    case Layout::kV05: return pack(280, 4);
    case Layout::kUnknown: break;
  }
  return {};
}

// Whether the layout's mask-valid bit is set (true for layouts without one).
inline bool mask_valid(const void* tmd, Layout layout) noexcept {
  const auto* b = static_cast<const unsigned char*>(tmd);
  if (layout == Layout::kV04) return load32(b + 0) >> 31;
  if (layout == Layout::kV05) return load32(b + 16) >> 31;
  return layout != Layout::kUnknown;
}

}  // namespace nvtaskset::tmd
