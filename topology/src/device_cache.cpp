// SPDX-License-Identifier: Apache-2.0
// The device list a launch needs, without initialising the CUDA driver:
// see device_cache.hpp.
#include "nvtaskset/device_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "nvtaskset/options.hpp"
#include "nvtaskset/topology_source.hpp"
#include "nvtaskset/trusted_file.hpp"

namespace nvtaskset::topo {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSchema = "nvtaskset-devices/1";
// Bounds: procfs files are small; anything larger is not what we expect.
constexpr std::size_t kMaxFile = 64 * 1024;
constexpr std::size_t kMaxEntries = 4096;
// More GPUs than any one machine holds: a list longer than this is not one
// this CLI wrote.
constexpr std::size_t kMaxCachedDevices = 64;

std::optional<std::string> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  // In small reads: these files are a few hundred bytes, and every launch
  // reads several (a buffer of kMaxFile filled up front cost more than the
  // reading).
  std::string s;
  char buf[4096];
  while (s.size() <= kMaxFile && in.read(buf, sizeof buf).gcount() > 0)
    s.append(buf, static_cast<std::size_t>(in.gcount()));
  if (s.size() > kMaxFile) return std::nullopt;
  return s;
}

std::string env_or(const char* name, const char* unset) {
  const char* v = std::getenv(name);
  return v ? std::string("=") + v : std::string(unset);
}

std::string proc_root(const DeviceCacheOptions& o) {
  if (!o.proc_root.empty()) return o.proc_root;
  if (const char* r = option_value(Option::kNvdebugRoot)) return r;
  return "/proc";
}

std::string cache_dir(const DeviceCacheOptions& o) {
  if (!o.dir.empty()) return o.dir;
  TopologyOptions t;
  t.system_cache_dir.clear();  // per user only: the key holds this user's environment
  return cache_write_dir(t);
}

std::string file_for(const std::string& key, const DeviceCacheOptions& o) {
  const std::string dir = cache_dir(o);
  if (dir.empty()) return "";
  return (fs::path(dir) / fmt::format("devices-{:016x}.json", std::hash<std::string>{}(key))).string();
}

