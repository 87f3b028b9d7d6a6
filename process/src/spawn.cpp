// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/spawn.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

extern char** environ;

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

namespace nvtaskset::process {

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

SpawnError::SpawnError(std::string step, int error)
    : std::runtime_error(step + ": " + std::strerror(error)), step_(std::move(step)), error_(error) {}

Pipe make_pipe() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw SpawnError("pipe", errno);
  return Pipe{UniqueFd(p[0]), UniqueFd(p[1])};
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

std::vector<std::string> without_variables(std::vector<std::string> env,
                                           std::initializer_list<std::string_view> names) {
  std::erase_if(env, [&](const std::string& kv) {
    for (std::string_view n : names)
      if (kv.size() > n.size() && kv[n.size()] == '=' && std::string_view(kv).starts_with(n)) return true;
    return false;
  });
  return env;
}

ExecArgs::ExecArgs(std::vector<std::string> argv, std::vector<std::string> env)
    : argv_(std::move(argv)), env_(std::move(env)), own_env_(true) {
  if (argv_.empty()) throw std::invalid_argument("ExecArgs: no program");
  for (auto& a : argv_) argv_ptrs_.push_back(a.data());
  argv_ptrs_.push_back(nullptr);
  for (auto& e : env_) env_ptrs_.push_back(e.data());
  env_ptrs_.push_back(nullptr);
}

ExecArgs::ExecArgs(std::vector<std::string> argv) : argv_(std::move(argv)) {
  if (argv_.empty()) throw std::invalid_argument("ExecArgs: no program");
  for (auto& a : argv_) argv_ptrs_.push_back(a.data());
  argv_ptrs_.push_back(nullptr);
}

char* const* ExecArgs::envp() const noexcept { return own_env_ ? env_ptrs_.data() : environ; }

namespace {

// The descriptors the child's streams come from, each above 2: a source that
// is itself 0, 1 or 2 could be overwritten by an earlier dup2 onto it (or be
// its own target, where dup2 does nothing and leaves close-on-exec set), so
// it is duplicated first (close-on-exec; closed when this goes).
struct Sources {
  std::array<int, 3> fd{-1, -1, -1};  // -1: inherit
  UniqueFd devnull;
  std::array<UniqueFd, 3> dups;

  explicit Sources(const SpawnOptions& o) {
    const Stream* streams[3] = {&o.in, &o.out, &o.err};
    for (int i = 0; i < 3; ++i) {
      int src = -1;
      switch (streams[i]->kind()) {
        case Stream::kInherit:
          continue;
        case Stream::kNull:
          if (!devnull) {
            devnull.reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
            if (!devnull) throw SpawnError("/dev/null", errno);
          }
          src = devnull.get();
          break;
        case Stream::kFd:
          src = streams[i]->source();
          break;
      }
      if (src >= 0 && src <= 2) {
        dups[i].reset(::fcntl(src, F_DUPFD_CLOEXEC, 3));
        if (!dups[i]) throw SpawnError("dup", errno);
        src = dups[i].get();
      }
      fd[i] = src;
    }
  }
};

// The steps the forked child reports over its error pipe.
enum ChildStep : int { kStepDup2 = 1, kStepExec = 2 };
struct ChildError {
  int step;
  int error;
};

[[noreturn]] void child_fail(int pipe_fd, int step) noexcept {
  const ChildError e{step, errno};
  (void)!::write(pipe_fd, &e, sizeof e);
  ::_exit(127);
}

pid_t fork_exec(const ExecArgs& args, const SpawnOptions& opts, const Sources& src) {
  Pipe err = make_pipe();
  // The error pipe's write end above the streams' targets, so the dup2 onto
  // 0-2 cannot replace it.
  if (err.write.get() <= 2) {
    UniqueFd hi(::fcntl(err.write.get(), F_DUPFD_CLOEXEC, 3));
    if (!hi) throw SpawnError("dup", errno);
    err.write = std::move(hi);
  }
  struct rlimit rl {};
  long max_fd = (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                    ? static_cast<long>(rl.rlim_cur)
                    : 65536;
  max_fd = std::min(max_fd, 65536L);
  const int keep = err.write.get();
  char* const* argv = args.argv();
  char* const* envp = args.envp();

  const pid_t pid = ::fork();
  if (pid < 0) throw SpawnError("fork", errno);
  if (pid == 0) {
    if (opts.reset_signals) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int s = 1; s < NSIG; ++s)
        if (s != SIGKILL && s != SIGSTOP) ::sigaction(s, &dfl, nullptr);
    }
    for (int i = 0; i < 3; ++i)
      if (src.fd[i] >= 0 && ::dup2(src.fd[i], i) < 0) child_fail(keep, kStepDup2);
    if (opts.close_other_fds) {
      // Everything above stdio but the error pipe (close-on-exec itself).
      auto close_from_to = [&](unsigned lo, unsigned hi) {
        if (lo > hi) return;
        if (::syscall(SYS_close_range, lo, hi, 0) != 0)
          for (long fd = lo; fd <= std::min<long>(hi, max_fd); ++fd) ::close(static_cast<int>(fd));
      };
      close_from_to(3, static_cast<unsigned>(keep) - 1);
      close_from_to(static_cast<unsigned>(keep) + 1, ~0U);
    }
    if (opts.search_path) ::execvpe(argv[0], argv, envp);
    else ::execve(argv[0], argv, envp);
    child_fail(keep, kStepExec);
  }

  // The pipe reads EOF at exec, or what failed. The child makes a few system
  // calls before its exec, so this read returns at once.
  err.write.reset();
  ChildError e{};
  ssize_t n;
  do {
    n = ::read(err.read.get(), &e, sizeof e);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof e)) {
    wait_for(pid);
    throw SpawnError(e.step == kStepExec ? "exec" : "dup2", e.error);
  }
  return pid;
}

pid_t posix_spawn_exec(const ExecArgs& args, const SpawnOptions& opts, const Sources& src) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  for (int i = 0; i < 3; ++i)
    if (src.fd[i] >= 0) posix_spawn_file_actions_adddup2(&fa, src.fd[i], i);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  if (opts.reset_signals) {
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  }
  pid_t pid = -1;
  // glibc's posix_spawn reports the child's exec failure as its result.
  const int rc = opts.search_path
                     ? ::posix_spawnp(&pid, args.program().c_str(), &fa, &at, args.argv(), args.envp())
                     : ::posix_spawn(&pid, args.program().c_str(), &fa, &at, args.argv(), args.envp());
  posix_spawnattr_destroy(&at);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw SpawnError("exec", rc);
  return pid;
}

}  // namespace

pid_t spawn(const ExecArgs& args, const SpawnOptions& opts) {
  const Sources src(opts);
  return opts.close_other_fds ? fork_exec(args, opts, src) : posix_spawn_exec(args, opts, src);
}

int exec(const ExecArgs& args, bool search_path) {
  if (search_path) ::execvpe(args.argv()[0], args.argv(), args.envp());
  else ::execve(args.argv()[0], args.argv(), args.envp());
  return errno;
}

int wait_for(pid_t pid) noexcept {
  int st = 0;
  for (;;) {
    if (::waitpid(pid, &st, 0) == pid) return st;
    if (errno != EINTR) return -1;
  }
}

void kill_and_reap(pid_t pid) noexcept {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  wait_for(pid);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#x", static_cast<unsigned>(status));
  return std::string("ended with wait status ") + buf;
}

}  // namespace nvtaskset::process
