// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/exec_check.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string_view>

#include "nvtaskset/idlist.hpp"
#include "nvtaskset/sharing.hpp"

namespace nvtaskset::cli {
namespace {

// glibc's execvp() searches this when PATH is unset (confstr(_CS_PATH)).
constexpr const char* kDefaultPath = "/bin:/usr/bin";
// A "#!" line longer than this is cut by the kernel (BINPRM_BUF_SIZE).
constexpr std::size_t kShebangBytes = 256;
// An interpreter may itself be a script; the kernel follows 4 levels.
constexpr int kMaxInterpreters = 4;

bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Capability names by number (linux/capability.h), for the message.
const char* cap_name(unsigned n) {
  static const char* const names[] = {
      "cap_chown", "cap_dac_override", "cap_dac_read_search", "cap_fowner", "cap_fsetid", "cap_kill",
      "cap_setgid", "cap_setuid", "cap_setpcap", "cap_linux_immutable", "cap_net_bind_service",
      "cap_net_broadcast", "cap_net_admin", "cap_net_raw", "cap_ipc_lock", "cap_ipc_owner", "cap_sys_module",
      "cap_sys_rawio", "cap_sys_chroot", "cap_sys_ptrace", "cap_sys_pacct", "cap_sys_admin", "cap_sys_boot",
      "cap_sys_nice", "cap_sys_resource", "cap_sys_time", "cap_sys_tty_config", "cap_mknod", "cap_lease",
      "cap_audit_write", "cap_audit_control", "cap_setfcap", "cap_mac_override", "cap_mac_admin", "cap_syslog",
      "cap_wake_alarm", "cap_block_suspend", "cap_audit_read", "cap_perfmon", "cap_bpf", "cap_checkpoint_restore"};
  return n < sizeof names / sizeof names[0] ? names[n] : nullptr;
}

// The permitted set of a security.capability attribute ("cap_sys_nice,..."),
// "" when the file has none. `raw` tells whether any attribute is there.
std::string file_capabilities(const std::string& path, bool* raw) {
  unsigned char buf[64] = {};
  const ssize_t n = ::getxattr(path.c_str(), "security.capability", buf, sizeof buf);
  *raw = n > 0;
  if (n < static_cast<ssize_t>(sizeof(std::uint32_t) * 3)) return "";
  // vfs_cap_data: magic_etc, then {permitted, inheritable} per 32-bit word.
  std::uint32_t words[5] = {};
  std::memcpy(words, buf, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof words));
  std::uint64_t permitted = words[1];
  if ((words[0] & VFS_CAP_REVISION_MASK) != VFS_CAP_REVISION_1 && n >= 20) permitted |= std::uint64_t{words[3]} << 32;
  std::string names;
  for (unsigned i = 0; i < 64; ++i) {
    if (!((permitted >> i) & 1)) continue;
    const char* nm = cap_name(i);
    names += (names.empty() ? "" : ",") + (nm ? std::string(nm) : "cap_" + std::to_string(i));
  }
  if ((words[0] & VFS_CAP_FLAGS_EFFECTIVE) && !names.empty()) names += "+ep";
  return names;
}

std::string group_name(gid_t g) {
  struct group gr {};
  struct group* out = nullptr;
  char buf[1024];
  if (::getgrgid_r(g, &gr, buf, sizeof buf, &out) == 0 && out != nullptr) return out->gr_name;
  return std::to_string(g);
}

// The interpreter of a "#!" script, or "".
std::string interpreter_of(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return "";
  char buf[kShebangBytes + 1] = {};
  const ssize_t n = ::read(fd, buf, kShebangBytes);
  ::close(fd);
  if (n < 3 || buf[0] != '#' || buf[1] != '!') return "";
  std::string_view line(buf + 2, static_cast<std::size_t>(n) - 2);
  line = line.substr(0, line.find('\n'));
  const std::size_t s = line.find_first_not_of(" \t");
  if (s == std::string_view::npos) return "";
  line.remove_prefix(s);
  return std::string(line.substr(0, line.find_first_of(" \t")));
}

const char* kWhy = ": the kernel runs it in secure-execution mode, where the loader ignores LD_LIBRARY_PATH and "
                   "LD_PRELOAD, so nvtaskset's shim would not be loaded and its kernels would run on all TPCs";

}  // namespace

std::string resolve_command(const std::string& command, const std::vector<std::string>& env) {
  if (command.empty()) return "";
  if (command.find('/') != std::string::npos) return command;
  std::string path = kDefaultPath;
  for (const std::string& e : env)
    if (e.starts_with("PATH=")) path = e.substr(5);
  std::size_t at = 0;
  while (at <= path.size()) {
    std::size_t end = path.find(':', at);
    if (end == std::string::npos) end = path.size();
    // An empty element is the current directory, as for execvp().
    const std::string dir = end == at ? "." : path.substr(at, end - at);
    const std::string candidate = dir + "/" + command;
    if (executable_file(candidate)) return candidate;
    at = end + 1;
  }
  return "";
}

std::string secure_execution_reason(const std::string& path) {
  // no_new_privs: execve() grants no set-id or capability (prctl(2)).
  if (::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1) return "";
  std::string file = path;
  for (int level = 0; level <= kMaxInterpreters && !file.empty(); ++level) {
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
    // The kernel ignores set-id bits and file capabilities of a script:
    // it is its interpreter that is executed.
    if (const std::string interp = interpreter_of(file); !interp.empty()) {
      file = interp;
      continue;
    }
    struct statvfs vfs {};
    if (::statvfs(file.c_str(), &vfs) == 0 && (vfs.f_flag & ST_NOSUID) != 0) return "";
    const std::string shown = printable(file, 200) + (file == path ? "" : " (the interpreter of " +
                                                                         printable(path, 200) + ")");
    // Secure execution when the exec changes the real and effective IDs
    // apart, or raises capabilities for anyone but root (execve(2),
    // capabilities(7)); a set-uid file of our own user changes nothing.
    if ((st.st_mode & S_ISUID) != 0 && st.st_uid != ::getuid())
      return shown + " is set-uid (owner " + user_name(st.st_uid) + ")" + kWhy +
             "; run it as that user instead, or remove the bit (chmod u-s)";
    if ((st.st_mode & S_ISGID) != 0 && (st.st_mode & S_IXGRP) != 0 && st.st_gid != ::getgid())
      return shown + " is set-gid (group " + group_name(st.st_gid) + ")" + kWhy +
             "; run it with that group as your own (sg, newgrp), or remove the bit (chmod g-s)";
    bool has_caps = false;
    const std::string caps = file_capabilities(file, &has_caps);
    if (has_caps && ::getuid() != 0)
      return shown + " carries file capabilities (" + (caps.empty() ? "unreadable" : caps) + ")" + kWhy +
             "; run it as root, or remove them (setcap -r) and grant what it needs another way";
    return "";
  }
  return "";
}

}  // namespace nvtaskset::cli
