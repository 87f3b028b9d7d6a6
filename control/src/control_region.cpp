// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/control_region.hpp"
#include "nvtaskset/proc.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <sys/mman.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string_view>
#include <sstream>
#include <thread>

namespace nvtaskset::ctl {

static_assert(std::is_standard_layout_v<Header>, "Header is shared between processes");
static_assert(sizeof(Header) < 4096, "the control region should fit one page");

struct Region::Impl {
  int fd = -1;
  void* map = nullptr;
  bool locked = false;  // this object holds the writer lock
  ~Impl() {
    if (locked) ::flock(fd, LOCK_UN);
    if (map != nullptr) ::munmap(map, sizeof(Header));
    if (fd >= 0) ::close(fd);
  }
  int get_fd() const { return fd; }
};

// The seals every region carries: its size can never change.
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW;

namespace {

std::string pid_str(pid_t pid) { return "pid " + std::to_string(pid); }

// Writers serialise with flock(), which the kernel releases if the holder
// dies, so a killed `nvtaskset -p` can never wedge later writers. A live
// holder can (the task's own user may flock its region and sleep), so every
// wait is bounded (Region::lock).

// At most this many lines of /proc/locks are read: one per lock on the
// machine, which any process can inflate.
constexpr int kMaxLockLines = 100000;

// Who holds a flock on the file of `fd`: "pid 42 (user alice)", or "" when
// /proc/locks does not say (another PID namespace, or it went meanwhile).
std::string lock_holder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "";
  char want[64];
  std::snprintf(want, sizeof want, "%02x:%02x:%llu", ::major(st.st_dev), ::minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream f("/proc/locks");
  std::string line;
  for (int n = 0; n < kMaxLockLines && std::getline(f, line); ++n) {
    // "1: FLOCK  ADVISORY  WRITE 4242 00:01:2048 0 EOF"; waiters have "->".
    std::istringstream in(line);
    std::string id, type, advisory, mode, dev;
    long pid = 0;
    if (!(in >> id >> type) || type != "FLOCK" || !(in >> advisory >> mode >> pid >> dev)) continue;
    if (dev != want || pid <= 0) continue;
    std::string who = "pid " + std::to_string(pid);
    struct stat ps {};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &ps) == 0) who += " (uid " + std::to_string(ps.st_uid) + ")";
    return who;
  }
  return "";
}

void store_buffer(MaskBuffer& b, const Partition& p) noexcept {
  // A writer killed between its two stores of `seq` (SIGKILL, the OOM
  // killer) leaves this buffer's sequence odd. Publishing it so would make
  // every reader see "being written" forever: round up to even first.
  std::uint64_t s = b.seq.load(std::memory_order_relaxed);
  s += s & 1;
  b.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  b.kind.store(static_cast<std::uint64_t>(p.kind), std::memory_order_relaxed);
  b.enabled[0].store(p.enabled.bits.lo, std::memory_order_relaxed);
  b.enabled[1].store(p.enabled.bits.hi, std::memory_order_relaxed);
  b.tpcs[0].store(p.tpcs.bits.lo, std::memory_order_relaxed);
  b.tpcs[1].store(p.tpcs.bits.hi, std::memory_order_relaxed);
  b.gpcs[0].store(p.gpcs.bits.lo, std::memory_order_relaxed);
  b.gpcs[1].store(p.gpcs.bits.hi, std::memory_order_relaxed);
  b.max_cluster.store(p.max_cluster, std::memory_order_relaxed);
  b.widened[0].store(p.widened.bits.lo, std::memory_order_relaxed);
  b.widened[1].store(p.widened.bits.hi, std::memory_order_relaxed);
  b.widened_max_cluster.store(p.widened_max_cluster, std::memory_order_relaxed);
  b.seq.store(s + 2, std::memory_order_release);
}

// Publishes `p` into the buffer readers are not using, then flips to it.
// Caller holds the writer lock (or is the only writer, during creation).
void publish(DeviceEntry& e, const Partition& p) noexcept {
  const std::uint64_t next = e.generation.load(std::memory_order_relaxed) + 1;
  store_buffer(e.buffer[next & 1], p);
  e.generation.store(next, std::memory_order_release);
}

