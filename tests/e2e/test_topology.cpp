// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of topologies: TPC and GPC lists become the chip's
// physical bits through a topology file, at launch and in a live change; a
// Hopper list without a topology is an error.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- Hopper needs a topology ---------------------------------------------------------------------

TEST_F(E2E, HopperLogicalListWithoutTopologyIsAnError) {
  env_["FAKECUDA_CC"] = "9.0";
  const std::string marker = path("marker");
  const Result r = run({kCli, "--no-mps", "-t", "0-3", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_FALSE(exists(marker));
  EXPECT_FALSE(exists(record_));
}

// --- topology files: translation on a Hopper-like layout -----------------------------------------

TEST_F(TopologyFile, ListsBecomeTheChipsPhysicalBits) {
  Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0-1", kLauncher, "--kernels", "2"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  auto recs = records();
  ASSERT_EQ(recs.size(), 2u);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.layout, "v4");
    EXPECT_EQ(rec.valid, 1);
    EXPECT_EQ(rec.mask, hopper_disable({0, 1})) << rec;  // bits 9 and 3, not 0 and 1
  }
  // A GPC list, and the topology from the environment instead of the option.
  Env env = env_;
  env["NVTASKSET_TOPOLOGY"] = file_;
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "-g", "1", kLauncher, "--kernels", "1"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  recs = records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].mask, hopper_disable({1, 3, 5})) << recs[0];
  // A hex mask over logical TPCs: 0x44 = TPCs 2 and 6 = bits 70 and 64.
  ::unlink(record_.c_str());
  r = run({kCli, "--no-mps", "0x44", kLauncher, "--kernels", "1"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  recs = records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].mask, hopper_disable({2, 6})) << recs[0];
}

TEST_F(TopologyFile, LiveChangeTranslatesToo) {
  Env env = env_;
  env["NVTASKSET_TOPOLOGY"] = file_;
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0", kLauncher, "--until-file", until, "--interval-ms", "5", "--ready-file",
                   ready},
                  env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const Result q = run({kCli, "-p", "-g", "0", std::to_string(pid)}, env);
  const std::size_t before = records().size();
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  // The old partition was a TPC list: it is shown as one, not as GPC "0".
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0") + pid_line(pid, "new GPC list", "0")) << q;
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, hopper_disable({0, 2, 4, 6})) << rec;
  const Result again = run({kCli, "-p", std::to_string(pid)}, env);
  EXPECT_EQ(again.out, pid_line(pid, "current GPC list", "0")) << again;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(TopologyFile, TopologyPrintsGpcsAndUnknownTpcs) {
  Result r = run({kCli, "--topology", "--topology-file", file_});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("gpc 0 tpcs: 0 2 4 6\n"), std::string::npos) << r;
  EXPECT_NE(r.out.find("gpc 1 tpcs: 1 3 5\n"), std::string::npos) << r;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("gpc 0 mask bits: (9 64 70 100|9 70 100 64)\n"))) << r;
  EXPECT_NE(r.out.find("gpc unknown tpcs: 7\n"), std::string::npos) << r;
  r = run({kCli, "--topology", "--json", "--topology-file", file_});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("\"schema\": \"nvtaskset-topology/1\""), std::string::npos) << r;
}

TEST_F(TopologyFile, ImpossiblePartitionsAreRefusedBeforeTheCommandRuns) {
  const std::string marker = path("marker");
  for (const std::vector<std::string>& spec : std::vector<std::vector<std::string>>{
           {"-g", "2"},              // no such GPC
           {"-t", "8"},              // no such TPC
           {"--physical", "0x4"},    // bit 2 controls no TPC: kernels would never run
           {"-d", "1", "-t", "0"}})  // no such GPU
  {
    std::vector<std::string> argv{kCli, "--no-mps", "--topology-file", file_};
    argv.insert(argv.end(), spec.begin(), spec.end());
    argv.insert(argv.end(), {"touch", marker});
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << spec[0] << " " << spec[1];
    EXPECT_FALSE(exists(marker));
  }
  // A topology file for another GPU is an error, not a fallback.
  std::ofstream(file_) << hopper_topology_json("GPU-00000000-1111-2222-3333-444444444444");
  const Result r = run({kCli, "--no-mps", "--topology-file", file_, "-t", "0", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_FALSE(exists(marker));
}

}  // namespace
