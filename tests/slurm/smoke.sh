#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Smoke test of the one-node Slurm harness (cluster.sh): start a private
# cluster, run steps with and without gres, two concurrent steps, scancel of a
# running step, the SPANK failure-point matrix (fail_plugin.c), then stop the
# cluster and check that no daemon survives. Needs root and the Debian 12
# packages slurmctld slurmd slurm-client munge libslurm-dev, and gcc.
#
#   tests/slurm/smoke.sh            exit 0 when every check passes
#   KEEP=1 tests/slurm/smoke.sh     keep the cluster directory (kept anyway on failure)
# Exit 77 (CTest's SKIP_RETURN_CODE) when not root or Slurm is not installed.
set -uo pipefail

if [[ $(id -u) != 0 ]]; then echo "smoke: skipped: needs root"; exit 77; fi
for b in slurmctld slurmd munged srun gcc; do
  command -v "$b" >/dev/null || { echo "smoke: skipped: $b not installed"; exit 77; }
done

HERE=$(dirname "$(readlink -f "$0")")
CLUSTER=$HERE/cluster.sh
DIR=$(mktemp -d /tmp/nvts-slurm.XXXXXX) # /tmp: DIR must be short
FAILS=0
STOPPED=0

now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
check() { # check NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@"; then pass "$name"; else fail "$name"; fi
}
# wait_for SECONDS COMMAND...: poll COMMAND every 50 ms until it succeeds.
wait_for() {
  local end=$(($(now_ms) + $1 * 1000)); shift
  until "$@"; do (($(now_ms) > end)) && return 1; sleep 0.05; done
}
timed() { # timed LABEL COMMAND...: run, print its time
  local label=$1 t0 rc; shift
  t0=$(now_ms); "$@"; rc=$?
  echo "TIME $label: $(($(now_ms) - t0)) ms"; return $rc
}

cleanup() {
  local rc=$?
  if ((!STOPPED)); then "$CLUSTER" stop "$DIR" >/dev/null 2>&1; fi
  if ((FAILS)) || ((rc)) || [[ -n ${KEEP:-} ]]; then
    echo "cluster directory kept: $DIR"
  else
    rm -rf "$DIR"
  fi
}
trap cleanup EXIT

# ------------------------------------------------------------------ start ---
t0=$(now_ms)
# --owner $$: if this script dies, the watchdog stops the cluster.
if ! "$CLUSTER" start "$DIR" --shards 8 --owner $$ --max-seconds 600; then
  fail "cluster start"
  exit 1
fi
echo "TIME start: $(($(now_ms) - t0)) ms (cluster.sh measured $(cat "$DIR/run/start_ms") ms to an idle node)"
eval "$("$CLUSTER" env "$DIR")"
NODE=$NVTS_SLURM_NODE
T=$DIR/tmp # shared scratch for tasks (same host, same root user)

# --------------------------------------------------------- plain steps ---
out=$(timed "srun hostname" srun -N1 -n1 hostname </dev/null 2>&1)
echo "$out" | grep TIME
check "srun -N1 -n1 hostname prints the node name ($NODE)" test "$(echo "$out" | grep -v '^TIME' | grep -v '^srun:')" == "$NODE"

# srun forwards its stdin to task 0: every srun here reads /dev/null.
step_env() { env -i PATH="$PATH" SLURM_CONF="$SLURM_CONF" srun "$@" env </dev/null 2>/dev/null | sort; }
gpu_vars='^(SLURM_SHARDS_ON_NODE|SLURM_GPUS_ON_NODE|SLURM_STEP_GPUS|SLURM_JOB_GPUS|CUDA_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL|ROCR_VISIBLE_DEVICES|ZE_AFFINITY_MASK|CUDA_MPS_[A-Z_]*)='