// The descriptor is written only under the writer lock and read by the CLI,
// never by the launch callback; it changes at most from unknown to known.
void store_desc(DeviceEntry& e, const DeviceDesc& d) noexcept {
  e.sm_count = d.sm_count;
  e.cc_major = d.cc_major;
  e.cc_minor = d.cc_minor;
  e.driver_version = d.driver_version;
}

void write_entry(Header& h, const DevicePartition& dp) {
  // A partition that enables no TPC its GPU has hangs every kernel: never
  // stored, whoever asks (a hand-made NVTASKSET_PARTITION, a -p of an older
  // build).
  if (const std::string why = partition_problem(dp); !why.empty()) throw Error(why);
  DeviceEntry* free_slot = nullptr;
  for (auto& e : h.devices) {
    if (e.in_use.load(std::memory_order_acquire)) {
      if (std::memcmp(e.uuid, dp.device.data(), 16) == 0) {
        if (dp.desc.known()) store_desc(e, dp.desc);  // keep what an earlier writer knew
        publish(e, dp.partition);
        return;
      }
    } else if (!free_slot) {
      free_slot = &e;
    }
  }
  if (!free_slot) throw Error("the control region has no room for another device partition");
  std::memcpy(free_slot->uuid, dp.device.data(), 16);
  store_desc(*free_slot, dp.desc);
  publish(*free_slot, dp.partition);
  free_slot->in_use.store(1, std::memory_order_release);
}

// After the partition is published: graph execs encoded before this epoch
// re-encode their kernels before their next launch.
void write_locked(Header& h, const DevicePartition& dp) {
  write_entry(h, dp);
  h.epoch.store(h.epoch.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}


// Whether a complete region belongs to the process `pid` that started at
// `start` (and not to an earlier process that had the same PID).
bool owned_by(const Header& h, pid_t pid, std::uint64_t start) { return h.pid == pid && h.start_time == start; }

}  // namespace

std::string region_name(pid_t pid) { return "nvtaskset." + std::to_string(pid); }

std::uint64_t process_start_time(pid_t pid) { return process_stat_number(pid, 22).value_or(0); }

Partition read_partition(const DeviceEntry& e) {
  Partition p;
  const ReadResult r = seqlock_read(e, [&p](const MaskBuffer& b) {
    p.kind = static_cast<SpecKind>(b.kind.load(std::memory_order_relaxed));
    p.enabled.bits = {b.enabled[0].load(std::memory_order_relaxed), b.enabled[1].load(std::memory_order_relaxed)};
    p.tpcs.bits = {b.tpcs[0].load(std::memory_order_relaxed), b.tpcs[1].load(std::memory_order_relaxed)};
    p.gpcs.bits = {b.gpcs[0].load(std::memory_order_relaxed), b.gpcs[1].load(std::memory_order_relaxed)};
    p.max_cluster = static_cast<std::uint32_t>(b.max_cluster.load(std::memory_order_relaxed));
    p.widened.bits = {b.widened[0].load(std::memory_order_relaxed), b.widened[1].load(std::memory_order_relaxed)};
    p.widened_max_cluster = static_cast<std::uint32_t>(b.widened_max_cluster.load(std::memory_order_relaxed));
  });
  if (r == ReadResult::kInconsistent) throw Error("inconsistent");
  return p;
}

void init_header(Header& h, const std::vector<DevicePartition>& initial) {
  for (DeviceEntry& e : h.devices) {
    e.in_use.store(0, std::memory_order_relaxed);
    e.generation.store(0, std::memory_order_relaxed);
  }
  h.version = kVersion;
  h.size = sizeof(Header);
  h.pid = ::getpid();
  h.start_time = process_start_time(h.pid);
  h.uid = ::getuid();
  for (const auto& dp : initial) write_locked(h, dp);
  h.magic.store(kMagic, std::memory_order_release);  // last: attachers see a complete region
}

Region::Region(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), header_(static_cast<Header*>(impl_->map)) {}

Region::~Region() = default;

