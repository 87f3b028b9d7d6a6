// SPDX-License-Identifier: Apache-2.0
// A stand-in for NVIDIA's `nvidia-cuda-mps-control` (docs/hardware.md, "%smid and MPS"),
// for tests on machines without a GPU or the MPS tools.
//
//   nvidia-cuda-mps-control -d   daemonize: fork, setsid; the parent exits 0
//                                once the child listens on a SOCK_SEQPACKET
//                                unix socket at $CUDA_MPS_PIPE_DIRECTORY/control
//   nvidia-cuda-mps-control -f   the same daemon, in the foreground
//   ... -d -M (--multiuser-server)  the daemon in multi-user server mode:
//                                as far as a client can tell, only its command
//                                line differs (/proc/<pid>/cmdline keeps -M,
//                                which is how nvtaskset tells the mode); the
//                                control log says so. NVIDIA's MPS guide
//                                (docs.nvidia.com/deploy/mps, multi-user
//                                server mode, Volta and later): started by
//                                root, one server serves the clients of every
//                                user as root's clients, so none waits for
//                                another user's; clients here never connect
//                                (the stand-in driver knows no MPS), so
//                                nothing else changes
//   nvidia-cuda-mps-control      client: sends each stdin line to the daemon
//                                and prints the replies (`echo quit | ...`)
//
// Daemon commands: quit (remove the socket and exit), get_server_list and
// get_client_list PID (the servers FAKE_MPS_SERVERS names; none by default). Each command is logged to
// $CUDA_MPS_LOG_DIRECTORY/control.log, as the real daemon does, so tests can
// see which log directory it was given. The pid goes to
// <pipe dir>/nvidia-cuda-mps-control.pid so a test can kill a daemon it lost.
//
// Knobs (environment):
//   FAKE_MPS_FAIL=1      -d prints an error and exits 3 without starting
//   FAKE_MPS_SILENT=1    -d exits 0 but never creates the socket
//   FAKE_MPS_IDLE_MS=N   exit after N ms without any connection or command;
//                        capped, like the default, at 60 s so that no test
//                        leaves a daemon running for long
//   FAKE_MPS_SERVERS=PID:N,...  servers get_server_list reports, N clients each
//   FAKE_MPS_FD_REPORT=F at startup, write the open fd numbers (e.g. "0 1 2")
//                        to file F: tests check that no stray fd was inherited
//   FAKE_MPS_CLIENT_LIST_DELAY_MS=N  answer each get_client_list N ms late
//                        (at most 10 s), from a child process, so the daemon
//                        keeps answering others meanwhile: a slow or hostile
//                        daemon, which must not delay a launch per server
//
// Wire format (fake only): one command per message; a reply is one message,
// its first byte '0' (ok) or '1' (error), then the text to print.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr long kMaxIdleMs = 60'000;

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

std::string env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : dflt;
}

std::string pipe_dir() { return env_or("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"); }
std::string log_dir() { return env_or("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"); }
std::string socket_path() { return pipe_dir() + "/control"; }
std::string pid_path() { return pipe_dir() + "/nvidia-cuda-mps-control.pid"; }

void report_fds() {
  const char* out = std::getenv("FAKE_MPS_FD_REPORT");
  if (out == nullptr || *out == '\0') return;
  std::string list;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  const int self = ::dirfd(d);
  std::vector<int> fds;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    int fd = std::atoi(e->d_name);
    if (fd != self) fds.push_back(fd);
  }
  ::closedir(d);
  std::sort(fds.begin(), fds.end());
  for (int fd : fds) list += (list.empty() ? "" : " ") + std::to_string(fd);
  if (FILE* f = std::fopen(out, "we")) {
    std::fprintf(f, "%s\n", list.c_str());
    std::fclose(f);
  }
}

bool fill_addr(sockaddr_un* a, const std::string& path) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  if (path.size() >= sizeof(a->sun_path)) return false;
  std::memcpy(a->sun_path, path.c_str(), path.size() + 1);
  return true;
}

