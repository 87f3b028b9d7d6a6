// SPDX-License-Identifier: Apache-2.0
// exec_check.hpp: which file a command runs, and whether the kernel would run
// it in secure-execution mode (where the loader ignores LD_PRELOAD and
// LD_LIBRARY_PATH, so the shim could not be loaded into it).
#include "nvtaskset/exec_check.hpp"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace nvtaskset::cli {
namespace {

namespace fs = std::filesystem;

class ExecCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvt-exec-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string program(const std::string& name, mode_t mode = 0755) {
    const std::string p = dir_ + "/" + name;
    fs::copy_file("/bin/true", p, fs::copy_options::overwrite_existing);
    ::chmod(p.c_str(), mode);
    return p;
  }
  // What `f` returns when run in a child that first dropped to user and
  // group 65534 (nobody), or ran `setup` otherwise: "" or the reason.
  static std::string in_child(const std::function<void()>& setup, const std::function<std::string()>& f) {
    int fds[2];
    if (::pipe(fds) != 0) return "pipe failed";
    const pid_t c = ::fork();
    if (c == 0) {
      ::close(fds[0]);
      setup();
      const std::string r = f();
      [[maybe_unused]] const ssize_t n = ::write(fds[1], r.data(), r.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string out;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    ::close(fds[0]);
    ::waitpid(c, nullptr, 0);
    return out;
  }
  std::string dir_;
};

TEST_F(ExecCheck, ResolvesAsExecvpDoes) {
  const std::string prog = program("tool");
  EXPECT_EQ(resolve_command("/bin/sh", {}), "/bin/sh");
  EXPECT_EQ(resolve_command("./relative/x", {}), "./relative/x") << "a slash: taken as it is";
  EXPECT_EQ(resolve_command("tool", {"PATH=/nonexistent:" + dir_ + ":/bin"}), dir_ + "/tool");
  // The first directory that has it wins; one without the x bit is passed over.
  const std::string other = dir_ + "/first";
  fs::create_directories(other);
  fs::copy_file(prog, other + "/tool");
  ::chmod((other + "/tool").c_str(), 0644);
  EXPECT_EQ(resolve_command("tool", {"PATH=" + other + ":" + dir_}), dir_ + "/tool");
  ::chmod((other + "/tool").c_str(), 0755);
  EXPECT_EQ(resolve_command("tool", {"PATH=" + other + ":" + dir_}), other + "/tool");
  EXPECT_EQ(resolve_command("no-such-tool-anywhere", {"PATH=" + dir_}), "");
  // Without PATH, glibc's default search path.
  EXPECT_EQ(resolve_command("sh", {}), "/bin/sh");
}

TEST_F(ExecCheck, AnOrdinaryProgramOrScriptIsFine) {
  EXPECT_EQ(secure_execution_reason(program("plain")), "");
  const std::string script = dir_ + "/script";
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  ::chmod(script.c_str(), 0755);
  EXPECT_EQ(secure_execution_reason(script), "");
  EXPECT_EQ(secure_execution_reason(dir_ + "/missing"), "");
}

TEST_F(ExecCheck, SetIdBitsCountOnlyWhenTheyChangeAnId) {
  // Of our own user and group: the exec changes nothing.
  EXPECT_EQ(secure_execution_reason(program("own-suid", 04755)), "");
  EXPECT_EQ(secure_execution_reason(program("own-sgid", 02755)), "");
  // Set-gid without group execute is mandatory locking, not set-gid.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a program another owner or group";
  const std::string sgid = program("sgid");
  ASSERT_EQ(::chown(sgid.c_str(), 0, 65534), 0);
  ASSERT_EQ(::chmod(sgid.c_str(), 02755), 0);
  std::string why = secure_execution_reason(sgid);
  EXPECT_NE(why.find(sgid + " is set-gid (group "), std::string::npos) << why;
  EXPECT_NE(why.find("secure-execution mode"), std::string::npos) << why;
  ASSERT_EQ(::chmod(sgid.c_str(), 02745), 0);
  EXPECT_EQ(secure_execution_reason(sgid), "") << "no group execute: mandatory locking";
  const std::string suid = program("suid");
  ASSERT_EQ(::chown(suid.c_str(), 65534, 0), 0);
  ASSERT_EQ(::chmod(suid.c_str(), 04755), 0);
  why = secure_execution_reason(suid);
  EXPECT_NE(why.find(suid + " is set-uid (owner "), std::string::npos) << why;
  // A script is run by its interpreter: the script's own bits are ignored
  // by the kernel, the interpreter's count.
  const std::string script = dir_ + "/script";
  std::ofstream(script) << "#!" << suid << " -x\n";
  ASSERT_EQ(::chmod(script.c_str(), 06755), 0);
  why = secure_execution_reason(script);
  EXPECT_NE(why.find("(the interpreter of " + script + ")"), std::string::npos) << why;
  // no_new_privs: execve() grants nothing, so nothing is refused.
  EXPECT_EQ(in_child([] { ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); }, [&] { return secure_execution_reason(suid); }),
            "");
}

TEST_F(ExecCheck, FileCapabilitiesCountForAnyoneButRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to set file capabilities";
  const std::string prog = program("rt_app");
  const std::uint32_t cap[5] = {VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, 1u << CAP_SYS_NICE, 0, 0, 0};
  if (::setxattr(prog.c_str(), "security.capability", cap, sizeof cap, 0) != 0)
    GTEST_SKIP() << "this file system keeps no file capabilities";
  EXPECT_EQ(secure_execution_reason(prog), "") << "root gains nothing it had not";
  ::chmod(dir_.c_str(), 0755);  // the other user must reach the program
  const std::string why = in_child(
      [] {
        [[maybe_unused]] const int g = ::setresgid(65534, 65534, 65534);
        [[maybe_unused]] const int u = ::setresuid(65534, 65534, 65534);
      },
      [&] { return secure_execution_reason(prog); });
  EXPECT_NE(why.find(prog + " carries file capabilities (cap_sys_nice+ep)"), std::string::npos) << why;
  EXPECT_NE(why.find("setcap -r"), std::string::npos) << why;
}

}  // namespace
}  // namespace nvtaskset::cli
