// SPDX-License-Identifier: Apache-2.0
// End-to-end tests: the real `nvtaskset` binary and the real shim, run against
// the stand-in driver (tests/fakecuda), on a machine without a GPU.
//
// The stand-in records, for every cuLaunchKernel, the TPC-disable mask that the
// shim's launch callback left in the TMD ("<pid> <layout> <valid> <mask>"), so
// these tests check what the hardware would have been told, per launch.
//
// Every child process runs in its own process group with a timeout; whatever
// is still running at the end of a test is killed.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- 1, 2: launches under -t and under a hex mask --------------------------------

class LauncherKinds : public E2E, public ::testing::WithParamInterface<std::string> {};

TEST_P(LauncherKinds, TpcListMasksEveryLaunch) {
  const std::string launcher = GetParam();
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", launcher, "--kernels", "5"});
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0));
  const long pid = printed_pid(r.out);
  // nvtaskset execs the command: same process, so the exit status is the user's.
  EXPECT_EQ(pid, p.pid) << r;
  const auto recs = records();
  ASSERT_EQ(recs.size(), 5u) << read_file(record_);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.pid, pid);
    EXPECT_EQ(rec.layout, "v3");
    EXPECT_EQ(rec.valid, 1);
    EXPECT_EQ(rec.mask, "0xfffffffffffffff0");  // ~0xf over the V03 64-bit field
  }
}

TEST_P(LauncherKinds, RunsUnchangedWithoutNvtaskset) {
  // The test programs themselves: they reach the stand-in without the shim,
  // and then nothing touches CUDA's own mask.
  Env env = env_;
  env["FAKECUDA_INITIAL_MASK"] = "0x5";
  const Result r = run({GetParam(), "--kernels", "3"}, env);
  ASSERT_TRUE(ExitedWith(r, 0));
  const auto recs = records();
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, "0x5") << rec;
}

// --partition-sm-count: the task's MULTIPROCESSOR_COUNT is its partition's
// SMs (2 per TPC), through the export and through cuGetProcAddress (the
// dlopen launcher), and only when asked. The stand-in has 16 SMs.
TEST_P(LauncherKinds, PartitionSmCountIsWhatTheTaskReads) {
  Result r = run({kCli, "--no-mps", "-t", "0-2", GetParam(), "--print-sms"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 16\n"), std::string::npos) << "off by default: " << r;
  for (const std::string flag : {"--partition-sm-count", "--hide-unallocated"}) {
    r = run({kCli, "--no-mps", flag, "-t", "0-2", GetParam(), "--print-sms"});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_NE(r.out.find("sms 6\nsms-end 6\n"), std::string::npos) << flag << ": " << r;
    EXPECT_EQ(r.err, "") << r;
  }
  // The same through the environment, as for the other options.
  Env env = env_;
  env["NVTASKSET_SM_COUNT"] = "Partition";
  r = run({kCli, "--no-mps", "0x3", GetParam(), "--print-sms"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 4\n"), std::string::npos) << r;
  // An unknown value is said, and the GPU's count stays.
  env["NVTASKSET_SM_COUNT"] = "half";
  r = run({kCli, "--no-mps", "-t", "0-2", GetParam(), "--print-sms"}, env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 16\n"), std::string::npos) << r;
  EXPECT_NE(r.err.find("NVTASKSET_SM_COUNT=half: unknown value"), std::string::npos) << r;
  // Never more than the driver says (a physical mask may name more bits than exist).
  r = run({kCli, "--no-mps", "--partition-sm-count", "--physical", "0xffffffffff", GetParam(), "--print-sms"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 16\n"), std::string::npos) << r;
}

INSTANTIATE_TEST_SUITE_P(E2E, LauncherKinds, ::testing::Values(kLauncher, kLauncherDlopen),
                         [](const auto& info) { return fs::path(info.param).filename().string(); });

struct MaskCase {
  std::string name;
  std::vector<std::string> spec;  // arguments between --no-mps and the command
  std::string layout_env;         // FAKECUDA_TMD_LAYOUT, or "" for the default
  std::string layout;             // expected layout in the records
  std::string disable;            // expected disable mask
};

void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

class Masks : public E2E, public ::testing::WithParamInterface<MaskCase> {};

TEST_P(Masks, EveryLaunchGetsTheMask) {
  const MaskCase& c = GetParam();
  Env env = env_;
  if (!c.layout_env.empty()) env["FAKECUDA_TMD_LAYOUT"] = c.layout_env;
  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), c.spec.begin(), c.spec.end());
  argv.insert(argv.end(), {kLauncher, "--kernels", "3"});
  const Result r = run(argv, env);
  ASSERT_TRUE(ExitedWith(r, 0));
  const auto recs = records();
  ASSERT_EQ(recs.size(), 3u) << read_file(record_);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.layout, c.layout) << rec;
    EXPECT_EQ(rec.valid, 1) << rec;
    EXPECT_EQ(rec.mask, c.disable) << rec;
  }
}

INSTANTIATE_TEST_SUITE_P(
    E2E, Masks,
    ::testing::Values(MaskCase{"HexMask", {"0xf0"}, "", "v3", disable64(0xf0)},
                      MaskCase{"HexMaskWithout0x", {"f0"}, "", "v3", disable64(0xf0)},
                      MaskCase{"ListWithStride", {"-t", "0-7:2"}, "", "v3", disable64(0x55)},
                      MaskCase{"ListOfRanges", {"-t", "1,3-4"}, "", "v3", disable64(0x1a)},
                      MaskCase{"AllTpcs", {"-t", "0-7"}, "", "v3", disable64(0xff)},
                      MaskCase{"LayoutV01", {"-t", "0-3"}, "v1", "v1", disable64(0xf)}),
    [](const auto& info) { return info.param.name; });

// --- 3: Hopper and Blackwell layouts with --physical -------------------------

struct PhysicalCase {
  std::string name;
  std::string cc;
  std::string layout;
  std::string mask;
  std::string disable;
};

void PrintTo(const PhysicalCase& c, std::ostream* os) { *os << c.name; }

class Physical : public E2E, public ::testing::WithParamInterface<PhysicalCase> {};

TEST_P(Physical, RawBitsReachThe128BitField) {
  const PhysicalCase& c = GetParam();
  Env env = env_;
  env["FAKECUDA_CC"] = c.cc;
  const Result r = run({kCli, "--no-mps", "--physical", c.mask, kLauncher, "--kernels", "3"}, env);
  ASSERT_TRUE(ExitedWith(r, 0));
  const auto recs = records();
  ASSERT_EQ(recs.size(), 3u) << read_file(record_);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.layout, c.layout) << rec;
    EXPECT_EQ(rec.valid, 1) << rec;  // V04/V05: the mask counts only with its valid bit
    EXPECT_EQ(rec.mask, c.disable) << rec;
  }
}

INSTANTIATE_TEST_SUITE_P(
    E2E, Physical,
    ::testing::Values(PhysicalCase{"Hopper", "9.0", "v4", "0xffff", disable128(0, 0xffff)},
                      // bit 80: working Hopper TPCs sit above bit 63 (docs/hardware.md)
                      PhysicalCase{"HopperHighBits", "9.0", "v4", "0x10000000000000000ffff",
                                   disable128(0x10000, 0xffff)},
                      PhysicalCase{"Blackwell", "10.0", "v5", "0xffff", disable128(0, 0xffff)}),
    [](const auto& info) { return info.param.name; });

TEST_F(E2E, PhysicalQueryAndLiveChange) {
  env_["FAKECUDA_CC"] = "9.0";
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "--physical", "0xffff", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();

  Result q = run({kCli, "-p", std::to_string(pid)});
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current physical mask", "0xffff")) << q;

  q = run({kCli, "-p", "--physical", "0xff", std::to_string(pid)});
  const std::size_t before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current physical mask", "0xffff") + pid_line(pid, "new physical mask", "0xff"))
      << q;
  for (const auto& rec : records_after(pid, before, 1, 3)) {
    EXPECT_EQ(rec.valid, 1) << rec;
    EXPECT_EQ(rec.mask, disable128(0, 0xff)) << rec;
  }
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// --- 4: -p query and live change in the middle of a run ----------------------

TEST_F(E2E, LiveChangeReachesTheNextLaunch) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);

  Result q = run({kCli, "-p", spid});
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3")) << q;

  q = run({kCli, "-p", "-t", "4-5", spid});
  // Only records written after the command returned count.
  std::size_t before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3") + pid_line(pid, "new TPC list", "4-5")) << q;
  // The first record after the command may come from a launch whose callback
  // ran before the change; every launch after that has the new mask.
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x30)) << rec;

  q = run({kCli, "-p", spid});
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "4-5")) << q;

  q = run({kCli, "-p", "0x3", spid});
  before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC mask", "0x30") + pid_line(pid, "new TPC mask", "0x3")) << q;
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x3)) << rec;

  // The launches before the first change all had the original partition.
  const auto all = records_of(pid);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front().mask, disable64(0xf));

  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(E2E, QueryShowsTheFormTheUserAsksFor) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "0x30", kLauncher, "--until-file", until, "--interval-ms", "5", "--ready-file",
                   ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  // By default a query answers with a TPC list; --show picks the form.
  EXPECT_EQ(run({kCli, "-p", spid}).out, pid_line(pid, "current TPC list", "4-5"));
  EXPECT_EQ(run({kCli, "-p", "--show", "list", spid}).out, pid_line(pid, "current TPC list", "4-5"));
  EXPECT_EQ(run({kCli, "-p", "--show", "mask", spid}).out, pid_line(pid, "current TPC mask", "0x30"));
  EXPECT_EQ(run({kCli, "-p", "--show", "physical", spid}).out, pid_line(pid, "current physical mask", "0x30"));
  // Not a GPC partition: shown as TPCs.
  EXPECT_EQ(run({kCli, "-p", "--show", "gpcs", spid}).out, pid_line(pid, "current TPC list", "4-5"));
  Result q = run({kCli, "-p", "--show", "bogus", spid});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  q = run({kCli, "-p", "--show", "list", "-t", "1", spid});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  EXPECT_EQ(run({kCli, "-p", spid}).out, pid_line(pid, "current TPC list", "4-5")) << "a refused --show changed it";
  q = run({kCli, "--show", "list", "--topology"});
  EXPECT_TRUE(FailedWithOneLine(q)) << q;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(E2E, LiveChangesWhileManyThreadsLaunch) {
  // Four threads launch back to back while the partition flips: every launch
  // sees one of the partitions, whole (never a mix of two), and once a change
  // has returned, each thread's next launch has it.
  constexpr int kThreads = 4;
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--threads", std::to_string(kThreads), "--interval-ms",
                   "1", "--until-file", until, "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  const std::vector<std::pair<std::string, std::uint64_t>> flips = {
      {"4-7", 0xf0}, {"0-3", 0x0f}, {"0,2,4,6", 0x55}, {"1,3,5,7", 0xaa}, {"0-7", 0xff}};
  for (const auto& [list, enabled] : flips) {
    const Result q = run({kCli, "-p", "-t", list, spid});
    const std::size_t before = records().size();
    ASSERT_TRUE(ExitedWith(q, 0));
    for (const auto& rec : records_after(pid, before, kThreads, 8)) EXPECT_EQ(rec.mask, disable64(enabled)) << rec;
  }
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
  std::set<std::string> allowed{disable64(0x0f)};
  for (const auto& f : flips) allowed.insert(disable64(f.second));
  std::size_t n = 0;
  for (const auto& rec : records_of(pid)) {
    ++n;
    EXPECT_TRUE(allowed.count(rec.mask)) << "torn or foreign mask: " << rec;
  }
  EXPECT_GT(n, 40u);
}