int connect_control() {
  sockaddr_un a{};
  if (!fill_addr(&a, socket_path())) return -1;
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

class Log {
 public:
  Log() {
    std::string p = log_dir() + "/control.log";
    f_ = std::fopen(p.c_str(), "ae");
  }
  ~Log() {
    if (f_) std::fclose(f_);
  }
  void line(const std::string& s) {
    if (!f_) return;
    std::time_t t = std::time(nullptr);
    char ts[32];
    std::strftime(ts, sizeof(ts), "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    std::fprintf(f_, "[%s] %s\n", ts, s.c_str());
    std::fflush(f_);
  }

 private:
  FILE* f_ = nullptr;
};

// Removes the socket only if it is still the one this daemon bound (a test
// may have replaced the directory meanwhile).
struct Bound {
  dev_t dev = 0;
  ino_t ino = 0;
  void remove() const {
    struct stat st {};
    if (::lstat(socket_path().c_str(), &st) == 0 && st.st_dev == dev && st.st_ino == ino)
      ::unlink(socket_path().c_str());
    ::unlink(pid_path().c_str());
  }
};

long idle_limit_ms() {
  long ms = kMaxIdleMs;
  if (const char* v = std::getenv("FAKE_MPS_IDLE_MS"); v && *v) ms = std::strtol(v, nullptr, 10);
  if (ms <= 0 || ms > kMaxIdleMs) ms = kMaxIdleMs;
  return ms;
}

std::vector<std::pair<long, long>> fake_servers();

void reply(int fd, char status, const std::string& text) {
  std::string msg = std::string(1, status) + text;
  ::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL);
}

// Serves until quit or idle; returns the exit status.
int serve(int listener, const Bound& bound, Log& log) {
  ::signal(SIGCHLD, SIG_IGN);  // delayed repliers (FAKE_MPS_CLIENT_LIST_DELAY_MS) reap themselves
  std::vector<pollfd> fds{{listener, POLLIN, 0}};
  const long idle = idle_limit_ms();
  for (;;) {
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(idle));
    if (n < 0) {
      if (errno == EINTR) continue;
      log.line(std::string("poll: ") + std::strerror(errno));
      bound.remove();
      return 1;
    }
    if (n == 0) {
      log.line("idle for " + std::to_string(idle) + " ms, exiting");
      bound.remove();
      return 0;
    }
    if (fds[0].revents & POLLIN) {
      int c = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) fds.push_back({c, POLLIN, 0});
    }
    for (size_t i = 1; i < fds.size();) {
      if (fds[i].revents == 0) {
        ++i;
        continue;
      }
      char buf[1024];
      ssize_t r = ::recv(fds[i].fd, buf, sizeof(buf), 0);
      if (r <= 0) {
        ::close(fds[i].fd);
        fds.erase(fds.begin() + static_cast<long>(i));
        continue;
      }
      std::string cmd(buf, static_cast<size_t>(r));
      while (!cmd.empty() && (cmd.back() == '\n' || cmd.back() == '\r' || cmd.back() == ' '))
        cmd.pop_back();
      log.line("command: " + cmd);
      if (cmd == "quit") {
        // The socket goes first, so that once the client sees us gone, a new
        // daemon can start at once.
        bound.remove();
        log.line("exiting");
        return 0;  // exit closes every client: the client's recv() sees EOF
      }
      if (cmd == "get_server_list") {
        std::string list;
        for (const auto& [pid, clients] : fake_servers()) list += std::to_string(pid) + "\n";
        reply(fds[i].fd, '0', list);
      } else if (cmd.rfind("get_client_list ", 0) == 0) {
        const long want = std::atol(cmd.c_str() + std::strlen("get_client_list "));
        std::string list;
        for (const auto& [pid, clients] : fake_servers())
          if (pid == want)
            for (long c = 0; c < clients; ++c) list += std::to_string(900000 + c) + "\n";
        const long delay = std::min(10'000L, std::atol(env_or("FAKE_MPS_CLIENT_LIST_DELAY_MS", "0").c_str()));
        if (delay > 0 && ::fork() == 0) {
          ::usleep(static_cast<useconds_t>(delay) * 1000);
          reply(fds[i].fd, '0', list);
          ::_exit(0);
        }
        if (delay <= 0) reply(fds[i].fd, '0', list);
      } else
        reply(fds[i].fd, '1', "Unknown command: " + cmd + "\n");
      ++i;
    }
  }
}

// FAKE_MPS_SERVERS="PID:CLIENTS,...": the servers get_server_list reports
// (tests point PID at a process of the user the server would serve).
std::vector<std::pair<long, long>> fake_servers() {
  std::vector<std::pair<long, long>> out;
  const char* v = std::getenv("FAKE_MPS_SERVERS");
  if (v == nullptr) return out;
  std::string s = v;
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    const auto colon = item.find(':');
    if (colon != std::string::npos) out.emplace_back(std::atol(item.c_str()), std::atol(item.c_str() + colon + 1));
    pos = end + 1;
  }
  return out;
}

