#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the best-effort role costs a training loop by itself, and which part of it: GPT-2-medium
training (bench/lc_be_mix.py's best-effort task) with no latency-critical task doing anything, so
that every difference is the shim's own doing, side by side in one run, configurations
interleaved round by round. Each run also reports the CPU seconds its process used per second
(all threads: the gatekeeper's wake-ups included), and the wall time of a launch, on each side
of it: 20000 adds of one float queued back to back (the launch path on the CPU sets it) and 3000
of 16M floats (about 30 us each on the GPU: the GPU sets it, gates included).

  plain        a plain process
  plain+lc     the same next to the idle LC task below (no shim in it: what another task's
               context costs by itself)
  role         nvtaskset --best-effort, no LC task (its queue is its own)
  role+lc      the same next to an idle LC task (nvtaskset -n 16 --latency-critical, one kernel
               launched, then asleep): the queue is bounded to NVTASKSET_BE_DEPTH launches (64),
               a gate queued every 2 launches (never closed: the LC task is idle)
  role+lc hold NVTASKSET_BE_YIELD=hold: no gate; the queue is 4 launches ("hold d16": 16)
  role+lc gN   a gate every N launches (NVTASKSET_BE_GATE_EVERY=N; g64: gates rare, the gatekeeper
               as often; g2: the spacing before the gates were spaced by work); "g2 d64": 64 launches
               queued
  role+lc gu250 the gates spaced by 250 us of learned work (NVTASKSET_BE_GATE_US; default 100)
  role+lc dN   the same with NVTASKSET_BE_DEPTH=N (an event every N/4 launches, at most 64 events)
  role+lc t500 NVTASKSET_BE_DEPTH=256 and NVTASKSET_BE_QUEUE_US=500
  role+lc wN   NVTASKSET_BE_WORK_US=N: at most N us of work queued, in learned kernel durations
  role+lc b0   NVTASKSET_BE_BORROW_US=0: every kernel borrows the idle reservation, long ones too
               (by default those timed at 500 us or more keep off it)
  role+lc run  NVTASKSET_BE_YIELD=run: no gate, no hold and no queue bound (what is left: the
               decision on every launch, the borrow limit's timing); "run d64" with the gate's
               queue bound of 64 launches; "run b0" without the timing either (the decision alone);
               "run d64 b0" the queue bound of 64 alone

Without MPS (--no-mps; the LC task is idle, so nothing contends). Prints each configuration's
it/s (median over rounds, min-max) and its ratio to plain, and the same of the launch times. With --compare B, every role+lc
configuration also runs under nvtaskset build B (its own shim), interleaved ("B: role+lc ..."), next
to an idle LC task of build B as well (a best-effort task reads only the beacons of its own build).
--configs picks some (names as above, comma-separated; with --compare each also under B, unless
some are named "B: ..." themselves, which are then the only ones under B).

    python3 bench/be_cost.py --nvtaskset .dev/nvt/bin/nvtaskset [--rounds 2] [--steps 15]
    python3 bench/be_cost.py ... --launch-only     # the two launch times alone, no training (seconds a round)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def per_launch_us(torch, x, n):
    """Wall time per launch of n in-place adds on x, queued back to back (us)."""
    for _ in range(200):
        x.add_(1)
    torch.cuda.synchronize()
    t = time.monotonic()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    return (time.monotonic() - t) / n * 1e6


def worker(steps):
    import torch
    if steps == 0:  # --launch-only: the launches alone, no model
        res = {"its": 0.0, "cpu": 0.0}
        res["tiny_us"] = per_launch_us(torch, torch.zeros(1, device="cuda"), 20000)
        res["short_us"] = per_launch_us(torch, torch.zeros(1 << 24, device="cuda"), 3000)
        print(json.dumps(res), flush=True)
        return
    import transformers
    sys.path.insert(0, os.path.dirname(HERE))
    import lc_be_mix  # the mix's BE task, the same code
    step = lc_be_mix.be_trainer(torch, transformers)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t, c = time.monotonic(), time.process_time()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall = time.monotonic() - t
    # CPU seconds of all the process's threads (the shim's gatekeeper included) per second
    res = {"its": steps / wall, "cpu": (time.process_time() - c) / wall}
    # The two sides of a launch, apart: one float (the launch path on the CPU: the GPU waits
    # for the CPU), and 16M floats (about 30 us on the GPU each: the CPU waits for the GPU).
    res["tiny_us"] = per_launch_us(torch, torch.zeros(1, device="cuda"), 20000)
    res["short_us"] = per_launch_us(torch, torch.zeros(1 << 24, device="cuda"), 3000)
    print(json.dumps(res), flush=True)


IDLE_LC = "import torch, time; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); print('ready', flush=True); time.sleep(3600)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvtaskset", default="build/bin/nvtaskset")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--launch-only", action="store_true",
                    help="no training: only the two launch times of each configuration (seconds a round)")
    ap.add_argument("--timeout", type=float, default=120, help="s per training run")
    ap.add_argument("--compare", help="a second nvtaskset build: its role+lc configurations run too")
    ap.add_argument("--configs", help="comma-separated subset (plain is always run: the ratios are to it)")
    a = ap.parse_args()
    nv = a.nvtaskset
    be = [sys.executable, HERE, "_worker", "0" if a.launch_only else str(a.steps)]
    role = [nv, "--no-mps", "--best-effort"]
    alone = [("plain", [], {}), ("role", role, {})]
    hold = {"NVTASKSET_BE_YIELD": "hold"}
    variants = [("role+lc", {}), ("role+lc hold", hold), ("role+lc hold d16", {**hold, "NVTASKSET_BE_DEPTH": "16"}),
                ("role+lc g1", {"NVTASKSET_BE_GATE_EVERY": "1"}), ("role+lc g4", {"NVTASKSET_BE_GATE_EVERY": "4"}),
                ("role+lc g64", {"NVTASKSET_BE_GATE_EVERY": "64"}), ("role+lc g2", {"NVTASKSET_BE_GATE_EVERY": "2"}),
                ("role+lc gu250", {"NVTASKSET_BE_GATE_US": "250"}),
                ("role+lc g2 d64", {"NVTASKSET_BE_DEPTH": "64"}),
                ("role+lc d16", {"NVTASKSET_BE_DEPTH": "16"}),
                ("role+lc d64", {"NVTASKSET_BE_DEPTH": "64"}), ("role+lc d1024", {"NVTASKSET_BE_DEPTH": "1024"}),
                ("role+lc t500", {"NVTASKSET_BE_DEPTH": "256", "NVTASKSET_BE_QUEUE_US": "500"}),
                ("role+lc w250", {"NVTASKSET_BE_WORK_US": "250"}), ("role+lc w500", {"NVTASKSET_BE_WORK_US": "500"}),
                ("role+lc w1000", {"NVTASKSET_BE_WORK_US": "1000"}),
                ("role+lc b0", {"NVTASKSET_BE_BORROW_US": "0"}),
                ("role+lc g64 b0", {"NVTASKSET_BE_GATE_EVERY": "64", "NVTASKSET_BE_BORROW_US": "0"}),
                ("role+lc run", {"NVTASKSET_BE_YIELD": "run"}),
                ("role+lc run b0", {"NVTASKSET_BE_YIELD": "run", "NVTASKSET_BE_BORROW_US": "0"}),
                ("role+lc run d64 b0", {"NVTASKSET_BE_YIELD": "run", "NVTASKSET_BE_DEPTH": "64",
                                        "NVTASKSET_BE_BORROW_US": "0"}),
                ("role+lc run d64", {"NVTASKSET_BE_YIELD": "run", "NVTASKSET_BE_DEPTH": "64"})]
    # plain+lc: a plain process next to the idle LC task, which no shim of its own sees
    beside = [("plain+lc", [], {})] + [(name, role, env) for name, env in variants]
    if a.compare:
        beside += [("B: " + name, [a.compare, "--no-mps", "--best-effort"], env) for name, env in variants]
    if a.configs:
        keep = set(a.configs.split(",")) | {"plain"}
        if not any(k.startswith("B: ") for k in keep):
            keep |= {"B: " + k for k in keep}
        alone = [c for c in alone if c[0] in keep]
        beside = [c for c in beside if c[0] in keep]
    got = {name: [] for name, _, _ in alone + beside}
    cpus = {name: [] for name, _, _ in alone + beside}
    tiny = {name: [] for name, _, _ in alone + beside}
    short = {name: [] for name, _, _ in alone + beside}

    def run(name, prefix, env):
        e = dict(os.environ, **env)
        try:
            p = subprocess.run(prefix + be, env=e, capture_output=True, text=True, timeout=a.timeout)
            res = json.loads(p.stdout.strip().splitlines()[-1])
            its, cpu = res["its"], res["cpu"]
        except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError) as x:
            print(f"  {name}: failed ({type(x).__name__}) {getattr(x, 'stderr', '') or ''}"[-400:], flush=True)
            return
        got[name].append(its)
        cpus[name].append(cpu)
        tiny[name].append(res["tiny_us"])
        short[name].append(res["short_us"])
        print(f"  {name}: " + ("" if a.launch_only else f"{its:.2f} it/s, {cpu:.2f} CPU s/s; ") + "a launch"
              f" {res['tiny_us']:.2f} us (1 float), "
              f"{res['short_us']:.2f} us (16M floats)", flush=True)

    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}", flush=True)
        for name, prefix, env in alone:
            run(name, prefix, env)
        if not beside:
            continue
        # With --compare, an idle LC task of build B too: a best-effort task makes way only for LC tasks
        # whose beacons it reads, those of its own build (the beacon's version), so each build's
        # configurations run next to an idle LC task of their own (both idle: another task's idle
        # context costs nothing, plain+lc).
        lcs = [subprocess.Popen([b, "--no-mps", "-n", "16", "--latency-critical", sys.executable, "-c", IDLE_LC],
                                stdout=subprocess.PIPE, text=True) for b in [nv] + ([a.compare] if a.compare else [])]
        try:
            if any(lc.stdout.readline().strip() != "ready" for lc in lcs):
                print("  an idle LC task did not start", flush=True)
                continue
            for name, prefix, env in beside:
                run(name, prefix, env)
        finally:
            for lc in lcs:
                lc.kill()
                lc.wait()
    base = statistics.median(got["plain"]) if got["plain"] else None
    tb = statistics.median(tiny["plain"]) if tiny["plain"] else None
    sb = statistics.median(short["plain"]) if short["plain"] else None
    print("\nconfiguration       it/s median [min-max]   x plain   CPU s/s (all threads)"
          "   us a launch: 1 float (x plain), 16M floats (x plain)")
    for name, xs in got.items():
        if not xs:
            print(f"  {name:18s} -")
            continue
        m = statistics.median(xs)
        ratio = f"{m / base:.3f}" if base else "-"  # (--launch-only: no it/s, "-")
        t, sh = statistics.median(tiny[name]), statistics.median(short[name])
        tr = f"{t / tb:.3f}" if tb else "-"
        sr = f"{sh / sb:.3f}" if sb else "-"
        print(f"  {name:18s} {m:6.2f} [{min(xs):.2f}-{max(xs):.2f}]   {ratio:7s}   {statistics.median(cpus[name]):.2f}"
              f"   {t:6.2f} ({tr}), {sh:6.2f} ({sr})")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_worker":
        worker(int(sys.argv[2]))
    else:
        main()
