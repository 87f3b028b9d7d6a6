// SPDX-License-Identifier: Apache-2.0
// `nvtaskset --verify` (verify.hpp): the checking side, which plans the
// partitions and judges where the blocks ran, and the probe process, which
// loads the shim and runs the kernel.
#include "nvtaskset/verify.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "nvtaskset/block_probe.hpp"
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/spawn.hpp"
#include "nvtaskset/cuda_driver.hpp"
#include "nvtaskset/devices.hpp"
#include "nvtaskset/driver_locate.hpp"
#include "nvtaskset/idlist.hpp"
#include "nvtaskset/log_level.hpp"

namespace nvtaskset::cli::verify {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// How long the probe waits for one kernel. A probe kernel takes milliseconds
// (2 x SM count blocks of 20 us, one per SM at a time); one that has not
// finished after this long never will: its mask enables no working TPC
// (docs/hardware.md).
constexpr auto kKernelTimeout = 5000ms;
// How long the checking side waits for the probe to start (driver, context,
// JIT), and for each answer (the kernel's own timeout plus slack).
constexpr auto kStartTimeout = 60s;
constexpr auto kAnswerTimeout = kKernelTimeout + 10s;
// Launches per partition while some of its TPCs have run no block yet. The
// first wave of one launch reaches every enabled SM (block_probe.hpp), so a
// second launch is rare; four make a miss a finding, not a fluke.
constexpr unsigned kMaxLaunches = 4;

std::string tpc_word(std::size_t n) { return n == 1 ? "TPC" : "TPCs"; }

// splitmix64: a seed gives the same lists with every compiler and library
// (std::uniform_int_distribution does not promise that).
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  unsigned below(unsigned n) { return static_cast<unsigned>(next() % n); }
};

// The partition the CLI would build for this request (cli.cpp,
// build_partition): the same translation, the same cluster limits.
Partition make_partition(const topo::Topology& t, SpecKind kind, const LogicalTpcSet& tpcs, const GpcSet& gpcs) {
  Partition p;
  p.kind = kind;
  p.tpcs = tpcs;
  p.gpcs = gpcs;
  p.enabled = topo::to_physical(t, tpcs);
  const topo::ClusterLimits c = topo::cluster_limits(t, p.tpcs);
  p.max_cluster = c.max_cluster;
  if (c.max_cluster != kClusterUnchecked) {
    p.widened = topo::to_physical(t, c.widened);
    p.widened_max_cluster = c.widened_max_cluster;
  }
  return p;
}

Planned tpc_partition(const topo::Topology& t, const LogicalTpcSet& tpcs) {
  return {"-t " + format_list(tpcs.bits), make_partition(t, SpecKind::kTpcList, tpcs, {})};
}

Planned gpc_partition(const topo::Topology& t, std::initializer_list<unsigned> ids) {
  GpcSet gpcs;
  for (unsigned g : ids) gpcs.insert(GpcId{g});
  return {"-g " + format_list(gpcs.bits), make_partition(t, SpecKind::kGpcList, topo::tpcs_of_gpcs(t, gpcs), gpcs)};
}

// ---- the probe process, seen from the checking side -------------------------------

// A child process with its stdin, stdout and stderr on pipes. Killed and
// reaped when destroyed, whatever state it is in.
class ProbeProcess {
 public:
  ProbeProcess(const std::string& exe, const std::vector<std::string>& args, const std::vector<std::string>& env) {
    std::vector<std::string> argv = args;
    argv.front() = exe;  // the program spawn() runs is argv[0]
    process::Pipe in, out, err;
    try {
      in = process::make_pipe();
      out = process::make_pipe();
      err = process::make_pipe();
    } catch (const process::SpawnError& e) {
      throw std::runtime_error(std::string("cannot create pipes for the probe process: ") + std::strerror(e.error()));
    }
    process::SpawnOptions so;
    so.in = process::Stream::fd(in.read.get());
    so.out = process::Stream::fd(out.write.get());
    so.err = process::Stream::fd(err.write.get());
    std::fflush(nullptr);
    try {
      pid_ = process::spawn(process::ExecArgs(std::move(argv), env), so);
    } catch (const process::SpawnError& e) {
      pid_ = -1;
      throw std::runtime_error("cannot start the probe process " + exe + ": " + std::strerror(e.error()));
    }
    // The child's ends close with `in`, `out` and `err`; ours stay.
    in_ = in.write.release();
    out_ = out.read.release();
    err_ = err.read.release();
    // Reads take what is there and never block: poll() says when to read.
    for (int fd : {out_, err_}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }

  ~ProbeProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    for (int fd : {in_, out_, err_})
      if (fd >= 0) ::close(fd);
  }

