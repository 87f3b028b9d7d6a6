#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The evaluation (docs/results.md) on a GPU machine, unattended. Builds
# nothing: bench/build_eval.sh built the programs into BIN, which travels with
# the checkout. Runs bench/eval.py under a hard time limit, stops MPS whatever
# happens, and leaves three files in $OUT (default /tmp/nvtaskset-eval-out):
#   eval-results.tar.gz   every CSV, the topology, all logs (tar xzf: nvtaskset-eval/)
#   summary.txt           the tables
#   eval-tail.log         the last 200 lines of the log
#
#   bench/run_eval.sh [--quick|--full] [--sections LIST] [BIN]     (BIN default .dev/eval)
# --quick: every section in about 6 minutes on an H100/H200 (killed at 7.5).
# --full: each call is killed at 9.5 minutes, so run it twice:
#   --full --sections startup        and    --full --sections latency,enforce,mechanisms,granularity
set -u
cd "$(dirname "$0")/.."
MODE=--quick
BIN=.dev/eval
SECTIONS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick | --full) MODE=$1 ;;
    --sections) SECTIONS=(--sections "$2"); shift ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) BIN=$1 ;;
  esac
  shift
done
OUT=${OUT:-/tmp/nvtaskset-eval-out}
WORK=${EVAL_WORK:-/tmp/nvtaskset-eval}
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK"
stop_mps() { echo quit | timeout 30 nvidia-cuda-mps-control >/dev/null 2>&1 || true; }
trap stop_mps EXIT
trap 'exit 130' INT TERM
if [ "$MODE" = --full ]; then LIMIT=565 BUDGET=520; else LIMIT=450 BUDGET=390; fi
timeout -k 15 "$LIMIT" python3 bench/eval.py "$MODE" --bin "$BIN" --out "$WORK" --budget-s "$BUDGET" "${SECTIONS[@]}"
rc=$?
stop_mps
tar czf "$OUT/eval-results.tar.gz" -C "$(dirname "$WORK")" "$(basename "$WORK")"
cp "$WORK/summary.txt" "$OUT/summary.txt" 2>/dev/null || echo "no summary (rc=$rc)" > "$OUT/summary.txt"
tail -n 200 "$WORK/eval.log" > "$OUT/eval-tail.log" 2>/dev/null || true
echo "run_eval: eval.py rc=$rc; results in $OUT (eval-results.tar.gz, summary.txt, eval-tail.log)"
exit $rc
