// SPDX-License-Identifier: Apache-2.0
// Beacons: the file, its devices, finding the others', waking (beacon.hpp).
#include "nvtaskset/beacon.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "nvtaskset/control_region.hpp"
#include "nvtaskset/proc.hpp"
#include "nvtaskset/seqlock.hpp"
#include "nvtaskset/status.hpp"
#include "nvtaskset/trusted_file.hpp"

namespace nvtaskset::roles {

namespace {

constexpr const char* kPrefix = "nvtaskset-beacon.";

}  // namespace

std::unique_ptr<BeaconFile> BeaconFile::create() {
  const std::string dir = ctl::status_dir();
  if (std::string why = ctl::check_shared_dir(dir); !why.empty()) throw ctl::Error(why);
  const std::string path = dir + "/" + kPrefix + std::to_string(::getpid()) + "." + ctl::random_hex();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw ctl::Error(path + ": " + std::strerror(errno));
  if (::fchmod(fd, 0644) != 0 || ::ftruncate(fd, static_cast<off_t>(kBeaconBytes)) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    throw ctl::Error(path + ": " + std::strerror(e));
  }
  void* m = ::mmap(nullptr, kBeaconBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) {
    ::unlink(path.c_str());
    throw ctl::Error(path + ": " + std::strerror(e));
  }
  auto* b = static_cast<Beacon*>(m);
  b->version = kBeaconVersion;
  b->size = static_cast<std::uint32_t>(sizeof(Beacon));
  b->pid = ::getpid();
  b->start_time = ctl::process_start_time(::getpid());
  b->uid = ::geteuid();
  b->magic.store(kBeaconMagic, std::memory_order_release);
  return std::unique_ptr<BeaconFile>(new BeaconFile(path, b));
}

BeaconFile::~BeaconFile() {
  if (!path_.empty()) ::unlink(path_.c_str());
  ::munmap(static_cast<void*>(b_), kBeaconBytes);
}

void set_device(Beacon& b, unsigned slot, const DeviceUuid& uuid, const Bits128& reserved, const Bits128& burst,
                const Bits128& topup) {
  if (slot >= kBeaconDevices) return;
  BeaconDevice& d = b.devices[slot];
  const std::uint64_t s = d.seq.load(std::memory_order_relaxed);
  d.seq.store(s | 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(d.uuid, uuid.data(), 16);
  d.reserved[0].store(reserved.lo, std::memory_order_relaxed);
  d.reserved[1].store(reserved.hi, std::memory_order_relaxed);
  d.burst[0].store(burst.lo, std::memory_order_relaxed);
  d.burst[1].store(burst.hi, std::memory_order_relaxed);
  d.topup[0].store(topup.lo, std::memory_order_relaxed);
  d.topup[1].store(topup.hi, std::memory_order_relaxed);
  d.in_use.store(1, std::memory_order_relaxed);
  d.seq.store((s | 1) + 1, std::memory_order_release);
}

namespace {

// One consistent copy of a device slot, or false (in use or not) within a
// bounded number of tries: a writer publishes in nanoseconds, a corrupt slot
// stays odd.
bool read_slot(const BeaconDevice& d, DeviceView& v, bool& in_use) noexcept {
  return seqlock::read(d.seq, [&]() noexcept {
    in_use = d.in_use.load(std::memory_order_relaxed) == 1;
    std::memcpy(v.uuid.data(), d.uuid, 16);
    v.reserved = {d.reserved[0].load(std::memory_order_relaxed), d.reserved[1].load(std::memory_order_relaxed)};
    v.burst = {d.burst[0].load(std::memory_order_relaxed), d.burst[1].load(std::memory_order_relaxed)};
    v.topup = {d.topup[0].load(std::memory_order_relaxed), d.topup[1].load(std::memory_order_relaxed)};
  });
}

// read_slot, waiting out a writer that the scheduler stopped half-way: its
// slot stays odd for as long as it is off the CPU (milliseconds on a loaded
// machine), far longer than read_slot's tries, and an unreadable slot counts
// as reserved everywhere, which leaves a best-effort task no floor (it ran on
// its whole partition: a CI run under ASan). Up to 50 ms, 20 us apart; only
// a slot a dead writer left odd stays unreadable.
bool read_slot_patiently(const BeaconDevice& d, DeviceView& v, bool& in_use) noexcept {
  constexpr int kRounds = 2500;
  for (int i = 0; i < kRounds; ++i) {
    if (read_slot(d, v, in_use)) return true;
    const timespec pause{0, 20'000};
    ::nanosleep(&pause, nullptr);
  }
  return false;
}

}  // namespace

bool read_devices(const Beacon& b, std::vector<DeviceView>& out) {
  out.clear();
  for (const BeaconDevice& d : b.devices) {
    DeviceView v;
    bool in_use = false;
    if (!read_slot_patiently(d, v, in_use)) return false;
    if (in_use) out.push_back(v);
  }
  return true;
}

namespace {

template <class Pick>
Bits128 claimed_on(const Beacon& b, const std::uint8_t (&uuid)[16], Pick pick) noexcept {
  Bits128 r;
  for (const BeaconDevice& d : b.devices) {
    DeviceView v;
    bool in_use = false;
    // An unreadable slot may be this GPU's: take nothing of it is wrong in
    // the unsafe direction (a BE kernel on the LC's TPCs); take all of it.
    if (!read_slot_patiently(d, v, in_use)) return Bits128{~0ull, ~0ull};
    if (!in_use) continue;
    const bool any = v.uuid == kAnyDevice;
    if (any || std::memcmp(v.uuid.data(), uuid, 16) == 0) r = r | pick(v);
  }
  return r;
}

}  // namespace

Bits128 reserved_on(const Beacon& b, const std::uint8_t (&uuid)[16]) noexcept {
  return claimed_on(b, uuid, [](const DeviceView& v) noexcept { return v.reserved; });
}

Bits128 topup_on(const Beacon& b, const std::uint8_t (&uuid)[16]) noexcept {
  return claimed_on(b, uuid, [](const DeviceView& v) noexcept { return v.topup; });
}

namespace {

// Maps a beacon read-only after the checks a shared file gets
// (trusted_file.hpp, OpenSSH-style): opened without following a link or
// waiting on a FIFO; a regular file of exactly one page; owned by the task's
// user or root; writable by its owner only; its header names the task and
// its start time.
const Beacon* map_trusted(const std::string& path, pid_t pid, std::uint64_t start, uid_t uid,
                          std::uint32_t* other_version) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                  st.st_size == static_cast<off_t>(kBeaconBytes) && (st.st_uid == uid || st.st_uid == 0) &&
                  (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
  void* m = ok ? ::mmap(nullptr, kBeaconBytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (m == MAP_FAILED) return nullptr;
  const auto* b = static_cast<const Beacon*>(m);
  // (The header sits at the same offsets in every version so far.)
  const bool names_it = b->magic.load(std::memory_order_acquire) == kBeaconMagic && b->pid == pid &&
                        b->start_time == start;
  if (names_it && b->version == kBeaconVersion) return b;
  if (names_it) *other_version = b->version;  // the task's, of another build
  ::munmap(m, kBeaconBytes);
  return nullptr;
}

}  // namespace

bool peer_alive(const Peer& p) {
  return p.pid > 0 && ctl::process_start_time(p.pid) == p.start_time && !ctl::process_is_zombie_or_dead(p.pid);
}

std::vector<Peer> scan_beacons(pid_t self, const std::vector<Peer>& known, std::vector<OtherBuild>* other_builds) {
  std::vector<Peer> out;
  const std::string dir = ctl::status_dir();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  std::vector<std::pair<std::string, pid_t>> names;
  while (const dirent* e = ::readdir(d))
    if (const auto pid = ctl::pid_of_shared_name(e->d_name, kPrefix)) names.emplace_back(e->d_name, *pid);
  ::closedir(d);
  for (const auto& [name, p] : names) {
    const std::optional<pid_t> pid = p;
    if (*pid == self) continue;
    const std::string path = dir + "/" + name;
    const std::uint64_t start = ctl::process_start_time(*pid);
    if (start == 0 || ctl::process_is_zombie_or_dead(*pid)) {
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ctl::may_remove(st)) ::unlink(path.c_str());
      continue;
    }
    bool have = false;
    for (const Peer& k : known)
      if (k.pid == *pid && k.start_time == start) {
        out.push_back(k);
        have = true;
        break;
      }
    if (have) continue;
    const auto uid = ctl::process_uid(*pid);
    if (!uid) continue;
    std::uint32_t other = 0;
    if (const Beacon* b = map_trusted(path, *pid, start, *uid, &other)) out.push_back(Peer{*pid, start, *uid, b});
    else if (other != 0 && other_builds != nullptr) other_builds->push_back({*pid, other});
  }
  return out;
}

LcSnapshot snapshot(const Beacon& b) noexcept {
  LcSnapshot s;
  s.completed = b.completed.load(std::memory_order_acquire);
  s.launches = b.launches.load(std::memory_order_acquire);
  s.heartbeat_ns = b.heartbeat_ns.load(std::memory_order_relaxed);
  s.may_burst = b.may_burst.load(std::memory_order_relaxed) == 1;
  s.probing = b.probing.load(std::memory_order_relaxed) == 1;
  return s;
}

bool is_stale(const LcSnapshot& s, std::uint64_t now_ns) noexcept {
  return now_ns > s.heartbeat_ns && now_ns - s.heartbeat_ns > kStaleNs;
}

// Shared futexes (no FUTEX_PRIVATE_FLAG): the waiters are other processes,
// each with its own read-only mapping of the beacon's file.
void wake_best_effort(const Beacon& b) noexcept {
  ::syscall(SYS_futex, const_cast<std::uint32_t*>(reinterpret_cast<const std::uint32_t*>(&b.wake)), FUTEX_WAKE,
            INT32_MAX, nullptr, nullptr, 0);
}

namespace {

// What a futex wait's return (and errno) means: woken, also when the word
// had changed already (EAGAIN) or a signal came (EINTR); timed out; or
// refused (the caller polls).
Wake wake_of(long rc) noexcept {
  if (rc >= 0 || errno == EAGAIN || errno == EINTR) return Wake::kWoken;
  return errno == ETIMEDOUT ? Wake::kTimedOut : Wake::kRefused;
}

}  // namespace

Wake await_wake(const Beacon& b, std::uint32_t seen, std::uint64_t timeout_ns) noexcept {
  const timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000), static_cast<long>(timeout_ns % 1'000'000'000)};
  return wake_of(::syscall(SYS_futex, const_cast<std::uint32_t*>(reinterpret_cast<const std::uint32_t*>(&b.wake)),
                           FUTEX_WAIT, seen, &ts, nullptr, 0));
}

namespace {

// struct futex_waitv of linux/futex.h (5.16), spelled out so that the
// build does not depend on the headers' age; the kernel answers ENOSYS
// where it lacks the call.
struct FutexWaitv {
  std::uint64_t val;
  std::uint64_t uaddr;
  std::uint32_t flags;
  std::uint32_t reserved;
};
#ifdef SYS_futex_waitv
constexpr long kSysFutexWaitv = SYS_futex_waitv;
#else
constexpr long kSysFutexWaitv = 449;  // x86-64's and the generic table's number
#endif
constexpr std::uint32_t kFutex32 = 2;   // FUTEX_32; shared: no FUTEX_PRIVATE_FLAG
constexpr std::size_t kWaitvMax = 128;  // FUTEX_WAITV_MAX

}  // namespace

Wake await_any_wake(std::span<const Beacon* const> bs, std::span<const std::uint32_t> seen,
                    std::uint64_t timeout_ns) noexcept {
  if (bs.empty() || bs.size() != seen.size() || bs.size() > kWaitvMax) return Wake::kRefused;
  if (bs.size() == 1) return await_wake(*bs[0], seen[0], timeout_ns);
  FutexWaitv w[kWaitvMax] = {};
  for (std::size_t i = 0; i < bs.size(); ++i)
    w[i] = {seen[i], reinterpret_cast<std::uint64_t>(&bs[i]->wake), kFutex32, 0};
  // futex_waitv's time-out is absolute, on the clock named.
  timespec at{};
  ::clock_gettime(CLOCK_MONOTONIC, &at);
  const std::uint64_t end = static_cast<std::uint64_t>(at.tv_sec) * 1'000'000'000ull +
                            static_cast<std::uint64_t>(at.tv_nsec) + timeout_ns;
  at.tv_sec = static_cast<time_t>(end / 1'000'000'000ull);
  at.tv_nsec = static_cast<long>(end % 1'000'000'000ull);
  return wake_of(::syscall(kSysFutexWaitv, w, static_cast<unsigned>(bs.size()), 0u, &at, CLOCK_MONOTONIC));
}

}  // namespace nvtaskset::roles