  ProbeProcess(const ProbeProcess&) = delete;
  ProbeProcess& operator=(const ProbeProcess&) = delete;

  pid_t pid() const { return pid_; }

  void send(std::string_view line) {
    std::string s(line);
    s += '\n';
    std::size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::write(in_, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) died();
      off += static_cast<std::size_t>(n);
    }
  }

  // The next line on the child's stdout; nullopt when none came by
  // `deadline`. Throws with one line when the child exits first.
  std::optional<std::string> read_line(Clock::time_point deadline) {
    for (;;) {
      if (const auto nl = out_buf_.find('\n'); nl != std::string::npos) {
        std::string line = out_buf_.substr(0, nl);
        out_buf_.erase(0, nl + 1);
        return line;
      }
      if (out_eof_) died();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
      const int n = ::poll(fds, err_ >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("poll failed: ") + std::strerror(errno));
      if (err_ >= 0 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) drain(err_, err_buf_);
      // At EOF, the lines it wrote before it went still count ("timeout").
      if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) && !drain(out_, out_buf_)) out_eof_ = true;
    }
  }

  // Asks the child to leave, and reaps it (killing it when it does not go).
  void finish() {
    if (pid_ <= 0 || reaped_) return;
    ::close(in_);  // EOF on its stdin: the probe leaves
    in_ = -1;
    const auto deadline = Clock::now() + 10s;
    int st = 0;
    while (::waitpid(pid_, &st, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        break;
      }
      if (err_ >= 0) drain(err_, err_buf_);
      std::this_thread::sleep_for(2ms);
    }
    reaped_ = true;
    if (err_ >= 0) drain(err_, err_buf_);
  }

  // What the child wrote on stderr (shim warnings, say).
  const std::string& stderr_text() const { return err_buf_; }

 private:
  // Reads what is there; false at EOF (or on an error, which ends it too).
  bool drain(int& fd, std::string& buf) {
    char chunk[4096];
    for (;;) {
      const ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n > 0) {
        buf.append(chunk, static_cast<std::size_t>(n));
        // A chatty probe (NVTASKSET_LOG=trace) must not grow without bound.
        if (&buf == &err_buf_ && buf.size() > (64u << 10)) buf.erase(0, buf.size() - (32u << 10));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (&fd == &err_) {
        ::close(err_);
        err_ = -1;
      }
      return false;
    }
  }

  // The child is gone (or going): reap it and say why, in one line.
  [[noreturn]] void died() {
    int st = 0;
    if (!reaped_) {
      // Its stdout closed; give it a moment to exit, then make sure.
      const auto deadline = Clock::now() + 5s;
      while (::waitpid(pid_, &st, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, &st, 0);
          break;
        }
        std::this_thread::sleep_for(2ms);
      }
      reaped_ = true;
    }
    if (err_ >= 0) drain(err_, err_buf_);
    std::string last;
    for (std::size_t end = err_buf_.size(); end > 0 && last.empty();) {
      const std::size_t nl = err_buf_.rfind('\n', end - 1);
      const std::size_t begin = nl == std::string::npos ? 0 : nl + 1;
      last = err_buf_.substr(begin, end - begin);
      while (!last.empty() && (last.back() == '\n' || last.back() == '\r')) last.pop_back();
      end = nl == std::string::npos ? 0 : nl;
    }
    if (last.starts_with("nvtaskset: ")) last.erase(0, std::strlen("nvtaskset: "));
    std::string how = WIFSIGNALED(st) ? fmt::format("was killed by signal {} ({})", WTERMSIG(st), strsignal(WTERMSIG(st)))
                                      : fmt::format("exited with status {}", WEXITSTATUS(st));
    throw std::runtime_error("the probe process " + how + (last.empty() ? "" : ": " + last));
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  bool reaped_ = false, out_eof_ = false;
  std::string out_buf_, err_buf_;
};

// The probe's environment: ours, with the first partition, the driver the
// device query used, and nothing preloaded (the probe loads the shim itself).
std::vector<std::string> probe_environment(const std::string& partitions, const std::string& driver) {
  std::vector<std::string> env = process::without_variables(
      process::current_environment(), {"LD_PRELOAD", kPartitionEnv, kPartitionPidEnv, kRealDriverEnv});
  env.push_back(std::string(kPartitionEnv) + "=" + partitions);
  if (!driver.empty()) env.push_back(std::string(kRealDriverEnv) + "=" + driver);
  return env;
}

