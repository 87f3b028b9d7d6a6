#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every figure in docs/figures, drawn again from the data committed in the repository.

    python3 bench/figures.py                 # every PNG into docs/figures
    python3 bench/figures.py --out DIR       # the same PNGs into DIR (to compare with the committed ones)
    python3 bench/figures.py --list          # each figure and the data it is drawn from
    python3 bench/figures.py --check         # no drawing, no matplotlib: every PNG in docs/figures has
                                             # a recipe here and every recipe's data exists

Figs. 11-13 are drawn by bench/plot.py from the eval.py files in docs/figures/data/<dir>; each
figure of the mix (bench/lc_be_mix.py) by bench/plot_lc_be.py from its JSON in docs/data.
Drawing needs matplotlib (pip install matplotlib; Debian: python3-matplotlib). Exit status 1,
with one line naming it, when a figure has no recipe, a recipe's data is missing, or a figure
was not written.
"""
import argparse
import os
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
FIGURES = os.path.join(ROOT, "docs", "figures")
EVAL_DATA = os.path.join(FIGURES, "data")
MIX_DATA = os.path.join(ROOT, "docs", "data")

# bench/plot.py: input directory under docs/figures/data -> the PNGs it draws from it.
EVAL_FIGURES = {
    "fig11a": ("fig11a_startup.png",),
    "fig11b_fig12": ("fig11b_latency.png", "fig12_enforcement.png", "fig12_trace.png"),
    "fig13": ("fig13_granularity.png",),
}

# bench/plot_lc_be.py: PNG -> its lc_be_mix.py JSON under docs/data (the same name but one).
MIX_FIGURES = {
    "lc_be_mix_all_h100_run112.png": "lc_be_mix_all_h100_run112.json",
    "lc_be_mix_all_h200_run108.png": "lc_be_mix_all_h200_run108.json",
    "lc_be_mix_borrow_limit_h100_run85.png": "lc_be_mix_borrow_limit_h100_run85.json",
    "lc_be_mix_borrow_limit_h200_run84.png": "lc_be_mix_borrow_limit_h200_run84.json",
    "lc_be_mix_ceiling_h100_run94.png": "lc_be_mix_ceiling_h100_run94.json",
    "lc_be_mix_ceiling_h200_run92.png": "lc_be_mix_ceiling_h200_run92.json",
    "lc_be_mix_futex_h100_run99.png": "lc_be_mix_futex_h100_run99.json",
    "lc_be_mix_futex_h200_run98.png": "lc_be_mix_futex_h200_run98.json",
    "lc_be_mix_gate_depth_h200_run81.png": "lc_be_mix_gate_depth_h200_run81.json",
    "lc_be_mix_gate_spacing_h100_run105.png": "lc_be_mix_gate_spacing_h100_run105.json",
    "lc_be_mix_roles_budget_h100.png": "lc_be_mix_roles_budget_h100.json",
    "lc_be_mix_roles_clusters_h100.png": "lc_be_mix_roles_clusters_h100.json",
    "lc_be_mix_roles_gate_h100_run72.png": "lc_be_mix_roles_gate_h100_run72.json",
    "lc_be_mix_roles_gate_h200_run70.png": "lc_be_mix_roles_gate_h200_run70.json",
    "lc_be_mix_roles_h100.png": "lc_be_mix_roles_h100.json",
    "lc_be_mix_roles_h200.png": "lc_be_mix_roles_h200.json",
    "lc_be_mix_roles_h200_run110.png": "lc_be_mix_roles_h200_run110.json",
    "lc_be_mix_roles_topup_h200.png": "lc_be_mix_roles_topup_h200_run61.json",
    "lc_be_mix_roles_topup_h200_run65.png": "lc_be_mix_roles_topup_h200_run65.json",
    "lc_be_mix_roles_work_h100.png": "lc_be_mix_roles_work_h100.json",
}


def recipes():
    """(png, tool, data path) for every figure, in a fixed order."""
    out = []
    for d, pngs in EVAL_FIGURES.items():
        out += [(png, "plot.py", os.path.join(EVAL_DATA, d)) for png in pngs]
    out += [(png, "plot_lc_be.py", os.path.join(MIX_DATA, js)) for png, js in MIX_FIGURES.items()]
    return out


def problems():
    """What makes the recipes disagree with the tree: a PNG without a recipe, a recipe without its
    data or its committed PNG."""
    known = {png for png, _, _ in recipes()}
    found = {f for f in os.listdir(FIGURES) if f.endswith(".png")}
    out = [f"docs/figures/{f}: no recipe in bench/figures.py" for f in sorted(found - known)]
    out += [f"docs/figures/{f}: in bench/figures.py but not committed" for f in sorted(known - found)]
    out += [f"{png}: its data {os.path.relpath(src, ROOT)} is missing"
            for png, _, src in recipes() if not os.path.exists(src)]
    return out


def draw(out, only):
    try:
        import matplotlib  # noqa: F401  (both plotting scripts need it; say so once, here)
    except ImportError:
        sys.exit(f"figures.py: {sys.executable} has no matplotlib (pip install matplotlib; Debian: "
                 "apt-get install python3-matplotlib)")
    sys.path.insert(0, BENCH)
    import plot_lc_be  # noqa: E402

    os.makedirs(out, exist_ok=True)
    wanted = [r for r in recipes() if not only or r[0] in only]
    for d, pngs in EVAL_FIGURES.items():
        if any(png in pngs for png, _, _ in wanted):
            # plot.py draws every figure its directory has input for, so one call per directory.
            subprocess.run([sys.executable, os.path.join(BENCH, "plot.py"), os.path.join(EVAL_DATA, d),
                            "--out", out], check=True)
    for png, tool, src in wanted:
        if tool == "plot_lc_be.py":
            plot_lc_be.main([src, "-o", os.path.join(out, png)])
    missing = [png for png, _, _ in wanted if not os.path.exists(os.path.join(out, png))]
    if missing:
        sys.exit(f"figures.py: not written: {', '.join(missing)}")
    print(f"figures.py: {len(wanted)} figures in {out}")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=FIGURES, help="where the PNGs go (default: docs/figures)")
    ap.add_argument("--list", action="store_true", help="print each figure and its data, draw nothing")
    ap.add_argument("--check", action="store_true", help="check the recipes against the tree, draw nothing")
    ap.add_argument("only", nargs="*", help="draw only these PNGs (names as in docs/figures)")
    a = ap.parse_args(argv)
    unknown = sorted(set(a.only) - {png for png, _, _ in recipes()})
    if unknown:
        sys.exit(f"figures.py: no such figure: {', '.join(unknown)} (--list names them)")
    if a.list:
        for png, tool, src in recipes():
            print(f"{png:42} {tool:14} {os.path.relpath(src, ROOT)}")
        return 0
    bad = problems()
    if bad:
        for line in bad:
            print(f"figures.py: {line}", file=sys.stderr)
        return 1
    if a.check:
        print(f"figures.py: {len(recipes())} figures, each with its data")
        return 0
    draw(os.path.abspath(a.out), set(a.only))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
