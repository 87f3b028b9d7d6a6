// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/devices.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <stdexcept>

#include "nvtaskset/cuda_driver.hpp"
#include "nvtaskset/device_cache.hpp"
#include "nvtaskset/topology_source.hpp"

namespace nvtaskset::cli {

struct Devices::Impl {
  std::vector<std::string> shim_paths;
  std::string topology_file;
  std::unique_ptr<topo::CudaDriver> driver;
  std::vector<topo::DeviceInfo> devices;
  // Keyed by UUID: devices described by a task's region have no ordinal.
  std::map<DeviceUuid, topo::Topology> topologies;
  std::map<DeviceUuid, std::optional<topo::Topology>> known;  // without calibration
  std::vector<std::unique_ptr<topo::DeviceInfo>> from_regions;

  // The device cache (device_cache.hpp): its key is read before the driver
  // is opened, since opening it changes the environment.
  std::optional<std::string> cache_key;
  std::optional<topo::CachedDevices> cached;
  bool cache_tried = false;
  const std::string& key() {
    if (!cache_key) cache_key = topo::device_cache_key({});
    return *cache_key;
  }
  topo::CudaDriver& drv() {
    if (!driver) {
      const std::string& k = key();
      topo::DriverOptions o;
      o.locate.exclude = shim_paths;
      driver = std::make_unique<topo::CudaDriver>(o);
      devices = driver->query_devices();
      if (devices.empty()) throw std::runtime_error("no CUDA device is visible");
      if (!k.empty())
        if (const std::string why = topo::device_cache_store(k, {devices, driver->library_path()}, {}); !why.empty())
          spdlog::debug("device list not cached: {}", why);
    }
    return *driver;
  }
  // The devices for a launch: the live list once the driver is open, else
  // the cached one when it is fresh, else the driver is opened.
  const std::vector<topo::DeviceInfo>& for_launch() {
    if (!driver && !cache_tried) {
      cache_tried = true;
      cached = topo::device_cache_load(key(), {});
    }
    if (!driver && cached) return cached->devices;
    drv();
    return devices;
  }

  topo::TopologyOptions options() {
    topo::TopologyOptions o;
    o.file = topology_file;
    return o;
  }
};

namespace {

// Calibration takes seconds: show progress, as a bar on a terminal.
topo::ProgressFn progress_bar(const topo::DeviceInfo& dev) {
  const bool tty = ::isatty(2);
  spdlog::info("calibrating device {} ({})", dev.ordinal, dev.name);
  return [tty](unsigned done, unsigned total) {
    if (!tty || total == 0) return;
    const unsigned width = 40, filled = width * done / total;
    std::fprintf(stderr, "\rnvtaskset: calibrating [%s%s] %u/%u", std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total);
    if (done == total) std::fprintf(stderr, "\n");
  };
}

}  // namespace

Devices::Devices(std::vector<std::string> shim_paths, std::string topology_file) : impl_(std::make_unique<Impl>()) {
  impl_->shim_paths = std::move(shim_paths);
  impl_->topology_file = std::move(topology_file);
}

Devices::~Devices() = default;

const std::vector<topo::DeviceInfo>& Devices::all() {
  impl_->drv();
  return impl_->devices;
}

const topo::DeviceInfo& Devices::select(const std::string& spec) {
  const auto& devs = impl_->for_launch();
  const topo::DeviceInfo picked = topo::select_device(devs, spec.empty() ? "0" : spec);
  for (const auto& d : devs)
    if (d.ordinal == picked.ordinal) return d;
  throw std::runtime_error("device " + spec + " vanished");
}

const topo::DeviceInfo* Devices::from_region(const DevicePartition& dp) {
  if (!dp.desc.known() || dp.device == kAnyDevice) return nullptr;
  // The description may come from another user's status entry: the layout
  // built from it has one element per TPC, so no more than a mask can name
  // (decode_partitions refuses more too; a claimed 999999998 SMs cost every
  // user's --status 6 GB before either check).
  if (dp.desc.sm_count > 2 * Bits128::kSize || dp.desc.sm_count % 2 != 0) return nullptr;
  for (const auto& d : impl_->from_regions)
    if (d->uuid == dp.device) return d.get();
  auto d = std::make_unique<topo::DeviceInfo>();
  d->uuid = dp.device;
  d->sm_count = dp.desc.sm_count;
  d->cc_major = static_cast<int>(dp.desc.cc_major);
  d->cc_minor = static_cast<int>(dp.desc.cc_minor);
  d->driver_version = dp.desc.driver_version;
  d->name = "GPU";
  if (!known_topology(*d)) return nullptr;
  impl_->from_regions.push_back(std::move(d));
  return impl_->from_regions.back().get();
}

const topo::DeviceInfo& Devices::by_uuid(const DeviceUuid& uuid, pid_t pid) {
  for (const auto& d : all())
    if (d.uuid == uuid) return d;
  throw std::runtime_error("pid " + std::to_string(pid) + " is partitioned on " + uuid_to_string(uuid) +
                           ", which is not visible here (check CUDA_VISIBLE_DEVICES)");
}

const topo::Topology& Devices::topology(const topo::DeviceInfo& dev) {
  if (auto it = impl_->topologies.find(dev.uuid); it != impl_->topologies.end()) return it->second;
  if (const topo::Topology* t = known_topology(dev)) return impl_->topologies.emplace(dev.uuid, *t).first->second;
  topo::TopologyOptions o = impl_->options();
  o.driver = &impl_->drv();
  o.progress = progress_bar(dev);
  try {
    const topo::Topology& t = impl_->topologies.emplace(dev.uuid, topo::get_topology(dev, o)).first->second;
    for (const auto& w : t.warnings) spdlog::warn("device {}: {}", dev.ordinal, w);
    return t;
  } catch (const std::exception& e) {
    if (impl_->driver && impl_->driver->wedged()) {
      // A calibration kernel did not finish: tearing the context down could
      // block forever. Leave at once (calibration.hpp).
      std::fprintf(stderr, "nvtaskset: %s\n", e.what());
      std::fflush(stderr);
      ::_exit(1);
    }
    throw std::runtime_error("the TPC layout of device " + std::to_string(dev.ordinal) + " (compute capability " +
                             std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor) +
                             ") is unknown: " + e.what() + "; use --topology-file, or --physical");
  }
}

