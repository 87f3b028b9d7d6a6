// SPDX-License-Identifier: Apache-2.0
// Find or start the NVIDIA MPS control daemon (docs/hardware.md, "%smid and MPS").
//
// The reference tool started MPS through system(); we fork/exec the control
// program directly, give it only stdin=/dev/null and a captured stdout/stderr,
// and bound every wait so that a daemon that never answers cannot hang the CLI.
#include "nvtaskset/mps.hpp"
#include "mps_private.hpp"
#include "nvtaskset/options.hpp"
#include "nvtaskset/spawn.hpp"
#include "nvtaskset/trusted_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace nvtaskset::mps {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using Fd = process::UniqueFd;
using detail::control_socket_path;
using detail::errno_text;
using detail::fill_sockaddr;

std::optional<std::string> env_nonempty(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}


bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Writable for the effective user (AT_EACCESS): that is who the daemon runs as.
bool is_writable_dir(const std::string& p) {
  return is_dir(p) && ::faccessat(AT_FDCWD, p.c_str(), W_OK | X_OK, AT_EACCESS) == 0;
}

// mkdir -p. Returns 0 or the errno of the failing step.
int make_dirs(const std::string& path, mode_t mode) {
  if (path.empty()) return ENOENT;
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    size_t next = path.find('/', pos + 1);
    cur = path.substr(0, next);
    pos = next;
    if (cur.empty() || cur == "/") continue;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return errno;
  }
  return is_dir(path) ? 0 : ENOTDIR;
}

// A per-user fallback directory: created 0700, and accepted only when it is a
// real directory (not a symlink) owned by us, since /tmp is shared and another
// user could have planted the name first.
bool private_dir_ok(const std::string& dir, std::string* why) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = errno_text(errno);
    return false;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    *why = errno_text(errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    *why = "not a directory";
    return false;
  }
  if (st.st_uid != ::geteuid()) {
    *why = fmt::format("owned by uid {}, not by uid {}", st.st_uid, ::geteuid());
    return false;
  }
  if (!is_writable_dir(dir)) {
    *why = "not writable";
    return false;
  }
  if (std::string e = ctl::check_trusted_dir(dir); !e.empty()) {
    *why = e;
    return false;
  }
  return true;
}

// "" when no other user can have placed or can replace what is in `dir`
// (trusted_file.hpp: owned by this user or root, nobody else may write to
// it unless it is sticky, the same for every directory above it), and the
// control socket in it, if any, is this user's or root's: in a sticky
// directory anyone may create that name first. A daemon reached there is
// one root's launches would wait on (a fake one delayed every launch and
// --status) and that serves them as MPS clients.
//
// The pipe directory itself may be writable by every user when it is this
// user's or root's: the control daemon makes it so (mode 0777, not sticky,
// whatever the umask: measured on an H100, driver 580.159.04, starting
// `nvidia-cuda-mps-control -d` as root; docs/hardware.md "MPS"), so that
// every user's clients can reach it. What nvtaskset talks to there is the
// control socket, whose owner is checked; one another user put in place of
// the daemon's is refused.
std::string pipe_dir_problem(const std::string& dir) {
  struct stat dst {};
  if (::lstat(dir.c_str(), &dst) != 0) return dir + ": " + errno_text(errno);
  if (S_ISLNK(dst.st_mode)) return dir + " is a symbolic link, which is never followed";
  if (!S_ISDIR(dst.st_mode)) return dir + " is not a directory";
  const bool daemon_layout = (dst.st_uid == 0 || dst.st_uid == ::geteuid()) && (dst.st_mode & S_IWOTH) != 0;
  if (std::string e = daemon_layout ? ctl::check_trusted_parent(dir) : ctl::check_trusted_dir(dir); !e.empty())
    return e;
  const std::string sock = dir + "/control";
  struct stat st {};
  if (::lstat(sock.c_str(), &st) != 0) return "";
  if (!S_ISSOCK(st.st_mode)) return sock + " is not a socket";
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    return fmt::format("{} is owned by uid {}, neither this user (uid {}) nor root", sock, st.st_uid, ::geteuid());
  return "";
}