e_none=$(step_env)
e_shard=$(step_env --gres=shard:2)
e_gpu=$(step_env --gres=gpu:1)
echo "step env, no gres:      $(echo "$e_none" | grep -E "$gpu_vars" | tr '\n' ' ')"
echo "step env, shard:2:      $(echo "$e_shard" | grep -E "$gpu_vars" | tr '\n' ' ')"
echo "step env, gpu:1:        $(echo "$e_gpu" | grep -E "$gpu_vars" | tr '\n' ' ')"
check "a step with no gres gets no GPU variable" test -z "$(echo "$e_none" | grep -E "$gpu_vars")"
check "srun --gres=shard:2: SLURM_SHARDS_ON_NODE=2" grep -qx 'SLURM_SHARDS_ON_NODE=2' <<<"$e_shard"
check "srun --gres=shard:2: CUDA_VISIBLE_DEVICES=0, SLURM_STEP_GPUS=0" \
  bash -c 'grep -qx CUDA_VISIBLE_DEVICES=0 <<<"$1" && grep -qx SLURM_STEP_GPUS=0 <<<"$1"' _ "$e_shard"
check "srun --gres=gpu:1: CUDA_VISIBLE_DEVICES=0, no SLURM_SHARDS_ON_NODE" \
  bash -c 'grep -qx CUDA_VISIBLE_DEVICES=0 <<<"$1" && ! grep -q ^SLURM_SHARDS_ON_NODE= <<<"$1"' _ "$e_gpu"
e_shard8=$(step_env --gres=shard:8)
check "srun --gres=shard:8 (all shards): SLURM_SHARDS_ON_NODE=8" grep -qx 'SLURM_SHARDS_ON_NODE=8' <<<"$e_shard8"

# ------------------------------------------------------ concurrent steps ---
# Each step writes its mark, then waits (bounded) for the other's: both can
# finish only if both ran at the same time.
rendezvous='touch "$1/$2"; for i in $(seq 200); do [ -e "$1/$3" ] && exit 0; sleep 0.05; done; exit 3'
t0=$(now_ms)
srun -J conc-a --gres=shard:3 bash -c "$rendezvous" _ "$T" a b </dev/null >"$T/conc-a.out" 2>&1 &
pa=$!
srun -J conc-b --gres=shard:3 bash -c "$rendezvous" _ "$T" b a </dev/null >"$T/conc-b.out" 2>&1 &
pb=$!
wait $pa; ra=$?
wait $pb; rb=$?
echo "TIME two concurrent steps: $(($(now_ms) - t0)) ms"
check "two concurrent shard:3 steps run at once (srun rc $ra, $rb)" test "$ra$rb" == 00

# --------------------------------------------------- scancel a running step ---
t0=$(now_ms)
srun -J cancelme --gres=shard:1 bash -c 'echo $$ >"$1/cancel.pid"; exec sleep 300' _ "$T" </dev/null >"$T/cancel.out" 2>&1 &
ps_srun=$!
if wait_for 10 test -s "$T/cancel.pid"; then
  task_pid=$(<"$T/cancel.pid")
  jobid=$(squeue -h -n cancelme -o %i)
  scancel "$jobid.0"
  wait_for 10 bash -c '! kill -0 "$1" 2>/dev/null' _ "$ps_srun"
  if kill -0 "$ps_srun" 2>/dev/null; then kill "$ps_srun"; fi
  wait "$ps_srun"; rc=$?
  check "scancel JOBID.0 ends the task (pid $task_pid)" wait_for 10 bash -c '! kill -0 "$1" 2>/dev/null' _ "$task_pid"
  state=$(scontrol show job -o "$jobid" 2>/dev/null | grep -oE 'JobState=[A-Z_]+|ExitCode=[0-9:]+' | tr '\n' ' ')
  echo "scancel of step $jobid.0: srun rc=$rc, $state, srun said: $(grep -v '^$' "$T/cancel.out" | tr '\n' '|')"
  check "srun exits non-zero after scancel of its step" test "$rc" -ne 0
  echo "TIME scancel: $(($(now_ms) - t0)) ms"
else
  fail "the step to cancel did not start in 10 s"
fi

# ------------------------------------------ SPANK failure-point matrix ---
if gcc -Wall -Wextra -O2 -shared -fPIC -o "$DIR/fail_plugin.so" "$HERE/fail_plugin.c"; then
  echo "required $DIR/fail_plugin.so" >"$NVTS_SLURM_PLUGSTACK"
  # POINT  expected: srun rc class (0 or nz), task ran (yes/no), enforced (1: the
  # nvtaskset plugin relies on this row; 0: recorded, a change only warns)
  matrix='
