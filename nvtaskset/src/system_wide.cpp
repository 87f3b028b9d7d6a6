// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/system_wide.hpp"

#include "nvtaskset/options.hpp"
#include "nvtaskset/spawn.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>


namespace nvtaskset::cli {
namespace fs = std::filesystem;

namespace {

const char* kMarker = "# nvtaskset --system-wide: the shim's directory, before the real driver's.";

std::string ldconfig_program() {
  const char* p = option_value(Option::kLdconfig);
  return p && *p ? p : "ldconfig";
}

void run_ldconfig() {
  const std::string prog = ldconfig_program();
  process::SpawnOptions so;
  so.search_path = true;
  pid_t pid = 0;
  try {
    pid = process::spawn(process::ExecArgs({prog}), so);
  } catch (const process::SpawnError& e) {
    throw std::runtime_error("cannot run " + prog + ": " + std::strerror(e.error()));
  }
  const int status = process::wait_for(pid);
  if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error(prog + " failed");
}

// The shim directory named by an existing configuration file, or "".
std::string configured_dir() {
  std::ifstream f(system_wide_conf_path());
  std::string line;
  while (std::getline(f, line))
    if (!line.empty() && line[0] != '#') return line;
  return "";
}

}  // namespace

std::string system_wide_conf_path() {
  const char* root = option_value(Option::kSysconfdir);
  return std::string(root && *root ? root : "/etc") + "/ld.so.conf.d/000-nvtaskset.conf";
}

int system_wide(const std::string& action, const std::string& shim_dir) {
  const std::string conf = system_wide_conf_path();
  if (action == "status") {
    const std::string dir = configured_dir();
    if (dir.empty()) std::printf("system-wide mode: disabled (%s absent)\n", conf.c_str());
    else std::printf("system-wide mode: enabled (%s names %s)\n", conf.c_str(), dir.c_str());
    return 0;
  }
  if (action == "enable") {
    if (shim_dir.empty()) throw std::runtime_error("cannot find the shim libcuda.so.1 next to nvtaskset");
    std::error_code ec;
    fs::create_directories(fs::path(conf).parent_path(), ec);
    std::ofstream f(conf, std::ios::trunc);
    if (!f) throw std::runtime_error("cannot write " + conf + ": " + std::strerror(errno) + " (run as root)");
    f << kMarker << "\n# Undo with: nvtaskset --system-wide disable\n" << shim_dir << "\n";
    f.close();
    if (!f) throw std::runtime_error("cannot write " + conf);
    run_ldconfig();
    std::printf(
        "system-wide mode: enabled. CUDA processes started from now on load the shim from %s with no partition;\n"
        "move one with: nvtaskset -p -t LIST PID. Undo with: nvtaskset --system-wide disable\n",
        shim_dir.c_str());
    return 0;
  }
  // disable
  if (!fs::exists(conf)) {
    std::printf("system-wide mode: already disabled\n");
    return 0;
  }
  if (::unlink(conf.c_str()) != 0)
    throw std::runtime_error("cannot remove " + conf + ": " + std::strerror(errno) + " (run as root)");
  run_ldconfig();
  std::printf("system-wide mode: disabled. Processes already running keep the shim until they exit.\n");
  return 0;
}

}  // namespace nvtaskset::cli
