// SPDX-License-Identifier: Apache-2.0
// Finding the real driver (driver_locate.hpp) over real loader caches built
// with ldconfig, real driver files (copies of the stand-in driver, soname
// libcuda.so.1) and real shim copies (the built shim, which carries the note).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "nvtaskset/driver_locate.hpp"

namespace nvtaskset {
namespace {

namespace fs = std::filesystem;

// Built by the nvtaskset_shim and fakecuda targets (build everything first).
const std::string kShim = std::string(NVTASKSET_BUILD_DIR) + "/lib/nvtaskset/libcuda.so.1";
const std::string kFakeDriver = std::string(NVTASKSET_BUILD_DIR) + "/tests/fakecuda/lib/libcuda.so.1";

std::vector<unsigned char> read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& p, const std::vector<unsigned char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::string ldconfig_path() {
  for (const char* p : {"/sbin/ldconfig", "/usr/sbin/ldconfig", "/bin/ldconfig", "/usr/bin/ldconfig"})
    if (::access(p, X_OK) == 0) return p;
  return {};
}

// Sets or unsets an environment variable for one test, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class DriverLocate : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_regular_file(kShim)) << kShim << " is missing: build the nvtaskset_shim target first";
    ASSERT_TRUE(fs::is_regular_file(kFakeDriver)) << kFakeDriver << " is missing: build the fakecuda target first";
    char tmpl[] = "/tmp/nvtaskset-locate-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    for (const char* d : {"drv1", "drv2", "shimcopy", "empty", "notelf", "hardlink", "foreign"})
      fs::create_directories(root_ / d);
    fs::copy_file(kFakeDriver, dir("drv1") + "/libcuda.so.1");
    fs::copy_file(kFakeDriver, dir("drv2") + "/libcuda.so.1");
    fs::copy_file(kShim, dir("shimcopy") + "/libcuda.so.1");
    write_bytes(dir("notelf") + "/libcuda.so.1", {'n', 'o', 't', ' ', 'E', 'L', 'F', '\n'});
    fs::create_hard_link(dir("drv1") + "/libcuda.so.1", dir("hardlink") + "/libcuda.so.1");
    // A driver built for another machine: the fake driver with e_machine
    // (bytes 18-19) changed to one this process cannot load.
    auto foreign = read_bytes(kFakeDriver);
    ASSERT_GT(foreign.size(), 20u);
    const unsigned short other = foreign[18] == 62 /* EM_X86_64 */ ? 183 /* EM_AARCH64 */ : 62;
    foreign[18] = static_cast<unsigned char>(other & 0xff);
    foreign[19] = static_cast<unsigned char>(other >> 8);
    write_bytes(dir("foreign") + "/libcuda.so.1", foreign);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  std::string dir(const char* d) const { return (root_ / d).string(); }
  std::string lib(const char* d) const { return dir(d) + "/libcuda.so.1"; }

  // Builds a loader cache over `dirs` (in that order) with the system's
  // ldconfig; -X: no symlinks, -i: leave the system's aux cache alone.
  std::string make_cache(const std::vector<std::string>& dirs, const char* format = "new") {
    const std::string ldconfig = ldconfig_path();
    EXPECT_FALSE(ldconfig.empty()) << "ldconfig not found";
    const std::string conf = (root_ / "ld.so.conf").string();
    const std::string cache = (root_ / (std::string("ld.so.cache.") + format)).string();
    {
      std::ofstream f(conf, std::ios::trunc);
      for (const auto& d : dirs) f << d << "\n";
    }
    const std::string cmd = ldconfig + " -i -X -c " + format + " -C '" + cache + "' -f '" + conf + "' 2>/dev/null";
    const int rc = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
    return cache;
  }

  // Cache entries under our temporary root (ldconfig also indexes the
  // system's trusted directories, which may hold a real driver).
  std::vector<std::string> ours(const std::vector<std::string>& entries) const {
    std::vector<std::string> out;
    for (const auto& e : entries)
      if (e.rfind(root_.string() + "/", 0) == 0) out.push_back(e);
    return out;
  }

  LocateOptions opts(std::vector<std::string> search_dirs) const {
    LocateOptions o;
    o.search_dirs = std::move(search_dirs);
    o.ld_cache_path = (root_ / "no-such-cache").string();
    o.use_env = false;
    return o;
  }

