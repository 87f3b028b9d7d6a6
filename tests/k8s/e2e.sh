#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Tier B of the Kubernetes tests: a real one-node cluster (cluster.sh: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, containerd
# with runc, and the nvtaskset DRA plugin), pods with ResourceClaims for TPCs
# of the stand-in driver posing as one 64-TPC GPU. It checks:
#   - a plain pod runs (the runtime, the sandbox image, the node);
#   - the plugin, as the ServiceAccount of k8s/deploy/rbac.yaml, publishes
#     its ResourceSlice: device gpu-0 with a consumable capacity tpcs;
#   - pods claiming 16 and 32 TPCs (k8s/deploy's DeviceClass) run at once, as
#     users 1000 and 2000, on disjoint TPCs: by the stand-in's record of their
#     kernels' masks and by `nvtaskset --status --json` on the node. Their
#     pod specs name no driver: the claim's CDI devices (the plugin's share
#     and a stand-in of the NVIDIA Container Toolkit's device, composed)
#     bring the shim and the driver;
#   - a claim for more than is free stays Pending, with the scheduler's reason;
#   - a claim whose share cannot be fenced (a bad opaque config) never starts
#     its container, and the kubelet's event carries the plugin's reason;
#   - deleting a pod releases its TPCs (status), and the pending pod then runs.
# Ends with 'N passed, M failed'; exit status 1 on any failure.
#
#   e2e.sh BUILD_DIR      nvtaskset's CMake build tree
#
# Environment: NVTS_K8S_BIN (the components, see cluster.sh),
# NVTASKSET_DRA_PLUGIN (default BUILD_DIR/bin/nvtaskset-dra-plugin).
set -uo pipefail

HERE=$(dirname "$(readlink -f "$0")")
CLUSTER=$HERE/cluster.sh
BUILD=$(readlink -f "${1:?usage: e2e.sh BUILD_DIR}")
PLUGIN=${NVTASKSET_DRA_PLUGIN:-$BUILD/bin/nvtaskset-dra-plugin}
[[ $(id -u) == 0 ]] || { echo "FAIL e2e.sh needs root (the kubelet and containerd)"; echo "0 passed, 1 failed"; exit 1; }
PASSES=0 FAILS=0
pass() { echo "PASS $*"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }
wait_for() {
  local end=$(($(now_ms) + $1 * 1000)); shift
  until "$@" >/dev/null 2>&1; do (($(now_ms) > end)) && return 1; sleep 0.2; done
}
finish() {
  echo "$PASSES passed, $FAILS failed"
  ((FAILS == 0))
  exit $?
}

NV=$BUILD/bin/nvtaskset
FAKE=$BUILD/tests/fakecuda/lib/libcuda.so.1
LAUNCHER=$BUILD/tests/e2e/launcher
for f in "$NV" "$FAKE" "$LAUNCHER" "$PLUGIN"; do
  [[ -e $f ]] || { fail "missing $f (build the project, and the DRA plugin)"; finish; }
done