[[noreturn]] void refuse_pipe_dir(const std::string& why) {
  throw Error(fmt::format(
      "MPS pipe directory not used: {}; set CUDA_MPS_PIPE_DIRECTORY to a directory of your own, or use --no-mps",
      why));
}

bool contains_shell_special(std::string_view s) {
  if (s.empty()) return true;
  return std::any_of(s.begin(), s.end(), [](char c) {
    return !(std::isalnum(static_cast<unsigned char>(c)) ||
             std::strchr("/._-+=:,@%", c) != nullptr);
  });
}

// Quote for a POSIX shell, so the printed stop command can be pasted.
std::string shell_quote(std::string_view s) {
  if (!contains_shell_special(s)) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  out += '\'';
  return out;
}



// ---------------------------------------------------------------------------
// Locating the control program.

struct Binary {
  std::string exec_path;  // what execve() gets
  std::string display;    // what the user types (bare name when found on $PATH)
};

// `where` is "" or " on $PATH"; `origin` says where the name came from.
[[noreturn]] void throw_missing(const std::string& name, const char* where,
                                const std::string& origin) {
  throw Error(fmt::format(
      "cannot start the MPS control daemon: {} not found{}{}; install the NVIDIA MPS tools "
      "({}) or use --no-mps",
      name, where, origin, kDefaultControlBinary));
}

bool is_executable_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::faccessat(AT_FDCWD, p.c_str(), X_OK, AT_EACCESS) == 0;
}

Binary resolve_binary(const Options& opts) {
  std::string name = opts.control_binary;
  std::string origin;
  if (name.empty()) {
    if (auto e = env_nonempty(option(Option::kMpsControl).name)) {
      name = *e;
      origin = " (from $NVTASKSET_MPS_CONTROL)";
    } else {
      name = kDefaultControlBinary;
    }
  }

  if (name.find('/') != std::string::npos) {
    struct stat st {};
    if (::stat(name.c_str(), &st) != 0) throw_missing(name, "", origin);
    if (!is_executable_file(name))
      throw Error(fmt::format(
          "cannot start the MPS control daemon: {}{} is not an executable file; install the "
          "NVIDIA MPS tools ({}) or use --no-mps",
          name, origin, kDefaultControlBinary));
    return {name, name};
  }

  // execvp() semantics, done here so a missing program is reported before we
  // fork, with a message that says which $PATH was searched.
  std::string path;
  if (auto p = env_nonempty("PATH")) {
    path = *p;
  } else {
    path = "/usr/local/bin:/usr/bin:/bin";
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    if (dir.empty()) dir = ".";  // an empty $PATH entry means the current directory
    std::string cand = dir + "/" + name;
    if (is_executable_file(cand)) {
      spdlog::debug("mps: found {} at {}", name, cand);
      return {cand, name};
    }
    start = end + 1;
  }
  throw_missing(name, " on $PATH", origin);
}

// ---------------------------------------------------------------------------
// Running `<binary> -d`.

// The first non-empty line the program printed, for the one-line error.
std::string first_output_line(int fd) {
  if (fd < 0) return {};
  char buf[4096];
  ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
  if (n <= 0) return {};
  std::string_view all(buf, static_cast<size_t>(n));
  spdlog::debug("mps: control program output: {}", all);
  size_t pos = 0;
  while (pos < all.size()) {
    size_t end = all.find('\n', pos);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = all.substr(pos, end - pos);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
      line.remove_suffix(1);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())))
      line.remove_prefix(1);
    if (!line.empty()) {
      std::string out(line.substr(0, 200));
      for (char& c : out)
        if (static_cast<unsigned char>(c) < 0x20) c = ' ';
      return out;
    }
    pos = end + 1;
  }
  return {};
}

struct Child {
  pid_t pid = -1;
  Fd output;  // memfd with its stdout/stderr (may be -1)
};

