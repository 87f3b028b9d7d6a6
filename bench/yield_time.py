#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How fast a best-effort task gives TPCs back: the yield time behind the roles.

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

--roles measures the give-back time of the roles (--latency-critical / --best-effort) instead (no `-p`): two arms, each a visit
of its own (one start of both workers, every DEPTH x KERNEL in a random order), the arms'
order random in each of --rounds rounds:
  roles: LC `nvtaskset -n 16 --latency-critical`, BE `nvtaskset --best-effort` (with
         NVTASKSET_BE_DEPTH=N when --be-depth N is given; else the shim's default);
  roles-hold (only with --arms): roles with the BE's NVTASKSET_BE_YIELD=hold, its launches
         held on the CPU instead of stopped by the default gate on the GPU;
  roles-n8 (only with --arms): one LC task on `-n 8 --latency-critical` (against roles-2lc: what
         the second LC task changes, not the smaller reservation);
  roles-2lc (only with --arms): two LC tasks, `nvtaskset -n 8 --latency-critical` each, probing
         independently (their probes pooled), next to the same BE: its gate closes for either;
  plain: LC `nvtaskset -t 0-15`, BE `nvtaskset -t 0-65` (no roles: the LC waits behind the BE's
         queue), as in the mode above before its `-p`.
Both are MPS clients of the same private daemon. The BE runs its DEPTH-deep matmul loop without
a break through a window; the LC, instead of replaying back to back, probes: one replay at a
time, a random idle gap (uniform --gap-ms, 20-60 ms) before each, so that it is idle most of
the time and a BE with a role has borrowed everything when a replay comes. Each replay's
latency is from its launch to its completion (synchronized). A visit first measures the LC
alone (the BE worker started but paused: no work queued). Printed per arm and DEPTH x KERNEL:
the LC's latency p50 / p99 / max alone and next to the BE (probes pooled over rounds), the
give-back time as (p50 and p99 next to the BE) - (p50 alone, same arm), and the BE's matmuls/s.
--be-align1 makes the BE's matmuls N x K x (N+1), whose output width is no multiple of 8, so that
cuBLAS takes its align1 kernels (CUTLASS 2.x grids of many short blocks), as GPT-2-medium
training's LM head does, instead of kernels that hold their SMs to the end.
Writes OUT/yield_time_roles.json and OUT/yield-roles-logs.tgz. Checks first that
`nvtaskset --help` mentions --latency-critical.

    python3 bench/yield_time.py --roles --nvtaskset build/bin/nvtaskset --out DIR [--be-depth N]
    python3 bench/yield_time.py --roles --dry-run   # the plan and its estimated time
"""
import argparse
import ctypes
import json
import math
import os
import random
import select
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

# --roles: how each arm starts its LC and BE (after `nvtaskset`), and what the estimate assumes
# (seconds): starting both workers of a visit (torch, 1 GB of BE operands, the LC's graph), the
# pause after, a BE switching DEPTH x KERNEL (it finishes its batch first) and settling, the end
# of a visit, the daemon and the checks.
ALL_ARMS = {
    "roles": (["-n", "16", "--latency-critical"], ["--best-effort"]),
    "roles-n8": (["-n", "8", "--latency-critical"], ["--best-effort"]),
    "roles-2lc": (["-n", "8", "--latency-critical"], ["--best-effort"]),
    "roles-hold": (["-n", "16", "--latency-critical"], ["--best-effort"]),
    "plain": (["-t", LC_TPCS], ["-t", BE_ALL]),
}
# The BE's environment in an arm, beyond --be-depth: roles-hold holds its launches on the CPU
# instead of the default gate on the GPU.
ARM_BE_ENV = {"roles-hold": {"NVTASKSET_BE_YIELD": "hold"}}
# How many LC tasks an arm starts (each with the arm's LC options, one after the other, so that
# each -n chooses after the one before has published its reservation).
ARM_LC_TASKS = {"roles-2lc": 2}
ARMS = {k: ALL_ARMS[k] for k in ("roles", "plain")}  # --arms
ROLE_OPTION = "--latency-critical"
BE_DEPTH_ENV = "NVTASKSET_BE_DEPTH"
R_STARTUP_S, R_SETTLE_S, R_SWITCH_S, R_TEARDOWN_S, R_FIXED_S = 15, 1.0, 1.0, 3, 10


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nvtaskset", default="build/bin/nvtaskset")
    p.add_argument("--out", default=None, help="directory for yield_time.json and the workers' logs")
    p.add_argument("--depths", default="1,16,128", help="BE kernels launched between synchronizations")
    p.add_argument("--kernel-ms", default="1.5,6", help="approximate BE kernel times on the whole GPU")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--dry-run", action="store_true")
    r = p.add_argument_group("--roles (the give-back time of --latency-critical / --best-effort)")
    r.add_argument("--roles", action="store_true",
                   help="measure the roles instead of -p: LC probes next to a BE with roles and a plain one")
    r.add_argument("--rounds", type=int, default=2, help="rounds, each visiting both arms (default %(default)s)")
    r.add_argument("--window-s", type=float, default=4.0,
                   help="LC probing per DEPTH x KERNEL x arm x round, and alone per visit (default %(default)s)")
    r.add_argument("--gap-ms", default="20,60", help="LC idle gap before each probe, uniform LO,HI (default %(default)s)")
    r.add_argument("--be-depth", type=int, default=None,
                   help=f"{BE_DEPTH_ENV} for the roles arm's BE (launches in flight, 1-1024; default: unset)")
    r.add_argument("--arms", default="roles,plain",
                   help=f"comma-separated, of {','.join(ALL_ARMS)} (default %(default)s; roles-hold: "
                        "NVTASKSET_BE_YIELD=hold)")
    r.add_argument("--seed", type=int, default=None, help="orders and gaps (default: random, printed)")
    r.add_argument("--budget-s", type=float, default=290, help="start no visit that would end after this (default %(default)s)")
    r.add_argument("--be-align1", action="store_true",
                   help="the BE's matmuls N x K x (N+1): an output width that is no multiple of 8 makes cuBLAS "
                        "take its align1 kernels (CUTLASS 2.x, many short blocks), as GPT-2-medium training's "
                        "LM head (vocabulary 50257) does, instead of its kernels that hold their SMs")
    p.add_argument("role", nargs="?", choices=["lc", "be", "lcprobe", "bectl"], help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--stop", help=argparse.SUPPRESS)
    p.add_argument("--depth", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--k", default="8192x8192", help=argparse.SUPPRESS)
    p.add_argument("--ks", default="", help=argparse.SUPPRESS)
    p.add_argument("--align1", action="store_true", help=argparse.SUPPRESS)
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
    try:
        a.gap = [float(x) for x in a.gap_ms.split(",")]
    except ValueError:
        a.gap = []
    if len(a.gap) != 2 or not 0 <= a.gap[0] <= a.gap[1] <= 10000:
        p.error(f"--gap-ms takes LO,HI in ms, 0 <= LO <= HI <= 10000: {a.gap_ms!r}")
    if a.rounds < 1 or a.rounds > 20:
        p.error("--rounds takes 1..20")
    if not 0.5 <= a.window_s <= 120:
        p.error("--window-s takes 0.5..120")
    if a.be_depth is not None and not 1 <= a.be_depth <= 1024:  # what options.hpp takes; else its default
        p.error("--be-depth takes 1..1024")
    if not a.budget_s > 0:
        p.error("--budget-s must be positive")
    arms = [x for x in a.arms.split(",") if x]
    if not arms or len(set(arms)) != len(arms) or any(x not in ALL_ARMS for x in arms):
        p.error(f"--arms takes some of {','.join(ALL_ARMS)}, each once: {a.arms!r}")
    global ARMS
    ARMS = {k: ALL_ARMS[k] for k in arms}
    if a.seed is None:
        a.seed = random.randrange(10**6)
    return a


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


# ---- the driver ----------------------------------------------------------------------------

def matmul_for(ms):
    """The BE matmul for a kernel of about MS ms on a whole GPU, as "NxK": N x K x N bf16. An
    N x K x N matmul does 2*N*N*K flops, about 700 TFLOP/s on a whole H100/H200
    (docs/results.md), so K ~ ms * 700e9 / (2 * N * N). N is 8192, and 2048 below 0.1 ms,
    where K would fall under 256 at 8192 (many short kernels: the gates' spacing by learned
    work, docs/design.md). The time a kernel took is measured and printed, not assumed."""
    n = 8192 if ms >= 0.1 else 2048
    return f"{n}x{max(256, int(ms * 700e9 / (2 * n * n)) // 256 * 256)}"


def matmul_dims(nk):
    n, k = (int(x) for x in nk.split("x"))
    return n, k


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


# ---- --roles --------------------------------------------------------------------------------

def pct(xs, q):
    """The q-th percentile, linearly interpolated (numpy's default); None for no data."""
    s = sorted(xs)
    if not s:
        return None
    k = (len(s) - 1) * q / 100
    f = int(math.floor(k))
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def lat_stats(xs):
    return {"n": len(xs), "p50_ms": pct(xs, 50), "p99_ms": pct(xs, 99), "max_ms": max(xs) if xs else None}


def read_tagged(path, tag):
    """The numbers of the log lines that start with `tag`."""
    rows = []
    try:
        for line in open(path):
            parts = line.split()
            if parts and parts[0] == tag:
                try:
                    rows.append(tuple(float(x) for x in parts[1:]))
                except ValueError:
                    pass
    except OSError:
        pass
    return rows


def roles_configs(a):
    return [(d, k) for k in a.kernel_list for d in a.depth_list]


def roles_visit_s(a, n_configs, startup_s):
    return startup_s + R_SETTLE_S + a.window_s + n_configs * (R_SWITCH_S + a.window_s) + R_TEARDOWN_S


def roles_estimate_s(a):
    return R_FIXED_S + a.rounds * len(ARMS) * roles_visit_s(a, len(roles_configs(a)), R_STARTUP_S)


def roles_be_env(a, arm):
    e = dict(ARM_BE_ENV.get(arm, {}))
    if arm.startswith("roles") and a.be_depth is not None:
        e[BE_DEPTH_ENV] = str(a.be_depth)
    return e


def roles_env(a, base, arm, role):
    e = dict(base)
    if role == "be":
        e.update(roles_be_env(a, arm))
    return e


def roles_cmd(a, arm, role, log, stop=None, extra=()):
    opts = ARMS[arm][0 if role == "lc" else 1]
    worker = "lcprobe" if role == "lc" else "bectl"
    cmd = [a.nvtaskset, *opts, sys.executable, os.path.abspath(__file__), worker, "--log", log]
    return cmd + (["--stop", stop] if stop else []) + list(extra)


def roles_show(a, arm, role):
    env = "".join(f"{k}={v} " for k, v in roles_be_env(a, arm).items()) if role == "be" else ""
    n = ARM_LC_TASKS.get(arm, 1) if role == "lc" else 1
    return env + " ".join(["nvtaskset", *ARMS[arm][0 if role == "lc" else 1]]) + (f" (x{n})" if n > 1 else "")


def nvtaskset_knows_roles(nv):
    try:
        r = subprocess.run([nv, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ROLE_OPTION in r.stdout + r.stderr


class BeCtl:
    """The --roles BE worker and its commands (stdin), answered by ack files."""

    def __init__(self, proc, log):
        self.p, self.log, self.n = proc, log, 0

    def send(self, *words, timeout=60):
        self.n += 1
        self.p.stdin.write(" ".join([words[0], str(self.n), *map(str, words[1:])]) + "\n")
        self.p.stdin.flush()
        ack = f"{self.log}.ack-{self.n}"
        end = time.monotonic() + timeout
        while not os.path.exists(ack):
            if self.p.poll() is not None:
                raise RuntimeError(f"BE worker exited ({self.p.returncode}): {open(self.log + '.err').read()[-300:]}")
            if time.monotonic() > end:
                raise RuntimeError(f"BE worker did not take {words[0]!r} within {timeout} s")
            time.sleep(0.005)

    def quit(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        except OSError:
            pass


def wait_file(path, p, log, timeout=60):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if p.poll() is not None:
            raise RuntimeError(f"worker exited ({p.returncode}): {open(log + '.err').read()[-300:]}")
        if time.monotonic() > end:
            raise RuntimeError(f"worker did not start in {timeout} s")
        time.sleep(0.02)


def roles_visit(a, d, work, arm, rnd, configs, rng):
    """Starts the arm's LC (first: its partition is published before the BE chooses) and BE,
    measures the LC alone (BE paused), then each DEPTH x KERNEL in a random order. Returns the
    windows: (name, depth, kernel ms, t0, t1), the start-up time, the LC logs and the BE's."""
    tag = f"r{rnd + 1}-{arm}"
    lcl, bel, stop = (os.path.join(work, f"{tag}.{x}") for x in ("lc", "be", "stop"))
    lcls = [lcl] + [f"{lcl}{i + 1}" for i in range(1, ARM_LC_TASKS.get(arm, 1))]
    ks = sorted({matmul_for(ms) for _, ms in configs})
    t_start = time.monotonic()
    procs = []
    windows = []
    be = None
    try:
        lcs = []
        for log in lcls:
            lc = subprocess.Popen(roles_cmd(a, arm, "lc", log, stop, ["--gap-ms", a.gap_ms, "--seed", str(rng.randrange(2**31))]),
                                  env=roles_env(a, d.env, arm, "lc"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=open(log + ".err", "w"), start_new_session=True)
            procs.append(lc)
            lcs.append(lc)
            try:
                wait_file(log + ".started", lc, log)
            except RuntimeError as e:
                raise RuntimeError(f"LC {e}") from None
        bp = subprocess.Popen(roles_cmd(a, arm, "be", bel,
                                        extra=["--ks", ",".join(ks)] + (["--align1"] if a.be_align1 else [])),
                              env=roles_env(a, d.env, arm, "be"), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=open(bel + ".err", "w"), text=True, start_new_session=True)
        procs.append(bp)
        be = BeCtl(bp, bel)
        for log, p, who in [*((l, p, "LC") for l, p in zip(lcls, lcs)), (bel, bp, "BE")]:
            try:
                wait_ready(log, p)
            except RuntimeError as e:
                raise RuntimeError(f"{who} {e}".strip()) from None
        startup = time.monotonic() - t_start
        time.sleep(R_SETTLE_S)
        t0 = time.monotonic()
        time.sleep(a.window_s)
        windows.append(("alone", None, None, t0, time.monotonic()))
        order = list(configs)
        rng.shuffle(order)
        for depth, ms in order:
            be.send("run", depth, matmul_for(ms))
            time.sleep(R_SWITCH_S / 2)
            t0 = time.monotonic()
            time.sleep(a.window_s)
            t1 = time.monotonic()
            for p, who in [*((p, "LC") for p in lcs), (bp, "BE")]:
                if p.poll() is not None:
                    raise RuntimeError(f"{who} worker exited ({p.returncode}) during depth {depth} x {ms} ms")
            windows.append(("be", depth, ms, t0, t1))
    finally:
        open(stop, "w").close()
        if be is not None:
            be.quit()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return windows, startup, lcls, bel


def roles_window(probes, batches, name, depth, ms, t0, t1, rnd):
    lat = [x for t, x in probes if t0 <= t < t1]
    b = [(t, per, n) for t, per, n in batches if t0 <= t < t1]
    w = {"round": rnd + 1, "window": name, "depth": depth, "kernel_ms_target": ms, "t0": round(t0, 4),
         "t1": round(t1, 4), **lat_stats(lat), "lat_ms": [round(x, 4) for x in lat]}
    if name == "be":
        w["be_kernel_ms"] = statistics.median([per for _, per, _ in b]) if b else None
        w["be_matmuls_per_s"] = sum(n for _, _, n in b) / (t1 - t0)
    return w


def roles_summary(a, windows, configs):
    """Probes pooled over rounds per arm and DEPTH x KERNEL; give-back from the arm's alone p50."""
    out = {"alone": {}, "configs": []}
    for arm in ARMS:
        lat = [x for w in windows if w["arm"] == arm and w["window"] == "alone" for x in w["lat_ms"]]
        out["alone"][arm] = {**lat_stats(lat), "per_round_p50_ms": [w["p50_ms"] for w in windows
                                                                   if w["arm"] == arm and w["window"] == "alone"]}
    for depth, ms in configs:
        c = {"depth": depth, "kernel_ms_target": ms, "k": matmul_for(ms)}
        for arm in ARMS:
            ws = [w for w in windows if w["arm"] == arm and w["window"] == "be" and w["depth"] == depth
                  and w["kernel_ms_target"] == ms]
            lat = [x for w in ws for x in w["lat_ms"]]
            e = lat_stats(lat)
            base = out["alone"][arm]["p50_ms"]
            e["give_back_p50_ms"] = e["p50_ms"] - base if lat and base is not None else None
            e["give_back_p99_ms"] = e["p99_ms"] - base if lat and base is not None else None
            kern = [w["be_kernel_ms"] for w in ws if w["be_kernel_ms"] is not None]
            e["be_kernel_ms"] = statistics.median(kern) if kern else None
            e["be_matmuls_per_s"] = statistics.median([w["be_matmuls_per_s"] for w in ws]) if ws else None
            e["per_round"] = [{"round": w["round"], "n": w["n"], "p50_ms": w["p50_ms"], "p99_ms": w["p99_ms"]} for w in ws]
            c[arm] = e
        out["configs"].append(c)
    return out


def f_(x, w=6, digits=2):
    return f"{round(x, digits) + 0.0:{w}.{digits}f}" if x is not None else f"{'-':>{w}s}"


def roles_table(a, summary):
    lines = [f"LC probes: one replay (8 chained bf16 2048^2 matmuls, one CUDA graph) after an idle gap of "
             f"{a.gap[0]:g}-{a.gap[1]:g} ms (uniform), latency from launch to completion; probes pooled over "
             f"{a.rounds} rounds; give-back = latency next to the BE - p50 alone (same arm), ms"]
    for arm in ARMS:
        e = summary["alone"][arm]
        lines.append(f"LC alone ({arm}: LC {roles_show(a, arm, 'lc')}, BE paused): p50 {f_(e['p50_ms'], 0)} "
                     f"p99 {f_(e['p99_ms'], 0)} max {f_(e['max_ms'], 0)} ms (n={e['n']})")
    h = " | ".join(f"{arm + ': BE ' + roles_show(a, arm, 'be'):^59s}" for arm in ARMS)
    lines.append(f"{'':18s} | {h}")
    sub = f"{'BE ms':>6s} {'p50':>6s} {'p99':>6s} {'max':>6s} {'give-back p50/p99':>17s} {'mm/s':>6s} {'n':>4s}"
    lines.append(f"{'depth  kernel ms':18s} | " + " | ".join(f"{sub:59s}" for _ in ARMS))
    for c in summary["configs"]:
        cells = []
        for arm in ARMS:
            e = c[arm]
            gb = f"{f_(e['give_back_p50_ms'], 0, 1)}/{f_(e['give_back_p99_ms'], 0, 1)}"
            mm = f"{e['be_matmuls_per_s']:6.0f}" if e["be_matmuls_per_s"] is not None else f"{'-':>6s}"
            cells.append(f"{f_(e['be_kernel_ms'])} {f_(e['p50_ms'])} {f_(e['p99_ms'])} {f_(e['max_ms'])} "
                         f"{gb:>17s} {mm} {e['n']:4d}")
        lines.append(f"{c['depth']:5d}  {c['kernel_ms_target']:9g}   | " + " | ".join(f"{x:59s}" for x in cells))
    lines.append("BE ms: the BE's time a matmul (its batch / DEPTH, median); mm/s: BE matmuls completed a second "
                 "in the window (median over rounds); n: LC probes")
    return lines


def roles_plan(a):
    configs = roles_configs(a)
    print(f"--roles: {a.rounds} rounds x {len(ARMS)} arms (a visit each, random order), MPS clients of a private daemon")
    for arm in ARMS:
        print(f"  {arm:6s} LC: {roles_show(a, arm, 'lc')} ...   BE: {roles_show(a, arm, 'be')} ...")
    print(f"  a visit: start LC, then BE; LC alone {a.window_s:g} s (BE paused); then per DEPTH x KERNEL (random "
          f"order) {a.window_s:g} s of LC probes next to the BE")
    print(f"  LC probe: one replay after a gap of {a.gap[0]:g}-{a.gap[1]:g} ms (uniform): about "
          f"{a.window_s * 1e3 / (sum(a.gap) / 2 + 1):.0f} probes a window, {a.rounds} windows per arm x config")
    for d_, k in configs:
        print(f"  depth {d_:4d}  kernel ~{k} ms (N x K: {matmul_for(k)})")
    print(f"  {BE_DEPTH_ENV}: " + (f"{a.be_depth} (roles arm's BE only)" if a.be_depth is not None else
                                   f"unset (the shim's default){'; inherited: ' + os.environ[BE_DEPTH_ENV] if BE_DEPTH_ENV in os.environ else ''}"))
    print(f"seed {a.seed}; about {roles_estimate_s(a):.0f} s (assuming {R_STARTUP_S} s to start a visit's workers); "
          f"no visit starts that would end after --budget-s {a.budget_s:g}")


def roles_main(a):
    if a.dry_run:
        roles_plan(a)
        if not os.access(a.nvtaskset, os.X_OK):
            print(f"note: a real run would stop here: {a.nvtaskset} is not an executable nvtaskset (--nvtaskset)")
        elif not nvtaskset_knows_roles(a.nvtaskset):
            print(f"note: a real run would stop here: {a.nvtaskset} --help does not mention {ROLE_OPTION}")
        return 0
    if not os.access(a.nvtaskset, os.X_OK):
        sys.exit(f"yield_time: {a.nvtaskset} is not an executable nvtaskset (--nvtaskset)")
    if not nvtaskset_knows_roles(a.nvtaskset):
        sys.exit(f"yield_time: --roles: {a.nvtaskset} --help does not mention {ROLE_OPTION} (no roles in this build)")
    a.nvtaskset = os.path.abspath(a.nvtaskset)
    t_begin = time.monotonic()
    rng = random.Random(a.seed)
    configs = roles_configs(a)
    out = a.out or tempfile.mkdtemp(prefix="yield-out-")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="nvt-yield-roles-")
    print(f"yield_time --roles: seed {a.seed}, {a.rounds} rounds, about {roles_estimate_s(a):.0f} s", flush=True)
    d = Daemon(work)
    windows, visits, skipped, failed = [], [], [], {}
    summary = None
    try:
        for rnd in range(a.rounds):
            arms = list(ARMS)
            rng.shuffle(arms)
            for arm in arms:
                if arm in failed:
                    continue
                startup = max([v["startup_s"] for v in visits] or [R_STARTUP_S])
                if time.monotonic() - t_begin + roles_visit_s(a, len(configs), startup) > a.budget_s:
                    skipped.append(f"r{rnd + 1} {arm}")
                    print(f"round {rnd + 1}: {arm} skipped (--budget-s {a.budget_s:g})", flush=True)
                    continue
                print(f"round {rnd + 1}/{a.rounds}: {arm}, {time.monotonic() - t_begin:.0f} s into the run", flush=True)
                try:
                    ws, startup, lcls, bel = roles_visit(a, d, work, arm, rnd, configs, rng)
                except RuntimeError as e:
                    failed[arm] = str(e).strip()
                    print(f"  FAILED, not run again: {failed[arm]}", flush=True)
                    continue
                probes = sorted(x for log in lcls for x in read_tagged(log, "p"))
                batches = read_tagged(bel, "b")
                visits.append({"round": rnd + 1, "arm": arm, "startup_s": round(startup, 2)})
                for name, depth, ms, t0, t1 in ws:
                    w = roles_window(probes, batches, name, depth, ms, t0, t1, rnd)
                    w["arm"] = arm
                    windows.append(w)
                    what = "alone" if name == "alone" else f"depth {depth:4d} x {ms:g} ms"
                    print(f"  {what:20s} LC p50 {f_(w['p50_ms'], 0)} p99 {f_(w['p99_ms'], 0)} max {f_(w['max_ms'], 0)} "
                          f"ms (n={w['n']})" + (f", BE {f_(w['be_kernel_ms'], 0)} ms a matmul, "
                                                 f"{w['be_matmuls_per_s']:.0f}/s" if name == "be" else ""), flush=True)
    finally:
        d.stop()
        summary = roles_summary(a, windows, configs)
        result = {"mode": "roles", "argv": sys.argv, "nvtaskset": a.nvtaskset, "seed": a.seed, "rounds": a.rounds,
                  "window_s": a.window_s, "gap_ms": a.gap, "be_align1": a.be_align1,
                  "be_depth": a.be_depth, "be_depth_inherited": os.environ.get(BE_DEPTH_ENV) if a.be_depth is None else None,
                  "arms": {arm: {"lc": roles_show(a, arm, "lc"), "be": roles_show(a, arm, "be")} for arm in ARMS},
                  "elapsed_s": round(time.monotonic() - t_begin, 1), "visits": visits, "skipped": skipped,
                  "failed": failed, **summary, "windows": windows}
        with open(os.path.join(out, "yield_time_roles.json"), "w") as f:
            json.dump(result, f, indent=1)
        subprocess.run(["tar", "czf", os.path.join(out, "yield-roles-logs.tgz"), "-C", work, "."], timeout=60)
    print()
    for line in roles_table(a, summary):
        print(line)
    print(f"elapsed {time.monotonic() - t_begin:.0f} s; written to {os.path.join(out, 'yield_time_roles.json')}")
    return 1 if failed or not visits else 0


def main(argv):
    a = parse_args(argv)
    if a.role == "lc":
        return worker_lc(a)
    if a.role == "be":
        return worker_be(a)
    if a.role == "lcprobe":
        return worker_lc_probe(a)
    if a.role == "bectl":
        return worker_be_ctl(a)
    if a.roles:
        return roles_main(a)
    configs = [(d, k) for k in a.kernel_list for d in a.depth_list]
    est = 25 + len(configs) * (20 + a.trials * (SHRUNK_S + GROWN_S))
    if a.dry_run:
        print(f"LC on {LC_TPCS}, BE on {BE_ALL} shrunk to {BE_FLOOR} and back, {a.trials} trials each")
        for d, k in configs:
            print(f"  depth {d:4d}  kernel ~{k} ms (N x K: {matmul_for(k)})")
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
