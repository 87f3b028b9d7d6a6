// SPDX-License-Identifier: Apache-2.0
// TMD (QMD) mask editing on synthetic images of every layout (tmd.hpp).
// Offsets come from NVIDIA open-gpu-doc classes/compute/cl*qmd.h, as listed in
// docs/hardware.md; the tests restate them independently of
// tmd.hpp so a wrong constant there cannot pass.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "nvtaskset/tmd.hpp"

namespace nvtaskset::tmd {
namespace {

constexpr std::size_t kImageBytes = 512;  // larger than any TMD (V05: 384)
using Image = std::array<unsigned char, kImageBytes>;

struct LayoutCase {
  const char* name;
  unsigned char byte72;
  unsigned char byte58;
  Layout layout;
  std::size_t mask_off;   // first mask word
  unsigned mask_words;    // 32-bit words
  int valid_byte;         // byte holding the valid bit (bit 7), -1 when none
};

const LayoutCase kCases[] = {
    {"V01_06", 0x16, 0x00, Layout::kV01toV03, 84, 2, -1},
    {"V02_02", 0x22, 0x00, Layout::kV01toV03, 84, 2, -1},
    {"V03_00", 0x30, 0x00, Layout::kV01toV03, 84, 2, -1},
    {"V03_last", 0x3f, 0x00, Layout::kV01toV03, 84, 2, -1},
    // V04_00: TPC_DISABLE_MASK_VALID is bit 31 of 32-bit word 0 -> byte 3, bit 7.
    {"V04_00", 0x40, 0x00, Layout::kV04, 304, 4, 3},
    // V05: valid bit is bit 31 of 32-bit word 4 -> byte 19, bit 7.
    {"V05_00", 0x00, 0x50, Layout::kV05, 280, 4, 19},
    {"V05_01", 0x00, 0x51, Layout::kV05, 280, 4, 19},
};

// A recognisable background: every byte differs from its neighbours, and the
// valid bits start cleared so setting them is observable.
Image make_image(unsigned char byte72, unsigned char byte58) {
  Image img;
  for (std::size_t i = 0; i < img.size(); ++i) img[i] = static_cast<unsigned char>(i * 37 + 11);
  img[3] &= 0x7f;
  img[19] &= 0x7f;
  img[72] = byte72;
  img[58] = byte58;
  return img;
}

bool in_mask(const LayoutCase& c, std::size_t i) { return i >= c.mask_off && i < c.mask_off + 4 * c.mask_words; }

std::uint32_t word_at(const Image& img, std::size_t off) {
  return img[off] | (img[off + 1] << 8) | (img[off + 2] << 16) | (std::uint32_t{img[off + 3]} << 24);
}

TEST(Tmd, DetectsEveryKnownLayout) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    const Image img = make_image(c.byte72, c.byte58);
    EXPECT_EQ(detect(img.data()), c.layout);
    EXPECT_EQ(version_byte(img.data()), c.byte72 ? c.byte72 : c.byte58);
  }
}

TEST(Tmd, UnknownLayoutsAreNotGuessed) {
  struct U {
    unsigned char b72, b58;
  };
  // 0x10: V01_00 (pre-V01_06); 0x06: V00_06 (Kepler1, cannot mask); 0x41:
  // a future V04 minor with unknown offsets; 0x60: a future major; 0x52:
  // an unknown V05 minor; all zero: not a TMD.
  for (const U u : {U{0x10, 0}, U{0x06, 0}, U{0x41, 0}, U{0x60, 0}, U{0x00, 0x52}, U{0x00, 0x40}, U{0, 0}}) {
    SCOPED_TRACE(testing::Message() << "byte72=0x" << std::hex << int{u.b72} << " byte58=0x" << int{u.b58});
    Image img = make_image(u.b72, u.b58);
    EXPECT_EQ(detect(img.data()), Layout::kUnknown);
    const Image before = img;
    EXPECT_FALSE(write_disable_mask(img.data(), Layout::kUnknown, Bits128{~0ull, ~0ull}));
    EXPECT_EQ(img, before) << "an unknown layout must be left untouched";
    EXPECT_TRUE(read_disable_mask(img.data(), Layout::kUnknown).none());
    EXPECT_FALSE(mask_valid(img.data(), Layout::kUnknown));
  }
}

TEST(Tmd, ByteSeventyTwoWinsOverByteFiftyEight) {
  // A pre-Blackwell TMD whose byte 58 happens to read 0x50 is still V04.
  const Image img = make_image(0x40, 0x50);
  EXPECT_EQ(detect(img.data()), Layout::kV04);
}

TEST(Tmd, MaskBits) {
  EXPECT_EQ(mask_bits(Layout::kV01toV03), 64u);
  EXPECT_EQ(mask_bits(Layout::kV04), 128u);
  EXPECT_EQ(mask_bits(Layout::kV05), 128u);
  EXPECT_EQ(mask_bits(Layout::kUnknown), 0u);
}

