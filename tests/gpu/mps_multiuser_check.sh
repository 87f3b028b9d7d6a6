#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 44, part 5's GPU check: MPS's multi-user server (`nvidia-cuda-mps-control
# -d -M`, Volta and later) through `nvtaskset --mps-multi-user`, on the real
# driver. In order:
#   1. no daemon: a user's `--mps-multi-user` launch fails in one line (root must start it);
#   2. a single-user daemon (`nvidia-cuda-mps-control -d`, started here) is refused in
#      one line by `--mps-multi-user`: nvtaskset tells the real daemon's mode;
#   3. root's `nvtaskset --mps-multi-user` starts the daemon with -d -M;
#   4. users nvt-a and nvt-b run smid_probe at once on A_TPCS and B_TPCS
#      (--mps-multi-user --partition-sm-count): both run kernels in one window
#      (%smid is virtual under MPS, so no exact TPCs here), each sees its
#      partition's SM count and uses no more SMs; nvt-b cannot steer nvt-a's
#      task; a launch of nvt-b without the option (NVTASKSET_MPS_OTHER_USER=fail)
#      runs too; --status names the server as every user's;
#   5. the daemon is stopped (echo quit | nvidia-cuda-mps-control) and no MPS
#      process is left;
#   6. the same pair with --no-mps: each ran on exactly its TPCs by %smid.
# Run as root from the repository root on the GPU machine, with the built tree
# carried (as tests/gpu/slurm_check.sh):
#
#   bash tests/gpu/mps_multiuser_check.sh
#
# Carried: .dev/nvt (bin/nvtaskset, lib/nvtaskset/libcuda.so.1: `cmake --install
# build --prefix .dev/nvt`), .dev/gpu/smid_probe (`nvcc -arch=sm_90 -o
# .dev/gpu/smid_probe tests/gpu/smid_probe.cu`). Users nvt-a and nvt-b are created
# (useradd) when missing. Settings (environment): NVT (.dev/nvt), PROBE
# (.dev/gpu/smid_probe), A_TPCS (0-15), B_TPCS (16-31): TPC lists as smid_probe
# prints them (ranges, ascending), HOLD_S (3): the common window's length.
# Refuses to run (exit 100) while any MPS process runs: that daemon is not ours.
#
# $OUT (default /tmp/nvtaskset-mpsmu-out) gets mps_multiuser_check.log (this
# run), mps-files.tgz (the daemon's logs, each program's output), env.txt.
# Exit status: the number of failed checks; 100 when something needed is missing.
set -uo pipefail
dest=${OUT:-/tmp/nvtaskset-mpsmu-out}
mkdir -p "$dest"
exec > >(tee "$dest/mps_multiuser_check.log") 2>&1

