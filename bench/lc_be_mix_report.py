# SPDX-License-Identifier: Apache-2.0
"""bench/lc_be_mix.py's results: the percentile, a window's line, the summary over rounds against the
baselines and the targets (summarize), the printed tables (report) and the files it writes
(write_outputs: lc_be_mix.csv, lc_be_mix.json, summary.txt).
"""
import collections
import csv
import json
import math
import os
import statistics

from lc_be_mix_setups import BASE_BE, BASE_GPU, BASE_RES, BE_MPS_ALONE, BE_ROLE_ALONE, BE_ROLE_NOMPS_ALONE, TARGETS


def pct(xs, q):
    """The q-th percentile, linearly interpolated (numpy's default)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    f = int(math.floor(k))
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def row_line(r):
    parts = [f"[r{r['rep'] + 1} {r['setup']} {r['pattern']}]"]
    if "lc_n" in r:
        parts.append(f"LC p50 {r['lc_p50_ms']:.2f} p99 {r['lc_p99_ms']:.2f} p99.9 {r['lc_p999_ms']:.2f} ms "
                     f"(n={r['lc_n']})")
    if "be_its" in r:
        parts.append(f"BE {r['be_its']:.2f} it/s ({r['be_steps']} steps)")
    if r.get("samples"):
        parts.append(f"{r['power_mean_w']:.0f} / {r['power_min_w']:.0f} W, "
                     f"{r['sm_mhz_mean']:.0f} / {r['sm_mhz_min']:.0f} MHz (mean / min)")
    if not r["valid"]:
        parts.append("REJECTED: " + r["reject_reason"])
    if r.get("note"):
        parts.append(r["note"])
    if r.get("roles"):
        x = r["roles"]
        parts.append(f"roles: LC states {x['lc_states']}, stops {x['lc_saturations']}, busy periods "
                     f"{x['lc_busy_periods']}, heartbeat age max {x['lc_max_heartbeat_age_ms']} ms; BE states "
                     f"{x['be_states']}, held {x['be_launches_held']} ({x['be_held_ms']} ms), on floor "
                     f"{x['be_launches_on_floor']}, off its floor {x['be_floor_skipped']}, queue waits "
                     f"{x['be_queue_waits']}, kept off the idle reservation {x.get('be_kept_off')}")
    return ", ".join(parts)


# ---- summary ----

def be_stopped_share(r):
    """The share of the window in which the BE task was stopped for the LC task (its gate closed or
    its launches held: the change of held_ms over the window, from --status), or None."""
    held = (r.get("roles") or {}).get("be_held_ms")
    if not isinstance(held, (int, float)) or not r.get("window_s"):
        return None
    return min(1.0, max(0.0, held / (1000.0 * r["window_s"])))


def stat(rows, key):
    xs = [r[key] for r in rows if r.get(key, "") != ""]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(rows, setups, patterns):
    valid = [r for r in rows if r.get("valid") and r.get("pattern")]
    by = collections.defaultdict(list)
    for r in valid:
        by[(r["setup"], r["pattern"])].append(r)
    be_alone = stat(by[(BASE_BE, "-")], "be_its")
    out = {"be_alone_its": be_alone, "setups": {}}
    for s in setups:
        per = {}
        for pname, _ in ([("-", None)] if not s.lc else patterns):
            rs = by[(s.name, pname)]
            keys = ("lc_p50_ms", "lc_p99_ms", "lc_p999_ms", "lc_service_p50_ms", "lc_service_p99_ms", "be_its",
                    "be_stopped", "power_mean_w", "power_min_w", "sm_mhz_mean", "sm_mhz_min")
            e = {k: stat(rs, k) for k in keys}
            e["valid"] = len(rs)
            e["rejected"] = sum(1 for r in rows if r["setup"] == s.name and r.get("pattern") == pname and not r["valid"])
            e["be_held"] = sum(1 for r in rs if r.get("note"))
            pooled = [x for r in rs for x in r.get("_lat", [])]
            if pooled:
                e["pooled"] = {"n": len(pooled), "p50_ms": pct(pooled, 50), "p99_ms": pct(pooled, 99),
                               "p999_ms": pct(pooled, 99.9)}
                # The p99 of every round's requests together over LC alone's, pooled the same way:
                # a window of a few hundred requests puts its p99 on its few slowest, so the
                # median of the rounds' p99s moves by more than the open-loop targets' margins.
                alone = [x for r in by[(BASE_GPU, pname)] for x in r.get("_lat", [])]
                if alone and pname != "closed":
                    e["pooled"]["p99_vs_gpu"] = e["pooled"]["p99_ms"] / pct(alone, 99)
            for base, tag in ((BASE_GPU, "gpu"), (BASE_RES, "res")):
                b = by[(base, pname)]
                for q in ("p50", "p99", "p999"):
                    m, bm = e[f"lc_{q}_ms"], stat(b, f"lc_{q}_ms")
                    e[f"{q}_vs_{tag}"] = m["median"] / bm["median"] if m and bm else None
            e["be_vs_alone"] = e["be_its"]["median"] / be_alone["median"] if e["be_its"] and be_alone else None
            # Stopped for a share of the window, the BE can run at most the rest of it: its ceiling,
            # and how close it came (the cost of the roles while it runs).
            if e["be_stopped"]:
                e["be_ceiling"] = 1.0 - e["be_stopped"]["median"]
                e["be_vs_ceiling"] = e["be_vs_alone"] / e["be_ceiling"] if e["be_vs_alone"] and e["be_ceiling"] else None
            e["target"] = target_verdict(s, pname, e)
            per[pname] = e
        out["setups"][s.name] = per
    return out


def target_verdict(setup, pname, e):
    if not (setup.lc and setup.be) or pname not in TARGETS:
        return ""
    base, max_ratio, be_min, kind = TARGETS[pname]
    ratio = e[f"p99_vs_{base}"]
    be = e["be_vs_alone"] if kind == "ratio" else (e["be_its"]["median"] if e["be_its"] else None)
    if ratio is None or be is None:
        return "n/a"
    ok = ratio <= max_ratio and be >= be_min
    return "met" if ok else "missed"


def fmt_stat(s, digits=2):
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def fmt_ratio(*xs):
    return "/".join("-" if x is None else f"{x:.2f}" for x in xs)


def pattern_title(pname, rate, a):
    if rate is None:
        return f"closed loop (LC steps back to back), {a.closed_s:g}-s windows"
    return f"open loop, Poisson {rate:g} requests/s, latency from arrival, {a.window_s:g}-s windows"


def report(d, summary):
    a = d.a
    say = d.say
    be = summary["be_alone_its"]
    say()
    say(f"LC p50 / p99 / p99.9 in ms and BE it/s: median [min-max] over the valid rounds (n). "
        f"x gpu, x res: LC p50/p99/p99.9 over LC alone on the whole GPU, on its reservation (-n {a.lc_tpcs}), same "
        f"pattern. BE x alone: over BE alone ({fmt_stat(be)} it/s). W, MHz: the window's mean / min, median over rounds.")
    say("Target: 44 req/s p99 <= 1.25x gpu and BE >= 90%; 87 req/s p99 <= 1.5x gpu and BE >= 80%; "
        "closed p99 <= 1.10x res and BE >= 8.6 it/s.")
    head = (f"  {'setup':14s} {'n':>2s}  {'p50 ms':20s} {'p99 ms':20s} {'p99.9 ms':20s} {'x gpu':15s} {'x res':15s} "
            f"{'BE it/s':20s} {'x alone':7s} {'W':9s} {'MHz':9s} target")
    for pname, rate in d.patterns:
        say()
        say(pattern_title(pname, rate, a))
        say(head)
        for s in d.setups:
            if not s.lc:
                continue
            e = summary["setups"][s.name][pname]
            pw = e["power_mean_w"], e["power_min_w"]
            mhz = e["sm_mhz_mean"], e["sm_mhz_min"]
            say(f"  {s.name:14s} {e['valid']:2d}  {fmt_stat(e['lc_p50_ms']):20s} {fmt_stat(e['lc_p99_ms']):20s} "
                f"{fmt_stat(e['lc_p999_ms']):20s} {fmt_ratio(e['p50_vs_gpu'], e['p99_vs_gpu'], e['p999_vs_gpu']):15s} "
                f"{fmt_ratio(e['p50_vs_res'], e['p99_vs_res'], e['p999_vs_res']):15s} "
                f"{fmt_stat(e['be_its']) if s.be else '-':20s} {fmt_ratio(e['be_vs_alone']) if s.be else '-':7s} "
                f"{fmt_pair(pw, 0):9s} {fmt_pair(mhz, 0):9s} {e['target']}"
                + (f"  ({e['rejected']} rejected)" if e["rejected"] else "")
                + (f"  ({e['be_held']} with BE stalled, kept)" if e["be_held"] else ""))
        for s in d.setups:
            if not (s.lc and s.be):
                continue
            e = summary["setups"][s.name][pname]
            if e.get("be_ceiling") is not None:
                st = e["be_stopped"]
                say(f"  {s.name}: BE stopped for the LC task {st['median']:.1%} of the window "
                    f"[{st['min']:.1%}-{st['max']:.1%}], so at most {e['be_ceiling']:.2f} of alone; it ran at "
                    f"{fmt_ratio(e['be_vs_alone'])}, {fmt_ratio(e['be_vs_ceiling'])} of that")
        for s in d.setups:
            if not (s.lc and s.be) or rate is None:
                continue
            pooled = summary["setups"][s.name][pname].get("pooled") or {}
            if pooled.get("p99_vs_gpu") is not None:
                say(f"  {s.name}: the rounds' {pooled['n']} requests pooled: p99 {pooled['p99_ms']:.2f} ms, "
                    f"{pooled['p99_vs_gpu']:.2f}x LC alone on the whole GPU pooled the same way")
    if BASE_BE in summary["setups"]:
        e = summary["setups"][BASE_BE]["-"]
        say()
        say(f"BE alone (whole GPU, {a.window_s:g}-s windows): {fmt_stat(e['be_its'])} it/s, n={e['valid']}, "
            f"{fmt_pair((e['power_mean_w'], e['power_min_w']), 0)} W, {fmt_pair((e['sm_mhz_mean'], e['sm_mhz_min']), 0)} MHz")
    for name, what in ((BE_ROLE_ALONE, "under --best-effort"), (BE_MPS_ALONE, "as a plain MPS client"),
                       (BE_ROLE_NOMPS_ALONE, "under --no-mps --best-effort")):
        if name in summary["setups"]:
            e = summary["setups"][name]["-"]
            say(f"BE alone {what}: {fmt_stat(e['be_its'])} it/s, {fmt_ratio(e['be_vs_alone'])} of BE alone, "
                f"n={e['valid']}")
    say("p99.9 of a window of fewer than 1,000 requests is close to its maximum; the JSON also has the "
        "percentiles of all rounds pooled (the open loop's pooled p99 over LC alone's is printed above).")
    for k in d.skipped:
        say(f"skipped (time budget): {k}")
    for k, why in d.failed.items():
        say(f"failed: {k}: {why}")


def fmt_pair(pair, digits):
    m, lo = pair
    if not m or not lo:
        return "-"
    return f"{m['median']:.{digits}f}/{lo['median']:.{digits}f}"


CSV_FIELDS = ["rep", "setup", "pattern", "rate", "window_s", "valid", "reject_reason", "lc_n", "lc_p50_ms",
              "lc_p99_ms", "lc_p999_ms", "lc_mean_ms", "lc_max_ms", "lc_service_p50_ms", "lc_service_p99_ms",
              "be_steps", "be_its", "be_stopped", "be_max_gap_s", "be_median_step_s", "power_mean_w", "power_min_w",
              "sm_mhz_mean", "sm_mhz_min", "samples", "t0_mono", "note"]


def write_outputs(d, summary, meta):
    out = d.a.out
    with open(os.path.join(out, "lc_be_mix.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in d.rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    with open(os.path.join(out, "lc_be_mix.json"), "w") as f:
        roles_windows = [{"rep": r["rep"], "setup": r["setup"], "pattern": r["pattern"], "roles": r["roles"],
                          "t0": r["t0_mono"], "slowest": r.get("_slowest", []),
                          "trace": r["_roles_trace"]} for r in d.rows if r.get("roles")]
        json.dump({"meta": meta, "summary": summary, "visits": d.visits, "skipped": d.skipped, "failed": d.failed,
                   "roles_windows": roles_windows}, f, indent=1)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write("\n".join(d.lines) + "\n")
