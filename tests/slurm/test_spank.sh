#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# The Slurm plugin end to end: a private one-node cluster
# (cluster.sh: munged, slurmctld, slurmd, started here and stopped by PID),
# spank_nvtaskset.so in its plugstack.conf, and srun steps that run the e2e
# launcher on the stand-in driver posing as a 64-TPC GPU. It checks the masks
# each step's kernels ran with (the stand-in's record), that concurrent
# steps (also of another Unix user) are disjoint, that TPCs are free again
# after a step exits and after scancel, the bad inputs, a step on two GPUs
# (a partition on each), MPS and a refused gres/mps, MPS's multi-user
# server (mps-multi-user: two users' steps at once), the TaskProlog
# fallback, and that a step that
# asks for nothing is left untouched. Needs root (slurmd) and Debian 12's
# slurmctld slurmd slurm-client munge.
#
#   test_spank.sh NVTASKSET PLUGIN STAND_IN_DRIVER LAUNCHER FAKE_MPS_CONTROL
set -uo pipefail

[[ $(id -u) == 0 ]] || { echo "FAIL test_spank.sh needs root (slurmd runs the steps)"; exit 1; }
NV=$1 PLUGIN=$2 FAKE=$3 LAUNCHER=$4 FAKE_MPS=$5
HERE=$(dirname "$(readlink -f "$0")")
CLUSTER=$HERE/cluster.sh
DIR=$(mktemp -d /tmp/nvts-spank.XXXXXX) # short: socket paths live under it
FAILS=0
STOPPED=0
TPCS=64 # the stand-in without a topology maps TPC k to mask bit k, up to 64 (identity)

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }
# wait_for SECONDS COMMAND...: poll every 50 ms until COMMAND succeeds.
wait_for() {
  local end=$(($(now_ms) + $1 * 1000)); shift
  until "$@"; do (($(now_ms) > end)) && return 1; sleep 0.05; done
}

cleanup() {
  local rc=$?
  for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  ((STOPPED)) || "$CLUSTER" stop "$DIR" >/dev/null 2>&1
  if ((FAILS)) || ((rc)); then
    echo "--- slurmd log (tail)"; tail -n 30 "$DIR"/log/slurmd.log 2>/dev/null
    echo "cluster directory kept: $DIR"
  else
    rm -rf "$DIR"
  fi
}
trap cleanup EXIT

if ! "$CLUSTER" start "$DIR" --shards 8 --owner $$ --max-seconds 300; then
  echo "FAIL the cluster did not start"
  exit 1
fi
eval "$("$CLUSTER" env "$DIR")"

# What every step and every nvtaskset here shares: the stand-in as the real
# driver, its record, the status directory, a private cache. Copies that
# another user can run (DIR is 0755).
T=$DIR/t
mkdir -p "$T/bin" "$T/status" "$T/cache"
cp "$LAUNCHER" "$T/bin/launcher"
cp "$FAKE" "$T/bin/libcuda.so.1"
chmod 755 "$T" "$T/bin" "$T/bin/launcher" "$T/bin/libcuda.so.1"
: >"$T/record"
chmod 666 "$T/record"
# nvtaskset, its shim and the plugin as another user can read them: srun of
# user nobody loads the plugin, nobody's task the shim (a build tree may sit
# in a directory only root can enter, as CI's does).
mkdir -p "$T/nv/bin" "$T/nv/lib/nvtaskset" "$T/nv/lib/slurm"
cp "$NV" "$T/nv/bin/nvtaskset"
cp "$(dirname "$NV")/../lib/nvtaskset/libcuda.so.1" "$T/nv/lib/nvtaskset/libcuda.so.1"
cp "$PLUGIN" "$T/nv/lib/slurm/spank_nvtaskset.so"
chmod -R a+rX "$T/nv"
NV=$T/nv/bin/nvtaskset PLUGIN=$T/nv/lib/slurm/spank_nvtaskset.so
export NVTASKSET_REAL_LIBCUDA=$T/bin/libcuda.so.1 FAKECUDA_SM_COUNT=$((2 * TPCS)) FAKECUDA_RECORD=$T/record
export NVTASKSET_STATUS_DIR=$T/status XDG_CACHE_HOME=$T/cache
unset LD_PRELOAD CUDA_VISIBLE_DEVICES
L=$T/bin/launcher
echo "required $PLUGIN no-mps nvtaskset=$NV" >"$NVTS_SLURM_PLUGSTACK"