// `<binary> -d` (`-d -M` for every user), a daemon-to-be: stdin /dev/null, stdout and stderr captured,
// no descriptor of ours and none of our signal state (process::spawn).
Child spawn_daemon(const Binary& bin, const std::string& pipe_dir, const std::string& log_dir, bool multi_user) {
  // Environment: ours, with the pipe and log directories forced, so the
  // daemon and every MPS server it starts use the directories we checked.
  std::vector<std::string> env =
      process::without_variables(process::current_environment(), {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"});
  env.push_back("CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir);
  env.push_back("CUDA_MPS_LOG_DIRECTORY=" + log_dir);
  std::vector<std::string> argv{bin.exec_path, "-d"};
  if (multi_user) argv.emplace_back("-M");
  const process::ExecArgs args(std::move(argv), std::move(env));

  // Capture stdout/stderr in memory, not a pipe: the daemonized grandchild
  // may keep them open for its whole life, and a pipe would then never reach
  // EOF (nor may it be the CLI's own stderr: `nvtaskset ... 2>&1 | cat` would
  // wait for the daemon to quit).
  Fd output(::memfd_create("nvtaskset-mps-control", MFD_CLOEXEC));
  if (output.get() < 0)
    spdlog::debug("mps: memfd_create failed ({}); output discarded", errno_text(errno));
  const process::Stream out = output ? process::Stream::fd(output.get()) : process::Stream::null();

  process::SpawnOptions so;
  so.in = process::Stream::null();
  so.out = so.err = out;
  // A long-lived daemon: no stray descriptor of ours, and no blocked mask or
  // ignored signal of the CLI's.
  so.close_other_fds = true;
  so.reset_signals = true;
  try {
    return Child{process::spawn(args, so), std::move(output)};
  } catch (const process::SpawnError& e) {
    if (e.step() != "exec")
      throw Error(fmt::format("cannot start the MPS control daemon: {}", e.what()));
    if (e.error() == ENOENT) throw_missing(bin.exec_path, "", "");
    throw Error(fmt::format("cannot start the MPS control daemon: cannot run {}: {}", bin.exec_path,
                            errno_text(e.error())));
  }
}

}  // namespace

// ---------------------------------------------------------------------------

std::string pipe_directory() {
  return env_nonempty("CUDA_MPS_PIPE_DIRECTORY").value_or(kDefaultPipeDirectory);
}

std::string detail::log_directory(const LogDirDefaults& defaults) {
  if (auto dir = env_nonempty("CUDA_MPS_LOG_DIRECTORY")) {
    // The user's explicit choice wins even if unusable; the daemon's own
    // error then names it, which beats silently logging somewhere else.
    if (int e = make_dirs(*dir, 0755); e != 0)
      spdlog::debug("mps: cannot create CUDA_MPS_LOG_DIRECTORY {}: {}", *dir, errno_text(e));
    else if (!is_writable_dir(*dir))
      spdlog::debug("mps: CUDA_MPS_LOG_DIRECTORY {} is not writable", *dir);
    // But never a directory another user controls: the daemon (root's,
    // often) writes its logs there, through whatever links they put in.
    if (is_dir(*dir))
      if (std::string why = ctl::check_trusted_dir(*dir); !why.empty())
        throw Error(fmt::format(
            "MPS log directory not used: {}; set CUDA_MPS_LOG_DIRECTORY to a directory of your own, or use --no-mps",
            why));
    return *dir;
  }

  // /var/log is root's: a non-root user can neither create nor write
  // /var/log/nvidia-mps, and the daemon would then fail to start.
  const std::string& sys = defaults.system_dir;
  const bool existed = is_dir(sys);
  if (!existed) {
    if (int e = make_dirs(sys, 0755); e != 0) spdlog::debug("mps: cannot create {}: {}", sys, errno_text(e));
  }
  if (is_writable_dir(sys)) {
    const std::string why = ctl::check_trusted_dir(sys);
    if (why.empty()) return sys;
    spdlog::warn("MPS log directory {} not used: {}", sys, why);
  } else if (existed || is_dir(sys)) {
    spdlog::debug("mps: {} is not writable", sys);
  }

  std::string why;
  if (auto xdg = env_nonempty("XDG_RUNTIME_DIR");
      xdg && xdg->front() == '/' && is_writable_dir(*xdg)) {
    std::string dir = *xdg + "/nvidia-mps-log";
    if (private_dir_ok(dir, &why)) {
      spdlog::debug("mps: log directory falls back to {}", dir);
      return dir;
    }
    spdlog::debug("mps: cannot use {}: {}", dir, why);
  }

  std::string dir = fmt::format("{}/nvidia-mps-log-{}", defaults.tmp_dir, ::geteuid());
  if (private_dir_ok(dir, &why)) {
    spdlog::debug("mps: log directory falls back to {}", dir);
    return dir;
  }
  throw Error(fmt::format(
      "no usable MPS log directory: {} is not writable and {} is {}; set CUDA_MPS_LOG_DIRECTORY",
      sys, dir, why));
}

std::string log_directory() { return detail::log_directory({}); }

namespace {
// 0 when a daemon listens at <pipe dir>/control, else the errno of the probe.
int probe_daemon(const std::string& path) {
  sockaddr_un addr{};
  if (!fill_sockaddr(path, &addr)) return ENAMETOOLONG;
  // Non-blocking: a connect() to a listener whose backlog is full would
  // otherwise block, and EAGAIN already proves that a daemon listens.
  Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s.get() < 0) return errno;
  int rc;
  do {
    rc = ::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  // A SOCK_STREAM listener at the path (not the MPS daemon) gives EPROTOTYPE;
  // a socket file left by a dead daemon gives ECONNREFUSED.
  return (rc == 0 || errno == EAGAIN) ? 0 : errno;
}
}  // namespace

bool daemon_running(const std::string& pipe_dir) {
  const std::string path = control_socket_path(pipe_dir);
  if (int e = probe_daemon(path); e != 0) {
    spdlog::debug("mps: no control daemon at {}: {}", path, errno_text(e));
    return false;
  }
  spdlog::debug("mps: control daemon answers at {}", path);
  return true;
}

namespace {
// With Options::multi_user: the daemon at pipe_dir must serve every user,
// never one user at a time (whose clients of other users would wait, or,
// worse, share a server nvtaskset did not ask for).
void require_multi_user(const std::string& pipe_dir) {
  const Daemon d = running_daemon(pipe_dir);
  if (d.mode == DaemonMode::kMultiUser) return;
  const std::string who = d.uid == 0 ? std::string("was started without -M") : fmt::format("runs as uid {}, not root", d.uid);
  throw Error(fmt::format(
      "the MPS control daemon at {} (pid {}) serves one user at a time: it {}; --mps-multi-user needs one root started "
      "with -d -M: stop this one (echo quit | {}) once its clients are done, or leave out --mps-multi-user",
      pipe_dir, d.pid, who, kDefaultControlBinary));
}
}  // namespace

EnsureResult ensure_daemon(const Options& opts) {
  EnsureResult r;
  r.pipe_dir = pipe_directory();
  const std::string sock = control_socket_path(r.pipe_dir);
  if (sockaddr_un addr{}; !fill_sockaddr(sock, &addr))
    throw Error(
        fmt::format("MPS pipe directory {} is too long: a unix socket path has at most {} bytes",
                    r.pipe_dir, sizeof(addr.sun_path) - 1));

  // Neither used nor started in a directory another user controls.
  if (struct stat st {}; ::lstat(r.pipe_dir.c_str(), &st) == 0)
    if (std::string why = pipe_dir_problem(r.pipe_dir); !why.empty()) refuse_pipe_dir(why);
  if (daemon_running(r.pipe_dir)) {
    if (opts.multi_user) require_multi_user(r.pipe_dir);
    r.multi_user = opts.multi_user;
    return r;
  }
  // Checked before anything is created: a user's daemon could serve no one else.
  if (opts.multi_user && ::geteuid() != 0)
    throw Error(fmt::format(
        "no MPS control daemon runs at {}, and only root can start one that serves every user ({} -d -M): "
        "ask the administrator (or the Slurm or Kubernetes plugin, as root) to start it, or leave out --mps-multi-user",
        r.pipe_dir, kDefaultControlBinary));

  const Binary bin = resolve_binary(opts);
  r.log_dir = log_directory();
  if (int e = make_dirs(r.pipe_dir, 0755); e != 0)
    throw Error(
        fmt::format("cannot create the MPS pipe directory {}: {}", r.pipe_dir, errno_text(e)));
  // Again once it exists: another user may have created it meanwhile.
  if (std::string why = pipe_dir_problem(r.pipe_dir); !why.empty()) refuse_pipe_dir(why);

  const auto t0 = Clock::now();
  auto deadline = t0 + opts.start_timeout;
  const char* flags = opts.multi_user ? "-d -M" : "-d";
  spdlog::debug("mps: starting `{} {}` (pipe directory {}, log directory {}, timeout {} ms)", bin.exec_path, flags,
                r.pipe_dir, r.log_dir, opts.start_timeout.count());
  Child child = spawn_daemon(bin, r.pipe_dir, r.log_dir, opts.multi_user);
  bool reaped = false;
  bool answered = false;
  auto elapsed_ms = [&] {
    return std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
  };

  // Poll both the `-d` parent (it exits once it has daemonized) and the
  // socket. Short sleeps first: the real daemon answers within milliseconds.
  milliseconds step{2};
  for (;;) {
    if (!reaped) {
      int st = 0;
      pid_t w = ::waitpid(child.pid, &st, WNOHANG);
      if (w == child.pid) {
        reaped = true;
        spdlog::debug("mps: `{} {}` {} after {} ms", bin.exec_path, flags, process::describe_status(st),
                      elapsed_ms());
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !answered) {
          // Two CLIs racing to start the daemon: the loser's control program
          // refuses to start a second instance; the winner's daemon serves both.
          if (daemon_running(r.pipe_dir)) {
            spdlog::debug("mps: another process started the daemon meanwhile");
            if (opts.multi_user) require_multi_user(r.pipe_dir);
            r.multi_user = opts.multi_user;
            return r;
          }
          std::string out = first_output_line(child.output.get());
          throw Error(fmt::format(
              "cannot start the MPS control daemon: `{} {}` {} (log directory {}){}{}",
              bin.exec_path, flags, process::describe_status(st), r.log_dir, out.empty() ? "" : ": ", out));
        }
      } else if (w < 0 && errno == ECHILD) {
        // Someone else reaped it (SIGCHLD ignored by the caller): the status
        // is lost, the socket still tells.
        reaped = true;
        spdlog::debug("mps: cannot wait for `{} -d`: {}", bin.exec_path, errno_text(errno));
      }
    }
    // Probed quietly: this loop runs up to a hundred times.
    if (!answered && probe_daemon(sock) == 0) {
      answered = true;
      spdlog::debug("mps: daemon answered after {} ms", elapsed_ms());
      // Give the `-d` parent a moment to exit so it is reaped, not left as a
      // zombie for the program the CLI execs next; but success is decided.
      deadline = std::min(deadline, Clock::now() + milliseconds{250});
    }
    if (answered && reaped) break;
    if (Clock::now() >= deadline) break;
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    std::this_thread::sleep_for(std::max(milliseconds{1}, std::min(step, left)));
    step = std::min(step * 2, milliseconds{50});
  }

  if (answered) {
    // A control program that answers but stays in the foreground is left
    // running; it is not an error.
    if (!reaped) spdlog::debug("mps: `{} {}` is still running; leaving it", bin.exec_path, flags);
    r.started = true;
    r.multi_user = opts.multi_user;
    r.control_binary = bin.display;
    return r;
  }

  if (!reaped) process::kill_and_reap(child.pid);
  std::string out = first_output_line(child.output.get());
  throw Error(fmt::format(
      "cannot start the MPS control daemon: `{} {}` did not answer on {} within {} ms (log "
      "directory {}){}{}",
      bin.exec_path, flags, sock, opts.start_timeout.count(), r.log_dir, out.empty() ? "" : ": ", out));
}

namespace {

// The control program run as a client with `commands` on its stdin, from
// its start to its answer: started by start_query, read by finish_query (or
// killed and reaped by abandon_query), so a caller can do other work while it
// runs.
struct Query {
  pid_t pid = -1;
  int out = -1;  // its stdout
};

// Started with posix_spawn (process::spawn), not fork: the CLI is not copied
// for a program that execs at once (this runs in every launch,
// docs/results.md Fig. 11a). nullopt when it cannot be started.
std::optional<Query> start_query(const Binary& bin, const std::string& commands) {
  try {
    process::Pipe in = process::make_pipe(), out = process::make_pipe();
    process::SpawnOptions so;
    so.in = process::Stream::fd(in.read.get());
    so.out = process::Stream::fd(out.write.get());
    so.err = process::Stream::null();
    const pid_t pid = process::spawn(process::ExecArgs({bin.exec_path}), so);
    in.read.reset();
    out.write.reset();
    // A few bytes: they fit the pipe, so this never blocks.
    (void)!::write(in.write.get(), commands.data(), commands.size());
    in.write.reset();
    ::fcntl(out.read.get(), F_SETFL, O_NONBLOCK);
    return Query{pid, out.read.release()};
  } catch (const process::SpawnError& e) {
    spdlog::debug("mps: cannot run {}: {}", bin.exec_path, e.what());
    return std::nullopt;
  }
}

void abandon_query(Query& q) {
  if (q.pid <= 0) return;
  ::close(q.out);
  process::kill_and_reap(q.pid);
  q.pid = -1;
}

// An answer lists PIDs, one a line: a list of every PID Linux can hand out
// would be under 32 MiB; what the daemon serves is a few lines. Beyond this
// it is not the control program answering.
constexpr std::size_t kMaxAnswerBytes = 64 * 1024;

// What the query printed (stdout), or nullopt when it failed, printed more
// than kMaxAnswerBytes, or gave no answer by `until`.
std::optional<std::string> finish_query(Query& q, Clock::time_point until) {
  std::string text;
  bool done = false;
  // Woken by the answer itself, not by a polling interval: every launch with
  // a running daemon waits for one of these (docs/results.md, Fig. 11a).
  while (!done) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd pfd{q.out, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left) + 1) < 0 && errno != EINTR) break;
    char buf[4096];
    const ssize_t n = ::read(q.out, buf, sizeof buf);
    if (n > 0) text.append(buf, static_cast<std::size_t>(n));
    else if (n == 0) done = true;
    else if (errno != EAGAIN && errno != EINTR) done = true;
    if (text.size() > kMaxAnswerBytes) {
      done = false;  // not an answer: given up below
      break;
    }
  }
  // Its exit, too, by `until`: a client that closed its output need not
  // have exited.
  int status = 0;
  bool exited = false;
  while (done && !exited) {
    const pid_t w = ::waitpid(q.pid, &status, WNOHANG);
    if (w == q.pid) exited = true;
    else if (w < 0 && errno != EINTR) done = false;  // reaped elsewhere: no status to trust
    else if (Clock::now() >= until) done = false;
    else std::this_thread::sleep_for(std::chrono::microseconds{100});
  }
  if (!done) {
    abandon_query(q);
    return std::nullopt;
  }
  ::close(q.out);
  q.pid = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return text;
}

