// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of CUDA graphs: replays follow live changes, a node the
// program disabled stays disabled, and a driver that will not re-encode a
// child graph's nodes is reported, not trusted.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- CUDA graphs follow live changes -------------------------------------------------------------
// The stand-in builds a graph kernel node's TMD at upload or first launch and
// replays reuse it, as the H200 does (docs/hardware.md): without the shim's
// re-encoding, every replay after a change would keep the old mask.

struct GraphCase {
  std::string mode;
  int threads;
};
void PrintTo(const GraphCase& c, std::ostream* os) { *os << c.mode << " x" << c.threads; }

class GraphReplays : public E2E, public ::testing::WithParamInterface<GraphCase> {
 protected:
  // Starts the graph launcher under `-t 0-3`, then makes `changes` live
  // changes and checks that every replay that began after each `-p` returned
  // ran on the new TPCs. Returns the pid.
  long follow_changes(const std::string& mode, int threads, int changes, const Env& env) {
    const std::string until = path("until"), ready = path("ready");
    Proc& p = start({kCli, "--no-mps", "-t", "0-3", kGraphLauncher, "--mode", mode, "--nodes", "2", "--threads",
                     std::to_string(threads), "--until-file", until, "--interval-ms", "2", "--ready-file", ready},
                    env);
    const long pid = wait_ready(ready, p);
    if (pid <= 0) {
      ADD_FAILURE() << p.wait();
      return -1;
    }
    const std::string spid = std::to_string(pid);
    // Before any change: the launch partition.
    for (const auto& rec : graph_records(records(), pid)) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
    std::uint32_t seed = 2026;
    for (int c = 0; c < changes; ++c) {
      seed = seed * 1664525u + 1013904223u;
      const std::uint64_t enabled = ((seed >> 8) & 0xff) | 1;  // never empty
      std::string list;
      for (unsigned k = 0; k < 8; ++k)
        if (enabled >> k & 1) list += (list.empty() ? "" : ",") + std::to_string(k);
      const Result q = run({kCli, "-p", "-t", list, spid});
      const std::size_t before = records().size();
      EXPECT_TRUE(ExitedWith(q, 0)) << q;
      // A replay already past its check when the change landed may still
      // carry the old mask: one per thread, two kernels each.
      std::vector<Record> after;
      wait_until([&] {
        after = graph_records(records(), pid, before);
        return after.size() >= static_cast<std::size_t>(2 * threads + 6);
      });
      if (after.size() < static_cast<std::size_t>(2 * threads + 6)) {
        ADD_FAILURE() << "change " << c << ": only " << after.size() << " replays after it";
        return -1;
      }
      for (std::size_t i = 2 * threads; i < after.size(); ++i)
        EXPECT_EQ(after[i].mask, disable64(enabled)) << "change " << c << " to " << list << ": " << after[i];
    }
    return pid;
  }
};

TEST_P(GraphReplays, EveryReplayAfterAChangeRunsOnTheNewTpcs) {
  const GraphCase c = GetParam();
  const long pid = follow_changes(c.mode, c.threads, 10, env_);
  ASSERT_GT(pid, 0);
  // The query reports the execs that follow (one per thread) and none that cannot.
  const Result q = run({kCli, "-p", std::to_string(pid)});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_NE(q.out.find("pid " + std::to_string(pid) + "'s CUDA graphs: " + std::to_string(c.threads) +
                       " follow the partition, 0 cannot\n"),
            std::string::npos)
      << q;
  touch(path("until"));
  for (auto& p : procs_)
    if (p->pid == pid) {
      const Result r = p->wait();
      EXPECT_TRUE(ExitedWith(r, 0)) << r;
      EXPECT_EQ(r.err.find("warning"), std::string::npos) << r;
    }
}

INSTANTIATE_TEST_SUITE_P(Modes, GraphReplays,
                         ::testing::Values(GraphCase{"plain", 1}, GraphCase{"child", 1}, GraphCase{"destroyed", 1},
                                           GraphCase{"update", 1}, GraphCase{"upload", 1}, GraphCase{"plain", 3}),
                         [](const auto& info) { return info.param.mode + std::to_string(info.param.threads); });

TEST_F(E2E, GraphNodeTheProgramDisabledStaysDisabled) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kGraphLauncher, "--mode", "disabled", "--nodes", "2",
                   "--until-file", until, "--interval-ms", "2", "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::size_t first = records().size();
  for (const std::string list : {"4-5", "1", "0-7", "6"}) {
    const Result q = run({kCli, "-p", "-t", list, std::to_string(pid)});
    EXPECT_TRUE(ExitedWith(q, 0)) << q;
    const std::size_t before = records().size();
    std::vector<Record> after;
    wait_until([&] { return (after = graph_records(records(), pid, before)).size() >= 4; });
    ASSERT_GE(after.size(), 4u);
  }
  // Node 2 (grid width 2) was disabled after the first replay: it never ran
  // again, although the shim re-encoded the exec four times.
  const auto later = graph_records(records(), pid, first + 2);
  ASSERT_FALSE(later.empty());
  for (const auto& rec : later) EXPECT_EQ(rec.source, "graph1") << rec;
  EXPECT_EQ(later.back().mask, disable64(0x40)) << later.back();
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// The H100's driver re-encodes kernel nodes of child graphs when toggled
// (docs/hardware.md); a driver that refused or ignored it must still never
// make the shim claim a partition the replays do not get: it checks that the
// driver re-encoded, and says so.
class ChildGraphDriver : public E2E, public ::testing::WithParamInterface<std::string> {};

TEST_P(ChildGraphDriver, AnExecTheDriverWillNotReencodeIsReportedNotTrusted) {
  Env env = env_;
  env["FAKECUDA_CHILD_NODES"] = GetParam();
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kGraphLauncher, "--mode", "child", "--nodes", "2", "--until-file",
                   until, "--interval-ms", "2", "--ready-file", ready},
                  env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  Result q = run({kCli, "-p", spid});
  EXPECT_NE(q.out.find("CUDA graphs: 1 follow the partition, 0 cannot"), std::string::npos) << q;
  q = run({kCli, "-p", "-t", "4-7", spid});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  const std::size_t before = records().size();
  wait_until([&] { return graph_records(records(), pid, before).size() >= 4; });
  // After the next replay the shim knows: the query says so.
  ASSERT_TRUE(wait_until([&] {
    return run({kCli, "-p", spid}).out.find("CUDA graphs: 0 follow the partition, 1 cannot") != std::string::npos;
  }));
  q = run({kCli, "-p", spid});
  EXPECT_NE(q.err.find("cannot follow partition changes"), std::string::npos) << q;
  q = run({kCli, "-p", "--json", spid});
  EXPECT_NE(q.out.find("\"graphs_not_following\": 1"), std::string::npos) << q;
  touch(until);
  const Result r = p.wait();
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  // ...and the task said it once on stderr.
  EXPECT_NE(r.err.find("a CUDA graph cannot follow partition changes"), std::string::npos) << r;
}

INSTANTIATE_TEST_SUITE_P(Answers, ChildGraphDriver, ::testing::Values("refuse", "ignore"));

}  // namespace
