// SPDX-License-Identifier: Apache-2.0
// get_topology() without a GPU: topology files, the cache (directory choice,
// hit and miss by UUID and driver version), pre-Hopper identity with and
// without nvdebug, and Hopper without calibration.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>

#include "nvtaskset/topology_json.hpp"
#include "nvtaskset/topology_source.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::topo {
namespace {

using namespace testing;
namespace fs = std::filesystem;

const std::string kData = std::string(NVTASKSET_TEST_DATA_DIR);

// Sets (or unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class TopologySource : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "nvtaskset_source_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    opts_.cache_dir = dir_ + "/cache";
    opts_.use_env = false;
    opts_.nvdebug_root = dir_ + "/no-proc";
    opts_.nvdebug_index = 0;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string error_of(const DeviceInfo& d) {
    try {
      get_topology(d, opts_);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }

  // A copy of a file of tests/data, owned by whoever runs the test: a
  // topology file must be this user's or root's, which a checkout another
  // user made (a CI container running as root) is not.
  std::string data(const std::string& name) {
    const std::string to = dir_ + "/" + fs::path(name).filename().string();
    fs::copy_file(kData + "/" + name, to, fs::copy_options::overwrite_existing);
    fs::permissions(to, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                            fs::perms::others_read);
    return to;
  }

  std::string dir_;
  TopologyOptions opts_;
};

TEST_F(TopologySource, CacheDirOverrideIsTheOnlyDirectory) {
  EXPECT_EQ(cache_read_dirs(opts_), std::vector<std::string>{dir_ + "/cache"});
  EXPECT_EQ(cache_write_dir(opts_), dir_ + "/cache");
}

TEST_F(TopologySource, SystemCacheDirWhenWritable) {
  TopologyOptions o;
  o.system_cache_dir = dir_ + "/var/cache/nvtaskset";  // creatable: dir_ is writable
  ScopedEnv xdg("XDG_CACHE_HOME", dir_ + "/xdg");
  EXPECT_EQ(cache_write_dir(o), o.system_cache_dir);
  EXPECT_EQ(cache_read_dirs(o), (std::vector<std::string>{o.system_cache_dir, dir_ + "/xdg/nvtaskset"}));
}

TEST_F(TopologySource, UserCacheDirWhenSystemDirIsNotWritable) {
  TopologyOptions o;
  // A path below a regular file can never be created, even by root.
  std::ofstream(dir_ + "/file") << "x";
  o.system_cache_dir = dir_ + "/file/nvtaskset";
  {
    ScopedEnv xdg("XDG_CACHE_HOME", dir_ + "/xdg");
    EXPECT_EQ(cache_write_dir(o), dir_ + "/xdg/nvtaskset");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", std::string("relative/path"));  // invalid per the XDG spec
    ScopedEnv home("HOME", dir_ + "/home");
    EXPECT_EQ(cache_write_dir(o), dir_ + "/home/.cache/nvtaskset");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
    ScopedEnv home("HOME", dir_ + "/home2");
    EXPECT_EQ(cache_write_dir(o), dir_ + "/home2/.cache/nvtaskset");
    EXPECT_EQ(cache_read_dirs(o), (std::vector<std::string>{o.system_cache_dir, dir_ + "/home2/.cache/nvtaskset"}));
  }
}

TEST_F(TopologySource, CacheFileIsPerUuidAndDriverVersion) {
  const DeviceInfo d = h200_device();
  EXPECT_EQ(cache_file_name(d), uuid_to_string(d.uuid) + "-cuda13000.json");
}

TEST_F(TopologySource, CacheHitAndMisses) {
  const DeviceInfo d = h200_device();
  EXPECT_FALSE(cache_load(d, opts_)) << "empty cache";
  Topology t = h200_topology();
  t.calibrated_at = "2025-06-01T12:00:00Z";
  std::string why;
  const std::string path = cache_store(t, opts_, &why);
  ASSERT_EQ(path, dir_ + "/cache/" + cache_file_name(d)) << why;

  // Hit: same UUID, driver version and release.
  DeviceInfo live = d;
  live.ordinal = 3;  // the live ordinal wins over the cached one
  auto hit = cache_load(live, opts_);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->device.ordinal, 3u);
  EXPECT_EQ(hit->calibrated_at, "2025-06-01T12:00:00Z");
  EXPECT_EQ(hit->working_bits(), t.working_bits());

