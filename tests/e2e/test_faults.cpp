// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of faults and hardening: a driver path that names the shim,
// an unknown TMD layout, a preloaded driver, another user, corrupt control
// regions and killed writers: never a hang, a crash, or a task that runs
// unpartitioned while nvtaskset says otherwise.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- the shim never loads itself as the real driver ----------------------------------------------

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

// --- an unknown TMD layout while partitioned -----------------------------------------------------

// Lines of `text` that mention the TMD (also called QMD), case-insensitively.
std::size_t tmd_lines(const std::string& text) {
  std::size_t n = 0;
  for (auto l : lines_of(text)) {
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
    if (l.find("tmd") != std::string::npos || l.find("qmd") != std::string::npos) ++n;
  }
  return n;
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

// --- silent ways to run unpartitioned, other users, corrupt regions ------------------------------

TEST_F(E2E, PreloadedRealDriverIsRefused) {
  // The driver in LD_PRELOAD would be loaded instead of the shim: every
  // kernel on all TPCs. Refused before anything runs.
  Env env = env_;
  const std::string driver = preloadable(kFake);
  env["LD_PRELOAD"] = driver;
  // In the sanitizer build the CLI carries ASan, which otherwise refuses to
  // start with anything preloaded before its runtime.
  env["ASAN_OPTIONS"] = "verify_asan_link_order=0";
  Result r = run({kCli, "--no-mps", "-t", "0-3", kLauncher, "--kernels", "2"}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("LD_PRELOAD names the CUDA driver (" + driver + ")"), std::string::npos) << r;
  EXPECT_TRUE(records().empty());
  // The shim itself may be preloaded.
  env["LD_PRELOAD"] = preloadable(kShim);
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
                   "while [ ! -e \"$1\" ]; do sleep 0.01; done; exec \"$0\" --no-mps -t 0-3 \"$2\" --until-file \"$3\" "
                   "--interval-ms 5 --ready-file \"$4\"",
                   kCli, go, kLauncher, until, ready});
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

}  // namespace