// "dev ino size mtime" of a file, or "" when it cannot be stat'ed.
std::string file_identity(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return "";
  return fmt::format("{}:{}:{}:{}.{}", st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

json device_to_json(const DeviceInfo& d) {
  return {{"ordinal", d.ordinal},          {"name", d.name},           {"uuid", uuid_to_string(d.uuid)},
          {"pci_bus_id", d.pci_bus_id},    {"cc_major", d.cc_major},   {"cc_minor", d.cc_minor},
          {"sm_count", d.sm_count},        {"driver_version", d.driver_version},
          {"driver_release", d.driver_release}};
}

DeviceInfo device_from_json(const json& j) {
  DeviceInfo d;
  d.ordinal = j.at("ordinal").get<unsigned>();
  d.name = j.at("name").get<std::string>();
  const auto u = uuid_from_string(j.at("uuid").get<std::string>());
  if (!u) throw std::runtime_error("bad uuid");
  d.uuid = *u;
  d.pci_bus_id = j.at("pci_bus_id").get<std::string>();
  d.cc_major = j.at("cc_major").get<int>();
  d.cc_minor = j.at("cc_minor").get<int>();
  d.sm_count = j.at("sm_count").get<unsigned>();
  d.driver_version = j.at("driver_version").get<int>();
  d.driver_release = j.at("driver_release").get<std::string>();
  // A TPC mask names at most 128 TPCs of 2 SMs.
  if (d.sm_count == 0 || d.sm_count % 2 != 0 || d.sm_count > 2 * Bits128::kSize) throw std::runtime_error("bad sm_count");
  return d;
}

}  // namespace

std::string device_cache_key(const DeviceCacheOptions& opts) {
  const fs::path nv = fs::path(proc_root(opts)) / "driver" / "nvidia";
  const auto version = slurp(nv / "version");
  std::error_code ec;
  if (!version || !fs::is_directory(nv / "gpus", ec)) return "";
  std::ostringstream k;
  k << kSchema << "\nuid " << ::geteuid() << "\n";
  k << "CUDA_VISIBLE_DEVICES" << env_or("CUDA_VISIBLE_DEVICES", " unset") << "\n";
  k << "CUDA_DEVICE_ORDER" << env_or("CUDA_DEVICE_ORDER", " unset") << "\n";
  k << option(Option::kRealLibcuda).name << env_or(option(Option::kRealLibcuda).name, " unset") << "\n";
  const auto boot = slurp("/proc/sys/kernel/random/boot_id");
  k << "boot " << (boot ? *boot : "unknown\n");
  k << "version " << *version;
  std::vector<std::string> gpus;
  for (fs::directory_iterator it(nv / "gpus", ec), end; !ec && it != end && gpus.size() < kMaxEntries;
       it.increment(ec)) {
    const auto info = slurp(it->path() / "information");
    if (!info) return "";  // a GPU we cannot describe: no cache
    gpus.push_back("gpu " + it->path().filename().string() + "\n" + *info);
  }
  if (ec) return "";
  std::sort(gpus.begin(), gpus.end());
  for (const auto& g : gpus) k << g;
  // MIG: the instances that exist decide which CUDA devices there are.
  std::vector<std::string> caps;
  const fs::path cap_root = nv / "capabilities";
  if (fs::is_directory(cap_root, ec)) {
    for (fs::recursive_directory_iterator it(cap_root, fs::directory_options::skip_permission_denied, ec), end;
         !ec && it != end && caps.size() < kMaxEntries; it.increment(ec))
      caps.push_back(fs::relative(it->path(), cap_root, ec).string());
    std::sort(caps.begin(), caps.end());
  }
  for (const auto& c : caps) k << "cap " << c << "\n";
  return k.str();
}

std::optional<CachedDevices> device_cache_load(const std::string& key, const DeviceCacheOptions& opts) {
  if (key.empty()) return std::nullopt;
  const std::string path = file_for(key, opts);
  if (path.empty()) return std::nullopt;
  auto miss = [&](const std::string& why) -> std::optional<CachedDevices> {
    spdlog::debug("device cache {}: not used ({})", path, why);
    return std::nullopt;
  };
  // As every shared file (trusted_file.hpp): a FIFO planted here hung the
  // launch in open(), before O_NONBLOCK. A file that fails is a miss, said
  // in one line: the driver is asked instead, and the store replaces it.
  ctl::TrustedRead r = ctl::read_trusted_file(path, kMaxFile);
  if (r.absent) return miss("absent");
  if (r.ok()) r.error = ctl::check_trusted_parent(path);
  if (!r.ok()) {
    spdlog::warn("device cache not used: {}", r.error);
    return std::nullopt;
  }
  try {
    const json j = json::parse(r.text);
    if (j.at("schema").get<std::string>() != kSchema) return miss("another schema");
    if (j.at("key").get<std::string>() != key) return miss("the GPUs, driver or environment changed");
    CachedDevices c;
    c.driver_path = j.at("driver").at("path").get<std::string>();
    if (file_identity(c.driver_path) != j.at("driver").at("identity").get<std::string>())
      return miss("the driver file " + c.driver_path + " changed");
    if (!j.at("devices").is_array() || j.at("devices").size() > kMaxCachedDevices) return miss("too many devices");
    for (const json& d : j.at("devices")) c.devices.push_back(device_from_json(d));
    if (c.devices.empty()) return miss("no devices");
    for (std::size_t i = 0; i < c.devices.size(); ++i)
      if (c.devices[i].ordinal != i) return miss("ordinals out of order");
    spdlog::debug("device list from cache {}", path);
    return c;
  } catch (const std::exception& e) {
    return miss(std::string("unreadable: ") + e.what());
  }
}

std::string device_cache_store(const std::string& key, const CachedDevices& c, const DeviceCacheOptions& opts) {
  if (key.empty()) return "procfs does not describe the GPUs";
  const std::string path = file_for(key, opts);
  if (path.empty()) return "no cache directory (neither HOME nor XDG_CACHE_HOME is set)";
  const std::string identity = file_identity(c.driver_path);
  if (identity.empty()) return "cannot stat the driver file " + c.driver_path;
  json j{{"schema", kSchema}, {"key", key}, {"driver", {{"path", c.driver_path}, {"identity", identity}}}};
  j["devices"] = json::array();
  for (const DeviceInfo& d : c.devices) j["devices"].push_back(device_to_json(d));
  const std::string dir = fs::path(path).parent_path().string();
  if (std::string e = ctl::make_trusted_dirs(dir, 0755); !e.empty()) return e;
  if (std::string e = ctl::check_trusted_dir(dir); !e.empty()) return e;
  const std::string tmp = path + fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot write " + tmp;
  const std::string text = j.dump(1);
  const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!wrote || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return "cannot write " + path;
  }
  spdlog::debug("device list cached in {}", path);
  return "";
}

}  // namespace nvtaskset::topo
