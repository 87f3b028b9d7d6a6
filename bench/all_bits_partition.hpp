// SPDX-License-Identifier: Apache-2.0
// What the benchmarks hand the shim as NVTASKSET_PARTITION.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "nvtaskset/partition.hpp"

// Every mask bit enabled, as `--physical` would pass it: the partition the
// benchmarks measure. Built with the library's encoder so that its format
// cannot drift from what the shim parses.
inline std::string all_bits_partition(const std::string& device) {
  nvtaskset::DevicePartition dp;
  if (!device.empty() && device != "*") {
    const auto u = nvtaskset::uuid_from_string(device);
    if (!u) {
      std::fprintf(stderr, "bad --uuid '%s'\n", device.c_str());
      std::exit(2);
    }
    dp.device = *u;
  }
  dp.partition.kind = nvtaskset::SpecKind::kPhysical;
  dp.partition.enabled.bits = nvtaskset::Bits128::first(128);
  dp.partition.widened.bits = dp.partition.enabled.bits;
  dp.partition.max_cluster = dp.partition.widened_max_cluster = 16;  // Hopper's largest (docs/hardware.md)
  return nvtaskset::encode_partitions({dp});
}
