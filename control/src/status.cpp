// SPDX-License-Identifier: Apache-2.0
// The public status entries (status.hpp). An entry is written whole under a
// temporary name that readers skip, then renamed over the task's entry, so a
// reader sees the old or the new entry at every moment: never a mix, and
// never neither (a new file beside the old one, then the old one removed,
// would let a directory scan miss both; a lock-free choice would then take
// the task's TPCs for free).
#include "nvtaskset/status.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>

#include "nvtaskset/control_region.hpp"
#include "nvtaskset/options.hpp"
#include "nvtaskset/proc.hpp"
#include "nvtaskset/trusted_file.hpp"

namespace nvtaskset::ctl {
namespace {

constexpr const char* kPrefix = "nvtaskset-status.";
// "<prefix><pid>.<16 hex>" is the entry of task <pid>; with this suffix, an
// entry being written by process <pid>.
constexpr const char* kTempSuffix = ".new";
constexpr const char* kFormat = "nvtaskset-status 1";
// An entry holds at most kMaxDevices partitions of ~150 bytes.
constexpr std::size_t kMaxEntryBytes = 16384;
// An entry has 4 lines (format, pid, start, partitions); a few more leave
// room for a later format's keys. Beyond that it is not an entry.
constexpr int kMaxEntryLines = 16;

struct File {
  std::string name;
  pid_t pid = 0;
  bool temp = false;  // being written by process `pid` (or left by one that died)
};

// Entries and temporary files, by name.
std::vector<File> entry_files(const std::string& dir) {
  std::vector<File> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    bool temp = false;
    if (const auto pid = pid_of_shared_name(e->d_name, kPrefix, kTempSuffix, &temp))
      out.push_back({e->d_name, *pid, temp});
  }
  ::closedir(d);
  return out;
}

struct Parsed {
  pid_t pid = 0;
  std::uint64_t start = 0;
  std::vector<DevicePartition> partitions;
  roles::Role role = roles::Role::kNone;
};

std::optional<Parsed> parse(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kFormat) return std::nullopt;
  Parsed p;
  bool have_pid = false, have_start = false, have_parts = false;
  for (int lines = 1; std::getline(in, line); ++lines) {
    if (lines >= kMaxEntryLines) return std::nullopt;
    const auto sp = line.find(' ');
    const std::string key = line.substr(0, sp);
    const std::string value = sp == std::string::npos ? "" : line.substr(sp + 1);
    try {
      if (key == "pid") {
        const auto pid = parse_pid(value);
        if (!pid) return std::nullopt;
        p.pid = *pid;
        have_pid = true;
      } else if (key == "start") {
        p.start = std::stoull(value);
        have_start = true;
      } else if (key == "partitions") {
        p.partitions = decode_partitions(value);
        have_parts = true;
      } else if (key == "role") {
        const auto r = roles::parse_role(value);
        if (!r) return std::nullopt;
        p.role = *r;
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (!have_pid || !have_start || !have_parts) return std::nullopt;
  return p;
}

// Reads an entry as every shared file is read (trusted_file.hpp): no link
// followed, no FIFO waited on, at most kMaxEntryBytes, writable by its owner
// only. Any user may own one: read_status matches the owner with the task's
// user. nullopt for anything else.
std::optional<std::pair<std::string, struct stat>> read_entry(const std::string& path) {
  TrustedRead r = read_trusted_file(path, kMaxEntryBytes, FileOwner::kAnyone);
  if (!r.ok()) return std::nullopt;
  return std::make_pair(std::move(r.text), r.st);
}

}  // namespace

// The directory is usable when no other user can remove or replace our
// files there: owned by root or us, and sticky if others may write to it.
std::string check_shared_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return dir + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) return dir + " belongs to another user";
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0)
    return dir + " is writable by others and not sticky";
  return "";
}

