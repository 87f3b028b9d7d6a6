// SPDX-License-Identifier: Apache-2.0
// What the benchmark drivers (bench_startup, bench_persistent) share: the
// clock they stamp with, the stop flag their signal handler sets, and how
// they run one child under a time limit.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

extern char** environ;

namespace bench {

// Set by on_signal (SIGINT, SIGTERM): run_capture kills its child, and the
// drivers stop starting new runs.
inline volatile sig_atomic_t g_stop = 0;
inline void on_signal(int) { g_stop = 1; }

inline std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Spawns argv in its own process group with stdout on a pipe and stderr
// appended to log_fd; returns what it printed on stdout and its exit status.
// Never waits for end-of-file (a daemon the child started may hold the pipe):
// it reads until the child has exited. Kills the group after timeout_s.
// spawn_ns (may be null) receives the stamp taken just before the spawn.
inline int run_capture(const std::vector<std::string>& argv, int log_fd, double timeout_s, std::string* out,
                       std::uint64_t* spawn_ns = nullptr, const std::string& stdin_text = "",
                       bool stdout_to_log = false) {
  int fds[2], in_fds[2] = {-1, -1};
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  if (!stdin_text.empty() && pipe2(in_fds, O_CLOEXEC) != 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, stdout_to_log ? log_fd : fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
  if (in_fds[0] >= 0) posix_spawn_file_actions_adddup2(&fa, in_fds[0], 0);
  else posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  if (spawn_ns != nullptr) *spawn_ns = mono_ns();
  const int err = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (in_fds[0] >= 0) close(in_fds[0]);
  if (err != 0) {
    close(fds[0]);
    if (in_fds[1] >= 0) close(in_fds[1]);
    return -1;
  }
  if (in_fds[1] >= 0) {
    // A few bytes: fits the pipe buffer, never blocks.
    const ssize_t w = write(in_fds[1], stdin_text.data(), stdin_text.size());
    (void)w;
    close(in_fds[1]);
  }
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  const std::uint64_t deadline = mono_ns() + static_cast<std::uint64_t>(timeout_s * 1e9);
  int status = 0;
  bool exited = false, killed = false;
  char buf[4096];
  while (!exited) {
    pollfd p{fds[0], POLLIN, 0};
    poll(&p, 1, 20);
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out->append(buf, static_cast<size_t>(n));
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) exited = true;
    else if (!killed && (mono_ns() > deadline || g_stop)) {
      killpg(pid, SIGKILL);
      killed = true;
    }
  }
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out->append(buf, static_cast<size_t>(n));
  close(fds[0]);
  if (killed) return 124;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace bench
