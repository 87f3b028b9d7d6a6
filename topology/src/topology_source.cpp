// SPDX-License-Identifier: Apache-2.0
// get_topology(): topology file, cache, identity + nvdebug, calibration.
#include "nvtaskset/topology_source.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <pwd.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "nvtaskset/calibration.hpp"
#include "nvtaskset/cuda_driver.hpp"
#include "nvtaskset/nvdebug.hpp"
#include "nvtaskset/topology_json.hpp"
#include "nvtaskset/trusted_file.hpp"

namespace nvtaskset::topo {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string user_cache_dir() {
  const std::string xdg = env("XDG_CACHE_HOME");
  // The XDG base directory spec: relative values are invalid and ignored.
  if (!xdg.empty() && xdg[0] == '/') return (fs::path(xdg) / "nvtaskset").string();
  std::string home = env("HOME");
  if (home.empty()) {
    if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  }
  if (home.empty()) return "";
  return (fs::path(home) / ".cache" / "nvtaskset").string();
}

// Writable now, or creatable because its nearest existing parent is.
bool writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::path p(dir);
  if (fs::exists(p, ec)) return fs::is_directory(p, ec) && ::access(p.c_str(), W_OK | X_OK) == 0;
  for (fs::path q = p.parent_path(); !q.empty(); q = q.parent_path()) {
    if (fs::exists(q, ec)) return fs::is_directory(q, ec) && ::access(q.c_str(), W_OK | X_OK) == 0;
    if (q == q.root_path()) break;
  }
  return false;
}

std::string describe_device(const DeviceInfo& d) {
  return fmt::format("device {} ({}, {})", d.ordinal, d.name, uuid_to_string(d.uuid));
}

// Bounds on files nvtaskset reads but did not necessarily write. A cache
// file holds one GPU (under 20 KiB pretty-printed at the 128 TPCs a mask can
// name); a topology file may describe many GPUs.
constexpr std::size_t kMaxCacheBytes = 256 * 1024;
constexpr std::size_t kMaxTopologyFileBytes = 4 * 1024 * 1024;

// A topology file read as every shared file is (trusted_file.hpp): the path
// may come from the environment, which `sudo -E` hands to root unchanged.
std::vector<Topology> load_trusted(const std::string& path, std::size_t max_bytes) {
  ctl::TrustedRead r = ctl::read_trusted_file(path, max_bytes);
  if (r.ok()) r.error = ctl::check_trusted_parent(path);
  if (!r.ok()) throw std::runtime_error(r.error);
  try {
    return topologies_from_text(r.text);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("{}: {}", path, e.what()));
  }
}

Topology from_file(const DeviceInfo& dev, const std::string& path) {
  std::vector<Topology> all;
  try {
    all = load_trusted(path, kMaxTopologyFileBytes);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("topology file {}", e.what()));
  }
  for (Topology& t : all) {
    if (t.device.uuid != dev.uuid) continue;
    if (t.device.sm_count != dev.sm_count)
      throw std::runtime_error(fmt::format("topology file {}: {} has {} SMs, but the file says {}", path,
                                           describe_device(dev), dev.sm_count, t.device.sm_count));
    if (t.device.cc_major != dev.cc_major || t.device.cc_minor != dev.cc_minor)
      throw std::runtime_error(fmt::format("topology file {}: {} is cc {}.{}, but the file says {}.{}", path,
                                           describe_device(dev), dev.cc_major, dev.cc_minor, t.device.cc_major,
                                           t.device.cc_minor));
    // The live device's identity (ordinal, name, PCI ID) wins over the file's.
    t.device = dev;
    t.source = "file";
    spdlog::debug("topology of {} from file {}", describe_device(dev), path);
    return t;
  }
  std::string listed;
  for (const auto& t : all) listed += (listed.empty() ? "" : ", ") + uuid_to_string(t.device.uuid);
  throw std::runtime_error(fmt::format("topology file {} does not describe {} (it describes {})", path,
                                       describe_device(dev), listed));
}

