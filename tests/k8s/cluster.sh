#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# A one-node Kubernetes cluster for tests, from real components built from Go
# modules (tests/k8s/components): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, the kubelet, containerd 2.x with Debian's runc, and the
# nvtaskset DRA plugin. All of its state is in one directory DIR; everything
# listens on 127.0.0.1 only, on ports picked free at start.
#
#   cluster.sh up [DIR] [options]  start it; print the shell lines to use it:
#                                  eval "$(cluster.sh up)"
#   cluster.sh down [DIR]          stop every process by PID, unmount, remove
#                                  the cgroups and DIR; harmless when nothing
#                                  is there. DIR defaults to $NVTS_K8S_DIR.
#   cluster.sh env DIR             print the shell lines again
#   cluster.sh status DIR          which recorded processes are alive
#   cluster.sh logs DIR [N]        the last N (40) lines of every log
#   cluster.sh plugin-restart DIR  stop the DRA plugin (TERM) and start it again,
#                                  as a DaemonSet's rolling update does
#   cluster.sh image DIR NAME ROOTFS ENTRYPOINT...
#                                  make an OCI image of directory ROOTFS and
#                                  import it into the node's containerd
#
# up options (each also from the environment variable named):
#   --bin DIR          the component binaries (NVTS_K8S_BIN; default
#                      tests/k8s/components/bin, made by components/build.sh)
#   --plugin PATH      the DRA plugin's binary (NVTASKSET_DRA_PLUGIN); without
#                      it the cluster runs without a DRA driver
#   --nvtaskset PATH   the CLI the plugin calls (NVTASKSET_CLI; default:
#                      nvtaskset in PATH)
#   --mps MODE         the plugin's --mps: off or multi-user (off)
#   --nvidia-cdi-dir D where the NVIDIA Container Toolkit's CDI spec (or a
#                      stand-in) is: containerd reads it, and the plugin
#                      composes each share with its GPU's device there
#                      (--nvidia-cdi=required); without it, --nvidia-cdi=off
#   --owner PID        run `down` when process PID ends (a watchdog, so a
#                      crashed test leaves nothing behind)
#   --max-seconds S    run `down` after S seconds (3600); 0: never
#   --timeout S        seconds to wait for each component (90)
# The plugin inherits this script's environment: the CLI's test variables
# (NVTASKSET_*, FAKECUDA_*) reach every nvtaskset it runs.
#
# DIR must be empty or absent and its path at most 40 bytes (Unix socket paths
# under it must fit in 108 bytes); by default a new /tmp/nvts-k8s.XXXXXX.
#
# Every process is started detached (setsid), its PID recorded in DIR/run, and
# carries NVTS_K8S_HARNESS=DIR in its environment (containerd's shims inherit
# it). The node's pods live in the cgroup /nvts-k8s.XXXXXX of every hierarchy
# (the kubelet's --cgroup-root), so `down` finds a container process left by a
# dead shim by its cgroup. A process is signalled only while it carries the
# marker or sits in that cgroup: never by name.
set -uo pipefail

SELF=$(readlink -f "$0")
HERE=$(dirname "$SELF")
PROG=${0##*/}
die() { echo "$PROG: $*" >&2; exit 1; }
note() { echo "$PROG: $*" >&2; }
now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }
# wait_for SECONDS COMMAND...: poll every 200 ms until COMMAND succeeds.
wait_for() {
  local end=$(($(now_ms) + $1 * 1000)); shift
  until "$@" >/dev/null 2>&1; do (($(now_ms) > end)) && return 1; sleep 0.2; done
}

# The components, in start order (stopped in reverse).
COMPONENTS=(etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet)
NEEDED_BINS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd containerd-shim-runc-v2 ctr pause loopback)
# The node's name is the host's: the API server reaches the kubelet (logs,
# exec) at the node's Hostname address, which resolves to 127.0.0.1 here
# (the kubelet refuses a loopback node IP, and listens on 127.0.0.1 only).
NODE=$(hostname -s | tr '[:upper:]' '[:lower:]')
NS=k8s.io # containerd's namespace for the kubelet's containers