opt             nz  no  1
opt_remote      0   yes 0
init_local      nz  no  1
init_remote     0   no  0
post_opt_local  nz  no  1
post_opt_remote 0   no  0
user_init       0   no  0
task_init_priv  nz  no  1
task_init       nz  no  1
task_post_fork  0   no  0
task_exit       0   yes 0
exit_local      0   yes 0
exit_remote     0   yes 0
none            0   yes 1'
  printf '%-16s %-5s %-4s %-10s %-10s %-8s %s\n' POINT SRUNRC RAN JOBSTATE EXITCODE REASON "STDERR (first line)"
  t0=$(now_ms)
  while read -r point want_rc want_ran enforced; do
    [[ -n $point ]] || continue
    rm -f "$T/ran"
    case $point in
      init_*) NVTS_FAIL_AT=$point timeout 60 srun -J "f-$point" touch "$T/ran" </dev/null >"$T/f.out" 2>&1 ;;
      *) timeout 60 srun -J "f-$point" --fail-at="$point" touch "$T/ran" </dev/null >"$T/f.out" 2>&1 ;;
    esac
    rc=$?
    ran=no; [[ -e $T/ran ]] && ran=yes
    # The state once it settles (COMPLETING lasts until slurmd reports the
    # step's end), bounded.
    for _ in $(seq 50); do
      line=$(scontrol show job -o 2>/dev/null | grep " JobName=f-$point " | tail -1)
      [[ $line == *JobState=COMPLETING* ]] || break
      sleep 0.1
    done
    js=$(grep -oP 'JobState=\K\S+' <<<"$line"); js=${js:-(no job)}
    ec=$(grep -oP 'ExitCode=\K\S+' <<<"$line")
    rs=$(grep -oP 'Reason=\K\S+' <<<"$line")
    printf '%-16s %-5s %-4s %-10s %-10s %-8s %s\n' "$point" "$rc" "$ran" "$js" "${ec:--}" "${rs:--}" \
      "$(grep -m1 . "$T/f.out" | cut -c1-90)"
    got_rc=0; ((rc)) && got_rc=nz
    if [[ $got_rc != "$want_rc" || $ran != "$want_ran" ]]; then
      if ((enforced)); then
        fail "SPANK failure in $point: srun rc $rc (want $want_rc), task ran: $ran (want $want_ran)"
      else
        echo "WARN SPANK failure in $point: srun rc $rc (recorded $want_rc), task ran: $ran (recorded $want_ran): Slurm's behaviour changed"
      fi
    fi
  done <<<"$matrix"
  echo "TIME SPANK matrix: $(($(now_ms) - t0)) ms"
  : >"$NVTS_SLURM_PLUGSTACK"
  check "a plain step still runs after the matrix" test "$(srun hostname </dev/null 2>/dev/null)" == "$NODE"
else
  fail "gcc could not build fail_plugin.c (libslurm-dev and gcc needed)"
fi

# ------------------------------------------------------------------- stop ---
# shellcheck source=proc_id.sh
source "$HERE/proc_id.sh"
pids=() ids=()
for n in munged slurmctld slurmd watchdog; do
  [[ -s $DIR/run/$n.pid ]] || continue
  pid=$(<"$DIR/run/$n.pid")
  pids+=("$n:$pid"); ids+=("$(proc_id "$pid")")
done
t0=$(now_ms)
"$CLUSTER" stop "$DIR"; rc=$?
STOPPED=1
echo "TIME stop: $(($(now_ms) - t0)) ms"
check "cluster.sh stop exits 0" test "$rc" -eq 0
survivors=""
for i in "${!pids[@]}"; do
  pid=${pids[i]#*:}
  # The same process (same start time) still there and not a zombie; a
  # recycled PID has another start time.
  id=$(proc_id "$pid") && [[ ${id#* } == "${ids[i]#* }" && ${id%% *} != Z ]] && survivors+=" ${pids[i]}"
done
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [[ $pid == "$$" ]] && continue
  if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qxF "NVTS_SLURM_HARNESS=$DIR"; then
    survivors+=" $pid($(cat "$p/comm" 2>/dev/null))"
  fi
done
check "no daemon or slurmstepd of the cluster survives stop (${pids[*]})" test -z "$survivors"
[[ -n $survivors ]] && echo "survivors:$survivors"

if ((FAILS)); then
  echo "smoke: $FAILS check(s) failed"
  "$CLUSTER" logs "$DIR" 20
  exit 1
fi
echo "smoke: all checks passed"
