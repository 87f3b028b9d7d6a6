#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# "Never silently unpartitioned" on a real GPU: the `trust` section of
# tests/gpu/verify.py, run from the repository root on the GPU machine, as root:
#
#   NVT_BUILD=.dev/nvt bash tests/gpu/run_trust.sh
#
# NVT_BUILD: a build tree, or a stripped copy of its bin/ and lib/ carried to the
# machine (docs/verification.md). smid_probe is compiled there with nvcc
# (NVCC_ARCH, default sm_90) into $GPUBIN (default a fresh temporary folder); a
# GPUBIN that already holds smid_probe (e.g. a carried .dev/gpu) is used as it is.
# verify.py finds the GPU's layout itself (`nvtaskset --topology --json`).
#
# $OUT gets few files (the device tool brings back at most 8): trust.log (the
# run), verify.log (every command with its output), env.txt (the machine),
# nvcc.log, trust-files.tgz (each task's output). Exit status: verify.py's (the
# number of failures); 124 when the whole run passes TRUST_TIMEOUT seconds
# (default 420); 100 when the build or smid_probe is missing.
set -u
set -o pipefail
dest=${OUT:-/tmp/nvtaskset-trust-out}
mkdir -p "$dest"
export NVT_BUILD=${NVT_BUILD:-build}
limit=${TRUST_TIMEOUT:-420}
work=$(mktemp -d /tmp/nvt-trust-run-XXXXXX)
# verify.py writes many files into its OUT; only the few above come back.
export OUT=$work/verify
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if [ ! -x "$NVT_BUILD/bin/nvtaskset" ] || [ ! -e "$NVT_BUILD/lib/nvtaskset/libcuda.so.1" ]; then
  echo "run_trust: no $NVT_BUILD/bin/nvtaskset or $NVT_BUILD/lib/nvtaskset/libcuda.so.1 (set NVT_BUILD)" |
    tee "$dest/trust.log"
  exit 100
fi

# smid_probe: the only CUDA program the section needs.
if [ -n "${GPUBIN:-}" ] && [ -x "$GPUBIN/smid_probe" ]; then
  echo "run_trust: using $GPUBIN/smid_probe as it is" >"$dest/nvcc.log"
else
  GPUBIN=${GPUBIN:-$work/gpu}
  mkdir -p "$GPUBIN"
  if command -v nvcc >/dev/null; then
    timeout 240 nvcc -arch="${NVCC_ARCH:-sm_90}" -o "$GPUBIN/smid_probe" tests/gpu/smid_probe.cu >"$dest/nvcc.log" 2>&1
    echo "nvcc exit $?" >>"$dest/nvcc.log"
  else
    echo "run_trust: no nvcc here" >"$dest/nvcc.log"
  fi
  if [ ! -x "$GPUBIN/smid_probe" ] && [ -x .dev/gpu/smid_probe ]; then
    echo "run_trust: falling back to .dev/gpu/smid_probe" >>"$dest/nvcc.log"
    GPUBIN=.dev/gpu
  fi
fi
export GPUBIN
if [ ! -x "$GPUBIN/smid_probe" ]; then
  cat "$dest/nvcc.log"
  echo "run_trust: no smid_probe" | tee "$dest/trust.log"
  exit 100
fi

{
  date -u
  id
  uname -a
  nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current --format=csv,noheader
  echo "--- ldconfig -p | grep libcuda"
  ldconfig -p | grep libcuda
  echo "--- tools"
  for t in setpriv setcap nvcc python3 nvidia-cuda-mps-control; do printf '%s: %s\n' "$t" "$(command -v $t)"; done
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'
  echo "--- mount options of /tmp and /var/tmp"
  findmnt -no TARGET,FSTYPE,OPTIONS -T /tmp
  findmnt -no TARGET,FSTYPE,OPTIONS -T /var/tmp
  grep -E '^(NoNewPrivs|Cap(Eff|Bnd))' /proc/self/status
  echo "--- build"
  ls -l "$NVT_BUILD/bin/nvtaskset" "$NVT_BUILD/lib/nvtaskset/libcuda.so.1" "$GPUBIN/smid_probe"
  readelf -n "$NVT_BUILD/lib/nvtaskset/libcuda.so.1" | grep -A1 'nvtaskset'
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} LD_PRELOAD=${LD_PRELOAD:-}"
} >"$dest/env.txt" 2>&1

timeout -k 15 "$limit" python3 -u tests/gpu/verify.py trust 2>&1 | tee "$dest/trust.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 124 ] && echo "run_trust: TIMEOUT after ${limit}s" | tee -a "$dest/trust.log"

# Whatever the section left behind (it stops its own; this is for a killed run).
for d in /tmp/nvtaskset-trust-mps/own /tmp/nvtaskset-trust-mps/foreign; do
  if [ -e "$d/control" ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$d timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1
    echo "run_trust: stopped an MPS daemon left at $d" | tee -a "$dest/trust.log"
  fi
done
rm -f /tmp/nvtaskset-trust/libnvrenamed-copy.so

cp "$OUT/verify.log" "$dest/verify.log" 2>/dev/null
tar czf "$dest/trust-files.tgz" -C "$work" verify -C /tmp nvtaskset-trust 2>/dev/null
echo "run_trust: exit $rc ($(grep -c '^PASS' "$dest/trust.log") PASS, $(grep -c '^FAIL' "$dest/trust.log") FAIL)" |
  tee -a "$dest/trust.log"
exit "$rc"
