// SPDX-License-Identifier: Apache-2.0
// mps/: find or start the NVIDIA MPS control daemon so that partitioned tasks
// co-run instead of time-slicing (docs/hardware.md, "%smid and MPS").
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace nvtaskset::mps {

// One-line, user-facing message (no "nvtaskset:" prefix: the CLI adds it).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The control program's name as NVIDIA ships it.
inline constexpr const char* kDefaultControlBinary = "nvidia-cuda-mps-control";
inline constexpr const char* kDefaultPipeDirectory = "/tmp/nvidia-mps";
inline constexpr const char* kDefaultLogDirectory = "/var/log/nvidia-mps";

struct Options {
  // Program to run as the control daemon. Default: $NVTASKSET_MPS_CONTROL, else
  // "nvidia-cuda-mps-control" searched on $PATH. A value with a '/' is used as
  // a path; a bare name is searched on $PATH.
  std::string control_binary;
  // How long to wait, in all, for a started daemon to answer on its control
  // socket (this bounds the wait for the `-d` parent to exit, too).
  std::chrono::milliseconds start_timeout{5000};
  // The daemon must serve every user at once (`-M`, --mps-multi-user): one
  // is started with `-d -M` (root only), and a running one that serves one
  // user at a time is refused rather than shared.
  bool multi_user = false;
};

// How a control daemon serves Unix users (NVIDIA's MPS guide and
// nvidia-cuda-mps-control(1); the multi-user server mode is Volta and later).
enum class DaemonMode {
  kSingleUser,  // one user's clients at a time: another user's wait
  kMultiUser,   // every user's clients at once, each as root's client (started by root with -M)
};

// Who serves a pipe directory: the process listening on its control socket.
struct Daemon {
  pid_t pid = 0;
  uid_t uid = 0;
  DaemonMode mode = DaemonMode::kSingleUser;
};

// The daemon answering at <pipe_dir>/control and its mode. The kernel says
// which process listens there (SO_PEERCRED: its PID and user as of its
// listen()); MPS has no command that reports the mode, so it is read from
// that process's command line: multi-user iff it is root's
// nvidia-cuda-mps-control (/proc/<pid>/cmdline owned by root) and was given
// -M or --multiuser-server. A daemon of another user serves that user only.
// No file in the pipe directory is believed: every user may write there
// (docs/hardware.md "MPS"), so a PID file could name any process. Throws
// Error, one line, when nothing answers or the mode cannot be told.
Daemon running_daemon(const std::string& pipe_dir);

// Whether running_daemon(pipe_dir) serves every user; false also when that
// cannot be told (said at debug level): what a launch without
// --mps-multi-user and --status ask before saying that another user's
// clients wait.
bool serves_every_user(const std::string& pipe_dir);

// $CUDA_MPS_PIPE_DIRECTORY when set and non-empty, else /tmp/nvidia-mps.
std::string pipe_directory();
// $CUDA_MPS_LOG_DIRECTORY when set and non-empty (created if missing; the
// user's choice is kept even when it is not writable: the daemon then reports
// it), else /var/log/nvidia-mps, else (when that is not writable or cannot be
// created, e.g. as a non-root user) $XDG_RUNTIME_DIR/nvidia-mps-log, else
// /tmp/nvidia-mps-log-<uid> (mode 0700, must be a real directory owned by the
// user). The fallback result exists and is writable; throws Error otherwise.
std::string log_directory();

// True iff a SOCK_SEQPACKET unix socket connects to <pipe dir>/control.
bool daemon_running(const std::string& pipe_dir);

struct EnsureResult {
  bool started = false;  // false: a daemon was already running
  std::string pipe_dir;
  std::string log_dir;  // empty when a daemon was already running
  // How to invoke the control program that was started: the bare name when it
  // was found on $PATH, else the path. Empty when nothing was started.
  std::string control_binary;
  // The daemon in use serves every user: started with -M, or found so
  // (only asked for with Options::multi_user).
  bool multi_user = false;
};

// Makes sure a control daemon answers at pipe_directory(). Starts one with
// fork/exec of `<control_binary> -d` (never system()), `-d -M` with
// opts.multi_user (which refuses a running daemon that running_daemon()
// finds single-user, and a start by anyone but root), passing the pipe and
// log directories in its environment, and waits until it answers. The pipe
// directory is created if missing. Throws Error with a one-line message when
// the binary is missing, exits non-zero, or does not answer in time. When the
// start fails only because another process started a daemon at the same time,
// returns started=false.
EnsureResult ensure_daemon(const Options& opts = {});

// The line the CLI prints to stderr after starting a daemon, saying how to stop
// it (no trailing newline); empty when r.started is false.
std::string started_message(const EnsureResult& r);

// An MPS server the control daemon runs. One server serves one Unix user at
// a time: a client of another user waits until every client of this one has
// exited (measured on H200, docs/hardware.md "MPS").
struct Server {
  pid_t pid = 0;
  uid_t uid = 0;             // the user it serves (the owner of /proc/<pid>)
  unsigned clients = 0;      // its client processes now
};

// The servers of the daemon at pipe_directory(), from the control program's
// `get_server_list` and `get_client_list PID` (run as a client, at most a few
// seconds). Empty when no daemon answers or it runs no server.
std::vector<Server> servers(const Options& opts = {});

// Only the servers that serve another user, the ones a client of this user
// would wait for: what a launch checks. This user's own servers are not
// asked for their clients, which saves one run of the control program each
// (a few ms of every launch's start-up, docs/results.md Fig. 11a).
std::vector<Server> other_users_servers(const Options& opts = {});

// other_users_servers(), asked early and read late: the construction starts
// the control program's `get_server_list` when a daemon answers, and
// servers() reads its answer, so the program runs (0.7 ms over an exec on an
// H100 and an H200, bench/cli_overhead.py) while the caller plans the
// partition. The answer is as of the query's start. servers() waits at most
// a few seconds from its call, however long ago the query started, and asks
// anew when no daemon answered at the start. A query never read is killed
// and reaped by the destructor.
class OtherUsersCheck {
 public:
  explicit OtherUsersCheck(const Options& opts = {});
  ~OtherUsersCheck();
  OtherUsersCheck(const OtherUsersCheck&) = delete;
  OtherUsersCheck& operator=(const OtherUsersCheck&) = delete;
  std::vector<Server> servers();  // a second call asks anew

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {
// Where log_directory() looks, injectable so tests can make the system
// directory unwritable even when they run as root.
struct LogDirDefaults {
  std::string system_dir = kDefaultLogDirectory;
  std::string tmp_dir = "/tmp";
};
std::string log_directory(const LogDirDefaults& defaults);
}  // namespace detail

}  // namespace nvtaskset::mps
