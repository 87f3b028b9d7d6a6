# SPDX-License-Identifier: Apache-2.0
"""bf16 matmul throughput over time, eagerly or through CUDA graphs.

    python3 torch_graphs.py VARIANT [--duration S] [--n N] [--interval-ms MS]

VARIANT: eager (a @ b each step), cudagraph (torch.cuda.CUDAGraph of the same
step, captured once and replayed), compile (torch.compile(mode="reduce-overhead")
of relu(x @ w1) @ w2: inductor + Triton, replayed through cudagraph trees).

After warm-up (and compilation/capture) it prints "ready", then for DURATION
seconds one line per interval of about --interval-ms:
    <CLOCK_MONOTONIC ns at the interval's end> <TFLOP/s in that interval>
Each step is synchronized, so an interval counts only work that finished in it.
The first line after "ready" is the start mark "<ns> start". Used by
tests/gpu/verify.py (section torchgraphs) with `nvtaskset -p` in the middle."""
import argparse
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("variant", choices=["eager", "cudagraph", "compile"])
ap.add_argument("--duration", type=float, default=4.0)
ap.add_argument("--n", type=int, default=8192)
ap.add_argument("--interval-ms", type=float, default=100.0)
args = ap.parse_args()

n = args.n
torch.manual_seed(0)
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)

if args.variant == "eager":
    def step():
        torch.matmul(a, b, out=out)
    flops = 2 * n**3
elif args.variant == "cudagraph":
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.matmul(a, b, out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.matmul(a, b, out=out)

    def step():
        g.replay()
    flops = 2 * n**3
else:
    w1, w2 = b, torch.randn(n, n, device="cuda", dtype=torch.bfloat16)  # no aliased inputs

    def mlp(x):
        return torch.relu(x @ w1) @ w2

    fn = torch.compile(mlp, mode="reduce-overhead")

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        fn(a)
    flops = 2 * 2 * n**3

t0 = time.perf_counter()
for _ in range(5):
    step()
torch.cuda.synchronize()
warm = time.perf_counter() - t0
info = f"info variant {args.variant} n {n} warm-up {warm:.1f} s"
if args.variant == "compile":
    try:
        from torch._dynamo.utils import counters
        info += f" cudagraph_skips {sum(counters['inductor'].get(k, 0) for k in counters['inductor'] if 'cudagraph' in k and 'skip' in k)}"
    except Exception as e:  # report, never fail on a private API
        info += f" counters unavailable ({e!r})"
print(info, flush=True)
print("ready", flush=True)

interval = args.interval_ms * 1e6
start = time.monotonic_ns()
print(f"{start} start", flush=True)
end = start + int(args.duration * 1e9)
last, done = start, 0
while True:
    step()
    torch.cuda.synchronize()
    done += 1
    now = time.monotonic_ns()
    if now - last >= interval:
        print(f"{now} {done * flops / ((now - last) * 1e-9) / 1e12:.1f}", flush=True)
        last, done = now, 0
        if now >= end:
            break
sys.exit(0)
