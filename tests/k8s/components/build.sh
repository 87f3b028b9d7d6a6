#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Builds the test cluster's components from their Go modules (go.mod here):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kubectl, containerd, containerd-shim-runc-v2, ctr, the CNI loopback plugin
# and the sandbox's pause, into OUT (default: bin/ beside this script).
#
#   build.sh [OUT]
#
# GOMODCACHE and GOCACHE are honoured (tests/k8s/ci.sh points them at a cache
# directory). One `go build` for all: the packages they share compile once.
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
OUT=${1:-$HERE/bin}
mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")
cd "$HERE"
export GOFLAGS=${GOFLAGS:--buildvcs=false}
# containerd's btrfs snapshotter needs the btrfs headers (cgo): left out by its
# own build tag; the node uses overlayfs.
start=$(date +%s)
go build -trimpath -ldflags '-s -w' -tags no_btrfs -o "$OUT/" \
  ./cmd/etcd ./cmd/pause \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr \
  github.com/containernetworking/plugins/plugins/main/loopback
echo "build.sh: components built into $OUT in $(($(date +%s) - start)) s"