# ------------------------------------------------------------- processes ---

# has_marker PID DIR: PID is alive and carries NVTS_K8S_HARNESS=DIR.
has_marker() {
  local e
  { while IFS= read -r -d '' e; do
      [[ $e == "NVTS_K8S_HARNESS=$2" ]] && return 0
    done <"/proc/$1/environ"; } 2>/dev/null
  return 1
}

# cgroup_name DIR: the node's cgroup (its last path component is DIR's).
cgroup_name() { echo "/${1##*/}"; }

# in_cgroup PID DIR: PID sits in the node's cgroup (or below) of some hierarchy.
in_cgroup() {
  local cg
  cg=$(cgroup_name "$2")
  grep -q ":$cg\(/\|$\)" "/proc/$1/cgroup" 2>/dev/null
}

# ours DIR: every live process that carries DIR's marker or sits in its cgroup,
# but not this script, its callers in the same run or a zombie.
ours() {
  local dir=$1 p pid
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" || $pid == "$PPID" || $pid == "${SKIP_PID:-}" ]] && continue
    [[ $(awk '{print $3}' "$p/stat" 2>/dev/null) == Z ]] && continue
    if has_marker "$pid" "$dir" || in_cgroup "$pid" "$dir"; then echo "$pid"; fi
  done
}

# start_time PID: field 22 of /proc/PID/stat (clock ticks since boot); with
# the PID it names one process exactly, so a recycled PID is never signalled.
start_time() { awk '{sub(/^.*\) /, ""); print $20}' "/proc/$1/stat" 2>/dev/null; }

# daemon NAME DIR CMD...: start CMD detached (own session, stdio to a log),
# with the marker in its environment; record its PID and start time.
daemon() {
  local name=$1 dir=$2 pid
  shift 2
  NVTS_K8S_HARNESS=$dir setsid "$@" </dev/null >>"$dir/log/$name.log" 2>&1 &
  pid=$!
  echo "$pid $(start_time "$pid")" >"$dir/run/$name.pid"
}

# recorded NAME DIR: the PID of NAME while it is the process that was started.
recorded() {
  local f=$2/run/$1.pid pid st
  [[ -s $f ]] || return 1
  read -r pid st <"$f"
  [[ -n $pid && $(start_time "$pid") == "$st" ]] || return 1
  echo "$pid"
}

