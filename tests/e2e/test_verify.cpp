// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of --verify: the probe checks that kernels run inside their
// partition, and fails (never hangs) when the layout or the shim is wrong.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- --verify ------------------------------------------------------------------------------------
// `nvtaskset --verify` runs its probe kernel in a process that loads the real
// shim; the stand-in runs that kernel, placing its blocks as a GPU does under
// the mask the shim left in the TMD (fakecuda.cpp, "Kernels"), on the chip
// FAKECUDA_TPC_BITS describes.

struct Verdict {
  bool ok;
  std::string label;  // "-t 0-7", "-g 1"
  std::string line;
};

std::vector<Verdict> verdicts(const std::string& out) {
  static const std::regex re("^(ok  |FAIL) (-[tg] [0-9,-]+)  \\([0-9]+ TPCs?\\): .+$");
  std::vector<Verdict> v;
  for (const auto& l : lines_of(out)) {
    std::smatch m;
    if (std::regex_match(l, m, re)) v.push_back({m[1] == "ok  ", m[2], l});
  }
  return v;
}

std::vector<std::string> labels(const std::vector<Verdict>& v) {
  std::vector<std::string> out;
  for (const auto& x : v) out.push_back(x.label);
  return out;
}

// The IDs of a list as nvtaskset prints it: "0-2,5".
std::set<unsigned> list_ids(const std::string& list) {
  std::set<unsigned> out;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const auto dash = item.find('-');
    const unsigned a = std::stoul(item.substr(0, dash));
    const unsigned b = dash == std::string::npos ? a : std::stoul(item.substr(dash + 1));
    for (unsigned k = a; k <= b; ++k) out.insert(k);
  }
  return out;
}

TEST_F(E2E, VerifyPassesWhenTheLayoutIsRight) {
  Proc& p = start({kCli, "--verify", "--seed", "7"});
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(r.err, "") << r;
  const auto ls = lines_of(r.out);
  ASSERT_GE(ls.size(), 3u) << r;
  EXPECT_EQ(ls[0], "device 0: Stand-in GPU " + kStandInUuid + ", 8 TPCs, 0 GPCs, layout from identity") << r;
  EXPECT_EQ(ls[1], "seed 7 (--seed 7 checks the same partitions)") << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 23u) << r;  // every TPC, the first, the last, 20 random lists (no GPCs known)
  EXPECT_EQ(v[0].line, "ok   -t 0-7  (8 TPCs): 32 blocks, all inside");
  EXPECT_EQ(v[1].label, "-t 0");
  EXPECT_EQ(v[2].label, "-t 7");
  for (const auto& x : v) EXPECT_TRUE(x.ok) << x.line;
  EXPECT_TRUE(std::regex_match(ls.back(), std::regex("PASS: all 23 partitions ran every block inside their TPCs "
                                                     "\\(seed 7, [0-9]+\\.[0-9] s\\)")))
      << r;
  // Every probe kernel went through the shim in one probe process, which
  // wrote each partition into its TMD: all TPCs first (from
  // NVTASKSET_PARTITION), then "-t 0" (written into its control region).
  const auto recs = records();
  ASSERT_GE(recs.size(), 23u) << read_file(record_);
  std::set<long> pids;
  for (const auto& rec : recs) pids.insert(rec.pid);
  EXPECT_EQ(pids.size(), 1u);
  EXPECT_NE(*pids.begin(), p.pid);
  EXPECT_EQ(recs[0].mask, disable64(0xff)) << recs[0];
  EXPECT_EQ(recs[1].mask, disable64(0x1)) << recs[1];
  // The probe process is gone with it, and left nothing in $TMPDIR.
  EXPECT_EQ(::kill(-p.pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(path("tmp"))) left.push_back(f.path().string());
  EXPECT_TRUE(left.empty()) << "left in $TMPDIR: " << ::testing::PrintToString(left);
}