TEST(Tmd, WriteReadBackAndNothingElse) {
  const Bits128 mask{0x0123456789abcdefull, 0xfedcba9876543210ull};
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    Image img = make_image(c.byte72, c.byte58);
    const Image before = img;
    if (c.valid_byte >= 0) EXPECT_FALSE(mask_valid(img.data(), c.layout));

    ASSERT_TRUE(write_disable_mask(img.data(), c.layout, mask));

    // Read back through the header and straight from the documented offsets.
    const Bits128 expect = c.mask_words == 2 ? Bits128{mask.lo, 0} : mask;
    EXPECT_EQ(read_disable_mask(img.data(), c.layout), expect);
    EXPECT_EQ(word_at(img, c.mask_off), 0x89abcdefu);
    EXPECT_EQ(word_at(img, c.mask_off + 4), 0x01234567u);
    if (c.mask_words == 4) {
      EXPECT_EQ(word_at(img, c.mask_off + 8), 0x76543210u);
      EXPECT_EQ(word_at(img, c.mask_off + 12), 0xfedcba98u);
    }
    EXPECT_TRUE(mask_valid(img.data(), c.layout));

    for (std::size_t i = 0; i < img.size(); ++i) {
      if (in_mask(c, i)) continue;
      if (static_cast<int>(i) == c.valid_byte) {
        EXPECT_EQ(img[i], before[i] | 0x80) << "only the valid bit may change in byte " << i;
        continue;
      }
      EXPECT_EQ(img[i], before[i]) << "byte " << i << " is outside the mask and must be untouched";
    }
    EXPECT_EQ(detect(img.data()), c.layout) << "writing must not change the version bytes";
  }
}

TEST(Tmd, BitPositions) {
  // Bit k of the mask is bit k%8 of byte k/8 of the mask field (little-endian
  // words, word 0 first).
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    const unsigned bits = c.mask_words * 32;
    for (unsigned k : {0u, 1u, 31u, 32u, 63u, 64u, 95u, 96u, 127u}) {
      if (k >= bits) continue;
      SCOPED_TRACE(k);
      Image img = make_image(c.byte72, c.byte58);
      Bits128 m;
      m.set(k);
      ASSERT_TRUE(write_disable_mask(img.data(), c.layout, m));
      for (std::size_t i = c.mask_off; i < c.mask_off + 4 * c.mask_words; ++i) {
        const unsigned char want = (i - c.mask_off == k / 8) ? static_cast<unsigned char>(1u << (k % 8)) : 0;
        EXPECT_EQ(img[i], want) << "byte " << i;
      }
      EXPECT_EQ(read_disable_mask(img.data(), c.layout), m);
    }
  }
}

TEST(Tmd, SecondWriteReplacesTheFirst) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    Image img = make_image(c.byte72, c.byte58);
    ASSERT_TRUE(write_disable_mask(img.data(), c.layout, Bits128{~0ull, ~0ull}));
    ASSERT_TRUE(write_disable_mask(img.data(), c.layout, Bits128{0x5, 0}));
    EXPECT_EQ(read_disable_mask(img.data(), c.layout), (Bits128{0x5, 0}));
    EXPECT_TRUE(mask_valid(img.data(), c.layout));
  }
}

TEST(Tmd, ValidBitAlreadySetStaysSet) {
  for (const auto& c : kCases) {
    if (c.valid_byte < 0) continue;
    SCOPED_TRACE(c.name);
    Image img = make_image(c.byte72, c.byte58);
    img[static_cast<std::size_t>(c.valid_byte)] |= 0x80;
    const Image before = img;
    ASSERT_TRUE(write_disable_mask(img.data(), c.layout, Bits128{}));
    EXPECT_TRUE(mask_valid(img.data(), c.layout));
    EXPECT_EQ(img[static_cast<std::size_t>(c.valid_byte)], before[static_cast<std::size_t>(c.valid_byte)]);
    EXPECT_TRUE(read_disable_mask(img.data(), c.layout).none());
  }
}

TEST(Tmd, EnableSetComplementLeavesOnlyEnabledTpcsRunning) {
  // The shim writes ~enabled: on a 64-bit layout the upper half is dropped,
  // on a 128-bit layout every bit outside the enable set is disabled.
  PhysicalTpcMask enabled;
  enabled.insert(PhysicalTpcBit{2});
  enabled.insert(PhysicalTpcBit{70});
  Image v3 = make_image(0x30, 0);
  ASSERT_TRUE(write_disable_mask(v3.data(), Layout::kV01toV03, ~enabled.bits));
  EXPECT_EQ(read_disable_mask(v3.data(), Layout::kV01toV03), (Bits128{~(1ull << 2), 0}));
  Image v4 = make_image(0x40, 0);
  ASSERT_TRUE(write_disable_mask(v4.data(), Layout::kV04, ~enabled.bits));
  EXPECT_EQ(read_disable_mask(v4.data(), Layout::kV04), (Bits128{~(1ull << 2), ~(1ull << 6)}));
}

}  // namespace
}  // namespace nvtaskset::tmd
