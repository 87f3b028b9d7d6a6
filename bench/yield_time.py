#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How fast a best-effort task gives TPCs back: the yield time behind issue 22's roles.

A mask reaches a kernel when the kernel is launched (its TMD is written then), so after
`nvtaskset -p` shrinks a best-effort (BE) task off the TPCs of a latency-critical (LC) task,
the BE kernels already queued still run where they were launched. This measures, on one GPU,
how long the LC task keeps waiting after the shrink, as a function of how deep the BE task
queues (kernels launched between synchronizations) and how long each BE kernel runs.

Both tasks are MPS clients (a private daemon, stopped at the end), as partitioned tasks must be
to run at the same time:
  LC: `nvtaskset -t 0-15`, replays a small bf16 matmul CUDA graph back to back and records
      each replay's latency (synchronized);
  BE: `nvtaskset -t 0-65`, launches DEPTH bf16 matmuls of about KERNEL ms each, then
      synchronizes, again and again.
Each trial: shrink BE to 16-65 with `-p` at t0, wait, grow it back. Next to the shrunk BE the
LC replays do not get back to their time alone (the SMs are fenced, DRAM and L2 are not), so
the yield time is from t0 to the end of the first of 5 LC replays in a row within 1.25x of the
LC's steady latency next to the shrunk BE (the median of the second half of the shrunk
window). Printed: the LC alone, next to the full BE, next to the shrunk BE, and the yield time
(median and range over trials) for each DEPTH x KERNEL, all in one run.

    python3 bench/yield_time.py --nvtaskset build/bin/nvtaskset --out DIR
    python3 bench/yield_time.py --dry-run       # the plan, no GPU
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