  fs::path root_;
  // Every test starts without the variables that steer the search.
  ScopedEnv no_ld_path_{"LD_LIBRARY_PATH", std::nullopt};
  ScopedEnv no_real_{kRealDriverEnv, std::nullopt};
};

// ---- the loader cache ---------------------------------------------------------

TEST_F(DriverLocate, CacheLookupListsEntriesInCacheOrder) {
  const std::string cache = make_cache({dir("drv2"), dir("shimcopy"), dir("notelf"), dir("drv1")});
  EXPECT_EQ(ours(ld_cache_lookup(cache, "libcuda.so.1")),
            (std::vector<std::string>{lib("drv2"), lib("shimcopy"), lib("drv1")}));
  EXPECT_TRUE(ours(ld_cache_lookup(cache, "libcuda.so")).empty());
  EXPECT_TRUE(ld_cache_lookup(cache, "libnvtaskset-no-such-library.so.7").empty());
  // The system's own libraries are there too: the parser reads the whole file.
  EXPECT_FALSE(ld_cache_lookup(cache, "libc.so.6").empty());
}

TEST_F(DriverLocate, CacheLookupReadsNewFormatAfterOldOne) {
  const std::vector<std::string> dirs = {dir("drv1"), dir("shimcopy"), dir("drv2")};
  const std::vector<std::string> want = {lib("drv1"), lib("shimcopy"), lib("drv2")};
  const std::string fresh = make_cache(dirs, "new");
  ASSERT_EQ(ours(ld_cache_lookup(fresh, "libcuda.so.1")), want);

  // What ldconfig writes with -c compat.
  const std::string compat = make_cache(dirs, "compat");
  const auto bytes = read_bytes(compat);
  ASSERT_GT(bytes.size(), 16u);
  ASSERT_EQ(std::string(bytes.begin(), bytes.begin() + 11), "ld.so-1.7.0") << "ldconfig wrote no old header";
  EXPECT_EQ(ours(ld_cache_lookup(compat, "libcuda.so.1")), want);
  EXPECT_EQ(ld_cache_lookup(compat, "libc.so.6"), ld_cache_lookup(fresh, "libc.so.6"));

  // The new table starts at the next 8-byte boundary after the old entries
  // (16-byte header, 12 bytes each). ldconfig's old count depends on the
  // system's libraries, so build compat files for both parities by hand; the
  // new table's string offsets are relative to its own header, so it can be
  // moved as it is.
  const auto new_bytes = read_bytes(fresh);
  const std::string built = (root_ / "built.cache").string();
  for (unsigned old_count : {0u, 1u, 2u, 3u}) {
    SCOPED_TRACE(old_count);
    std::vector<unsigned char> f = {'l', 'd', '.', 's', 'o', '-', '1', '.', '7', '.', '0', 0,
                                    static_cast<unsigned char>(old_count), 0, 0, 0};
    f.resize(f.size() + 12 * old_count, 0);
    while (f.size() % 8) f.push_back(0);
    f.insert(f.end(), new_bytes.begin(), new_bytes.end());
    write_bytes(built, f);
    EXPECT_EQ(ours(ld_cache_lookup(built, "libcuda.so.1")), want);
  }
}

TEST_F(DriverLocate, CacheLookupSurvivesMissingTruncatedAndCorruptFiles) {
  EXPECT_TRUE(ld_cache_lookup(dir("empty") + "/none", "libcuda.so.1").empty());
  EXPECT_TRUE(ld_cache_lookup(dir("empty"), "libcuda.so.1").empty()) << "a directory is not a cache";

  const std::string cache = make_cache({dir("drv1"), dir("drv2")});
  const auto good = read_bytes(cache);
  const auto full = ld_cache_lookup(cache, "libcuda.so.1");
  ASSERT_EQ(ours(full).size(), 2u);
  const std::string bad = (root_ / "bad.cache").string();

  // Every prefix: never a crash, never an entry that is not in the full file.
  for (std::size_t n = 0; n < good.size(); n += (n < 256 ? 1 : 61)) {
    write_bytes(bad, std::vector<unsigned char>(good.begin(), good.begin() + static_cast<long>(n)));
    for (const auto& e : ld_cache_lookup(bad, "libcuda.so.1"))
      EXPECT_NE(std::find(full.begin(), full.end(), e), full.end()) << "prefix " << n << " invented " << e;
  }

  // Absurd entry count (uint32 at byte 20 of the new header).
  auto corrupt = good;
  corrupt[20] = corrupt[21] = corrupt[22] = corrupt[23] = 0xff;
  write_bytes(bad, corrupt);
  EXPECT_TRUE(ld_cache_lookup(bad, "libcuda.so.1").empty());

  // String offsets pointing past the end: those entries are skipped.
  corrupt = good;
  for (std::size_t e = 48; e + 24 <= corrupt.size() && e < 48 + 24 * 4096; e += 24) {
    corrupt[e + 8] = corrupt[e + 9] = corrupt[e + 10] = 0xff;  // value offset
    corrupt[e + 11] = 0x7f;
  }
  write_bytes(bad, corrupt);
  EXPECT_TRUE(ours(ld_cache_lookup(bad, "libcuda.so.1")).empty());

  // No terminating NUL anywhere after the strings start.
  corrupt = good;
  for (std::size_t i = 48 + 24 * 8; i < corrupt.size(); ++i)
    if (corrupt[i] == 0) corrupt[i] = 'x';
  write_bytes(bad, corrupt);
  for (const auto& e : ld_cache_lookup(bad, "libcuda.so.1"))
    EXPECT_NE(std::find(full.begin(), full.end(), e), full.end()) << e;

  // The old header claiming more entries than the file holds.
  std::vector<unsigned char> old_hdr = {'l', 'd', '.', 's', 'o', '-', '1', '.', '7', '.', '0', 0, 0xff, 0xff, 0xff, 0xff};
  write_bytes(bad, old_hdr);
  EXPECT_TRUE(ld_cache_lookup(bad, "libcuda.so.1").empty());

  // Random bytes behind a valid magic.
  std::vector<unsigned char> noise(good.begin(), good.begin() + 20);
  unsigned x = 12345;
  for (int i = 0; i < 4096; ++i) noise.push_back(static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 16));
  write_bytes(bad, noise);
  EXPECT_TRUE(ld_cache_lookup(bad, "libcuda.so.1").empty());
}

