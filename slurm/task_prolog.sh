#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# nvtaskset's TaskProlog, for Slurm sites that cannot load SPANK plugins
# (docs/slurm.md, "A TaskProlog"). slurm.conf: TaskProlog=/path/to/task_prolog.sh
#
# Slurm runs it as the user before each task and puts the "export NAME=value"
# lines it prints into the task's environment. The count comes from
# NVTASKSET_GPU_TPCS (srun --export=ALL,NVTASKSET_GPU_TPCS=16) or from the
# step's shards (SLURM_SHARDS_ON_NODE of NVTASKSET_SHARDS_TOTAL, default 8);
# NVTASKSET_SLURM_NO_MPS=1 is --no-mps, NVTASKSET_SLURM_MPS_MULTI_USER=1 is
# --mps-multi-user (a daemon root started with -d -M must then be running:
# the prolog runs as the user). Each task claims its own TPCs, for its
# own PID (SLURM_TASK_PID): free again when the task ends.
NV=${NVTASKSET:-nvtaskset}
n=${NVTASKSET_GPU_TPCS:-}
shards=${SLURM_SHARDS_ON_NODE:-}
[ -z "$n" ] && [ -z "$shards" ] && exit 0 # nothing asked: the task is untouched
fail() { # fail LINE: the task's output and stderr get it; Slurm then fails the task
  echo "print $*"
  echo "$*" >&2
  exit 1
}
[ -n "${SLURM_TASK_PID:-}" ] || fail "nvtaskset: no SLURM_TASK_PID in the TaskProlog's environment"
if [ -z "$n" ]; then
  total=${NVTASKSET_SHARDS_TOTAL:-8}
  tpcs=$("$NV" --topology --json 2>/dev/null | grep -c '"tpc":') || fail "nvtaskset: cannot read the GPU's TPCs (nvtaskset --topology)"
  n=$((tpcs * shards / total))
  [ "$n" -ge 1 ] || n=1
fi
set -- --env-for "$SLURM_TASK_PID" -n "$n" --exclusive
[ "${NVTASKSET_SLURM_NO_MPS:-0}" = 1 ] && set -- "$@" --no-mps
[ "${NVTASKSET_SLURM_MPS_MULTI_USER:-0}" = 1 ] && set -- "$@" --mps-multi-user
out=$("$NV" "$@" 2>&1) || fail "$(printf '%s\n' "$out" | tail -n 1)"
printf '%s\n' "$out" | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*=.*\)$/export \1/p'
