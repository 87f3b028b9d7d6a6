#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_startup (bench/startup_overhead.cpp) end to end on the CPU: the real
# CLI against the stand-in driver, a child that prints what
# bench/cuda/first_kernel.cu prints, the stand-in MPS daemon. Checks what the
# GPU run relies on and cannot check itself: every configuration runs once
# per round, in the designed order (outside MPS first, then the cold run,
# then the warm ones), the CSVs hold them, the target ratio is printed, and
# MPS is stopped before (a daemon left running) and after.
#   bench_startup_smoke.sh BENCH CLI FAKECUDA FAKE_MPS_CONTROL CHILD
set -euo pipefail
BENCH=$1 CLI=$2 FAKECUDA=$3 FAKEMPS=$4 CHILD=$5
T=$(mktemp -d)
cleanup() {
  echo quit | CUDA_MPS_PIPE_DIRECTORY="$T/pipe" timeout 10 "$FAKEMPS" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- stdout"; cat "$T/out.txt" 2>/dev/null || true
  echo "--- log"; cat "$T/log.txt" 2>/dev/null || true
  exit 1
}
# Alive and not a zombie (a daemon's exit is reaped by whoever adopted it, maybe late).
alive() { [ -r "/proc/$1/stat" ] && ! awk '{ exit !($3 == "Z") }' "/proc/$1/stat"; }
unset LD_PRELOAD NVTASKSET_PARTITION NVTASKSET_TOPOLOGY CUDA_VISIBLE_DEVICES
export CUDA_MPS_PIPE_DIRECTORY="$T/pipe" CUDA_MPS_LOG_DIRECTORY="$T/log" NVTASKSET_REAL_LIBCUDA="$FAKECUDA" \
  NVTASKSET_MPS_CONTROL="$FAKEMPS" HOME="$T" XDG_CACHE_HOME="$T/cache" FAKE_MPS_IDLE_MS=30000
mkdir -p "$T/pipe" "$T/log"

"$FAKEMPS" -d  # a daemon left running: the bench must stop it before measuring
test -S "$T/pipe/control" || fail "the stand-in daemon did not start"
first_daemon=$(cat "$T/pipe/nvidia-cuda-mps-control.pid")

rc=0
timeout 120 "$BENCH" --child "$CHILD" --nvtaskset "$CLI" --list 0-1 --rounds 3 --csv "$T/runs.csv" \
  --summary-csv "$T/summary.csv" --log "$T/log.txt" --mps-control "$FAKEMPS" --timeout-s 20 >"$T/out.txt" || rc=$?
[ "$rc" = 0 ] || fail "bench_startup exited $rc"

! alive "$first_daemon" || fail "the daemon running before the bench was not stopped"
[ ! -e "$T/pipe/control" ] || fail "an MPS daemon is left running after the bench"
if [ -e "$T/pipe/nvidia-cuda-mps-control.pid" ]; then
  ! alive "$(cat "$T/pipe/nvidia-cuda-mps-control.pid")" || fail "the last daemon is still alive"
fi

# 3 rounds x 5 configurations, all measured.
[ "$(tail -n +2 "$T/runs.csv" | wc -l)" = 15 ] || fail "runs.csv has $(tail -n +2 "$T/runs.csv" | wc -l) rows, not 15"
[ "$(tail -n +2 "$T/runs.csv" | awk -F, '$4 != 1' | wc -l)" = 0 ] || fail "a run failed"
for c in plain nvt-nomps nvt-cold mps-client nvt-warm; do
  [ "$(awk -F, -v c="$c" '$2 == c' "$T/runs.csv" | wc -l)" = 3 ] || fail "$c did not run once per round"
  grep -q "^$c,3,0," "$T/summary.csv" || fail "summary.csv lacks $c"
done
# Order within each round: outside MPS (positions 0-1), the cold run (2), warm (3-4).
awk -F, 'NR > 1 {
  want = ($2 == "plain" || $2 == "nvt-nomps") ? "01" : ($2 == "nvt-cold") ? "2" : "34"
  if (index(want, $3) == 0) { print "round " $1 ": " $2 " at position " $3; bad = 1 }
} END { exit bad }' "$T/runs.csv" || fail "configurations out of order"
# The warm runs had the stand-in daemon up (it starts no server; that column stays 0).
grep -q "^startup under nvtaskset (MPS warm, cached topology) / plain: [0-9.]*x" "$T/out.txt" ||
  fail "no target line"
grep -q "nvtaskset: started the MPS control daemon" "$T/log.txt" || fail "the cold runs did not start MPS"

# mps-client-q: an MPS client given nvtaskset's queues, set for its runs only. A
# child that writes down its queue settings: the two untimed warm-ups (plain,
# --no-mps) and, per round, the start of MPS and mps-client run with
# neither; nvt-warm and mps-client-q with 8 and 2.
# (Paths single-quoted for sh, so any checkout path, "/tmp/a b" or one with
# a quote or a "$", reads back whole.)
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
cat >"$T/child.sh" <<EOS
#!/bin/sh
echo "\${CUDA_DEVICE_MAX_CONNECTIONS-}/\${CUDA_DEVICE_MAX_COPY_CONNECTIONS-}" >>$(sq "$T/queues.txt")
exec $(sq "$CHILD")
EOS
chmod +x "$T/child.sh"
rc=0
timeout 120 "$BENCH" --child "$T/child.sh" --nvtaskset "$CLI" --list 0-1 --rounds 2 --configs mps-client,nvt-warm,mps-client-q \
  --csv "$T/runs.csv" --log "$T/log.txt" --mps-control "$FAKEMPS" --timeout-s 20 >"$T/out.txt" || rc=$?
[ "$rc" = 0 ] || fail "bench_startup (mps-client-q) exited $rc"
[ "$(grep -cx / "$T/queues.txt")" = 6 ] || fail "runs without queue settings: $(tr '\n' ' ' <"$T/queues.txt")"
[ "$(grep -cx 8/2 "$T/queues.txt")" = 4 ] || fail "runs with nvtaskset's queues: $(tr '\n' ' ' <"$T/queues.txt")"
[ "$(awk -F, '$2 == "mps-client-q" && $4 == 1' "$T/runs.csv" | wc -l)" = 2 ] || fail "mps-client-q did not run twice"
grep -q "^nvtaskset (MPS warm) / MPS client with its queues: [0-9.]*x" "$T/out.txt" || fail "no own-cost line"
echo "PASS"