std::string nvdebug_root(const TopologyOptions& opts) {
  if (!opts.nvdebug_root.empty()) return opts.nvdebug_root;
  if (opts.use_env) {
    if (std::string r = env(kNvdebugRootEnv); !r.empty()) return r;
  }
  return "/proc";
}

// nullopt: nvdebug not available (note says why); throws on malformed files.
std::optional<NvdebugLayout> find_nvdebug(const DeviceInfo& dev, const TopologyOptions& opts, std::string* note) {
  const std::string root = nvdebug_root(opts);
  std::optional<unsigned> idx = opts.nvdebug_index;
  if (!idx) idx = nvdebug_index_of(dev.pci_bus_id, opts.sysfs_pci_root);
  if (!idx) {
    // A device known only from a task's control region (nvtaskset -p) has
    // no PCI bus id; "is PCI device )" named nothing.
    *note = dev.pci_bus_id.empty()
                ? fmt::format("nvdebug: cannot tell which {}/gpuN is {}: its PCI bus id is unknown", root,
                              uuid_to_string(dev.uuid))
                : fmt::format("nvdebug: cannot tell which {}/gpuN is PCI device {}", root, dev.pci_bus_id);
    return std::nullopt;
  }
  auto nv = read_nvdebug(root, *idx);
  if (!nv) *note = fmt::format("the nvdebug kernel module is not loaded ({}/gpu{} is absent)", root, *idx);
  return nv;
}

}  // namespace

std::vector<std::string> cache_read_dirs(const TopologyOptions& opts) {
  if (!opts.cache_dir.empty()) return {opts.cache_dir};
  std::vector<std::string> dirs;
  if (!opts.system_cache_dir.empty()) dirs.push_back(opts.system_cache_dir);
  if (std::string u = user_cache_dir(); !u.empty() && u != opts.system_cache_dir) dirs.push_back(u);
  return dirs;
}

std::string cache_write_dir(const TopologyOptions& opts) {
  if (!opts.cache_dir.empty()) return opts.cache_dir;
  if (!opts.system_cache_dir.empty() && writable_dir(opts.system_cache_dir)) return opts.system_cache_dir;
  return user_cache_dir();
}

std::string cache_file_name(const DeviceInfo& dev) {
  return fmt::format("{}-cuda{}.json", uuid_to_string(dev.uuid), dev.driver_version);
}

std::optional<Topology> cache_load(const DeviceInfo& dev, const TopologyOptions& opts) {
  for (const std::string& dir : cache_read_dirs(opts)) {
    const std::string path = (fs::path(dir) / cache_file_name(dev)).string();
    // Never followed, never waited on, never read past kMaxCacheBytes, and
    // used only when no other user could have written it (a cache directory
    // another user can write, e.g. a shared XDG_CACHE_HOME kept by `sudo -E`,
    // moved root's TPCs). Such a file is a miss: the layout is measured anew.
    ctl::TrustedRead r = ctl::read_trusted_file(path, kMaxCacheBytes);
    if (r.absent) continue;
    if (r.ok()) r.error = ctl::check_trusted_dir(dir);
    if (!r.ok()) {
      spdlog::warn("topology cache not used: {}", r.error);
      continue;
    }
    try {
      std::vector<Topology> all;
      try {
        all = topologies_from_text(r.text);
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(fmt::format("{}: {}", path, e.what()));
      }
      if (all.size() != 1) throw std::runtime_error(path + ": expected one device");
      Topology& t = all[0];
      const DeviceInfo& c = t.device;
      std::string miss;
      if (c.uuid != dev.uuid)
        miss = "another GPU";
      else if (c.driver_version != dev.driver_version)
        miss = fmt::format("driver version {} (now {})", c.driver_version, dev.driver_version);
      else if (!dev.driver_release.empty() && c.driver_release != dev.driver_release)
        miss = fmt::format("driver release {} (now {})", c.driver_release, dev.driver_release);
      else if (c.sm_count != dev.sm_count)
        miss = fmt::format("{} SMs (now {})", c.sm_count, dev.sm_count);
      else if (!t.bits_known())
        miss = "incomplete bit map";
      if (!miss.empty()) {
        spdlog::debug("cache {}: stale ({})", path, miss);
        continue;
      }
      t.device = dev;
      spdlog::debug("topology of {} from cache {}", describe_device(dev), path);
      return t;
    } catch (const std::exception& e) {
      spdlog::warn("ignoring corrupt topology cache: {}", e.what());
    }
  }
  return std::nullopt;
}

