// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/proc.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace nvtaskset::ctl {

bool process_is_zombie_or_dead(pid_t pid) {
  if (pid <= 0) return true;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ::kill(pid, 0) != 0 && errno == ESRCH;
  // "pid (comm) S ...": comm may hold spaces and ')' itself, so the state is
  // the field after the LAST ')'. comm is at most 16 bytes: 512 is plenty.
  char buf[512];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  // An empty read: the process went away between open and read.
  if (n <= 0) return n == 0;
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');
  if (close == nullptr || close[1] != ' ' || close[2] == '\0') return false;  // unknown format: cannot tell
  return close[2] == 'Z' || close[2] == 'X';
}

}  // namespace nvtaskset::ctl
