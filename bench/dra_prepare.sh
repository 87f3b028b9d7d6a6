#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What the Kubernetes plugin's Prepare and Unprepare cost a claim, called as
# the kubelet calls them (gRPC on the plugin's socket), p50/p99 over 200
# claims, with 1, 8 and 32 shares already live on the node: the p99s as
# ratios to the first row's, side by side in one run (target: p99 under
# 100 ms, flat in the live shares). docs/kubernetes.md; docs/results.md.
#
#   bench/dra_prepare.sh BUILD_DIR            # the stand-in driver (a 64-TPC GPU)
#   bench/dra_prepare.sh BUILD_DIR --gpu      # the node's real GPU and driver
#
# Extra arguments go to `dra-sim bench` (--claims N, --live 1,8,32).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: bench/dra_prepare.sh BUILD_DIR [--gpu] [dra-sim bench flags]}" && pwd)
shift
tmp=$(mktemp -d /tmp/dra-prepare-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
sim=${DRA_SIM:-$tmp/dra-sim}
if [[ -z ${DRA_SIM:-} ]]; then
  (cd "$here/k8s" && CGO_ENABLED=0 go build -o "$sim" ./tools/dra-sim)
fi
if [[ ${1:-} == --gpu ]]; then
  shift
else
  mkdir -p "$tmp/status" "$tmp/cache" && chmod 1777 "$tmp/status" # as /dev/shm (the plugin checks)
  export NVTASKSET_REAL_LIBCUDA=$build/tests/fakecuda/lib/libcuda.so.1 FAKECUDA_SM_COUNT=128
  export NVTASKSET_STATUS_DIR=$tmp/status XDG_CACHE_HOME=$tmp/cache
fi
"$sim" bench --nvtaskset "$build/bin/nvtaskset" "$@"
