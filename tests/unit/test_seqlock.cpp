// SPDX-License-Identifier: Apache-2.0
// seqlock.hpp: the one seqlock reader. Bounded (gives up after N attempts,
// so a caller can fail closed), never a torn copy, and the double-buffer form
// the control region uses.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "nvtaskset/seqlock.hpp"

namespace nvtaskset::seqlock {
namespace {

struct Guarded {
  std::atomic<std::uint64_t> seq{0};
  std::atomic<std::uint64_t> a{0}, b{0};

  void write(std::uint64_t v) {
    const std::uint64_t s = seq.load(std::memory_order_relaxed);
    seq.store(s | 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    a.store(v, std::memory_order_relaxed);
    b.store(~v, std::memory_order_relaxed);
    seq.store((s | 1) + 1, std::memory_order_release);
  }
};

TEST(Seqlock, ReadsAQuietCopyOnTheFirstAttempt) {
  Guarded g;
  g.write(7);
  int copies = 0;
  std::uint64_t a = 0, b = 0;
  ASSERT_TRUE(read(g.seq, [&] {
    ++copies;
    a = g.a.load(std::memory_order_relaxed);
    b = g.b.load(std::memory_order_relaxed);
  }));
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(a, 7u);
  EXPECT_EQ(b, ~std::uint64_t{7});
}

TEST(Seqlock, AnOddCounterGivesUpWithoutCopying) {
  // A writer that died mid-write, or scribbled memory: the counter stays odd.
  Guarded g;
  g.seq.store(5);
  int copies = 0;
  EXPECT_FALSE(read(g.seq, [&] { ++copies; }));
  EXPECT_EQ(copies, 0);
  EXPECT_FALSE(read(g.seq, [&] { ++copies; }, 3));
}

TEST(Seqlock, AWriterDuringEveryAttemptGivesUpAfterExactlyTheTries) {
  // Each copy sees a writer publish meanwhile: no attempt counts.
  Guarded g;
  int copies = 0;
  EXPECT_FALSE(read(g.seq, [&] {
    ++copies;
    g.write(static_cast<std::uint64_t>(copies));
  }));
  EXPECT_EQ(copies, kReadTries);
  copies = 0;
  EXPECT_FALSE(read(g.seq, [&] {
    ++copies;
    g.write(1);
  }, 5));
  EXPECT_EQ(copies, 5);
}

TEST(Seqlock, AWriterDuringSomeAttemptsRetriesThenReads) {
  Guarded g;
  int copies = 0;
  std::uint64_t a = 0;
  EXPECT_TRUE(read(g.seq, [&] {
    if (++copies < 3) g.write(100 + static_cast<std::uint64_t>(copies));
    a = g.a.load(std::memory_order_relaxed);
  }));
  EXPECT_EQ(copies, 3);
  EXPECT_EQ(a, 102u);
}

TEST(Seqlock, Uint32Counters) {
  std::atomic<std::uint32_t> seq{2};
  int copies = 0;
  EXPECT_TRUE(read(seq, [&] { ++copies; }));
  seq.store(3);
  EXPECT_FALSE(read(seq, [&] { ++copies; }));
  EXPECT_EQ(copies, 1);
}

TEST(Seqlock, ReadPickedRereadsWhichCopyIsPublished) {
  // A double buffer, as the control region's entries: the writer fills the
  // other copy, then flips `current`.
  Guarded buf[2];
  std::atomic<std::uint64_t> current{0};
  buf[0].write(1);
  buf[1].seq.store(9);  // the unpublished copy, mid-write
  int picks = 0;
  std::uint64_t a = 0;
  EXPECT_TRUE(read_picked(
      [&]() -> const Guarded& {
        ++picks;
        return buf[current.load() & 1];
      },
      [&](const Guarded& g) { a = g.a.load(std::memory_order_relaxed); }));
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(picks, 1);
  // The published copy is being written for good: bounded.
  current.store(1);
  picks = 0;
  EXPECT_FALSE(read_picked([&]() -> const Guarded& { ++picks; return buf[current.load() & 1]; },
                           [&](const Guarded&) {}));
  EXPECT_EQ(picks, kReadTries);
}

TEST(Seqlock, NeverATornCopyUnderAConcurrentWriter) {
  Guarded g;
  g.write(0);  // every published state holds b == ~a
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (std::uint64_t v = 1; !stop.load(std::memory_order_relaxed); ++v) g.write(v);
  });
  unsigned good = 0, gave_up = 0, torn = 0;
  for (int i = 0; i < 200000; ++i) {
    std::uint64_t a = 0, b = 0;
    if (read(g.seq, [&] {
          a = g.a.load(std::memory_order_relaxed);
          b = g.b.load(std::memory_order_relaxed);
        })) {
      ++good;
      if (b != ~a) ++torn;
    } else {
      ++gave_up;
    }
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(torn, 0u) << "copies returned that no writer published";
  EXPECT_EQ(good + gave_up, 200000u);
}

}  // namespace
}  // namespace nvtaskset::seqlock
