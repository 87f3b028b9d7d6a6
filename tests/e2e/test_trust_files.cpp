// SPDX-License-Identifier: Apache-2.0
// Every shared file nvtaskset trusts is checked as OpenSSH checks its own
// (control/trusted_file.hpp): the topology and device caches, a topology
// file named in the environment, the public status entries, and the MPS pipe
// and log directories. Each test is an attack from the fault-injection
// review, run with the real CLI against the stand-in driver; the
// second-user ones need root (CI runs as root).
#include "e2e_fixture.hpp"

#include <sys/resource.h>

using namespace e2e;

namespace {

// The stand-in's device 0 with bit k + 8 for TPC k: a layout under which
// `-t 0-3` runs on the TPCs that bits 8-11 control.
constexpr std::array<unsigned, 8> kForgedBits = {8, 9, 10, 11, 12, 13, 14, 15};

// The CLI under an address-space limit, so that an allocation sized by
// untrusted input fails at once instead of taking seconds and gigabytes.
// ASan reserves terabytes of address space for its shadow memory: under it
// the limit is left out (the test then relies on its timeout).
std::vector<std::string> limited(std::vector<std::string> argv) {
#if defined(__SANITIZE_ADDRESS__)
  return argv;
#else
  argv.insert(argv.begin(), {"prlimit", "--as=400000000", "--"});
  return argv;
#endif
}

class TrustFiles : public E2E {
 protected:
  void SetUp() override {
    E2E::SetUp();
    // The second user must reach the directories below, as it reaches /tmp.
    ::chmod(dir_.c_str(), 0711);
  }