  DeviceInfo other_version = d;
  other_version.driver_version = 13010;
  EXPECT_FALSE(cache_load(other_version, opts_)) << "another driver version";
  DeviceInfo other_release = d;
  other_release.driver_release = "580.200.01";
  EXPECT_FALSE(cache_load(other_release, opts_)) << "another driver release";
  DeviceInfo unknown_release = d;
  unknown_release.driver_release.clear();
  EXPECT_TRUE(cache_load(unknown_release, opts_)) << "release unknown now: version decides";
  EXPECT_FALSE(cache_load(h200_device(1), opts_)) << "another GPU";
  DeviceInfo fewer_sms = d;
  fewer_sms.sm_count = 114;
  EXPECT_FALSE(cache_load(fewer_sms, opts_)) << "another SM count";

  // A corrupt cache file is a miss, not an error.
  std::ofstream(path) << "{ not json";
  EXPECT_FALSE(cache_load(d, opts_));
}

// The cache is read as every shared file (trusted_file.hpp): a cache file or
// directory another user could have written is a miss, said in a warning,
// and the layout is measured anew (here: the Hopper GPU then needs a
// driver). A cache directory another user could write (a shared
// XDG_CACHE_HOME kept by `sudo -E`) moved root's `-t 0-3` to other TPCs.
TEST_F(TopologySource, CacheOthersCouldHaveWrittenIsAMiss) {
  const DeviceInfo d = h200_device();
  std::string why;
  const std::string path = cache_store(h200_topology(), opts_, &why);
  ASSERT_FALSE(path.empty()) << why;
  ASSERT_TRUE(cache_load(d, opts_)) << "the cache as written is used";
  ::chmod(path.c_str(), 0666);
  EXPECT_FALSE(cache_load(d, opts_)) << "a cache file every user can write";
  ::chmod(path.c_str(), 0644);
  ::chmod(opts_.cache_dir.c_str(), 0777);
  EXPECT_FALSE(cache_load(d, opts_)) << "a cache directory every user can write";
  EXPECT_NE(error_of(d).find("needs calibration"), std::string::npos) << "a miss, as without a cache";
  EXPECT_TRUE(cache_store(h200_topology(), opts_, &why).empty()) << "nothing is stored there either";
  EXPECT_NE(why.find(opts_.cache_dir + " is writable by every user"), std::string::npos) << why;
  ::chmod(opts_.cache_dir.c_str(), 0755);
  ASSERT_TRUE(cache_load(d, opts_));
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(path.c_str(), 54321, static_cast<gid_t>(-1)), 0);
    EXPECT_FALSE(cache_load(d, opts_)) << "a cache file of another user";
  }
}

// Never followed, never waited on, never read without bound: a symbolic link
// to /dev/zero read until memory ran out, and a FIFO hung the launch.
TEST_F(TopologySource, CacheLinksFifosAndHugeFilesAreMisses) {
  const DeviceInfo d = h200_device();
  std::string why;
  const std::string path = cache_store(h200_topology(), opts_, &why);
  ASSERT_FALSE(path.empty()) << why;
  fs::rename(path, dir_ + "/good.json");
  fs::create_symlink(dir_ + "/good.json", path);
  EXPECT_FALSE(cache_load(d, opts_)) << "a link, even to a good file";
  fs::remove(path);
  fs::create_symlink("/dev/zero", path);
  EXPECT_FALSE(cache_load(d, opts_));
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  EXPECT_FALSE(cache_load(d, opts_)) << "returns at once: no writer is waited for";
  fs::remove(path);
  std::ofstream(path) << std::string(300 * 1024, ' ') << "{}";
  ::chmod(path.c_str(), 0644);
  EXPECT_FALSE(cache_load(d, opts_));
}

// NVTASKSET_TOPOLOGY crosses `sudo -E`: the file it names is held to the
// same rules, and one that fails them is an error (the user asked for it).
TEST_F(TopologySource, TopologyFileOthersCouldHaveWrittenIsAnError) {
  opts_.file = data("topology/h200.json");
  ASSERT_EQ(get_topology(h200_device(), opts_).source, "file");
  ::chmod(opts_.file.c_str(), 0666);
  std::string e = error_of(h200_device());
  EXPECT_NE(e.find("topology file " + opts_.file + " is writable by every user"), std::string::npos) << e;
  ::chmod(opts_.file.c_str(), 0644);
  fs::create_symlink(opts_.file, dir_ + "/link.json");
  opts_.file = dir_ + "/link.json";
  e = error_of(h200_device());
  EXPECT_NE(e.find("is a symbolic link, which is never followed"), std::string::npos) << e;
  opts_.file = dir_ + "/h200.json";
  ::chmod(dir_.c_str(), 0777);
  e = error_of(h200_device());
  ::chmod(dir_.c_str(), 0755);
  EXPECT_NE(e.find(dir_ + " is writable by every user"), std::string::npos) << e;
}

