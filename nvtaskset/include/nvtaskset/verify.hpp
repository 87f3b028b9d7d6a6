// SPDX-License-Identifier: Apache-2.0
// `nvtaskset --verify`: checks on the user's own GPU, with this GPU's layout
// (cache, calibration or --topology-file), that kernels under nvtaskset run on
// exactly their TPCs.
//
// It starts a probe process (this same executable, with kProbeArg) that loads
// the shim the way a task does, so the partitions reach the kernels through
// the real path: the shim's control region, its launch callback, the TMD
// layout code. The first partition comes in NVTASKSET_PARTITION, as for a
// launched task; every later one is written into the probe's control region,
// as `nvtaskset -p` writes it. For each, the probe launches the block-SM
// kernel (topology/block_probe.hpp), outside MPS, and reports the %smid of
// every block; a block on an SM outside the partition (logical TPC k = SMs
// 2k and 2k+1, docs/hardware.md) is a violation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nvtaskset/partition.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::cli::verify {

struct Options {
  std::string device;               // -d ("" = device 0)
  std::optional<std::string> seed;  // --seed (none: a random seed, printed)
  std::string topology_file;        // --topology-file / NVTASKSET_TOPOLOGY ("" = cache or calibration)
  std::string shim_dir;             // where libcuda.so.1 (the shim) is; "" when there is none
};

// Prints one verdict line per partition and a summary to stdout. Returns 0
// when every block of every partition ran inside it, 2 when some did not (or
// a kernel never finished). Throws std::runtime_error with one line on
// errors (no GPU, bad -d, no shim, a probe process that fails).
int run(const Options& o);

// The first argument with which --verify starts its probe process.
inline constexpr const char* kProbeArg = "--internal-verify-probe";
// main() of the probe process: `nvtaskset --internal-verify-probe SHIM UUID`.
// Reads commands on stdin ("run", "quit"), answers on stdout.
int probe_main(int argc, char** argv);

// A partition to check and how a user would ask for it ("-t 0-7", "-g 2").
struct Planned {
  std::string label;
  Partition partition;
};

// How many random TPC lists a run checks.
inline constexpr unsigned kRandomLists = 20;

// The partitions to check, in order: every TPC; the first TPC; the last;
// each GPC alone and two pairs of GPCs (when GPCs are known); kRandomLists
// random TPC lists drawn from `seed`. The same seed gives the same lists on
// every machine. Throws std::runtime_error when a TPC's mask bit is unknown.
std::vector<Planned> plan(const topo::Topology& t, std::uint64_t seed);

// A --seed value: decimal, 0 to 2^64-1. Throws std::runtime_error (one line).
std::uint64_t parse_seed(std::string_view text);

}  // namespace nvtaskset::cli::verify
