// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of thread-block clusters: a cluster that cannot fit the
// partition stops the task (or widens, when told) instead of hanging, and a
// live change must host the clusters the task launched.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- thread-block clusters never hang ------------------------------------------------------------
// On the stand-in Hopper layout (hopper_topology_json): GPC 0 = TPCs 0,2,4,6
// (clusters up to 8), GPC 1 = TPCs 1,3,5 (up to 4), TPC 7 of unknown GPC.
// `-t 0-1` has 2 SMs of each GPC: clusters of at most 2.

TEST_F(TopologyFile, ClusterThatCannotFitStopsTheTaskBeforeItLaunches) {
  for (const std::string mode : {"eager", "plain"}) {
    ::unlink(record_.c_str());
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kGraphLauncher, "--mode", mode,
                          "--cluster", "8", "--nodes", "1"});
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_FALSE(r.timed_out) << r;
    EXPECT_FALSE(r.exited) << r;
    EXPECT_EQ(r.signal, SIGABRT) << r;
    EXPECT_LT(took, 5s);
    EXPECT_NE(r.err.find("]: kernel with clusters of 8 cannot run on TPCs 0-1 (at most 2 SMs of one GPC); stopping\n"),
              std::string::npos)
        << mode << r;
    EXPECT_TRUE(records().empty()) << mode << ": a kernel reached the GPU: " << read_file(record_);
  }
}

TEST_F(TopologyFile, ClusterThatFitsRuns) {
  // -g 0 hosts 8; -t 0,2 hosts 4; every launch of a fitting cluster runs.
  Result r = run({kCli, "--no-mps", "--topology-file", file_, "-g", "0", kGraphLauncher, "--mode", "eager",
                  "--cluster", "8", "--nodes", "1", "--replays", "3"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  auto recs = records();
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, hopper_disable({0, 2, 4, 6})) << rec;
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0,2", kGraphLauncher, "--mode", "plain", "--cluster",
           "4", "--nodes", "1", "--replays", "2"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(records().size(), 2u);
}

TEST_F(TopologyFile, WidenRunsTheMisfitOnThePartitionsWholeGpcs) {
  Env env = env_;
  env["NVTASKSET_ON_CLUSTER_MISFIT"] = "widen";
  Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kGraphLauncher, "--mode", "eager",
                  "--cluster", "8", "--nodes", "1", "--replays", "2"},
                 env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  auto recs = records();
  ASSERT_EQ(recs.size(), 2u);
  // TPCs 0 and 1 touch GPCs 0 and 1: the misfit ran on all their TPCs.
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, hopper_disable({0, 1, 2, 3, 4, 5, 6})) << rec;
  EXPECT_NE(r.err.find("does not fit TPCs 0-1 (at most 2 SMs of one GPC); running such kernels on the partition's "
                       "whole GPCs"),
            std::string::npos)
      << r;
  // Kernels without clusters keep the partition itself.
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kGraphLauncher, "--mode", "eager", "--nodes", "1"},
          env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  recs = records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].mask, hopper_disable({0, 1}));
  // When even the whole GPCs cannot host it (16 > 8), it stops.
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kGraphLauncher, "--mode", "eager", "--cluster",
           "16", "--nodes", "1"},
          env);
  EXPECT_EQ(r.signal, SIGABRT) << r;
  EXPECT_NE(r.err.find("cannot run on TPCs 0-1 (at most 2 SMs of one GPC), nor on its whole GPCs (at most 8); "
                       "stopping"),
            std::string::npos)
      << r;
  EXPECT_TRUE(records().empty());
}

TEST_F(TopologyFile, LiveChangeMustHostTheClustersTheTaskLaunched) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "--topology-file", file_, "-g", "0", kGraphLauncher, "--mode", "plain",
                   "--cluster", "8", "--nodes", "1", "--until-file", until, "--interval-ms", "2", "--ready-file",
                   ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  Result q = run({kCli, "-p", "--topology-file", file_, spid});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.out, pid_line(pid, "current GPC list", "0") +
                       pid_line(pid, "CUDA graphs", "1 follow the partition, 0 cannot") +
                       pid_line(pid, "largest thread-block cluster", "8"))
      << q;
  // 2 SMs of one GPC cannot host clusters of 8: refused, nothing changed.
  q = run({kCli, "-p", "--topology-file", file_, "-t", "0-1", spid});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  EXPECT_NE(q.err.find("has launched thread-block clusters of 8 SMs, but TPCs 0-1 can host at most 2 SMs of one GPC"),
            std::string::npos)
      << q;
  q = run({kCli, "-p", "--topology-file", file_, spid});
  EXPECT_TRUE(q.out.starts_with(pid_line(pid, "current GPC list", "0"))) << q;
  // A list that hosts 8 is accepted, and the replays follow it.
  q = run({kCli, "-p", "--topology-file", file_, "-t", "6,4,2,0", spid});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  const std::size_t before = records().size();
  std::vector<Record> after;
  wait_until([&] { return (after = graph_records(records(), pid, before)).size() >= 3; });
  ASSERT_GE(after.size(), 3u);
  EXPECT_EQ(after.back().mask, hopper_disable({0, 2, 4, 6}));
  q = run({kCli, "-p", "--json", "--topology-file", file_, spid});
  EXPECT_NE(q.out.find("\"max_cluster\": 8"), std::string::npos) << q;
  EXPECT_NE(q.out.find("\"max_cluster_hosted\": 8"), std::string::npos) << q;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(TopologyFile, UnpartitionedTaskKeepsCountOfItsClustersToo) {
  // System-wide mode: the shim loaded, no partition yet. A later -p must
  // still not give it a partition its clusters cannot run in.
  Env env = env_;
  env["LD_LIBRARY_PATH"] = shim_dir();
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kGraphLauncher, "--mode", "eager", "--cluster", "8", "--nodes", "1", "--until-file", until,
                   "--interval-ms", "2", "--ready-file", ready},
                  env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  ASSERT_TRUE(wait_until([&] {
    return run({kCli, "-p", "--topology-file", file_, spid}).out.find("largest thread-block cluster: 8") !=
           std::string::npos;
  }));
  Result q = run({kCli, "-p", "--topology-file", file_, "-t", "0-1", spid});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  q = run({kCli, "-p", "--topology-file", file_, "-g", "0", spid});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  const std::size_t before = records().size();
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, hopper_disable({0, 2, 4, 6})) << rec;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(TopologyFile, LaunchSuggestsAGpcAlignedListThatHostsClusters) {
  // -t 0-3 holds 2 TPCs of GPC 0 and 2 of GPC 1: clusters of 4 at most, while
  // GPC 0 alone (TPCs 0,2,4,6) hosts the portable size 8.
  const Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-3", "true"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("cannot run thread-block clusters larger than 4 (the GPU runs up to 8); a GPC-aligned list of "
                       "the same size hosts clusters of 8: -t 0,2,4,6"),
            std::string::npos)
      << r;
}

TEST_F(TopologyFile, DebugLogNamesTheClusterSizesLaunched) {
  Env env = env_;
  env["NVTASKSET_LOG"] = "debug";
  const Result r = run({kCli, "--no-mps", "--topology-file", file_, "-g", "0", kGraphLauncher, "--mode", "eager",
                        "--cluster", "4", "--nodes", "1", "--replays", "3"},
                       env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("cluster sizes launched: 4:3 (3 kernels in all)"), std::string::npos) << r;
}

}  // namespace