// The whole conversation with the control daemon, get_server_list and every
// get_client_list, ends this long after it is read for: a daemon that
// answers slowly (or a fake one in a pipe directory nobody checked, which
// delayed launches by 2.9 s per server it named) costs a launch or --status
// this much at most, not this much per server. The real daemon answers in
// 0.7 ms over the exec of its client (H100 and H200, docs/results.md
// Fig. 11a): 500 ms leaves room for a loaded machine and is still well
// under a second. An answer that comes too late is reported and treated as
// no server.
constexpr std::chrono::milliseconds kConversationBudget{500};
// Servers asked for their clients: the daemon runs one server per user at a
// time (docs/hardware.md, "MPS"), so a few; an answer naming more is cut here.
constexpr std::size_t kMaxServers = 16;

// The PIDs in an answer (checked: a run of digits that is no PID is skipped),
// each once, at most `limit`.
std::vector<pid_t> pids_in(const std::string& text, std::size_t limit) {
  std::vector<pid_t> out;
  std::size_t i = 0;
  while (i < text.size() && out.size() < limit) {
    while (i < text.size() && !std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    const std::size_t start = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (i == start) break;
    const auto pid = ctl::parse_pid(std::string_view(text).substr(start, i - start));
    if (pid && std::find(out.begin(), out.end(), *pid) == out.end()) out.push_back(*pid);
  }
  return out;
}

// How many client PIDs an answer lists (the daemon's clients are bounded by
// MPS itself; the answer by kMaxAnswerBytes).
unsigned count_pids(const std::string& text) {
  return static_cast<unsigned>(pids_in(text, kMaxAnswerBytes).size());
}

// The control program, or nullopt when it cannot be found: then nobody can
// run a server to ask about either.
std::optional<Binary> query_binary(const Options& opts) {
  try {
    return resolve_binary(opts);
  } catch (const Error&) {
    return std::nullopt;
  }
}

void too_late(const char* what, const char* so) {
  spdlog::warn("the MPS control daemon at {} did not answer {} within {} ms; {}", pipe_directory(), what,
               kConversationBudget.count(), so);
}

// The servers a get_server_list answer names, each asked for its clients:
// all at once, so the answers arrive together, by `until`.
std::vector<Server> servers_listed(const Binary& bin, const std::string& list, bool other_users_only,
                                   Clock::time_point until) {
  std::vector<Server> out;
  std::vector<std::optional<Query>> queries;
  for (const pid_t pid : pids_in(list, kMaxServers)) {
    struct stat st {};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) continue;
    if (other_users_only && st.st_uid == ::getuid()) continue;
    out.push_back(Server{pid, st.st_uid, 0});
    queries.push_back(start_query(bin, "get_client_list " + std::to_string(pid) + "\n"));
  }
  bool late = false;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!queries[i]) continue;
    if (const auto clients = finish_query(*queries[i], until)) out[i].clients = count_pids(*clients);
    else late = late || Clock::now() >= until;
  }
  if (late) too_late("get_client_list", "its servers' clients are not counted");
  return out;
}

