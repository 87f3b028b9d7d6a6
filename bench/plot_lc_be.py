#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The trade-off of bench/lc_be_mix.py (GPT-2 inference next to GPT-2-medium training), from its
JSON: LC p99 against BE throughput.

One panel per load (each open-loop rate, then the closed loop), one point per setup that runs
both tasks: x is BE it/s over BE alone, y is LC p99 over LC alone on the whole GPU at the same
load (the closed loop: over LC alone on its reservation, when the JSON has that baseline, as
the target is). A point is the median over the valid rounds; its bars span the rounds'
minimum to maximum, over the same baselines' medians (the baselines' own spread is not in the
bars). The target region is shaded (lc_be_mix.TARGETS: 44 req/s p99 <= 1.25x and BE >=
0.90; 87 req/s p99 <= 1.5x and BE >= 0.80; closed p99 <= 1.10x of alone on the reservation and
BE >= 8.6 it/s, drawn as 8.6 / BE alone). The roles setup (lc_be_mix.ROLES), when the JSON has
it, is the red star.

    python3 bench/plot_lc_be.py DIR/lc_be_mix.json [-o OUT.png]

Needs matplotlib (Debian: apt-get install python3-matplotlib); draws with the Agg backend.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lc_be_mix as mix  # noqa: E402  (its setup names and targets; imports only the standard library)

try:
    import matplotlib