TEST_F(E2E, VerifyChecksTheGpuItIsGiven) {
  env_["FAKECUDA_DEVICES"] = "2";
  const Result r = run({kCli, "--verify", "-d", "1", "--seed", "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(lines_of(r.out)[0].starts_with("device 1: Stand-in GPU GPU-fa4ecda0-0000-4000-8000-000000000001, "))
      << r;
  EXPECT_EQ(verdicts(r.out).size(), 23u) << r;
}

TEST_F(E2E, VerifySeedRepeatsARun) {
  const Result a = run({kCli, "--verify"});
  ASSERT_TRUE(ExitedWith(a, 0)) << a;
  std::smatch m;
  const auto ls = lines_of(a.out);
  ASSERT_GE(ls.size(), 2u) << a;
  ASSERT_TRUE(std::regex_match(ls[1], m, std::regex("seed ([0-9]+) \\(--seed \\1 checks the same partitions\\)")))
      << a;
  const Result b = run({kCli, "--verify", "--seed", m[1].str()});
  ASSERT_TRUE(ExitedWith(b, 0)) << b;
  EXPECT_EQ(labels(verdicts(a.out)), labels(verdicts(b.out)));
  const Result c = run({kCli, "--verify", "--seed", std::to_string(std::stoull(m[1].str()) + 1)});
  ASSERT_TRUE(ExitedWith(c, 0)) << c;
  EXPECT_NE(labels(verdicts(a.out)), labels(verdicts(c.out)));
}

TEST_F(E2E, VerifyErrorsAreOneLine) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--verify", "-d", "9"},
           {"--verify", "-d", "GPU-0123"},
           {"--verify", "-t", "0-3"},
           {"--verify", "-d", "0", "-g", "0"},
           {"--verify", "0xff"},
           {"--verify", "true"},
           {"--verify", "-p", "1"},
           {"--verify", "--topology"},
           {"--seed", "3", "-t", "0", "true"},
           {"--verify", "--seed", "x"},
           {"--verify", "--seed", "18446744073709551616"}}) {
    std::vector<std::string> argv{kCli};
    argv.insert(argv.end(), args.begin(), args.end());
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
  }
  EXPECT_FALSE(exists(record_)) << "a refused --verify ran a kernel";
  Env env = env_;
  env["FAKECUDA_DEVICES"] = "0";
  Result r = run({kCli, "--verify"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("no CUDA device is visible"), std::string::npos) << r;
  env = env_;
  env["NVTASKSET_SHIM_DIR"] = path("no-shim-here");
  r = run({kCli, "--verify"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("cannot find the shim"), std::string::npos) << r;
}

TEST_F(E2E, VerifyNeverPassesKernelsTheShimDidNotMask) {
  env_["FAKECUDA_TMD_LAYOUT"] = "unknown";
  // The shim stops a partitioned process whose TMD layout it does not know:
  // here, the probe, which is an error of its own.
  Result r = run({kCli, "--verify", "--seed", "1"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("nvtaskset: the probe process was killed by signal"), std::string::npos) << r;
  // Told to run such kernels unmasked, the shim does, and that is a failure
  // even where the blocks happen to land inside.
  env_["NVTASKSET_ON_UNSUPPORTED"] = "warn";
  r = run({kCli, "--verify", "--seed", "1"});
  ASSERT_TRUE(ExitedWith(r, 2)) << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 23u) << r;
  EXPECT_EQ(v[0].line, "FAIL -t 0-7  (8 TPCs): the shim masked 0 of 1 probe kernels");
  for (const auto& x : v) EXPECT_FALSE(x.ok) << x.line;
  EXPECT_TRUE(lines_of(r.out).back().starts_with("FAIL: 23 of 23 partitions failed (seed 1, ")) << r;
}

TEST_F(TopologyFile, VerifyPassesOnTheChipTheFileDescribes) {
  env_["FAKECUDA_TPC_BITS"] = "9,3,70,12,100,5,64,1";  // kBits
  const Result r = run({kCli, "--verify", "--topology-file", file_, "--seed", "7"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(lines_of(r.out)[0],
            "device 0: Stand-in GPU " + kStandInUuid + ", 8 TPCs, 2 GPCs, layout from file " + file_)
      << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 26u) << r;  // every TPC, first, last; GPC 0, GPC 1, both; 20 random lists
  EXPECT_EQ(v[3].line, "ok   -g 0  (4 TPCs): 32 blocks, all inside");
  EXPECT_EQ(v[4].line, "ok   -g 1  (3 TPCs): 32 blocks, all inside");
  EXPECT_EQ(v[5].label, "-g 0-1");
  for (const auto& x : v) EXPECT_TRUE(x.ok) << x.line;
  // The lists reached the TMDs as the chip's bits, through the shim.
  std::set<std::string> masks;
  for (const auto& rec : records()) {
    EXPECT_EQ(rec.layout, "v4") << rec;
    EXPECT_EQ(rec.valid, 1) << rec;
    masks.insert(rec.mask);
  }
  EXPECT_TRUE(masks.count(hopper_disable({0}))) << "-t 0";
  EXPECT_TRUE(masks.count(hopper_disable({0, 2, 4, 6}))) << "-g 0";
}

TEST_F(TopologyFile, VerifyFailsWhenTheLayoutIsWrong) {
  env_["FAKECUDA_TPC_BITS"] = "9,3,70,12,100,5,64,1";  // kBits
  // The file swaps the bits of TPCs 2 and 5: a partition holding one of them
  // but not the other runs on the other.
  std::ofstream(file_) << hopper_topology_json(kStandInUuid, {9, 3, 5, 12, 100, 70, 64, 1});
  const Result r = run({kCli, "--verify", "--topology-file", file_, "--seed", "7"});
  ASSERT_TRUE(ExitedWith(r, 2)) << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 26u) << r;
  const std::vector<std::set<unsigned>> gpcs = {{0, 2, 4, 6}, {1, 3, 5}};  // hopper_topology_json
  unsigned fails = 0;
  for (const auto& x : v) {
    std::set<unsigned> tpcs = list_ids(x.label.substr(3));
    if (x.label.starts_with("-g")) {
      std::set<unsigned> of_gpcs;
      for (unsigned g : tpcs) of_gpcs.insert(gpcs.at(g).begin(), gpcs.at(g).end());
      tpcs = of_gpcs;
    }
    const bool has2 = tpcs.count(2) != 0, has5 = tpcs.count(5) != 0;
    if (has2 == has5) {
      EXPECT_TRUE(x.ok) << x.line;
      continue;
    }
    ++fails;
    EXPECT_FALSE(x.ok) << x.line;
    const std::string other = has2 ? "5" : "2";
    EXPECT_TRUE(std::regex_search(x.line, std::regex(": [0-9]+ of 32 blocks on TPC " + other + " outside the partition$")))
        << x.line;
  }
  EXPECT_GE(fails, 2u);  // GPC 0 alone and GPC 1 alone, at least
  EXPECT_TRUE(std::regex_match(lines_of(r.out).back(), std::regex("FAIL: " + std::to_string(fails) +
                                                                  " of 26 partitions failed \\(seed 7, [0-9.]+ s\\)")))
      << r;
}

TEST_F(TopologyFile, VerifyReportsAKernelThatNeverRunsInsteadOfHanging) {
  env_["FAKECUDA_TPC_BITS"] = "9,3,70,12,100,5,64,1";  // kBits
  // The file gives TPC 7 bit 2, which controls nothing on this chip: a
  // partition of TPC 7 alone enables no TPC that works.
  std::ofstream(file_) << hopper_topology_json(kStandInUuid, {9, 3, 70, 12, 100, 5, 64, 2});
  Proc& p = start({kCli, "--verify", "--topology-file", file_, "--seed", "7"});
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 2)) << r;
  const auto v = verdicts(r.out);
  ASSERT_EQ(v.size(), 3u) << r;  // the third, "-t 7", stops the run
  EXPECT_EQ(v[0].line, "FAIL -t 0-7  (8 TPCs): all 128 blocks inside, but TPC 7 of it never ran one in 4 launches");
  EXPECT_EQ(v[1].line, "ok   -t 0  (1 TPC): 32 blocks, all inside");
  EXPECT_EQ(v[2].line,
            "FAIL -t 7  (1 TPC): the kernel did not finish within 5 s, so its mask enables no TPC that works (the "
            "layout is wrong)");
  EXPECT_TRUE(std::regex_match(lines_of(r.out).back(),
                               std::regex("FAIL: 2 of 26 partitions failed, 23 not checked after a kernel that never "
                                          "finished \\(seed 7, [0-9.]+ s\\)")))
      << r;
  // The probe process stuck behind that kernel did not outlive the check,
  // nor leave its private MPS pipe directory behind.
  EXPECT_EQ(::kill(-p.pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(path("tmp"))) left.push_back(f.path().string());
  EXPECT_TRUE(left.empty()) << "left in $TMPDIR: " << ::testing::PrintToString(left);
}

}  // namespace
