// SPDX-License-Identifier: Apache-2.0
// Programs the shim cannot be loaded into. The kernel runs a set-uid or
// set-gid program, or one whose file capabilities raise its privileges, in
// secure-execution mode (AT_SECURE), and the dynamic loader then ignores
// LD_LIBRARY_PATH and LD_PRELOAD: the task would load the real driver and
// run every kernel on all TPCs while nvtaskset reported its partition
// (ld.so(8), "Secure-execution mode"; execve(2)). Such a command is refused
// before it starts.
#pragma once

#include <string>
#include <vector>

namespace nvtaskset::cli {

// The file execvp() would run for `command` with the task's environment
// `env` (its PATH, else the default search path); "" when there is none.
std::string resolve_command(const std::string& command, const std::vector<std::string>& env);

// Why the program at `path` would run in secure-execution mode when started
// by this process (one line naming the bit or capability and what to do
// instead), or "" when the loader would honour the environment. A script
// ("#!") runs its interpreter, whose bits count instead; a file system
// mounted nosuid and a process with no_new_privs grant neither.
std::string secure_execution_reason(const std::string& path);

}  // namespace nvtaskset::cli