LC_TPCS, BE_ALL, BE_FLOOR = "0-15", "0-65", "16-65"
STEADY = 5  # LC replays in a row within the bound that end a yield
BOUND = 1.25  # x the LC's steady latency next to the shrunk BE
# A trial's windows. The BE task grown back before a trial runs on all TPCs only once the
# kernels it queued while shrunk have run: GROWN_S must outlast the deepest queue (128
# kernels of ~8 ms: about 1 s).
SHRUNK_S, GROWN_S = 2.0, 2.5


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nvtaskset", default="build/bin/nvtaskset")
    p.add_argument("--out", default=None, help="directory for yield_time.json and the workers' logs")
    p.add_argument("--depths", default="1,16,128", help="BE kernels launched between synchronizations")
    p.add_argument("--kernel-ms", default="1.5,6", help="approximate BE kernel times on the whole GPU")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("role", nargs="?", choices=["lc", "be"], help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--stop", help=argparse.SUPPRESS)
    p.add_argument("--depth", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--k", type=int, default=8192, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        a.depth_list = [int(x) for x in a.depths.split(",")]
        a.kernel_list = [float(x) for x in a.kernel_ms.split(",")]
    except ValueError:
        p.error(f"--depths and --kernel-ms take comma-separated numbers: {a.depths!r}, {a.kernel_ms!r}")
    if any(d < 1 or d > 4096 for d in a.depth_list) or any(k <= 0 or k > 100 for k in a.kernel_list):
        p.error("depths must be 1..4096 and kernel times 0..100 ms")
    if a.trials < 1 or a.trials > 50:
        p.error("--trials takes 1..50")
    return a


# ---- workers (run under nvtaskset, as MPS clients) ----------------------------------------

def worker_lc(a):
    import torch
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
    x = torch.randn(8192, a.k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(a.k, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with open(a.log, "w", buffering=1) as f:
        f.write("ready\n")
        while not os.path.exists(a.stop):
            t0 = time.monotonic()
            for _ in range(a.depth):
                x @ w
            torch.cuda.synchronize()
            f.write(f"{time.monotonic():.6f} {(time.monotonic() - t0) * 1e3 / a.depth:.4f}\n")


# ---- the driver ----------------------------------------------------------------------------

def k_for(ms):
    # An 8192 x K x 8192 bf16 matmul does 2*8192*8192*K flops; about 700 TFLOP/s on a whole
    # H100/H200 (docs/results.md), so K ~ ms * 700e9 / (2 * 8192 * 8192).
    return max(256, int(ms * 700e9 / (2 * 8192 * 8192)) // 256 * 256)


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


class Daemon:
    def __init__(self, root):
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(root, "pipe"),
                        CUDA_MPS_LOG_DIRECTORY=os.path.join(root, "log"))
        os.makedirs(self.env["CUDA_MPS_PIPE_DIRECTORY"])
        os.makedirs(self.env["CUDA_MPS_LOG_DIRECTORY"])
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True, timeout=30)

    def stop(self):
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=self.env, timeout=30)


def start(a, role, tpcs, log, stop, env, extra=()):
    cmd = [a.nvtaskset, "-t", tpcs, sys.executable, os.path.abspath(__file__), role, "--log", log, "--stop", stop,
           *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(log + ".err", "w"),
                            start_new_session=True)


def wait_ready(log, p, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.poll() is not None:
            raise RuntimeError(f"worker exited ({p.returncode}): {open(log + '.err').read()[-300:]}")
        try:
            if open(log).readline().strip() == "ready":
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"worker not ready in {timeout} s")


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
    be = start(a, "be", BE_ALL, bel, stop, d.env, ["--depth", str(depth), "--k", str(k_for(ms))])
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


def main(argv):
    a = parse_args(argv)
    if a.role == "lc":
        return worker_lc(a)
    if a.role == "be":
        return worker_be(a)
    configs = [(d, k) for k in a.kernel_list for d in a.depth_list]
    est = 25 + len(configs) * (20 + a.trials * (SHRUNK_S + GROWN_S))
    if a.dry_run:
        print(f"LC on {LC_TPCS}, BE on {BE_ALL} shrunk to {BE_FLOOR} and back, {a.trials} trials each")
        for d, k in configs:
            print(f"  depth {d:4d}  kernel ~{k} ms (K={k_for(k)})")
        print(f"about {est} s")
        return 0
    if not os.access(a.nvtaskset, os.X_OK):
        sys.exit(f"yield_time: {a.nvtaskset} is not an executable nvtaskset (--nvtaskset)")
    out = a.out or tempfile.mkdtemp(prefix="yield-out-")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="nvt-yield-")
    d = Daemon(work)
    results = {}
    try:
        alone = lc_alone(a, d, work)
        print(f"LC alone on TPCs {LC_TPCS}: {alone:.3f} ms a replay (median); bound {BOUND}x = {BOUND * alone:.3f} ms",
              flush=True)
        results = {"lc_alone_ms": alone, "configs": []}
        for depth, ms in configs:
            r = one_config(a, d, work, depth, ms, alone)
            results["configs"].append(r)
            ys = [y for y in r["yield_ms"] if y is not None]
            rng = f"[{min(ys):.1f}-{max(ys):.1f}]" if ys else "[-]"
            ym = f"{r['yield_median_ms']:8.1f}" if r["yield_median_ms"] is not None else "       -"
            bk = f"{r['be_kernel_ms']:.2f}" if r["be_kernel_ms"] is not None else "-"
            lcc = f"{r['lc_contended_ms']:.2f}" if r["lc_contended_ms"] is not None else "-"
            lcs = f"{r['lc_shrunk_ms']:.2f}" if r["lc_shrunk_ms"] is not None else "-"
            print(f"depth {depth:4d}  BE kernel {bk:>6} ms  LC next to full BE {lcc:>7} ms, shrunk {lcs:>6} ms  "
                  f"yield {ym} ms {rng}  not recovered {r['never_recovered']}/{len(r['yield_ms'])}", flush=True)
    finally:
        d.stop()
        with open(os.path.join(out, "yield_time.json"), "w") as f:
            json.dump(results, f, indent=1)
        subprocess.run(["tar", "czf", os.path.join(out, "yield-logs.tgz"), "-C", work, "."], timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
