#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Slurm plugin's one GPU check: a one-node Slurm (tests/slurm/cluster.sh, run from a
# carried Debian 12 bundle, `cluster.sh bundle .dev/slurm-bundle`) on the real
# driver, 8 shards on /dev/nvidia0, spank_nvtaskset.so with no-mps. Two
# concurrent `srun --gres=shard:2 smid_probe` steps must run on disjoint TPC
# sets of floor(T*2/8) TPCs each (16 on a 66-TPC H100/H200), as %smid shows
# (physical outside MPS); a concurrent `--gpu-tpcs=8` step on 8 TPCs disjoint
# from both; `nvtaskset --status` lists the running steps; `--gpu-tpcs=999`
# fails (srun exit non-zero, the program never runs); a `--gpu-tpcs=16
# --gpu-role=latency-critical` step alone bursts onto every TPC; a
# `--gpu-role=best-effort` step next to a busy latency-critical step runs on
# every TPC but its reservation; the TPCs are free after.
# Run as root from the repository root on the GPU machine:
#
#   bash tests/gpu/slurm_check.sh
#
# Carried: .dev/nvt (bin/nvtaskset, lib/nvtaskset/libcuda.so.1,
# lib/slurm/spank_nvtaskset.so), .dev/gpu/smid_probe, .dev/gpu/busy, .dev/slurm-bundle.
# Settings (environment): NVT (.dev/nvt), BUNDLE (.dev/slurm-bundle), PROBE
# (.dev/gpu/smid_probe), BUSY (.dev/gpu/busy), GPU_DEV (/dev/nvidia0; empty: the harness's mknod
# stand-in), SHARDS (8), CHECK_SECONDS (200: the whole run's budget).
# Dry run on a CPU machine with the stand-in driver: STANDIN_LAUNCHER=<build>/tests/e2e/launcher
# NVTASKSET_REAL_LIBCUDA=<build>/tests/fakecuda/lib/libcuda.so.1 GPU_DEV= (a
# wrapper turns the stand-in's record into smid_probe's lines; 64 TPCs).
#
# $OUT (default /tmp/nvtaskset-slurm-out) gets: slurm_check.log (this run),
# slurm-files.tgz (the cluster's config and logs, each step's output),
# env.txt. Exit status: the number of failed checks; 100 when something
# needed is missing.
set -uo pipefail
dest=${OUT:-/tmp/nvtaskset-slurm-out}
mkdir -p "$dest"
LOG=$dest/slurm_check.log
exec > >(tee "$LOG") 2>&1

