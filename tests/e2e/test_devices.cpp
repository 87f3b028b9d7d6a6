// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of several GPUs: a partition per GPU (-d), a task that
// sees its GPUs under other ordinals or not at all (CUDA_VISIBLE_DEVICES), and
// the device cache that spares the CLI the driver's initialisation.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- a partition per GPU -------------------------------------------------------------------------

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

// --- a partition follows its GPU, whatever the task sees -----------------------------------------

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

// --- the device cache ----------------------------------------------------------------------------

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

}  // namespace
