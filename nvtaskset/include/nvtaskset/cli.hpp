// SPDX-License-Identifier: Apache-2.0
// The nvtaskset command line, as a library so tests and benchmarks can run it.
#pragma once

#include "nvtaskset/task_role.hpp"

#include <string>
#include <vector>

namespace nvtaskset::cli {

// Runs the command line. Returns the exit status (and does not return at all
// when it execs the task).
int run(int argc, char** argv);

// Directory of the shim (holding libcuda.so.1) for a CLI installed or built
// at `exe_path`: <exe dir>/../lib/nvtaskset, in both the install layout
// (bin/nvtaskset + lib/nvtaskset/libcuda.so.1) and the build tree.
// $NVTASKSET_SHIM_DIR overrides. Returns "" when there is none.
std::string find_shim_dir(const std::string& exe_path);

// The environment for the task: `env` (NAME=VALUE strings) with
// NVTASKSET_PARTITION set, the shim directory prepended to LD_LIBRARY_PATH
// (never replacing it), for an MPS client CUDA_DEVICE_MAX_CONNECTIONS=8 unless
// already set and CUDA_DEVICE_MAX_COPY_CONNECTIONS=2 unless either is set, and
// NVTASKSET_REAL_LIBCUDA pinned to the driver the CLI found, and
// NVTASKSET_SM_COUNT=partition with `partition_sm_count`.
// With a role (task_role.hpp), NVTASKSET_ROLE and, for a latency-critical task,
// NVTASKSET_BURST_POOL, for a best-effort one NVTASKSET_CLUSTER_MAP where
// the layout is known; without one, none (a launch from inside a task with
// a role does not inherit them).
struct TaskRole {
  roles::Role role = roles::Role::kNone;
  std::string burst_pool;   // encode_partitions() of every working TPC per GPU
  std::string cluster_map;  // best-effort: encode_cluster_maps() of its GPUs (NVTASKSET_CLUSTER_MAP)
};
// NVTASKSET_PARTITION_PID is `partition_pid` (0: this process, which execs
// the task and so keeps its PID).
std::vector<std::string> task_environment(std::vector<std::string> env, const std::string& shim_dir,
                                          const std::string& partitions, const std::string& real_driver,
                                          bool partition_sm_count = false, bool mps_client = true,
                                          const TaskRole& role = {}, pid_t partition_pid = 0);

}  // namespace nvtaskset::cli
