// SPDX-License-Identifier: Apache-2.0
// System-wide mode: the configuration file it writes must make the loader
// cache prefer the shim over the driver, and disable must undo it. Checked
// with the real ldconfig on a private configuration and cache.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "nvtaskset/driver_locate.hpp"
#include "nvtaskset/system_wide.hpp"

namespace fs = std::filesystem;
using namespace nvtaskset;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/nvtaskset-sw-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct EnvVar {
  std::string name;
  EnvVar(const char* n, const std::string& v) : name(n) { ::setenv(n, v.c_str(), 1); }
  ~EnvVar() { ::unsetenv(name.c_str()); }
};

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

int ldconfig(const fs::path& root) {
  const std::string cmd = "ldconfig -i -X -C " + (root / "ld.so.cache").string() + " -f " +
                          (root / "etc/ld.so.conf").string() + " 2>/dev/null";
  return std::system(cmd.c_str());
}

}  // namespace

TEST(SystemWide, EnableMakesTheCachePreferTheShimAndDisableUndoesIt) {
  TempDir t;
  const fs::path shim = fs::path(NVTASKSET_BUILD_DIR) / "lib/nvtaskset/libcuda.so.1";
  const fs::path driver = fs::path(NVTASKSET_BUILD_DIR) / "tests/fakecuda/lib/libcuda.so.1";
  ASSERT_TRUE(fs::exists(shim) && fs::exists(driver)) << "build nvtaskset_shim and fakecuda first";
  // A driver directory listed by the distribution's configuration, as on a
  // real machine (where the driver's own file is e.g. x86_64-linux-gnu.conf).
  fs::create_directories(t.path / "etc/ld.so.conf.d");
  fs::create_directories(t.path / "driver");
  fs::copy_file(driver, t.path / "driver/libcuda.so.1");
  std::ofstream(t.path / "etc/ld.so.conf") << "include " << (t.path / "etc/ld.so.conf.d").string() << "/*.conf\n";
  std::ofstream(t.path / "etc/ld.so.conf.d/x86_64-linux-gnu.conf") << (t.path / "driver").string() << "\n";
  ASSERT_EQ(ldconfig(t.path), 0);
  const std::string cache = (t.path / "ld.so.cache").string();
  ASSERT_EQ(ld_cache_lookup(cache, "libcuda.so.1"),
            std::vector<std::string>{(t.path / "driver/libcuda.so.1").string()});

  EnvVar root("NVTASKSET_SYSCONFDIR", (t.path / "etc").string());
  EnvVar prog("NVTASKSET_LDCONFIG", "true");  // this test runs ldconfig itself, on its own cache
  const std::string shim_dir = shim.parent_path().string();
  ASSERT_EQ(cli::system_wide_conf_path(), (t.path / "etc/ld.so.conf.d/000-nvtaskset.conf").string());

  testing::internal::CaptureStdout();
  EXPECT_EQ(cli::system_wide("enable", shim_dir), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("enabled"), std::string::npos);
  EXPECT_NE(read(cli::system_wide_conf_path()).find("\n" + shim_dir + "\n"), std::string::npos);
  ASSERT_EQ(ldconfig(t.path), 0);
  const auto entries = ld_cache_lookup(cache, "libcuda.so.1");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0], shim_dir + "/libcuda.so.1") << "the loader would not find the shim first";
  EXPECT_EQ(entries[1], (t.path / "driver/libcuda.so.1").string());
  // The shim, found through that cache, still finds the real driver.
  LocateOptions opts;
  opts.use_env = false;
  opts.ld_cache_path = cache;
  opts.search_dirs = {};
  opts.exclude = {shim.string()};
  std::string why;
  EXPECT_EQ(locate_real_driver(opts, &why), (t.path / "driver/libcuda.so.1").string()) << why;

  testing::internal::CaptureStdout();
  EXPECT_EQ(cli::system_wide("status", shim_dir), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("enabled"), std::string::npos);

  testing::internal::CaptureStdout();
  EXPECT_EQ(cli::system_wide("disable", shim_dir), 0);
  testing::internal::GetCapturedStdout();
  EXPECT_FALSE(fs::exists(cli::system_wide_conf_path()));
  ASSERT_EQ(ldconfig(t.path), 0);
  EXPECT_EQ(ld_cache_lookup(cache, "libcuda.so.1"),
            std::vector<std::string>{(t.path / "driver/libcuda.so.1").string()});
}

TEST(SystemWide, UnwritableConfigurationIsAOneLineError) {
  EnvVar root("NVTASKSET_SYSCONFDIR", "/proc/nvtaskset-no-such-dir");
  try {
    cli::system_wide("enable", "/opt/nvtaskset/lib/nvtaskset");
    FAIL() << "enable succeeded in an unwritable place";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot write"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
}
