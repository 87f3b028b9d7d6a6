# SPDX-License-Identifier: Apache-2.0
# Sourced by cluster.sh and smoke.sh (bash).
# proc_id PID: "STATE STARTTIME" from /proc/PID/stat (proc(5) fields 3 and
# 22, counted after the last ')' of comm, which may hold spaces), nothing
# (and status 1) when PID does not exist: a PID and its start time name one
# process, whatever reuses the number later.
proc_id() {
  local s
  { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 1
  s=${s##*) }
  set -- $s
  echo "$1 ${20}"
}