const topo::Topology* Devices::known_topology(const topo::DeviceInfo& dev) {
  auto it = impl_->known.find(dev.uuid);
  if (it == impl_->known.end()) {
    std::optional<topo::Topology> t;
    try {
      t = topo::get_topology(dev, impl_->options());  // no driver: never calibrates
      // Say when sources disagree (nvdebug against calibration, say).
      for (const auto& w : t->warnings) spdlog::warn("device {}: {}", dev.ordinal, w);
    } catch (const std::exception& e) {
      spdlog::debug("no topology for device {} without calibration: {}", dev.ordinal, e.what());
    }
    it = impl_->known.emplace(dev.uuid, std::move(t)).first;
  }
  return it->second ? &*it->second : nullptr;
}

std::string Devices::driver_path() {
  if (!impl_->driver && impl_->cached) return impl_->cached->driver_path;
  return impl_->drv().library_path();
}

void Devices::restore_environment() {
  if (impl_->driver) impl_->driver->restore_environment();
}

namespace {

// --topology's and --calibrate's output: every layout found, then the status.
int print_topologies(const std::vector<topo::Topology>& topos, bool json, int status) {
  const std::string out = json ? topo::render_topology_json(topos) : topo::render_topology(topos);
  std::fputs(out.c_str(), stdout);
  if (!out.empty() && out.back() != '\n') std::fputc('\n', stdout);
  return status;
}

}  // namespace

int Devices::print(bool json) {
  std::vector<topo::Topology> topos;
  int status = 0;
  for (const auto& d : all()) {
    try {
      topos.push_back(topology(d));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nvtaskset: %s\n", e.what());
      status = 1;
    }
  }
  return print_topologies(topos, json, status);
}

int Devices::calibrate_all(bool json) {
  std::vector<topo::Topology> topos;
  int status = 0;
  for (const auto& d : all()) {
    topo::TopologyOptions o = impl_->options();
    o.file.clear();
    o.use_env = false;  // --calibrate measures; it never reads a topology file
    o.recalibrate = true;
    o.driver = &impl_->drv();
    o.progress = progress_bar(d);
    try {
      topo::Topology t = topo::get_topology(d, o);
      std::fprintf(stderr, "nvtaskset: device %u: %zu TPCs, %zu GPCs, from %s\n", d.ordinal, t.tpcs.size(),
                   t.gpcs.size(), t.source.c_str());
      impl_->topologies[d.uuid] = t;
      topos.push_back(std::move(t));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nvtaskset: device %u: calibration failed: %s\n", d.ordinal, e.what());
      status = 1;
    }
  }
  return print_topologies(topos, json, status);
}

}  // namespace nvtaskset::cli
