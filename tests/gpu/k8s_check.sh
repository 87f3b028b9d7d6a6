#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Kubernetes plugin on a real GPU (docs/verification.md, "Kubernetes"),
# as root from the repository root, with the build at $NVT_BUILD (bin/ and
# lib/ of `cmake --install`), .dev/gpu/smid_probe and .dev/dra-sim
# (`cd k8s && CGO_ENABLED=0 go build -o ../.dev/dra-sim ./tools/dra-sim`):
#   1. --mps=off: the plugin prepares shares of 16 and 32 TPCs as the kubelet
#      asks (gRPC on its sockets; k8s/tools/dra-sim), and smid_probe started
#      with each share's CDI edits runs, both at once, on exactly its share's
#      TPCs by %smid, disjoint;
#   2. --mps=multi-user: the same shares under the multi-user MPS server the
#      plugin's nvtaskset starts, the two probes run as two other users at
#      the same time, each on its share's SM count (%smid is renumbered
#      under MPS);
#   3. what each nvtaskset call of a Prepare takes, and 4. Prepare/Unprepare
#      timings on the GPU's nvtaskset (bench/dra_prepare.sh).
# Every GPU command has a timeout; the MPS daemon is stopped at the end.
set -u
build=${NVT_BUILD:-.dev/nvt}
sim=${DRA_SIM:-.dev/dra-sim}
probe=${PROBE:-.dev/gpu/smid_probe}
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
failures=0
step() { echo "=== $*"; }
run() {
  "$@"
  local rc=$?
  [[ $rc == 0 ]] || failures=$((failures + 1))
  return $rc
}
# An MPS process, by its program (argv[0]), never this script's own command line.
mps_running() { pgrep -f '^(/[^ ]*/)?nvidia-cuda-mps-(control|server)( |$)' >/dev/null; }
if mps_running; then
  echo "an MPS daemon runs already: not starting (stop it first)"
  exit 100
fi
step "1. --mps=off: two shares, exact TPCs by %smid"
run timeout 180 "$sim" gpucheck --nvtaskset "$build/bin/nvtaskset" --probe "$probe" --mps off
step "2. --mps=multi-user: two users' probes at once"
run timeout 180 "$sim" gpucheck --nvtaskset "$build/bin/nvtaskset" --probe "$probe" --mps multi-user --users 1001,1002
ps -eo pid,user,args | grep '[n]vidia-cuda-mps' || true
echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 30 nvidia-cuda-mps-control
for _ in $(seq 1 50); do mps_running || break; sleep 0.2; done
if mps_running; then
  echo "FAIL an MPS process is left"; failures=$((failures + 1))
else
  echo "PASS no MPS daemon left"
fi
step "3. the nvtaskset calls of one Prepare, each timed (3 times)"
TIMEFORMAT='%R s'
for i in 1 2 3; do
  sleep 120 & h=$!
  echo -n "nvtaskset --env-for -n 1 --exclusive --no-mps: "; { time timeout 60 "$build/bin/nvtaskset" --env-for $h -d 0 -n 1 --exclusive --no-mps >/dev/null; } 2>&1 | tail -1
  echo -n "nvtaskset --status --json: "; { time timeout 60 "$build/bin/nvtaskset" --status --json >/dev/null; } 2>&1 | tail -1
  echo -n "nvtaskset --topology --json: "; { time timeout 60 "$build/bin/nvtaskset" --topology --json >/dev/null; } 2>&1 | tail -1
  kill $h; wait $h 2>/dev/null
done
claims=${BENCH_CLAIMS:-200}  # 0: no benchmark
if ((claims > 0)); then
  step "4. Prepare/Unprepare on the GPU"
  DRA_SIM=$sim run timeout 400 bash bench/dra_prepare.sh "$build" --gpu --claims "$claims"
fi
echo "k8s_check: $failures failed steps"
exit "$failures"
