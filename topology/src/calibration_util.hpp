// SPDX-License-Identifier: Apache-2.0
// What calibration's two halves share: the inference from observations
// (inference.cpp) and the GPU session that makes them (calibration.cpp).
// Internal to topology/.
#pragma once

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo::detail {

[[noreturn]] inline void fail(const std::string& msg) { throw std::runtime_error(msg); }

inline std::vector<unsigned> sorted_unique(const std::vector<SmId>& in) {
  std::vector<unsigned> v;
  v.reserve(in.size());
  for (SmId s : in) v.push_back(s.value);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

inline std::string sm_list(const std::vector<unsigned>& v) {
  return v.size() == 1 ? fmt::format("SM {}", v[0]) : fmt::format("SMs {}", format_id_list(v));
}

// The two SMs of one TPC: 2k and 2k+1.
inline bool is_tpc_pair(const std::vector<unsigned>& v) {
  return v.size() == 2 && v[0] % 2 == 0 && v[1] == v[0] + 1;
}

}  // namespace nvtaskset::topo::detail
