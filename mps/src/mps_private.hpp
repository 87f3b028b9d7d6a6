// SPDX-License-Identifier: Apache-2.0
// What mps.cpp and daemon_mode.cpp share: the control socket's path and address.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <string>

namespace nvtaskset::mps::detail {

inline std::string errno_text(int err) { return std::strerror(err); }

inline std::string control_socket_path(const std::string& pipe_dir) { return pipe_dir + "/control"; }

// false when the path does not fit a unix socket address.
inline bool fill_sockaddr(const std::string& path, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr->sun_path)) return false;
  std::memcpy(addr->sun_path, path.c_str(), path.size() + 1);
  return true;
}

}  // namespace nvtaskset::mps::detail
