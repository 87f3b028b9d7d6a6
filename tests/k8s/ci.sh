#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Tier B of the Kubernetes tests for CI or by hand: builds the cluster's
# components (cached), then runs e2e.sh, which brings the one-node cluster up
# with the DRA plugin, runs the claims against it and takes it down. Prints the
# time of each step.
#
#   ci.sh BUILD_DIR [CACHE_DIR]
#
# BUILD_DIR: nvtaskset's CMake build tree (bin/nvtaskset, the stand-in driver,
# the launcher and the DRA plugin are taken from it). CACHE_DIR (default
# $XDG_CACHE_HOME/nvtaskset-k8s or ~/.cache/nvtaskset-k8s) keeps the Go module
# and build caches (unless GOMODCACHE and GOCACHE are set) and the binaries: a
# second run rebuilds nothing.
set -uo pipefail
HERE=$(dirname "$(readlink -f "$0")")
BUILD=${1:?usage: ci.sh BUILD_DIR [CACHE_DIR]}
BUILD=$(readlink -f "$BUILD")
CACHE=${2:-${XDG_CACHE_HOME:-$HOME/.cache}/nvtaskset-k8s}
mkdir -p "$CACHE" && CACHE=$(readlink -f "$CACHE")
# (GOMODCACHE and GOCACHE set by the caller win: a machine's own caches.)
export GOMODCACHE=${GOMODCACHE:-$CACHE/gomod} GOCACHE=${GOCACHE:-$CACHE/gobuild}
step() { echo "ci.sh: $1: $2 s"; }

t=$(date +%s)
(cd "$HERE/components" && go mod download) || { echo "ci.sh: go mod download failed"; exit 1; }
step "go mod download" $(($(date +%s) - t))
t=$(date +%s)
"$HERE/components/build.sh" "$CACHE/bin" || { echo "ci.sh: building the components failed"; exit 1; }
step "build components" $(($(date +%s) - t))
t=$(date +%s)
NVTS_K8S_BIN=$CACHE/bin "$HERE/e2e.sh" "$BUILD"
rc=$?
step "e2e (up, tests, down)" $(($(date +%s) - t))
exit $rc