# enabled_of PID: the TPCs the stand-in recorded for PID's last kernel.
# shellcheck source=standin_record.sh
source "$HERE/standin_record.sh"
enabled_of() { standin_tpcs "$T/record" "$1" "$TPCS"; }
count_of() { local s; s=$(enabled_of "$1") || { echo 0; return; }; [[ -z $s ]] && echo 0 || echo $(($(tr -cd , <<<"$s" | wc -c) + 1)); }
disjoint() { # disjoint LIST LIST: both non-empty, no index in common
  [[ -n $1 && -n $2 ]] || return 1
  local x
  for x in ${1//,/ }; do [[ ,$2, == *,$x,* ]] && return 1; done
  return 0
}
launched_pid() { sed -n 's/^pid \([0-9]*\)$/\1/p' "$1" | head -1; }
steps_listed() { "$NV" --status 2>/dev/null | grep -c slurmstepd; }
none_listed() { [[ $(steps_listed) == 0 ]]; }

# 1. --gpu-tpcs=16: the step's kernels run on 16 TPCs, and --status lists the
#    step (slurmstepd, with its job and step id) while it runs.
srun --gpu-tpcs=16 "$L" --kernels 2 >"$T/o1" 2>"$T/e1" </dev/null
rc=$?
p=$(launched_pid "$T/o1")
n=$(count_of "$p")
[[ $rc == 0 && $n == 16 ]] && pass "srun --gpu-tpcs=16: the kernels ran on 16 TPCs ($(enabled_of "$p"))" ||
  fail "srun --gpu-tpcs=16: rc=$rc, kernels on $n TPCs: $(cat "$T/e1")"

# 2. --gres=shard:2 of 8: a quarter of the TPCs, 16 of 64.
srun --gres=shard:2 "$L" >"$T/o2" 2>"$T/e2" </dev/null
rc=$?
p=$(launched_pid "$T/o2")
n=$(count_of "$p")
[[ $rc == 0 && $n == 16 ]] && pass "srun --gres=shard:2 (of 8): the kernels ran on 16 TPCs" ||
  fail "srun --gres=shard:2: rc=$rc, kernels on $n TPCs: $(cat "$T/e2")"

# 3. A running step and a second one, of another Unix user: disjoint; the
#    first is listed while it runs and released after it exits.
srun --gpu-tpcs=16 "$L" --until-file "$T/stopA" --ready-file "$T/readyA" --interval-ms 50 \
  >"$T/oA" 2>"$T/eA" </dev/null &
sA=$!
if wait_for 30 test -s "$T/readyA"; then
  # Its PID from the ready file it wrote itself: its stdout reaches "$T/oA"
  # through srun's forwarding, which may not have caught up yet.
  pA=$(cat "$T/readyA")
  st=$("$NV" --status 2>&1)
  grep -Eq 'slurmstepd: \[[0-9]+\.[0-9]+\]' <<<"$st" && pass "--status lists the running step as slurmstepd: [job.step]" ||
    fail "--status during the step: $st"
  # The step's task runs on the partition its slurmstepd holds: not a second
  # partition sharing those TPCs.
  ! grep -q "share TPCs" <<<"$st" && pass "--status reports no sharing between a step and its own task" ||
    fail "--status during the step says it shares: $st"
  runuser -u nobody -- env PATH="$PATH" SLURM_CONF="$SLURM_CONF" NVTASKSET_REAL_LIBCUDA="$NVTASKSET_REAL_LIBCUDA" \
    FAKECUDA_SM_COUNT="$FAKECUDA_SM_COUNT" FAKECUDA_RECORD="$FAKECUDA_RECORD" NVTASKSET_STATUS_DIR="$NVTASKSET_STATUS_DIR" \
    srun --gres=shard:2 "$L" >"$T/oB" 2>"$T/eB" </dev/null
  rc=$?
  pB=$(launched_pid "$T/oB")
  a=$(enabled_of "$pA") b=$(enabled_of "$pB")
  [[ $rc == 0 ]] && disjoint "$a" "$b" && pass "a step of user nobody (shard:2) runs on TPCs disjoint from the running one's ($b vs $a)" ||
    fail "concurrent steps: rc=$rc, A on '$a', B on '$b': $(cat "$T/eB")"
  # 4. A share that cannot be honoured now: 60 of the 48 left.
  srun --gpu-tpcs=60 "$L" >"$T/o4" 2>"$T/e4" </dev/null
  rc=$?
  [[ $rc != 0 && -z $(launched_pid "$T/o4") ]] && grep -q -- '-n 60' "$T/e4" &&
    pass "srun --gpu-tpcs=60 next to a step on 16: fails before the program runs ($(grep -- '-n 60' "$T/e4" | head -1))" ||
    fail "srun --gpu-tpcs=60 next to a step on 16: rc=$rc: $(cat "$T/o4" "$T/e4")"
  touch "$T/stopA"
  wait "$sA"
  rc=$?
  [[ $rc == 0 ]] && wait_for 10 none_listed && pass "after the step exits, --status lists no step" ||
    fail "after the step exited (rc=$rc): $("$NV" --status 2>&1)"
else
  fail "the first step did not start: $(cat "$T/eA")"
fi

# 5. scancel: the step's TPCs are free again; a step on all of them then runs.
srun --gpu-tpcs=16 "$L" --until-file "$T/never" --ready-file "$T/readyC" --interval-ms 50 \
  >"$T/oC" 2>"$T/eC" </dev/null &
sC=$!
if wait_for 30 test -s "$T/readyC"; then
  scancel "$(squeue -h -o %i | head -1)"
  wait "$sC"
  rc=$?
  wait_for 10 none_listed && [[ $rc != 0 ]] && pass "after scancel (srun exit $rc), --status lists no step" ||
    fail "after scancel (srun exit $rc): $("$NV" --status 2>&1)"
  srun --gpu-tpcs=$TPCS "$L" >"$T/o5" 2>"$T/e5" </dev/null
  rc=$?
  n=$(count_of "$(launched_pid "$T/o5")")
  [[ $rc == 0 && $n == "$TPCS" ]] && pass "then srun --gpu-tpcs=$TPCS runs on all $TPCS TPCs" ||
    fail "srun --gpu-tpcs=$TPCS after scancel: rc=$rc, $n TPCs: $(cat "$T/e5")"
else
  fail "the step to cancel did not start: $(cat "$T/eC")"
fi

# 6. Bad input: srun fails, one line names the value, the program never runs.
for v in 0 abc -3 $((TPCS + 1)); do
  srun --gpu-tpcs="$v" "$L" >"$T/o6" 2>"$T/e6" </dev/null
  rc=$?
  line=$(grep -m1 -- "$v" "$T/e6")
  [[ $rc != 0 && -z $(launched_pid "$T/o6") && -n $line ]] && pass "srun --gpu-tpcs=$v fails (exit $rc): $line" ||
    fail "srun --gpu-tpcs=$v: rc=$rc: $(cat "$T/o6" "$T/e6")"
done
srun --gpu-tpcs=4 --gpu-tpcs-mode=diagonal "$L" >"$T/o7" 2>"$T/e7" </dev/null
rc=$?
[[ $rc != 0 && -z $(launched_pid "$T/o7") ]] && grep -q diagonal "$T/e7" && pass "srun --gpu-tpcs-mode=diagonal fails (exit $rc)" ||
  fail "srun --gpu-tpcs-mode=diagonal: rc=$rc: $(cat "$T/e7")"

# 7. No option and no shard: the step runs untouched, no variable of ours.
out=$(srun env </dev/null 2>&1)
rc=$?
[[ $rc == 0 ]] && ! grep -Eq '^NVTASKSET_PARTITION|^LD_PRELOAD=.*libcuda|^CUDA_DEVICE_MAX_CONNECTIONS' <<<"$out" &&
  pass "a step with no option and no shard gets no partition and no variable" ||
  fail "a plain step: rc=$rc: $(grep -E 'NVTASKSET|LD_PRELOAD|CUDA_DEVICE' <<<"$out")"

# 8. --gpu-tpcs-mode=spread: as -n --spread (the stand-in's GPCs are unknown,
#    so the count is what can be checked here).
srun --gpu-tpcs=8 --gpu-tpcs-mode=spread "$L" >"$T/o8" 2>"$T/e8" </dev/null
rc=$?
n=$(count_of "$(launched_pid "$T/o8")")
[[ $rc == 0 && $n == 8 ]] && pass "srun --gpu-tpcs=8 --gpu-tpcs-mode=spread: 8 TPCs" || fail "spread: rc=$rc, $n TPCs: $(cat "$T/e8")"

# 8b. --gpu-role (nvtaskset's role options): a latency-critical step reserves
#     its TPCs, and its task gets the role; a second reservation over them is
#     refused; a best-effort step with no count runs next to it on every TPC
#     (it may borrow the reservation); a reservation with no count, or a role
#     that is none of the two, fails srun, and the program never runs.
srun --gpu-tpcs=16 --gpu-role=latency-critical "$L" --print-env NVTASKSET_ROLE --until-file "$T/stopR" \
  --ready-file "$T/readyR" --interval-ms 50 >"$T/oR" 2>"$T/eR" </dev/null &
sR=$!
if wait_for 30 test -s "$T/readyR"; then
  pR=$(cat "$T/readyR")
  lc_role=$("$NV" --status --json 2>/dev/null | grep -o '"role": *"[a-z-]*"' | sort -u | sed 's/.*"\([a-z-]*\)"$/\1/')
  n=$(count_of "$pR")
  [[ $lc_role == latency-critical && $n -ge 16 ]] && pass "srun --gpu-tpcs=16 --gpu-role=latency-critical: --status says latency-critical, kernels on $n TPCs" ||
    fail "latency-critical step: roles '$lc_role', $n TPCs: $(cat "$T/eR")"
  srun --gpu-tpcs=60 --gpu-role=latency-critical "$L" >"$T/oR2" 2>"$T/eR2" </dev/null
  rc=$?
  [[ $rc != 0 && -z $(launched_pid "$T/oR2") ]] && grep -q -- '-n 60' "$T/eR2" &&
    pass "a second reservation of 60 next to one of 16 fails (exit $rc): $(grep -m1 -- '-n 60' "$T/eR2")" ||
    fail "a second reservation of 60: rc=$rc: $(cat "$T/oR2" "$T/eR2")"
  srun --gpu-role=best-effort "$L" --print-env NVTASKSET_ROLE >"$T/oR3" 2>"$T/eR3" </dev/null
  rc=$?
  n=$(count_of "$(launched_pid "$T/oR3")")
  [[ $rc == 0 && $n -ge $((TPCS - 16)) ]] && grep -q "^env NVTASKSET_ROLE=best-effort$" "$T/oR3" &&
    pass "srun --gpu-role=best-effort next to it: the role, kernels on $n TPCs" ||
    fail "best-effort step: rc=$rc, $n TPCs: $(cat "$T/oR3" "$T/eR3")"
  touch "$T/stopR"
  wait "$sR"
  rc=$?
  [[ $rc == 0 ]] && grep -q "^env NVTASKSET_ROLE=latency-critical$" "$T/oR" &&
    pass "the latency-critical step's task had NVTASKSET_ROLE=latency-critical" ||
    fail "the latency-critical step: rc=$rc: $(cat "$T/oR" "$T/eR")"
else
  fail "the latency-critical step did not start: $(cat "$T/eR")"
fi
for args in "--gpu-role=latency-critical:--gpu-tpcs" "--gpu-role=fast:fast"; do
  srun "${args%%:*}" "$L" >"$T/oR4" 2>"$T/eR4" </dev/null
  rc=$?
  line=$(grep -m1 -- "${args##*:}" "$T/eR4")
  [[ $rc != 0 && -z $(launched_pid "$T/oR4") && -n $line ]] && pass "srun ${args%%:*} fails (exit $rc): $line" ||
    fail "srun ${args%%:*}: rc=$rc: $(cat "$T/oR4" "$T/eR4")"
done

# 9. A step Slurm gave no GPU that sees two (the stand-in with two): GPU 0
#    gets the partition, and the step sees only GPU 0.
FAKECUDA_DEVICES=2 srun --gpu-tpcs=8 "$L" --print-env CUDA_VISIBLE_DEVICES >"$T/oG" 2>"$T/eG" </dev/null
rc=$?
n=$(count_of "$(launched_pid "$T/oG")")
[[ $rc == 0 && $n == 8 ]] && grep -q "^env CUDA_VISIBLE_DEVICES=0$" "$T/oG" &&
  pass "a step given no GPU that sees two: 8 TPCs on GPU 0, and CUDA_VISIBLE_DEVICES=0" ||
  fail "a step given no GPU that sees two: rc=$rc, $n TPCs: $(cat "$T/oG" "$T/eG")"

# 10. With MPS (no no-mps): the plugin's nvtaskset makes sure a control
#     daemon runs (the stand-in), and the step's tasks get an MPS client's 8
#     kernel queues; a step with Slurm's own gres/mps thread percentage and a
#     partition is refused in one line.
cp "$FAKE_MPS" "$T/bin/nvidia-cuda-mps-control"
chmod 755 "$T/bin/nvidia-cuda-mps-control"
mkdir -p "$T/mps-pipe" "$T/mps-log"
echo "required $PLUGIN nvtaskset=$NV" >"$NVTS_SLURM_PLUGSTACK"
mps_env=(NVTASKSET_MPS_CONTROL="$T/bin/nvidia-cuda-mps-control" CUDA_MPS_PIPE_DIRECTORY="$T/mps-pipe"
  CUDA_MPS_LOG_DIRECTORY="$T/mps-log")
env "${mps_env[@]}" srun --gpu-tpcs=8 "$L" --print-env CUDA_DEVICE_MAX_CONNECTIONS >"$T/oM" 2>"$T/eM" </dev/null
rc=$?
n=$(count_of "$(launched_pid "$T/oM")")
[[ $rc == 0 && $n == 8 && -S $T/mps-pipe/control ]] && grep -q "^env CUDA_DEVICE_MAX_CONNECTIONS=8$" "$T/oM" &&
  pass "with MPS: the control daemon runs, the step's task gets 8 kernel queues and 8 TPCs" ||
  fail "with MPS: rc=$rc, $n TPCs, socket $(ls "$T/mps-pipe" 2>&1): $(cat "$T/oM" "$T/eM")"
env "${mps_env[@]}" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 srun --gpu-tpcs=8 "$L" >"$T/oN" 2>"$T/eN" </dev/null
rc=$?
[[ $rc != 0 && -z $(launched_pid "$T/oN") ]] && grep -q "gres/mps" "$T/eN" &&
  pass "a step with Slurm's MPS thread percentage and --gpu-tpcs is refused (exit $rc): $(grep -m1 gres/mps "$T/eN")" ||
  fail "gres/mps with --gpu-tpcs: rc=$rc: $(cat "$T/oN" "$T/eN")"
# Stop the stand-in daemon this started, by its PID.
mps_pid=$(cat "$T/mps-pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)
env "${mps_env[@]}" "$T/bin/nvidia-cuda-mps-control" <<<quit >/dev/null 2>&1
[[ -z $mps_pid ]] || wait_for 5 sh -c "! kill -0 $mps_pid 2>/dev/null" || { kill -9 "$mps_pid" 2>/dev/null; fail "the stand-in MPS daemon did not quit"; }

# 10b. mps-multi-user in plugstack.conf: the plugin's nvtaskset starts the
#     control daemon with -d -M (the stand-in keeps -M on its command line),
#     and a step of user nobody runs to its end while root's step runs, on
#     TPCs disjoint from it. With a single-user daemon running, such a step
#     is refused in one line; no-mps and mps-multi-user together fail srun.
echo "required $PLUGIN mps-multi-user nvtaskset=$NV" >"$NVTS_SLURM_PLUGSTACK"
env "${mps_env[@]}" srun --gpu-tpcs=16 "$L" --until-file "$T/stopMU" --ready-file "$T/readyMU" --interval-ms 50 \
  >"$T/oMU" 2>"$T/eMU" </dev/null &
sMU=$!
if wait_for 30 test -s "$T/readyMU"; then
  pMU=$(cat "$T/readyMU")
  mps_pid=$(cat "$T/mps-pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)
  cmd=$(tr '\0' ' ' <"/proc/${mps_pid:-0}/cmdline" 2>/dev/null)
  [[ " $cmd" == *" -d -M "* ]] && pass "mps-multi-user: the step's nvtaskset started the control daemon as: $cmd" ||
    fail "mps-multi-user: the daemon (pid '${mps_pid}') runs as '$cmd': $(cat "$T/eMU")"
  runuser -u nobody -- env PATH="$PATH" SLURM_CONF="$SLURM_CONF" NVTASKSET_REAL_LIBCUDA="$NVTASKSET_REAL_LIBCUDA" \
    FAKECUDA_SM_COUNT="$FAKECUDA_SM_COUNT" FAKECUDA_RECORD="$FAKECUDA_RECORD" NVTASKSET_STATUS_DIR="$NVTASKSET_STATUS_DIR" \
    "${mps_env[@]}" srun --gres=shard:2 "$L" >"$T/oMV" 2>"$T/eMV" </dev/null
  rc=$?
  pMV=$(launched_pid "$T/oMV")
  a=$(enabled_of "$pMU") b=$(enabled_of "$pMV")
  [[ $rc == 0 ]] && kill -0 "$sMU" 2>/dev/null && disjoint "$a" "$b" &&
    pass "mps-multi-user: a step of user nobody ran to its end while root's step ran, on disjoint TPCs ($b vs $a)" ||
    fail "mps-multi-user, two users' steps: rc=$rc, root's step running: $(kill -0 "$sMU" 2>/dev/null && echo yes || echo no), A on '$a', B on '$b': $(cat "$T/eMV")"
  touch "$T/stopMU"
  wait "$sMU" || fail "mps-multi-user: root's step failed: $(cat "$T/eMU")"
else
  fail "mps-multi-user: the first step did not start: $(cat "$T/oMU" "$T/eMU")"
fi
env "${mps_env[@]}" "$T/bin/nvidia-cuda-mps-control" <<<quit >/dev/null 2>&1
[[ -z $mps_pid ]] || wait_for 5 sh -c "! kill -0 $mps_pid 2>/dev/null" || { kill -9 "$mps_pid" 2>/dev/null; fail "the stand-in multi-user daemon did not quit"; }
# A single-user daemon (as `nvidia-cuda-mps-control -d` leaves one) is never shared.
env "${mps_env[@]}" "$T/bin/nvidia-cuda-mps-control" -d >/dev/null 2>&1
mps_pid=$(cat "$T/mps-pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)
env "${mps_env[@]}" srun --gpu-tpcs=8 "$L" >"$T/oMW" 2>"$T/eMW" </dev/null
rc=$?
[[ $rc != 0 && -z $(launched_pid "$T/oMW") ]] && grep -q "serves one user at a time" "$T/eMW" &&
  pass "mps-multi-user next to a single-user daemon: the step fails (exit $rc): $(grep -m1 'serves one user' "$T/eMW")" ||
  fail "mps-multi-user next to a single-user daemon: rc=$rc: $(cat "$T/oMW" "$T/eMW")"
env "${mps_env[@]}" "$T/bin/nvidia-cuda-mps-control" <<<quit >/dev/null 2>&1
[[ -z $mps_pid ]] || wait_for 5 sh -c "! kill -0 $mps_pid 2>/dev/null" || { kill -9 "$mps_pid" 2>/dev/null; fail "the stand-in single-user daemon did not quit"; }
echo "required $PLUGIN no-mps mps-multi-user nvtaskset=$NV" >"$NVTS_SLURM_PLUGSTACK"
srun --gpu-tpcs=8 "$L" >"$T/oMX" 2>"$T/eMX" </dev/null
rc=$?
[[ $rc != 0 && -z $(launched_pid "$T/oMX") ]] && grep -q "no-mps and mps-multi-user exclude each other" "$T/eMX" &&
  pass "plugstack.conf with no-mps and mps-multi-user: srun fails (exit $rc) and says why" ||
  fail "plugstack.conf with no-mps and mps-multi-user: rc=$rc: $(cat "$T/oMX" "$T/eMX")"
echo "required $PLUGIN no-mps nvtaskset=$NV" >"$NVTS_SLURM_PLUGSTACK"

# 11. The TaskProlog fallback (slurm/task_prolog.sh), without the plugin:
#    NVTASKSET_GPU_TPCS or the shards set each task's TPCs; a bad count fails
#    the task and srun, and the program never runs.
: >"$NVTS_SLURM_PLUGSTACK"
# The checkout may sit at a path with spaces ("/tmp/a b"): slurm.conf takes
# it quoted (conf_value); one it cannot hold at all is run from a copy in T.
# shellcheck source=slurm_conf.sh
source "$HERE/slurm_conf.sh"
prolog=$(readlink -f "$HERE/../../slurm/task_prolog.sh")
if ! prolog_value=$(conf_value "$prolog"); then
  cp "$prolog" "$T/bin/task_prolog.sh" && chmod 755 "$T/bin/task_prolog.sh"
  prolog_value=$T/bin/task_prolog.sh
fi
echo "TaskProlog=$prolog_value" >>"$SLURM_CONF"
if scontrol reconfigure && wait_for 10 sh -c 'scontrol show config | grep -q "^TaskProlog .*task_prolog.sh"'; then
  export NVTASKSET=$NV NVTASKSET_SLURM_NO_MPS=1
  NVTASKSET_GPU_TPCS=8 srun "$L" >"$T/o9" 2>"$T/e9" </dev/null
  rc=$?
  n=$(count_of "$(launched_pid "$T/o9")")
  [[ $rc == 0 && $n == 8 ]] && pass "TaskProlog: NVTASKSET_GPU_TPCS=8 runs the task on 8 TPCs" ||
    fail "TaskProlog with NVTASKSET_GPU_TPCS=8: rc=$rc, $n TPCs: $(cat "$T/e9")"
  srun --gres=shard:2 "$L" >"$T/o10" 2>"$T/e10" </dev/null
  rc=$?
  n=$(count_of "$(launched_pid "$T/o10")")
  [[ $rc == 0 && $n == 16 ]] && pass "TaskProlog: --gres=shard:2 runs the task on 16 TPCs" ||
    fail "TaskProlog with shard:2: rc=$rc, $n TPCs: $(cat "$T/e10")"
  NVTASKSET_GPU_TPCS=$((TPCS + 1)) srun "$L" >"$T/o11" 2>"$T/e11" </dev/null
  rc=$?
  [[ $rc != 0 && -z $(launched_pid "$T/o11") ]] && grep -q -- "-n $((TPCS + 1))" "$T/o11" "$T/e11" &&
    pass "TaskProlog: NVTASKSET_GPU_TPCS=$((TPCS + 1)) fails the task (srun exit $rc), the program never runs" ||
    fail "TaskProlog with a bad count: rc=$rc: $(cat "$T/o11" "$T/e11")"
  # NVTASKSET_SLURM_MPS_MULTI_USER=1 is --mps-multi-user: the prolog (root's
  # here, as the step is) starts the daemon with -d -M; with
  # NVTASKSET_SLURM_NO_MPS=1 too, the task fails with the CLI's one line.
  NVTASKSET_SLURM_MPS_MULTI_USER=1 NVTASKSET_GPU_TPCS=8 srun "$L" >"$T/o12" 2>"$T/e12" </dev/null
  rc=$?
  [[ $rc != 0 && -z $(launched_pid "$T/o12") ]] && grep -q -- "--no-mps and --mps-multi-user exclude each other" "$T/o12" "$T/e12" &&
    pass "TaskProlog: NVTASKSET_SLURM_NO_MPS=1 with NVTASKSET_SLURM_MPS_MULTI_USER=1 fails the task (srun exit $rc)" ||
    fail "TaskProlog with both MPS switches: rc=$rc: $(cat "$T/o12" "$T/e12")"
  env "${mps_env[@]}" NVTASKSET_SLURM_NO_MPS=0 NVTASKSET_SLURM_MPS_MULTI_USER=1 NVTASKSET_GPU_TPCS=8 srun "$L" \
    >"$T/o13" 2>"$T/e13" </dev/null
  rc=$?
  n=$(count_of "$(launched_pid "$T/o13")")
  mps_pid=$(cat "$T/mps-pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)
  cmd=$(tr '\0' ' ' <"/proc/${mps_pid:-0}/cmdline" 2>/dev/null)
  [[ $rc == 0 && $n == 8 && " $cmd" == *" -d -M "* ]] &&
    pass "TaskProlog: NVTASKSET_SLURM_MPS_MULTI_USER=1 starts the daemon with -d -M, the task runs on 8 TPCs" ||
    fail "TaskProlog with NVTASKSET_SLURM_MPS_MULTI_USER=1: rc=$rc, $n TPCs, daemon '$cmd': $(cat "$T/e13")"
  env "${mps_env[@]}" "$T/bin/nvidia-cuda-mps-control" <<<quit >/dev/null 2>&1
  [[ -z $mps_pid ]] || wait_for 5 sh -c "! kill -0 $mps_pid 2>/dev/null" || kill -9 "$mps_pid" 2>/dev/null
else
  fail "slurmctld did not take the TaskProlog: $(scontrol show config | grep -i taskprolog)"
fi

"$CLUSTER" stop "$DIR" >/dev/null 2>&1 && STOPPED=1 || fail "cluster stop"

# 12. A node with two GPUs (8 shards each): a step given both gets a
#     partition on each; a shard's share is of one GPU's shards.
DIR2=$(mktemp -d /tmp/nvts-spank2.XXXXXX)
if "$CLUSTER" start "$DIR2" --gpus 2 --shards 8 --owner $$ --max-seconds 120 >/dev/null; then
  eval "$("$CLUSTER" env "$DIR2")"
  echo "required $PLUGIN no-mps nvtaskset=$NV" >"$NVTS_SLURM_PLUGSTACK"
  export FAKECUDA_DEVICES=2
  srun --gres=gpu:2 --gpu-tpcs=8 "$L" --device 1 --until-file "$T/stopH" --ready-file "$T/readyH" \
    >"$T/oH" 2>"$T/eH" </dev/null &
  sH=$!
  if wait_for 30 test -s "$T/readyH"; then
    rows=$("$NV" --status 2>/dev/null | grep -c slurmstepd)
    touch "$T/stopH"
    wait "$sH"
    rc=$?
    n=$(count_of "$(launched_pid "$T/oH")")
    [[ $rc == 0 && $n == 8 && $rows == 2 ]] && pass "a step given two GPUs: 8 TPCs on the second, --status lists it on both" ||
      fail "a step given two GPUs: rc=$rc, $n TPCs on GPU 1, $rows --status rows: $(cat "$T/eH")"
  else
    fail "the two-GPU step did not start: $(cat "$T/eH")"
  fi
  srun --gres=shard:2 "$L" >"$T/oI" 2>"$T/eI" </dev/null
  rc=$?
  n=$(count_of "$(launched_pid "$T/oI")")
  [[ $rc == 0 && $n == 16 ]] && pass "on a node of two GPUs of 8 shards each, --gres=shard:2 is 16 TPCs" ||
    fail "shard:2 on two GPUs: rc=$rc, $n TPCs: $(cat "$T/eI")"
  unset FAKECUDA_DEVICES
  "$CLUSTER" stop "$DIR2" >/dev/null 2>&1 || fail "stop of the two-GPU cluster"
else
  fail "the two-GPU cluster did not start"
fi
rm -rf "$DIR2"
echo "== $FAILS failure(s)"
exit $((FAILS > 0))
