#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# How many gates a best-effort task queues per launch, how many of its launches it keeps off an
# idle reservation, and how often its queue bound made it wait, for GPT-2-medium training
# (bench/lc_be_mix.py's best-effort task, 30 steps) next to an idle latency-critical task, under
# each gate spacing: the default (100 us of learned work, NVTASKSET_BE_GATE_US), a gate every 2
# launches (NVTASKSET_BE_GATE_EVERY=2) and 250 us. Counts, read from `nvtaskset --status --json`
# once the training is done; no timing.
# Without MPS. Run from the repository root:
#
#   bash bench/be_gates.sh .dev/nvt/bin/nvtaskset
set -u
NV=${1:?usage: be_gates.sh NVTASKSET}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
IDLE="import torch, time; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); print('ready', flush=True); time.sleep(3600)"
"$NV" --no-mps -n 16 --latency-critical python3 -c "$IDLE" > "$tmp/lc.out" & lc=$!
for _ in $(seq 60); do grep -q ready "$tmp/lc.out" && break; sleep 0.5; done
for mode in default g2 gu250; do
  case $mode in
    g2) E="NVTASKSET_BE_GATE_EVERY=2" ;;
    gu250) E="NVTASKSET_BE_GATE_US=250" ;;
    *) E="NVTASKSET_BE_GATES_DEFAULT=1" ;;  # (a name nvtaskset does not read: the defaults)
  esac
  env "$E" "$NV" --no-mps --best-effort python3 -c "
import sys, time
sys.path.insert(0, 'bench')
import torch, transformers, lc_be_mix
step = lc_be_mix.be_trainer(torch, transformers)
for _ in range(30):
    step()
torch.cuda.synchronize()
open('$tmp/done', 'w').close()
time.sleep(5)" & be=$!
  for _ in $(seq 120); do [ -e "$tmp/done" ] && break; sleep 0.5; done
  "$NV" --status --json > "$tmp/st.json"
  python3 -c "
import json
for t in json.load(open('$tmp/st.json'))['tasks']:
    if t.get('role') == 'best-effort':
        c = t['controller']
        n = t['kernels_launched']
        print('$mode', 'launches', n, 'gates', c['gates_queued'], 'per launch %.3f' % (c['gates_queued'] / max(1, n)),
              'kept_off', c.get('kept_off'), 'queue_waits', c.get('queue_waits'))"
  wait "$be"
  rm -f "$tmp/done"
done
kill "$lc"
wait "$lc" 2> /dev/null