// --- 5: a process started without nvtaskset (system-wide mode) -------------------

TEST_F(E2E, UnpartitionedProcessIsUntouchedThenMovable) {
  const std::string until = path("until"), ready = path("ready");
  Env env = env_;
  env["LD_LIBRARY_PATH"] = shim_dir();
  env["FAKECUDA_INITIAL_MASK"] = "0x5";  // CUDA's own mask must survive
  Proc& p = start({kLauncher, "--until-file", until, "--interval-ms", "5", "--ready-file", ready}, env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);

  Result q = run({kCli, "-p", spid});
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-7")) << q;
  const auto untouched = records_of(pid);
  ASSERT_FALSE(untouched.empty());
  for (const auto& rec : untouched) EXPECT_EQ(rec.mask, "0x5") << rec;

  q = run({kCli, "-p", "-t", "1", spid});
  const std::size_t before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-7") + pid_line(pid, "new TPC list", "1")) << q;
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x2)) << rec;

  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(E2E, ShimWorksFromLdPreload) {
  // The partition as nvtaskset hands it over...
  Result r = run({kCli, "--no-mps", "-t", "2-3", kLauncher, "--print-env", "NVTASKSET_PARTITION"});
  ASSERT_TRUE(ExitedWith(r, 0));
  const auto partition = printed_env(r.out, "NVTASKSET_PARTITION");
  ASSERT_TRUE(partition.has_value()) << r;
  ::unlink(record_.c_str());
  // ...given to a program that gets the shim through LD_PRELOAD, and also
  // finds it first on LD_LIBRARY_PATH (loaded twice: harmless).
  for (const bool also_path : {false, true}) {
    SCOPED_TRACE(also_path ? "LD_PRELOAD and LD_LIBRARY_PATH" : "LD_PRELOAD");
    Env env = env_;
    env["LD_PRELOAD"] = kShim;
    if (also_path) env["LD_LIBRARY_PATH"] = shim_dir();
    env["NVTASKSET_PARTITION"] = *partition;
    r = run({kLauncher, "--kernels", "3"}, env);
    ASSERT_TRUE(ExitedWith(r, 0));
    const auto recs = records_of(printed_pid(r.out));
    ASSERT_EQ(recs.size(), 3u);
    for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0xc)) << rec;
  }
}

// --- 6: bad PIDs -----------------------------------------------------------------

TEST_F(E2E, BadPids) {
  Proc& gone = start({"true"});
  ASSERT_TRUE(ExitedWith(gone.wait(), 0));
  const std::string dead = std::to_string(gone.pid);
  Result r = run({kCli, "-p", dead});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_NE(r.err.find("pid " + dead), std::string::npos) << r;

  Proc& sleeper = start({"sleep", "30"});
  ASSERT_TRUE(wait_until([&] { return read_file("/proc/" + std::to_string(sleeper.pid) + "/comm") == "sleep\n"; }));
  for (const std::string& pid : {std::string("1"), std::to_string(sleeper.pid)}) {
    SCOPED_TRACE("pid " + pid);
    const std::string expected = "nvtaskset: pid " + pid + " is not running under nvtaskset\n";
    r = run({kCli, "-p", pid});
    EXPECT_TRUE(FailedWithOneLine(r));
    EXPECT_EQ(r.err, expected) << r;
    r = run({kCli, "-p", "-t", "0", pid});
    EXPECT_TRUE(FailedWithOneLine(r));
    EXPECT_EQ(r.err, expected) << r;
    EXPECT_EQ(r.out, "") << r;
  }
  EXPECT_TRUE(sleeper.running());

  for (const std::string bad : {"abc", "-5", "0", "12abc", "99999999999999999999"}) {
    SCOPED_TRACE("pid \"" + bad + "\"");
    r = run({kCli, "-p", bad});
    EXPECT_TRUE(FailedWithOneLine(r));
    r = run({kCli, "-p", "-t", "0", bad});
    EXPECT_TRUE(FailedWithOneLine(r));
  }
  r = run({kCli, "-p"});
  EXPECT_TRUE(FailedWithOneLine(r));
}

// --- 7: bad lists and masks never start the command --------------------------------

struct BadSpec {
  std::string name;
  std::vector<std::string> args;  // between --no-mps and the command
};

void PrintTo(const BadSpec& c, std::ostream* os) { *os << c.name; }

class BadSpecs : public E2E, public ::testing::WithParamInterface<BadSpec> {};

TEST_P(BadSpecs, RejectedBeforeTheCommandRuns) {
  // Control: the same command with a good list runs, so the failure below is
  // the bad argument's, not the setup's.
  const std::string control = path("control");
  ASSERT_TRUE(ExitedWith(run({kCli, "--no-mps", "-t", "0", "touch", control}), 0));
  ASSERT_TRUE(exists(control));
  ::unlink(record_.c_str());

  const std::string marker = path("marker");
  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), GetParam().args.begin(), GetParam().args.end());
  argv.insert(argv.end(), {"touch", marker});
  const Result r = run(argv);
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_FALSE(exists(marker)) << "the command ran" << r;
  EXPECT_FALSE(exists(record_));
}

