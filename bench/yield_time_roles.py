# SPDX-License-Identifier: Apache-2.0
"""bench/yield_time.py --roles: the give-back time of the roles (--latency-critical / --best-effort),
LC probes next to a BE under each arm: the arms, their visits, the summary and the table.
"""
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from yield_time_common import BE_ALL, LC_TPCS, SCRIPT, Daemon, matmul_for, wait_ready

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
    cmd = [a.nvtaskset, *opts, sys.executable, SCRIPT, worker, "--log", log]
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

