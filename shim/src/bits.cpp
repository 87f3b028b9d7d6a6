#include "nvtaskset/bits.hpp"

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

}  // namespace nvtaskset
