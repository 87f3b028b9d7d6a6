// SPDX-License-Identifier: Apache-2.0
// The public status of partitioned tasks, as `ps` shows processes: which
// task holds which TPCs of which GPU, readable by every user, changeable by
// no one but the task's own user (and root).
//
// The control region stays owner-only (control_region.hpp); this is a
// second, read-only view of its partition: one small file per task,
// "nvtaskset-status.<pid>.<random>", in /dev/shm (root-owned, sticky: a user
// can remove or replace only their own files). A reader trusts an entry only
// when the kernel says so:
//   * the file is owned by the user the live process <pid> runs as (or root),
//     so no user can publish an entry for another user's task;
//   * its start time matches the live process, so an entry outlives neither
//     its task nor a reuse of its PID (such stale entries never show, and
//     whoever may remove them does);
//   * the name carries 64 random bits, so no user can occupy the name a task
//     will use and hide it.
// An entry says what its owner's nvtaskset wrote, which is what the task's
// shim applies: a user can misdescribe only their own tasks.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nvtaskset/partition.hpp"
#include "nvtaskset/task_role.hpp"

namespace nvtaskset::ctl {

struct StatusEntry {
  pid_t pid = 0;
  std::uint64_t start_time = 0;
  uid_t uid = 0;  // the task's user
  std::vector<DevicePartition> partitions;
  // --latency-critical / --best-effort (task_role.hpp); a latency-critical
  // task's partitions are its reservation.
  roles::Role role = roles::Role::kNone;
};

// Where entries live: NVTASKSET_STATUS_DIR (tests) or /dev/shm.
std::string status_dir();

// "" when no other user can remove or replace our files in `dir`: it is
// owned by root or us, and sticky if others may write to it. Else why not.
std::string check_shared_dir(const std::string& dir);

// 64 random bits as 16 hex digits: the part of a shared file's name (a status
// entry, a beacon) no other user can guess and occupy first.
std::string random_hex();

// The PID a shared file of the status directory is named after:
// "<prefix><pid>.<16 hex>" (a status entry, a beacon), or that and
// `temp_suffix` when one is given (*temp then says which). Anyone can create
// such a name, so the PID is parsed with checks (ten digits do not overflow
// it); nothing for any other name.
std::optional<pid_t> pid_of_shared_name(std::string_view name, std::string_view prefix,
                                        std::string_view temp_suffix = {}, bool* temp = nullptr);

// Whether this process may remove a file of the status directory: its own,
// or any as root (the directory is sticky).
bool may_remove(const struct stat& st);

// Publishes (or replaces) the entry of `pid`, which the caller must own or
// be root for. Returns "" or why it could not (one line; the partition
// itself is not affected).
std::string publish_status(pid_t pid, const std::vector<DevicePartition>& partitions,
                           roles::Role role = roles::Role::kNone);

// Removes the entries of `pid` the caller may remove.
void withdraw_status(pid_t pid);

// Every trustworthy entry of a live task, one per PID, by PID. Entries of
// ended tasks are removed where the caller may.
std::vector<StatusEntry> read_status();

}  // namespace nvtaskset::ctl
