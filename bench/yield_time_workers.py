# SPDX-License-Identifier: Apache-2.0
"""bench/yield_time.py's worker processes (run under nvtaskset, as MPS clients, on the GPU machine):
the LC's matmul graph replayed back to back or as probes, the BE's matmul loop, plain or steered
from stdin (--roles). torch is imported inside the workers: importing this module needs none.
"""
import ctypes
import os
import random
import select
import signal
import sys
import time

from yield_time_common import matmul_dims


# ---- workers (run under nvtaskset, as MPS clients) ----------------------------------------

def lc_graph(torch):
    """The LC's request: 8 chained 2048 x 2048 bf16 matmuls, one CUDA graph (with its tensors)."""
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            y = x @ w
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x
            for _ in range(8):
                y = y @ w
    torch.cuda.synchronize()
    return g, (x, w, y, s)


def worker_lc(a):
    import torch
    g, _keep = lc_graph(torch)
    with open(a.log, "w", buffering=1) as f:
        f.write("ready\n")
        while not os.path.exists(a.stop):
            t0 = time.monotonic()
            g.replay()
            torch.cuda.synchronize()
            t1 = time.monotonic()
            f.write(f"{t1:.6f} {(t1 - t0) * 1e3:.4f}\n")


def worker_be(a):
    import torch
    n, k = matmul_dims(a.k)
    x = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with open(a.log, "w", buffering=1) as f:
        f.write("ready\n")
        while not os.path.exists(a.stop):
            t0 = time.monotonic()
            for _ in range(a.depth):
                x @ w
            torch.cuda.synchronize()
            f.write(f"{time.monotonic():.6f} {(time.monotonic() - t0) * 1e3 / a.depth:.4f}\n")


def die_with_parent():
    """--roles workers: SIGKILL when the driver dies (nvtaskset execs in place, so it is the
    parent); the BE also quits on its stdin's EOF."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_lc_probe(a):
    """--roles LC: waits a random gap, replays the graph once, synchronizes; again until the
    stop file. Log lines "p LAUNCH LATENCY_MS" (CLOCK_MONOTONIC s, ms)."""
    die_with_parent()
    open(a.log + ".started", "w").close()  # nvtaskset has exec'd: its partition is published
    import torch
    g, _keep = lc_graph(torch)
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    rng = random.Random(a.seed)
    lo, hi = a.gap
    with open(a.log, "w", buffering=1) as f:
        f.write("ready\n")
        while not os.path.exists(a.stop):
            time.sleep(rng.uniform(lo, hi) / 1e3)
            t0 = time.monotonic()
            g.replay()
            torch.cuda.synchronize()
            t1 = time.monotonic()
            f.write(f"p {t0:.6f} {(t1 - t0) * 1e3:.4f}\n")


def worker_be_ctl(a):
    """--roles BE: the matmul loop of worker_be, steered from stdin: "run ID DEPTH NxK" (DEPTH
    matmuls of N x K x N, then a synchronization, again and again), "pause ID" (nothing
    queued), "quit". Starts paused; each command is taken between batches and answered with the
    file LOG.ack-ID. Log lines "b END PER_KERNEL_MS DEPTH" per batch."""
    die_with_parent()
    import torch
    ops = {}
    for nk in sorted({x for x in a.ks.split(",") if x}):
        n, k = matmul_dims(nk)
        ops[nk] = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
                   torch.randn(k, n + 1 if a.align1 else n, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    cur = None
    with open(a.log, "w", buffering=1) as f:
        f.write("ready\n")
        while True:
            if cur is None or select.select([sys.stdin], [], [], 0)[0]:
                cmd = sys.stdin.readline().split()
                if not cmd or cmd[0] == "quit":
                    break  # EOF: the driver is gone
                cur = (int(cmd[2]), cmd[3]) if cmd[0] == "run" else None
                open(f"{a.log}.ack-{cmd[1]}", "w").close()
                continue
            depth, k = cur
            x, w = ops[k]
            t0 = time.monotonic()
            for _ in range(depth):
                x @ w
            torch.cuda.synchronize()
            t1 = time.monotonic()
            f.write(f"b {t1:.6f} {(t1 - t0) * 1e3 / depth:.4f} {depth}\n")