INSTANTIATE_TEST_SUITE_P(E2E, BadSpecs,
                         ::testing::Values(BadSpec{"EmptyList", {"-t", ""}},                     //
                                           BadSpec{"OpenRange", {"-t", "1-"}},                   //
                                           BadSpec{"LeadingDash", {"-t", "-1"}},                 //
                                           BadSpec{"Letter", {"-t", "a"}},                       //
                                           BadSpec{"ReversedRange", {"-t", "3-1"}},              //
                                           BadSpec{"ZeroStride", {"-t", "0-7:0"}},               //
                                           BadSpec{"EmptyItem", {"-t", "0,,1"}},                 //
                                           BadSpec{"TpcBeyondDevice", {"-t", "8"}},              //
                                           BadSpec{"RangeBeyondDevice", {"-t", "0-8"}},          //
                                           BadSpec{"EmptyMask", {"0x0"}},                        //
                                           BadSpec{"NotHex", {"0xzz"}},                          //
                                           BadSpec{"MaskOf33Digits", {"0x1" + std::string(32, '0')}},  //
                                           BadSpec{"MaskBeyondDevice", {"0x100"}},               //
                                           BadSpec{"UnknownOption", {"--bogus", "-t", "0"}}),
                         [](const auto& info) { return info.param.name; });

TEST_F(E2E, MissingCommandIsAnError) {
  const Result r = run({kCli, "--no-mps", "-t", "0"});
  EXPECT_TRUE(FailedWithOneLine(r));
}

// --- 8: the shim never loads itself as the real driver -------------------------------

TEST_F(E2E, RealDriverPointingAtTheShimIsAnError) {
  env_["NVTASKSET_REAL_LIBCUDA"] = kShim;
  const std::string marker = path("marker");
  Result r = run({kCli, "--no-mps", "-t", "0-3", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_FALSE(exists(marker));

  // A program that loads the shim directly, told the same: it must neither
  // hang nor crash, nor run kernels.
  Env env = env_;
  env["LD_LIBRARY_PATH"] = shim_dir();
  r = run({kLauncher, "--kernels", "1"}, env);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_TRUE(r.exited) << r;
  EXPECT_NE(r.code, 0) << r;
  EXPECT_FALSE(exists(record_));
}

TEST_F(E2E, ShimCopyOnLibraryPathIsNeverLoaded) {
  // A copy of the shim, alone in a directory, looks exactly like a driver to
  // anyone searching for libcuda.so.1.
  const std::string decoy_dir = path("decoy");
  fs::create_directories(decoy_dir);
  const std::string decoy = decoy_dir + "/libcuda.so.1";
  fs::copy_file(kShim, decoy);
  Env env = env_;
  env.erase("NVTASKSET_REAL_LIBCUDA");
  env["LD_LIBRARY_PATH"] = decoy_dir;
  // The loader logs every file it tries or loads, in every process.
  env["LD_DEBUG"] = "files,libs";
  env["LD_DEBUG_OUTPUT"] = path("ld");
  auto decoy_seen = [&] {
    std::vector<std::string> hits;
    for (const auto& f : fs::directory_iterator(dir_))
      if (f.path().filename().string().starts_with("ld.")) {
        const std::string log = read_file(f.path().string());
        for (const auto& l : lines_of(log))
          if (l.find(decoy) != std::string::npos) hits.push_back(l);
      }
    return hits;
  };

  // Through nvtaskset: without a real driver the CLI must fail cleanly; with
  // one (a GPU machine) the task runs; either way the decoy is never loaded.
  Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--print-libcuda", "--kernels", "1"}, env);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_TRUE(r.exited) << r;
  if (r.code != 0) {
    EXPECT_TRUE(FailedWithOneLine(r));
  }
  EXPECT_EQ(r.out.find(decoy), std::string::npos) << r;
  EXPECT_TRUE(decoy_seen().empty()) << "loader tried the decoy:\n" << ::testing::PrintToString(decoy_seen());

  // A program that loads the real shim first (as nvtaskset arranges), with
  // the decoy behind it on the path: the shim looks for the driver and must
  // not take the decoy.
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_))
    if (f.path().filename().string().starts_with("ld.")) fs::remove(f.path(), ec);
  env["LD_LIBRARY_PATH"] = shim_dir() + ":" + decoy_dir;
  r = run({kLauncher, "--print-libcuda", "--kernels", "1"}, env);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_TRUE(r.exited) << r;
  // The launcher got to main and listed what it had mapped: the shim, not the decoy.
  EXPECT_NE(r.out.find("libcuda " + fs::canonical(kShim).string()), std::string::npos) << r;
  EXPECT_EQ(r.out.find(decoy), std::string::npos) << r;
  EXPECT_TRUE(decoy_seen().empty()) << "loader tried the decoy:\n" << ::testing::PrintToString(decoy_seen());
  // The loader log exists, so the check above could have failed.
  bool logged = false;
  for (const auto& f : fs::directory_iterator(dir_))
    logged |= f.path().filename().string().starts_with("ld.") &&
              read_file(f.path().string()).find(shim_dir()) != std::string::npos;
  EXPECT_TRUE(logged) << "no loader log mentions the shim directory";
}

// --- 9: children ----------------------------------------------------------------------

TEST_F(E2E, ForkedChildGetsItsOwnRegionWithTheParentsPartition) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--fork", "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const long child = wait_ready(ready + ".child", p);
  ASSERT_GT(child, 0) << p.wait();
  EXPECT_NE(p.out().find("child " + std::to_string(child) + "\n"), std::string::npos) << p.out();

  Result q = run({kCli, "-p", std::to_string(child)});
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(child, "current TPC list", "0-3")) << q;
  EXPECT_NE(region_fd(child), "");

  // Its own region: moving the child leaves the parent where it was.
  q = run({kCli, "-p", "-t", "6-7", std::to_string(child)});
  const std::size_t before = records().size();
  EXPECT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, pid_line(child, "current TPC list", "0-3") + pid_line(child, "new TPC list", "6-7")) << q;
  for (const auto& rec : records_after(child, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0xc0)) << rec;
  for (const auto& rec : records_after(pid, before, 0, 3)) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
  q = run({kCli, "-p", std::to_string(pid)});
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3")) << q;

  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
  const auto child_recs = records_of(child);
  ASSERT_FALSE(child_recs.empty());
  EXPECT_EQ(child_recs.front().mask, disable64(0xf)) << "the child's first launch was not masked";
}

TEST_F(E2E, ExecdChildGetsTheParentsCurrentPartition) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--exec-child", "--kernels", "3", "--until-file", until,
                   "--interval-ms", "5", "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const Result q = run({kCli, "-p", "-t", "4-5", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0));
  touch(until);
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0));
  long child = -1;
  for (const auto& l : lines_of(r.out))
    if (l.starts_with("child ")) child = std::stol(l.substr(6));
  ASSERT_GT(child, 0) << r;
  const auto recs = records_of(child);
  ASSERT_EQ(recs.size(), 3u) << read_file(record_);
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0x30)) << rec;
}

// --- 10: an unknown TMD layout while partitioned ----------------------------------------

// Lines of `text` that mention the TMD (also called QMD), case-insensitively.
std::size_t tmd_lines(const std::string& text) {
  std::size_t n = 0;
  for (auto l : lines_of(text)) {
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
    if (l.find("tmd") != std::string::npos || l.find("qmd") != std::string::npos) ++n;
  }
  return n;
}

// nvtaskset run from inside a partitioned CUDA process: the partition the
// user just asked for wins over the one the new task would inherit from its
// (partitioned) parent.
TEST_F(E2E, NvtasksetInsideAPartitionedTaskAppliesItsOwnPartition) {
  const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "1", "--spawn", kCli, "--no-mps", "-t",
                        "4-5", kLauncher, "--kernels", "2"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  const auto recs = records();
  ASSERT_EQ(recs.size(), 3u) << read_file(record_);
  const long parent = recs[0].pid;
  EXPECT_EQ(recs[0].mask, disable64(0xf));
  for (const auto& rec : recs)
    if (rec.pid != parent) {
      EXPECT_EQ(rec.mask, disable64(0x30)) << rec;
    }
}

