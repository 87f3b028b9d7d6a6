// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/bits.hpp"

#include <algorithm>
#include <cstdio>

namespace nvtaskset {

std::vector<unsigned> Bits128::indices() const {
  std::vector<unsigned> out;
  out.reserve(count());
  for (unsigned i = 0; i < kSize; ++i)
    if (test(i)) out.push_back(i);
  return out;
}

std::string Bits128::to_hex() const {
  char buf[40];
  if (hi) {
    std::snprintf(buf, sizeof buf, "0x%llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
  } else {
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(lo));
  }
  return buf;
}

std::string format_ranges(std::vector<unsigned> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::string out;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ids[i]);
    if (j > i) out += '-' + std::to_string(ids[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace nvtaskset