TEST_F(TopologySource, HopperUsesTheCacheWithoutADriver) {
  Topology t = h200_topology();
  std::string why;
  ASSERT_FALSE(cache_store(t, opts_, &why).empty()) << why;
  opts_.driver = nullptr;
  const Topology got = get_topology(h200_device(), opts_);
  EXPECT_EQ(got.source, "calibration");
  EXPECT_EQ(got.working_bits(), t.working_bits());
}

TEST_F(TopologySource, HopperWithoutCacheOrDriverIsAnError) {
  const std::string e = error_of(h200_device());
  EXPECT_NE(e.find("needs calibration"), std::string::npos) << e;
  opts_.recalibrate = true;  // and --calibrate ignores the cache
  Topology t = h200_topology();
  std::string why;
  ASSERT_FALSE(cache_store(t, opts_, &why).empty()) << why;
  EXPECT_NE(error_of(h200_device()).find("needs calibration"), std::string::npos);
}

TEST_F(TopologySource, TopologyFileWinsAndMustMatchTheUuid) {
  opts_.file = data("topology/two_gpus.json");
  const Topology t1 = get_topology(h200_device(1), opts_);
  EXPECT_EQ(t1.source, "file");
  EXPECT_EQ(t1.device.uuid, h200_device(1).uuid);
  EXPECT_EQ(t1.working_bits(), h200_topology(1).working_bits());

  DeviceInfo live = h200_device(0);
  live.ordinal = 5;
  live.pci_bus_id = "0000:99:00.0";
  const Topology t0 = get_topology(live, opts_);
  EXPECT_EQ(t0.device.ordinal, 5u);
  EXPECT_EQ(t0.device.pci_bus_id, "0000:99:00.0");

  const std::string e = error_of(a100_device());
  EXPECT_NE(e.find("topology file " + opts_.file + " does not describe device 0 (NVIDIA A100-SXM4-40GB, GPU-"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("it describes " + uuid_to_string(h200_device(0).uuid) + ", " + uuid_to_string(h200_device(1).uuid)),
            std::string::npos)
      << e;
}

TEST_F(TopologySource, TopologyFileMustMatchTheDeviceShape) {
  opts_.file = data("topology/h200.json");
  DeviceInfo d = h200_device();
  d.sm_count = 114;
  EXPECT_NE(error_of(d).find("has 114 SMs, but the file says 132"), std::string::npos) << error_of(d);
  d = h200_device();
  d.cc_minor = 1;
  EXPECT_NE(error_of(d).find("is cc 9.1, but the file says 9.0"), std::string::npos) << error_of(d);
}

TEST_F(TopologySource, TopologyFileFromTheEnvironment) {
  opts_.use_env = true;
  ScopedEnv e(kTopologyFileEnv, data("topology/h200.json"));
  ScopedEnv r(kNvdebugRootEnv, std::nullopt);
  EXPECT_EQ(get_topology(h200_device(), opts_).source, "file");
  // Without use_env the variable is ignored, and without cache or driver a
  // Hopper GPU cannot be served.
  opts_.use_env = false;
  EXPECT_NE(error_of(h200_device()).find("needs calibration"), std::string::npos);
}

TEST_F(TopologySource, BrokenTopologyFileIsAnError) {
  opts_.file = data("topology/duplicate_bit.json");
  EXPECT_NE(error_of(h200_device()).find("tpcs[1].bit: bit 5 already controls TPC 0"), std::string::npos);
  opts_.file = dir_ + "/absent.json";
  EXPECT_NE(error_of(h200_device()).find("cannot open"), std::string::npos);
}

TEST_F(TopologySource, PreHopperIdentityWithoutNvdebug) {
  const Topology t = get_topology(a100_device(), opts_);
  EXPECT_EQ(t.source, "identity");
  EXPECT_TRUE(t.bits_known());
  EXPECT_FALSE(t.gpcs_known());
  EXPECT_NE(t.gpc_note.find("nvdebug kernel module is not loaded (" + dir_ + "/no-proc/gpu0 is absent)"),
            std::string::npos)
      << t.gpc_note;
  // -t lists translate; -g lists explain why not.
  EXPECT_EQ(to_physical(t, tpc_set({0, 1})).size(), 2u);
  try {
    tpcs_of_gpcs(t, gpc_set({0}));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nvdebug kernel module is not loaded"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(opts_.cache_dir)) << "identity topologies are not cached";
}

TEST_F(TopologySource, PreHopperNvdebugNoteNamesTheDevice) {
  // Without a given index, the PCI bus id finds /proc/gpuN; none of these
  // sysfs directories has an NVIDIA GPU.
  opts_.nvdebug_index.reset();
  opts_.sysfs_pci_root = dir_ + "/no-sysfs";
  DeviceInfo d = a100_device();
  d.pci_bus_id = "0000:41:00.0";
  EXPECT_NE(get_topology(d, opts_).gpc_note.find("nvdebug: cannot tell which " + dir_ +
                                                 "/no-proc/gpuN is PCI device 0000:41:00.0"),
            std::string::npos)
      << get_topology(d, opts_).gpc_note;
  // A device known only from a task's control region (-p) has no PCI bus id:
  // the note names its UUID instead of an empty PCI device.
  d.pci_bus_id.clear();
  const Topology t = get_topology(d, opts_);
  EXPECT_NE(t.gpc_note.find("nvdebug: cannot tell which " + dir_ + "/no-proc/gpuN is " + uuid_to_string(d.uuid) +
                            ": its PCI bus id is unknown"),
            std::string::npos)
      << t.gpc_note;
  EXPECT_EQ(t.gpc_note.find("PCI device )"), std::string::npos) << t.gpc_note;
  try {
    tpcs_of_gpcs(t, gpc_set({0}));  // what -p -g reports
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("its PCI bus id is unknown"), std::string::npos) << e.what();
  }
}

TEST_F(TopologySource, PreHopperGpcsFromNvdebug) {
  opts_.nvdebug_root = kData + "/nvdebug/a100";
  const Topology t = get_topology(a100_device(), opts_);
  EXPECT_EQ(t.source, "identity+nvdebug");
  ASSERT_EQ(t.gpcs.size(), 7u);
  EXPECT_EQ(ids_of(tpcs_of_gpcs(t, gpc_set({0}))), (std::vector<unsigned>{0, 7, 14, 21, 28, 35, 42, 49}));
}

TEST_F(TopologySource, PreHopperNvdebugRootFromTheEnvironment) {
  opts_.use_env = true;
  opts_.nvdebug_root.clear();
  ScopedEnv f(kTopologyFileEnv, std::nullopt);
  ScopedEnv r(kNvdebugRootEnv, kData + "/nvdebug/a100");
  EXPECT_EQ(get_topology(a100_device(), opts_).source, "identity+nvdebug");
}

TEST_F(TopologySource, PreHopperMalformedNvdebugKeepsTpcListsWorking) {
  opts_.nvdebug_root = kData + "/nvdebug/malformed";
  const Topology t = get_topology(a100_device(), opts_);
  EXPECT_EQ(t.source, "identity");
  EXPECT_FALSE(t.gpcs_known());
  EXPECT_NE(t.gpc_note.find("expected a hex number, got 'zz'"), std::string::npos) << t.gpc_note;
  EXPECT_EQ(to_physical(t, tpc_set({5})).size(), 1u);
}

TEST_F(TopologySource, PreHopperNvdebugOfAnotherGpuIsRefused) {
  opts_.nvdebug_root = kData + "/nvdebug/h200";  // 66 TPCs, but the A100 has 54
  const Topology t = get_topology(a100_device(), opts_);
  EXPECT_FALSE(t.gpcs_known());
  EXPECT_NE(t.gpc_note.find("describes 66 TPCs, but device 0"), std::string::npos) << t.gpc_note;
}

TEST_F(TopologySource, PreHopperRecalibrateNeedsADriver) {
  opts_.recalibrate = true;
  EXPECT_NE(error_of(a100_device()).find("needs the CUDA driver"), std::string::npos);
}

}  // namespace
}  // namespace nvtaskset::topo
