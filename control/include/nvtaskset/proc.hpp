// SPDX-License-Identifier: Apache-2.0
// Facts about other processes, from /proc.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nvtaskset::ctl {

// /proc/<pid>/stat's fields by proc(5)'s numbers (1 pid, 2 comm, 3 state,
// 4 ppid, 22 starttime), as util-linux's procfs_process_get_stat_nth reads
// them. Field 2, comm, is the program's name in parentheses, and a program
// may name itself anything, spaces and ')' included (prctl PR_SET_NAME): so
// the fields after it are counted from its LAST ')', and comm itself is what
// lies between the first '(' and that ')'.

// Field `n` of one stat line, or nullopt when the line has no such field
// (n == 0, or the line is not in that format). Pure: no system call.
std::optional<std::string_view> stat_field(std::string_view line, unsigned n) noexcept;

// Field `n` of /proc/<pid>/stat, read now. nullopt when it cannot be read or
// has no such field; then *gone (when given) says whether the process does
// not exist (or no longer does), as opposed to a file that exists but cannot
// be read (e.g. /proc mounted with hidepid).
std::optional<std::string> process_stat_field(pid_t pid, unsigned n, bool* gone = nullptr);

// The same field as a decimal number; nullopt also when it is not one.
std::optional<std::uint64_t> process_stat_number(pid_t pid, unsigned n, bool* gone = nullptr);

// Whether `pid` has ended: a zombie (killed or exited, not yet reaped by its
// parent; state 'Z') or dead ('X'), or gone altogether. kill(pid, 0) succeeds
// on a zombie, so a liveness check built on it alone takes a dead task for a
// running one. False when the state cannot be read but the PID exists (e.g.
// /proc mounted with hidepid): the caller's kill() check stands then.
bool process_is_zombie_or_dead(pid_t pid);

// The parent of `pid` (/proc/<pid>/stat field 4), or 0 when it cannot be read.
pid_t parent_pid(pid_t pid);

// The parent of `pid`, its parent, ... up to (not including) init; at most 64.
std::vector<pid_t> ancestors(pid_t pid);

// The user a live process runs as: the owner of /proc/<pid>; nullopt when
// it does not exist.
std::optional<uid_t> process_uid(pid_t pid);

}  // namespace nvtaskset::ctl