// ---- the shim's note ----------------------------------------------------------------

TEST_F(DriverLocate, ShimNoteDetection) {
  EXPECT_TRUE(is_shim_library(kShim));
  EXPECT_TRUE(is_shim_library(lib("shimcopy")));
  EXPECT_FALSE(is_shim_library(kFakeDriver));
  EXPECT_FALSE(is_shim_library(lib("drv1")));
  EXPECT_FALSE(is_shim_library(lib("notelf")));
  EXPECT_FALSE(is_shim_library(dir("empty") + "/libcuda.so.1"));
  EXPECT_FALSE(is_shim_library(dir("empty")));

  // Truncated copies of the shim: the note cannot be read, so it is not
  // there, and nothing crashes.
  const auto shim = read_bytes(kShim);
  const std::string cut = dir("empty") + "/cut.so";
  for (std::size_t n : {0, 4, 16, 63, 64, 100, 200, 400, 600, 0x290, 0x2a0}) {
    if (n >= shim.size()) continue;
    write_bytes(cut, std::vector<unsigned char>(shim.begin(), shim.begin() + static_cast<long>(n)));
    (void)is_shim_library(cut);
  }
  write_bytes(cut, std::vector<unsigned char>(shim.begin(), shim.begin() + 64));
  EXPECT_FALSE(is_shim_library(cut));

  // The same file with the note's owner name changed is not the shim: the
  // detection is the note, not the file name or its size.
  auto renamed = shim;
  const std::string owner("nvtaskset\0", 10);
  auto it = std::search(renamed.begin(), renamed.end(), owner.begin(), owner.end());
  ASSERT_NE(it, renamed.end());
  for (; it != renamed.end(); it = std::search(it + 1, renamed.end(), owner.begin(), owner.end())) it[8] = 'X';
  write_bytes(cut, renamed);
  EXPECT_FALSE(is_shim_library(cut));
}

// ---- the search ---------------------------------------------------------------------

TEST_F(DriverLocate, SkipsShimCopiesByNote) {
  std::string why;
  EXPECT_EQ(locate_real_driver(opts({dir("shimcopy"), dir("drv1")}), &why), lib("drv1")) << why;
}

TEST_F(DriverLocate, SkipsExcludedFilesByInode) {
  // hardlink/libcuda.so.1 is drv1's inode under another name.
  auto o = opts({dir("hardlink"), dir("drv1"), dir("drv2")});
  o.exclude = {lib("drv1")};
  std::string why;
  EXPECT_EQ(locate_real_driver(o, &why), lib("drv2")) << why;

  // Through a symlink to the excluded file, too.
  fs::create_symlink(lib("drv1"), dir("empty") + "/libcuda.so.1");
  o.search_dirs = {dir("empty"), dir("drv2")};
  EXPECT_EQ(locate_real_driver(o, &why), lib("drv2")) << why;
}

TEST_F(DriverLocate, SkipsUnusableFiles) {
  fs::create_directories(dir("empty") + "/libcuda.so.1");  // a directory with the name
  std::string why;
  EXPECT_EQ(locate_real_driver(opts({dir("empty"), dir("notelf"), dir("foreign"), dir("drv2")}), &why), lib("drv2"))
      << why;
}