// A partition is per GPU: with two devices, each launch gets the mask of its
// own device (the shim asks the driver which device the launch is on), and a
// device without a partition is left alone.
TEST_F(E2E, EachGpuGetsItsOwnPartition) {
  env_["FAKECUDA_DEVICES"] = "2";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  for (const auto& [device, want] : std::vector<std::pair<std::string, std::string>>{
           {"0", disable64(0xf)}, {"1", disable64(0x30)}}) {
    ::unlink(record_.c_str());
    const Result r = run({kCli, "--no-mps", "-d", "0", "-t", "0-3", "-d", "1", "-t", "4-5", kLauncher, "--device",
                          device, "--kernels", "2"});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    const auto recs = records();
    ASSERT_EQ(recs.size(), 2u);
    for (const auto& rec : recs) EXPECT_EQ(rec.mask, want) << "device " << device << ": " << rec;
  }
  // Only device 1 partitioned: device 0's launches keep CUDA's own mask.
  ::unlink(record_.c_str());
  Result r = run({kCli, "--no-mps", "-d", "1", "-t", "4-5", kLauncher, "--device", "0", "--kernels", "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(records().size(), 1u);
  EXPECT_EQ(records()[0].mask, "0x5");
  // By full UUID; a UUID prefix that matches both devices is refused.
  for (const std::string spec : {"GPU-fa4ecda0-0000-4000-8000-000000000001", "GPU-fa4ecda0-0000-4000-8000-00000000000"}) {
    ::unlink(record_.c_str());
    r = run({kCli, "--no-mps", "-d", spec, "-t", "4-5", kLauncher, "--device", "1", "--kernels", "1"});
    if (spec.size() == 40) {
      ASSERT_TRUE(ExitedWith(r, 0)) << r;
      EXPECT_EQ(records()[0].mask, disable64(0x30));
    } else {
      EXPECT_TRUE(FailedWithOneLine(r)) << "an ambiguous UUID prefix must be refused: " << r;
    }
  }
}

// --partition-sm-count per GPU: each device answers with its own partition;
// a device without one with the driver's count.
TEST_F(E2E, PartitionSmCountIsPerGpu) {
  env_["FAKECUDA_DEVICES"] = "2";
  for (const auto& [device, want] : std::vector<std::pair<std::string, std::string>>{{"0", "sms 16"}, {"1", "sms 4"}}) {
    const Result r = run({kCli, "--no-mps", "--partition-sm-count", "-d", "1", "-t", "4-5", kLauncher, "--device",
                          device, "--print-sms"});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_NE(r.out.find(want + "\n"), std::string::npos) << "device " << device << ": " << r;
  }
}

// What a task already read stays; a query after `-p` answers with the new
// partition. Only a launch takes the option.
TEST_F(E2E, PartitionSmCountFollowsLaterQueriesOnly) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "--partition-sm-count", "-t", "0-3", kLauncher, "--print-sms", "--until-file",
                   until, "--interval-ms", "5", "--ready-file", ready},
                  env_);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0);
  EXPECT_NE(p.out().find("sms 8\n"), std::string::npos) << p.out();
  const Result q = run({kCli, "-p", "-t", "0", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  const Result bad = run({kCli, "-p", "--partition-sm-count", "-t", "1", std::to_string(pid)});
  EXPECT_TRUE(FailedWithOneLine(bad)) << bad;
  EXPECT_NE(bad.err.find("goes with a launch"), std::string::npos) << bad;
  touch(until);
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.out.find("sms 8\n"), std::string::npos) << r;
  EXPECT_NE(r.out.find("sms-end 2\n"), std::string::npos) << r;
}

// The device cache (topology/include/nvtaskset/device_cache.hpp): with the
// GPUs described in procfs (here a stand-in tree), the second launch takes the
// device list from the cache and the CLI never initialises the driver; any
// change to what decides CUDA's enumeration, and a cache file others could
// have written, make the CLI ask the driver again. Without that procfs tree
// (no NVIDIA kernel driver) there is no cache at all.
class DeviceCache : public E2E {
 protected:
  void SetUp() override {
    E2E::SetUp();
    proc_ = path("proc");
    fs::create_directories(proc_ + "/driver/nvidia/gpus/0000:01:00.0");
    fs::create_directories(proc_ + "/driver/nvidia/gpus/0000:02:00.0");
    write(proc_ + "/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module  580.159.04\n");
    write(gpu_info(1), "Model: \t\t Stand-in\nGPU UUID: \t GPU-fa4ecda0-0000-4000-8000-000000000000\n");
    write(gpu_info(2), "Model: \t\t Stand-in\nGPU UUID: \t GPU-fa4ecda0-0000-4000-8000-000000000001\n");
    env_["NVTASKSET_NVDEBUG_ROOT"] = proc_;
    env_["FAKECUDA_INIT_LOG"] = path("inits");
    env_["FAKECUDA_DEVICES"] = "2";
  }
  static void write(const std::string& file, const std::string& text) { std::ofstream(file) << text; }
  std::string gpu_info(int bus) const {
    return proc_ + "/driver/nvidia/gpus/0000:0" + std::to_string(bus) + ":00.0/information";
  }
  // Launches on `device`, checks the mask the kernel got, and returns the
  // programs that called cuInit ("nvtaskset" is the CLI before its exec).
  std::string launch(const std::string& device, const Env& env) {
    ::unlink(path("inits").c_str());
    ::unlink(record_.c_str());
    const Result r = run({kCli, "--no-mps", "-d", device, "-t", "1-2", kLauncher, "--device", device}, env);
    EXPECT_TRUE(ExitedWith(r, 0)) << r;
    const auto recs = records();
    EXPECT_EQ(recs.size(), 1u);
    for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0x6)) << rec;
    return read_file(path("inits"));
  }
  std::vector<std::string> cache_files() {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path("cache/nvtaskset"), ec))
      if (e.path().filename().string().starts_with("devices-")) out.push_back(e.path().string());
    return out;
  }
  std::string proc_;
};

TEST_F(DeviceCache, SecondLaunchSkipsTheDriverUntilSomethingChanges) {
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
  ASSERT_EQ(cache_files().size(), 1u);
  struct stat st {};
  ASSERT_EQ(::stat(cache_files()[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(launch("1", env_), "init launcher\n") << "fresh cache: the CLI must not initialise the driver";
  EXPECT_EQ(launch("0", env_), "init launcher\n");
  // A device that does not exist is refused from the cache as from the driver.
  Result r = run({kCli, "--no-mps", "-d", "2", "-t", "1", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  // What decides CUDA's enumeration changes: the driver is asked again.
  Env env = env_;
  env["CUDA_VISIBLE_DEVICES"] = "0,1";
  EXPECT_EQ(launch("1", env), "init nvtaskset\ninit launcher\n") << "CUDA_VISIBLE_DEVICES";
  EXPECT_EQ(launch("1", env), "init launcher\n");
  env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  EXPECT_EQ(launch("1", env), "init nvtaskset\ninit launcher\n") << "CUDA_DEVICE_ORDER";
  write(gpu_info(2), "Model: \t\t Stand-in\nGPU UUID: \t GPU-fa4ecda0-0000-4000-8000-000000000009\n");
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << "another GPU";
  write(proc_ + "/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module  580.999.01\n");
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << "another driver";
  fs::create_directories(proc_ + "/driver/nvidia/capabilities/gpu0/mig/gi1/ci0");
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << "a MIG instance";
  EXPECT_EQ(launch("1", env_), "init launcher\n");
  fs::remove(gpu_info(2));
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << "a GPU that cannot be described";
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
}

TEST_F(DeviceCache, UntrustedOrBrokenFilesAreNotUsed) {
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
  ASSERT_EQ(cache_files().size(), 1u);
  const std::string file = cache_files()[0];
  ::chmod(file.c_str(), 0622);  // others could have written it
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
  ASSERT_EQ(cache_files().size(), 1u);
  EXPECT_EQ(launch("1", env_), "init launcher\n") << "rewritten owner-only";
  // A device list that does not parse, or whose driver file changed.
  write(file, "{\"schema\": \"nvtaskset-devices/1\", \"key\": 7}");
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n");
  const std::string text = read_file(file);
  ASSERT_NE(text.find("\"identity\""), std::string::npos);
  std::string edited = text;
  const auto at = edited.find(":", edited.find("\"identity\"") + 11);
  edited.insert(at + 3, "9");
  write(file, edited);
  EXPECT_EQ(launch("1", env_), "init nvtaskset\ninit launcher\n") << edited;
}

TEST_F(E2E, NoDeviceCacheWithoutTheKernelDriversGpuList) {
  env_["FAKECUDA_INIT_LOG"] = path("inits");
  env_["NVTASKSET_NVDEBUG_ROOT"] = path("empty-proc");
  for (int i = 0; i < 2; ++i) {
    ::unlink(path("inits").c_str());
    const Result r = run({kCli, "--no-mps", "-t", "1", kLauncher});
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_EQ(read_file(path("inits")), "init nvtaskset\ninit launcher\n");
  }
}

TEST_F(E2E, UnknownTmdLayoutStopsThePartitionedTask) {
  env_["FAKECUDA_TMD_LAYOUT"] = "unknown";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "3"});
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_FALSE(r.exited && r.code == 0) << "a partitioned task ran unpartitioned" << r;
  const auto ls = lines_of(r.err);
  ASSERT_EQ(ls.size(), 1u) << r;
  EXPECT_EQ(tmd_lines(r.err), 1u) << r;
  for (const auto& rec : records()) EXPECT_EQ(rec.mask, "0x5") << "a launch ran with a guessed mask: " << rec;
}

TEST_F(E2E, UnknownTmdLayoutWithWarnRunsUnmasked) {
  env_["FAKECUDA_TMD_LAYOUT"] = "unknown";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  env_["NVTASKSET_ON_UNSUPPORTED"] = "warn";
  const Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "5"});
  ASSERT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(tmd_lines(r.err), 1u) << "the warning must appear once" << r;
  const auto recs = records();
  ASSERT_EQ(recs.size(), 5u);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec.layout, "unknown") << "TMD bytes changed: " << rec;
    EXPECT_EQ(rec.mask, "0x5") << rec;
  }
}

