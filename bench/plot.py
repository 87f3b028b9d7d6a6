#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Figures of the evaluation (docs/results.md) from the CSV files bench/eval.py writes.

    python3 bench/plot.py RESULTS_DIR [RESULTS_DIR ...] [--out DIR]

RESULTS_DIR is eval.py's output (an extracted eval-results.tar.gz); with
several (a --full run made in two calls), each file is taken from the first
directory that has it. Writes, for each input that exists:
  fig11a_startup.png      exec -> first kernel per configuration (startup.csv)
  fig11b_latency.png      launch -> first block start, CDF and box plot (latency.csv)
  fig12_enforcement.png   SGEMM time relative to alone, per interferer and mechanism (enforce_*.csv)
  fig12_trace.png         SM clock and power over the run (trace.csv)
  fig13_granularity.png   SGEMM time by partition size, and the sizes each mechanism offers
                          (granularity*.csv, mechanisms.csv, topology.json)
Needs matplotlib (Debian: apt-get install python3-matplotlib). Box plots: the box
spans the quartiles, the whiskers min to max, a dash marks the p99.
"""
import argparse
import csv
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

MECH_ORDER = ["timeslice", "mps", "mps50", "nvt-striped", "nvt-gpc", "green"]
MECH_NAMES = {"timeslice": "time-\nsliced", "mps": "MPS", "mps50": "MPS\n50%", "nvt-striped": "nvt\nstriped",
              "nvt-gpc": "nvt\nGPCs", "green": "green\nctx"}
COLORS = {"timeslice": "#999999", "mps": "#d62728", "mps50": "#ff7f0e", "nvt-striped": "#1f77b4",
          "nvt-gpc": "#17becf", "green": "#2ca02c"}


DIRS = []


def find(name):
    """NAME in the first results directory that has it."""
    for d in DIRS:
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return os.path.join(DIRS[0], name) if DIRS else name


def read_csv(name):
    path = find(name)
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_granularity():
    """granularity.csv. Files written before eval.py quoted its fields have the TPC list (which
    holds commas) unquoted: layout,tpcs,sms,<list spread over several fields>,i,ms; so the last
    two fields are i and ms, and the list is what lies between."""
    path = find("granularity.csv")
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return None
    out = []
    for r in rows[1:]:
        if len(r) < 6:
            continue
        out.append(dict(layout=r[0], tpcs=r[1], sms=r[2], list=",".join(r[3:-2]), i=r[-2], ms=r[-1]))
    return out


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def p99(v):
    s = sorted(v)
    return s[max(1, math.ceil(0.99 * len(s))) - 1] if s else float("nan")


def median(v):
    s = sorted(v)
    n = len(s)
    return float("nan") if not n else (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2)


def log_axis(axis):
    """Log scale with plain numbers (4, 10, 40), minor ticks labelled when the range is narrow."""
    axis.axes.set_xscale("log") if axis is axis.axes.xaxis else axis.axes.set_yscale("log")
    axis.set_major_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def boxes(ax, data, labels, colors=None):
    """Quartile boxes, whiskers min..max, a dash at the p99."""
    pos = list(range(1, len(data) + 1))
    keep = [(p, d) for p, d in zip(pos, data) if d]
    if keep:
        bp = ax.boxplot([d for _, d in keep], positions=[p for p, _ in keep], whis=(0, 100), widths=0.55,
                        patch_artist=True, medianprops=dict(color="black"), showfliers=False)
        for i, box in enumerate(bp["boxes"]):
            c = colors[keep[i][0] - 1] if colors else "#aec7e8"
            box.set_facecolor(c)
            box.set_alpha(0.75)
        for p, d in keep:
            ax.plot([p - 0.2, p + 0.2], [p99(d)] * 2, color="red", lw=1.5)
    ax.set_xticks(pos)
    ax.set_xticklabels(labels, fontsize=8)
    for p, d in zip(pos, data):
        if not d:
            ax.text(p, 0.5, "no data", transform=ax.get_xaxis_transform(), ha="center", fontsize=8, color="gray")


def fig_startup(out):
    rows = read_csv("startup.csv")
    if not rows:
        return None
    summ = {r["config"]: r for r in (read_csv("startup_summary.csv") or [])}
    order = [c for c in ["plain", "mps-client", "mps-client-q", "nvt-nomps", "nvt-warm", "nvt-cold"]
             if any(r["config"] == c for r in rows)]
    names = {"plain": "plain", "mps-client": "MPS client", "mps-client-q": "MPS client,\nnvtaskset's\nqueues",
             "nvt-nomps": "nvtaskset\n--no-mps", "nvt-warm": "nvtaskset\n(MPS warm)", "nvt-cold": "nvtaskset\n(MPS cold)"}
    ok = [r for r in rows if r["ok"] == "1"]
    data = [[num(r["spawn_to_kernel_ms"]) for r in ok if r["config"] == c] for c in order]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw=dict(width_ratios=[3, 2]))
    boxes(a1, data, [names[c] for c in order])
    a1.set_ylabel("exec -> first kernel running (ms)")
    log_axis(a1.yaxis)
    a1.set_title("Fig. 11a: start-up time", pad=30)
    for i, c in enumerate(order):
        if c in summ:
            a1.text(i + 1, 1.01, f"{num(summ[c]['median_ms']):.0f} ms\n{num(summ[c]['ratio_to_plain']):.2f}x",
                    transform=a1.get_xaxis_transform(), ha="center", va="bottom", fontsize=7)
    e2m = [median([num(r["spawn_to_main_ms"]) for r in ok if r["config"] == c]) for c in order]
    m2k = [median([num(r["spawn_to_kernel_ms"]) - num(r["spawn_to_main_ms"]) for r in ok if r["config"] == c])
           for c in order]
    x = range(len(order))
    a2.bar(x, e2m, color="#c5b0d5", label="exec -> main (loader; nvtaskset's CLI)")
    a2.bar(x, m2k, bottom=e2m, color="#1f77b4", label="main -> first kernel (CUDA init)")
    a2.set_xticks(list(x))
    a2.set_xticklabels([names[c] for c in order], fontsize=7)
    a2.set_ylabel("median (ms)")
    a2.set_title("where the time goes (medians)")
    a2.set_ylim(0, max([a + b for a, b in zip(e2m, m2k) if a == a and b == b], default=1) * 1.4)
    a2.legend(fontsize=7, loc="upper left")
    n = len({r["round"] for r in rows})
    fig.suptitle(f"{n} rounds, configurations interleaved; whiskers min-max, red dash p99", fontsize=8, y=0.01,
                 va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = os.path.join(out, "fig11a_startup.png")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def fig_latency(out):
    rows = read_csv("latency.csv")
    if not rows:
        return None
    configs = list(dict.fromkeys(r["config"] for r in rows))
    data = [[num(r["latency_us"]) for r in rows if r["config"] == c] for c in configs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for c, v in zip(configs, data):
        s = sorted(v)
        a1.plot(s, [(i + 1) / len(s) for i in range(len(s))], label=f"{c} (median {median(s):.2f} us)")
    log_axis(a1.xaxis)
    a1.set_xlabel("launch -> first block start (us)")
    a1.set_ylabel("fraction of launches")
    a1.set_title("Fig. 11b: launch latency (CDF)")
    a1.legend(fontsize=7, loc="lower right")
    a1.grid(alpha=0.3)
    boxes(a2, data, [c.replace(" -t ", "\n-t ") for c in configs])
    a2.set_ylabel("latency (us)")
    log_axis(a2.yaxis)
    a2.set_title("per configuration (whiskers min-max, red dash p99)")
    for lab in a2.get_xticklabels():
        lab.set_fontsize(7)
    fig.tight_layout()
    path = os.path.join(out, "fig11b_latency.png")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def fig_enforcement(out):
    rows = read_csv("enforce_samples.csv")
    summ = read_csv("enforce_summary.csv")
    if not rows or not summ:
        return None
    alone = {r["mechanism"]: num(r["alone_median_ms"]) for r in summ if r["scenario"] == "alone"}
    rej = {(r["mechanism"], r["scenario"]): r["rejected"] for r in summ}
    scenarios = [("corun-mem", "memory-bound interferer"), ("corun-compute", "compute-bound interferer"),
                 ("corun-short", "many short kernels"), ("three-task", "three tasks: 50% + 25% + 25%"),
                 ("alone", "alone (run-to-run noise)")]
    fig, grid = plt.subplots(2, 3, figsize=(13, 7.6))
    axes = list(grid.flat)
    for ax, (sc, title) in zip(axes, scenarios):
        mechs = [m for m in MECH_ORDER if any(r["mechanism"] == m and r["scenario"] == sc for r in rows)]
        data = [[num(r["iter_ms"]) / alone[m] for r in rows if r["mechanism"] == m and r["scenario"] == sc
                 and r["accepted"] == "1"] for m in mechs]
        labels = [MECH_NAMES.get(m, m) + (f"\n{median(v):.2f}x" if v else "") for m, v in zip(mechs, data)]
        boxes(ax, data, labels, [COLORS.get(m, "#aec7e8") for m in mechs])
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("iteration time / alone", fontsize=8)
        top = max((max(v) for v in data if v), default=1)
        if top > 3:
            log_axis(ax.yaxis)
        ax.grid(alpha=0.3, axis="y", which="both")
        for lab in ax.get_xticklabels():
            lab.set_fontsize(7)
        for i, m in enumerate(mechs):
            r = rej.get((m, sc))
            if r not in (None, "", "0"):
                ax.text(i + 1, 0.99, f"{r} rej.", transform=ax.get_xaxis_transform(), ha="center", va="top",
                        fontsize=6, color="gray")
    # The ratios are to each mechanism's own alone time, and those differ: without an SM limit
    # (time-sliced, MPS) the task alone has every SM, in a partition about half of them.
    ax = axes[len(scenarios)]
    mechs = [m for m in MECH_ORDER if m in alone]
    ax.bar(range(len(mechs)), [alone[m] for m in mechs], color=[COLORS.get(m, "#aec7e8") for m in mechs], alpha=0.75)
    for i, m in enumerate(mechs):
        ax.text(i, alone[m], f"{alone[m]:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(mechs)))
    ax.set_xticklabels([MECH_NAMES.get(m, m) for m in mechs], fontsize=7)
    ax.set_ylabel("median SGEMM iteration alone (ms)", fontsize=8)
    ax.set_ylim(0, max(alone.values(), default=1) * 1.2)
    ax.set_title("the baselines: the task alone (ms)", fontsize=10)
    for ax in axes[len(scenarios) + 1:]:
        ax.axis("off")
    fig.suptitle("Fig. 12: partition enforcement: FP32 SGEMM in half the GPU, interferer in the other half\n"
                 "iteration time / the same task alone in the same partition; whiskers min-max, red dash p99, "
                 "median under each name;\nsamples where the interferer finished no kernel rejected. "
                 "nvt = nvtaskset (striped TPC list / whole GPCs); MPS 50% = CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50; "
                 "green ctx = green contexts in one process", fontsize=8.5)
    fig.tight_layout()
    path = os.path.join(out, "fig12_enforcement.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig_trace(out):
    rows = read_csv("trace.csv")
    if not rows:
        return None
    t = [num(r["t_s"]) for r in rows]
    clk = [num(r["sm_mhz"]) for r in rows]
    pw = [num(r["power_w"]) for r in rows]
    groups = []  # (start, end, group name)
    for ti, r in zip(t, rows):
        parts = r["label"].split("/")
        g = "/".join(parts[:2]) if parts[0] == "enforce" else parts[0]
        if groups and groups[-1][2] == g:
            groups[-1][1] = ti
        else:
            groups.append([ti, ti, g])
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(14, 5.5), sharex=True)
    a1.plot(t, clk, lw=0.6, color="#1f77b4")
    a1.set_ylabel("SM clock (MHz)")
    a2.plot(t, pw, lw=0.6, color="#d62728")
    a2.set_ylabel("power (W)")
    a2.set_xlabel("time since the start of the evaluation (s)")
    palette = ["#f2f2f2", "#dde8f5"]
    for i, (s, e, g) in enumerate(groups):
        for ax in (a1, a2):
            ax.axvspan(s, e, color=palette[i % 2], lw=0)
        a1.text((s + e) / 2, 1.01, g.replace("enforce/", ""), transform=a1.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=6, rotation=60)
    reasons = sorted({r.get("clock_event_reasons", "") for r in rows} - {""})
    temps = [num(r.get("temp_c")) for r in rows if num(r.get("temp_c")) == num(r.get("temp_c"))]
    extra = f"; NVML clock-event reasons seen: {', '.join(reasons) or 'none'}"
    if temps:
        extra += f"; GPU temperature {min(temps):.0f}-{max(temps):.0f} C"
    step = median([b - a for a, b in zip(t, t[1:])]) * 1000 if len(t) > 1 else float("nan")
    fig.suptitle(f"Fig. 12 (trace): NVML SM clock and power during the evaluation (sampled every ~{step:.0f} ms)"
                 f"{extra}",
                 fontsize=10, y=0.995)
    fig.tight_layout()
    path = os.path.join(out, "fig12_trace.png")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def mech_sizes(row, sms):
    """SM counts a mechanism row of mechanisms.csv lists (fractions of the GPU for MiG)."""
    out = []
    for tok in row["sizes_sms"].split():
        if "/" in tok:
            a, b = tok.split("/")
            try:
                out.append(int(a) / int(b) * sms)
            except ValueError:
                pass
        else:
            try:
                out.append(float(tok))
            except ValueError:
                pass
    return out


def fig_granularity(out):
    rows = read_granularity()
    mech = read_csv("mechanisms.csv") or []
    if not rows and not mech:
        return None
    sms = 132
    topo = find("topology.json")
    if os.path.exists(topo):
        with open(topo) as f:
            sms = json.load(f)["device"]["sm_count"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw=dict(width_ratios=[3, 2]))
    if rows:
        # Hollow big markers for packed, small filled ones and a dashed line for striped: where the
        # two layouts take the same time the lines coincide and both stay visible.
        for layout, color, style in (("packed", "#1f77b4", dict(marker="o", ms=7, mfc="none", ls="-")),
                                     ("striped", "#ff7f0e", dict(marker="o", ms=3, ls="--"))):
            ks = sorted({int(r["tpcs"]) for r in rows if r["layout"] == layout})
            med = [median([num(r["ms"]) for r in rows if r["layout"] == layout and int(r["tpcs"]) == k]) for k in ks]
            a1.plot(ks, med, color=color, **style,
                    label=f"{layout} ({'GPC by GPC' if layout == 'packed' else 'TPCs 0..k-1, one GPC after another'})")
        full = [num(r["ms"]) for r in rows if r["layout"].startswith("all")]
        ks = sorted({int(r["tpcs"]) for r in rows if not r["layout"].startswith("all")})
        if full and ks:
            nt = max(int(r["tpcs"]) for r in rows)
            a1.plot(ks, [median(full) * nt / k for k in ks], ls=":", color="gray", label="ideal: all-TPC time x N/k")
        log_axis(a1.yaxis)
        log_axis(a1.xaxis)
        a1.set_xlabel("partition size (TPCs; 2 SMs each; log scale)")
        a1.set_ylabel("SGEMM n=4096 time (ms, median; log scale)")
        a1.set_title("Fig. 13: SGEMM time at every partition size (nvtaskset -p)")
        a1.legend(fontsize=8)
        a1.grid(alpha=0.3, which="both")
    y = 0
    labels = []
    for r in mech:
        v = mech_sizes(r, sms)
        if not v:
            continue
        doc = "not measured" in r["source"]
        if doc:
            a2.scatter(v, [y] * len(v), s=14, marker="o", facecolors="none", edgecolors="black")
        else:
            a2.scatter(v, [y] * len(v), s=14 if len(v) <= 20 else 6, marker="o", color="#1f77b4")
        labels.append(f"{r['mechanism']}\n{r['distinct_sizes']} sizes{' (documented)' if doc else ''}")
        y += 1
    a2.set_yticks(range(len(labels)))
    a2.set_yticklabels(labels, fontsize=7)
    a2.set_xlabel("partition size (SMs)")
    a2.set_xlim(0, sms + 4)
    a2.invert_yaxis()
    a2.set_title("partition sizes each mechanism offers")
    a2.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path = os.path.join(out, "fig13_granularity.png")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="eval.py's output directories")
    ap.add_argument("--out", help="where the PNGs go (default: the first RESULTS_DIR/plots)")
    a = ap.parse_args()
    DIRS.extend(a.results)
    out = a.out or os.path.join(a.results[0], "plots")
    os.makedirs(out, exist_ok=True)
    made = 0
    for fn in (fig_startup, fig_latency, fig_enforcement, fig_trace, fig_granularity):
        path = fn(out)
        print(f"{fn.__name__}: {path or 'no input, skipped'}")
        made += path is not None
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
