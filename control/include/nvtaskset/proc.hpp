// SPDX-License-Identifier: Apache-2.0
// Facts about other processes, from /proc.
#pragma once

#include <sys/types.h>

#include <optional>

namespace nvtaskset::ctl {

// Whether `pid` has ended: a zombie (killed or exited, not yet reaped by its
// parent; state 'Z') or dead ('X'), or gone altogether. kill(pid, 0) succeeds
// on a zombie, so a liveness check built on it alone takes a dead task for a
// running one. False when the state cannot be read but the PID exists (e.g.
// /proc mounted with hidepid): the caller's kill() check stands then.
bool process_is_zombie_or_dead(pid_t pid);

// The parent of `pid` (/proc/<pid>/stat field 4), or 0 when it cannot be read.
pid_t parent_pid(pid_t pid);

// The user a live process runs as: the owner of /proc/<pid>; nullopt when
// it does not exist.
std::optional<uid_t> process_uid(pid_t pid);

}  // namespace nvtaskset::ctl