TEST_F(DriverLocate, NothingFoundIsOneLine) {
  std::string why;
  EXPECT_EQ(locate_real_driver(opts({dir("empty"), dir("shimcopy"), dir("notelf")}), &why), "");
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  EXPECT_NE(why.find("libcuda.so.1"), std::string::npos) << why;
}

TEST_F(DriverLocate, CacheComesBeforeSearchDirsAndIsSkippedPastShims) {
  auto o = opts({dir("drv2")});
  o.ld_cache_path = make_cache({dir("shimcopy"), dir("drv1")});
  std::string why;
  EXPECT_EQ(locate_real_driver(o, &why), lib("drv1")) << why;

  // A cache listing only the shim falls through to the directories.
  o.ld_cache_path = make_cache({dir("shimcopy")});
  EXPECT_EQ(locate_real_driver(o, &why), lib("drv2")) << why;
}

TEST_F(DriverLocate, LdLibraryPathComesFirstInOrder) {
  auto o = opts({dir("drv1")});
  o.ld_cache_path = make_cache({dir("drv1")});
  std::string why;
  {
    // Empty elements and $ORIGIN-style elements are ignored; the shim's own
    // directory (what the CLI puts first) is skipped by the note.
    ScopedEnv env("LD_LIBRARY_PATH", "::$ORIGIN/x:" + dir("shimcopy") + ":" + dir("drv2") + ";" + dir("drv1"));
    EXPECT_EQ(locate_real_driver(o, &why), lib("drv2")) << why;
  }
  {
    ScopedEnv env("LD_LIBRARY_PATH", dir("empty") + ":" + dir("hardlink"));
    EXPECT_EQ(locate_real_driver(o, &why), lib("hardlink")) << why;
  }
  {
    ScopedEnv env("LD_LIBRARY_PATH", dir("shimcopy"));
    EXPECT_EQ(locate_real_driver(o, &why), lib("drv1")) << why;
  }
}

TEST_F(DriverLocate, EnvironmentOverrideWins) {
  auto o = opts({dir("drv1")});
  std::string why;
  ScopedEnv path("LD_LIBRARY_PATH", dir("drv1"));
  ScopedEnv env(kRealDriverEnv, lib("drv2"));
  o.use_env = false;
  EXPECT_EQ(locate_real_driver(o, &why), lib("drv1")) << why;
  o.use_env = true;
  EXPECT_EQ(locate_real_driver(o, &why), lib("drv2")) << why;
}

TEST_F(DriverLocate, UnusableEnvironmentOverrideIsAnErrorNotAFallback) {
  auto o = opts({dir("drv1")});
  o.use_env = true;
  for (const std::string& bad : {dir("empty") + "/libcuda.so.1", lib("shimcopy"), lib("notelf"), lib("foreign"),
                                 dir("drv1")}) {
    SCOPED_TRACE(bad);
    ScopedEnv env(kRealDriverEnv, bad);
    std::string why;
    EXPECT_EQ(locate_real_driver(o, &why), "");
    EXPECT_NE(why.find(kRealDriverEnv), std::string::npos) << why;
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  }
  // Excluded by inode, named explicitly: still refused.
  ScopedEnv env(kRealDriverEnv, lib("hardlink"));
  o.exclude = {lib("drv1")};
  std::string why;
  EXPECT_EQ(locate_real_driver(o, &why), "");
  o.exclude.clear();
  EXPECT_EQ(locate_real_driver(o, &why), lib("hardlink")) << why;
}

TEST_F(DriverLocate, OpenRealDriverFailsCleanly) {
  auto o = opts({dir("empty")});
  std::string why, path = "unchanged";
  EXPECT_EQ(open_real_driver(o, &why, &path), nullptr);
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(path, "unchanged");
}

TEST_F(DriverLocate, OpenRealDriverLoadsTheFirstUsableCandidate) {
  // In a child process: the stand-in driver's soname is libcuda.so.1, and it
  // must not stay loaded in the test binary, where later dlopen("libcuda.so.1")
  // calls would find it.
  const auto o = opts({dir("shimcopy"), dir("notelf"), dir("drv2"), dir("drv1")});
  const std::string want = lib("drv2");
  const std::string shim_copy = lib("shimcopy");
  auto child = [&] {
    std::string why, path;
    void* h = open_real_driver(o, &why, &path);
    // The shim copy was recognised from its file, never loaded.
    void* shim = ::dlopen(shim_copy.c_str(), RTLD_NOW | RTLD_NOLOAD);
    std::exit(h != nullptr && path == want && shim == nullptr ? 0 : 1);
  };
  EXPECT_EXIT(child(),
      testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace nvtaskset