// A partition names its GPU by UUID. A task that changed CUDA_VISIBLE_DEVICES
// (a wrapper, or a launcher giving each worker its own GPU) may see none of
// its partitioned GPUs: stopped at cuInit in one line, never run unmasked
// while nvtaskset reports a partition. The stand-in applies
// CUDA_VISIBLE_DEVICES at cuInit as the driver does (tests/fakecuda).
TEST_F(E2E, ATaskThatSeesNoneOfItsPartitionedGpusIsStopped) {
  env_["FAKECUDA_DEVICES"] = "2";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  const Result r =
      run({kCli, "--no-mps", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1", kLauncher, "--kernels", "3"});
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_EQ(r.signal, SIGABRT) << r;
  ASSERT_EQ(lines_of(r.err).size(), 1u) << r;
  EXPECT_NE(r.err.find("the partition is for GPU-fa4ecda0-0000-4000-8000-000000000000, which this process does "
                       "not see (1 GPU, CUDA_VISIBLE_DEVICES=1)"),
            std::string::npos)
      << r;
  EXPECT_TRUE(records().empty()) << "a kernel ran unmasked";
}

TEST_F(E2E, APartitionFollowsItsGpuWhateverOrdinalTheTaskGivesIt) {
  env_["FAKECUDA_DEVICES"] = "2";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  // -d 1: the task's only GPU, its device 0, is that GPU.
  Result r = run({kCli, "--no-mps", "-d", "1", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1", kLauncher, "--kernels",
                  "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  auto recs = records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].mask, disable64(0x3)) << recs[0];
  // Reordered: GPU 0 is the task's device 1, partitioned; its device 0 (GPU 1)
  // has no partition and is unrestricted, as documented.
  r = run({kCli, "--no-mps", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1,0", kLauncher, "--device", "1", "--kernels",
           "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(r.err.empty()) << r;
  r = run({kCli, "--no-mps", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1,0", kLauncher, "--device", "0", "--kernels",
           "1"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  recs = records();
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[1].mask, disable64(0x3)) << recs[1];
  EXPECT_EQ(recs[2].mask, "0x5") << recs[2];
}

TEST_F(E2E, ATaskThatSeesNoneOfItsGpusRunsUnmaskedOnlyWhenToldAndSaysSo) {
  env_["FAKECUDA_DEVICES"] = "2";
  env_["FAKECUDA_INITIAL_MASK"] = "0x5";
  env_["NVTASKSET_ON_UNSUPPORTED"] = "warn";
  Proc& p = start({kCli, "--no-mps", "-t", "0-1", "env", "CUDA_VISIBLE_DEVICES=1", kLauncher, "--until-file",
                   path("until"), "--interval-ms", "5", "--ready-file", path("ready")});
  const long pid = wait_ready(path("ready"), p);
  ASSERT_GT(pid, 0) << p.err();
  // -p neither reports nor changes a partition that does not apply.
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{kCli, "-p", std::to_string(pid)}, {kCli, "-p", "-t", "2", std::to_string(pid)}}) {
    const Result q = run(argv);
    EXPECT_TRUE(FailedWithOneLine(q)) << q;
    EXPECT_NE(q.err.find("runs on all TPCs: it sees none of the GPUs its partition is for"), std::string::npos) << q;
  }
  // --status does not list TPCs it does not hold.
  const Result st = run({kCli, "--status", "--json"});
  EXPECT_EQ(nlohmann::json::parse(st.out)["tasks"].size(), 0u) << st.out;
  touch(path("until"));
  const Result r = p.wait();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(lines_of(r.err).size(), 1u) << r;
  EXPECT_NE(r.err.find("its kernels run on all TPCs (NVTASKSET_ON_UNSUPPORTED=warn)"), std::string::npos) << r;
  for (const auto& rec : records()) EXPECT_EQ(rec.mask, "0x5") << rec;
}

// --- 11: environment and exit status ------------------------------------------------------

TEST_F(E2E, EnvironmentOfTheTask) {
  const std::vector<std::string> print{"--print-env", "CUDA_DEVICE_MAX_CONNECTIONS",
                                       "--print-env", "CUDA_DEVICE_MAX_COPY_CONNECTIONS",
                                       "--print-env", "LD_LIBRARY_PATH",
                                       "--print-env", "NVTASKSET_PARTITION",
                                       "--print-env", "LD_PRELOAD",
                                       "--print-env", "ASAN_OPTIONS"};
  auto launch = [&](const Env& env) {
    std::vector<std::string> argv{kCli, "--no-mps", "-t", "0", kLauncher};
    argv.insert(argv.end(), print.begin(), print.end());
    return run(argv, env);
  };
  auto shim_first = [](const std::string& v) {
    const std::string first = v.substr(0, v.find(':'));
    std::error_code ec;
    return fs::equivalent(first, shim_dir(), ec);
  };

  Result r = launch(env_);
  ASSERT_TRUE(ExitedWith(r, 0));
  // Outside MPS, CUDA's default already gives 8 kernel queues (and a plain
  // process's 4 copy queues): left alone (an MPS client's, EnvironmentOfAnMpsClient).
  EXPECT_EQ(printed_env(r.out, "CUDA_DEVICE_MAX_CONNECTIONS").value_or("<unset>"), "<unset>");
  EXPECT_EQ(printed_env(r.out, "CUDA_DEVICE_MAX_COPY_CONNECTIONS").value_or("<unset>"), "<unset>");
  auto ldp = printed_env(r.out, "LD_LIBRARY_PATH");
  ASSERT_TRUE(ldp.has_value());
  // Exactly the shim dir: a trailing ':' would add the working directory.
  EXPECT_EQ(ldp->find(':'), std::string::npos) << *ldp;
  EXPECT_TRUE(shim_first(*ldp)) << *ldp;
  EXPECT_TRUE(printed_env(r.out, "NVTASKSET_PARTITION").has_value());
  // The shim is preloaded too (a wrapper that replaces LD_LIBRARY_PATH keeps
  // it), and an ASan-instrumented program accepts that.
  EXPECT_EQ(printed_env(r.out, "LD_PRELOAD").value_or("<unset>"), kShim);
  EXPECT_EQ(printed_env(r.out, "ASAN_OPTIONS").value_or("<unset>"), "verify_asan_link_order=0");

  Env env = env_;
  env["CUDA_DEVICE_MAX_CONNECTIONS"] = "4";
  env["LD_LIBRARY_PATH"] = "/opt/user/lib:/opt/other";
  env["LD_PRELOAD"] = "libuser.so";
  env["ASAN_OPTIONS"] = "detect_leaks=0";
  r = launch(env);
  EXPECT_EQ(printed_env(r.out, "LD_PRELOAD").value_or("<unset>"), kShim + ":libuser.so");
  EXPECT_EQ(printed_env(r.out, "ASAN_OPTIONS").value_or("<unset>"), "detect_leaks=0:verify_asan_link_order=0");
  ASSERT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(printed_env(r.out, "CUDA_DEVICE_MAX_CONNECTIONS").value_or("<unset>"), "4");
  ldp = printed_env(r.out, "LD_LIBRARY_PATH");
  ASSERT_TRUE(ldp.has_value());
  EXPECT_TRUE(shim_first(*ldp)) << *ldp;
  EXPECT_TRUE(ldp->ends_with(":/opt/user/lib:/opt/other")) << *ldp;
  EXPECT_EQ(std::count(ldp->begin(), ldp->end(), ':'), 2) << *ldp;
}

TEST_F(E2E, ExitStatusIsTheCommands) {
  Result r = run({kCli, "--no-mps", "-t", "0", "sh", "-c", "exit 7"});
  EXPECT_TRUE(ExitedWith(r, 7));
  r = run({kCli, "--no-mps", "-t", "0", "sh", "-c", "exit 0"});
  EXPECT_TRUE(ExitedWith(r, 0));
  r = run({kCli, "--no-mps", "-t", "0", "sh", "-c", "kill -TERM $$"});
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_FALSE(r.exited) << r;
  EXPECT_EQ(r.signal, SIGTERM) << r;
}

TEST_F(E2E, CommandThatCannotRunExits127) {
  for (const std::string& cmd : {std::string("/nonexistent/command"), std::string("nvtaskset-no-such-command")}) {
    SCOPED_TRACE(cmd);
    const Result r = run({kCli, "--no-mps", "-t", "0", cmd});
    EXPECT_TRUE(FailedWithOneLine(r, 127));
  }
  // A name with control characters is echoed escaped: one line, nothing raw.
  const Result r = run({kCli, "--no-mps", "-t", "0", "no-such\x1b[2J\ncommand"});
  EXPECT_TRUE(FailedWithOneLine(r, 127)) << r;
  EXPECT_NE(r.err.find("no-such\\x1b[2J\\x0acommand"), std::string::npos) << r;
}

// --- 12: control-region lifetime ---------------------------------------------------------

TEST_F(E2E, RegionLivesExactlyAsLongAsTheTask) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string region = region_fd(pid);
  ASSERT_NE(region, "") << "pid " << pid << " holds no control region";
  struct stat st;
  ASSERT_EQ(::stat(region.c_str(), &st), 0) << region << ": " << std::strerror(errno);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "region mode " << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(st.st_uid, ::getuid());

  // A PID that is gone: taskset's answer.
  Proc& gone = start({"true"});
  ASSERT_TRUE(ExitedWith(gone.wait(), 0));
  const Result q = run({kCli, "-p", std::to_string(gone.pid)});
  EXPECT_TRUE(FailedWithOneLine(q));
  EXPECT_EQ(q.err, "nvtaskset: pid " + std::to_string(gone.pid) + ": no such process\n") << q;

  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
  // The region lived in the task: nothing of it is left anywhere.
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator("/dev/shm"))
    if (f.path().filename().string().find("nvtaskset." + std::to_string(pid)) != std::string::npos)
      left.push_back(f.path().string());
  EXPECT_TRUE(left.empty()) << ::testing::PrintToString(left);
}

TEST_F(E2E, LeavesNoTemporaryFiles) {
  // nvtaskset execs the command, so nothing it created in $TMPDIR for itself
  // can be cleaned up afterwards: it must be gone before the exec.
  ASSERT_TRUE(ExitedWith(run({kCli, "--no-mps", "-t", "0-3", kLauncher}), 0));
  ASSERT_EQ(records().size(), 1u);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(path("tmp"))) left.push_back(f.path().string());
  EXPECT_TRUE(left.empty()) << "left in $TMPDIR: " << ::testing::PrintToString(left);
}

// --- 13: Hopper needs a topology ---------------------------------------------------------

TEST_F(E2E, HopperLogicalListWithoutTopologyIsAnError) {
  env_["FAKECUDA_CC"] = "9.0";
  const std::string marker = path("marker");
  const Result r = run({kCli, "--no-mps", "-t", "0-3", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_FALSE(exists(marker));
  EXPECT_FALSE(exists(record_));
}

// --- topology files: translation on a Hopper-like layout, end to end ------------------------

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

// --- --verify --------------------------------------------------------------------------------
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

// --- 14: --help ----------------------------------------------------------------------------

// Every long option and NVTASKSET_ variable in --help is documented in the
// man page, and every option the man page documents is in --help: the two
// stay in step with the parser.
TEST_F(E2E, HelpAndManPageAgree) {
  const Result r = run({kCli, "--help"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  // One usage block, then examples (as taskset's usage()).
  EXPECT_EQ(r.out.find("Usage:"), 0u) << r.out;
  EXPECT_EQ(r.out.find("Usage:", 1), std::string::npos) << "two usage blocks:\n" << r.out;
  EXPECT_NE(r.out.find("\nExamples:\n"), std::string::npos) << r.out;
  auto collect = [](const std::string& text, const std::regex& re) {
    std::set<std::string> out;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
      out.insert((*it)[1].str());
    return out;
  };
  const std::string help_options = r.out.substr(r.out.find("Options:"), r.out.find("Examples:") - r.out.find("Options:"));
  const auto help_long = collect(help_options, std::regex("(?:^|[ ,])--([a-z][a-z-]+)"));
  const std::string man = read_file(NVTASKSET_E2E_MAN);
  const auto sec = [&](const std::string& name) {
    const auto a = man.find(".SH " + name + "\n");
    const auto b = man.find("\n.SH ", a + 1);
    return a == std::string::npos ? std::string() : man.substr(a, b - a);
  };
  // Option entries of the OPTIONS section: lines that follow ".TP".
  std::set<std::string> man_long;
  {
    std::istringstream in(sec("OPTIONS"));
    std::string line, prev;
    while (std::getline(in, line)) {
      if (prev == ".TP")
        for (const auto& o : collect(line, std::regex("\\\\-\\\\-([a-z][a-z\\\\-]+)"))) {
          std::string name = o;
          name.erase(std::remove(name.begin(), name.end(), '\\'), name.end());
          man_long.insert(name);
        }
      prev = line;
    }
  }
  ASSERT_FALSE(man_long.empty());
  EXPECT_EQ(help_long, man_long) << "--help and nvtaskset(1) document different options";
  const auto help_env = collect(r.out, std::regex("(NVTASKSET_[A-Z_]+)"));
  const std::string man_env = sec("ENVIRONMENT");
  for (const auto& v : help_env) EXPECT_NE(man_env.find(v), std::string::npos) << v << " is not in nvtaskset(1)";
}

TEST_F(E2E, VersionSaysWhatABugReportNeeds) {
  const Result r = run({kCli, "--version"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("nvtaskset [0-9]+\\.[0-9]+\\.[0-9]+\n"
                                                 "built against CUDA driver API [0-9]+\\.[0-9]+ \\(CUDA_VERSION [0-9]+\\), "
                                                 "control region version [0-9]+\n")))
      << r;
}

TEST_F(E2E, HelpNamesTheOptions) {
  const Result r = run({kCli, "--help"});
  ASSERT_TRUE(ExitedWith(r, 0));
  // As options, not as parts of longer ones ("--physical" contains "-p").
  for (const std::string opt : {"-p", "-t", "--physical", "--no-mps"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex("(^|[\\s,\\[])" + opt + "([\\s,=\\]]|$)")))
        << "--help does not mention " << opt << r;
}

// --- 15: CUDA graphs follow live changes ------------------------------------------------------
// The stand-in builds a graph kernel node's TMD at upload or first launch and
// replays reuse it, as the H200 does (docs/hardware.md): without the shim's
// re-encoding, every replay after a change would keep the old mask.

// Every record of `pid` from a graph kernel node, from index `from` on.
std::vector<Record> graph_records(const std::vector<Record>& all, long pid, std::size_t from = 0) {
  std::vector<Record> out;
  for (std::size_t i = from; i < all.size(); ++i)
    if (all[i].pid == pid && all[i].source.starts_with("graph")) out.push_back(all[i]);
  return out;
}

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

// --- 16: thread-block clusters never hang ------------------------------------------------------
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

// --- 17: hardening: other users, corrupt regions, silent ways to run unpartitioned ---------

TEST_F(E2E, PreloadedRealDriverIsRefused) {
  // The driver in LD_PRELOAD would be loaded instead of the shim: every
  // kernel on all TPCs. Refused before anything runs.
  Env env = env_;
  env["LD_PRELOAD"] = kFake;
  // In the sanitizer build the CLI carries ASan, which otherwise refuses to
  // start with anything preloaded before its runtime.
  env["ASAN_OPTIONS"] = "verify_asan_link_order=0";
  Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "2"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("LD_PRELOAD names the CUDA driver (" + kFake + ")"), std::string::npos) << r;
  EXPECT_TRUE(records().empty());
  // The shim itself may be preloaded.
  env["LD_PRELOAD"] = kShim;
  r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "1"}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(records().size(), 1u);
  EXPECT_EQ(records()[0].mask, disable64(0xf));
}

TEST_F(E2E, TaskThatCannotApplyAPartitionIsNeverReportedAsPartitioned) {
  Env env = env_;
  env["FAKECUDA_TMD_LAYOUT"] = "unknown";
  env["NVTASKSET_ON_UNSUPPORTED"] = "warn";
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                   "--ready-file", ready},
                  env);
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  for (const std::vector<std::string>& args : {std::vector<std::string>{}, std::vector<std::string>{"-t", "4-5"}}) {
    std::vector<std::string> argv{kCli, "-p"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(std::to_string(pid));
    const Result q = run(argv);
    EXPECT_TRUE(FailedWithOneLine(q)) << q;
    EXPECT_NE(q.err.find("pid " + std::to_string(pid) + " runs on all TPCs: "), std::string::npos) << q;
    EXPECT_NE(q.err.find("a TMD layout nvtaskset does not know"), std::string::npos) << q;
  }
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

TEST_F(E2E, AnotherUserCanNeitherTakeOverNorSteerATask) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  // The attack from the hardening issue: while a root task is still
  // starting under a known PID, the other user plants a region file for that
  // PID, mode 0666, with a valid header. Then it tries to repartition.
  const std::string until = path("until"), ready = path("ready"), go = path("go");
  Proc& p = start({"sh", "-c",
                   "while [ ! -e " + go + " ]; do sleep 0.01; done; exec " + kCli + " --no-mps -t 0-3 " + kLauncher +
                       " --until-file " + until + " --interval-ms 5 --ready-file " + ready});
  const std::string planted = "/dev/shm/nvtaskset." + std::to_string(p.pid);
  const Result plant = run(as_user(*other, {"sh", "-c", "umask 0; head -c 4096 /dev/zero > " + planted}));
  ASSERT_TRUE(ExitedWith(plant, 0)) << plant;
  cleanup_.push_back(planted);
  {
    // A valid-looking header in it, as the attacker would write.
    const int fd = ::open(planted.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    auto* h = static_cast<nvtaskset::ctl::Header*>(
        ::mmap(nullptr, sizeof(nvtaskset::ctl::Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ASSERT_NE(h, MAP_FAILED);
    nvtaskset::ctl::init_header(*h, {});
    h->pid = p.pid;
    h->start_time = nvtaskset::ctl::process_start_time(p.pid);
    ::munmap(h, sizeof *h);
    ::close(fd);
  }
  touch(go);
  const long pid = wait_ready(ready, p);
  ASSERT_EQ(pid, p.pid) << p.wait();
  const std::string spid = std::to_string(pid);
  // The other user can neither query nor change it.
  for (const std::vector<std::string>& args : {std::vector<std::string>{"-p", "-t", "6-7", spid},
                                              std::vector<std::string>{"-p", spid}}) {
    std::vector<std::string> argv{kCli};
    argv.insert(argv.end(), args.begin(), args.end());
    const Result q = run(as_user(*other, argv));
    EXPECT_TRUE(FailedWithOneLine(q)) << q;
    EXPECT_NE(q.err.find("belongs to another user: only its owner and root can query or change its TPCs"),
              std::string::npos)
        << q;
  }
  // The task never used the planted file, and kept its partition.
  const Result q = run({kCli, "-p", spid});
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3")) << q;
  const std::size_t before = records().size();
  for (const auto& rec : records_after(pid, before, 0, 5)) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
  struct stat st {};
  ASSERT_EQ(::stat(planted.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, other->first);
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// The task's owner can write anything into its region: corrupt states must
// not hang the task or the CLI, crash the task, or make either lie.
class CorruptRegion : public E2E {
 protected:
  long start_task() {
    const std::string ready = path("ready");
    task_ = &start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", path("until"), "--interval-ms", "2",
                    "--ready-file", ready});
    const long pid = wait_ready(ready, *task_);
    if (pid <= 0) return -1;
    const std::string fd = region_fd(pid);
    if (fd.empty()) return -1;
    fd_ = ::open(fd.c_str(), O_RDWR);
    if (fd_ < 0) return -1;
    void* m = ::mmap(nullptr, sizeof(nvtaskset::ctl::Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) return -1;
    h_ = static_cast<nvtaskset::ctl::Header*>(m);
    return pid;
  }
  void TearDown() override {
    if (h_) ::munmap(h_, sizeof *h_);
    if (fd_ >= 0) ::close(fd_);
    E2E::TearDown();
  }
  nvtaskset::ctl::MaskBuffer& published() {
    auto& e = h_->devices[0];
    return e.buffer[e.generation.load() & 1];
  }
  // The CLI answers a query promptly (a bounded read, not a wait: a few ms;
  // 3 s leaves room for the sanitizer build on a loaded 2-core CI machine,
  // where 1 s was exceeded by 50 ms), with one line.
  Result query_fails(long pid) {
    const auto t0 = std::chrono::steady_clock::now();
    Result q = run({kCli, "-p", std::to_string(pid)});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
    EXPECT_TRUE(FailedWithOneLine(q)) << q;
    return q;
  }
  // The task keeps launching, on TPCs 0-3.
  void still_on_0_3(long pid) {
    const std::size_t before = records().size();
    for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;
  }
  Proc* task_ = nullptr;
  int fd_ = -1;
  nvtaskset::ctl::Header* h_ = nullptr;
};

TEST_F(CorruptRegion, NoStateHangsCrashesOrLies) {
  const long pid = start_task();
  ASSERT_GT(pid, 0);
  const std::string spid = std::to_string(pid);

  // 1. A sequence that stays odd (a writer killed as it published).
  auto& pub = published();
  const std::uint64_t seq = pub.seq.load();
  pub.seq.store(seq | 1);
  Result q = query_fails(pid);
  EXPECT_NE(q.err.find("control region of pid " + spid + " is corrupt: device slot 0 cannot be read consistently"),
            std::string::npos)
      << q;
  still_on_0_3(pid);  // the last good partition
  pub.seq.store(seq);

  // 2. A writer killed mid-write leaves the other buffer odd: the next
  // writer repairs it, and the change lands.
  auto& e = h_->devices[0];
  auto& other = e.buffer[(e.generation.load() + 1) & 1];
  other.seq.store(other.seq.load() | 1);
  q = run({kCli, "-p", "-t", "4-5", spid});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  std::size_t before = records().size();
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x30)) << rec;
  q = run({kCli, "-p", "-t", "0-3", spid});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  still_on_0_3(pid);

  // 3. An active partition that enables nothing: every kernel would hang.
  auto& p3 = published();
  const std::uint64_t lo = p3.enabled[0].load();
  p3.enabled[0].store(0);
  q = query_fails(pid);
  EXPECT_NE(q.err.find("device slot 0 enables no TPC"), std::string::npos) << q;
  still_on_0_3(pid);  // not the all-disabled mask
  p3.enabled[0].store(lo);

  // 4. An impossible device: refused at once, no huge topology.
  const std::uint32_t sms = e.sm_count;
  e.sm_count = 0xfffffffe;
  q = query_fails(pid);
  EXPECT_NE(q.err.find("describes an impossible GPU"), std::string::npos) << q;
  e.sm_count = sms;

  // 5. A logical list that does not match the mask the kernels get.
  auto& p5 = published();
  const std::uint64_t tpcs = p5.tpcs[0].load();
  p5.tpcs[0].store(0x3);
  q = query_fails(pid);
  EXPECT_NE(q.err.find("its TPC list 0-1 does not match the mask its kernels get"), std::string::npos) << q;
  p5.tpcs[0].store(tpcs);

  // 6. Every slot in use: the query shows what the shim applies, no more.
  for (unsigned i = 1; i < nvtaskset::ctl::kMaxDevices; ++i) {
    auto& d = h_->devices[i];
    std::memset(d.uuid, static_cast<int>(0x40 + i), sizeof d.uuid);
    d.buffer[0].kind.store(1);
    d.buffer[0].enabled[0].store(0xff);
    d.buffer[0].tpcs[0].store(0xff);
    d.generation.store(0);
    d.in_use.store(1);
  }
  q = run({kCli, "-p", spid});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-3")) << q;
  still_on_0_3(pid);

  // 7. Its size cannot change: a truncation fails, the task lives on.
  EXPECT_NE(::ftruncate(fd_, 0), 0);
  still_on_0_3(pid);

  // 8. Random bytes over everything: the CLI refuses, the task keeps its
  // last good partition and says so once.
  std::uint32_t x = 7;
  auto* bytes = reinterpret_cast<unsigned char*>(h_);
  for (std::size_t i = 0; i < sizeof(nvtaskset::ctl::Header); ++i) bytes[i] = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 16);
  q = query_fails(pid);
  EXPECT_NE(q.err.find("is corrupt"), std::string::npos) << q;
  still_on_0_3(pid);
  touch(path("until"));
  const Result r = task_->wait();
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("the control region is corrupt; using the last partition read"), std::string::npos) << r;
  EXPECT_NE(r.err.find("cannot be read consistently; using the last partition read"), std::string::npos) << r;
}

TEST_F(E2E, KilledWritersNeverHangTheTaskOrTheCli) {
  const std::string until = path("until"), ready = path("ready");
  Proc& p = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "2",
                   "--ready-file", ready});
  const long pid = wait_ready(ready, p);
  ASSERT_GT(pid, 0) << p.wait();
  const std::string spid = std::to_string(pid);
  std::uint32_t seed = 99;
  for (int i = 0; i < 40; ++i) {
    seed = seed * 1664525u + 1013904223u;
    Proc& w = start({kCli, "-p", "-t", (i % 2) ? "4-5" : "6-7", spid});
    std::this_thread::sleep_for(std::chrono::microseconds(seed % 20000));
    w.kill_group();
  }
  // Whatever the writers left: the CLI answers at once, a change lands, the task launches.
  const Result q = run({kCli, "-p", "-t", "1-2", spid}, env_, 5s);
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  const std::size_t before = records().size();
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, disable64(0x6)) << rec;
  touch(until);
  EXPECT_TRUE(ExitedWith(p.wait(), 0));
}

// --- 18: input hardening: zombies, syntax before the driver, overlong lists, log levels ------

// The state letter of /proc/<pid>/stat (after the last ')'), or '?'.
char proc_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

// --- a killed, unreaped task is dead --------------------------------------------------

TEST_F(E2E, ZombieTaskIsRefused) {
  const std::string until = path("until"), ready = path("ready");
  Proc& task = start({kCli, "--no-mps", "-t", "0-3", kLauncher, "--until-file", until, "--interval-ms", "5",
                      "--ready-file", ready},
                     env_);
  ASSERT_TRUE(wait_until([&] { return exists(ready); })) << task.wait();
  const pid_t pid = task.pid;  // nvtaskset execs the launcher: same process
  ASSERT_EQ(std::stol(read_file(ready)), pid);
  const std::string spid = std::to_string(pid);

  // Control: while it runs, -p answers.
  Result q = run({kCli, "-p", spid});
  ASSERT_TRUE(ExitedWith(q, 0));
  EXPECT_EQ(q.out, "pid " + spid + "'s current TPC list: 0-3\n") << q;

  // Killed; we are its parent and do not reap it, so it stays a zombie whose
  // control region the shim never got to remove.
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(wait_until([&] { return proc_state(pid) == 'Z'; })) << "state " << proc_state(pid);

  q = run({kCli, "-p", spid});
  EXPECT_TRUE(FailedWithOneLine(q));
  EXPECT_EQ(q.err, "nvtaskset: pid " + spid + ": no such process\n") << q;
  EXPECT_EQ(q.out, "") << q;
  q = run({kCli, "-p", "-t", "5", spid});
  EXPECT_TRUE(FailedWithOneLine(q));
  EXPECT_EQ(q.out, "") << "reported a change to a dead task" << q;
  EXPECT_EQ(proc_state(pid), 'Z');

  const Result r = task.wait();
  EXPECT_FALSE(r.exited);
  EXPECT_EQ(r.signal, SIGKILL);
}

// --- syntax errors come before any driver access ------------------------------------

struct BadSyntax {
  std::string name;
  std::vector<std::string> args;  // between --no-mps and the command
  std::string error;              // the whole stderr line, after "nvtaskset: "
};

void PrintTo(const BadSyntax& c, std::ostream* os) { *os << c.name; }

class SyntaxBeforeDriver : public E2E, public ::testing::WithParamInterface<BadSyntax> {};

TEST_P(SyntaxBeforeDriver, IsReportedAsSuch) {
  // No driver anywhere: the stand-in is replaced by a file that does not exist.
  env_["NVTASKSET_REAL_LIBCUDA"] = path("no-such-libcuda.so.1");
  const std::string marker = path("marker");
  // Control: a good list gets as far as the (missing) driver.
  Result r = run({kCli, "--no-mps", "-t", "0-3", "touch", marker});
  ASSERT_TRUE(FailedWithOneLine(r));
  ASSERT_NE(r.err.find("no CUDA driver found"), std::string::npos) << r;

  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), GetParam().args.begin(), GetParam().args.end());
  argv.insert(argv.end(), {"touch", marker});
  r = run(argv);
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: " + GetParam().error + "\n") << r;
  EXPECT_FALSE(exists(marker)) << "the command ran";
}

