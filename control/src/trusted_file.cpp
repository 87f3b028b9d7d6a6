// SPDX-License-Identifier: Apache-2.0
// Files and directories that another user might have placed: see
// trusted_file.hpp for the rules and where they come from.
#include "nvtaskset/trusted_file.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace nvtaskset::ctl {
namespace {

std::string owner_text(uid_t uid) { return "uid " + std::to_string(uid); }

// Whether no account but `owner` can be in group `gid`: no member listed but
// the owner, and no other account has it as its primary group. That is a
// user private group, whose write bit gives nobody else anything.
bool private_group(gid_t gid, uid_t owner) {
  const passwd* pw = ::getpwuid(owner);
  if (pw == nullptr) return false;
  const std::string name = pw->pw_name;
  const group* gr = ::getgrgid(gid);
  if (gr == nullptr) return false;
  for (char** m = gr->gr_mem; m != nullptr && *m != nullptr; ++m)
    if (name != *m) return false;
  bool alone = true;
  ::setpwent();
  // Bounded by the account database, which only root writes.
  while (const passwd* p = ::getpwent()) {
    if (p->pw_gid == gid && p->pw_uid != owner) {
      alone = false;
      break;
    }
  }
  ::endpwent();
  return alone;
}

// "" when the owner and the mode of `st` leave `what` to the user and root.
std::string judge(const std::string& what, const struct stat& st, FileOwner owner, bool sticky_ok) {
  const uid_t me = ::geteuid();
  if (owner == FileOwner::kUserOrRoot && st.st_uid != 0 && st.st_uid != me)
    return what + " is owned by " + owner_text(st.st_uid) + ", neither this user (" + owner_text(me) + ") nor root";
  const bool sticky = sticky_ok && (st.st_mode & S_ISVTX) != 0;
  if ((st.st_mode & S_IWOTH) != 0 && !sticky) return what + " is writable by every user";
  // Status entries (kAnyone) are written 0644: no need to ask the account
  // database (NSS, inside every task's shim) about their group.
  if ((st.st_mode & S_IWGRP) != 0 && !sticky) {
    if (owner == FileOwner::kAnyone) return what + " is writable by its group";
    if (!private_group(st.st_gid, st.st_uid))
      return what + " is writable by group " + std::to_string(st.st_gid) + ", which other users may be in";
  }
  return "";
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

TrustedRead read_trusted_file(const std::string& path, std::size_t max_bytes, FileOwner owner) {
  TrustedRead r;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
  // writer; on a regular file it changes nothing.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    r.absent = e == ENOENT;
    // O_NOFOLLOW on a final symbolic link fails with ELOOP (open(2)).
    r.error = e == ELOOP ? path + " is a symbolic link, which is never followed" : path + ": cannot open: " + std::strerror(e);
    return r;
  }
  if (::fstat(fd, &r.st) != 0) {
    r.error = path + ": " + std::strerror(errno);
  } else if (!S_ISREG(r.st.st_mode)) {
    r.error = path + " is not a regular file";
  } else if (r.st.st_size < 0 || static_cast<unsigned long long>(r.st.st_size) > max_bytes) {
    r.error = path + " holds " + std::to_string(r.st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
              " this file may have";
  } else {
    r.error = judge(path, r.st, owner, /*sticky_ok=*/false);
  }
  if (r.error.empty()) {
    // At most max_bytes + 1: a file that grew after fstat is refused too.
    r.text.resize(static_cast<std::size_t>(r.st.st_size) + 1);
    std::size_t got = 0;
    while (got < r.text.size()) {
      const ssize_t n = ::read(fd, r.text.data() + got, r.text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        r.error = path + ": " + std::strerror(errno);
        break;
      }
      if (n == 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (r.error.empty() && got > max_bytes)
      r.error = path + " grew past the " + std::to_string(max_bytes) + " bytes this file may have";
    r.text.resize(r.error.empty() ? got : 0);
  }
  ::close(fd);
  return r;
}

std::string check_trusted_dir(const std::string& dir) {
  struct stat st {};
  if (dir.empty()) return "no directory given";
  if (::lstat(dir.c_str(), &st) != 0) return dir + ": " + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return dir + " is a symbolic link, which is never followed";
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (std::string why = judge(dir, st, FileOwner::kUserOrRoot, /*sticky_ok=*/true); !why.empty()) return why;
  // Every directory above it: whoever may rename one of them can put
  // another tree in its place (OpenSSH's safe_path walks up the same way).
  char* real = ::realpath(dir.c_str(), nullptr);
  if (real == nullptr) return dir + ": " + std::strerror(errno);
  std::string p = real;
  std::free(real);
  // A path has fewer components than PATH_MAX bytes: the walk ends.
  for (int depth = 0; p != "/" && depth < PATH_MAX; ++depth) {
    p = parent_of(p);
    if (::stat(p.c_str(), &st) != 0) return p + ": " + std::strerror(errno);
    if (std::string why = judge(p, st, FileOwner::kUserOrRoot, /*sticky_ok=*/true); !why.empty())
      return why + " (it holds " + dir + ")";
  }
  return "";
}

std::string check_trusted_parent(const std::string& path) { return check_trusted_dir(parent_of(path)); }

std::optional<pid_t> parse_pid(std::string_view digits) {
  // 7 digits hold kPidMaxLimit (4194304); a longer run is never a PID.
  if (digits.empty() || digits.size() > 7 || digits[0] == '0') return std::nullopt;
  pid_t v = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v > kPidMaxLimit) return std::nullopt;
  return v;
}

std::string make_trusted_dirs(const std::string& dir, mode_t mode) {
  if (dir.empty()) return "no directory given";
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    const std::string cur = dir.substr(0, pos);
    if (cur.empty() || cur == "/") continue;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return "cannot create " + cur + ": " + std::strerror(errno);
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "cannot create " + dir + ": not a directory";
  return "";
}

}  // namespace nvtaskset::ctl