namespace {

// How /proc/<pid>/fd shows a region: "/memfd:nvtaskset.<pid> (deleted)".
std::string memfd_link(pid_t pid) { return "/memfd:" + region_name(pid) + " (deleted)"; }

// The descriptor numbers in /proc/<pid>/fd whose link target satisfies
// `match`. *denied (if given) says whether the directory was another user's.
template <class Match>
std::vector<int> fds_where(pid_t pid, Match match, bool* denied = nullptr) {
  std::vector<int> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (denied) *denied = errno == EACCES || errno == EPERM;
    return out;
  }
  char target[256];
  // Bounded by the kernel's own limit on a process's descriptors (nr_open's
  // default): a task cannot make this scan run on without end.
  constexpr long kMaxFds = 1L << 20;
  long seen = 0;
  while (dirent* ent = ::readdir(d)) {
    if (++seen > kMaxFds) break;
    if (ent->d_name[0] < '0' || ent->d_name[0] > '9') continue;
    const ssize_t n = ::readlinkat(::dirfd(d), ent->d_name, target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (match(std::string_view(target, static_cast<std::size_t>(n)))) out.push_back(std::atoi(ent->d_name));
  }
  ::closedir(d);
  return out;
}

// The descriptors through which `pid` holds its own region.
std::vector<int> region_fds(pid_t pid, bool* denied = nullptr) {
  const std::string link = memfd_link(pid);
  return fds_where(pid, [&](std::string_view t) { return t == link; }, denied);
}

// The effective UID of a process (/proc/<pid>/status "Uid:" field 2), or -1.
long process_euid(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("Uid:", 0) != 0) continue;
    std::istringstream in(line.substr(4));
    long real = -1, effective = -1;
    in >> real >> effective;
    return effective;
  }
  return -1;
}

// Checks that `fd` is a region as its task's shim made it; "" or why not.
std::string check_file(int fd, long uid) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "it is not a memory file";
  if (uid >= 0 && st.st_uid != static_cast<uid_t>(uid))
    return "it is owned by uid " + std::to_string(st.st_uid) + ", not the task's user (uid " + std::to_string(uid) +
           ")";
  if ((st.st_mode & 07777) != 0600) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("its mode is ") + mode + ", not 0600";
  }
  if (st.st_size != static_cast<off_t>(sizeof(Header)))
    return "its size is " + std::to_string(st.st_size) + " bytes, not " + std::to_string(sizeof(Header));
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) return "its size is not sealed";
  return {};
}

