# SPDX-License-Identifier: Apache-2.0
"""bench/yield_time.py's default mode: the yield time after `nvtaskset -p` shrinks the BE off the LC's
TPCs, for each DEPTH x KERNEL (the LC alone, then trials of shrink and grow next to the BE).
"""
import os
import signal
import statistics
import subprocess
import sys
import time

from yield_time_common import BE_ALL, BE_FLOOR, LC_TPCS, SCRIPT, matmul_for, wait_ready

STEADY = 5  # LC replays in a row within the bound that end a yield
BOUND = 1.25  # x the LC's steady latency next to the shrunk BE
# A trial's windows. The BE task grown back before a trial runs on all TPCs only once the
# kernels it queued while shrunk have run: GROWN_S must outlast the deepest queue (128
# kernels of ~8 ms: about 1 s).
SHRUNK_S, GROWN_S = 2.0, 2.5


def read_rows(path):
    rows = []
    try:
        for line in open(path):
            parts = line.split()
            if len(parts) == 2:
                rows.append((float(parts[0]), float(parts[1])))
    except OSError:
        pass
    return rows


def start(a, role, tpcs, log, stop, env, extra=()):
    cmd = [a.nvtaskset, "-t", tpcs, sys.executable, SCRIPT, role, "--log", log, "--stop", stop,
           *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(log + ".err", "w"),
                            start_new_session=True)


def finish(procs, stop):
    open(stop, "w").close()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def p_(a, tpcs, pid, env):
    r = subprocess.run([a.nvtaskset, "-p", "-t", tpcs, str(pid)], capture_output=True, text=True, timeout=30, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"-p -t {tpcs} {pid}: {r.stderr.strip()}")


def lc_alone(a, d, work):
    log, stop = os.path.join(work, "lc-alone.log"), os.path.join(work, "lc-alone.stop")
    p = start(a, "lc", LC_TPCS, log, stop, d.env)
    try:
        wait_ready(log, p)
        time.sleep(3)
    finally:
        finish([p], stop)
    lat = [x for _, x in read_rows(log)][20:]
    return statistics.median(lat)


def one_config(a, d, work, depth, ms, alone):
    tag = f"d{depth}-k{ms}"
    lcl, bel, stop = (os.path.join(work, f"{tag}.{x}") for x in ("lc", "be", "stop"))
    lc = start(a, "lc", LC_TPCS, lcl, stop, d.env)
    be = start(a, "be", BE_ALL, bel, stop, d.env, ["--depth", str(depth), "--k", matmul_for(ms)])
    trials = []
    try:
        wait_ready(lcl, lc)
        wait_ready(bel, be)
        time.sleep(2)
        for _ in range(a.trials):
            t0 = time.monotonic()
            p_(a, BE_FLOOR, be.pid, d.env)
            time.sleep(SHRUNK_S)
            t1 = time.monotonic()
            p_(a, BE_ALL, be.pid, d.env)
            time.sleep(GROWN_S)
            trials.append((t0, t1))
    finally:
        finish([lc, be], stop)
    rows = read_rows(lcl)
    be_rows = read_rows(bel)
    yields, contended, shrunk = [], [], []
    for t0, t1 in trials:
        contended.extend(x for t, x in rows if t0 - 0.5 < t < t0)
        settled = [x for t, x in rows if (t0 + t1) / 2 < t < t1]
        if not settled:
            yields.append(None)
            continue
        steady = statistics.median(settled)
        shrunk.append(steady)
        run, end = 0, None
        for t, x in ((t, x) for t, x in rows if t0 < t < t1):
            run = run + 1 if x <= BOUND * steady else 0
            if run == STEADY:
                end = t
                break
        yields.append((end - t0) * 1e3 if end is not None else None)
    kernel = statistics.median([x for _, x in be_rows]) if be_rows else None
    ok = [y for y in yields if y is not None]
    return {"depth": depth, "kernel_ms_target": ms, "be_kernel_ms": kernel,
            "lc_contended_ms": statistics.median(contended) if contended else None,
            "lc_shrunk_ms": statistics.median(shrunk) if shrunk else None, "trials": trials,
            "yield_ms": yields, "yield_median_ms": statistics.median(ok) if ok else None,
            "never_recovered": len(yields) - len(ok)}