# The node's stand-in driver and its record, the status directory, and the
# stand-in of the NVIDIA Container Toolkit's CDI spec, which brings the driver
# into a container as the real one does (mounts and environment). Pods reach
# only run/ by a hostPath volume (their ready and stop files).
# World-readable: the pods run as users 1000 and 2000.
T=$(mktemp -d /tmp/nvts-k8s-t.XXXXXX)
chmod 0755 "$T"
mkdir -p "$T/lib" "$T/rec" "$T/status" "$T/cache" "$T/run" "$T/nvcdi"
chmod 1777 "$T/run" "$T/rec" "$T/status" # status: as /dev/shm, which the plugin checks
cp "$FAKE" "$T/lib/libcuda.so.1"
: >"$T/rec/record"
chmod 0666 "$T/rec/record"
chmod -R a+rX "$T/lib"
TPCS=64 # the stand-in without a topology maps TPC k to mask bit k (identity)
export NVTASKSET_REAL_LIBCUDA=$T/lib/libcuda.so.1 FAKECUDA_SM_COUNT=$((2 * TPCS)) FAKECUDA_RECORD=$T/rec/record
export NVTASKSET_STATUS_DIR=$T/status XDG_CACHE_HOME=$T/cache
unset LD_PRELOAD CUDA_VISIBLE_DEVICES
UUID=$("$NV" --topology --json 2>/dev/null | jq -r '.devices[0].device.uuid // empty')
[[ -n $UUID ]] || { fail "nvtaskset --topology --json names no GPU on the stand-in"; finish; }
cat >"$T/nvcdi/nvidia.json" <<EOF
{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
 "devices": [{"name": "$UUID", "containerEdits": {
   "env": ["NVTASKSET_REAL_LIBCUDA=$NVTASKSET_REAL_LIBCUDA", "FAKECUDA_SM_COUNT=$FAKECUDA_SM_COUNT",
           "FAKECUDA_RECORD=$FAKECUDA_RECORD", "NVTS_TEST_NVIDIA_CDI=$UUID"],
   "mounts": [{"hostPath": "$T/lib", "containerPath": "$T/lib", "options": ["ro", "bind"]},
              {"hostPath": "$T/rec", "containerPath": "$T/rec", "options": ["rw", "bind"]}]}}]}
EOF

DIR=""
cleanup() {
  local rc=$?
  if [[ -n $DIR ]]; then
    ((FAILS)) && { echo "--- cluster logs"; "$CLUSTER" logs "$DIR" 30 2>/dev/null; }
    "$CLUSTER" down "$DIR" || echo "FAIL cluster.sh down did not leave a clean machine"
  fi
  rm -rf "$T"
  exit "$rc"
}
trap cleanup EXIT

t0=$(now_ms)
if ! env=$(NVTASKSET_DRA_PLUGIN=$PLUGIN "$CLUSTER" up --owner $$ --max-seconds 900 --nvtaskset "$NV" \
  --nvidia-cdi-dir "$T/nvcdi"); then
  fail "cluster.sh up"
  finish
fi
eval "$env"
DIR=$NVTS_K8S_DIR
pass "cluster.sh up: the node is Ready, the plugin published its slices ($((($(now_ms) - t0) / 1000)) s)"

# The pods' image: busybox, the launcher and the libraries it links (its
# libcuda.so.1 comes from the claim's CDI edits: no driver is in the image).
R=$DIR/tmp/rootfs
mkdir -p "$R/bin" "$R/tmp"
cp /bin/busybox "$R/bin/busybox"
for a in sh cat sleep ls id env; do ln -s busybox "$R/bin/$a"; done
cp "$LAUNCHER" "$R/bin/launcher"
# One path a line, whole: the build tree's own libcuda.so.1 (the launcher's
# RUNPATH) may sit at a path with spaces (a checkout at "/tmp/a b").
while IFS= read -r lib; do
  [[ -z $lib || $lib == */libcuda.so.1 ]] && continue
  mkdir -p "$R$(dirname "$lib")" && cp -L "$lib" "$R$lib"
done < <(ldd "$LAUNCHER" "$BUILD/lib/nvtaskset/libcuda.so.1" | sed -n -e 's/^.* => \(\/.*\) (0x[0-9a-f]*)$/\1/p' \
  -e 's/^\t\(\/lib.*\) (0x[0-9a-f]*)$/\1/p' | sort -u)
mkdir -p "$R/lib64" && cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
IMAGE=nvts.test/launcher:local
"$CLUSTER" image "$DIR" "$IMAGE" "$R" /bin/launcher && pass "the test image is imported into containerd" ||
  { fail "importing the test image"; finish; }

