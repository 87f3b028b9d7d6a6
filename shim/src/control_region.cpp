#include "nvtaskset/control_region.hpp"
#include "nvtaskset/proc.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <thread>

namespace bip = boost::interprocess;

namespace nvtaskset::ctl {

static_assert(std::is_standard_layout_v<Header>, "Header is shared between processes");
static_assert(sizeof(Header) < 4096, "the control region should fit one page");

struct Region::Impl {
  bip::shared_memory_object shm;
  bip::mapped_region map;
  std::string name;
  int fd() const { return shm.get_mapping_handle().handle; }
};

namespace {

std::string pid_str(pid_t pid) { return "pid " + std::to_string(pid); }

// Serialises writers across processes. flock() is released by the kernel if
// the holder dies, so a killed `nvtaskset -p` can never wedge later writers.
class WriterLock {
 public:
  explicit WriterLock(int fd) : fd_(fd) {
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~WriterLock() { ::flock(fd_, LOCK_UN); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  int fd_;
};

void store_buffer(MaskBuffer& b, const Partition& p) noexcept {
  const std::uint64_t s = b.seq.load(std::memory_order_relaxed);
  b.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  b.kind.store(static_cast<std::uint64_t>(p.kind), std::memory_order_relaxed);
  b.enabled[0].store(p.enabled.bits.lo, std::memory_order_relaxed);
  b.enabled[1].store(p.enabled.bits.hi, std::memory_order_relaxed);
  b.tpcs[0].store(p.tpcs.bits.lo, std::memory_order_relaxed);
  b.tpcs[1].store(p.tpcs.bits.hi, std::memory_order_relaxed);
  b.gpcs[0].store(p.gpcs.bits.lo, std::memory_order_relaxed);
  b.gpcs[1].store(p.gpcs.bits.hi, std::memory_order_relaxed);
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

void write_locked(Header& h, const DevicePartition& dp) {
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

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Whether a complete region belongs to the process `pid` that started at
// `start` (and not to an earlier process that had the same PID).
bool owned_by(const Header& h, pid_t pid, std::uint64_t start) { return h.pid == pid && h.start_time == start; }

}  // namespace

std::string region_name(pid_t pid) { return "nvtaskset." + std::to_string(pid); }

std::uint64_t process_start_time(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!f || !std::getline(f, line)) return 0;
  // Field 2 (comm) may contain spaces and parentheses: skip to the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  // After comm come fields 3..; starttime is field 22, i.e. the 20th here.
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return 0;
  }
  try {
    return std::stoull(field);
  } catch (...) {
    return 0;
  }
}

Partition read_partition(const DeviceEntry& e) noexcept {
  for (;;) {
    const std::uint64_t gen = e.generation.load(std::memory_order_acquire);
    const MaskBuffer& b = e.buffer[gen & 1];
    const std::uint64_t s1 = b.seq.load(std::memory_order_acquire);
    if (s1 & 1) continue;
    Partition p;
    p.kind = static_cast<SpecKind>(b.kind.load(std::memory_order_relaxed));
    p.enabled.bits = {b.enabled[0].load(std::memory_order_relaxed), b.enabled[1].load(std::memory_order_relaxed)};
    p.tpcs.bits = {b.tpcs[0].load(std::memory_order_relaxed), b.tpcs[1].load(std::memory_order_relaxed)};
    p.gpcs.bits = {b.gpcs[0].load(std::memory_order_relaxed), b.gpcs[1].load(std::memory_order_relaxed)};
    std::atomic_thread_fence(std::memory_order_acquire);
    if (b.seq.load(std::memory_order_relaxed) == s1) return p;
  }
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

Region::Region(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), header_(static_cast<Header*>(impl_->map.get_address())) {}

Region::~Region() = default;

std::unique_ptr<Region> Region::create_for_self(const std::vector<DevicePartition>& initial) {
  const pid_t self = ::getpid();
  const std::uint64_t start = process_start_time(self);
  const std::string name = region_name(self);
  try {
    // A region under our name is either ours (a second copy of the shim in
    // this process created it) or a leftover of a dead process whose PID we
    // now have.
    try {
      auto impl = std::make_unique<Impl>();
      impl->shm = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
      bip::offset_t size = 0;
      if (impl->shm.get_size(size) && size >= static_cast<bip::offset_t>(sizeof(Header))) {
        impl->map = bip::mapped_region(impl->shm, bip::read_write);
        const auto* h = static_cast<const Header*>(impl->map.get_address());
        if (h->magic.load(std::memory_order_acquire) == kMagic && h->version == kVersion &&
            owned_by(*h, self, start)) {
          impl->name = name;
          return std::unique_ptr<Region>(new Region(std::move(impl)));
        }
      }
      bip::shared_memory_object::remove(name.c_str());
    } catch (const bip::interprocess_exception&) {
      // Not there: the normal case.
    }

    auto impl = std::make_unique<Impl>();
    bip::permissions perm;
    perm.set_permissions(0600);  // owner-only: other users cannot repartition us (root can)
    impl->shm = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write, perm);
    ::fchmod(impl->fd(), 0600);  // independent of the umask
    impl->shm.truncate(sizeof(Header));
    impl->map = bip::mapped_region(impl->shm, bip::read_write);
    impl->name = name;
    std::memset(impl->map.get_address(), 0, sizeof(Header));
    init_header(*new (impl->map.get_address()) Header, initial);
    return std::unique_ptr<Region>(new Region(std::move(impl)));
  } catch (const bip::interprocess_exception& e) {
    throw Error("cannot create the control region " + name + ": " + e.what());
  }
}

std::unique_ptr<Region> Region::attach(pid_t pid) {
  if (pid <= 0) throw Error("invalid pid " + std::to_string(pid));
  const std::string name = region_name(pid);
  if (!process_alive(pid) || process_is_zombie_or_dead(pid)) {
    try {
      bip::shared_memory_object::remove(name.c_str());  // stale leftover, if any
    } catch (...) {
    }
    throw Error(pid_str(pid) + ": no such process");
  }
  auto impl = std::make_unique<Impl>();
  try {
    impl->shm = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::security_error)
      throw Error(pid_str(pid) + " belongs to another user (permission denied on its control region)");
    throw Error(pid_str(pid) + " is not running under nvtaskset");
  }
  bip::offset_t size = 0;
  if (!impl->shm.get_size(size) || size < static_cast<bip::offset_t>(sizeof(Header)))
    throw Error(pid_str(pid) + "'s control region has an unknown size (another nvtaskset version?)");
  impl->map = bip::mapped_region(impl->shm, bip::read_write);
  impl->name = name;
  auto* h = static_cast<Header*>(impl->map.get_address());
  // The shim stores the magic last; a task that is still starting gets a
  // short, bounded grace period.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (h->magic.load(std::memory_order_acquire) != kMagic) {
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(pid_str(pid) + "'s control region is not an nvtaskset region");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (h->version != kVersion)
    throw Error(pid_str(pid) + "'s control region has version " + std::to_string(h->version) + ", expected " +
                std::to_string(kVersion));
  if (!owned_by(*h, pid, process_start_time(pid))) {
    // The PID was reused: the region belongs to a process that is gone.
    bip::shared_memory_object::remove(name.c_str());
    throw Error(pid_str(pid) + " is not running under nvtaskset");
  }
  return std::unique_ptr<Region>(new Region(std::move(impl)));
}

unsigned Region::remove_stale() {
  unsigned removed = 0;
  DIR* d = ::opendir("/dev/shm");
  if (!d) return 0;
  const uid_t me = ::getuid();
  while (dirent* ent = ::readdir(d)) {
    const std::string n = ent->d_name;
    if (n.rfind("nvtaskset.", 0) != 0) continue;
    pid_t pid = 0;
    try {
      std::size_t used = 0;
      pid = static_cast<pid_t>(std::stol(n.substr(10), &used));
      if (used != n.size() - 10) continue;
    } catch (...) {
      continue;
    }
    struct stat st {};
    if (::fstatat(::dirfd(d), ent->d_name, &st, 0) != 0) continue;
    if (me != 0 && st.st_uid != me) continue;
    bool stale = !process_alive(pid);
    if (!stale) {
      try {
        bip::shared_memory_object shm(bip::open_only, n.c_str(), bip::read_only);
        bip::offset_t size = 0;
        if (shm.get_size(size) && size >= static_cast<bip::offset_t>(sizeof(Header))) {
          bip::mapped_region map(shm, bip::read_only);
          const auto* h = static_cast<const Header*>(map.get_address());
          stale = h->magic.load(std::memory_order_acquire) == kMagic && !owned_by(*h, pid, process_start_time(pid));
        }
      } catch (...) {
      }
    }
    if (stale && bip::shared_memory_object::remove(n.c_str())) ++removed;
  }
  ::closedir(d);
  return removed;
}

std::vector<DevicePartition> Region::read_all() const { return ctl::read_all(*header_); }

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

void Region::write(const DevicePartition& dp) {
  WriterLock lock(impl_->fd());
  write_locked(*header_, dp);
}

void Region::unlink() noexcept {
  try {
    bip::shared_memory_object::remove(impl_->name.c_str());
  } catch (...) {
  }
}

}  // namespace nvtaskset::ctl