INSTANTIATE_TEST_SUITE_P(
    Hardening, SyntaxBeforeDriver,
    ::testing::Values(
        BadSyntax{"ZeroStride", {"-t", "0-3:0"}, "invalid TPC list '0-3:0': stride must be at least 1"},
        BadSyntax{"StrideOf2To64Minus1",
                  {"-t", "50-53:18446744073709551615"},
                  "invalid TPC list '50-53:18446744073709551615': stride 18446744073709551615 is larger than 4095"},
        BadSyntax{"GpcList", {"-g", "1-"}, "invalid GPC list '1-': range without an end"},
        BadSyntax{"PositionalMask", {"0xzz"}, "invalid TPC mask '0xzz': 'z' is not a hex digit"},
        BadSyntax{"Physical", {"--physical", "0x"}, "invalid physical mask '0x': no digits"},
        BadSyntax{"SecondDevice", {"-d", "0", "-t", "0-3", "-d", "1", "-t", "x"},
                  "invalid TPC list 'x': 'x' is not a number or range"},
        BadSyntax{"MaskAfterDevice", {"-d", "1", "0x1g"}, "invalid TPC mask '0x1g': 'g' is not a hex digit"},
        BadSyntax{"ControlCharacters", {"-t", "1\n2"}, "invalid TPC list '1\\x0a2': unexpected '\\x0a2'"}),
    [](const auto& info) { return info.param.name; });

