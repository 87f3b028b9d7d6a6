// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of launching a command under a partition: every launch gets
// the mask of a TPC list (-t) or a hex mask, raw physical bits reach the
// TMD's 128-bit field, --partition-sm-count, the task's environment and exit
// status, its control region, and its children.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- -t and hex masks: every launch gets the mask ------------------------------------------------

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

// --- --physical: Hopper and Blackwell layouts ----------------------------------------------------

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

// --- the task's environment and exit status ------------------------------------------------------

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
  // (By name where its path holds a space: ShimUnderAPathWithASpace.)
  const std::string preload = shim_dir().find(' ') == std::string::npos ? kShim : "libcuda.so.1";
  EXPECT_EQ(printed_env(r.out, "LD_PRELOAD").value_or("<unset>"), preload);
  EXPECT_EQ(printed_env(r.out, "ASAN_OPTIONS").value_or("<unset>"), "verify_asan_link_order=0");

  Env env = env_;
  env["CUDA_DEVICE_MAX_CONNECTIONS"] = "4";
  env["LD_LIBRARY_PATH"] = "/opt/user/lib:/opt/other";
  env["LD_PRELOAD"] = "libuser.so";
  env["ASAN_OPTIONS"] = "detect_leaks=0";
  r = launch(env);
  EXPECT_EQ(printed_env(r.out, "LD_PRELOAD").value_or("<unset>"), preload + ":libuser.so");
  EXPECT_EQ(printed_env(r.out, "ASAN_OPTIONS").value_or("<unset>"), "detect_leaks=0:verify_asan_link_order=0");
  ASSERT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(printed_env(r.out, "CUDA_DEVICE_MAX_CONNECTIONS").value_or("<unset>"), "4");
  ldp = printed_env(r.out, "LD_LIBRARY_PATH");
  ASSERT_TRUE(ldp.has_value());
  EXPECT_TRUE(shim_first(*ldp)) << *ldp;
  EXPECT_TRUE(ldp->ends_with(":/opt/user/lib:/opt/other")) << *ldp;
  EXPECT_EQ(std::count(ldp->begin(), ldp->end(), ':'), 2) << *ldp;
}

// ld.so splits LD_PRELOAD at ' ' and ':' and LD_LIBRARY_PATH at ':' and ';',
// with no escape. A shim under a path with a space is preloaded by name,
// which LD_LIBRARY_PATH, where its directory comes first, resolves; one
// under a path with a ':' or ';' cannot be named at all: refused, since the
// task would find the real driver and run on all TPCs.
TEST_F(E2E, ShimUnderAPathWithASpace) {
  const std::string spaced = path("shim dir");
  fs::create_directory(spaced);
  fs::copy_file(kShim, spaced + "/libcuda.so.1");
  Env env = env_;
  env["NVTASKSET_SHIM_DIR"] = spaced;
  Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "2", "--print-env", "LD_PRELOAD",
                  "--print-env", "LD_LIBRARY_PATH"},
                 env);
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(printed_env(r.out, "LD_PRELOAD").value_or("<unset>"), "libcuda.so.1");
  EXPECT_EQ(printed_env(r.out, "LD_LIBRARY_PATH").value_or("<unset>"), spaced);
  const auto recs = records_of(printed_pid(r.out));
  ASSERT_EQ(recs.size(), 2u);
  for (const auto& rec : recs) EXPECT_EQ(rec.mask, disable64(0xf)) << rec;

  for (const std::string name : {"shim:dir", "shim;dir"}) {
    ::unlink(record_.c_str());
    const std::string bad = path(name);
    fs::create_directory(bad);
    fs::copy_file(kShim, bad + "/libcuda.so.1");
    env["NVTASKSET_SHIM_DIR"] = bad;
    r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "1"}, env);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find("nvtaskset's shim directory " + bad +
                         " holds a ':' or ';', which LD_LIBRARY_PATH cannot name; install nvtaskset under a path"),
              std::string::npos)
        << r;
    EXPECT_FALSE(exists(record_)) << name;
  }
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

// --- the control region lives as long as the task ------------------------------------------------

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

// --- children: forked, exec'd, and nvtaskset inside a task ---------------------------------------

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

}  // namespace