std::string cache_store(const Topology& t, const TopologyOptions& opts, std::string* why) {
  const std::string dir = cache_write_dir(opts);
  if (dir.empty()) {
    *why = "no cache directory (neither HOME nor XDG_CACHE_HOME is set)";
    return "";
  }
  // 0755 whatever the umask: a directory this program creates must pass the
  // check its readers make. One that does not pass gets nothing written.
  if (std::string e = ctl::make_trusted_dirs(dir, 0755); !e.empty()) {
    *why = e;
    return "";
  }
  if (std::string e = ctl::check_trusted_dir(dir); !e.empty()) {
    *why = e;
    return "";
  }
  const std::string path = (fs::path(dir) / cache_file_name(t.device)).string();
  try {
    save_topology_file(path, {t});
  } catch (const std::exception& e) {
    *why = e.what();
    return "";
  }
  spdlog::debug("topology of {} cached in {}", describe_device(t.device), path);
  return path;
}

Topology get_topology(const DeviceInfo& dev, const TopologyOptions& opts) {
  // 1. An explicit topology file.
  std::string file = opts.file;
  if (file.empty() && opts.use_env) file = env(kTopologyFileEnv);
  if (!file.empty()) return from_file(dev, file);

  // 2. The cache.
  if (opts.use_cache && !opts.recalibrate && !dev.mask_bits_are_logical()) {
    if (auto t = cache_load(dev, opts)) return *t;
  }

  // 3. Before Hopper: identity bits (verified on the GPU when asked), GPCs
  // from nvdebug or unknown.
  if (dev.mask_bits_are_logical()) {
    Topology t;
    if (opts.recalibrate) {
      if (!opts.driver) throw std::runtime_error(fmt::format("calibrating {} needs the CUDA driver", describe_device(dev)));
      t = calibrate(*opts.driver, dev, opts.progress, opts.calibration);
    } else {
      auto id = identity_topology(dev);
      if (!id)
        throw std::runtime_error(fmt::format("{} claims {} SMs, more than a TPC mask can name", describe_device(dev),
                                             dev.sm_count));
      t = std::move(*id);
    }
    std::string note;
    try {
      if (auto nv = find_nvdebug(dev, opts, &note)) {
        apply_nvdebug_gpcs(t, *nv);
      } else {
        t.gpc_note = "GPUs before Hopper have no thread-block clusters to find GPCs with, and " + note;
      }
    } catch (const std::exception& e) {
      // -t lists still work without GPCs; -g reports this note.
      t.gpc_note = e.what();
      spdlog::warn("{}", e.what());
    }
    return t;
  }

  // 4. Hopper and newer: measure, never guess.
  if (!opts.driver)
    throw std::runtime_error(
        fmt::format("{} needs calibration (its mask bits are physical TPC slots), but no CUDA driver is open",
                    describe_device(dev)));
  spdlog::debug("calibrating {}: its TPC mask bits are physical slots (once per driver version)",
               describe_device(dev));
  Topology t = calibrate(*opts.driver, dev, opts.progress, opts.calibration);
  std::string note;
  try {
    if (auto nv = find_nvdebug(dev, opts, &note)) merge_nvdebug(t, *nv);
  } catch (const std::exception& e) {
    const std::string w = std::string("nvdebug not used: ") + e.what();
    spdlog::warn("{}", w);
    t.warnings.push_back(w);
  }
  if (opts.use_cache) {
    std::string why;
    if (cache_store(t, opts, &why).empty()) spdlog::warn("topology of {} not cached: {}", describe_device(dev), why);
  }
  return t;
}

}  // namespace nvtaskset::topo