# pod NAME UID [TEMPLATE] [ARGS...]: a pod of user UID running the launcher
# (TEMPLATE: the ResourceClaimTemplate its container's claim comes from).
pod() {
  local name=$1 uid=$2 tmpl=${3:-} claims="" uses=""
  shift 3 || shift $#
  local args="" a
  for a in "$@"; do args+="\"$a\", "; done
  if [[ -n $tmpl ]]; then
    claims="  resourceClaims: [{name: gpu, resourceClaimTemplateName: $tmpl}]"
    uses="    resources: {claims: [{name: gpu}]}"
  fi
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  restartPolicy: Never
  hostPID: ${HOSTPID:-true}
  hostNetwork: true # the node has no pod network (cluster.sh)
  dnsPolicy: Default
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  securityContext: {runAsUser: $uid, runAsGroup: $uid}
$claims
  containers:
  - name: main
    image: $IMAGE
    imagePullPolicy: Never
    args: [${args%, }]
$uses
    volumeMounts: [{name: run, mountPath: "$T/run"}]
  volumes: [{name: run, hostPath: {path: "$T/run", type: Directory}}]
EOF
}
template() { # template NAME TPCS [OPAQUE_PARAMETERS]
  local config=""
  [[ -n ${3:-} ]] && config="
      config:
      - requests: [gpu]
        opaque:
          driver: tpc.nvtaskset.dev
          parameters: $3"
  cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $1}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: tpc.nvtaskset.dev
          capacity:
            requests: {tpcs: "$2"}$config
