// SPDX-License-Identifier: Apache-2.0
// Where a device's topology comes from, in order:
//   1. a topology file (TopologyOptions::file, else $NVTASKSET_TOPOLOGY); it
//      must describe this device's UUID (a file may list several GPUs);
//   2. the cache: one JSON file per GPU UUID and driver version, in
//      /var/cache/nvtaskset when writable, else $XDG_CACHE_HOME/nvtaskset,
//      else ~/.cache/nvtaskset;
//   3. before Hopper: identity bits; GPCs from nvdebug when /proc/gpuN exists,
//      else unknown;
//   4. Hopper and newer: calibration on the GPU, cached for next time.
// Calibration failure is an error: the layout is never guessed.
#pragma once

#include "nvtaskset/options.hpp"

#include <optional>
#include <string>
#include <vector>

#include "nvtaskset/calibration.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo {

class CudaDriver;

inline constexpr const char* kTopologyFileEnv = option(Option::kTopology).name;
inline constexpr const char* kNvdebugRootEnv = option(Option::kNvdebugRoot).name;
inline constexpr const char* kSystemCacheDir = "/var/cache/nvtaskset";

struct TopologyOptions {
  std::string file;            // --topology-file; empty: $NVTASKSET_TOPOLOGY (when use_env)
  bool use_env = true;         // honour NVTASKSET_TOPOLOGY and NVTASKSET_NVDEBUG_ROOT
  bool use_cache = true;       // read and write the cache
  std::string cache_dir;       // overrides the cache directory choice (tests)
  std::string system_cache_dir = kSystemCacheDir;  // tests
  bool recalibrate = false;    // --calibrate: skip the cache and measure (pre-Hopper: verify identity)
  std::string nvdebug_root;    // default $NVTASKSET_NVDEBUG_ROOT, else /proc
  std::optional<unsigned> nvdebug_index;  // default: from the PCI bus ID (nvdebug_index_of)
  std::string sysfs_pci_root = "/sys/bus/pci/devices";
  CudaDriver* driver = nullptr;  // needed to calibrate; without it calibration is an error
  ProgressFn progress;           // calibration progress
  CalibrationOptions calibration;
};

Topology get_topology(const DeviceInfo& dev, const TopologyOptions& opts);

// Cache plumbing (exposed for tests and `nvtaskset --calibrate` messages).
// Directories searched, in order: cache_dir alone when set; else the system
// directory, then the user one.
std::vector<std::string> cache_read_dirs(const TopologyOptions& opts);
// Where a new result goes: cache_dir when set; else the system directory
// when it is writable (or creatable); else $XDG_CACHE_HOME/nvtaskset (when
// absolute) or ~/.cache/nvtaskset.
std::string cache_write_dir(const TopologyOptions& opts);
// "GPU-<uuid>-cuda<driver_version>.json"
std::string cache_file_name(const DeviceInfo& dev);
// A cached topology for exactly this UUID, driver version, driver release and
// SM count; nullopt on a miss. A corrupt cache file is a miss (logged).
std::optional<Topology> cache_load(const DeviceInfo& dev, const TopologyOptions& opts);
// Stores; returns the path written, or "" with *why set.
std::string cache_store(const Topology& t, const TopologyOptions& opts, std::string* why);

}  // namespace nvtaskset::topo
