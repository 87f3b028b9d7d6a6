// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/proc.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace nvtaskset::ctl {

namespace {

// /proc/<pid>/stat's fields after "pid (comm)", into `buf`: comm may hold
// spaces and ')' itself, so they start after the LAST ')'. comm is at most 16
// bytes: 512 is plenty. nullptr when the file cannot be read (gone: *gone).
const char* stat_after_comm(pid_t pid, char (&buf)[512], bool* gone) {
  *gone = false;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *gone = ::kill(pid, 0) != 0 && errno == ESRCH;
    return nullptr;
  }
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  // An empty read: the process went away between open and read.
  if (n <= 0) {
    *gone = n == 0;
    return nullptr;
  }
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');
  if (close == nullptr || close[1] != ' ' || close[2] == '\0') return nullptr;  // unknown format
  return close + 2;
}

}  // namespace

bool process_is_zombie_or_dead(pid_t pid) {
  if (pid <= 0) return true;
  char buf[512];
  bool gone = false;
  const char* rest = stat_after_comm(pid, buf, &gone);
  if (rest == nullptr) return gone;  // unreadable but present: cannot tell
  return rest[0] == 'Z' || rest[0] == 'X';
}

pid_t parent_pid(pid_t pid) {
  if (pid <= 0) return 0;
  char buf[512];
  bool gone = false;
  const char* rest = stat_after_comm(pid, buf, &gone);
  // "S ppid ...": the state, one space, the parent.
  if (rest == nullptr || rest[0] == '\0' || rest[1] != ' ') return 0;
  long ppid = 0;
  for (const char* p = rest + 2; *p >= '0' && *p <= '9'; ++p) {
    ppid = ppid * 10 + (*p - '0');
    if (ppid > 0x7fffffffL) return 0;
  }
  return static_cast<pid_t>(ppid);
}

std::optional<uid_t> process_uid(pid_t pid) {
  struct stat st {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) return std::nullopt;
  return st.st_uid;
}

}  // namespace nvtaskset::ctl
