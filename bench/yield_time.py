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
import json
import os
import random
import subprocess
import sys
import tempfile

# The modes and the workers, one module each beside this file.
import yield_time_roles
from yield_time_common import BE_ALL, BE_FLOOR, LC_TPCS, Daemon, matmul_for
from yield_time_roles import ALL_ARMS, BE_DEPTH_ENV, roles_main
from yield_time_shrink import BOUND, GROWN_S, SHRUNK_S, lc_alone, one_config
from yield_time_workers import worker_be, worker_be_ctl, worker_lc, worker_lc_probe


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
    yield_time_roles.ARMS = {k: ALL_ARMS[k] for k in arms}  # what every --roles function reads
    if a.seed is None:
        a.seed = random.randrange(10**6)
    return a


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