# stop_one NAME DIR GRACE: TERM the recorded process, KILL it after GRACE s.
stop_one() {
  local pid end
  pid=$(recorded "$1" "$2") || { rm -f "$2/run/$1.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null
  end=$(($(now_ms) + $3 * 1000))
  while [[ -d /proc/$pid ]] && [[ $(start_time "$pid") != "" ]]; do
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && break
    if (($(now_ms) > end)); then kill -KILL "$pid" 2>/dev/null; sleep 0.2; break; fi
    sleep 0.1
  done
  rm -f "$2/run/$1.pid"
}

# ----------------------------------------------------------------- ports ---

# used_ports, pick_ports N (tests/lib/ports.sh).
# shellcheck source=../lib/ports.sh
source "$HERE/../lib/ports.sh"

# ----------------------------------------------------------------- certs ---

# sign NAME SUBJECT EXTENSIONS: DIR/pki/NAME.{key,crt}, an EC P-256 key and a
# certificate signed by the cluster's CA, valid 2 days.
sign() {
  local p=$PKI/$1
  openssl ecparam -name prime256v1 -genkey -noout -out "$p.key" 2>/dev/null || return 1
  openssl req -new -key "$p.key" -subj "$2" -out "$p.csr" 2>/dev/null || return 1
  printf '%s\n' "$3" >"$p.ext"
  openssl x509 -req -in "$p.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 2 -extfile "$p.ext" -out "$p.crt" 2>/dev/null || return 1
  rm -f "$p.csr" "$p.ext"
}

make_pki() {
  local client='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'
  mkdir -m 0700 -p "$PKI"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null &&
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=nvts-k8s-ca" -days 2 -out "$PKI/ca.crt" 2>/dev/null ||
    return 1
  sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" &&
    sign kubelet-serving "/CN=$NODE" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:$NODE" &&
    sign admin "/O=system:masters/CN=nvts-admin" "$client" &&
    sign kubelet "/O=system:nodes/CN=system:node:$NODE" "$client" &&
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client" &&
    sign kube-scheduler "/CN=system:kube-scheduler" "$client" &&
    sign kube-controller-manager "/CN=system:kube-controller-manager" "$client" &&
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null &&
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

# kubeconfig NAME [TOKEN]: DIR/NAME.kubeconfig for the client certificate
# NAME, or for the bearer TOKEN.
kubeconfig() {
  local cred="client-certificate: $PKI/$1.crt
    client-key: $PKI/$1.key"
  [[ -n ${2:-} ]] && cred="token: $2"
  cat >"$DIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nvts
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $1
  user:
    $cred
contexts:
- name: nvts
  context: {cluster: nvts, user: $1}
current-context: nvts
EOF
  chmod 0600 "$DIR/$1.kubeconfig"
}

# --------------------------------------------------------------- images ---

# image DIR NAME ROOTFS ENTRYPOINT...: an OCI image archive of ROOTFS (one
# uncompressed layer), imported into the node's containerd as NAME.
image() {
  local dir=$1 name=$2 rootfs=$3 ep w layer cfg man sha size
  shift 3
  [[ -d $rootfs ]] || { note "image: no directory $rootfs"; return 1; }
  ep=$(printf '"%s",' "$@")
  w=$(mktemp -d "$dir/tmp/image.XXXXXX") || return 1
  mkdir -p "$w/oci/blobs/sha256"
  tar --numeric-owner -C "$rootfs" -cf "$w/layer.tar" . || return 1
  layer=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
  mv "$w/layer.tar" "$w/oci/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":[%s],"Env":["PATH=/bin:/usr/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "${ep%,}" "$layer" >"$w/cfg"
  cfg=$(sha256sum "$w/cfg" | cut -d' ' -f1)
  mv "$w/cfg" "$w/oci/blobs/sha256/$cfg"
  size=$(stat -c %s "$w/oci/blobs/sha256/$layer")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cfg" "$(stat -c %s "$w/oci/blobs/sha256/$cfg")" "$layer" "$size" >"$w/man"
  man=$(sha256sum "$w/man" | cut -d' ' -f1)
  mv "$w/man" "$w/oci/blobs/sha256/$man"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$man" "$(stat -c %s "$w/oci/blobs/sha256/$man")" "$name" "${name##*:}" >"$w/oci/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$w/oci/oci-layout"
  tar -C "$w/oci" -cf "$w/image.tar" . || return 1
  "$dir/bin/ctr" -n "$NS" images import --digests --snapshotter overlayfs "$w/image.tar" >"$w/import.log" 2>&1 ||
    { cat "$w/import.log" >&2; return 1; }
  rm -rf "$w"
}

# ------------------------------------------------------------------- up ---

write_configs() {
  local cdi_dirs="\"$DIR/cdi\""
  [[ -n $NVCDI ]] && cdi_dirs+=", \"$NVCDI\""
  mkdir -p "$DIR/containerd" "$DIR/cni/net.d" "$DIR/cni/bin" "$DIR/cdi" "$DIR/kubelet" "$DIR/pod-logs"
  ln -s "$BIN/loopback" "$DIR/cni/bin/loopback"
  # The pods' only network is their own loopback (no pod network here: the
  # sandbox reaches nothing else); the tests' pods use the host's network.
  cat >"$DIR/cni/net.d/10-loopback.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "nvts-lo", "plugins": [{"type": "loopback"}]}
EOF
  cat >"$DIR/containerd/config.toml" <<EOF
version = 3
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
temp = "$DIR/tmp"
# Snapshotters and services the test node does not use (some probe devices or
# file systems; NRI would listen in /var/run).
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$DIR/containerd/containerd.sock"
[ttrpc]
  address = "$DIR/containerd/containerd.ttrpc.sock"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  # (CDI is always on in containerd 2.x.)
  cdi_spec_dirs = [$cdi_dirs]
  # Without CAP_SYS_RESOURCE (as in a container) a negative oom_score_adj
  # (the kubelet asks -998 for a sandbox) fails runc's init: keep them at or
  # above containerd's own.
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["$DIR/cni/bin"]
  conf_dir = "$DIR/cni/net.d"
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "$RUNC"
  Root = "$DIR/containerd/runc"
  SystemdCgroup = false
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
  cat >"$DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
containerRuntimeEndpoint: unix://$DIR/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP
# This machine has cgroup v1 (hybrid): the kubelet refuses it unless told.
failCgroupV1: false
failSwapOn: false
podLogsDir: $DIR/pod-logs
staticPodPath: ""
resolvConf: /etc/resolv.conf
registerNode: true
serializeImagePulls: false
# A test node: never evict for the shared machine's disk or memory.
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
featureGates:
  DRAConsumableCapacity: true
EOF
}

make_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -e $h/cgroup.procs ]] || continue
    mkdir -p "$h${CGROUP#/}" || return 1
    # A new cpuset is empty: give it its parent's CPUs and memory nodes.
    if [[ -e $h/cpuset.cpus ]]; then
      cat "$h/cpuset.cpus" >"$h${CGROUP#/}/cpuset.cpus" && cat "$h/cpuset.mems" >"$h${CGROUP#/}/cpuset.mems" || return 1
    fi
  done
}

remove_cgroups() {
  local h d
  for h in /sys/fs/cgroup/*/; do
    d=$h${1#/}
    [[ -d $d ]] || continue
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
}

cluster_up() {
  local feature="--feature-gates=DRAConsumableCapacity=true" b ports
  [[ -d $BIN ]] || die "no component directory $BIN (build it: tests/k8s/components/build.sh $BIN)"
  for b in "${NEEDED_BINS[@]}"; do [[ -x $BIN/$b ]] || die "$BIN/$b is missing (tests/k8s/components/build.sh $BIN)"; done
  RUNC=$(command -v runc) || die "runc not found (Debian: apt-get install runc)"
  command -v openssl >/dev/null || die "openssl not found"
  if [[ -n $PLUGIN ]]; then
    [[ -x $PLUGIN ]] || die "--plugin: $PLUGIN is not an executable"
    [[ -x $NVCLI ]] || die "--nvtaskset: ${NVCLI:-nvtaskset} not found"
  fi
  if [[ -z $DIR ]]; then
    DIR=$(mktemp -d /tmp/nvts-k8s.XXXXXX) || die "mktemp failed"
  else
    [[ -e $DIR && -n $(ls -A "$DIR" 2>/dev/null) ]] && die "$DIR is not empty"
    mkdir -p "$DIR" || die "cannot make $DIR"
    DIR=$(readlink -f "$DIR")
  fi
  ((${#DIR} <= 40)) || die "$DIR: path longer than 40 bytes (socket paths under it must fit)"
  chmod 0755 "$DIR"
  mkdir -p "$DIR/run" "$DIR/log" "$DIR/tmp" "$DIR/bin" && mkdir -m 0700 "$DIR/etcd"
  CGROUP=$(cgroup_name "$DIR")
  echo "$CGROUP" >"$DIR/run/cgroup"
  PKI=$DIR/pki
  SERVICE_IP=10.0.0.1
  PAUSE_IMAGE=registry.k8s.io/pause:nvts
  local ports
  ports=$(pick_ports 4) || die "up: no 4 free TCP ports found"
  read -r ETCD_PORT ETCD_PEER_PORT API_PORT KUBELET_PORT <<<"$ports"
  echo "etcd=$ETCD_PORT etcd-peer=$ETCD_PEER_PORT apiserver=$API_PORT kubelet=$KUBELET_PORT" >"$DIR/run/ports"
  for b in kubectl ctr; do ln -s "$BIN/$b" "$DIR/bin/$b.real"; done
  # kubectl and ctr that talk to this cluster: whatever KUBECONFIG the caller has.
  printf '#!/bin/sh\nexec "%s" --kubeconfig "%s" "$@"\n' "$BIN/kubectl" "$DIR/admin.kubeconfig" >"$DIR/bin/kubectl"
  printf '#!/bin/sh\nexec "%s" --address "%s" "$@"\n' "$BIN/ctr" "$DIR/containerd/containerd.sock" >"$DIR/bin/ctr"
  chmod 0755 "$DIR/bin/kubectl" "$DIR/bin/ctr"

  make_pki || { note "making certificates failed"; return 1; }
  for b in admin kubelet kube-scheduler kube-controller-manager; do kubeconfig "$b"; done
  write_configs
  make_cgroups || { note "cannot make the cgroup $CGROUP"; return 1; }
  ((OWNER || MAX_SECONDS)) && start_watchdog

  note "etcd on 127.0.0.1:$ETCD_PORT"
  daemon etcd "$DIR" "$BIN/etcd" --name nvts --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "nvts=http://127.0.0.1:$ETCD_PEER_PORT" --log-level warn
  wait_for "$TIMEOUT" curl -sf "http://127.0.0.1:$ETCD_PORT/health" || { note "etcd did not come up"; return 1; }

  note "kube-apiserver on 127.0.0.1:$API_PORT"
  daemon kube-apiserver "$DIR" "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types Hostname \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode Node,RBAC --endpoint-reconciler-type none --anonymous-auth=false \
    --profiling=false "$feature"
  wait_for "$TIMEOUT" "$DIR/bin/kubectl" get --raw /readyz || { note "kube-apiserver did not become ready"; return 1; }

  note "containerd (runc: $RUNC)"
  daemon containerd "$DIR" env PATH="$BIN:$PATH" "$BIN/containerd" --config "$DIR/containerd/config.toml"
  # The shim is found in PATH, next to containerd.
  wait_for "$TIMEOUT" "$DIR/bin/ctr" version || { note "containerd did not come up"; return 1; }
  local pr=$DIR/tmp/pause-root
  mkdir -p "$pr" && cp "$BIN/pause" "$pr/pause" && image "$DIR" "$PAUSE_IMAGE" "$pr" /pause ||
    { note "importing the pause image failed"; return 1; }
  rm -rf "$pr"

  note "kube-controller-manager, kube-scheduler"
  daemon kube-controller-manager "$DIR" "$BIN/kube-controller-manager" --kubeconfig "$DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DIR/kube-controller-manager.kubeconfig" --authorization-kubeconfig "$DIR/kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --use-service-account-credentials \
    --root-ca-file "$PKI/ca.crt" \
    --controllers serviceaccount-controller,root-ca-certificate-publisher-controller,resourceclaim-controller,garbage-collector-controller,node-lifecycle-controller \
    "$feature"
  daemon kube-scheduler "$DIR" "$BIN/kube-scheduler" --kubeconfig "$DIR/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$DIR/kube-scheduler.kubeconfig" --authorization-kubeconfig "$DIR/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false "$feature"

  note "kubelet (node $NODE, port $KUBELET_PORT)"
  daemon kubelet "$DIR" env PATH="$BIN:$PATH" "$BIN/kubelet" --config "$DIR/kubelet/config.yaml" \
    --kubeconfig "$DIR/kubelet.kubeconfig" --root-dir "$DIR/kubelet" --hostname-override "$NODE"
  wait_for "$TIMEOUT" node_ready || { note "the node did not become Ready"; return 1; }
  wait_for "$TIMEOUT" "$DIR/bin/kubectl" get serviceaccount default || { note "no default ServiceAccount"; return 1; }

  if [[ -n $PLUGIN ]]; then
    note "DRA plugin $PLUGIN"
    mkdir -p "$DIR/dra"
    local nvcdi=(--nvidia-cdi off)
    [[ -n $NVCDI ]] && nvcdi=(--nvidia-cdi required --cdi-spec-dirs "$NVCDI")
    # The plugin runs as the DaemonSet's ServiceAccount, with the RBAC of
    # k8s/deploy: a verb missing there fails here too.
    plugin_identity || { note "the plugin's ServiceAccount (k8s/deploy/rbac.yaml) could not be set up"; return 1; }
    printf '%s\0' "$PLUGIN" --node-name "$NODE" --kubeconfig "$DIR/dra-plugin.kubeconfig" --nvtaskset "$NVCLI" \
      --kubelet-registrar-dir "$DIR/kubelet/plugins_registry" --kubelet-plugins-dir "$DIR/kubelet/plugins" \
      --cdi-dir "$DIR/cdi" --state-dir "$DIR/dra" --mps "$MPS" "${nvcdi[@]}" >"$DIR/run/dra-plugin.argv"
    start_plugin
    local end=$(($(now_ms) + TIMEOUT * 1000))
    until slices_published; do
      recorded dra-plugin "$DIR" >/dev/null || { note "the plugin exited"; return 1; }
      (($(now_ms) > end)) && { note "the plugin published no ResourceSlice in $TIMEOUT s"; return 1; }
      sleep 0.2
    done
  fi
}

# start_plugin: the plugin, with the arguments `up` chose (DIR/run/dra-plugin.argv).
start_plugin() {
  local argv
  mapfile -d '' -t argv <"$DIR/run/dra-plugin.argv"
  daemon dra-plugin "$DIR" "${argv[@]}"
}

# plugin_restart: the plugin stopped (TERM) and started again, as a DaemonSet
# rolls it; done once it is serving its registration socket again.
plugin_restart() {
  local sock=$DIR/kubelet/plugins_registry/tpc.nvtaskset.dev-reg.sock end
  [[ -s $DIR/run/dra-plugin.argv ]] || die "plugin-restart: this cluster runs no plugin"
  stop_one dra-plugin "$DIR" 10
  rm -f "$sock"
  start_plugin
  end=$(($(now_ms) + TIMEOUT * 1000))
  until [[ -S $sock ]]; do
    recorded dra-plugin "$DIR" >/dev/null || die "plugin-restart: the plugin exited: $(tail -3 "$DIR/log/dra-plugin.log")"
    (($(now_ms) > end)) && die "plugin-restart: no registration socket after $TIMEOUT s"
    sleep 0.1
  done
}

# plugin_identity: k8s/deploy's namespace and RBAC applied, and
# DIR/dra-plugin.kubeconfig with a token of its ServiceAccount (2 hours).
plugin_identity() {
  local token
  "$DIR/bin/kubectl" apply -f "$DEPLOY/namespace.yaml" -f "$DEPLOY/rbac.yaml" >"$DIR/log/rbac.log" 2>&1 || return 1
  wait_for "$TIMEOUT" "$DIR/bin/kubectl" -n nvtaskset-dra get serviceaccount nvtaskset-dra || return 1
  token=$("$DIR/bin/kubectl" -n nvtaskset-dra create token nvtaskset-dra --duration 2h 2>>"$DIR/log/rbac.log") || return 1
  kubeconfig dra-plugin "$token"
}

node_ready() {
  [[ $("$DIR/bin/kubectl" get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
slices_published() {
  [[ -n $("$DIR/bin/kubectl" get resourceslices --field-selector spec.driver=tpc.nvtaskset.dev -o name 2>/dev/null) ]]
}

start_watchdog() {
  local owner=$OWNER max=$MAX_SECONDS dir=$DIR
  NVTS_K8S_HARNESS=$dir setsid bash -c '
    start=$(date +%s)
    while :; do
      sleep 1
      [[ -d $0 ]] || exit 0
      if (($1)) && ! kill -0 "$1" 2>/dev/null; then break; fi
      if (($2)) && (($(date +%s) - start >= $2)); then break; fi
    done
    NVTS_K8S_WATCHDOG=1 exec "$3" down "$0"' "$dir" "$owner" "$max" "$SELF" </dev/null >>"$dir/log/watchdog.log" 2>&1 &
  echo "$! $(start_time $!)" >"$dir/run/watchdog.pid"
}

print_env() {
  # %q: read back whole by the shell that evals them, whatever DIR holds.
  printf 'export NVTS_K8S_DIR=%q\n' "$1"
  printf 'export KUBECONFIG=%q\n' "$1/admin.kubeconfig"
  printf 'export PATH=%q:"$PATH"\n' "$1/bin"
}

# ----------------------------------------------------------------- down ---

cluster_down() {
  local left mounts m d pid n
  if [[ -z $DIR ]]; then note "down: no DIR (nor NVTS_K8S_DIR): nothing to do"; return 0; fi
  [[ -d $DIR ]] || { note "down: $DIR is not there: nothing to do"; return 0; }
  DIR=$(readlink -f "$DIR")
  [[ -d $DIR/run ]] || die "down: $DIR was not made by $PROG up (no run/): left alone"
  local cg
  cg=$(cat "$DIR/run/cgroup" 2>/dev/null) || cg=$(cgroup_name "$DIR")
  # The watchdog runs `down` itself: leave the caller alone, stop it otherwise.
  if [[ -n ${NVTS_K8S_WATCHDOG:-} ]]; then SKIP_PID=$PPID; else stop_one watchdog "$DIR" 1; fi
  # Pods first, while the kubelet and the plugin run: their claims are unprepared.
  if recorded kube-apiserver "$DIR" >/dev/null && recorded kubelet "$DIR" >/dev/null; then
    timeout 60 "$DIR/bin/kubectl" delete pods --all --all-namespaces --wait=true --timeout=50s >/dev/null 2>&1 ||
      note "down: deleting the pods did not finish in time"
  fi
  stop_one dra-plugin "$DIR" 10
  stop_one kubelet "$DIR" 10
  # Every container of the node: kill its task through containerd while it runs.
  if recorded containerd "$DIR" >/dev/null; then
    for id in $(timeout 20 "$DIR/bin/ctr" -n "$NS" tasks ls -q 2>/dev/null); do
      timeout 10 "$DIR/bin/ctr" -n "$NS" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1
    done
  fi
  stop_one kube-scheduler "$DIR" 10
  stop_one kube-controller-manager "$DIR" 10
  stop_one containerd "$DIR" 10
  stop_one kube-apiserver "$DIR" 15
  stop_one etcd "$DIR" 10
  # What is left: shims (marked) and container processes (in the node's cgroup).
  for n in TERM KILL; do
    left=$(ours "$DIR")
    [[ -z $left ]] && break
    for pid in $left; do kill -"$n" "$pid" 2>/dev/null; done
    sleep 2
  done
  left=$(ours "$DIR")
  [[ -n $left ]] && note "down: processes left: $left"
  # Mounts under DIR (container root file systems, shm, the kubelet's volumes), deepest first.
  for _ in 1 2 3; do
    mounts=$(awk -v d="$DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    [[ -z $mounts ]] && break
    for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  done
  remove_cgroups "$cg"
  # The kubelet links every container's log into /var/log/containers.
  for m in /var/log/containers/*; do
    [[ -L $m ]] || continue
    d=$(readlink "$m")
    [[ $d == "$DIR/"* ]] && rm -f "$m"
  done
  rm -rf "$DIR"
  # Check: nothing of this cluster is left.
  local bad=0
  left=$(ours "$DIR")
  [[ -n $left ]] && { note "down: FAILED: processes still alive: $left"; bad=1; }
  [[ -e $DIR ]] && { note "down: FAILED: $DIR is still there"; bad=1; }
  awk -v d="$DIR/" 'index($5, d) == 1 {f = 1} END {exit !f}' /proc/self/mountinfo && { note "down: FAILED: mounts left under $DIR"; bad=1; }
  for d in /sys/fs/cgroup/*/"${cg#/}"; do [[ -d $d ]] && { note "down: FAILED: cgroup $d left"; bad=1; }; done
  ((bad == 0)) && note "down: $DIR stopped and removed"
  return $bad
}

cluster_status() {
  local n pid
  for n in "${COMPONENTS[@]}" dra-plugin watchdog; do
    [[ -e $DIR/run/$n.pid ]] || continue
    if pid=$(recorded "$n" "$DIR"); then echo "$n: running (pid $pid)"; else echo "$n: not running"; fi
  done
}

tail_logs() {
  local f
  for f in "$DIR"/log/*.log; do
    [[ -s $f ]] || continue
    echo "----- $f (last $1 lines)"
    tail -n "$1" "$f"
  done
}

# ----------------------------------------------------------------- main ---

cmd=${1:-}
shift || true
DIR=""
if [[ ${1:-} != "" && ${1:-} != -* ]]; then DIR=$1; shift; fi
BIN=${NVTS_K8S_BIN:-$HERE/components/bin}
DEPLOY=$(readlink -f "$HERE/../../k8s/deploy")
PLUGIN=${NVTASKSET_DRA_PLUGIN:-}
NVCLI=${NVTASKSET_CLI:-$(command -v nvtaskset 2>/dev/null)}
MPS=off OWNER=0 MAX_SECONDS=3600 TIMEOUT=90 NVCDI=""
case $cmd in
  up)
    while (($#)); do
      case $1 in
        --bin) BIN=$2; shift 2 ;;
        --plugin) PLUGIN=$2; shift 2 ;;
        --nvtaskset) NVCLI=$2; shift 2 ;;
        --mps) MPS=$2; shift 2 ;;
        --nvidia-cdi-dir) NVCDI=$2; shift 2 ;;
        --owner) OWNER=$2; shift 2 ;;
        --max-seconds) MAX_SECONDS=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        *) die "up: unknown option $1" ;;
      esac
    done
    [[ $MPS == off || $MPS == multi-user ]] || die "--mps: $MPS is neither off nor multi-user"
    [[ $OWNER =~ ^[0-9]+$ && $MAX_SECONDS =~ ^[0-9]+$ && $TIMEOUT =~ ^[0-9]+$ ]] || die "--owner, --max-seconds, --timeout take a number"
    BIN=$(readlink -f "$BIN")
    [[ -n $PLUGIN ]] && PLUGIN=$(readlink -f "$PLUGIN")
    if [[ -n $NVCDI ]]; then [[ -d $NVCDI ]] || die "--nvidia-cdi-dir: no directory $NVCDI"; NVCDI=$(readlink -f "$NVCDI"); fi
    [[ -n $NVCLI ]] && NVCLI=$(readlink -f "$NVCLI")
    if ! cluster_up; then
      note "up failed; the logs:"
      [[ -n $DIR && -d $DIR/log ]] && tail_logs 25 >&2
      [[ -n $DIR && -d $DIR/run ]] && cluster_down >&2
      exit 1
    fi
    print_env "$DIR"
    ;;
  down) DIR=${DIR:-${NVTS_K8S_DIR:-}}; cluster_down ;;
  env) [[ -d $DIR/run ]] || die "env: no cluster in '$DIR'"; print_env "$(readlink -f "$DIR")" ;;
  status) [[ -d $DIR/run ]] || die "status: no cluster in '$DIR'"; cluster_status ;;
  logs) [[ -d $DIR/log ]] || die "logs: no cluster in '$DIR'"; tail_logs "${1:-40}" ;;
  plugin-restart) [[ -d $DIR/run ]] || die "plugin-restart: no cluster in '$DIR'"; plugin_restart ;;
  image) [[ -d $DIR/run ]] || die "image: no cluster in '$DIR'"; (($# >= 3)) || die "image DIR NAME ROOTFS ENTRYPOINT..."; image "$DIR" "$@" ;;
  *) die "usage: $PROG up [DIR] [options] | down [DIR] | env DIR | status DIR | logs DIR [N] | plugin-restart DIR | image DIR NAME ROOTFS ENTRYPOINT..." ;;
esac
