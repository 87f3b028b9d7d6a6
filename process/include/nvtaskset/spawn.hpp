// SPDX-License-Identifier: Apache-2.0
// Starting child processes: the one way the CLI, topology/ and mps/ start a
// program. The argument and environment vectors are built here, the child's
// standard streams are wired here, and a failure names the step that failed
// with its errno.
//
// Host side only: the shim, which is loaded into tasks, starts no process and
// does not link this library (process/CMakeLists.txt).
//
// Descriptors: everything this library opens is close-on-exec. A child gets
// its standard streams by dup2() onto 0-2 (which clears close-on-exec there
// only), and, unless `close_other_fds`, every descriptor of ours that is not
// close-on-exec, as execve(2) hands them on.
#pragma once

#include <sys/types.h>

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nvtaskset::process {

// A descriptor, closed when this goes; -1 means none.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

// A pipe, both ends close-on-exec. Throws SpawnError (step "pipe").
struct Pipe {
  UniqueFd read, write;
};
Pipe make_pipe();

// This process's environment, as NAME=VALUE strings.
std::vector<std::string> current_environment();

// `env` without the variables named in `names` (exact names, no '=').
std::vector<std::string> without_variables(std::vector<std::string> env, std::initializer_list<std::string_view> names);

// argv and envp as execve(2) takes them: null-terminated arrays pointing into
// strings this object owns (so neither copyable nor movable).
class ExecArgs {
 public:
  // The child gets `env`.
  ExecArgs(std::vector<std::string> argv, std::vector<std::string> env);
  // The child gets this process's environment as it is when it starts.
  explicit ExecArgs(std::vector<std::string> argv);
  ExecArgs(const ExecArgs&) = delete;
  ExecArgs& operator=(const ExecArgs&) = delete;

  char* const* argv() const noexcept { return argv_ptrs_.data(); }
  char* const* envp() const noexcept;
  const std::string& program() const noexcept { return argv_.front(); }

 private:
  std::vector<std::string> argv_, env_;
  std::vector<char*> argv_ptrs_, env_ptrs_;
  bool own_env_ = false;
};

// What one of the child's standard streams is.
class Stream {
 public:
  static Stream inherit() noexcept { return Stream(kInherit, -1); }  // this process's
  static Stream null() noexcept { return Stream(kNull, -1); }        // /dev/null, read-write
  static Stream fd(int fd) noexcept { return Stream(kFd, fd); }      // a descriptor of ours, dup2'd

  enum Kind { kInherit, kNull, kFd };
  Kind kind() const noexcept { return kind_; }
  int source() const noexcept { return fd_; }

 private:
  Stream(Kind k, int fd) noexcept : kind_(k), fd_(fd) {}
  Kind kind_;
  int fd_;
};

struct SpawnOptions {
  Stream in = Stream::inherit(), out = Stream::inherit(), err = Stream::inherit();
  // Look the program up in $PATH as execvp(3) does (a name without '/').
  bool search_path = false;
  // Close every descriptor above 2 in the child, not only the close-on-exec
  // ones: for a long-lived daemon, which must not keep a pipe or a lock of
  // the caller's open. Forks (posix_spawn cannot close a range without
  // glibc 2.34's posix_spawn_file_actions_addclosefrom_np, newer than some
  // machines the CLI is copied to); only async-signal-safe calls run between
  // fork and exec, since the caller may have threads.
  bool close_other_fds = false;
  // Default dispositions for every signal and an empty signal mask: ignored
  // signals and a blocked mask survive execve(2), and a long-lived child
  // should not inherit the caller's.
  bool reset_signals = false;
};

// A child that could not be started: the step that failed ("exec" when the
// program itself could not be executed; "fork", "pipe", "dup2", "/dev/null")
// and its errno. what() is "<step>: <strerror>".
class SpawnError : public std::runtime_error {
 public:
  SpawnError(std::string step, int error);
  const std::string& step() const noexcept { return step_; }
  int error() const noexcept { return error_; }

 private:
  std::string step_;
  int error_;
};

// Starts `args` with `opts`; returns its PID (the caller reaps it). Without
// `close_other_fds` it is posix_spawn(3), which does not copy the caller
// (this runs on every launch's path, docs/results.md). Throws SpawnError; an
// exec failure (a missing program: ENOENT) is reported here, not as an exit
// status of the child.
pid_t spawn(const ExecArgs& args, const SpawnOptions& opts = {});

// Replaces this process with `args` (execve, or execvpe with `search_path`).
// Returns only on failure, with its errno.
int exec(const ExecArgs& args, bool search_path);

// Waits for `pid`, retrying on EINTR: its wait status, or -1 with errno set
// when it cannot be waited for (ECHILD: not ours, or reaped elsewhere).
int wait_for(pid_t pid) noexcept;

// SIGKILL, then waits for it: for a child that must not outlive its caller.
void kill_and_reap(pid_t pid) noexcept;

// "exited with status 1", "was killed by signal 9 (Killed)".
std::string describe_status(int status);

}  // namespace nvtaskset::process
