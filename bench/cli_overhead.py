#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The CLI's part of start-up, without the GPU (docs/results.md, Fig. 11a).

bench_startup's exec->main column is, under nvtaskset, the whole CLI plus the task's own exec.
This splits it, side by side in one run, configurations interleaved round by round (order
shuffled per round), each the wall time from spawning to exit of a command whose task is
/bin/true:

    true                       one exec: what a plain program pays before main
    nvtaskset --version        the CLI's own process start (it returns before any work)
    nvtaskset --no-mps -t ...  + the cached device list and topology, the plan, the status entry
    nvtaskset -t ...           + MPS: the daemon probe and the get_server_list query
    get_server_list            that query alone (the control program as a client)

With --compare DIR (another bench/build_eval.sh output, e.g. an older build), the three nvtaskset
rows run for it too, in the same rounds. The MPS daemon is started by a warm-up launch of
first_kernel (which also caches the topology and starts this user's MPS server, as in
bench_startup) and stopped at the end.

    python3 bench/cli_overhead.py [--rounds N] [--tpcs LIST] [--compare DIR] [BIN]
    (BIN: what bench/build_eval.sh built, default .dev/eval)
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import time

TRUE = shutil.which("true") or "/bin/true"


def timed(cmd, stdin=None):
    t = time.perf_counter()
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)
    took = (time.perf_counter() - t) * 1e3
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: rc={p.returncode} {p.stderr.strip()[-300:]}")
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--tpcs", default="0-32")
    ap.add_argument("--compare", help="another build_eval.sh output, run side by side")
    ap.add_argument("bin", nargs="?", default=".dev/eval")
    a = ap.parse_args()
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl:
        raise SystemExit("cli_overhead: nvidia-cuda-mps-control not found on PATH")
    builds = {"": a.bin}
    if a.compare:
        builds[" [compare]"] = a.compare
    configs = {"true": ([TRUE], None), "get_server_list": ([ctl], "get_server_list\n")}
    for tag, b in builds.items():
        nv = os.path.join(b, "nvt/bin/nvtaskset")
        if not os.access(nv, os.X_OK):
            raise SystemExit(f"cli_overhead: {nv} is not an executable (is {b} a bench/build_eval.sh output?)")
        configs["nvtaskset --version" + tag] = ([nv, "--version"], None)
        configs["nvtaskset --no-mps" + tag] = ([nv, "--no-mps", "-t", a.tpcs, TRUE], None)
        configs["nvtaskset (MPS warm)" + tag] = ([nv, "-t", a.tpcs, TRUE], None)
    nv = os.path.join(a.bin, "nvt/bin/nvtaskset")
    try:
        # Warm-up, untimed: starts the daemon and this user's server, caches the topology.
        subprocess.run([nv, "-t", a.tpcs, os.path.join(a.bin, "cuda/first_kernel")], capture_output=True,
                       timeout=300, check=True)
        times = {k: [] for k in configs}
        for _ in range(a.rounds):
            order = list(configs)
            random.shuffle(order)
            for k in order:
                cmd, stdin = configs[k]
                times[k].append(timed(cmd, stdin))
    finally:
        subprocess.run([ctl], input="quit\n", text=True, capture_output=True, timeout=30)
    base = statistics.median(times["true"])
    print(f"{'configuration':34s} {'n':>4s} {'median ms':>10s} {'p90 ms':>8s} {'- true ms':>10s}")
    for k, v in times.items():
        med = statistics.median(v)
        p90 = sorted(v)[int(0.9 * (len(v) - 1))]
        print(f"{k:34s} {len(v):4d} {med:10.2f} {p90:8.2f} {med - base:10.2f}")
    for tag in builds:
        ver, nomps, warm = (statistics.median(times[k + tag]) for k in
                            ("nvtaskset --version", "nvtaskset --no-mps", "nvtaskset (MPS warm)"))
        print(f"split{tag}: the CLI's process start {ver - base:.2f} ms, its planning and the task's exec "
              f"{nomps - ver:.2f} ms, "
              f"MPS {warm - nomps:.2f} ms (the query alone: {statistics.median(times['get_server_list']) - base:.2f} "
              f"ms over one exec)")


if __name__ == "__main__":
    main()