EOF
}
phase() { kubectl get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
is_phase() { [[ $(phase "$1") == "$2" ]]; }
# prepare_failure POD: the kubelet's first FailedPrepareDynamicResources event of POD.
prepare_failure() {
  kubectl get events --field-selector "involvedObject.name=$1" \
    -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' 2>/dev/null | grep -m1 FailedPrepareDynamicResources
}
# kept_of POD: what the plugin keeps of POD's claim: a holder in --status, a
# CDI spec or checkpoint naming its UID (nothing, after a failed Prepare).
kept_of() {
  local uid
  uid=$(kubectl get resourceclaims -o json |
    jq -r --arg p "$1" '.items[] | select(any(.metadata.ownerReferences[]?; .name == $p)) | .metadata.uid')
  [[ -n $uid ]] || { echo "no claim of pod $1"; return; }
  "$NV" --status --json | jq -r --arg c "pod default/$1 claim" '.tasks[] | select(.command | contains($c)) | "holder \(.pid)"'
  grep -l -- "$uid" "$DIR"/cdi/* "$DIR"/dra/* 2>/dev/null
}
# holders: the shares' holders in --status, [pid, TPCs] each.
holders() { "$NV" --status --json | jq -c '[.tasks[] | select(.command | startswith("tpc.nvtaskset.dev")) | [.pid, .tpcs]] | sort'; }

# 1. A plain pod: no claim (so no driver: a shell), runs and exits; its log is its output.
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec:
  restartPolicy: Never
  hostNetwork: true
  dnsPolicy: Default
  automountServiceAccountToken: false
  containers:
  - {name: main, image: $IMAGE, imagePullPolicy: Never, command: [/bin/sh, -c, 'echo plain pod ran as \$(id -u)']}
EOF
if wait_for 120 is_phase plain Succeeded || wait_for 1 is_phase plain Failed; then
  log=$(kubectl logs plain 2>&1)
  [[ $(phase plain) == Succeeded && $log == "plain pod ran as 0" ]] && pass "a plain pod (no claim) ran to completion" ||
    fail "the plain pod: phase $(phase plain), log: $log"
else
  fail "the plain pod did not finish: $(kubectl describe pod plain | tail -15)"
fi
kubectl delete pod plain --wait=true --timeout=60s >/dev/null 2>&1

# 2. The plugin's ResourceSlice: gpu-0, tpcs = 64, for the node.
slice=$(kubectl get resourceslices -o json --field-selector spec.driver=tpc.nvtaskset.dev)
dev=$(jq -r '[.items[].spec.devices[]?.name] | join(",")' <<<"$slice")
cap=$(jq -r '[.items[].spec.devices[]? | select(.name == "gpu-0") | .capacity.tpcs.value] | first // ""' <<<"$slice")
multi=$(jq -r '[.items[].spec.devices[]? | select(.name == "gpu-0") | .allowMultipleAllocations] | first // ""' <<<"$slice")
[[ $dev == gpu-0 && $cap == "$TPCS" && $multi == true ]] &&
  pass "the ResourceSlice has gpu-0 with consumable capacity tpcs=$cap" ||
  fail "the ResourceSlice: devices '$dev', tpcs '$cap', allowMultipleAllocations '$multi'"

# 3. Pods of 16 and 32 TPCs, users 1000 and 2000, at once: disjoint.
kubectl apply -f "$HERE/../../k8s/deploy/deviceclass.yaml" >/dev/null || fail "applying k8s/deploy/deviceclass.yaml"
for n in 16 32 48; do template "tpcs-$n" "$n" | kubectl apply -f - >/dev/null; done
pod p16 1000 tpcs-16 --until-file "$T/run/stop-p16" --ready-file "$T/run/ready-p16" --interval-ms 50 | kubectl apply -f - >/dev/null
pod p32 2000 tpcs-32 --until-file "$T/run/stop-p32" --ready-file "$T/run/ready-p32" --interval-ms 50 | kubectl apply -f - >/dev/null
source "$HERE/../slurm/standin_record.sh"
count() { [[ -z $1 ]] && echo 0 || echo $(($(tr -cd , <<<"$1" | wc -c) + 1)); }
# expand LIST: "0-2,5" as "0,1,2,5".
expand() {
  local out="" r a b
  for r in ${1//,/ }; do
    a=${r%-*} b=${r#*-}
    for ((; a <= b; a++)); do out+="$a,"; done
  done
  echo "${out%,}"
}
disjoint() {
  [[ -n $1 && -n $2 ]] || return 1
  local x
  for x in ${1//,/ }; do [[ ,$2, == *,$x,* ]] && return 1; done
  return 0
}
if wait_for 120 test -s "$T/run/ready-p16" && wait_for 60 test -s "$T/run/ready-p32"; then
  p16=$(cat "$T/run/ready-p16") p32=$(cat "$T/run/ready-p32")
  a=$(standin_tpcs "$T/rec/record" "$p16" "$TPCS") b=$(standin_tpcs "$T/rec/record" "$p32" "$TPCS")
  [[ $(count "$a") == 16 && $(count "$b") == 32 ]] && disjoint "$a" "$b" &&
    pass "pods of 16 and 32 TPCs run on disjoint TPCs ($a | $b)" ||
    fail "the kernels of p16 ran on '$a', of p32 on '$b'"
  u16=$(stat -c %u "/proc/$p16") u32=$(stat -c %u "/proc/$p32")
  [[ $u16 == 1000 && $u32 == 2000 ]] && pass "the two pods run at once as users 1000 and 2000" ||
    fail "the pods' users: $u16 and $u32"
  st=$("$NV" --status --json 2>&1)
  held=$(jq -r '[.tasks[] | .tpcs] | join(" | ")' <<<"$st" 2>/dev/null)
  [[ $(jq '.tasks | length' <<<"$st" 2>/dev/null) -ge 2 ]] && ! grep -q '"shares_tpcs_with": \[[0-9]' <<<"$st" &&
    pass "nvtaskset --status on the node lists the shares, none overlapping ($held)" ||
    fail "nvtaskset --status --json: $st"
else
  fail "p16/p32 did not start: $(kubectl get pods -o wide 2>&1; kubectl describe pods p16 p32 2>&1 | tail -30)"
fi

# 3b. The plugin restarts (as a DaemonSet's rolling update restarts it)
#     while p16 and p32 run: it adopts their holders, their TPCs stay held,
#     and the kubelet registers it again; the claims below are all prepared
#     by the restarted plugin.
before=$(holders)
if "$CLUSTER" plugin-restart "$DIR"; then
  sleep 2
  after=$(holders)
  [[ $before == "$after" && $before != "[]" && $(phase p16) == Running && $(phase p32) == Running ]] &&
    pass "the plugin restarted while p16 and p32 ran: their holders and TPCs are unchanged ($after)" ||
    fail "across the plugin's restart: shares $before -> $after, p16 $(phase p16), p32 $(phase p32)"
else
  fail "cluster.sh plugin-restart"
fi

# 4. 48 more TPCs than the 16 left: Pending, the scheduler says why.
pod pbig 1000 tpcs-48 --kernels 1 | kubectl apply -f - >/dev/null
sched() { kubectl get pod pbig -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}' 2>/dev/null; }
if wait_for 60 eval '[[ $(sched) == Unschedulable ]]'; then
  why=$(kubectl get pod pbig -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')
  sleep 3
  [[ $(phase pbig) == Pending && $why == *claim* ]] && pass "a claim of 48 TPCs with 16 free stays Pending: $why" ||
    fail "pbig: phase $(phase pbig), reason: $why"
else
  fail "pbig is not reported unschedulable: $(kubectl describe pod pbig | tail -12)"
fi

# 5. A share that cannot be fenced must not start as if it were: a claim of
#    8 TPCs whose opaque config names no role nvtaskset has. The scheduler
#    places it (it fits); the plugin's Prepare refuses it, keeping nothing
#    of the claim, so the kubelet never starts the container, and its event
#    says why.
template tpcs-bad 8 '{apiVersion: tpc.nvtaskset.dev/v1alpha1, kind: TpcConfig, role: fast}' | kubectl apply -f - >/dev/null
pod pbad 1000 tpcs-bad --kernels 1 --ready-file "$T/run/ready-pbad" | kubectl apply -f - >/dev/null
if wait_for 90 prepare_failure pbad; then
  why=$(prepare_failure pbad)
  sleep 2
  started=$(kubectl get pod pbad -o jsonpath='{.status.containerStatuses[0].state.running}{.status.containerStatuses[0].state.terminated}')
  kept=$(kept_of pbad)
  [[ $(phase pbad) == Pending && -z $started && ! -e $T/run/ready-pbad && $why == *role* && -z $kept ]] &&
    pass "a claim with a bad opaque config never starts its container, and nothing of it is kept: $why" ||
    fail "pbad: phase $(phase pbad), container '$started', kept '$kept', event: $why"
else
  fail "pbad: no FailedPrepareDynamicResources event: $(kubectl describe pod pbad | tail -12)"
fi
kubectl delete pod pbad --wait=true --timeout=60s >/dev/null 2>&1

# 6. Deleting p32 releases its 32 TPCs; then the 48 fit and pbig runs.
touch "$T/run/stop-p32"
kubectl delete pod p32 --wait=true --timeout=60s >/dev/null 2>&1
released() { [[ $("$NV" --status --json | jq '[.tasks[] | select(.pid == '"${p32:-0}"')] | length') == 0 ]]; }
listed() { "$NV" --status --json | jq '.tasks | length'; }
if wait_for 60 released; then
  pass "deleting pod p32 released its TPCs (--status lists $(listed) task(s))"
else
  fail "p32's TPCs are still held: $("$NV" --status 2>&1)"
fi
if wait_for 120 is_phase pbig Succeeded; then
  pass "the pending pod ran once TPCs were free"
else
  fail "pbig did not run after the release: phase $(phase pbig): $(kubectl describe pod pbig | tail -10)"
fi
touch "$T/run/stop-p16"
kubectl delete pod p16 pbig --wait=true --timeout=60s >/dev/null 2>&1
wait_for 60 eval '[[ $(listed) == 0 ]]' && pass "with every pod deleted, no TPC is held" ||
  fail "TPCs still held after every pod was deleted: $("$NV" --status 2>&1)"

# 7. Roles: a latency-critical share of 8 TPCs and a best-effort share of
#    16, each in a pod that shares the node's PID namespace. Both run; the
#    node's --status shows each share's role; the LC task's beacon (what BE
#    tasks make way for) is named by its node PID, which is why role shares
#    need hostPID: a role share for a pod without it is refused.
role() { echo "{apiVersion: tpc.nvtaskset.dev/v1alpha1, kind: TpcConfig, role: $1}"; }
template tpcs-lc 8 "$(role latency-critical)" | kubectl apply -f - >/dev/null
template tpcs-be 16 "$(role best-effort)" | kubectl apply -f - >/dev/null
pod lc 1000 tpcs-lc --until-file "$T/run/stop-lc" --ready-file "$T/run/ready-lc" --interval-ms 50 | kubectl apply -f - >/dev/null
pod be 2000 tpcs-be --until-file "$T/run/stop-be" --ready-file "$T/run/ready-be" --interval-ms 50 | kubectl apply -f - >/dev/null
if wait_for 120 test -s "$T/run/ready-lc" && wait_for 60 test -s "$T/run/ready-be"; then
  plc=$(cat "$T/run/ready-lc") pbe=$(cat "$T/run/ready-be")
  st=$("$NV" --status --json)
  # task PID FIELD: that field of task PID in $st.
  task() { jq -r --argjson p "$1" --arg f "$2" '[.tasks[] | select(.pid == $p) | .[$f]] | first // "none"' <<<"$st"; }
  [[ $(task "$plc" role) == latency-critical && $(task "$pbe" role) == best-effort ]] &&
    pass "the LC and BE pods run; --status shows their tasks' roles" ||
    fail "roles in --status: pid $plc $(task "$plc" role), pid $pbe $(task "$pbe" role): $("$NV" --status 2>&1)"
  # The BE share's floor is all its 16 TPCs: none of them is reserved.
  lct=$(expand "$(task "$plc" tpcs)") bet=$(expand "$(task "$pbe" tpcs)")
  [[ $(count "$lct") == 8 && $(count "$bet") == 16 ]] && disjoint "$lct" "$bet" &&
    pass "the BE share's 16 TPCs lie off the LC share's reservation ($bet | $lct)" ||
    fail "the LC share holds '$lct', the BE share '$bet'"
  beacon=$(ls "$NVTASKSET_STATUS_DIR" | grep -c "^nvtaskset-beacon\.$plc\.")
  ((beacon == 1)) && pass "the LC pod's task (node pid $plc) keeps a beacon in the node's status directory" ||
    fail "no beacon of pid $plc in $NVTASKSET_STATUS_DIR: $(ls "$NVTASKSET_STATUS_DIR"); its log: $(kubectl logs lc 2>&1 | tail -3)"
else
  fail "the LC/BE pods did not start: $(kubectl get pods 2>&1; kubectl describe pods lc be 2>&1 | tail -20)"
fi
touch "$T/run/stop-lc" "$T/run/stop-be"
HOSTPID=false pod lcnopid 1000 tpcs-lc --kernels 1 --ready-file "$T/run/ready-lcnopid" | kubectl apply -f - >/dev/null
if wait_for 90 prepare_failure lcnopid; then
  why=$(prepare_failure lcnopid)
  kept=$(kept_of lcnopid)
  [[ $(phase lcnopid) == Pending && ! -e $T/run/ready-lcnopid && $why == *hostPID* && -z $kept ]] &&
    pass "a role share for a pod without hostPID is refused, nothing of it kept: ${why#*tpc.nvtaskset.dev: }" ||
    fail "lcnopid: phase $(phase lcnopid), kept '$kept', event: $why"
else
  fail "lcnopid: no FailedPrepareDynamicResources event: $(kubectl describe pod lcnopid | tail -12)"
fi
kubectl delete pod lc be lcnopid --wait=true --timeout=60s >/dev/null 2>&1
wait_for 60 eval '[[ $(listed) == 0 ]]' && pass "with the role pods deleted, no TPC is held" ||
  fail "TPCs still held after the role pods were deleted: $("$NV" --status 2>&1)"

# 8. down: nothing left.
if "$CLUSTER" down "$DIR"; then
  pass "cluster.sh down stopped every process and removed $DIR"
  DIR=""
  "$CLUSTER" down "$NVTS_K8S_DIR" >/dev/null 2>&1 && pass "cluster.sh down a second time is harmless" ||
    fail "cluster.sh down a second time failed"
else
  fail "cluster.sh down"
  DIR=""
fi
finish