// "blocks 12 13 - 40 ...": the SM of each block, "-" for one that never ran.
std::vector<std::optional<unsigned>> parse_blocks(const std::string& line, unsigned expected) {
  std::vector<std::optional<unsigned>> out;
  if (!line.starts_with("blocks")) throw std::runtime_error("the probe process answered '" + printable(line) + "'");
  std::size_t i = std::strlen("blocks");
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    if (i >= line.size()) break;
    if (line[i] == '-') {
      out.emplace_back();
      ++i;
      continue;
    }
    unsigned v = 0;
    std::size_t digits = 0;
    for (; i < line.size() && line[i] >= '0' && line[i] <= '9' && digits < 9; ++i, ++digits) v = v * 10 + (line[i] - '0');
    if (digits == 0 || (i < line.size() && line[i] != ' '))
      throw std::runtime_error("the probe process answered '" + printable(line) + "'");
    out.emplace_back(v);
  }
  if (out.size() != expected)
    throw std::runtime_error(fmt::format("the probe process reported {} blocks, not {}", out.size(), expected));
  return out;
}

// What the blocks of one partition did, over its launches.
struct Verdict {
  unsigned launches = 0;
  std::size_t blocks = 0;
  std::size_t outside = 0;    // blocks on SMs of TPCs outside the partition
  std::size_t never_ran = 0;  // blocks the kernel finished without running
  LogicalTpcSet outside_tpcs;
  LogicalTpcSet used;  // TPCs of the partition that ran a block
  std::uint64_t masked = 0;  // probe kernels the shim says it masked
  bool timed_out = false;
};

std::string describe(const Planned& p, const Verdict& v, bool* ok) {
  const LogicalTpcSet& tpcs = p.partition.tpcs;
  const std::string head = fmt::format("{}  ({} {})", p.label, tpcs.size(), tpc_word(tpcs.size()));
  *ok = false;
  if (v.timed_out)
    return fmt::format("FAIL {}: the kernel did not finish within {} s, so its mask enables no TPC that works "
                       "(the layout is wrong)",
                       head, std::chrono::duration_cast<std::chrono::seconds>(kKernelTimeout).count());
  if (v.masked != v.launches)
    return fmt::format("FAIL {}: the shim masked {} of {} probe kernels", head, v.masked, v.launches);
  if (v.outside > 0)
    return fmt::format("FAIL {}: {} of {} blocks on {} {} outside the partition", head, v.outside, v.blocks,
                       tpc_word(v.outside_tpcs.size()), format_list(v.outside_tpcs.bits));
  if (v.never_ran > 0) return fmt::format("FAIL {}: {} of {} blocks never ran", head, v.never_ran, v.blocks);
  if (v.used != tpcs) {
    const Bits128 unused = tpcs.bits & ~v.used.bits;
    return fmt::format("FAIL {}: all {} blocks inside, but {} {} of it never ran one in {} launches", head, v.blocks,
                       tpc_word(unused.count()), format_list(unused), v.launches);
  }
  *ok = true;
  return fmt::format("ok   {}: {} blocks, all inside", head, v.blocks);
}

// ---- the probe process itself -----------------------------------------------------------

void probe_logging() {
  // stdout carries the answers: log to stderr only.
  auto logger = spdlog::stderr_color_mt("nvtaskset");
  logger->set_pattern("nvtaskset: %^%l%$: %v");
  logger->set_level(static_cast<spdlog::level::level_enum>(log_setting(std::getenv(kLogLevelEnv)).level));
  spdlog::set_default_logger(logger);
}

}  // namespace

