// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of --env-for PID, the launch for launchers that start
// their tasks themselves (the Slurm plugin, docs/slurm.md): it plans and
// claims as a launch does, with the status entry on PID, and prints the
// environment a task needs instead of exec'ing a command.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// NAME=VALUE lines into a map.
Env parse_env(const std::string& text) {
  Env out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

TEST_F(E2E, EnvForClaimsForThePidAndItsTasksRunOnThePartition) {
  Proc& holder = start({"/bin/sleep", "60"});
  const std::string pid = std::to_string(holder.pid);
  const Result r = run({kCli, "--no-mps", "--env-for", pid, "-t", "0-3", "--exclusive"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  const Env printed = parse_env(r.out);
  ASSERT_TRUE(printed.count("NVTASKSET_PARTITION")) << r.out;
  EXPECT_EQ(printed.at("NVTASKSET_PARTITION_PID"), pid) << r.out;
  ASSERT_TRUE(printed.count("LD_PRELOAD")) << r.out;
  EXPECT_NE(printed.at("LD_PRELOAD").find("libcuda.so.1"), std::string::npos) << r.out;

  // The holder is listed with the TPCs, as a task nvtaskset started would be.
  const Result st = run({kCli, "--status"});
  ASSERT_TRUE(ExitedWith(st, 0)) << st;
  EXPECT_NE(st.out.find(pid + " "), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("0-3"), std::string::npos) << st.out;

  // A task started with that environment, its own PID in
  // NVTASKSET_PARTITION_PID (as the Slurm plugin starts one), runs its
  // kernels on TPCs 0-3.
  Env task = env_;
  for (const auto& [k, v] : printed) task[k] = v;
  const Result tr = run({"/bin/sh", "-c", "NVTASKSET_PARTITION_PID=$$ exec \"$0\" --kernels 2", kLauncher}, task);
  ASSERT_TRUE(ExitedWith(tr, 0)) << tr;
  const auto recs = records();
  ASSERT_FALSE(recs.empty()) << read_file(record_);
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, "0xfffffffffffffff0") << rec;

  // Another claim that overlaps is refused, as --exclusive refuses a launch.
  Proc& other = start({"/bin/sleep", "60"});
  const Result o = run({kCli, "--no-mps", "--env-for", std::to_string(other.pid), "-t", "2-5", "--exclusive"});
  EXPECT_TRUE(FailedWithOneLine(o)) << o;
  EXPECT_NE(o.err.find(pid), std::string::npos) << o;

  // The holder ends: its TPCs are free again.
  holder.kill_group();
  holder.wait();
  const Result again = run({kCli, "--no-mps", "--env-for", std::to_string(other.pid), "-t", "2-5", "--exclusive"});
  EXPECT_TRUE(ExitedWith(again, 0)) << again;
  other.kill_group();
}

TEST_F(E2E, EnvForRefusesWhatItCannotClaim) {
  Result r = run({kCli, "--no-mps", "--env-for", "999999999", "-t", "0-3"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("no such process"), std::string::npos) << r;
  Proc& holder = start({"/bin/sleep", "60"});
  const std::string pid = std::to_string(holder.pid);
  r = run({kCli, "--no-mps", "--env-for", pid, "-t", "0-3", kLauncher});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("runs no command"), std::string::npos) << r;
  r = run({kCli, "--env-for", pid, "-p", pid});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  r = run({kCli, "--no-mps", "--env-for", pid, "-t", "0-99"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  r = run({kCli, "--no-mps", "--env-for", "abc", "-t", "0-3"});
  EXPECT_TRUE(ExitedWith(r, 1)) << r;
  // Nothing was claimed by any of them.
  const Result st = run({kCli, "--status"});
  EXPECT_EQ(st.out.find(pid + " "), std::string::npos) << st.out;
  holder.kill_group();
}

}  // namespace

namespace {

// --env-for --json: the same variables as an object, and the TPCs chosen,
// as --status lists them, so a launcher can claim exactly them again.
TEST_F(E2E, EnvForJsonNamesTheEnvironmentAndTheTpcsChosen) {
  Proc& holder = start({"/bin/sleep", "60"});
  const std::string pid = std::to_string(holder.pid);
  const Result r = run({kCli, "--no-mps", "--env-for", pid, "-n", "6", "--exclusive", "--json"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("environment").at("NVTASKSET_PARTITION_PID"), pid) << r.out;
  ASSERT_TRUE(j.at("environment").contains("NVTASKSET_PARTITION")) << r.out;
  ASSERT_EQ(j.at("partitions").size(), 1u) << r.out;
  const std::string tpcs = j.at("partitions")[0].at("tpcs");
  const Result st = run({kCli, "--status", "--json"});
  ASSERT_TRUE(ExitedWith(st, 0)) << st;
  std::string listed;
  const nlohmann::json status = nlohmann::json::parse(st.out);
  for (const auto& t : status.at("tasks"))
    if (t.at("pid") == holder.pid) listed = t.at("tpcs");
  EXPECT_EQ(tpcs, listed) << r.out << st.out;
  EXPECT_EQ(tpcs, "0-5") << r.out;  // the stand-in's layout is unknown: the lowest-numbered TPCs
  // Claimed again by that list, on a new holder, once the first is gone.
  holder.kill_group();
  holder.wait();
  Proc& again = start({"/bin/sleep", "60"});
  const Result r2 = run({kCli, "--no-mps", "--env-for", std::to_string(again.pid), "-t", tpcs, "--exclusive", "--json"});
  ASSERT_TRUE(ExitedWith(r2, 0)) << r2;
  EXPECT_EQ(nlohmann::json::parse(r2.out).at("partitions")[0].at("tpcs"), tpcs) << r2.out;
  // Without --env-for, a launch takes no --json.
  const Result bad = run({kCli, "--no-mps", "--json", "-t", "0-3", "/bin/true"});
  EXPECT_TRUE(ExitedWith(bad, 1)) << bad;
  EXPECT_NE(bad.err.find("--json goes with --topology, --calibrate, --status, -p or --env-for"), std::string::npos) << bad;
}

}  // namespace
