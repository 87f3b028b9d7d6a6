# SPDX-License-Identifier: Apache-2.0
"""bench/eval.py's section enforce (Fig. 12): an FP32 SGEMM in half the GPU next to an interferer in the
other half, under time-slicing, MPS, MPS percentages, nvtaskset and green contexts.
"""
import bisect
import os
import re

import eval_harness as H
from eval_harness import (LABEL, Measured, Proc, fmt, gpc_half, left, log, median, mps_start, mps_stop, parse_calib,
                          pstats, ranges, read_u64, to_host, write_csv)


# ---- Fig. 12: enforcement ----------------------------------------------------------------------------------


class Interf:
    """gpuwork interfere KIND under a prefix/environment, stopped through a file."""

    def __init__(self, prefix, env, kind, tag):
        self.kind, self.tag = kind, tag
        self.stamps = os.path.join(H.LOGS, f"{tag}.u64")
        self.stopf = os.path.join(H.LOGS, f"{tag}.stop")
        for f in (self.stamps, self.stopf):
            if os.path.exists(f):
                os.remove(f)
        self.p = Proc(prefix + [H.GW, "interfere", "--kind", kind, "--stamps", self.stamps, "--stop-file", self.stopf,
                                "--max-s", "300"], tag, env)
        self.ready = self.p.expect(r"^ready$", 120) is not None

    def stop(self):
        open(self.stopf, "w").close()
        rc = self.p.finish(60)
        calib = parse_calib(self.p.lines)
        m = next((re.search(r"launched (\d+) recorded (\d+)", l) for l in self.p.lines if l.startswith("interferer ")),
                 None)
        host = to_host(read_u64(self.stamps), calib) if rc == 0 else None
        if os.path.exists(self.stamps):
            os.remove(self.stamps)  # large; the counts per sample are what the CSV keeps
        return dict(rc=rc, host=host or [], launched=int(m.group(1)) if m else 0,
                    recorded=int(m.group(2)) if m else 0,
                    halfwidth=max((c[1] for c in calib.values()), default=-1))


def count_in(host, t0, t1):
    return bisect.bisect_right(host, t1) - bisect.bisect_left(host, t0)


ENF_SAMPLES, ENF_ROWS, ENF_SUMMARY = [], [], []


def record(mech, label, kind, samples, alone_med, interferers, trace_window=True):
    """Adds one scenario's samples (with the interferers' progress per sample) and its summary row."""
    rel, rel_all, rejected = [], [], 0
    for i, t0, t1, g0, g1 in samples:
        counts = [count_in(it["host"], t0, t1) for it in interferers]
        accepted = all(c > 0 for c in counts) if interferers else True
        ms = (t1 - t0) / 1e6
        ENF_SAMPLES.append((mech, label, kind, i, t0, t1, ms, (g1 - g0) / 1e6 if g1 > g0 else "",
                            counts[0] if counts else "", counts[1] if len(counts) > 1 else "", int(accepted)))
        rel_all.append(ms / alone_med)
        if accepted:
            rel.append(ms / alone_med)
        else:
            rejected += 1
    s, sa = pstats(rel), pstats(rel_all)
    clk = pw = float("nan")
    if samples and H.SAMPLER and H.SAMPLER.ok and trace_window:
        clk, pw = H.SAMPLER.between(samples[0][1], samples[-1][2])
    dur = (samples[-1][2] - samples[0][1]) / 1e9 if samples else 0
    rates = [count_in(it["host"], samples[0][1], samples[-1][2]) / dur for it in interferers] if dur > 0 else []
    ENF_SUMMARY.append((mech, label, kind, len(samples), rejected, alone_med, s["min"], s["med"], s["p99"], s["max"],
                        sa["p99"], sa["max"], "/".join(f"{x:.0f}" for x in rates), clk, pw))
    return s, rejected