std::uint64_t parse_seed(std::string_view text) {
  std::uint64_t v = 0;
  if (text.empty() || text.size() > 20) throw std::runtime_error("--seed " + printable(text) + ": not a number from 0 to 2^64-1");
  for (char c : text) {
    if (c < '0' || c > '9' || v > (~std::uint64_t{0} - static_cast<unsigned>(c - '0')) / 10)
      throw std::runtime_error("--seed " + printable(text) + ": not a number from 0 to 2^64-1");
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  return v;
}

std::vector<Planned> plan(const topo::Topology& t, std::uint64_t seed) {
  const unsigned n = static_cast<unsigned>(t.tpcs.size());
  std::vector<unsigned> unknown;
  for (const auto& ti : t.tpcs)
    if (!ti.bit) unknown.push_back(ti.id.value);
  if (n == 0 || !unknown.empty())
    throw std::runtime_error(fmt::format("the layout of device {} does not give the mask bit of {} {}: nothing to "
                                         "verify against",
                                         t.device.ordinal, tpc_word(unknown.size()), format_list(unknown)));
  std::vector<Planned> out;
  out.push_back(tpc_partition(t, topo::all_tpcs(t)));
  LogicalTpcSet one;
  one.insert(LogicalTpcId{0});
  out.push_back(tpc_partition(t, one));
  if (n > 1) {
    LogicalTpcSet last;
    last.insert(LogicalTpcId{n - 1});
    out.push_back(tpc_partition(t, last));
  }
  Rng rng{seed};
  const unsigned g = static_cast<unsigned>(t.gpcs.size());
  for (unsigned i = 0; i < g; ++i) out.push_back(gpc_partition(t, {i}));
  if (g >= 2) out.push_back(gpc_partition(t, {0, g - 1}));
  if (g >= 3) {
    // A second pair, drawn: any but {0, g-1}.
    unsigned a = 0, b = g - 1;
    while ((a == 0 && b == g - 1) || a == b) {
      a = rng.below(g);
      b = rng.below(g);
      if (a > b) std::swap(a, b);
    }
    out.push_back(gpc_partition(t, {a, b}));
  }
  // Random lists: a size from 1 to n-1 (every TPC was the first check),
  // then that many distinct TPCs (a partial Fisher-Yates shuffle).
  for (unsigned i = 0; i < kRandomLists; ++i) {
    std::vector<unsigned> ids(n);
    for (unsigned k = 0; k < n; ++k) ids[k] = k;
    const unsigned size = n > 1 ? 1 + rng.below(n - 1) : 1;
    LogicalTpcSet s;
    for (unsigned k = 0; k < size; ++k) {
      std::swap(ids[k], ids[k + rng.below(n - k)]);
      s.insert(LogicalTpcId{ids[k]});
    }
    out.push_back(tpc_partition(t, s));
  }
  return out;
}

int run(const Options& o) {
  const auto t0 = Clock::now();
  if (o.shim_dir.empty())
    throw std::runtime_error("cannot find the shim libcuda.so.1 (looked in ../" NVTASKSET_SHIM_RELDIR
                             " next to nvtaskset; set NVTASKSET_SHIM_DIR)");
  std::uint64_t seed = 0;
  if (o.seed) {
    seed = parse_seed(*o.seed);
  } else {
    std::random_device rd;
    seed = rd();  // 32 bits: short enough to type back
  }
  const std::string shim = o.shim_dir + "/libcuda.so.1";
  Devices devices({shim}, o.topology_file);
  const topo::DeviceInfo& dev = devices.select(o.device);
  const topo::Topology& t = devices.topology(dev);
  const std::vector<Planned> partitions = plan(t, seed);
  const DeviceDesc desc{dev.sm_count, static_cast<std::uint32_t>(dev.cc_major),
                        static_cast<std::uint32_t>(dev.cc_minor), dev.driver_version};
  const std::string driver = devices.driver_path();
  devices.restore_environment();

  std::printf("device %u: %s %s, %zu TPCs, %zu GPCs, layout from %s\n", dev.ordinal, dev.name.c_str(),
              uuid_to_string(dev.uuid).c_str(), t.tpcs.size(), t.gpcs.size(),
              o.topology_file.empty() ? t.source.c_str() : ("file " + o.topology_file).c_str());
  std::printf("seed %llu (--seed %llu checks the same partitions)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);

  // A probe process that dies must not take us with it.
  ::signal(SIGPIPE, SIG_IGN);
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) exe = "/proc/self/exe";
  ProbeProcess probe(exe, {exe, kProbeArg, shim, uuid_to_string(dev.uuid)},
                     probe_environment(encode_partitions({{dev.uuid, partitions[0].partition, desc}}), driver));
  const auto ready = probe.read_line(Clock::now() + kStartTimeout);
  if (!ready)
    throw std::runtime_error(fmt::format("the probe process did not start within {} s", kStartTimeout.count()));
  if (!ready->starts_with("ready ")) throw std::runtime_error("the probe process answered '" + printable(*ready) + "'");
  const unsigned blocks = static_cast<unsigned>(std::strtoul(ready->c_str() + 6, nullptr, 10));
  const auto region = ctl::Region::attach(probe.pid());
  if (const std::string why = ctl::cannot_apply(region->header()); !why.empty())
    throw std::runtime_error("the shim cannot apply partitions in the probe process: " + why);

  unsigned failed = 0, checked = 0;
  bool stopped = false;
  for (std::size_t i = 0; i < partitions.size() && !stopped; ++i) {
    const Planned& p = partitions[i];
    // The first partition came in NVTASKSET_PARTITION, as for a launched
    // task; the others go the way of `nvtaskset -p`.
    if (i > 0) region->write({dev.uuid, p.partition, desc});
    Verdict v;
    const std::uint64_t masked_before = region->header().kernels_masked.load(std::memory_order_relaxed);
    while (v.launches < kMaxLaunches) {
      probe.send("run");
      const auto answer = probe.read_line(Clock::now() + kAnswerTimeout);
      if (!answer || *answer == "timeout") {
        v.timed_out = true;
        break;
      }
      ++v.launches;
      for (const std::optional<unsigned>& sm : parse_blocks(*answer, blocks)) {
        ++v.blocks;
        if (!sm) {
          ++v.never_ran;
          continue;
        }
        const LogicalTpcId tpc = tpc_of_sm(SmId{*sm});  // TPC k = SMs 2k, 2k+1 (docs/hardware.md)
        if (p.partition.tpcs.contains(tpc)) {
          v.used.insert(tpc);
        } else {
          ++v.outside;
          v.outside_tpcs.insert(tpc);  // an SM ID above 255 shows as no TPC, but still counts
        }
      }
      if (v.outside > 0 || v.never_ran > 0 || v.used == p.partition.tpcs) break;
    }
    v.masked = region->header().kernels_masked.load(std::memory_order_relaxed) - masked_before;
    bool ok = false;
    std::printf("%s\n", describe(p, v, &ok).c_str());
    std::fflush(stdout);
    ++checked;
    if (!ok) ++failed;
    // The probe is stuck behind a kernel that will never run: nothing more
    // can be checked in it.
    if (v.timed_out) stopped = true;
  }
  if (!stopped) probe.finish();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!probe.stderr_text().empty()) std::fputs(probe.stderr_text().c_str(), stderr);
  if (failed == 0) {
    std::printf("PASS: all %u partitions ran every block inside their TPCs (seed %llu, %.1f s)\n", checked,
                static_cast<unsigned long long>(seed), secs);
    return 0;
  }
  std::printf("FAIL: %u of %zu partitions failed%s (seed %llu, %.1f s)\n", failed, partitions.size(),
              stopped ? fmt::format(", {} not checked after a kernel that never finished", partitions.size() - checked)
                            .c_str()
                      : "",
              static_cast<unsigned long long>(seed), secs);
  return 2;
}

