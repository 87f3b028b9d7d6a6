// SPDX-License-Identifier: Apache-2.0
// The device list a launch needs, without initialising the CUDA driver.
//
// To turn `-d 1` (or the default device 0) into a GPU UUID, SM count and
// compute capability, the CLI used to open the driver and call cuInit: about
// 150 ms on an idle H100, which made a `--no-mps` launch 1.83x a plain CUDA
// program (docs/results.md). The task initialises the driver anyway. So the
// CLI keeps what cuInit told it in a per-user cache file and reuses it only
// while nothing that decides CUDA's device enumeration has changed, which it
// can read from procfs and the environment without the driver:
//   * the kernel driver's release (/proc/driver/nvidia/version);
//   * every GPU the kernel driver has bound, with its UUID, bus location and
//     excluded state (/proc/driver/nvidia/gpus/*/information);
//   * the MIG instances that exist (/proc/driver/nvidia/capabilities);
//   * this boot (/proc/sys/kernel/random/boot_id);
//   * CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, NVTASKSET_REAL_LIBCUDA;
//   * the user-space driver file the list came from (path, inode, size,
//     modification time).
// The whole description is the cache key, stored in the file and compared
// byte for byte. Any difference, an unreadable procfs, a file not owned by
// this user or writable by others, or one that does not parse, is a miss:
// the CLI initialises the driver as before and rewrites the cache. Without
// /proc/driver/nvidia (no NVIDIA kernel driver: the CPU tests' stand-in) the
// cache is never used.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo {

struct DeviceCacheOptions {
  std::string dir;        // "" = $XDG_CACHE_HOME/nvtaskset or ~/.cache/nvtaskset
  std::string proc_root;  // "" = $NVTASKSET_NVDEBUG_ROOT (tests), else /proc
};

struct CachedDevices {
  std::vector<DeviceInfo> devices;
  std::string driver_path;  // the real libcuda the list came from
};

// The description of everything above, or "" when procfs does not describe
// the GPUs (then there is no cache). `driver_path` is "" before the driver is
// located: the file's identity is then checked against the cached path.
std::string device_cache_key(const DeviceCacheOptions& opts);

// The cached list, when the cache is fresh for `key`; nullopt on any miss
// (logged at debug with the reason).
std::optional<CachedDevices> device_cache_load(const std::string& key, const DeviceCacheOptions& opts);

// Stores the list for `key` (atomically; owner-only). Returns "" or why not.
std::string device_cache_store(const std::string& key, const CachedDevices& c, const DeviceCacheOptions& opts);

}  // namespace nvtaskset::topo