// Whether a daemon answers at the pipe directory and may be asked anything:
// not in a directory that fails pipe_dir_problem, which `warn` says in one
// line (a launch says nothing here: ensure_daemon refuses it, in one line).
bool may_ask_daemon(bool warn) {
  const std::string dir = pipe_directory();
  if (struct stat st {}; ::lstat(dir.c_str(), &st) != 0) return false;  // no directory, no daemon
  if (const std::string why = pipe_dir_problem(dir); !why.empty()) {
    if (warn) spdlog::warn("MPS servers not listed: {}", why);
    return false;
  }
  return daemon_running(dir);
}

std::vector<Server> list_servers(const Options& opts, bool other_users_only) {
  const auto until = Clock::now() + kConversationBudget;
  if (!may_ask_daemon(true)) return {};
  const auto bin = query_binary(opts);
  if (!bin) return {};
  auto q = start_query(*bin, "get_server_list\n");
  if (!q) return {};
  const auto list = finish_query(*q, until);
  if (!list) {
    if (Clock::now() >= until) too_late("get_server_list", "its servers are not listed");
    return {};
  }
  return servers_listed(*bin, *list, other_users_only, until);
}
}  // namespace

std::vector<Server> servers(const Options& opts) { return list_servers(opts, false); }

std::vector<Server> other_users_servers(const Options& opts) { return list_servers(opts, true); }