  // Where the CLI looks for its caches: $XDG_CACHE_HOME/nvtaskset.
  std::string cache_dir() const { return path("cache/nvtaskset"); }
  std::string topology_cache() const { return cache_dir() + "/" + kStandInUuid + "-cuda13000.json"; }
  void hopper() { env_["FAKECUDA_CC"] = "9.0"; }
  static void write(const std::string& file, const std::string& text, mode_t mode = 0644) {
    std::ofstream(file) << text;
    ::chmod(file.c_str(), mode);
  }
  static void give(const std::string& p, std::pair<uid_t, gid_t> user) {
    ASSERT_EQ(::chown(p.c_str(), user.first, user.second), 0) << p << ": " << std::strerror(errno);
  }
  Result launch_0_3() { return run({kCli, "--no-mps", "-t", "0-3", kLauncher}); }
};

// Hole 4: a cache directory another user can write (a shared XDG_CACHE_HOME,
// kept by `sudo -E`) held a layout that made root's `-t 0-3` run on the TPCs
// of bits 8-11. A cache file or directory that another user could have
// written is now ignored, in one warning, and the layout is measured anew:
// on the stand-in, which cannot be calibrated, the launch is then refused;
// on a GPU it runs on the TPCs calibration finds. Never on the forged ones.
TEST_F(TrustFiles, ATopologyCacheOthersCouldHaveWrittenNeverMovesATask) {
  hopper();
  ASSERT_EQ(::mkdir(path("cache").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(cache_dir().c_str(), 0755), 0);
  // This user's own cache is used: the right TPCs, and no warning.
  write(topology_cache(), hopper_topology_json());
  Result r = launch_0_3();
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  ASSERT_EQ(records().size(), 1u);
  EXPECT_EQ(records()[0].mask, hopper_disable({0, 1, 2, 3}));
  EXPECT_EQ(r.err.find("cache not used"), std::string::npos) << r;

  // The directory is writable by every user, and the file was replaced.
  ::unlink(record_.c_str());
  ::chmod(cache_dir().c_str(), 0777);
  write(topology_cache(), hopper_topology_json(kStandInUuid, kForgedBits));
  r = launch_0_3();
  EXPECT_FALSE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(records().empty()) << "no kernel may run with the forged layout: " << records()[0];
  EXPECT_NE(r.err.find("topology cache not used: " + cache_dir() + " is writable by every user"), std::string::npos)
      << r;
  EXPECT_NE(r.err.find("the TPC layout of device 0"), std::string::npos) << r;

  // The file and directory of another user.
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  ::chmod(cache_dir().c_str(), 0755);
  give(cache_dir(), *other);
  give(topology_cache(), *other);
  r = launch_0_3();
  EXPECT_FALSE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(records().empty()) << records()[0];
  EXPECT_NE(r.err.find("topology cache not used: " + topology_cache() + " is owned by uid " +
                       std::to_string(other->first) + ", neither this user (uid 0) nor root"),
            std::string::npos)
      << r;
}

// A FIFO planted as a cache file hung every launch in open(): the topology
// cache (read with an ifstream) and the device cache (opened without
// O_NONBLOCK). Now it is no cache, said once, and the launch goes on.
TEST_F(TrustFiles, AFifoAsACacheFileNeverHangsALaunch) {
  // The device cache exists only where the kernel driver lists its GPUs.
  const std::string proc = path("proc");
  fs::create_directories(proc + "/driver/nvidia/gpus/0000:01:00.0");
  write(proc + "/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module  580.159.04\n");
  write(proc + "/driver/nvidia/gpus/0000:01:00.0/information", "GPU UUID: \t " + kStandInUuid + "\n");
  env_["NVTASKSET_NVDEBUG_ROOT"] = proc;
  Result r = run({kCli, "--no-mps", "-t", "1-2", kLauncher});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  std::string devices;
  for (const auto& e : fs::directory_iterator(cache_dir()))
    if (e.path().filename().string().starts_with("devices-")) devices = e.path().string();
  ASSERT_NE(devices, "") << "the first launch caches the device list";
  ::unlink(devices.c_str());
  ASSERT_EQ(::mkfifo(devices.c_str(), 0600), 0);
  r = run({kCli, "--no-mps", "-t", "1-2", kLauncher}, env_, 10s);
  ASSERT_FALSE(r.timed_out) << "a FIFO as the device cache hung the launch" << r;
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("device cache not used: " + devices + " is not a regular file"), std::string::npos) << r;

  // The cached device list says the stand-in is what it was (cc 8.6); the
  // topology cache is read for a Hopper GPU only.
  env_.erase("NVTASKSET_NVDEBUG_ROOT");
  hopper();
  ASSERT_EQ(::mkfifo(topology_cache().c_str(), 0644), 0);
  r = run({kCli, "--no-mps", "-t", "0-3", kLauncher}, env_, 10s);
  ASSERT_FALSE(r.timed_out) << "a FIFO as the topology cache hung the launch" << r;
  EXPECT_NE(r.err.find("topology cache not used: " + topology_cache() + " is not a regular file"), std::string::npos)
      << r;
}

// A symbolic link to /dev/zero as the cache file was followed and read until
// memory ran out; an oversized file was read whole. Neither is read now.
TEST_F(TrustFiles, LinksAndOversizedCacheFilesAreNeverRead) {
  hopper();
  fs::create_directories(cache_dir());
  fs::create_symlink("/dev/zero", topology_cache());
  Result r = run(limited({kCli, "--no-mps", "-t", "0-3", kLauncher}));
  ASSERT_FALSE(r.timed_out) << r;
  EXPECT_NE(r.err.find("topology cache not used: " + topology_cache() + " is a symbolic link, which is never followed"),
            std::string::npos)
      << r;
  EXPECT_EQ(r.err.find("bad_alloc"), std::string::npos) << r;
  // A link to a good file is not followed either: whoever placed the link
  // chose what it names.
  write(path("good.json"), hopper_topology_json());
  fs::remove(topology_cache());
  fs::create_symlink(path("good.json"), topology_cache());
  r = launch_0_3();
  EXPECT_FALSE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("is a symbolic link, which is never followed"), std::string::npos) << r;
  fs::remove(topology_cache());
  write(topology_cache(), std::string(300 * 1024, ' ') + hopper_topology_json());
  r = launch_0_3();
  EXPECT_FALSE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("holds " + std::to_string(300 * 1024 + hopper_topology_json().size()) +
                       " bytes, more than the 262144 this file may have"),
            std::string::npos)
      << r;
  EXPECT_TRUE(records().empty());
}

// NVTASKSET_TOPOLOGY crosses `sudo -E` like XDG_CACHE_HOME: the file it names
// is held to the same rules. The user asked for that file, so one that fails
// them is an error, in one line, before anything runs.
TEST_F(TrustFiles, ATopologyFileOthersCouldHaveWrittenIsRefused) {
  hopper();
  const std::string file = path("topology.json");
  write(file, hopper_topology_json(kStandInUuid, kForgedBits), 0666);
  env_["NVTASKSET_TOPOLOGY"] = file;
  Result r = launch_0_3();
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("topology file " + file + " is writable by every user"), std::string::npos) << r;
  EXPECT_TRUE(records().empty());
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  ::chmod(file.c_str(), 0644);
  give(file, *other);
  r = launch_0_3();
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find(file + " is owned by uid " + std::to_string(other->first)), std::string::npos) << r;
  EXPECT_TRUE(records().empty());
}

