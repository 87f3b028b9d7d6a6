// SPDX-License-Identifier: Apache-2.0
// Roles: beacons and the policy (roles.hpp).
#include "nvtaskset/roles.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "nvtaskset/control_region.hpp"
#include "nvtaskset/proc.hpp"
#include "nvtaskset/seqlock.hpp"
#include "nvtaskset/status.hpp"
#include "nvtaskset/trusted_file.hpp"

namespace nvtaskset::roles {

const char* role_name(Role r) noexcept {
  switch (r) {
    case Role::kLatencyCritical: return "latency-critical";
    case Role::kBestEffort: return "best-effort";
    case Role::kNone: break;
  }
  return "none";
}

std::optional<Role> parse_role(std::string_view s) noexcept {
  if (s == "latency-critical") return Role::kLatencyCritical;
  if (s == "best-effort") return Role::kBestEffort;
  if (s == "none" || s.empty()) return Role::kNone;
  return std::nullopt;
}

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

}  // namespace

bool read_devices(const Beacon& b, std::vector<DeviceView>& out) {
  out.clear();
  for (const BeaconDevice& d : b.devices) {
    DeviceView v;
    bool in_use = false;
    if (!read_slot(d, v, in_use)) return false;
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
    if (!read_slot(d, v, in_use)) return Bits128{~0ull, ~0ull};
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

// ---- the policy ----------------------------------------------------------------------

void BurstBudget::advance(std::uint64_t now, bool busy) noexcept {
  if (!started_) {
    started_ = true;
    last_ = now;
  }
  const std::uint64_t dt = now > last_ ? now - last_ : 0;
  last_ = now;
  // The share of time busy, weighted by exp(-age / tau): what the last
  // interval adds is its length's weight, all busy or all idle.
  const double keep = std::exp(-static_cast<double>(dt) / static_cast<double>(p_.tau_ns));
  share_ = share_ * keep + (busy ? 1.0 - keep : 0.0);
  if (p_.fast_tau_ns != 0) {
    const double fast_keep = std::exp(-static_cast<double>(dt) / static_cast<double>(p_.fast_tau_ns));
    fast_share_ = fast_share_ * fast_keep + (busy ? 1.0 - fast_keep : 0.0);
  }
  if (busy) {
    if (busy_since_ == 0) busy_since_ = now - dt;
    const bool fast = p_.fast_tau_ns != 0 && fast_share_ > p_.fast_stop_share;
    if (allowed_ && (share_ > p_.stop_share || fast || now - busy_since_ >= p_.max_burst_ns)) {
      allowed_ = false;
      stopped_at_ = now;
      ++saturations_;
      // A probe the task's load ended at once: wait twice as long for the
      // next one (roles.hpp).
      const bool failed_probe = probed_at_ != 0 && now - probed_at_ < 2 * p_.tau_ns;
      timeout_ns_ = failed_probe ? std::min(2 * resume_timeout(), std::max(p_.max_resume_after_ns, p_.resume_after_ns))
                                 : p_.resume_after_ns;
      probed_at_ = 0;
    }
  } else {
    busy_since_ = 0;
    // Both shares below the resume share: a closed loop the fast share
    // stopped has a slow share still below it (0.32 after 0.39 s).
    if (!allowed_ && share_ < p_.resume_share && (p_.fast_tau_ns == 0 || fast_share_ < p_.resume_share)) {
      allowed_ = true;
      timeout_ns_ = 0;
      probed_at_ = 0;
    } else if (!allowed_ && p_.resume_after_ns != 0 && now - stopped_at_ >= resume_timeout()) {
      // Stopped long enough: try again at the resume share (roles.hpp says why).
      allowed_ = true;
      share_ = std::min(share_, p_.resume_share);
      fast_share_ = std::min(fast_share_, p_.fast_resume_share);
      probed_at_ = now;
    }
  }
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

BeAction be_action(std::span<const LcSnapshot> lcs, std::uint64_t now_ns) noexcept {
  BeAction a = BeAction::kRun;
  for (const LcSnapshot& s : lcs) {
    if (is_stale(s, now_ns)) {
      // Its controller stopped: whether the task is busy is unknown, so
      // its reservation is kept free, and nothing waits for it.
      if (a == BeAction::kRun) a = BeAction::kFloor;
      continue;
    }
    if (s.launches == s.completed) continue;
    if (s.may_burst) return BeAction::kHold;
    a = BeAction::kFloor;
  }
  return a;
}

bool hold_is_probe(std::span<const LcSnapshot> lcs, std::uint64_t now_ns) noexcept {
  bool any = false;
  for (const LcSnapshot& s : lcs) {
    if (is_stale(s, now_ns) || s.launches == s.completed || !s.may_burst) continue;
    if (!s.probing) return false;
    any = true;
  }
  return any;
}

const KernelDurations::Entry* KernelDurations::find(std::uint64_t key) const noexcept {
  for (unsigned i = 0; i < kProbe; ++i) {
    const Entry& e = e_[(key + i) % kSlots];
    if (e.key == key) return &e;
    if (e.key == 0) break;
  }
  return nullptr;
}

std::uint64_t KernelDurations::estimate(std::uint64_t key, std::uint64_t unknown) const noexcept {
  const Entry* e = find(key);
  return e != nullptr ? e->ns : unknown;
}

unsigned KernelDurations::samples(std::uint64_t key) const noexcept {
  const Entry* e = find(key);
  return e != nullptr ? e->samples : 0;
}

template <class Merge>
void KernelDurations::put(std::uint64_t key, std::uint64_t sample_ns, Merge merge) noexcept {
  sample_ns = std::min<std::uint64_t>(sample_ns, 1'000'000'000);  // a second: not a kernel, a stall
  for (unsigned i = 0; i < kProbe; ++i) {
    Entry& e = e_[(key + i) % kSlots];
    if (e.key == key) {
      e.ns = merge(e.ns, sample_ns, e.samples);
      if (e.samples != ~0u) ++e.samples;
      return;
    }
    if (e.key == 0) {
      e = {key, sample_ns, 1};
      return;
    }
  }
}

void KernelDurations::learn(std::uint64_t key, std::uint64_t sample_ns) noexcept {
  put(key, sample_ns, [](std::uint64_t old, std::uint64_t s, unsigned n) noexcept {
    return n < kFirst ? std::min(old, s) : old - old / 4 + s / 4;
  });
}

void KernelDurations::learn_least(std::uint64_t key, std::uint64_t sample_ns) noexcept {
  put(key, sample_ns, [](std::uint64_t old, std::uint64_t s, unsigned) noexcept { return std::min(old, s); });
}

WorkQueue::WorkQueue(std::uint64_t bound_ns, unsigned max_launches) noexcept
    : bound_ns_(bound_ns), max_(std::clamp(max_launches, 1u, kRing - 1)) {}

void WorkQueue::push(std::uint64_t key) noexcept {
  Slot& s = slots_[next_slot()];
  s.key = key;
  // Not learned yet: counted as the whole bound, so an unknown kernel is
  // queued behind nothing else (the first training step runs shallow once).
  s.est = durations_.estimate(key, bound_ns_);
  s.behind = chained_ && size_ > 0;
  queued_ns_ += s.est;
  ++size_;
  chained_ = true;
}

void WorkQueue::pop(std::int64_t elapsed_ns) noexcept {
  if (size_ == 0) return;
  const Slot& s = slots_[oldest()];
  if (wants_sample() && elapsed_ns >= 0) durations_.learn(s.key, static_cast<std::uint64_t>(elapsed_ns));
  queued_ns_ -= std::min(queued_ns_, s.est);
  ++head_;
  --size_;
}

// ---- kernels too long to borrow ---------------------------------------------------------

int KernelTimer::start(std::uint64_t key) noexcept {
  const bool due = ++launches_ % kEvery == 0;
  int free = -1;
  for (unsigned i = 0; i < kPairs; ++i) {
    if (pairs_[i].state == State::kFree) {
      if (free < 0) free = static_cast<int>(i);
    } else if (pairs_[i].key == key && !due) {
      return -1;  // being timed now
    }
  }
  if (free < 0) return -1;
  if (!due && durations_.samples(key) >= KernelDurations::kFirst) return -1;
  pairs_[free] = {key, State::kStarted};
  return free;
}

void KernelTimer::ended(int pair, bool ok) noexcept {
  if (pair < 0 || pair >= static_cast<int>(kPairs) || pairs_[pair].state != State::kStarted) return;
  if (ok) pairs_[pair].state = State::kRecorded;
  else pairs_[pair] = {};
}

void KernelTimer::finish(int pair, std::int64_t elapsed_ns) noexcept {
  if (!pending(pair)) return;
  if (elapsed_ns >= 0) durations_.learn(pairs_[pair].key, static_cast<std::uint64_t>(elapsed_ns));
  pairs_[pair] = {};
}

bool GateLane::next(const GateSpacing& s, std::uint64_t kernel_ns) noexcept {
  if (s.every != 0) {
    const bool gate = n_ % s.every == 0;
    ++n_;
    return gate;
  }
  const bool unknown = kernel_ns == GateSpacing::kUnknown;
  const std::uint64_t k = unknown ? 0 : kernel_ns;
  const bool gate = gate_next_ || unknown || n_ >= s.max_launches || work_ns_ + k > s.work_ns;
  if (gate) {
    n_ = 0;
    work_ns_ = 0;
  }
  ++n_;
  work_ns_ += k;
  // After a kernel not timed yet, or one longer than the bound, the next
  // one gets a gate of its own.
  gate_next_ = unknown || work_ns_ > s.work_ns;
  return gate;
}

// ---- the top-up ---------------------------------------------------------------------------

void TopUp::set_max(unsigned max_tpcs, unsigned reserved, std::uint64_t reservation) noexcept {
  reserved_ = reserved;
  if (reservation != 0) {
    if (reservation_ != 0 && reservation != reservation_) forget();
    reservation_ = reservation;
  }
  if (max_ == max_tpcs) return;
  max_ = max_tpcs;
  if (tpcs_ > max_) {
    tpcs_ = max_;
    if (mode_ == Mode::kRun) ++gen_;
  }
}

void TopUp::forget() noexcept {
  alone_.clear();
  ever_probed_ = false;
  timed_alone_ = false;
  n_ = 0;
  below_ = 0;
}

void TopUp::advance(std::uint64_t now, bool saturated) noexcept {
  if (!saturated) {
    // Bursting or idle: the top-up waits, at the size it had, for the next
    // saturation (a closed loop's probes of the burst come and go).
    if (mode_ != Mode::kOff) {
      mode_ = Mode::kOff;
      ++gen_;
    }
    below_ = 0;
    return;
  }
  if (mode_ == Mode::kProbe) {
    if (probe_n_ >= p_.probe_samples || now - probe_start_ >= p_.probe_max_ns) {
      mode_ = Mode::kRun;
      ++gen_;
      probed_at_ = now;
      timed_alone_ = probe_n_ > 0;
      if (!ever_ran_) {
        // Its first top-up starts at its most, and shrinks to what it needs:
        // the task is protected first. Grown from none, its first tens of
        // ms of launches after each stop of the burst were slow, and they
        // were most of a 4-s closed loop's 2% tail (run 63, docs/runs.md).
        ever_ran_ = true;
        tpcs_ = max_;
      }
      start_window(now);
    }
    return;
  }
  if (!ever_probed_ || now - probed_at_ >= (timed_alone_ ? p_.probe_every_ns : p_.probe_retry_ns)) {
    // Durations alone on the reservation: learned anew, so that they follow
    // the clocks and the task's work; a probe that times nothing leaves none,
    // and no decision is made until the next one.
    mode_ = Mode::kProbe;
    ++gen_;
    ++probes_;
    ever_probed_ = true;
    probe_start_ = now;
    probe_n_ = 0;
    below_ = 0;
    alone_.clear();
    return;
  }
  if (mode_ == Mode::kOff) {
    mode_ = Mode::kRun;
    ++gen_;
    start_window(now);
    return;
  }
  // Growing comes as soon as two of min_samples timed launches are slow, shrinking
  // only after shrink_after whole windows: the task is protected first, and
  // the top-up does not swing. After each stop of the burst the task starts on the
  // top-up it last had, or none; a window of 100 ms at the wrong size is
  // about 12 of GPT-2's requests, 1.4% of a 4-s closed-loop window, and
  // was its p99 (run 58: 1.20x of alone on the reservation while the
  // controller's ratio was 0.89-0.98 once settled).
  const bool full = now - decided_at_ >= p_.decide_ns;
  if (n_ < p_.min_samples) {
    if (full && n_ == 0) decided_at_ = now;  // nothing timed: wait a whole window again
    return;
  }
  std::sort(ratios_, ratios_ + n_);
  // Nearest rank: the ceil(q n)-th smallest (of 20 at 0.9, the slowest but two).
  const unsigned rank = static_cast<unsigned>(std::ceil(p_.quantile * static_cast<double>(n_)));
  const unsigned at = std::min(n_ - 1, rank > 0 ? rank - 1 : 0);
  // Before the window is over, two slow launches are needed, so that one
  // outlier does not decide.
  const double r = full ? ratios_[at] : ratios_[n_ - 2];
  if (r <= p_.grow_above && !full) return;
  last_ratio_ = r;
  const unsigned before = tpcs_;
  if (r > p_.grow_above) {
    const double need = static_cast<double>(reserved_ + tpcs_) * (r - 1.0);
    unsigned add = std::max(p_.step, static_cast<unsigned>(std::ceil(need)));
    add += add % 2;  // an even number, as the step
    tpcs_ = std::min(max_, tpcs_ + add);
    below_ = 0;
  } else if (r < p_.shrink_below) {
    below_max_ = below_ == 0 ? r : std::max(below_max_, r);
    if (++below_ >= p_.shrink_after) {
      unsigned cut = p_.step;
      if (reserved_ > 0) {
        // To where the heaviest of those windows would run at shrink_to.
        const double total = static_cast<double>(reserved_ + tpcs_);
        const double want = std::ceil(total * below_max_ / p_.shrink_to);
        const unsigned by = want < total ? static_cast<unsigned>(total - want) : 0;
        cut = std::max(p_.step, by - by % 2);
      }
      tpcs_ = tpcs_ > cut ? tpcs_ - cut : 0;
      below_ = 0;
    }
  } else {
    below_ = 0;
  }
  if (tpcs_ != before) ++gen_;
  start_window(now);
}

void TopUp::sample(std::uint64_t key, std::uint64_t ns, std::uint64_t gen, std::uint64_t launched_ns) noexcept {
  if (gen != gen_ || ns == 0) return;
  if (mode_ == Mode::kProbe) {
    if (launched_ns < probe_start_ + p_.probe_settle_ns) return;
    alone_.learn_least(key, ns);
    ++probe_n_;
    return;
  }
  if (mode_ != Mode::kRun || n_ >= kWindow) return;
  const std::uint64_t alone = alone_.estimate(key, 0);
  if (alone == 0) return;  // not timed alone: no measure of it
  ratios_[n_++] = static_cast<double>(ns) / static_cast<double>(alone);
}

namespace {

Bits128 take_bits(Bits128 from, unsigned& n) noexcept {
  Bits128 out;
  for (unsigned b = 0; b < 128 && n > 0; ++b)
    if (from.test(b)) {
      out.set(b);
      --n;
    }
  return out;
}

}  // namespace

Bits128 choose_topup(const Bits128& free, const Bits128& reserved, const ClusterMap* map, unsigned n) noexcept {
  Bits128 out;
  if (map == nullptr) return take_bits(free, n);
  out = out | take_bits(free & ~map->capable.bits, n);
  for (const ClusterMap::Gpc& g : map->gpcs)
    if ((g.capable.bits & reserved).any()) out = out | take_bits(free & g.capable.bits & ~out, n);
  for (const ClusterMap::Gpc& g : map->gpcs) out = out | take_bits(free & g.capable.bits & ~out, n);
  out = out | take_bits(free & ~out, n);
  return out;
}

}  // namespace nvtaskset::roles
