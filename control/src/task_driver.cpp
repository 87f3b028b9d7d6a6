// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/task_driver.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "nvtaskset/driver_locate.hpp"

namespace nvtaskset::ctl {
namespace {

// Bounds on what a task's maps make us read: a large PyTorch process maps
// a few thousand regions of a few hundred files.
constexpr std::size_t kMaxMapsBytes = 8u * 1024 * 1024;
constexpr std::size_t kMaxFiles = 4096;

// The whole of /proc/<pid>/maps (it is generated as it is read), or nothing
// with errno set.
bool read_maps(pid_t pid, std::string* out) {
  const std::string path = "/proc/" + std::to_string(pid) + "/maps";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || out->size() >= kMaxMapsBytes) break;
    out->append(buf, static_cast<std::size_t>(n));
  }
  const int err = errno;
  ::close(fd);
  errno = err;
  // An empty maps file: a zombie, or a kernel thread.
  return true;
}

struct MappedFile {
  std::string path;  // as the task sees it
  std::string dev_ino;
};

// The distinct files mapped, from lines "addr perms offset dev inode path".
std::vector<MappedFile> mapped_files(const std::string& maps) {
  std::vector<MappedFile> out;
  std::set<std::string> seen;
  std::size_t at = 0;
  while (at < maps.size() && out.size() < kMaxFiles) {
    std::size_t end = maps.find('\n', at);
    if (end == std::string::npos) end = maps.size();
    const std::string_view line(maps.data() + at, end - at);
    at = end + 1;
    // Five fields, then the path (which may hold spaces).
    std::size_t pos = 0;
    std::string_view field[5];
    bool ok = true;
    for (auto& f : field) {
      while (pos < line.size() && line[pos] == ' ') ++pos;
      const std::size_t s = pos;
      while (pos < line.size() && line[pos] != ' ') ++pos;
      f = line.substr(s, pos - s);
      ok = ok && !f.empty();
    }
    while (pos < line.size() && line[pos] == ' ') ++pos;
    if (!ok || pos >= line.size() || line[pos] != '/' || field[4] == "0") continue;
    std::string path(line.substr(pos));
    if (path.ends_with(" (deleted)")) path.resize(path.size() - std::strlen(" (deleted)"));
    std::string id = std::string(field[3]) + ":" + std::string(field[4]);
    if (seen.insert(id).second) out.push_back({std::move(path), std::move(id)});
  }
  return out;
}

}  // namespace

DriverUse task_driver_use(pid_t pid, std::optional<bool> hooked) {
  DriverUse u;
  std::string maps;
  if (pid <= 0 || !read_maps(pid, &maps)) {
    u.why = std::string("its memory map cannot be read: ") + std::strerror(errno);
    return u;
  }
  // Opened through /proc/<pid>/root: the file the task mapped, also when it
  // runs in another mount namespace (a container).
  const std::string root = "/proc/" + std::to_string(pid) + "/root";
  bool shim = false;
  std::vector<std::string> drivers;
  for (const MappedFile& f : mapped_files(maps)) {
    // Shared libraries only: skip what cannot be one cheaply.
    if (f.path.starts_with("/dev/") || f.path.starts_with("/memfd:") || f.path.starts_with("/SYSV")) continue;
    switch (library_kind(root + f.path)) {
      case LibraryKind::kShim: shim = true; break;
      case LibraryKind::kDriver: drivers.push_back(f.path); break;
      default: break;
    }
  }
  if (drivers.empty()) {
    u.state = DriverUse::State::kNotLoaded;
  } else if (!shim) {
    u.state = DriverUse::State::kBypassed;
    u.why = "the CUDA driver " + drivers[0] +
            " is loaded without nvtaskset's shim (LD_LIBRARY_PATH and LD_PRELOAD replaced, or the driver loaded by "
            "its path)";
  } else if (drivers.size() > 1) {
    u.state = DriverUse::State::kBypassed;
    u.why = "a second CUDA driver, " + drivers[1] + ", is loaded beside " + drivers[0] +
            ", and nvtaskset's shim hooks only one";
  } else if (hooked.has_value() && !*hooked) {
    u.state = DriverUse::State::kBypassed;
    u.why = "the CUDA driver " + drivers[0] + " was loaded by the program itself, and nvtaskset's shim hooks none";
  } else {
    u.state = DriverUse::State::kThroughShim;
  }
  return u;
}

}  // namespace nvtaskset::ctl