REPO=$(pwd -P)
abs() { case $1 in /*) echo "$1" ;; *) echo "$REPO/$1" ;; esac; }
NVT=$(abs "${NVT:-.dev/nvt}")
BUNDLE=$(abs "${BUNDLE:-.dev/slurm-bundle}")
PROBE=$(abs "${PROBE:-.dev/gpu/smid_probe}")
GPU_DEV=${GPU_DEV-/dev/nvidia0}
SHARDS=${SHARDS:-8}
BUDGET=${CHECK_SECONDS:-200}
CLUSTER=$REPO/tests/slurm/cluster.sh
NV=$NVT/bin/nvtaskset
PLUGIN=$NVT/lib/slurm/spank_nvtaskset.so
T0=$SECONDS
FAILS=0 PASSES=0
SUMMARY=()

pass() { echo "PASS $*"; PASSES=$((PASSES + 1)); SUMMARY+=("PASS $*"); }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); SUMMARY+=("FAIL $*"); }
say() { echo "[$((SECONDS - T0)) s] $*"; }
# left CAP: seconds to give the next wait: CAP, or what is left of the budget
# (at least 1, keeping 20 s for the stop).
left() { local l=$((BUDGET - 20 - (SECONDS - T0))); ((l < 1)) && l=1; ((l < $1)) && echo "$l" || echo "$1"; }
now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }
wait_for() { # wait_for SECONDS COMMAND...: poll every 100 ms
  local end=$(($(now_ms) + $1 * 1000)); shift
  until "$@"; do (($(now_ms) > end)) && return 1; sleep 0.1; done
}

{
  echo "date: $(date -u +%FT%TZ)"; uname -a; cat /etc/os-release 2>/dev/null | head -2
  ldd --version 2>&1 | head -1; nvidia-smi -L 2>&1 | head -4
  nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv 2>&1 | head -3
  echo "bundle: $(cat "$BUNDLE/MANIFEST" 2>/dev/null | head -1)"; du -sh "$BUNDLE" 2>&1
} >"$dest/env.txt" 2>&1

missing=""
[[ $(id -u) == 0 ]] || missing+=" root"
for f in "$NV" "$NVT/lib/nvtaskset/libcuda.so.1" "$PLUGIN" "$CLUSTER"; do [[ -e $f ]] || missing+=" $f"; done
[[ -n ${STANDIN_LAUNCHER:-} ]] && { [[ -x $STANDIN_LAUNCHER ]] || missing+=" $STANDIN_LAUNCHER"; } || { [[ -x $PROBE ]] || missing+=" $PROBE"; }
[[ -d $BUNDLE ]] || missing+=" $BUNDLE"
[[ -z $GPU_DEV || -c $GPU_DEV ]] || missing+=" $GPU_DEV(a character device)"
if [[ -n $missing ]]; then echo "slurm_check: missing:$missing"; exit 100; fi

DIR=$(mktemp -d /tmp/nvts-gpu.XXXXXX) # short: Unix sockets live under it
W=$DIR/w
STOPPED=0
# MPS: none is started (no-mps); any control daemon or server that appears
# while this runs is ours to stop.
mps_pids() { local p; for p in /proc/[0-9]*; do case $(cat "$p/comm" 2>/dev/null) in nvidia-cuda-mps*) echo "${p#/proc/}" ;; esac; done; }
MPS_BEFORE=" $(mps_pids | tr '\n' ' ') "

finish() {
  local p new=""
  for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  mkdir -p "$W"
  ((STOPPED)) || "$CLUSTER" stop "$DIR" >"$W/stop.log" 2>&1
  remove_slice
  for p in $(mps_pids); do [[ $MPS_BEFORE == *" $p "* ]] || new+=" $p($(cat /proc/$p/comm 2>/dev/null))"; done
  if [[ -n $new ]]; then
    echo "FAIL an MPS process appeared during the check:$new; stopping it"
    FAILS=$((FAILS + 1))
    for p in $new; do kill -TERM "${p%%(*}" 2>/dev/null; done
  fi
  tar -czf "$dest/slurm-files.tgz" -C "$DIR" --exclude='munge/munge.key' --exclude='munge/munge.socket*' \
    slurm.conf gres.conf plugstack.conf log w 2>/dev/null
  echo
  echo "==== summary ($((SECONDS - T0)) s; cluster in $DIR)"
  printf '%s\n' "${SUMMARY[@]}"
  echo "slurm_check: $PASSES passed, $FAILS failed"
  ((FAILS)) || rm -rf "$DIR"
  exit "$FAILS"
}
trap 'exit 143' TERM INT
trap finish EXIT

# slurmd 22.05 initialises the cgroup plugin of the machine's hierarchy
# whatever the config; with cgroup v2 and no systemd (the lent GPU VMs:
# Ubuntu 24.04, cgroup2 only) it wants /sys/fs/cgroup/system.slice to put its
# scope in, and stops without it. Made here when missing, removed after.
MADE_SLICE=0
if [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs && ! -d /sys/fs/cgroup/system.slice ]]; then
  mkdir /sys/fs/cgroup/system.slice && MADE_SLICE=1 && say "made /sys/fs/cgroup/system.slice (cgroup v2 without systemd)"
fi
remove_slice() {
  ((MADE_SLICE)) || return 0
  find /sys/fs/cgroup/system.slice -depth -type d -exec rmdir {} \; 2>/dev/null
  [[ -d /sys/fs/cgroup/system.slice ]] && echo "note: /sys/fs/cgroup/system.slice could not be removed" || true
}

say "starting the cluster from $BUNDLE ($SHARDS shards on ${GPU_DEV:-the stand-in device node})"
if ! "$CLUSTER" start "$DIR" --prefix "$BUNDLE" --shards "$SHARDS" ${GPU_DEV:+--gpu-file "$GPU_DEV"} \
  --owner $$ --max-seconds $((BUDGET + 60)) --timeout "$(left 30)"; then
  fail "the cluster did not start"
  exit 1
fi
eval "$("$CLUSTER" env "$DIR")"
mkdir -m 0755 "$W" "$W/status"
chmod 1777 "$W/status"
pass "cluster up in $(cat "$DIR/run/start_ms") ms from the bundle: $(sinfo -h -N -o '%N %t %G' 2>&1)"

# No LD_LIBRARY_PATH or LD_PRELOAD of ours reaches the steps (srun hands its
# whole environment to them); the bundle's clients run through DIR/bin.
unset LD_PRELOAD CUDA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
[[ -n ${STANDIN_LAUNCHER:-} ]] || unset LD_LIBRARY_PATH
export NVTASKSET_STATUS_DIR=$W/status # private: only this check's partitions
# plugstack.conf splits its lines at whitespace, quoted or not: a plugin or
# nvtaskset at a path with spaces (a checkout at "/tmp/a b") is run from a
# copy in DIR (nvtaskset finds its shim at ../lib/nvtaskset).
if [[ $PLUGIN$NV =~ [[:space:]] ]]; then
  mkdir -p "$DIR/nvt/bin" "$DIR/nvt/lib/nvtaskset" "$DIR/nvt/lib/slurm" &&
    cp "$NV" "$DIR/nvt/bin/nvtaskset" && cp "$NVT/lib/nvtaskset/libcuda.so.1" "$DIR/nvt/lib/nvtaskset/libcuda.so.1" &&
    cp "$PLUGIN" "$DIR/nvt/lib/slurm/spank_nvtaskset.so" && chmod -R a+rX "$DIR/nvt" ||
    { fail "copying nvtaskset and the plugin from $NVT into $DIR/nvt"; exit 1; }
  say "$NVT's path has whitespace: nvtaskset and the plugin run from copies in $DIR/nvt"
  NV=$DIR/nvt/bin/nvtaskset PLUGIN=$DIR/nvt/lib/slurm/spank_nvtaskset.so
fi
echo "required $PLUGIN no-mps nvtaskset=$NV" >"$NVTS_SLURM_PLUGSTACK"
say "plugstack.conf: $(cat "$NVTS_SLURM_PLUGSTACK")"

if [[ -n ${STANDIN_LAUNCHER:-} ]]; then
  # The dry run: a probe that prints smid_probe's lines from the stand-in's
  # record (identity layout: TPC k is disable-mask bit k).
  # identity layout: 64 TPCs, one 64-bit disable mask
  export FAKECUDA_SM_COUNT=${FAKECUDA_SM_COUNT:-128} FAKECUDA_RECORD=$W/record
  export STANDIN_RECORD_LIB=$REPO/tests/slurm/standin_record.sh
  : >"$FAKECUDA_RECORD"; chmod 666 "$FAKECUDA_RECORD"
  PROBE=$W/standin_probe
  cat >"$PROBE" <<'EOF'
#!/usr/bin/env bash
# smid_probe's interface over the e2e launcher and the stand-in's record.
args=() ready="" iters=1
while (($#)); do
  case $1 in
    --iters) iters=$2; shift 2 ;;
    --ready-file) ready=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
source "$STANDIN_RECORD_LIB" # standin_tpcs
line() {
  local out
  out=$(standin_tpcs "$FAKECUDA_RECORD" "$1" $((FAKECUDA_SM_COUNT / 2))) || return 1
  echo "iter $2 sms $((2 * ($(tr -cd , <<<"$out" | wc -c) + 1))) tpcs $out"
}
out=$(mktemp)
STANDIN_LAUNCHER_PATH=${0%/*}/launcher
"$STANDIN_LAUNCHER_PATH" --kernels "$iters" --ready-file "$out.ready" "${args[@]}" >"$out" 2>&1 &
l=$!
for _ in $(seq 1 600); do [[ -s $out.ready ]] && break; kill -0 $l 2>/dev/null || break; sleep 0.05; done
pid=$(sed -n 's/^pid \([0-9]*\)$/\1/p' "$out" | head -1)
[[ -n $pid ]] && echo "pid $pid device 0 Stand-in sms $FAKECUDA_SM_COUNT" && line "$pid" 0
[[ -n $ready && -n $pid ]] && echo "$pid" >"$ready"
wait $l; rc=$?
[[ -n $pid ]] && line "$pid" 1
cat "$out" >&2; rm -f "$out" "$out.ready"
exit $rc
EOF
  cp "$STANDIN_LAUNCHER" "$W/launcher"
  chmod 755 "$PROBE" "$W/launcher"
  say "dry run: the stand-in driver ($NVTASKSET_REAL_LIBCUDA), $PROBE"
fi

# The GPU's TPC count, as the plugin sees it (nvtaskset --topology --json).
topo=$(timeout "$(left 60)" "$NV" --topology --json 2>"$W/topology.err")
echo "$topo" >"$W/topology.json"
T=$(python3 -c 'import json,sys; print(len(json.load(sys.stdin)["devices"][0]["tpcs"]))' <<<"$topo" 2>/dev/null)
if [[ ! $T =~ ^[0-9]+$ ]]; then
  fail "nvtaskset --topology --json: $(head -c 400 "$W/topology.err")"
  exit 1
fi
EXPECT=$((T * 2 / SHARDS)); ((EXPECT < 1)) && EXPECT=1
say "device 0: $T TPCs; a shard:2 step of $SHARDS shards gets floor($T*2/$SHARDS) = $EXPECT"

# tpcs_of FILE: the TPC list of the last kernel line in FILE, expanded.
tpcs_of() {
  local l
  l=$(grep -E '^(pid [0-9]+ )?iter [0-9]+ sms' "$1" | tail -1 | sed 's/.* tpcs //')
  python3 - "$l" <<'EOF'
import sys
s = sys.argv[1].strip()
out = []
for part in filter(None, s.split(",")):
    a, _, b = part.partition("-")
    out += range(int(a), int(b or a) + 1)
print(",".join(map(str, sorted(set(out)))))
EOF
}
count() { [[ -z $1 ]] && echo 0 || echo $(($(tr -cd , <<<"$1" | wc -c) + 1)); }
disjoint() { local x; [[ -n $1 && -n $2 ]] || return 1; for x in ${1//,/ }; do [[ ,$2, == *,$x,* ]] && return 1; done; return 0; }
# One CUDA init, a first calibration: the first steps may take a while.
S=$(left 120)
say "two concurrent steps: srun --gres=shard:2 $PROBE --interval-ms 50 (until-file, at most ${S} s)"
timeout "$S" srun -J shardA --gres=shard:2 "$PROBE" --interval-ms 50 --until-file "$W/stop" --ready-file "$W/readyA" \
  >"$W/oA" 2>"$W/eA" </dev/null &
sA=$!
timeout "$S" srun -J shardB --gres=shard:2 "$PROBE" --interval-ms 50 --until-file "$W/stop" --ready-file "$W/readyB" \
  >"$W/oB" 2>"$W/eB" </dev/null &
sB=$!
if wait_for "$(left 60)" test -s "$W/readyA" -a -s "$W/readyB"; then
  # Both steps' kernel lines have come through srun's forwarding (the ready
  # files are written by the tasks themselves, their output goes via srun).
  wait_for "$(left 30)" sh -c "grep -q '^iter' '$W/oA' && grep -q '^iter' '$W/oB'"
  sleep 0.3 # a few more kernels each, both running
  a=$(tpcs_of "$W/oA") b=$(tpcs_of "$W/oB")
  na=$(count "$a") nb=$(count "$b")
  say "step A (pid $(cat "$W/readyA")): $na TPCs: $a"
  say "step B (pid $(cat "$W/readyB")): $nb TPCs: $b"
  [[ $na == "$EXPECT" && $nb == "$EXPECT" ]] && pass "each shard:2 step's kernels ran on $EXPECT TPCs (%smid)" ||
    fail "shard:2 steps on $na and $nb TPCs, expected $EXPECT each"
  disjoint "$a" "$b" && pass "the two concurrent shard:2 steps ran on disjoint TPCs" ||
    fail "the two shard:2 steps share TPCs: A $a / B $b"
  st=$("$NV" --status 2>&1); echo "$st" >"$W/status_during.txt"
  echo "--- nvtaskset --status during the steps"; echo "$st"
  [[ $(grep -cE 'slurmstepd: \[[0-9]+\.[0-9]+\]' <<<"$st") -ge 2 ]] && pass "--status lists both running steps as slurmstepd: [job.step]" ||
    fail "--status during the steps does not list two slurmstepd entries"
  # A third step beside them: --gpu-tpcs=8, no --gres.
  timeout "$(left 60)" srun -J tpcs8 --gpu-tpcs=8 "$PROBE" --iters 1 >"$W/o8" 2>"$W/e8" </dev/null
  rc=$?
  c=$(tpcs_of "$W/o8"); nc=$(count "$c")
  say "srun --gpu-tpcs=8 (rc $rc): $nc TPCs: $c"
  [[ $rc == 0 && $nc == 8 ]] && pass "srun --gpu-tpcs=8 ran on 8 TPCs" || fail "srun --gpu-tpcs=8: rc=$rc, $nc TPCs: $(tail -3 "$W/e8")"
  disjoint "$c" "$a" && disjoint "$c" "$b" && pass "the --gpu-tpcs=8 step's TPCs are disjoint from both running steps'" ||
    fail "the --gpu-tpcs=8 step shares TPCs with a running step"
else
  fail "the shard:2 steps did not both start: $(tail -3 "$W/eA" "$W/eB" 2>&1 | tr '\n' ' ')"
fi
touch "$W/stop"
wait_for "$(left 30)" bash -c "! kill -0 $sA 2>/dev/null && ! kill -0 $sB 2>/dev/null"
wait "$sA"; rA=$?
wait "$sB"; rB=$?
[[ $rA == 0 && $rB == 0 ]] && pass "both shard:2 steps exited 0" || fail "shard:2 steps exited $rA and $rB: $(tail -2 "$W/eA" "$W/eB" 2>&1 | tr '\n' ' ')"

# A count the GPU does not have: the step fails, the program never runs.
timeout "$(left 30)" srun -J bad --gpu-tpcs=999 "$PROBE" --iters 1 >"$W/obad" 2>"$W/ebad" </dev/null
rc=$?
[[ $rc != 0 ]] && ! grep -q 'iter ' "$W/obad" &&
  pass "srun --gpu-tpcs=999 fails (exit $rc) before the program runs: $(grep -m1 -i 'nvtaskset' "$W/ebad")" ||
  fail "srun --gpu-tpcs=999: exit $rc: $(cat "$W/obad" "$W/ebad" | head -5)"

# A role through the plugin (--gpu-role): a latency-critical step of 16 TPCs,
# alone on the GPU, bursts onto every TPC while it has work (a step of 16
# without the role ran on 16, above): the role reached its task.
timeout "$(left 60)" srun -J lc --gpu-tpcs=16 --gpu-role=latency-critical "$PROBE" --iters 2 >"$W/olc" 2>"$W/elc" </dev/null
rc=$?
c=$(tpcs_of "$W/olc"); nc=$(count "$c")
say "srun --gpu-tpcs=16 --gpu-role=latency-critical (rc $rc): $nc TPCs: $c"
[[ $rc == 0 && $nc == "$T" ]] && pass "srun --gpu-tpcs=16 --gpu-role=latency-critical alone: its kernels burst onto all $T TPCs (%smid)" ||
  fail "the latency-critical step: rc=$rc, $nc TPCs: $(tail -3 "$W/elc")"

# A best-effort step next to a busy latency-critical step: while the LC
# step's compute-bound kernels run back to back, the BE step's kernels run
# on its floor, every TPC but the LC step's reservation (%smid), and
# --status shows both roles. Not in the dry run: the stand-in's kernels
# end at once, so its LC step is never busy.
if [[ -z ${STANDIN_LAUNCHER:-} ]]; then
  BUSY=$(abs "${BUSY:-.dev/gpu/busy}")
  bt=$("$BUSY" --work 40 2>/dev/null | sed -n 's/.*busy: \([0-9.]*\) s.*/\1/p')
  work=$(python3 -c "import sys; t=float(sys.argv[1] or 0.4); print(max(40, int(8.0 / max(t / 40, 1e-4))))" "$bt")
  say "srun --gpu-tpcs=16 --gpu-role=latency-critical $BUSY --work $work (about 8 s), then a --gpu-role=best-effort probe beside it"
  # (Its top-up off, NVTASKSET_LC_TOPUP=off, passed on by srun: the floor is then every TPC but the
  # reservation; verify.py roles f checks the top-up.)
  NVTASKSET_LC_TOPUP=off timeout "$(left 60)" srun -J lcbusy --gpu-tpcs=16 --gpu-role=latency-critical "$BUSY" --work "$work" \
    >"$W/olcb" 2>"$W/elcb" </dev/null &
  sL=$!
  lc_res() { "$NV" --status --json 2>/dev/null | python3 -c '
import json, sys
for t in json.load(sys.stdin).get("tasks", []):
    if t.get("role") == "latency-critical":
        print(t["tpcs"]); break'; }
  lc_listed() { "$NV" --status --json 2>/dev/null | grep -q '"latency-critical"'; }
  if wait_for "$(left 30)" lc_listed; then
    sleep 2 # its kernels running back to back for a while
    res=$(lc_res)
    timeout "$(left 60)" srun -J be --gpu-role=best-effort "$PROBE" --iters 3 --interval-ms 300 \
      >"$W/obe" 2>"$W/ebe" </dev/null &
    sE=$!
    wait_for "$(left 20)" sh -c "grep -q '^iter' '$W/obe'"
    "$NV" --status --json >"$W/status_roles.json" 2>&1
    wait "$sE"; rc=$?
    be=$(tpcs_of "$W/obe"); nbe=$(count "$be")
    exp=$(python3 - "$T" "$res" <<'PY'
import sys
n, res = int(sys.argv[1]), set()
for part in filter(None, sys.argv[2].split(",")):
    a, _, b = part.partition("-")
    res |= set(range(int(a), int(b or a) + 1))
print(",".join(str(t) for t in range(n) if t not in res))
PY
)
    say "LC step's reservation: $res; BE step (rc $rc): $nbe TPCs: $be"
    [[ $rc == 0 && -n $res && $be == "$exp" ]] &&
      pass "a --gpu-role=best-effort step next to a busy latency-critical step runs on its floor: every TPC but $res (%smid)" ||
      fail "the best-effort step beside the busy LC step: rc=$rc, ran on $be, expected $exp: $(tail -3 "$W/ebe")"
    roles=$(python3 -c 'import json,sys; print(" ".join(sorted(str(t.get("role")) for t in json.load(sys.stdin).get("tasks", []))))' <"$W/status_roles.json" 2>&1)
    [[ $roles == *best-effort* && $roles == *latency-critical* ]] &&
      pass "--status --json shows both steps' roles: $roles" || fail "--status --json roles during the two steps: $roles"
  else
    fail "the busy latency-critical step did not appear in --status: $(tail -3 "$W/elcb")"
  fi
  wait "$sL"; rc=$?
  [[ $rc == 0 ]] && pass "the busy latency-critical step exited 0" || fail "the busy latency-critical step exited $rc: $(tail -3 "$W/elcb")"
fi

none_listed() { ! "$NV" --status 2>/dev/null | grep -q slurmstepd; }
wait_for "$(left 10)" none_listed && pass "after the steps, --status lists no step" ||
  fail "after the steps, --status still lists: $("$NV" --status 2>&1)"

"$CLUSTER" stop "$DIR" >"$W/stop.log" 2>&1 && pass "cluster.sh stop: no process of the cluster left ($(cat "$DIR/run/stop_ms") ms)" ||
  fail "cluster.sh stop: $(cat "$W/stop.log")"
STOPPED=1
exit "$FAILS"
