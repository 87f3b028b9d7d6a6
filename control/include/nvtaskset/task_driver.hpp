// SPDX-License-Identifier: Apache-2.0
// Whether a task's kernels can reach the GPU without nvtaskset's shim, told
// from outside the task: the libraries its address space maps
// (/proc/<pid>/maps), identified by their contents (driver_locate.hpp), not
// by their names. A program cannot hide from this by what it says about
// itself; a task whose driver is not the one the shim hooks is never
// reported as partitioned (docs/security.md).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace nvtaskset::ctl {

struct DriverUse {
  enum class State {
    kUnknown,     // its maps cannot be read (another user's task, or gone)
    kNotLoaded,   // no CUDA driver in it yet: nothing can launch
    kThroughShim, // exactly one driver, and the shim hooks it
    kBypassed,    // a driver the shim does not hook: kernels run on all TPCs
  };
  State state = State::kUnknown;
  std::string why;  // kBypassed, kUnknown: one line
};

// `hooked`: whether the task's shim has subscribed its launch callback in
// the driver it loaded (its region's callback_registered; false when it has
// no region); nullopt when that cannot be read (a corrupt region). A driver
// mapped while the shim hooks none was loaded by something else.
DriverUse task_driver_use(pid_t pid, std::optional<bool> hooked);

}  // namespace nvtaskset::ctl
