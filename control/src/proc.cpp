// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/proc.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace nvtaskset::ctl {

std::optional<std::string_view> stat_field(std::string_view line, unsigned n) noexcept {
  if (n == 0) return std::nullopt;
  const std::size_t open = line.find(" (");
  const std::size_t close = line.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open + 1) return std::nullopt;
  if (n == 1) return line.substr(0, open);
  if (n == 2) return line.substr(open + 2, close - open - 2);
  // After comm: ") " and then fields 3, 4, ... separated by one space.
  std::string_view rest = line.substr(close + 1);
  if (rest.empty() || rest.front() != ' ') return std::nullopt;
  rest.remove_prefix(1);
  while (!rest.empty() && rest.back() == '\n') rest.remove_suffix(1);
  for (unsigned i = 3;; ++i) {
    const std::size_t space = rest.find(' ');
    if (i == n) {
      const std::string_view f = rest.substr(0, space);
      if (f.empty()) return std::nullopt;
      return f;
    }
    if (space == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(space + 1);
  }
}

namespace {

// The whole of /proc/<pid>/stat into `buf`: 52 fields of at most 20 digits
// and a comm of at most 16 bytes (TASK_COMM_LEN) fit. nullopt when it cannot
// be read (*gone: the process does not exist).
std::optional<std::string_view> read_stat(pid_t pid, char (&buf)[2048], bool* gone) {
  *gone = false;
  if (pid <= 0) {
    *gone = true;
    return std::nullopt;
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *gone = ::kill(pid, 0) != 0 && errno == ESRCH;
    return std::nullopt;
  }
  std::size_t len = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf + len, sizeof buf - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0 || (len += static_cast<std::size_t>(n)) == sizeof buf - 1) break;
  }
  ::close(fd);
  // An empty read: the process went away between open and read.
  if (len == 0) {
    *gone = true;
    return std::nullopt;
  }
  return std::string_view(buf, len);
}

}  // namespace

std::optional<std::string> process_stat_field(pid_t pid, unsigned n, bool* gone) {
  char buf[2048];
  bool g = false;
  const auto line = read_stat(pid, buf, &g);
  if (gone != nullptr) *gone = g;
  if (!line) return std::nullopt;
  const auto f = stat_field(*line, n);
  if (!f) return std::nullopt;
  return std::string(*f);
}

std::optional<std::uint64_t> process_stat_number(pid_t pid, unsigned n, bool* gone) {
  const auto f = process_stat_field(pid, n, gone);
  if (!f || f->empty() || f->size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : *f) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, static_cast<unsigned>(c - '0'), &v))
      return std::nullopt;
  }
  return v;
}

bool process_is_zombie_or_dead(pid_t pid) {
  if (pid <= 0) return true;
  bool gone = false;
  const auto state = process_stat_field(pid, 3, &gone);
  if (!state) return gone;  // unreadable but present: cannot tell
  return (*state)[0] == 'Z' || (*state)[0] == 'X';
}

pid_t parent_pid(pid_t pid) {
  if (pid <= 0) return 0;
  const auto ppid = process_stat_number(pid, 4);
  if (!ppid || *ppid > 0x7fffffffULL) return 0;
  return static_cast<pid_t>(*ppid);
}

std::vector<pid_t> ancestors(pid_t pid) {
  std::vector<pid_t> out;
  for (int depth = 0; depth < 64; ++depth) {
    pid = parent_pid(pid);
    if (pid <= 1) break;
    out.push_back(pid);
  }
  return out;
}

std::optional<uid_t> process_uid(pid_t pid) {
  struct stat st {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) return std::nullopt;
  return st.st_uid;
}

}  // namespace nvtaskset::ctl
