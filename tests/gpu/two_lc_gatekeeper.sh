#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A best-effort task next to two idle latency-critical tasks: where its
# gatekeeper thread (nvt-gatekeeper) waits, from /proc/<pid>/task/*/syscall.
# Asleep on both beacons at once it is in futex_waitv (449, Linux 5.16);
# polling, in clock_nanosleep (230). No MPS (--no-mps). Run from the
# repository root on a GPU machine with PyTorch, after carrying .dev/nvt:
#   timeout 60 bash tests/gpu/two_lc_gatekeeper.sh
set -u
uname -r
B=.dev/nvt/bin/nvtaskset
IDLE="import torch,time; torch.zeros(1,device='cuda'); torch.cuda.synchronize(); print('ready',flush=True); time.sleep(25)"
$B --no-mps -n 8 --latency-critical python3 -c "$IDLE" & L1=$!
$B --no-mps -n 8 --latency-critical python3 -c "$IDLE" & L2=$!
sleep 10
$B --no-mps --best-effort python3 -c "
import torch,time
x=torch.zeros(1<<20,device='cuda'); t=time.time()
while time.time()-t<10: x.add_(1)
torch.cuda.synchronize(); print('be done',flush=True)" & BE=$!
sleep 6
$B --status | head -8
for i in 1 2 3 4 5; do for t in /proc/$BE/task/*; do [ "$(cat $t/comm 2>/dev/null)" = nvt-gatekeeper ] && echo "gatekeeper: $(cut -d' ' -f1-3 $t/syscall)"; done; sleep 0.3; done
wait $BE; kill $L1 $L2 2>/dev/null; wait