std::unique_ptr<Region::Impl> map_fd(int fd) {
  auto impl = std::make_unique<Region::Impl>();
  impl->fd = fd;
  void* p = ::mmap(nullptr, sizeof(Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw Error(std::string("cannot map the control region: ") + std::strerror(errno));
  impl->map = p;
  return impl;
}

}  // namespace

std::unique_ptr<Region> Region::create_for_self(const std::vector<DevicePartition>& initial) {
  const pid_t self = ::getpid();
  const std::uint64_t start = process_start_time(self);
  // A region this process already has: another copy of the shim in this
  // image created it (the descriptor is close-on-exec, so no earlier image's
  // survives). It is ours only if everything about it says so; anything else
  // is closed.
  for (int fd : region_fds(self)) {
    if (check_file(fd, static_cast<long>(::geteuid())).empty()) {
      auto impl = map_fd(::fcntl(fd, F_DUPFD_CLOEXEC, 3));
      const auto* h = static_cast<const Header*>(impl->map);
      if (h->magic.load(std::memory_order_acquire) == kMagic && h->version == kVersion && owned_by(*h, self, start))
        return std::unique_ptr<Region>(new Region(std::move(impl)));
    }
  }
  // Regions inherited from ancestors (fork) are theirs, not ours: drop the
  // descriptors (the ancestors keep their own).
  for (int fd : fds_where(self, [](std::string_view t) { return t.starts_with("/memfd:nvtaskset."); })) ::close(fd);

  // Close-on-exec: a descriptor that crossed execve() would reach every
  // child started through a path that runs no fork handler (system(),
  // popen(), posix_spawn(), vfork()), and one that then switched user could
  // steer this task. A new image finds its partition again from its status
  // entry or its ancestors (shim.cpp, initial_partitions).
  const int fd = ::memfd_create(region_name(self).c_str(), MFD_ALLOW_SEALING | MFD_CLOEXEC);
  if (fd < 0) throw Error(std::string("cannot create the control region: memfd_create: ") + std::strerror(errno));
  if (::fchmod(fd, 0600) != 0 || ::ftruncate(fd, sizeof(Header)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, kSeals | F_SEAL_SEAL) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(std::string("cannot create the control region: ") + std::strerror(err));
  }
  auto impl = map_fd(fd);
  std::memset(impl->map, 0, sizeof(Header));
  init_header(*new (impl->map) Header, initial);
  return std::unique_ptr<Region>(new Region(std::move(impl)));
}

std::unique_ptr<Region> Region::attach(pid_t pid) {
  if (pid <= 0) throw Error("invalid pid " + std::to_string(pid));
  // A zombie (killed, not yet reaped) is dead too: taskset's answer.
  if (process_is_zombie_or_dead(pid)) throw Error(pid_str(pid) + ": no such process");
  bool denied = false;
  const std::vector<int> fds = region_fds(pid, &denied);
  if (denied)
    throw Error(pid_str(pid) + " belongs to another user: only its owner and root can query or change its TPCs");
  if (fds.empty()) throw Error(pid_str(pid) + " is not running under nvtaskset");
  const long uid = process_euid(pid);
  std::string why;
  for (int n : fds) {
    // A "magic link" to the task's own descriptor: the kernel lets only the
    // task's user and root through it.
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(n);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      if (errno == EACCES || errno == EPERM)
        throw Error(pid_str(pid) + " belongs to another user: only its owner and root can query or change its TPCs");
      continue;  // closed meanwhile
    }
    why = check_file(fd, uid);
    if (!why.empty()) {
      ::close(fd);
      continue;
    }
    auto impl = map_fd(fd);
    auto* h = static_cast<Header*>(impl->map);
    // The shim stores the magic last: a task still starting gets a short,
    // bounded grace period.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (h->magic.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const std::uint32_t magic = h->magic.load(std::memory_order_acquire);
    if (magic != kMagic || h->version != kVersion) {
      why = magic == kMagic ? "it has version " + std::to_string(h->version) + ", this nvtaskset knows " +
                                  std::to_string(kVersion)
                            : "its header is not an nvtaskset header";
      continue;
    }
    if (!owned_by(*h, pid, process_start_time(pid))) {
      why = "its header names pid " + std::to_string(h->pid) + ", not this process";
      continue;
    }
    return std::unique_ptr<Region>(new Region(std::move(impl)));
  }
  if (why.empty()) throw Error(pid_str(pid) + " is not running under nvtaskset");
  throw Error("control region of pid " + std::to_string(pid) + " is corrupt: " + why);
}

std::string validate(const Header& h) {
  for (unsigned i = 0; i < kMaxDevices; ++i) {
    const DeviceEntry& e = h.devices[i];
    const std::uint32_t in_use = e.in_use.load(std::memory_order_acquire);
    if (in_use > 1) return "device slot " + std::to_string(i) + " has flag " + std::to_string(in_use);
    if (in_use == 0) continue;
    Partition p;
    try {
      p = read_partition(e);
    } catch (const Error&) {
      return "device slot " + std::to_string(i) + " cannot be read consistently";
    }
    if (static_cast<std::uint32_t>(p.kind) > static_cast<std::uint32_t>(SpecKind::kPhysical))
      return "device slot " + std::to_string(i) + " has partition kind " + std::to_string(static_cast<unsigned>(p.kind));
    if (p.active() && p.enabled.empty()) return "device slot " + std::to_string(i) + " enables no TPC";
    if (!p.active() && (!p.enabled.empty() || !p.widened.empty() || p.max_cluster != 0))
      return "device slot " + std::to_string(i) + " holds a mask but no partition";
    if (p.max_cluster > kMaxClusterSms || p.widened_max_cluster > kMaxClusterSms)
      return "device slot " + std::to_string(i) + " names clusters of " +
             std::to_string(std::max(p.max_cluster, p.widened_max_cluster)) + " SMs";
    if (e.sm_count > 256 || e.sm_count % 2 != 0 || e.cc_major > 99 || e.cc_minor > 9)
      return "device slot " + std::to_string(i) + " describes an impossible GPU (" + std::to_string(e.sm_count) +
             " SMs, compute capability " + std::to_string(e.cc_major) + "." + std::to_string(e.cc_minor) + ")";
    for (unsigned j = 0; j < i; ++j)
      if (h.devices[j].in_use.load(std::memory_order_acquire) == 1 &&
          std::memcmp(h.devices[j].uuid, e.uuid, 16) == 0)
        return "device slots " + std::to_string(j) + " and " + std::to_string(i) + " name the same GPU";
  }
  return {};
}