def print_enforce_table():
    log("enforcement: SGEMM iteration time relative to the same task alone in the same partition "
        "(accepted samples: the interferer(s) finished a kernel during the sample)", summary=True)
    log(f"{'mechanism':<12} {'scenario':<15} {'n':>5} {'rej':>4} {'alone ms':>9} {'min':>6} {'median':>7} {'p99':>7} "
        f"{'max':>7} {'intf k/s':>10} {'SM MHz':>7} {'W':>5}", summary=True)
    for (mech, label, kind, n, rej, am, mn, md, p99, mx, p99a, mxa, rate, clk, pw) in ENF_SUMMARY:
        log(f"{mech:<12} {label:<15} {n:>5} {rej:>4} {fmt(am, 3):>9} {fmt(mn, 2):>6} {fmt(md, 3):>7} {fmt(p99, 3):>7} "
            f"{fmt(mx, 3):>7} {rate:>10} {fmt(clk, 0):>7} {fmt(pw, 0):>5}", summary=True)


def run_mechanism(mech, samples, n):
    """One measured process per mechanism: alone, next to each interferer, (three tasks), alone again."""
    name = mech["name"]
    m = Measured(mech["m"][0], mech["m"][1], f"enf-{name}-measured", n, "enforce")
    if not m.ok:
        return
    log(f"INFO {name}: {m.info}")
    per_sample_s = 0.1  # generous bound for the batch timeout
    bt = 60 + samples * per_sample_s
    alone = m.batch(f"{name}/alone", samples, bt)
    if not alone:
        log(f"WARN {name}: alone batch failed", summary=True)
        m.close()
        return
    results = []
    for kind in mech.get("kinds", ["mem", "compute", "short"]):
        if left() < 40:
            log(f"WARN {name}: time budget spent before {kind}", summary=True)
            break
        it = Interf(mech["i"][0], mech["i"][1], kind, f"enf-{name}-{kind}")
        if not it.ready:
            log(f"WARN {name}/{kind}: interferer did not start: {open(it.p.errpath).read().strip()[-300:]}",
                summary=True)
            it.p.kill()
            continue
        co = m.batch(f"{name}/corun-{kind}", samples, bt * 2)
        res = it.stop()
        if res["recorded"] < res["launched"]:
            log(f"WARN {name}/{kind}: the interferer recorded {res['recorded']} of {res['launched']} kernels "
                f"(ring full); later iterations count no progress", summary=True)
        if co is None or res["rc"] != 0:
            log(f"WARN {name}/{kind}: co-run failed (measured {co is not None}, interferer rc {res['rc']})",
                summary=True)
            continue
        results.append((f"corun-{kind}", kind, co, [res]))
    if "three" in mech and left() > 40:
        (p1, e1), (p2, e2) = mech["three"]
        a = Interf(p1, e1, "compute", f"enf-{name}-three-a")
        b = Interf(p2, e2, "compute", f"enf-{name}-three-b")
        if a.ready and b.ready:
            co = m.batch(f"{name}/three-task", samples, bt * 2)
            ra, rb = a.stop(), b.stop()
            if co is not None and ra["rc"] == 0 and rb["rc"] == 0:
                results.append(("three-task", "compute+compute", co, [ra, rb]))
            else:
                log(f"WARN {name}/three-task failed", summary=True)
        else:
            log(f"WARN {name}/three-task: an interferer did not start", summary=True)
            a.p.kill()
            b.p.kill()
    end = m.batch(f"{name}/alone-end", samples, bt) or []
    m.close()
    alone_all = [(t1 - t0) / 1e6 for _, t0, t1, _, _ in alone + end]
    am = median(alone_all)
    record(name, "alone", "", alone + end, am, [])
    for label, kind, co, its in results:
        record(name, label, kind, co, am, its)
    if end:
        drift = median([(t1 - t0) / 1e6 for _, t0, t1, _, _ in end]) / median([(t1 - t0) / 1e6 for _, t0, t1, _, _ in alone])
        log(f"INFO {name}: alone at the end / alone at the start = {drift:.3f}")


