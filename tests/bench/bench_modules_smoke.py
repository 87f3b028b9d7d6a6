#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A CPU smoke of the modules bench/lc_be_mix.py, eval.py and yield_time.py are made of: imports
each (no torch, no GPU) and runs their pure functions on fabricated data; nothing is timed.

    python3 tests/bench/bench_modules_smoke.py     # prints one line and exits 0, or fails an assert
"""
import os
import sys
import tempfile
import types

BENCH = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
sys.path.insert(0, BENCH)

import eval_harness as H  # noqa: E402
import eval_enforcement  # noqa: E402,F401
import eval_granularity  # noqa: E402,F401
import eval_startup_latency  # noqa: E402,F401
import lc_be_mix  # noqa: E402
import lc_be_mix_driver as driver  # noqa: E402
import lc_be_mix_report as report  # noqa: E402
import lc_be_mix_worker as worker  # noqa: E402
import yield_time_common  # noqa: E402
import yield_time_roles  # noqa: E402
import yield_time_shrink  # noqa: E402,F401
import yield_time_workers  # noqa: E402,F401


def mix():
    a, setups = lc_be_mix.parse_args(["--nvtaskset", "/nonexistent", "--reps", "1", "--seed", "1",
                                      "--setups", "lc-alone-gpu,lc-alone-res,be-alone,mps"])
    patterns = lc_be_mix.patterns_of(a.rates)
    assert [s.name for s in setups] == ["lc-alone-gpu", "lc-alone-res", "be-alone", "mps"]
    assert [p for p, _ in patterns] == ["closed", "poisson44", "poisson87"]
    assert driver.HERE == os.path.join(BENCH, "lc_be_mix.py")
    # the worker's window with a replay that takes no time, and a closed loop of 0 s: the warm-up only
    calls = []
    w = worker.lc_window(lambda: calls.append(1), {"rate": None, "seconds": 0})
    assert len(calls) == worker.LC_WARMUP_REPLAYS and w["lat_ms"] == []
    rows = []
    for setup, scale, be_its in (("lc-alone-gpu", 1.0, None), ("lc-alone-res", 1.2, None), ("mps", 1.3, 9.5),
                                 ("be-alone", None, 10.0)):
        for pname, _ in (patterns if scale else [("-", None)]):
            r = {"rep": 0, "setup": setup, "pattern": pname, "valid": 1, "reject_reason": "", "window_s": 1.0}
            if scale:
                lat = [scale * x for x in range(1, 101)]
                r.update({"_lat": lat, "lc_n": len(lat), "lc_p50_ms": report.pct(lat, 50),
                          "lc_p99_ms": report.pct(lat, 99), "lc_p999_ms": report.pct(lat, 99.9)})
            if be_its:
                r.update({"be_its": be_its, "be_steps": 10})
            rows.append(r)
    assert report.row_line(rows[0]).startswith("[r1 lc-alone-gpu closed], LC p50 50.50 p99 99.01")
    s = report.summarize(rows, setups, patterns)
    e = s["setups"]["mps"]["poisson44"]
    assert abs(e["p99_vs_gpu"] - 1.3) < 1e-9 and abs(e["be_vs_alone"] - 0.95) < 1e-9
    # the targets: p99 1.3x gpu misses 44 req/s (1.25x), meets 87 (1.5x); 1.3 / 1.2 = 1.08x res meets the closed loop
    assert [s["setups"]["mps"][p]["target"] for p, _ in patterns] == ["met", "missed", "met"]
    d = types.SimpleNamespace(a=a, setups=setups, patterns=patterns, lines=[], skipped=[], failed={}, rows=rows,
                              visits=[])
    d.say = lambda line="": d.lines.append(line)
    report.report(d, s)
    assert any(line.startswith("  mps ") for line in d.lines)
    with tempfile.TemporaryDirectory() as out:
        a.out = out
        report.write_outputs(d, s, {"argv": []})
        assert sorted(os.listdir(out)) == ["lc_be_mix.csv", "lc_be_mix.json", "summary.txt"]


def evaluation():
    assert H.ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert H.median([3, 1, 2]) == 2 and H.pstats([1.0, 2.0])["max"] == 2.0
    H.TOPO = {"gpcs": [{"gpc": g, "tpcs": list(range(4 * g, 4 * g + 4))} for g in range(3)],
              "tpcs": [{"tpc": t, "gpc": t // 4} for t in range(12)]}
    H.NTPC = 12
    assert H.gpc_half() == ([0], [0, 1, 2, 3], list(range(4, 12)))  # 4 of 12 (then fewer rather than more)
    calib = H.parse_calib(["calib begin offset_ns 10 halfwidth_ns 5 at_ns 100 ok 1"])
    assert H.to_host([110, 210], calib) == [100, 200]


def yields():
    assert yield_time_common.matmul_for(1.5) == "8192x7680" and yield_time_common.matmul_dims("8x16") == (8, 16)
    a = types.SimpleNamespace(kernel_list=[1.5], depth_list=[16], gap=[20.0, 60.0], rounds=1, be_depth=None)
    yield_time_roles.ARMS = {k: yield_time_roles.ALL_ARMS[k] for k in ("roles", "plain")}
    windows = [{"arm": arm, "window": w, "depth": 16 if w == "be" else None,
                "kernel_ms_target": 1.5 if w == "be" else None, "round": 1, "n": 3,
                "lat_ms": [base, base + 1, base + 2], "p50_ms": base + 1, "p99_ms": base + 2,
                "be_kernel_ms": 1.4 if w == "be" else None, "be_matmuls_per_s": 600.0}
               for arm in ("roles", "plain") for w, base in (("alone", 1.0), ("be", 3.0))]
    s = yield_time_roles.roles_summary(a, windows, yield_time_roles.roles_configs(a))
    assert s["configs"][0]["roles"]["give_back_p50_ms"] == 2.0
    assert len(yield_time_roles.roles_table(a, s)) == 7


if __name__ == "__main__":
    mix()
    evaluation()
    yields()
    print("bench_modules_smoke: lc_be_mix, eval and yield_time modules import and compute as expected")
