#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the number of hardware copy queues an MPS client gets costs a program that overlaps copies
with kernels on several streams (bench/cuda/copy_pipeline.cu), side by side in one run.

nvtaskset gives its MPS clients 8 kernel queues and 2 copy queues (a plain process has 4): fewer
copy queues start faster (docs/hardware.md, "MPS"). This shows what they cost afterwards: each
configuration runs copy_pipeline, configurations interleaved round by round; it prints the median
time and its ratio to an MPS client with a plain process's queues (CUDA_DEVICE_MAX_CONNECTIONS=8
CUDA_DEVICE_MAX_COPY_CONNECTIONS=4), and the median bandwidth.

    python3 bench/copy_queues.py [--rounds N] [--streams S] [--chunk-mb M] [--kernel-us U] [BIN]
    (BIN: what bench/build_eval.sh built, default .dev/eval)

It stops any MPS control daemon for the plain runs, starts one for the rest and stops it again.
"""
import argparse
import os
import statistics
import sys

from benchproc import interleaved, mps, run_matching

CONN = "CUDA_DEVICE_MAX_CONNECTIONS"
COPY = "CUDA_DEVICE_MAX_COPY_CONNECTIONS"


def run(cmd, env):
    m = run_matching(cmd, env, r" ms ([0-9.]+) gbps ([0-9.]+)", 120)
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--chunk-mb", type=int, default=16)
    ap.add_argument("--kernel-us", type=int, default=500)
    ap.add_argument("bin", nargs="?", default=".dev/eval")
    a = ap.parse_args()
    prog = os.path.join(a.bin, "cuda/copy_pipeline")
    nv = os.path.join(a.bin, "nvt/bin/nvtaskset")
    for path in (prog, nv):
        if not os.access(path, os.X_OK):
            sys.exit(f"copy_queues.py: {path}: not found; build it with bench/build_eval.sh {a.bin}")
    pipe = [prog, "--streams", str(a.streams), "--chunk-mb", str(a.chunk_mb), "--kernel-us", str(a.kernel_us)]
    plain = {"plain process": (pipe, {})}
    clients = {
        "mps client": (pipe, {}),
        "mps client copy4": (pipe, {CONN: "8", COPY: "4"}),
        "mps client copy2": (pipe, {CONN: "8", COPY: "2"}),
        "mps client copy1": (pipe, {CONN: "8", COPY: "1"}),
        "nvtaskset -t 0-32 (copy2)": ([nv, "-t", "0-32"] + pipe, {}),
        "nvtaskset -t 0-32, user's copy4": ([nv, "-t", "0-32"] + pipe, {COPY: "4"}),
    }
    base = "mps client copy4"
    res = {k: [] for k in list(plain) + list(clients)}

    def measure(group):
        interleaved(group, a.rounds, run, res)

    try:
        mps("stop")
        measure(plain)
        mps("start")
        measure(clients)
    finally:
        mps("stop")
    print(f"copy_pipeline, {a.streams} streams, {a.chunk_mb} MiB in and out per stream, {a.kernel_us} us kernels "
          f"(median of {a.rounds}, interleaved)")
    b = statistics.median(t for t, _ in res[base])
    for k in res:
        t = statistics.median(x for x, _ in res[k])
        g = statistics.median(y for _, y in res[k])
        print(f"  {k:32s} {t:9.1f} ms  {t / b:6.3f}x  {g:7.2f} GB/s")


if __name__ == "__main__":
    main()