REPO=$(pwd -P)
abs() { case $1 in /*) echo "$1" ;; *) echo "$REPO/$1" ;; esac; }
NVT=$(abs "${NVT:-.dev/nvt}")
PROBE=$(abs "${PROBE:-.dev/gpu/smid_probe}")
A_TPCS=${A_TPCS:-0-15}
B_TPCS=${B_TPCS:-16-31}
HOLD_S=${HOLD_S:-3}
T0=$SECONDS
FAILS=0 PASSES=0
SUMMARY=()
pass() { echo "PASS $*"; PASSES=$((PASSES + 1)); SUMMARY+=("PASS $*"); }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); SUMMARY+=("FAIL $*"); }
check() { # check NAME DETAIL COMMAND...: PASS when COMMAND succeeds
  local name=$1 detail=$2; shift 2
  if "$@"; then pass "$name"; else fail "$name: $detail"; fi
}
say() { echo "[$((SECONDS - T0)) s] $*"; }
now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }
wait_for() { # wait_for SECONDS COMMAND...: poll every 100 ms
  local end=$(($(now_ms) + $1 * 1000)); shift
  until "$@"; do (($(now_ms) > end)) && return 1; sleep 0.1; done
}
# count_list LIST: how many TPCs a list of ranges names (0-15,20 -> 17).
count_list() {
  local n=0 item
  for item in ${1//,/ }; do
    if [[ $item == *-* ]]; then n=$((n + ${item#*-} - ${item%-*} + 1)); else n=$((n + 1)); fi
  done
  echo "$n"
}
one_line() { [[ $(printf '%s' "$1" | grep -c .) == 1 ]]; }
iters() { grep -c '^iter ' "$1" 2>/dev/null; }

{
  echo "date: $(date -u +%FT%TZ)"; uname -a; head -2 /etc/os-release 2>/dev/null
  timeout 30 nvidia-smi -L 2>&1 | head -4
  timeout 30 nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv 2>&1 | head -3
  timeout 10 nvidia-cuda-mps-control -h </dev/null 2>&1 | head -20
} >"$dest/env.txt" 2>&1

mps_pids() { local p; for p in /proc/[0-9]*; do case $(cat "$p/comm" 2>/dev/null) in nvidia-cuda-mps*) echo "${p#/proc/}" ;; esac; done; }
missing=""
[[ $(id -u) == 0 ]] || missing+=" root"
for f in "$NVT/bin/nvtaskset" "$NVT/lib/nvtaskset/libcuda.so.1" "$PROBE"; do [[ -e $f ]] || missing+=" $f"; done
command -v nvidia-cuda-mps-control >/dev/null || missing+=" nvidia-cuda-mps-control"
command -v python3 >/dev/null || missing+=" python3"
[[ -n $(mps_pids) ]] && missing+=" (no MPS process may run: $(mps_pids | tr '\n' ' '))"
if [[ -n $missing ]]; then echo "mps_multiuser_check: missing:$missing"; exit 100; fi
NA=$(count_list "$A_TPCS") NB=$(count_list "$B_TPCS")

DIR=$(mktemp -d /tmp/nvts-mpsmu.XXXXXX)
chmod 755 "$DIR"
# Copies every user can run (the repository may sit under /root).
mkdir -p "$DIR/nvt" "$DIR/w" "$DIR/log"
cp -r "$NVT/bin" "$NVT/lib" "$DIR/nvt/"
cp "$PROBE" "$DIR/smid_probe"
chmod -R a+rX "$DIR/nvt" "$DIR/smid_probe"
chmod 1777 "$DIR/w" # each user's output, ready and until files; sticky, as /tmp
NV=$DIR/nvt/bin/nvtaskset P=$DIR/smid_probe W=$DIR/w
# A pipe directory of this run's own (nvtaskset creates it, the daemon opens
# it to every user) and its log directory.
export CUDA_MPS_PIPE_DIRECTORY=$DIR/pipe CUDA_MPS_LOG_DIRECTORY=$DIR/log
unset NVTASKSET_MPS_OTHER_USER CUDA_VISIBLE_DEVICES LD_PRELOAD

no_mps() { [[ -z $(mps_pids) ]]; }
stop_daemon() { # quits the daemon at our pipe directory; true when no MPS process is left after 20 s
  [[ -S $CUDA_MPS_PIPE_DIRECTORY/control ]] && echo quit | timeout 30 nvidia-cuda-mps-control >/dev/null 2>&1
  wait_for 20 no_mps
}
finish() {
  local p
  for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  if [[ -n $(mps_pids) ]]; then
    fail "an MPS process was left at the end: $(mps_pids | tr '\n' ' '); stopping it"
    stop_daemon || for p in $(mps_pids); do kill -TERM "$p" 2>/dev/null; done
  fi
  tar -czf "$dest/mps-files.tgz" -C "$DIR" log w 2>/dev/null
  echo
  echo "==== summary ($((SECONDS - T0)) s; files in $DIR)"
  printf '%s\n' "${SUMMARY[@]}"
  echo "mps_multiuser_check: $PASSES passed, $FAILS failed"
  ((FAILS)) || rm -rf "$DIR"
  exit "$FAILS"
}
trap 'exit 143' TERM INT
trap finish EXIT

for u in nvt-a nvt-b; do
  id "$u" >/dev/null 2>&1 || useradd -M -s /bin/sh "$u" || { echo "mps_multiuser_check: cannot create user $u"; exit 100; }
  mkdir -p "$W/home-$u" && chown "$u" "$W/home-$u"
done
# as U COMMAND...: COMMAND as user U, with a home and cache of its own and the
# layout root calibrates below (a user's calibration would run under MPS,
# where %smid is virtual).
as() {
  local u=$1; shift
  setpriv --reuid="$(id -u "$u")" --regid="$(id -g "$u")" --clear-groups -- \
    env HOME="$W/home-$u" XDG_CACHE_HOME="$W/home-$u/cache" NVTASKSET_TOPOLOGY="$DIR/topology.json" "$@"
}

say "calibrating GPU 0 outside MPS"
if timeout 180 "$NV" --topology --json >"$DIR/topology-all.json" 2>"$W/topology.err" &&
  python3 -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))["devices"][0], open(sys.argv[2], "w"))' \
    "$DIR/topology-all.json" "$DIR/topology.json"; then
  chmod 644 "$DIR/topology.json"
  export NVTASKSET_TOPOLOGY=$DIR/topology.json
else
  fail "nvtaskset --topology --json: $(tail -n 2 "$W/topology.err")"
  exit
fi

# 1. No daemon: a user is told that root must start one.
out=$(as nvt-a timeout 60 "$NV" --mps-multi-user -t "$A_TPCS" "$P" --iters 1 2>&1)
rc=$?
check "1. no daemon: nvt-a's --mps-multi-user launch fails in one line saying root must start it" "rc=$rc: $out" \
  eval '[[ $rc == 1 ]] && one_line "$out" && [[ $out == *"only root can start one that serves every user"* && -z $(mps_pids) ]]'

# 2. A single-user daemon, as `nvidia-cuda-mps-control -d` leaves one, is never shared.
timeout 30 nvidia-cuda-mps-control -d
wait_for 10 test -S "$CUDA_MPS_PIPE_DIRECTORY/control" || fail "2. nvidia-cuda-mps-control -d did not start"
out=$(timeout 60 "$NV" --mps-multi-user -t "$A_TPCS" "$P" --iters 1 2>&1)
rc=$?
check "2. a single-user daemon (-d) is refused in one line by --mps-multi-user" "rc=$rc: $out" \
  eval '[[ $rc == 1 ]] && one_line "$out" && [[ $out == *"serves one user at a time: it was started without -M"* ]]'
check "2. the single-user daemon stops, no MPS process left" "left: $(mps_pids | tr '\n' ' ')" stop_daemon

# 3. Root's nvtaskset starts the multi-user daemon, in a pipe directory it
#    creates itself (0755, root's), as on a fresh node.
rm -rf "$CUDA_MPS_PIPE_DIRECTORY"
out=$(timeout 60 "$NV" --mps-multi-user -t "$A_TPCS" "$P" --iters 1 2>&1)
rc=$?
check "3. root's nvtaskset --mps-multi-user starts the daemon for every user and runs the probe" "rc=$rc: $out" \
  eval '[[ $rc == 0 && $out == *"started the MPS control daemon for every user (-M)"* ]]'
cmdline=""
for p in $(mps_pids); do
  c=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)
  [[ $c == *nvidia-cuda-mps-control* ]] && cmdline=$c
done
check "3. the control daemon runs as: $cmdline" "no control daemon with -M: $(for p in $(mps_pids); do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done)" \
  eval '[[ " $cmdline " == *" -M "* ]]'

# 4. Two users at once, each on its own TPCs under the one multi-user server.
pair() { # pair FLAG...: nvt-a on A_TPCS and nvt-b on B_TPCS, in the background, until $W/until
  rm -f "$W/until" "$W"/ready.* "$W"/[ab].out "$W"/[ab].err
  as nvt-a timeout 180 "$NV" "$@" -t "$A_TPCS" "$P" --interval-ms 5 --until-file "$W/until" --ready-file "$W/ready.a" \
    >"$W/a.out" 2>"$W/a.err" &
  PA=$!
  as nvt-b timeout 180 "$NV" "$@" -t "$B_TPCS" "$P" --interval-ms 5 --until-file "$W/until" --ready-file "$W/ready.b" \
    >"$W/b.out" 2>"$W/b.err" &
  PB=$!
}
pair_end() { # stops the pair; sets RA, RB to their exit status
  touch "$W/until"
  wait "$PA"; RA=$?
  wait "$PB"; RB=$?
}
# rows FILE: the TPC lists its kernels ran on, one a line; sms FILE: their distinct SM counts.
rows() { sed -n 's/^iter [0-9]* sms [0-9]* tpcs //p' "$1"; }
sms_seen() { sed -n 's/^iter [0-9]* sms \([0-9]*\) .*/\1/p' "$1"; }

say "two users at once under the multi-user daemon; the pipe directory: $(ls -la "$CUDA_MPS_PIPE_DIRECTORY" | tr '\n' ';')"
pair --mps-multi-user --partition-sm-count
if wait_for 90 test -s "$W/ready.a" -a -s "$W/ready.b"; then
  ia=$(iters "$W/a.out") ib=$(iters "$W/b.out")
  sleep "$HOLD_S"
  ja=$(iters "$W/a.out") jb=$(iters "$W/b.out")
  alive=$(kill -0 "$PA" 2>/dev/null && kill -0 "$PB" 2>/dev/null && echo yes || echo no)
  check "4. both users' probes ran kernels in the same ${HOLD_S} s window (nvt-a $ia -> $ja, nvt-b $ib -> $jb kernels)" \
    "alive at the end: $alive" eval '[[ $alive == yes ]] && ((ja > ia && jb > ib))'
  pidA=$(cat "$W/ready.a")
  out=$(as nvt-b timeout 60 "$NV" -p -t "$B_TPCS" "$pidA" 2>&1)
  rc=$?
  check "4. nvt-b cannot steer nvt-a's task (owner-only control under the multi-user server)" "rc=$rc: $out" \
    eval '[[ $rc == 1 ]] && one_line "$out" && [[ $out == *"belongs to another user"* ]]'
  out=$(as nvt-b env NVTASKSET_MPS_OTHER_USER=fail timeout 60 "$NV" -n 2 "$P" --iters 1 2>&1)
  rc=$?
  check "4. nvt-b's launch without the option runs beside them, told of no wait" "rc=$rc: $out" \
    eval '[[ $rc == 0 && $out != *"serves user"* ]]'
  st=$(timeout 60 "$NV" --status 2>&1)
  echo "$st" >"$W/status.txt"
  check "4. --status names the MPS server as every user's" "$(grep 'mps:' <<<"$st")" \
    eval 'grep -q "^mps: server pid [0-9]* serves every user (a multi-user daemon)" <<<"$st"'
  pair_end
  for x in a:"$NA":"$RA" b:"$NB":"$RB"; do
    IFS=: read -r who n rc <<<"$x"
    f=$W/$who.out
    want=$((2 * n))
    dev_sms=$(sed -n 's/^pid [0-9]* device 0 .* sms \([0-9]*\)$/\1/p' "$f" | head -1)
    most=$(sms_seen "$f" | sort -n | tail -1)
    over=$(sms_seen "$f" | awk -v w="$want" '$1 > w' | wc -l)
    check "4. nvt-$who's probe (exit $rc) saw $want SMs (--partition-sm-count), and its kernels used $want distinct SMs at most and at best ($(rows "$f" | wc -l) kernels; virtual %smid TPC sets: $(rows "$f" | sort | uniq -c | sort -rn | head -2 | tr '\n' ';'))" \
      "device sms '$dev_sms', most distinct SMs in a kernel '$most', kernels over $want: $over; $(tail -n 2 "$W/$who.err")" \
      eval '[[ $rc == 0 && $dev_sms == "$want" && $most == "$want" && $over == 0 ]]'
    check "4. nvt-$who was told of no wait" "$(cat "$W/$who.err")" eval '! grep -q "wait" "$W/$who.err"'
  done
else
  fail "4. the two probes did not both start within 90 s: nvt-a: $(tail -n 2 "$W/a.err"); nvt-b: $(tail -n 2 "$W/b.err")"
  pair_end
fi
cp "$W/a.out" "$W/mps-a.out" 2>/dev/null; cp "$W/b.out" "$W/mps-b.out" 2>/dev/null

# 5. Stop the daemon: nothing of MPS is left.
check "5. echo quit | nvidia-cuda-mps-control stops the daemon and its server: no MPS process left" \
  "left: $(mps_pids | tr '\n' ' ')" stop_daemon

# 6. The same pair without MPS: %smid is physical, each on exactly its TPCs.
say "the same pair with --no-mps"
pair --no-mps
if wait_for 90 test -s "$W/ready.a" -a -s "$W/ready.b"; then
  sleep 1
  pair_end
  for x in a:"$A_TPCS":"$RA" b:"$B_TPCS":"$RB"; do
    IFS=: read -r who want rc <<<"$x"
    f=$W/$who.out
    n=$(rows "$f" | wc -l)
    other=$(rows "$f" | grep -vx -- "$want" | sort | uniq -c | head -3 | tr '\n' ';')
    check "6. --no-mps: nvt-$who's $n kernels all ran on exactly TPCs $want" "exit $rc, other TPC sets: $other" \
      eval '[[ $rc == 0 ]] && ((n >= 5)) && [[ -z $other ]]'
  done
else
  fail "6. the --no-mps pair did not both start within 90 s: $(tail -n 2 "$W/a.err") $(tail -n 2 "$W/b.err")"
  pair_end
fi
check "6. no MPS process appeared with --no-mps" "$(mps_pids | tr '\n' ' ')" no_mps