TEST_F(E2E, PidModeChecksSyntaxFirstToo) {
  env_["NVTASKSET_REAL_LIBCUDA"] = path("no-such-libcuda.so.1");
  // PID 1 exists and is not under nvtaskset: the list is still the error.
  Result r = run({kCli, "-p", "-t", "0-3:0", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: invalid TPC list '0-3:0': stride must be at least 1\n") << r;
  r = run({kCli, "-p", "0xzz", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: invalid TPC mask '0xzz': 'z' is not a hex digit\n") << r;
  // Control: with good syntax, the PID is the error.
  r = run({kCli, "-p", "-t", "0-3", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: pid 1 is not running under nvtaskset\n") << r;
}

TEST_F(E2E, OverlongListIsRefusedAtOnce) {
  std::string huge;
  while (huge.size() < 120 * 1024) huge += "0-4095:3,";
  huge += "0";
  const std::string marker = path("marker");
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run({kCli, "--no-mps", "-t", huge, "touch", marker});
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_NE(r.err.find("longer than 4096 characters"), std::string::npos) << r;
  EXPECT_LT(r.err.size(), 200u) << r;
  EXPECT_LT(elapsed, 3s) << "took 4-60 s before the bound";
  EXPECT_FALSE(exists(marker));
}

// --- NVTASKSET_LOG ---------------------------------------------------------------------

TEST_F(E2E, LogLevelIsCaseInsensitiveAndUnknownLevelsWarn) {
  // `true` is no CUDA program, so only the CLI logs here.
  Env env = env_;
  env["NVTASKSET_LOG"] = "bogus";
  Result r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(r.err,
            "nvtaskset: warning: NVTASKSET_LOG=bogus: unknown level (trace, debug, info, warn, error, off); using warn\n")
      << r;

  env["NVTASKSET_LOG"] = "DEBUG";  // spdlog's from_str turned this into "off"
  r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_NE(r.err.find("nvtaskset: debug: CUDA driver: " + kFake + "\n"), std::string::npos) << r;

  env["NVTASKSET_LOG"] = "Warn";
  r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(r.err, "") << r;

  // Unknown means warn, not off: a warning still reaches the user.
  env["NVTASKSET_LOG"] = "INFOO";
  env["FAKECUDA_CC"] = "9.0";  // a Hopper without a known layout: the physical mask warning
  r = run({kCli, "--no-mps", "--physical", "0xf", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(lines_of(r.err).size(), 2u) << r;
  EXPECT_NE(r.err.find("NVTASKSET_LOG=INFOO: unknown level"), std::string::npos) << r;
}

}  // namespace