except ImportError:
    sys.exit(f"plot_lc_be.py: {sys.executable} has no matplotlib (pip install matplotlib; Debian: apt-get install "
             "python3-matplotlib)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

OTHER_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
ROLES_COLOR = "#d62728"


def median_span(s, scale):
    """(median, [below, above]) of a lc_be_mix stat {median, min, max} over `scale`."""
    m = s["median"] / scale
    return m, [m - s["min"] / scale, s["max"] / scale - m]


def panels_of(data):
    rates = data.get("meta", {}).get("rates") or []
    names = [f"poisson{r:g}" for r in rates] + ["closed"]
    if not rates:  # a JSON without meta: the patterns its setups have
        seen = {p for per in data["summary"]["setups"].values() for p in per if p != "-"}
        names = sorted(p for p in seen if p != "closed") + (["closed"] if "closed" in seen else [])
    return [(p, rate_of(p)) for p in names]


def rate_of(pname):
    return float(pname[len("poisson"):]) if pname.startswith("poisson") else None


def title_of(pname, rate):
    return "closed loop (LC steps back to back)" if rate is None else f"open loop, Poisson {rate:g} req/s"


def baseline(setups, pname):
    """(the LC-alone setup name, its p99 median, tag) the pattern's ratio uses: the target's
    baseline (the reservation for the closed loop) where the JSON has it, else the whole GPU."""
    want = mix.TARGETS[pname][0] if pname in mix.TARGETS else "gpu"
    order = [want, "gpu"] if want == "res" else ["gpu"]
    for tag in order:
        name = mix.BASE_RES if tag == "res" else mix.BASE_GPU
        e = setups.get(name, {}).get(pname) or {}
        if e.get("lc_p99_ms"):
            return name, e["lc_p99_ms"]["median"], tag
    return None, None, None


def mixes(data):
    """The setups that run LC and BE, in the JSON's order."""
    meta_setups = data.get("meta", {}).get("setups")
    if meta_setups:
        return [s["name"] for s in meta_setups if s.get("lc") and s.get("be")]
    return [n for n in data["summary"]["setups"] if n not in (mix.BASE_GPU, mix.BASE_RES, mix.BASE_BE)]


def draw_panel(ax, data, pname, rate, names, colors, be_alone, lines):
    setups = data["summary"]["setups"]
    base_name, base, tag = baseline(setups, pname)
    ax.set_title(title_of(pname, rate), fontsize=10)
    if base is None:
        ax.text(0.5, 0.5, "no LC-alone baseline in this JSON", ha="center", va="center", transform=ax.transAxes)
        lines.append(f"{pname}: no LC-alone baseline; nothing drawn")
        return
    xs, ys = [], []
    for name in names:
        e = setups.get(name, {}).get(pname) or {}
        if not e.get("lc_p99_ms") or not e.get("be_its"):
            lines.append(f"{pname}: {name}: no valid round; not drawn")
            continue
        y, yerr = median_span(e["lc_p99_ms"], base)
        x, xerr = median_span(e["be_its"], be_alone or 1.0)
        roles = name == mix.ROLES
        ax.errorbar([x], [y], xerr=[[xerr[0]], [xerr[1]]], yerr=[[yerr[0]], [yerr[1]]],
                    fmt="*" if roles else "o", ms=16 if roles else 7, color=colors[name],
                    mec="black" if roles else colors[name], elinewidth=1.6 if roles else 1, capsize=3,
                    zorder=5 if roles else 3)
        ax.annotate(name, (x, y), xytext=(6, 5), textcoords="offset points", fontsize=8,
                    fontweight="bold" if roles else "normal", color=colors[name] if roles else "black")
        xs += [x - xerr[0], x + xerr[1]]
        ys += [y - yerr[0], y + yerr[1]]
        lines.append(f"{pname}: {name:14s} LC p99 {e['lc_p99_ms']['median']:7.2f} ms = {y:5.2f}x {tag} "
                     f"[{y - yerr[0]:.2f}-{y + yerr[1]:.2f}], BE {e['be_its']['median']:5.2f} it/s"
                     + (f" = {x:.2f}x alone [{x - xerr[0]:.2f}-{x + xerr[1]:.2f}]" if be_alone else "")
                     + (f", target {e['target']}" if e.get("target") else "") + f", n={e.get('valid', '?')}")
    target = mix.TARGETS.get(pname)
    shade = None
    if target:
        t_base, max_ratio, be_min, kind = target
        if t_base != tag:
            lines.append(f"{pname}: the target is over LC alone on its {'reservation' if t_base == 'res' else 'GPU'}, "
                         f"absent here: not shaded")
        elif kind == "ratio" and not be_alone:
            lines.append(f"{pname}: no BE-alone baseline: the target (BE >= {be_min:g}x alone) is not shaded")
        else:
            x_min = be_min / be_alone if kind == "it/s" and be_alone else be_min
            shade = (x_min, max_ratio, be_min, kind)
    x_hi = max(xs + [1.0, shade[0] if shade else 0]) * 1.08
    x_lo = max(0.0, int((min(xs + [shade[0] if shade else 1.0, 1.0]) - 0.05) * 10) / 10) if be_alone else 0.0
    y_lo = min(ys + [1.0]) * 0.85
    y_hi = max(ys + [shade[1] if shade else 1.0]) * 1.25
    if shade:
        x_min, max_ratio, be_min, kind = shade
        ax.fill_between([x_min, x_hi], [y_lo, y_lo], [max_ratio, max_ratio], color="#2ca02c", alpha=0.15, lw=0,
                        zorder=1)
        if kind != "it/s":
            be_txt = f"BE >= {be_min:g}x alone"
        else:
            be_txt = f"BE >= {be_min:g} it/s" + (f" (= {x_min:.2f}x alone)" if be_alone else "")
        ax.text(x_hi * 0.99, max_ratio, f"target: p99 <= {max_ratio:g}x, {be_txt}", ha="right", va="bottom",
                fontsize=7, color="#1b6e1b")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", zorder=2)
    if be_alone:
        ax.axvline(1.0, color="grey", lw=0.8, ls=":", zorder=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x" if be_alone else f"{v:g}"))
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    where = f"on its reservation ({base_name})" if tag == "res" else f"on the whole GPU ({base_name})"
    ax.set_ylabel(f"LC p99 / LC alone {where}", fontsize=8)
    ax.set_xlabel("BE it/s / BE alone" if be_alone else "BE it/s (no BE-alone baseline)", fontsize=8)
    ax.grid(True, which="both", alpha=0.25)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="lc_be_mix.json, as bench/lc_be_mix.py writes it")
    ap.add_argument("-o", "--out", help="the PNG (default: next to the JSON, <name>_p99_vs_be.png)")
    ap.add_argument("--dpi", type=int, default=150)
    a = ap.parse_args(argv)
    try:
        with open(a.json) as f:
            data = json.load(f)
        data["summary"]["setups"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot_lc_be.py: {a.json}: not a lc_be_mix.py JSON ({e!r})")
    out = a.out or os.path.splitext(a.json)[0] + "_p99_vs_be.png"
    names = mixes(data)
    others = [n for n in names if n != mix.ROLES]
    colors = {n: OTHER_COLORS[i % len(OTHER_COLORS)] for i, n in enumerate(others)}
    colors[mix.ROLES] = ROLES_COLOR
    be = data["summary"].get("be_alone_its")
    be_alone = be["median"] if be else None
    panels = panels_of(data)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6), squeeze=False)
    lines = []
    for ax, (pname, rate) in zip(axes[0], panels):
        draw_panel(ax, data, pname, rate, names, colors, be_alone, lines)
    meta = data.get("meta", {})
    reps = meta.get("reps")
    sup = "LC p99 vs BE throughput (bench/lc_be_mix.py)"
    if meta.get("gpu"):
        sup += f": {meta['gpu'].split(',')[0]}"
    if reps and data.get("skipped"):
        # (a round cut by the time budget: fewer valid rounds than asked for, the n in the summary)
        sup += f"; median over the valid rounds ({reps} asked, {len(data['skipped'])} runs skipped), bars min-max"
    else:
        sup += f"; median over {reps} rounds, bars min-max" if reps else "; median over rounds, bars min-max"
    if mix.ROLES not in names:
        sup += f"; no '{mix.ROLES}' setup in this run"
    fig.suptitle(sup, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=a.dpi)
    for line in lines:
        print(line)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
