// SPDX-License-Identifier: Apache-2.0
// Reading a file that another user might have placed or changed: the
// topology cache, the device-list cache, a topology file named in the
// environment (which crosses `sudo -E`), the public status entries, and the
// MPS pipe and log directories. The rules are OpenSSH's for the files it
// trusts (sshd_config(5) StrictModes; the secure_filename and safe_path
// checks of its misc.c): a file counts only when no user but its reader or
// root can have written it.
//
//   * opened with O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC and judged by fstat of
//     that descriptor, so a symbolic link is never followed, a FIFO never
//     blocks, and the file judged is the file read;
//   * a regular file, at most the caller's number of bytes (/dev/zero or a
//     huge file is refused before anything is read);
//   * owned by the effective user or root, unless the caller checks the
//     owner itself (status entries belong to every user);
//   * writable by nobody else: no write bit for others, and the group's only
//     when the group is the owner's own (no account but the owner is in it:
//     the "user private groups" of Debian-like systems, whose umask is 002;
//     Debian's OpenSSH accepts those too);
//   * its directory, and every directory above it, owned by the user or
//     root and not writable by others unless sticky (in a sticky directory
//     only a file's owner can rename or remove it, as in /tmp and /dev/shm).
//
// Every refusal is one line that starts with the path it is about.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace nvtaskset::ctl {

// Who may own a file for it to be read.
enum class FileOwner {
  kUserOrRoot,  // the effective user or root
  kAnyone,      // any user: the caller compares the owner with what it expects
};

struct TrustedRead {
  std::string text;     // the whole file, when ok()
  struct stat st {};    // fstat of the file opened (zeroed when it could not be opened)
  std::string error;    // "" or why the file is not used: one line, naming the path
  bool absent = false;  // it does not exist (ENOENT): a cache miss, not worth a warning
  bool ok() const noexcept { return error.empty(); }
};

// The file at `path`, read whole when it passes every rule above for a file
// (its directories are not checked: see check_trusted_dir).
TrustedRead read_trusted_file(const std::string& path, std::size_t max_bytes,
                              FileOwner owner = FileOwner::kUserOrRoot);

// "" when `dir` is a directory, not a symbolic link, that passes the rules
// above, as does every directory above it (symbolic links above it are
// resolved first, as OpenSSH does with realpath); else why not, one line.
std::string check_trusted_dir(const std::string& dir);

// check_trusted_dir of the directory that holds `path`.
std::string check_trusted_parent(const std::string& path);

// Creates `dir` and any missing parent with `mode` (mkdir -p), so that a
// directory this program creates passes check_trusted_dir whatever the
// umask widens. "" or why not, one line.
std::string make_trusted_dirs(const std::string& dir, mode_t mode = 0755);

// The largest PID Linux can hand out: PID_MAX_LIMIT, 4 * 1024 * 1024 on
// 64-bit kernels (include/linux/threads.h; /proc/sys/kernel/pid_max cannot
// be set above it, proc(5)).
inline constexpr pid_t kPidMaxLimit = 4 * 1024 * 1024;

// A PID written in decimal by someone else (a file name, a daemon's answer):
// 1 to 7 digits, no sign, no leading zero, at most kPidMaxLimit; nullopt for
// anything else, so no such text can overflow a pid_t.
std::optional<pid_t> parse_pid(std::string_view digits);

}  // namespace nvtaskset::ctl