int probe_main(int argc, char** argv) {
  // Dies with the checking side, even when stuck behind a kernel.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  probe_logging();
  try {
    if (argc != 4) throw std::runtime_error(std::string("internal: ") + kProbeArg + " takes SHIM UUID");
    const auto uuid = uuid_from_string(argv[3]);
    if (!uuid) throw std::runtime_error(std::string("internal: not a GPU UUID: ") + argv[3]);
    // The shim takes NVTASKSET_PARTITION from the environment of the process
    // it names (shim.cpp, partition_set_by_cli), as in a launched task.
    ::setenv(kPartitionPidEnv, std::to_string(::getpid()).c_str(), 1);
    void* shim = ::dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!shim) throw std::runtime_error(std::string("cannot load the shim: ") + ::dlerror());
    // Every driver call goes through the shim's trampolines; the shim loads
    // the real driver ($NVTASKSET_REAL_LIBCUDA, set by the checking side).
    topo::DriverOptions dopt;
    dopt.resolver = [shim](const char* name) { return ::dlsym(shim, name); };
    dopt.library_path = argv[2];
    topo::CudaDriver drv(dopt);  // outside MPS: %smid is the real SM ID
    std::optional<topo::DeviceInfo> dev;
    for (const auto& d : drv.query_devices())
      if (d.uuid == *uuid) dev = d;
    if (!dev) throw std::runtime_error(std::string(argv[3]) + " is not visible to the probe process");
    topo::BlockProbe probe(drv, *dev, std::chrono::duration_cast<std::chrono::milliseconds>(kKernelTimeout));
    std::printf("ready %u\n", probe.blocks());
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof line, stdin)) {
      if (std::strcmp(line, "run\n") != 0) break;  // "quit", or anything else
      std::vector<std::optional<SmId>> sms;
      try {
        sms = probe.run();
      } catch (const std::exception& e) {
        if (!drv.wedged()) throw;
        // A kernel that never ran: tearing down would block on it. Only
        // the private MPS pipe directory is removed (no GPU call), before
        // the answer: the checking side kills this process once it has it.
        drv.restore_environment();
        std::printf("timeout\n");
        std::fflush(stdout);
        ::_exit(3);
      }
      std::string out = "blocks";
      for (const auto& sm : sms) out += sm ? " " + std::to_string(sm->value) : std::string(" -");
      std::printf("%s\n", out.c_str());
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvtaskset: %s\n", e.what());
    return 1;
  }
}

}  // namespace nvtaskset::cli::verify