int run_daemon(bool foreground, bool multi_user) {
  if (env_is("FAKE_MPS_FAIL", "1")) {
    std::fprintf(stderr, "fake nvidia-cuda-mps-control: failing on purpose (FAKE_MPS_FAIL=1)\n");
    return 3;
  }
  if (env_is("FAKE_MPS_SILENT", "1")) return 0;

  if (int s = connect_control(); s >= 0) {
    ::close(s);
    std::fprintf(stderr, "An instance of this daemon is already running\n");
    return 1;
  }
  ::mkdir(pipe_dir().c_str(), 0755);
  sockaddr_un addr{};
  if (!fill_addr(&addr, socket_path())) {
    std::fprintf(stderr, "fake nvidia-cuda-mps-control: socket path too long\n");
    return 1;
  }

  int ready[2] = {-1, -1};
  if (!foreground) {
    if (::pipe2(ready, O_CLOEXEC) != 0) return 1;
    pid_t pid = ::fork();
    if (pid < 0) return 1;
    if (pid > 0) {
      // Parent: exit 0 only once the daemon listens, like the real `-d`.
      ::close(ready[1]);
      pollfd p{ready[0], POLLIN, 0};
      char c = 0;
      if (::poll(&p, 1, 10'000) == 1 && ::read(ready[0], &c, 1) == 1 && c == 'R') return 0;
      std::fprintf(stderr, "fake nvidia-cuda-mps-control: daemon failed to start\n");
      return 1;
    }
    ::close(ready[0]);
    ::setsid();
  }

  Log log;
  int listener = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (listener < 0) {
    std::perror("fake nvidia-cuda-mps-control: socket");
    return 1;
  }
  ::unlink(addr.sun_path);  // stale socket: connect above was refused
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 16) != 0) {
    std::perror("fake nvidia-cuda-mps-control: bind");
    return 1;
  }
  // Every user's clients reach it: the real daemon leaves `control`
  // srw-rw-rw- (measured, docs/hardware.md "MPS").
  ::chmod(addr.sun_path, 0666);
  Bound bound;
  struct stat st {};
  if (::lstat(addr.sun_path, &st) == 0) {
    bound.dev = st.st_dev;
    bound.ino = st.st_ino;
  }
  if (FILE* f = std::fopen(pid_path().c_str(), "we")) {
    std::fprintf(f, "%d\n", static_cast<int>(::getpid()));
    std::fclose(f);
  }
  log.line("started, pid " + std::to_string(::getpid()) + ", pipe directory " + pipe_dir() +
           ", log directory " + log_dir() + (multi_user ? ", multi-user server mode" : ""));

  if (!foreground) {
    // Detach from the starter's stdio: it may be a pipe someone reads to EOF.
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::close(null);
    }
    char r = 'R';
    (void)!::write(ready[1], &r, 1);
    ::close(ready[1]);
  }
  ::signal(SIGPIPE, SIG_IGN);
  return serve(listener, bound, log);
}

int run_client() {
  int s = connect_control();
  if (s < 0) {
    std::fprintf(stderr, "Cannot find MPS control daemon process\n");
    return 1;
  }
  // Bounded: a wedged daemon must not hang the test that talks to it.
  timeval tv{5, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int rc = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    if (::send(s, line.data(), line.size(), MSG_NOSIGNAL) < 0) {
      std::perror("send");
      rc = 1;
      break;
    }
    char buf[4096];
    ssize_t n = ::recv(s, buf, sizeof(buf), 0);
    if (line == "quit") {
      // The daemon answers quit by exiting: wait for EOF.
      if (n != 0) {
        std::fprintf(stderr, "daemon did not quit\n");
        rc = 1;
      }
      break;
    }
    if (n <= 0) {
      std::fprintf(stderr, "no reply from the MPS control daemon\n");
      rc = 1;
      break;
    }
    std::fwrite(buf + 1, 1, static_cast<size_t>(n - 1), stdout);
    if (buf[0] != '0') rc = 1;
  }
  ::close(s);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  report_fds();
  bool daemon = false, foreground = false, multi_user = false, bad = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-d") daemon = true;
    else if (a == "-f") foreground = true;
    else if (a == "-M" || a == "--multiuser-server") multi_user = true;
    else bad = true;
  }
  if (!bad && !daemon && !foreground && !multi_user) return run_client();
  if (!bad && daemon != foreground) return run_daemon(foreground, multi_user);
  std::fprintf(stderr, "usage: %s [-d | -f] [-M]\n", argv[0]);
  return 2;
}
