# SPDX-License-Identifier: Apache-2.0
"""bench/eval.py's sections startup (Fig. 11a: exec -> first kernel) and latency (Fig. 11b: launch ->
first block start, plain vs nvtaskset).
"""
import os
import random
import re
import subprocess

import eval_harness as H
from eval_harness import LABEL, fmt, left, log, median, mps_start, mps_stop, pstats, run, write_csv


# ---- Fig. 11a: start-up ------------------------------------------------------------------------------------


def section_startup():
    """Start-up with the GPU idle (no process holds it), then with it held open by another process
    (first_kernel --hold, outside MPS): the driver then skips bringing the GPU up."""
    rounds = 100 if H.ARGS.full else 20
    for held in (False, True):
        budget = min(left() - 30, 480 if H.ARGS.full else 110)
        if budget < 20:
            log("SKIP startup: no time left")
            return
        tag = "_held" if held else ""
        cmd = [os.path.join(H.BIN, "nvt/bench/bench_startup"), "--child", os.path.join(H.BIN, "cuda/first_kernel"),
               "--nvtaskset", H.NV, "--list", f"0-{H.NTPC // 2 - 1}", "--rounds", str(rounds),
               "--csv", os.path.join(H.OUT, f"startup{tag}.csv"),
               "--summary-csv", os.path.join(H.OUT, f"startup{tag}_summary.csv"),
               "--log", os.path.join(H.LOGS, f"startup{tag}.log"), "--budget-s", str(int(budget)), "--timeout-s", "60"]
        holder = None
        # mps-client-q (an MPS client with nvtaskset's hardware queues) splits nvtaskset's own cost from the
        # queues'. The cold configuration is left out when held: it stops the MPS daemon, which the holder does
        # not need.
        cmd += ["--configs", "plain,nvt-nomps," + ("" if held else "nvt-cold,") + "mps-client,nvt-warm,mps-client-q"]
        if held:
            holder = subprocess.Popen([os.path.join(H.BIN, "cuda/first_kernel"), "--hold"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            if not holder.stdout.readline().startswith("first_kernel"):
                log("WARN startup: the process holding the GPU open did not start", summary=True)
        LABEL[0] = "startup" + (" (GPU held open)" if held else " (GPU idle)")
        log(f"-- {LABEL[0]}", summary=True)
        try:
            rc, out, err, dt = run(cmd, timeout=budget + 200)
        finally:
            if holder is not None:
                holder.stdin.close()
                try:
                    holder.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    holder.kill()
        for line in out.strip().splitlines():
            log(line, summary=True)
        if rc != 0:
            log(f"WARN bench_startup rc={rc} ({dt:.0f} s): {err.strip()[-600:]}", summary=True)
        mps_stop()


# ---- Fig. 11b: launch latency ------------------------------------------------------------------------------


def section_latency():
    rounds = 7 if H.ARGS.full else 3
    launches = 10000 if H.ARGS.full else 2000
    half, full = f"0-{H.NTPC // 2 - 1}", f"0-{H.NTPC - 1}"
    configs = [("plain", [], False), (f"nvt-nomps -t {half}", [H.NV, "--no-mps", "-t", half], False),
               (f"nvt-nomps -t {full}", [H.NV, "--no-mps", "-t", full], False),
               ("mps-client", [], True), (f"nvt-mps -t {half}", [H.NV, "-t", half], True)]
    rows, summ = [], {c[0]: [] for c in configs}
    rng = random.Random(11)
    path = os.path.join(H.LOGS, "latency-samples.csv")
    done = 0
    for r in range(rounds):
        if left() < 60:
            log("WARN latency: time budget spent; stopping early", summary=True)
            break
        for use_mps in (False, True):
            (mps_start if use_mps else mps_stop)()
            group = [c for c in configs if c[2] == use_mps]
            rng.shuffle(group)
            for name, prefix, _ in group:
                LABEL[0] = f"latency/{name}"
                rc, out, err, _ = run(prefix + [os.path.join(H.BIN, "cuda/launch_latency"), "--launches", str(launches),
                                                "--samples-out", path], timeout=180)
                m = re.search(r"summary .* halfwidth_ns (\d+) drift_ns (-?\d+)", out)
                res = re.search(r"timer_resolution_ns (\d+)", out)
                if rc != 0 or not m:
                    log(f"WARN latency {name} round {r}: rc={rc} {err.strip()[-300:]}", summary=True)
                    continue
                with open(path) as f:
                    next(f)
                    for i, line in enumerate(f):
                        lat, call, rt, lastb = (float(x) for x in line.split(","))
                        rows.append((r, name, i, lat / 1e3, call / 1e3, rt / 1e3, lastb / 1e3))
                summ[name].append((r, int(m.group(1)), int(m.group(2)), int(res.group(1)) if res else -1))
        done += 1
    mps_stop()
    write_csv("latency.csv", ["round", "config", "i", "latency_us", "call_us", "roundtrip_us", "last_block_us"], rows)
    by = {c[0]: [x[3] for x in rows if x[1] == c[0]] for c in configs}
    calls = {c[0]: [x[4] for x in rows if x[1] == c[0]] for c in configs}
    per_round = {}
    for x in rows:
        per_round.setdefault((x[1], x[0]), []).append(x[3])
    pmed = stats_or_nan(by["plain"])
    log(f"launch latency (host stamp before the launch -> first block's %globaltimer), us; {done} rounds of "
        f"{launches} launches per configuration, interleaved", summary=True)
    log(f"{'config':<22} {'n':>6} {'min':>8} {'median':>8} {'p99':>8} {'max':>9} {'x plain':>8} {'paired':>7} "
        f"{'call med':>9} {'+-clock':>8} {'timer res':>9}", summary=True)
    srows = []
    for name, _, _ in configs:
        s = pstats(by[name])
        paired = [median(per_round[(name, r)]) / median(per_round[("plain", r)]) for r in range(rounds)
                  if (name, r) in per_round and ("plain", r) in per_round]
        hw = max((x[1] for x in summ[name]), default=-1) / 1e3
        res = max((x[3] for x in summ[name]), default=-1)
        ratio = s["med"] / pmed if pmed == pmed else float("nan")
        log(f"{name:<22} {s['n']:>6} {fmt(s['min'], 2):>8} {fmt(s['med'], 2):>8} {fmt(s['p99'], 2):>8} "
            f"{fmt(s['max'], 1):>9} {fmt(ratio):>7}x {fmt(median(paired)):>6}x {fmt(median(calls[name]), 2):>9} "
            f"{fmt(hw, 2):>8} {res:>7}ns", summary=True)
        srows.append((name, s["n"], s["min"], s["med"], s["p99"], s["max"], ratio, median(paired), median(calls[name]),
                      hw, res))
    write_csv("latency_summary.csv", ["config", "n", "min_us", "median_us", "p99_us", "max_us", "ratio_to_plain",
                                      "paired_ratio_to_plain", "call_median_us", "clock_halfwidth_us",
                                      "timer_resolution_ns"], srows)
    log("(+-clock: the half-width of the host/GPU clock calibration, a bound on the error of each latency; "
        "paired: median of per-round median ratios)", summary=True)


def stats_or_nan(v):
    return median(v) if v else float("nan")