std::string random_hex() {
  std::uint64_t r = 0;
  if (::getrandom(&r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) {
    r = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (static_cast<std::uint64_t>(::getpid()) << 32);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

std::optional<pid_t> pid_of_shared_name(std::string_view name, std::string_view prefix, std::string_view temp_suffix,
                                        bool* temp) {
  if (!name.starts_with(prefix)) return std::nullopt;
  std::string_view rest = name.substr(prefix.size());
  const bool is_temp = !temp_suffix.empty() && rest.size() > temp_suffix.size() && rest.ends_with(temp_suffix);
  if (is_temp) rest.remove_suffix(temp_suffix.size());
  if (temp != nullptr) *temp = is_temp;
  const auto dot = rest.find('.');
  if (dot == std::string_view::npos || rest.size() - dot - 1 != 16) return std::nullopt;
  return parse_pid(rest.substr(0, dot));
}

bool may_remove(const struct stat& st) { return ::geteuid() == 0 || st.st_uid == ::geteuid(); }

std::string status_dir() {
  if (const char* d = option_value(Option::kStatusDir)) return d;
  return "/dev/shm";
}

std::string publish_status(pid_t pid, const std::vector<DevicePartition>& partitions, roles::Role role) {
  const std::string dir = status_dir();
  if (std::string why = check_shared_dir(dir); !why.empty()) return why;
  const std::uint64_t start = process_start_time(pid);
  const auto uid = process_uid(pid);
  if (start == 0 || !uid) return "pid " + std::to_string(pid) + " is gone";
  std::string text = std::string(kFormat) + "\npid " + std::to_string(pid) + "\nstart " + std::to_string(start) +
                     "\npartitions " + encode_partitions(partitions) + "\n";
  if (role != roles::Role::kNone) text += std::string("role ") + roles::role_name(role) + "\n";
  const std::string base = dir + "/" + kPrefix + std::to_string(pid) + ".";
  // Named for the writer (a `-p` writer is not the task): if it dies before
  // the rename, readers clean the file up once it is gone.
  const std::string tmp = dir + "/" + kPrefix + std::to_string(::getpid()) + "." + random_hex() + kTempSuffix;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return tmp + ": " + std::strerror(errno);
  // Root writing for another user's task: the entry must be the task's
  // user's, or readers take it for a forgery.
  bool ok = ::fchmod(fd, 0644) == 0 && (::geteuid() != 0 || *uid == 0 || ::fchown(fd, *uid, static_cast<gid_t>(-1)) == 0);
  std::size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) ok = false;
    else done += static_cast<std::size_t>(n);
  }
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return tmp + ": " + std::strerror(err);
  }
  // The complete entry takes the name of the task's current one, which names
  // the task at every moment; the first entry gets a fresh random name.
  const std::vector<File> files = entry_files(dir);
  std::string target;
  for (const File& f : files) {
    if (f.pid != pid || f.temp) continue;
    const std::string path = dir + "/" + f.name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && may_remove(st)) {
      target = path;
      break;
    }
  }
  if (target.empty() || ::rename(tmp.c_str(), target.c_str()) != 0) {
    target = base + random_hex();
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return target + ": " + std::strerror(e);
    }
  }
  // Any other entry of the task (two writers at once) goes.
  for (const File& f : files) {
    const std::string path = dir + "/" + f.name;
    if (f.pid != pid || f.temp || path == target) continue;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && may_remove(st)) ::unlink(path.c_str());
  }
  return "";
}

void withdraw_status(pid_t pid) {
  const std::string dir = status_dir();
  for (const File& f : entry_files(dir)) {
    if (f.pid != pid || f.temp) continue;
    const std::string path = dir + "/" + f.name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && may_remove(st)) ::unlink(path.c_str());
  }
}

std::vector<StatusEntry> read_status() {
  const std::string dir = status_dir();
  std::map<pid_t, StatusEntry> by_pid;
  std::map<pid_t, struct timespec> newest;
  for (const File& f : entry_files(dir)) {
    const std::string path = dir + "/" + f.name;
    if (f.temp) {
      // Left by a writer that died before renaming it.
      struct stat st {};
      if (process_start_time(f.pid) == 0 && ::lstat(path.c_str(), &st) == 0 && may_remove(st))
        ::unlink(path.c_str());
      continue;
    }
    const auto e = read_entry(path);
    if (!e) continue;
    const auto& [text, st] = *e;
    const std::optional<Parsed> p = parse(text);
    const std::uint64_t live_start = process_start_time(f.pid);
    const bool live = live_start != 0 && !process_is_zombie_or_dead(f.pid);
    if (!p || p->pid != f.pid || !live || p->start != live_start) {
      // Ended (or never valid): never shown; cleaned by whoever may.
      if ((!live || (p && p->start != live_start)) && may_remove(st)) ::unlink(path.c_str());
      continue;
    }
    const auto uid = process_uid(f.pid);
    if (!uid || (st.st_uid != *uid && st.st_uid != 0)) continue;  // a forgery
    // Two entries of one task exist only for a moment while one replaces
    // the other: the newer wins.
    auto it = newest.find(f.pid);
    const bool newer = it == newest.end() || st.st_mtim.tv_sec > it->second.tv_sec ||
                       (st.st_mtim.tv_sec == it->second.tv_sec && st.st_mtim.tv_nsec > it->second.tv_nsec);
    if (!newer) continue;
    newest[f.pid] = st.st_mtim;
    by_pid[f.pid] = {f.pid, p->start, *uid, p->partitions, p->role};
  }
  std::vector<StatusEntry> out;
  for (auto& [pid, e] : by_pid) out.push_back(std::move(e));
  return out;
}

}  // namespace nvtaskset::ctl