const DevicePartition* applied_to(const std::vector<DevicePartition>& parts, const DeviceUuid& device) {
  const DevicePartition* any = nullptr;
  for (const auto& dp : parts) {
    if (dp.device == device) return &dp;
    if (dp.device == kAnyDevice && any == nullptr) any = &dp;
  }
  return any;
}

std::string cannot_apply(const Header& h) {
  // 0: the shim has not loaded the driver yet, so nothing of it launches;
  // a driver loaded around the shim is task_driver.hpp's to tell.
  if (h.callback_registered.load(std::memory_order_acquire) == kHookFailed)
    return "its shim could not hook kernel launches";
  if (h.partition_unseen.load(std::memory_order_relaxed) != 0)
    return "it sees none of the GPUs its partition is for (CUDA_VISIBLE_DEVICES changed after nvtaskset chose "
           "the GPU; NVTASKSET_ON_UNSUPPORTED=warn)";
  if (const std::uint64_t n = h.kernels_unmasked.load(std::memory_order_relaxed))
    return std::to_string(n) + " of its kernels ran on all TPCs (" +
           (h.kernels_unsupported.load(std::memory_order_relaxed) != 0
                ? "a TMD layout nvtaskset does not know, QMD version 0x" +
                      [&] {
                        char b[8];
                        std::snprintf(b, sizeof b, "%x", h.last_tmd_version.load(std::memory_order_relaxed));
                        return std::string(b);
                      }() + ", NVTASKSET_ON_UNSUPPORTED=warn"
                : std::string("no partition could be read from its control region")) +
           ")";
  return {};
}

std::vector<DevicePartition> Region::read_all() const {
  try {
    return ctl::read_all(*header_);
  } catch (const Error&) {
    throw Error("control region of pid " + std::to_string(header_->pid) +
                " is corrupt: its partition cannot be read consistently");
  }
}

std::vector<DevicePartition> read_all(const Header& h) {
  std::vector<DevicePartition> out;
  for (const auto& e : h.devices) {
    if (!e.in_use.load(std::memory_order_acquire)) continue;
    DevicePartition dp;
    std::memcpy(dp.device.data(), e.uuid, 16);
    dp.partition = read_partition(e);
    dp.desc = {e.sm_count, e.cc_major, e.cc_minor, e.driver_version};
    out.push_back(dp);
  }
  return out;
}

void Region::lock(std::chrono::milliseconds timeout) {
  if (impl_->locked) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (::flock(impl_->fd, LOCK_EX | LOCK_NB) == 0) {
      impl_->locked = true;
      return;
    }
    if (errno != EWOULDBLOCK && errno != EINTR)
      throw Error("cannot lock the control region of pid " + std::to_string(header_->pid) + ": " +
                  std::strerror(errno));
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string who = lock_holder(impl_->fd);
  throw Error("the control region of pid " + std::to_string(header_->pid) + " is locked by " +
              (who.empty() ? std::string("another writer") : who) + " for more than " +
              std::to_string(timeout.count()) + " ms; nothing was changed");
}

bool Region::try_lock() {
  if (impl_->locked) return true;
  if (::flock(impl_->fd, LOCK_EX | LOCK_NB) != 0) return false;
  impl_->locked = true;
  return true;
}

void Region::unlock() noexcept {
  if (!impl_->locked) return;
  ::flock(impl_->fd, LOCK_UN);
  impl_->locked = false;
}

bool Region::locked() const noexcept { return impl_->locked; }

void Region::write(const DevicePartition& dp) {
  if (impl_->locked) {
    write_locked(*header_, dp);
    return;
  }
  lock(kLockTimeout);
  try {
    write_locked(*header_, dp);
  } catch (...) {
    unlock();
    throw;
  }
  unlock();
}

}  // namespace nvtaskset::ctl