def run_green(samples, n):
    prefix = os.path.join(H.LOGS, "enf-green")
    LABEL[0] = "enforce/green/all"
    p = Proc([H.GW, "green", "--n", str(n), "--samples", str(samples), "--kinds", "mem,compute,short",
              "--stamps-prefix", prefix], "enf-green")
    rc = p.finish(120 + samples * 0.2)
    info = next((l for l in p.lines if l.startswith("green ")), "")
    if rc != 0:
        log(f"WARN green contexts: rc={rc} {open(p.errpath).read().strip()[-400:]}", summary=True)
        return
    log(f"INFO green contexts: {info}", summary=True)
    calib = parse_calib(p.lines)
    by = {}
    for l in p.lines:
        m = re.match(r"s (\S+) (\d+) (\d+) (\d+) (\d+) (\d+)$", l)
        if m:
            by.setdefault(m.group(1), []).append(tuple(int(m.group(k)) for k in range(2, 7)))
    alone = by.get("alone", []) + by.get("alone-end", [])
    if not alone:
        log("WARN green contexts: no samples", summary=True)
        return
    am = median([(t1 - t0) / 1e6 for _, t0, t1, _, _ in alone])
    record("green", "alone", "", alone, am, [])
    for kind in ("mem", "compute", "short"):
        co = by.get(f"corun-{kind}")
        if not co:
            continue
        host = to_host(read_u64(f"{prefix}-{kind}.u64"), calib) or []
        if os.path.exists(f"{prefix}-{kind}.u64"):
            os.remove(f"{prefix}-{kind}.u64")
        record("green", f"corun-{kind}", kind, co, am, [dict(host=host)])


def section_enforce():
    global ENF_SAMPLES, ENF_ROWS, ENF_SUMMARY
    samples = 1000 if H.ARGS.full else 100
    n = H.ARGS.enforce_n
    half = H.NTPC // 2
    striped_m, striped_i = ranges(range(half)), ranges(range(half, H.NTPC))
    q = half + (H.NTPC - half) // 2
    g_list, g_mine, g_rest = gpc_half()
    log(f"INFO enforcement partitions: striped measured -t {striped_m} / interferer -t {striped_i}; GPC-aligned "
        f"measured -g {ranges(g_list)} ({len(g_mine)} TPCs: {ranges(g_mine)}) / interferer -t {ranges(g_rest)}; "
        f"three tasks: -t {striped_m} / -t {ranges(range(half, q))} / -t {ranges(range(q, H.NTPC))}", summary=True)
    p50 = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    p25 = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    mechs_nomps = [dict(name="timeslice", m=([], {}), i=([], {}))]
    mechs_mps = [
        dict(name="mps", m=([], {}), i=([], {})),
        dict(name="mps50", m=([], p50), i=([], p50), three=(([], p25), ([], p25))),
        dict(name="nvt-striped", m=([H.NV, "-t", striped_m], {}), i=([H.NV, "-t", striped_i], {}),
             three=(([H.NV, "-t", ranges(range(half, q))], {}), ([H.NV, "-t", ranges(range(q, H.NTPC))], {}))),
        dict(name="nvt-gpc", m=([H.NV, "-g", ranges(g_list)], {}), i=([H.NV, "-t", ranges(g_rest)], {})),
    ]
    try:
        mps_stop()
        for mech in mechs_nomps:
            if left() > 60:
                run_mechanism(mech, samples, n)
        if left() > 60:
            run_green(samples, n)
        if not mps_start():
            log("WARN enforcement: no MPS daemon; MPS mechanisms skipped", summary=True)
            return
        for mech in mechs_mps:
            if left() < 60:
                log(f"WARN enforcement: time budget spent before {mech['name']}", summary=True)
                break
            run_mechanism(mech, samples, n)
    finally:
        mps_stop()
        write_csv("enforce_samples.csv", ["mechanism", "scenario", "interferer", "i", "t0_ns", "t1_ns", "iter_ms",
                                          "gpu_span_ms", "interferer_done", "interferer2_done", "accepted"],
                  ENF_SAMPLES)
        write_csv("enforce_summary.csv", ["mechanism", "scenario", "interferer", "n", "rejected", "alone_median_ms",
                                          "min_rel", "median_rel", "p99_rel", "max_rel", "p99_rel_all", "max_rel_all",
                                          "interferer_kernels_per_s", "sm_mhz_median", "power_w_median"], ENF_SUMMARY)
        print_enforce_table()


