// SPDX-License-Identifier: Apache-2.0
// Which mode the running MPS control daemon is in (mps.hpp, running_daemon):
// the process that listens on the control socket, by the kernel's peer
// credentials, and its flags, read from /proc as trusted_file.hpp reads a
// file (docs/security.md).
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <string_view>
#include <vector>

#include "mps_private.hpp"
#include "nvtaskset/mps.hpp"
#include "nvtaskset/spawn.hpp"

namespace nvtaskset::mps {
namespace {
using Fd = process::UniqueFd;
using detail::control_socket_path;
using detail::errno_text;
using detail::fill_sockaddr;
}  // namespace

namespace {
// The command line of a process that runs as root, from /proc/<pid>/cmdline,
// judged as trusted_file.hpp judges a file: not followed if a link, a
// regular file, owned by root (a process's /proc files belong to the user it
// runs as) and writable by nobody. 4 KiB holds the control program's few
// flags; a longer line is not that program's. "" in *why, or why not.
std::vector<std::string> root_process_argv(pid_t pid, std::string* why) {
  const std::string path = fmt::format("/proc/{}/cmdline", pid);
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  struct stat st {};
  if (fd.get() < 0) {
    const int err = errno;
    // /proc mounted with hidepid hides another user's processes that still run.
    const bool hidden = err == ENOENT && (::kill(pid, 0) == 0 || errno == EPERM);
    *why = hidden            ? fmt::format("{} cannot be seen (is /proc mounted with hidepid?)", path)
           : err == ENOENT ? fmt::format("the process that listens there (pid {}) is gone", pid)
                           : fmt::format("{}: {}", path, errno_text(err));
    return {};
  }
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 0222) != 0) {
    *why = fmt::format("{} is not a read-only file of root's", path);
    return {};
  }
  constexpr std::size_t kMaxCmdline = 4096;
  std::string text(kMaxCmdline + 1, '\0');
  std::size_t got = 0;
  for (;;) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = fmt::format("{}: {}", path, errno_text(errno));
      return {};
    }
    if (n == 0 || (got += static_cast<std::size_t>(n)) == text.size()) break;
  }
  if (got > kMaxCmdline) {
    *why = fmt::format("{} is longer than {} bytes", path, kMaxCmdline);
    return {};
  }
  text.resize(got);
  std::vector<std::string> argv;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t end = std::min(text.find('\0', pos), text.size());
    argv.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  why->clear();
  return argv;
}

// -M or --multiuser-server among the flags: alone, or among other one-letter
// flags (-dM).
bool has_multi_user_flag(const std::vector<std::string>& argv) {
  for (std::size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--multiuser-server") return true;
    const bool letters = a.size() >= 2 && a[0] == '-' && a[1] != '-' &&
                         std::all_of(a.begin() + 1, a.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
    if (letters && a.find('M') != std::string::npos) return true;
  }
  return false;
}

// What a name from another process's memory may show in a one-line message.
std::string printable_name(std::string_view s) {
  std::string out(s.substr(0, 80));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return out;
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
}  // namespace

Daemon running_daemon(const std::string& pipe_dir) {
  const std::string sock = control_socket_path(pipe_dir);
  auto cannot = [&](const std::string& why) {
    return Error(fmt::format("cannot tell whether the MPS control daemon at {} serves every user: {}", sock, why));
  };
  sockaddr_un addr{};
  if (!fill_sockaddr(sock, &addr)) throw cannot("the path is too long for a unix socket");
  Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (s.get() < 0) throw cannot(errno_text(errno));
  // Bounded: connect() to a listener whose backlog is full waits this long.
  const timeval limit{0, 500'000};
  ::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  int rc;
  do {
    rc = ::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) throw cannot(errno_text(errno));
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(s.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) throw cannot(errno_text(errno));
  s.reset();
  Daemon d{cred.pid, cred.uid, DaemonMode::kSingleUser};
  // Only root can start servers for other users: a user's own daemon serves
  // that user alone, whatever its flags.
  if (cred.uid != 0) return d;
  std::string why;
  const std::vector<std::string> argv = root_process_argv(cred.pid, &why);
  if (!why.empty()) throw cannot(why);
  // The flags are read as that program's own.
  if (argv.empty() || base_name(argv[0]) != kDefaultControlBinary)
    throw cannot(fmt::format("the process that listens there (pid {}) is {}, not {}", cred.pid,
                             argv.empty() ? std::string("unnamed") : printable_name(argv[0]), kDefaultControlBinary));
  if (has_multi_user_flag(argv)) d.mode = DaemonMode::kMultiUser;
  spdlog::debug("mps: the daemon at {} is pid {}, {}", sock, d.pid,
                d.mode == DaemonMode::kMultiUser ? "multi-user" : "single-user");
  return d;
}

bool serves_every_user(const std::string& pipe_dir) {
  try {
    return running_daemon(pipe_dir).mode == DaemonMode::kMultiUser;
  } catch (const Error& e) {
    spdlog::debug("mps: {}", e.what());
    return false;
  }
}

}  // namespace nvtaskset::mps