struct OtherUsersCheck::Impl {
  Options opts;
  std::optional<Binary> bin;
  std::optional<Query> query;
};

OtherUsersCheck::OtherUsersCheck(const Options& opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = opts;
  if (!may_ask_daemon(false)) return;
  impl_->bin = query_binary(opts);
  if (impl_->bin) impl_->query = start_query(*impl_->bin, "get_server_list\n");
}

OtherUsersCheck::~OtherUsersCheck() {
  if (impl_ && impl_->query) abandon_query(*impl_->query);
}

std::vector<Server> OtherUsersCheck::servers() {
  if (!impl_->query) return other_users_servers(impl_->opts);
  // The budget counts from here: the query ran while the caller planned.
  const auto until = Clock::now() + kConversationBudget;
  const auto list = finish_query(*impl_->query, until);
  impl_->query.reset();
  if (!list) {
    if (Clock::now() >= until) too_late("get_server_list", "its servers are not listed");
    return {};
  }
  return servers_listed(*impl_->bin, *list, true, until);
}

std::string started_message(const EnsureResult& r) {
  if (!r.started) return {};
  std::string bin =
      r.control_binary.empty() ? std::string(kDefaultControlBinary) : r.control_binary;
  std::string prefix;
  if (r.pipe_dir != kDefaultPipeDirectory)
    prefix = "CUDA_MPS_PIPE_DIRECTORY=" + shell_quote(r.pipe_dir) + " ";
  return fmt::format(
      "nvtaskset: started the MPS control daemon{} (pipe directory {}); stop it with: echo quit | "
      "{}{}",
      r.multi_user ? " for every user (-M)" : "", r.pipe_dir, prefix, shell_quote(bin));
}

}  // namespace nvtaskset::mps
