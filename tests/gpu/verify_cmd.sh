#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `nvtaskset --verify` on a real GPU, both ways:
#   1. with the GPU's own layout it passes (exit 0, every line "ok"), in under 10 s;
#   2. with a layout whose TPCs 0 and 1 have their mask bits swapped it fails
#      (exit 2), and every FAIL line names TPC 0 or 1 as where blocks ran outside:
#      the check can fail, and says where.
# Prints one PASS/FAIL line per check (the nvtaskset output above them) and
# exits with the number of failures. Every GPU command has a timeout.
#
#   NVT_BUILD=.dev/nvt bash tests/gpu/verify_cmd.sh        # DEV=1 for another GPU
set -u
build=${NVT_BUILD:?set NVT_BUILD to a build tree or a copy of its bin/ and lib/}
nvt=$build/bin/nvtaskset
dev=${DEV:-0}
tmp=$(mktemp -d /tmp/nvtaskset-verify-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
pass() { echo "PASS $*"; }
fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# 0. The layout (calibrated now if not cached), so that run 1 times the check.
if ! timeout 120 "$nvt" --topology --json >"$tmp/topology.json" 2>"$tmp/topology.err"; then
  fail "nvtaskset --topology --json: $(tail -n 1 "$tmp/topology.err")"
  exit "$failures"
fi

# 1. The GPU's own layout.
t0=$(date +%s%N)
timeout 60 "$nvt" --verify -d "$dev" >"$tmp/good.out" 2>"$tmp/good.err"
rc=$?
ms=$(ms_since "$t0")
echo "--- nvtaskset --verify -d $dev (exit $rc, $ms ms)"
cat "$tmp/good.out" "$tmp/good.err"
oks=$(grep -c '^ok   -' "$tmp/good.out")
fails=$(grep -c '^FAIL -' "$tmp/good.out")
if [ "$rc" -eq 0 ] && [ "$fails" -eq 0 ] && [ "$oks" -ge 23 ] && grep -q '^PASS: all ' "$tmp/good.out"; then
  pass "--verify with the GPU's layout: exit 0, $oks partitions ok"
else
  fail "--verify with the GPU's layout: exit $rc, $oks ok, $fails FAIL"
fi
if [ "$ms" -lt 10000 ]; then pass "--verify took $ms ms (< 10 s)"; else fail "--verify took $ms ms (>= 10 s)"; fi

# 2. The same layout with the bits of TPCs 0 and 1 swapped (in every GPU of
# the file; only the verified one matters). They sit in different GPCs, so
# some GPC partitions catch it as well as the random lists.
python3 - "$tmp/topology.json" "$tmp/wrong.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for d in doc["devices"]:
    t = {e["tpc"]: e for e in d["tpcs"]}
    t[0]["bit"], t[1]["bit"] = t[1]["bit"], t[0]["bit"]
json.dump(doc, open(sys.argv[2], "w"), indent=1)
PY
t0=$(date +%s%N)
timeout 60 "$nvt" --verify -d "$dev" --topology-file "$tmp/wrong.json" --seed 2026 >"$tmp/wrong.out" 2>"$tmp/wrong.err"
rc=$?
ms=$(ms_since "$t0")
echo "--- nvtaskset --verify -d $dev --topology-file wrong.json --seed 2026 (TPCs 0 and 1 swapped; exit $rc, $ms ms)"
cat "$tmp/wrong.out" "$tmp/wrong.err"
fails=$(grep -c '^FAIL -' "$tmp/wrong.out")
# A partition fails exactly when it holds one of TPCs 0 and 1, and its blocks
# then run on the other one.
stray=$(grep '^FAIL -' "$tmp/wrong.out" | grep -Ecv ': [0-9]+ of [0-9]+ blocks on TPC [01] outside the partition$')
if [ "$rc" -eq 2 ] && [ "$fails" -ge 1 ] && [ "$stray" -eq 0 ] && grep -q '^FAIL: ' "$tmp/wrong.out"; then
  pass "--verify with TPCs 0 and 1 swapped: exit 2, $fails FAIL lines, each naming TPC 0 or 1 outside"
else
  fail "--verify with TPCs 0 and 1 swapped: exit $rc, $fails FAIL lines, $stray naming something else"
fi
grep -q '^ok   -t 0-' "$tmp/wrong.out" && pass "the all-TPC partition (holding both) still passes" ||
  fail "the all-TPC partition did not pass with the swapped layout"

echo "$failures failure(s)"
exit "$failures"
