// SPDX-License-Identifier: Apache-2.0
// trusted_file.hpp: how every file another user might have placed is read
// (the topology and device caches, topology files, status entries, the MPS
// directories), and the checked PID parse for names anyone can create.
#include "nvtaskset/trusted_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>


namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace nvtaskset::ctl {
namespace {

// Not in the account database: a user no test machine has.
constexpr uid_t kStranger = 54321;

class TrustedFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvtaskset-trust-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 0755);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text, mode_t mode = 0644) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p;
  }
  std::string dir_;
};

TEST_F(TrustedFile, ReadsAnOwnSmallRegularFile) {
  const std::string p = write("ok", "hello");
  const TrustedRead r = read_trusted_file(p, 16);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.text, "hello");
  EXPECT_EQ(r.st.st_uid, ::geteuid());
  EXPECT_EQ(check_trusted_dir(dir_), "");
  EXPECT_EQ(check_trusted_parent(p), "");
}

TEST_F(TrustedFile, AnAbsentFileIsAMissNotAWarning) {
  const TrustedRead r = read_trusted_file(dir_ + "/none", 16);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.absent);
}

TEST_F(TrustedFile, SymbolicLinksAreNeverFollowed) {
  const std::string target = write("target", "x");
  fs::create_symlink(target, dir_ + "/link");
  fs::create_symlink("/dev/zero", dir_ + "/zero");
  for (const char* name : {"/link", "/zero"}) {
    const TrustedRead r = read_trusted_file(dir_ + name, 1 << 20);
    EXPECT_FALSE(r.ok()) << name;
    EXPECT_FALSE(r.absent) << name;
    EXPECT_NE(r.error.find("is a symbolic link, which is never followed"), std::string::npos) << r.error;
    EXPECT_TRUE(r.text.empty());
  }
  fs::create_directory(dir_ + "/real");
  fs::create_directory_symlink(dir_ + "/real", dir_ + "/dirlink");
  EXPECT_NE(check_trusted_dir(dir_ + "/dirlink").find("is a symbolic link"), std::string::npos);
}

TEST_F(TrustedFile, DevicesAndOversizedFilesAreRefusedBeforeAnyRead) {
  TrustedRead r = read_trusted_file("/dev/zero", 1 << 20);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("/dev/zero is not a regular file"), std::string::npos) << r.error;
  const std::string big = write("big", std::string(4097, 'x'));
  r = read_trusted_file(big, 4096);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("holds 4097 bytes, more than the 4096"), std::string::npos) << r.error;
  EXPECT_TRUE(r.text.empty());
  EXPECT_TRUE(read_trusted_file(big, 4097).ok());
}

// Opening a FIFO for reading waits for a writer unless O_NONBLOCK: a FIFO
// planted as a cache file hung every launch. A regression would block the
// reading thread; the writer below then frees it, and the test fails.
TEST_F(TrustedFile, AFifoNeverBlocks) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  auto reading = std::async(std::launch::async, [&] { return read_trusted_file(fifo, 1024); });
  if (reading.wait_for(10s) != std::future_status::ready) {
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    FAIL() << "reading a FIFO blocked";
  }
  const TrustedRead r = reading.get();
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("is not a regular file"), std::string::npos) << r.error;
}

TEST_F(TrustedFile, FilesOthersCanWriteAreRefused) {
  const std::string p = write("open", "x", 0666);
  TrustedRead r = read_trusted_file(p, 16);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find(p + " is writable by every user"), std::string::npos) << r.error;
  // Status entries (any owner) never accept a group's write bit either.
  ::chmod(p.c_str(), 0664);
  r = read_trusted_file(p, 16, FileOwner::kAnyone);
  EXPECT_NE(r.error.find("is writable by its group"), std::string::npos) << r.error;
}

TEST_F(TrustedFile, FilesOfAnotherUserAreRefusedUnlessTheCallerChecksTheOwner) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  const std::string p = write("theirs", "x");
  ASSERT_EQ(::chown(p.c_str(), kStranger, static_cast<gid_t>(-1)), 0);
  TrustedRead r = read_trusted_file(p, 16);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("is owned by uid 54321, neither this user (uid 0) nor root"), std::string::npos) << r.error;
  r = read_trusted_file(p, 16, FileOwner::kAnyone);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.st.st_uid, kStranger);
  ASSERT_EQ(::chown(dir_.c_str(), kStranger, static_cast<gid_t>(-1)), 0);
  EXPECT_NE(check_trusted_dir(dir_).find("is owned by uid 54321"), std::string::npos);
}

TEST_F(TrustedFile, RootsFilesAreTrusted) {
  // Every user reads root's files (the system cache, /etc).
  const TrustedRead r = read_trusted_file("/etc/passwd", 1 << 24);
  EXPECT_TRUE(r.ok()) << r.error;
}

TEST_F(TrustedFile, DirectoriesOthersCanWriteAreRefusedUnlessSticky) {
  const std::string d = dir_ + "/d";
  fs::create_directory(d);
  ::chmod(d.c_str(), 0777);
  EXPECT_NE(check_trusted_dir(d).find(d + " is writable by every user"), std::string::npos) << check_trusted_dir(d);
  // Sticky, as /tmp and /dev/shm: only a file's owner may rename or remove it.
  ::chmod(d.c_str(), 01777);
  EXPECT_EQ(check_trusted_dir(d), "");
  // A directory above it that others can write can be swapped for another.
  fs::create_directory(d + "/inner");
  ::chmod(d.c_str(), 0777);
  const std::string why = check_trusted_dir(d + "/inner");
  EXPECT_NE(why.find(d + " is writable by every user (it holds " + d + "/inner)"), std::string::npos) << why;
  EXPECT_NE(check_trusted_dir(dir_ + "/none").find("No such file"), std::string::npos);
  EXPECT_NE(check_trusted_dir(write("f", "x")).find("is not a directory"), std::string::npos);
}

TEST_F(TrustedFile, DirectoriesItCreatesPassWhateverTheUmask) {
  const mode_t old = ::umask(0);
  const std::string d = dir_ + "/a/b/c";
  const std::string why = make_trusted_dirs(d, 0755);
  ::umask(old);
  ASSERT_EQ(why, "");
  struct stat st {};
  ASSERT_EQ(::stat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_EQ(check_trusted_dir(d), "");
  EXPECT_EQ(make_trusted_dirs(d, 0755), "") << "existing directories are fine";
  EXPECT_NE(make_trusted_dirs(write("file", "x") + "/sub", 0755), "");
}

// Status entry names carry a PID that anyone can write: "9999999999"
// overflowed an int before (UBSan).
TEST(ParsePid, AcceptsOnlyPidsLinuxCanHandOut) {
  EXPECT_EQ(parse_pid("1"), 1);
  EXPECT_EQ(parse_pid("32768"), 32768);
  EXPECT_EQ(parse_pid("4194304"), 4194304);
  for (const char* bad : {"", "0", "01", "-1", "+1", "12a", " 1", "4194305", "9999999", "9999999999",
                          "99999999999999999999999"})
    EXPECT_EQ(parse_pid(bad), std::nullopt) << bad;
}

}  // namespace
}  // namespace nvtaskset::ctl
