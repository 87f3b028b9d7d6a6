// SPDX-License-Identifier: Apache-2.0
// What the unit tests of the control region share.
#pragma once

#include <unistd.h>

#include <string>

#include "nvtaskset/control_region.hpp"

namespace nvtaskset::ctl::test {

// The descriptor through which this process holds its region, or -1.
inline int own_region_fd() {
  const std::string want = "/memfd:" + region_name(::getpid()) + " (deleted)";
  for (int fd = 0; fd < 1024; ++fd) {
    char target[256];
    const ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), target, sizeof target - 1);
    if (n > 0 && std::string(target, static_cast<std::size_t>(n)) == want) return fd;
  }
  return -1;
}

}  // namespace nvtaskset::ctl::test
