// SPDX-License-Identifier: Apache-2.0
// The CLI's view of the GPUs: queried from the real driver once, on first
// use, with topologies fetched (or calibrated) per device as lists need them.
// It is the planner's source of layouts (planner.hpp, Layouts).
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nvtaskset/partition.hpp"
#include "nvtaskset/planner.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::cli {

class Devices : public planner::Layouts {
 public:
  // shim_paths: shim copies the driver search must skip. topology_file: the
  // --topology-file / $NVTASKSET_TOPOLOGY override ("" for none).
  Devices(std::vector<std::string> shim_paths, std::string topology_file);
  ~Devices() override;

  const std::vector<topo::DeviceInfo>& all();
  // "" selects device 0; else an index, UUID or PCI bus id. Without cuInit
  // when the device cache is fresh (device_cache.hpp).
  const topo::DeviceInfo& select(const std::string& spec);
  // The device a task's region describes, when the description is complete
  // and its layout is known without the driver (cache, file, identity);
  // nullptr otherwise. Costs no cuInit.
  const topo::DeviceInfo* from_region(const DevicePartition& dp);
  // The visible device with this UUID (the one a task was partitioned on).
  const topo::DeviceInfo& by_uuid(const DeviceUuid& uuid, pid_t pid);

  // The layout, calibrating when needed. Throws with a one-line reason.
  const topo::Topology& topology(const topo::DeviceInfo& dev) override;
  // The layout when it is known without calibrating (file, cache, identity).
  const topo::Topology* known_topology(const topo::DeviceInfo& dev) override;

  // The real driver library the query (or the fresh device cache) names.
  std::string driver_path();
  // Undo what querying the driver did to this process's environment
  // (CUDA_MPS_PIPE_DIRECTORY), before starting or looking for MPS.
  void restore_environment();

  // --topology and --calibrate; return the exit status.
  int print(bool json);
  int calibrate_all(bool json);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvtaskset::cli