// Hole 8: a pipe directory another user made (/tmp/nvidia-mps created
// first) is where root started its daemon, and a fake daemon of theirs
// there delayed every launch and --status. The CLI now neither starts nor
// asks a daemon there: a launch is refused in one line that says what to
// do; --status says, in one warning, that it lists no MPS servers.
TEST_F(TrustFiles, AnMpsPipeDirectoryOthersControlIsNeverUsed) {
  env_["NVTASKSET_MPS_CONTROL"] = kFakeMps;
  env_["FAKE_MPS_IDLE_MS"] = "20000";
  // A pipe directory under one every user can write: anyone could put
  // another tree in its place.
  const std::string open_parent = path("open");
  ASSERT_EQ(::mkdir(open_parent.c_str(), 0777), 0);
  ::chmod(open_parent.c_str(), 0777);
  const std::string inside = open_parent + "/mps";
  ASSERT_EQ(::mkdir(inside.c_str(), 0755), 0);
  env_["CUDA_MPS_PIPE_DIRECTORY"] = inside;
  const std::string marker = path("marker");
  Result r = run({kCli, "-t", "0", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("MPS pipe directory not used: " + open_parent + " is writable by every user"),
            std::string::npos)
      << r;
  EXPECT_NE(r.err.find("; set CUDA_MPS_PIPE_DIRECTORY to a directory of your own, or use --no-mps"), std::string::npos)
      << r;
  EXPECT_FALSE(exists(marker));
  EXPECT_FALSE(exists(inside + "/control")) << "a daemon was started there";

  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  // Root's own pipe directory as the real daemon leaves it (mode 0777), in
  // which the other user started a daemon of theirs first: its socket is
  // theirs, and nothing is asked of it.
  {
    const std::string roots = path("mps-roots");
    ASSERT_EQ(::mkdir(roots.c_str(), 0777), 0);
    ::chmod(roots.c_str(), 0777);
    env_["CUDA_MPS_PIPE_DIRECTORY"] = roots;
    Env theirs = env_;
    theirs["CUDA_MPS_LOG_DIRECTORY"] = path("their-log");
    ASSERT_EQ(::mkdir(path("their-log").c_str(), 0755), 0);
    give(path("their-log"), *other);
    ASSERT_TRUE(ExitedWith(run(as_user(*other, {kFakeMps, "-d"}), theirs), 0));
    ASSERT_TRUE(exists(roots + "/control"));
    r = run({kCli, "-t", "0", "touch", marker});
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_NE(r.err.find(roots + "/control is owned by uid " + std::to_string(other->first)), std::string::npos) << r;
    EXPECT_FALSE(exists(marker));
    // Their daemon also ends by itself once idle (FAKE_MPS_IDLE_MS).
    run(as_user(*other, {"sh", "-c", "echo quit | \"$0\"", kFakeMps}), theirs);
  }
  const std::string pipe = path("mps-shared");
  ASSERT_EQ(::mkdir(pipe.c_str(), 0755), 0);
  env_["CUDA_MPS_PIPE_DIRECTORY"] = pipe;

  // The other user's own directory, with their daemon in it, which would
  // answer each get_client_list late.
  ::chmod(pipe.c_str(), 0755);
  give(pipe, *other);
  ASSERT_EQ(::mkdir((pipe + "/log").c_str(), 0755), 0);
  give(pipe + "/log", *other);
  Env theirs = env_;
  theirs["CUDA_MPS_LOG_DIRECTORY"] = pipe + "/log";
  theirs["FAKE_MPS_SERVERS"] = "1:3";
  theirs["FAKE_MPS_CLIENT_LIST_DELAY_MS"] = "2900";
  const Result d = run(as_user(*other, {kFakeMps, "-d"}), theirs);
  ASSERT_TRUE(ExitedWith(d, 0)) << d;
  ASSERT_TRUE(exists(pipe + "/control"));
  r = run({kCli, "-t", "0", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("MPS pipe directory not used: " + pipe + " is owned by uid " + std::to_string(other->first)),
            std::string::npos)
      << r;
  EXPECT_FALSE(exists(marker));
  r = run({kCli, "--status"});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("MPS servers not listed: " + pipe + " is owned by uid"), std::string::npos) << r;
  EXPECT_EQ(r.out.find("mps: server"), std::string::npos) << r;
  EXPECT_EQ(read_file(pipe + "/log/control.log").find("get_server_list"), std::string::npos)
      << "the daemon was asked: " << read_file(pipe + "/log/control.log");
  run(as_user(*other, {"sh", "-c", "echo quit | \"$0\"", kFakeMps}), theirs);
}

// A daemon that answers slowly (a fake one answered each get_client_list
// 2.9 s late) cost --status 2.9 s per server it named: 11.6 s for the four
// here. The whole conversation now ends within 500 ms (mps.cpp,
// kConversationBudget); 4 s leaves a loaded machine eight times that.
TEST_F(TrustFiles, ASlowMpsDaemonDelaysStatusABoundedTotal) {
  env_["NVTASKSET_MPS_CONTROL"] = kFakeMps;
  env_["FAKE_MPS_IDLE_MS"] = "20000";
  std::string servers;
  for (int i = 0; i < 4; ++i) {
    Proc& p = start({"sleep", "30"});
    servers += (servers.empty() ? "" : ",") + std::to_string(p.pid) + ":2";
  }
  Env daemon = env_;
  daemon["FAKE_MPS_SERVERS"] = servers;
  daemon["FAKE_MPS_CLIENT_LIST_DELAY_MS"] = "2900";
  ASSERT_TRUE(ExitedWith(run({kFakeMps, "-d"}, daemon), 0));
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run({kCli, "--status"});
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_LT(took, 4s) << r;
  EXPECT_NE(r.err.find("did not answer get_client_list within 500 ms"), std::string::npos) << r;
  run({"sh", "-c", "echo quit | \"$0\"", kFakeMps});
}

// Hole 9: one status entry claiming 999999998 SMs made every user's --status
// allocate 6.3 GB (a layout of one element per claimed TPC) and take 11-19
// s. Such an entry, and one with more device partitions than a task can
// have (9), is no entry now; a name whose PID has ten digits is none either.
// Under a 400 MB address-space limit an allocation sized by the entry fails
// at once, so the test does not depend on time.
TEST_F(TrustFiles, AStatusEntryClaimingAHugeGpuCostsNothing) {
  Proc& task = start({"sleep", "30"});
  ASSERT_TRUE(wait_until([&] { return nvtaskset::ctl::process_start_time(task.pid) != 0; }));
  const std::string head = "nvtaskset-status 1\npid " + std::to_string(task.pid) + "\nstart " +
                           std::to_string(nvtaskset::ctl::process_start_time(task.pid)) + "\npartitions ";
  const std::string huge = kStandInUuid + ",1,0xf,0xf,0x0,999999998,8,6,13000,0,0x0,0";
  write(path("status/nvtaskset-status." + std::to_string(task.pid) + ".0123456789abcdef"), head + huge + "\n");
  Proc& task2 = start({"sleep", "30"});
  ASSERT_TRUE(wait_until([&] { return nvtaskset::ctl::process_start_time(task2.pid) != 0; }));
  std::string many;
  for (int i = 0; i < 9; ++i) {  // a task partitions at most 8 GPUs
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-fa4ecda0-0000-4000-8000-%012d", i);
    many += std::string(many.empty() ? "" : ";") + uuid + ",1,0xf,0xf,0x0,16,8,6,13000,0,0x0,0";
  }
  write(path("status/nvtaskset-status." + std::to_string(task2.pid) + ".0123456789abcdef"),
        "nvtaskset-status 1\npid " + std::to_string(task2.pid) + "\nstart " +
            std::to_string(nvtaskset::ctl::process_start_time(task2.pid)) + "\npartitions " + many + "\n");
  write(path("status/nvtaskset-status.9999999999.0123456789abcdef"), head + huge + "\n");
  for (const bool json : {false, true}) {
    std::vector<std::string> argv{kCli, "--status"};
    if (json) argv.push_back("--json");
    const Result r = run(limited(argv));
    ASSERT_TRUE(ExitedWith(r, 0)) << r;
    EXPECT_EQ(r.out.find(std::to_string(task.pid)), std::string::npos) << "the entry was read" << r;
    EXPECT_EQ(r.out.find(std::to_string(task2.pid)), std::string::npos) << "the entry was read" << r;
    if (json) {
      EXPECT_EQ(nlohmann::json::parse(r.out)["tasks"].size(), 0u) << r;
    } else {
      EXPECT_TRUE(r.out.starts_with("PID")) << r;
    }
  }
}

}  // namespace
