#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_persistent (bench/persistent_grid.cpp) end to end on the CPU: the real
# CLI and shim against the stand-in driver posing as an H100 (132 SMs, cc 9.0,
# the measured H100 layout of tests/data/topology/ under the stand-in's UUID),
# so `-n 16` means what it means on the GPU. The child is persistent_stub,
# which reads MULTIPROCESSOR_COUNT through the shim as cudart would. Checks
# what the GPU run relies on: each variant runs once per round, B (with
# --partition-sm-count) reads its partition's 32 SMs while A and the whole
# GPU read 132, the table and the ratio line are printed, and a child that
# fails or hangs ends the run with one line and a non-zero status. Timings are
# the stub's made-up numbers and are never checked.
#   bench_persistent_smoke.sh BENCH CLI FAKECUDA STUB H100_TOPOLOGY
set -euo pipefail
BENCH=$1 CLI=$2 FAKECUDA=$3 STUB=$4 H100=$5
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
  echo "FAIL: $*"
  for f in out.txt err.txt log.txt runs.csv; do
    echo "--- $f"
    cat "$T/$f" 2>/dev/null || true
  done
  exit 1
}
unset LD_PRELOAD NVTASKSET_PARTITION NVTASKSET_SM_COUNT CUDA_VISIBLE_DEVICES
sed 's/"uuid": "[^"]*"/"uuid": "GPU-fa4ecda0-0000-4000-8000-000000000000"/' "$H100" >"$T/h100.json"
export NVTASKSET_REAL_LIBCUDA="$FAKECUDA" NVTASKSET_TOPOLOGY="$T/h100.json" FAKECUDA_CC=9.0 FAKECUDA_SM_COUNT=132 \
  CUDA_MPS_PIPE_DIRECTORY="$T/pipe" CUDA_MPS_LOG_DIRECTORY="$T/mpslog" HOME="$T" XDG_CACHE_HOME="$T/cache"

# No --nvtaskset: the bench finds ../bin/nvtaskset next to itself (build/bench -> build/bin).
[ "$(dirname "$(dirname "$BENCH")")/bin/nvtaskset" -ef "$CLI" ] || fail "the build does not put nvtaskset at ../bin"
rc=0
timeout 120 "$BENCH" --rounds 3 --count 16 --no-mps --csv "$T/runs.csv" --log "$T/log.txt" "$STUB" --tiles 1056 \
  >"$T/out.txt" 2>"$T/err.txt" || rc=$?
[ "$rc" = 0 ] || fail "bench_persistent exited $rc"

# 3 rounds x 3 variants, each once per round.
[ "$(tail -n +2 "$T/runs.csv" | wc -l)" = 9 ] || fail "runs.csv has $(tail -n +2 "$T/runs.csv" | wc -l) rows, not 9"
for r in 0 1 2; do
  [ "$(awk -F, -v r="$r" '$1 == r { print $2 }' "$T/runs.csv" | sort | tr -d '\n')" = ABC ] ||
    fail "round $r did not run A, B and C once each"
done
# The SM count each variant read (both paths through the shim), and its grid.
awk -F, 'NR > 1 {
  want = ($2 == "B") ? 32 : 132
  if ($4 != want || $5 != want || $6 != want || $8 != 1056) { print "row " NR ": " $0; bad = 1 }
} END { exit bad }' "$T/runs.csv" || fail "a variant read the wrong SM count"
# The table: one row per variant with its SM count, then the ratio line.
grep -Eq '^A +nvtaskset -n 16 +3 +132 +132 +132 +1 +1056 ' "$T/out.txt" || fail "no row for A"
grep -Eq '^B +nvtaskset -n 16 --partition-sm-count +3 +32 +32 +32 +1 +1056 ' "$T/out.txt" || fail "no row for B"
grep -Eq '^C +whole GPU, no nvtaskset +3 +132 +132 +132 +1 +1056 ' "$T/out.txt" || fail "no row for C"
# The ratios of the stub's made-up numbers (ceil(1056 / sms) x 0.01 ms: 0.08
# for 132 SMs, 0.33 for 32): arithmetic and which variant is which, not timing.
grep -q '^ratio A/B=0.242 A/C=1.000 B/C=4.125 (medians; A/B per round, median 0.242' "$T/out.txt" || fail "no ratio line"
! grep -q '^warning' "$T/out.txt" || fail "a warning on a consistent run"
# What nvtaskset told the shim: B's runs (the warm-up and 3 rounds) only.
[ "$(grep -c '^env NVTASKSET_SM_COUNT=partition$' "$T/log.txt")" = 4 ] || fail "B did not run with NVTASKSET_SM_COUNT=partition"
[ "$(grep -c '^env NVTASKSET_SM_COUNT=' "$T/log.txt")" = 12 ] || fail "the children's stderr is not in the log"

# A failing child: one line naming it, status 1, no table.
rc=0
timeout 120 "$BENCH" --nvtaskset "$CLI" --rounds 2 --no-mps "$STUB" --fail >"$T/out.txt" 2>"$T/err.txt" || rc=$?
[ "$rc" = 1 ] || fail "a failing child: bench_persistent exited $rc, not 1"
[ "$(grep -c '^bench_persistent: .* failed: exit status 1$' "$T/err.txt")" = 1 ] || fail "no one-line report of the failure"
[ ! -s "$T/out.txt" ] || fail "a table after a failed run"

# A child that hangs is killed at the timeout, and reported the same way.
rc=0
timeout 60 "$BENCH" --nvtaskset "$CLI" --no-mps --timeout-s 1 "$STUB" --hang >"$T/out.txt" 2>"$T/err.txt" || rc=$?
[ "$rc" = 1 ] || fail "a hanging child: bench_persistent exited $rc, not 1"
grep -q '^bench_persistent: warm-up run A .* failed: ran past 1 s; killed$' "$T/err.txt" || fail "no report of the kill"

# Bad usage: no program.
rc=0
"$BENCH" --nvtaskset "$CLI" >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "no PROGRAM: exit $rc, not 2"
echo "PASS"
