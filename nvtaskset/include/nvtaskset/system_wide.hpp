// SPDX-License-Identifier: Apache-2.0
// System-wide mode: every CUDA process on the machine loads the shim, with no
// partition, so processes started without nvtaskset can later be moved with
// `nvtaskset -p` (the paper's "tasks started without nvtaskset could later be
// moved to a partition"). Opt-in and reversible: it is one file in
// /etc/ld.so.conf.d that puts the shim's directory before the driver's in the
// loader cache, plus an ldconfig run.
#pragma once

#include <string>

namespace nvtaskset::cli {

// The configuration file that enables it: $NVTASKSET_SYSCONFDIR (default
// /etc) + /ld.so.conf.d/000-nvtaskset.conf. "000-" sorts it before the
// distribution's and the driver's own files, and ldconfig keeps the first
// directory's library when two have the same soname.
std::string system_wide_conf_path();

// action: "enable", "disable" or "status". Prints what it did; returns the
// exit status. Runs $NVTASKSET_LDCONFIG (default ldconfig) after a change.
int system_wide(const std::string& action, const std::string& shim_dir);

}  // namespace nvtaskset::cli
