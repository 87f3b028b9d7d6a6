#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPT-2 inference next to GPT-2-medium training, side by side in one run: a latency-critical (LC)
inference task next to a best-effort (BE) training task, under each way of sharing one GPU.

LC: Hugging Face transformers GPT-2 (GPT2Config's defaults: 12 layers, 768 wide), random weights,
fp16, batch 4 x 256 tokens, forward only, captured once as one CUDA graph and replayed. BE:
GPT-2-medium (24 layers, 1024 wide, 16 heads) training, bf16 autocast, batch 8 x 512, AdamW.
LC load patterns: the closed loop (steps back to back) and the open loop (Poisson arrivals at 44
and 87 requests/s, served one at a time in arrival order, latency from arrival: queueing counts).

Setups (SETUPS, one table): LC alone on the whole GPU and on its reservation (nvtaskset -n 16
--exclusive), BE alone, and both together under time-slicing, MPS without limits, MPS 25/75
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and static nvtaskset -n 16 / -n 50 --exclusive. --with-roles
adds the roles (-n 16 --latency-critical / --best-effort), once nvtaskset has them.

Each round makes every visit once, in a random order (the visits that need the MPS control
daemon grouped, the groups' order random too). A visit starts the workers (this file, hidden
subcommand `_worker lc|be`) once, which build their model once (starting them costs about 15 s,
9 s of it importing transformers' GPT-2), and serves every window of a mix and of the baselines
that start the same way: LC alone runs with the BE worker paused (its context idle, no work
queued), BE alone with the LC worker idle. The windows of a visit (setup x pattern) run in a
random order; every setup of a round gets the same Poisson arrivals (the roles setup's windows
each after 1 s with the LC idle: the roles' budgets carry over from one window to the next). A
window in which the BE task did not progress (fewer than 2 steps, or a stall) is rejected.

Prints, per setup and pattern: LC p50/p99/p99.9 (ms), median [min-max] over rounds; their ratios
to LC alone on the whole GPU and to LC alone on its reservation at the same pattern; BE it/s and
its ratio to BE alone; GPU power (W) and SM clock (MHz), mean/min over the window (NVML, else
nvidia-smi, every 200 ms); and whether the target (TARGETS) is met. For each roles setup, also the
share of each window in which the BE task was stopped for the LC task (held_ms in --status), the
BE's ceiling that leaves (1 minus that share) and the BE's throughput as a share of it. In the
open loop, for each setup of both tasks, the p99 of every round's requests pooled, over LC alone's
pooled the same way (a window's p99 is its few slowest requests; the verdict stays on the medians).

    python3 bench/lc_be_mix.py --out DIR [--nvtaskset PATH] [--reps 3] [--window-s 4] [--with-roles]
    python3 bench/lc_be_mix.py --dry-run          # the plan and its estimated time; starts nothing
    python3 bench/lc_be_mix.py --quick --out DIR  # a smoke of about 2 minutes: 1 round, short windows

Writes DIR/lc_be_mix.csv (one row per setup x pattern x round), DIR/lc_be_mix.json (the summary),
DIR/summary.txt (the tables) and DIR/workers.log. The MPS control daemon it needs runs in its own
pipe and log directories under a temp dir (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, for
the daemon and every client), and is stopped at the end: nothing else on the machine is touched.
torch and transformers are needed on the GPU machine only; --dry-run and --help run without them.
"""
import argparse
import os
import random
import shutil
import signal
import sys
import time

# The run's parts, one module each beside this file; their names are re-exported here, so that
# `import lc_be_mix` (bench/overlap_bound.py, be_cost.py, be_kernels.py, be_gates.sh, plot_lc_be.py)
# sees what it always did. Importing any of them needs no torch.
from lc_be_mix_setups import (  # noqa: F401 - the setups, targets and times
    BASE_BE, BASE_GPU, BASE_RES, BASE_SIZED, BE_DEPTH_ENV, BE_MPS_ALONE, BE_RESUME_S, BE_ROLE_ALONE,
    BE_ROLE_NOMPS_ALONE, BE_WARMUP_STEPS, CHECK_S, L2_ENV, L2_PCT_ENV, LC_WARMUP_REPLAYS, MPS_BE_LOW, MPS_TOGGLE_S,
    OPTIONAL, PCT, PRIO_ENV, ROLE_OPTIONS, ROLE_SETUPS, ROLE_VARIANTS, ROLES, ROLES_IDLE_S, ROLES_L2, ROLES_NO_BORROW,
    ROLES_NO_TOPUP, SETTLE_S, STARTUP_S, STATIC_SHAPES, TARGETS, TEARDOWN_S, WINDOW_OVERHEAD_S, YIELD_ENV, Launch,
    Setup, patterns_of, setup_table, window_s)
from lc_be_mix_worker import (  # noqa: F401 - the worker process, its models
    L2_INFO, be_trainer, be_worker, build_model, capture_lc, die_with, gpt2_config, l2_window, lc_window, lc_worker,
    next_command, versions, wait_until, worker_main, write_json)
from lc_be_mix_driver import (  # noqa: F401 - the driver
    HERE, Driver, Interrupted, RolesPoller, Sampler, VisitError, Worker, be_rejection, be_stats, kill_group,
    on_sigterm, tail)
from lc_be_mix_report import (  # noqa: F401 - the summary, the tables, the files
    CSV_FIELDS, be_stopped_share, fmt_pair, fmt_ratio, fmt_stat, pattern_title, pct, report, row_line, stat,
    summarize, target_verdict, write_outputs)
from lc_be_mix_plan import (  # noqa: F401 - the checks and the plan
    check_gpu_python, estimate_s, nvtaskset_knows_roles, print_plan, query, show_cmd, uses_nvtaskset,
    visit_estimate_s, visit_groups)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="lc_be_mix-out", help="directory for the CSV, JSON, summary and logs")
    ap.add_argument("--nvtaskset", default="build/bin/nvtaskset", help="the nvtaskset binary (default %(default)s)")
    ap.add_argument("--reps", type=int, help="rounds (default 3; --quick: 1)")
    ap.add_argument("--window-s", type=float, help="open-loop and BE-alone window, s (default 4; --quick: 2)")
    ap.add_argument("--closed-s", type=float, help="closed-loop window, s (default 3; --quick: 1.5)")
    ap.add_argument("--rates", default="44,87",
                    help="open-loop arrival rates, requests/s, or none for the closed loop only (default %(default)s)")
    ap.add_argument("--lc-tpcs", type=int, default=16, help="the LC reservation, -n (default %(default)s)")
    ap.add_argument("--be-tpcs", type=int, default=50, help="BE's static partition, -n (default %(default)s)")
    ap.add_argument("--setups", help="comma-separated subset of the setups (default: all)")
    ap.add_argument("--with-roles", action="store_true",
                    help="add the roles setup (nvtaskset --latency-critical / --best-effort)")
    ap.add_argument("--be-depth", type=int, default=None,
                    help=f"{BE_DEPTH_ENV} (launches in flight, 1-1024) for the roles setup's BE only (default: unset)")
    ap.add_argument("--quick", action="store_true", help="a smoke of about 2 minutes: 1 round, 2-s windows")
    ap.add_argument("--budget-s", type=float, default=550, help="start no setup that would end after this (default %(default)s)")
    ap.add_argument("--ready-timeout", type=float, default=180, help="s a worker may take to build its model")
    ap.add_argument("--be-max-gap-s", type=float, default=1.0,
                    help="reject a window where BE completed no step for longer than this (or 4 of its median steps)")
    ap.add_argument("--seed", type=int, default=None, help="order and arrivals (default: random, printed)")
    ap.add_argument("--l2-persist-pct", type=int, default=0,
                    help=f"start the MPS control daemon with {L2_PCT_ENV}=P (the L2 set-aside for persisting "
                         "accesses; the setup roles-l2 uses it)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its estimated time; start nothing")
    a = ap.parse_args(argv)
    for name, normal, quick in (("reps", 3, 1), ("window_s", 4.0, 2.0), ("closed_s", 3.0, 1.5)):
        if getattr(a, name) is None:
            setattr(a, name, quick if a.quick else normal)
    closed_only = a.rates.strip() == "none"
    try:
        a.rates = [] if closed_only else [float(x) for x in a.rates.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--rates {a.rates!r}: expected numbers separated by commas, e.g. 44,87, or none")
    if (not a.rates and not closed_only) or any(r <= 0 for r in a.rates):
        ap.error("--rates: positive requests/s expected (or none: the closed loop only)")
    for name in ("reps", "lc_tpcs", "be_tpcs"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("window_s", "closed_s", "budget_s", "ready_timeout", "be_max_gap_s"):
        if not getattr(a, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if a.window_s > 120 or a.closed_s > 120:
        ap.error("--window-s and --closed-s are at most 120 s")
    if a.be_depth is not None and not 1 <= a.be_depth <= 1024:
        ap.error("--be-depth takes 1..1024")
    a.nvtaskset = os.path.abspath(a.nvtaskset)
    table = setup_table(a.nvtaskset, a.lc_tpcs, a.be_tpcs, a.be_depth)
    names = [s.name for s in table]
    if a.setups:
        want = [x.strip() for x in a.setups.split(",") if x.strip()]
        bad = [x for x in want if x not in names]
        if bad:
            ap.error(f"--setups: unknown {', '.join(bad)}; known: {', '.join(names)}")
        if ROLES in want and not a.with_roles:
            ap.error("--setups roles needs --with-roles")
        setups = [s for s in table if s.name in want]
    else:
        setups = [s for s in table if (s.name != ROLES or a.with_roles) and s.name not in OPTIONAL]
    if a.with_roles and ROLES not in [s.name for s in setups]:
        setups.append(table[names.index(ROLES)])
    if a.be_depth is not None and ROLES not in [s.name for s in setups]:
        ap.error("--be-depth sets the roles setup's BE: it needs --with-roles")
    if a.seed is None:
        a.seed = random.randrange(10**6)
    return a, setups


def check_nvtaskset(a, setups):
    """One line and exit 1 when a setup needs nvtaskset and it is missing, or --with-roles and it
    does not know the roles."""
    if not uses_nvtaskset(a, setups):
        return
    if not os.access(a.nvtaskset, os.X_OK):
        raise SystemExit(f"lc_be_mix.py: {a.nvtaskset}: not an executable nvtaskset; build it, or pass --nvtaskset PATH")
    if any(s.name in ROLE_SETUPS for s in setups) and not nvtaskset_knows_roles(a.nvtaskset):
        raise SystemExit(f"lc_be_mix.py: --with-roles: {a.nvtaskset} --help lists no {' / '.join(ROLE_OPTIONS)} "
                         "(the roles are not in this build)")


def main(argv):
    a, setups = parse_args(argv)
    patterns = patterns_of(a.rates)
    random.seed(a.seed)
    if a.dry_run:
        print_plan(a, setups, patterns)
        try:
            check_nvtaskset(a, setups)
        except SystemExit as e:
            print(f"note: a real run would stop here: {e}")
        return
    check_nvtaskset(a, setups)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        if not shutil.which(tool):
            raise SystemExit(f"lc_be_mix.py: {tool} not found in PATH")
    os.makedirs(a.out, exist_ok=True)
    d = Driver(a, setups, patterns)
    signal.signal(signal.SIGTERM, on_sigterm)
    interrupted = None
    try:
        versions_info = check_gpu_python(d)
        gpu = query(["nvidia-smi", "-i", "0", "--query-gpu=name,driver_version,power.limit,clocks.max.sm",
                     "--format=csv,noheader"])
        others = query(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"])
        d.say(f"lc_be_mix: {gpu}; torch {versions_info['torch']}, transformers {versions_info['transformers']}; "
              f"seed {a.seed}; {a.reps} rounds; estimated {estimate_s(a, setups, patterns) / 60:.1f} min")
        if others:
            d.say(f"WARNING: other processes use the GPU: {' | '.join(others.splitlines())}")
        topology = ""
        if uses_nvtaskset(a, setups):  # calibrates the GPU's layout now, if it must, not inside a visit
            topology = query([a.nvtaskset, "--topology"], env=d.env({}), timeout=180)
            d.say("nvtaskset --topology: " + (" | ".join(topology.splitlines()[:3]) or "no output"))
        d.sampler = Sampler(limit_s=a.budget_s + 300)
        d.say(f"power and SM clock from {d.sampler.source}")
        try:
            d.rounds()
        except (Interrupted, KeyboardInterrupt) as e:
            interrupted = repr(e)
            d.say(f"INTERRUPTED ({interrupted}): what was measured so far follows")
    finally:
        d.cleanup()
        d.save_worker_logs(a.out)
    summary = summarize(d.rows, setups, patterns)
    report(d, summary)
    meta = {"argv": sys.argv, "gpu": gpu, "versions": versions_info, "seed": a.seed, "reps": a.reps,
            "window_s": a.window_s, "closed_s": a.closed_s, "rates": a.rates, "lc_tpcs": a.lc_tpcs,
            "be_tpcs": a.be_tpcs, "be_depth": a.be_depth, "be_depth_inherited": os.environ.get(BE_DEPTH_ENV),
            "nvtaskset": a.nvtaskset, "topology": topology, "power_source": d.sampler.source,
            "elapsed_s": round(time.monotonic() - d.t_begin, 1),
            "setups": [{"name": s.name, "mps": s.mps, "about": s.about,
                        "lc": show_cmd(s.lc, "lc") if s.lc else None, "be": show_cmd(s.be, "be") if s.be else None}
                       for s in setups]}
    d.say(f"elapsed {meta['elapsed_s']:.0f} s; written to {a.out}: lc_be_mix.csv, lc_be_mix.json, summary.txt, workers.log")
    meta["interrupted"] = interrupted
    write_outputs(d, summary, meta)
    shutil.rmtree(d.tmp, ignore_errors=True)
    if interrupted or d.failed:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
