#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a latency-critical request waits behind when it arrives next to the best-effort training of
bench/lc_be_mix.py (GPT-2-medium, next to GPT-2 inference), read from the training's own kernel timeline (no nvtaskset involved).

Under the roles a BE task is stopped on the GPU by a gate (a stream wait on a word its gatekeeper
closes) queued before every NVTASKSET_BE_GATE_EVERY launches. When an LC request arrives, what is
already past the last open gate still runs: the kernel in flight and the rest of its group. Kernels
whose blocks hold their SMs to the end (Hopper's persistent GEMMs) keep the LC task's blocks off
those SMs until they end, whatever MPS client priority says. So the BE work in the way of a
request arriving at a random moment is, at most:

    R_g(t) = end of the last kernel of the group (of g launches) in flight at t  -  t

Profiles GPT-2-medium training (bench/lc_be_mix.py's BE task: bf16 autocast, batch 8 x 512, AdamW)
with torch.profiler for --steps steps after --warmup, and prints:
  - kernels per step, GPU busy time per step, the share of busy time in kernels of at least
    0.1 / 0.25 / 0.5 / 1 / 2 ms, and the kernels that take the most time;
  - R_g's p50 / p90 / p99 / max over --samples arrivals drawn uniformly over the profiled steps, for
    a gate every 1, 2 and 4 launches (the gates' phase drawn at random too), in ms, and the share
    of arrivals with R_g above 0.5 / 1 / 2 ms.
It is an upper bound of the wait (a kernel of many short blocks lets the LC task's blocks in as
its own end), and a lower one where the GPU's front end passes open gates ahead of the kernels
behind them.

    python3 bench/be_kernels.py [--steps 6] [--warmup 4] [--samples 200000] [--long-ms 0.5] [--json OUT.json]
"""
import argparse
import bisect
import collections
import json
import os
import random
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def pct(xs, q):
    """Nearest-rank percentile of sorted xs."""
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, int(round(q / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def kernels_of(trace_path, grids=None):
    """(start_us, end_us, name) of every kernel in a chrome trace, in start order. With `grids` (a
    dict), also fills grids[name] with the set of (grid, block, cluster) launch shapes seen."""
    with open(trace_path) as f:
        d = json.load(f)
    ks = []
    for e in d.get("traceEvents", []):
        if e.get("cat") == "kernel" and "ts" in e and "dur" in e:
            ks.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e.get("name", "?")))
            if grids is not None:
                args = e.get("args", {})
                shape = (tuple(args.get("grid", ())), tuple(args.get("block", ())),
                         tuple(args.get("cluster", ())) if "cluster" in args else ())
                grids.setdefault(e.get("name", "?"), collections.Counter())[shape] += 1
    ks.sort()
    return ks


def residuals(ks, every, samples, rng):
    """R_g(t) in us for `samples` arrivals uniform over the timeline, gates every `every` launches
    at a random phase per arrival."""
    starts = [k[0] for k in ks]
    ends = [k[1] for k in ks]
    # running max of ends: with kernels that overlap (several streams), "in flight" is any that
    # started and has not ended
    t0, t1 = starts[0], ends[-1]
    out = []
    for _ in range(samples):
        t = rng.uniform(t0, t1)
        i = bisect.bisect_right(starts, t) - 1  # the last kernel that started by t
        if i < 0:
            out.append(0.0)
            continue
        phase = rng.randrange(every)
        last = i + (every - 1 - ((i + phase) % every))  # the last kernel of its gate's group
        last = min(last, len(ks) - 1)
        end = max(ends[i:last + 1])
        out.append(max(0.0, end - t))
    out.sort()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="training steps profiled (default 6)")
    ap.add_argument("--warmup", type=int, default=4, help="steps run first, not profiled (default 4)")
    ap.add_argument("--samples", type=int, default=200000, help="random arrivals (default 200000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--long-ms", type=float, default=0.5,
                    help="print the launch shapes (grid, block, cluster) of kernels at least this long "
                         "(default 0.5 ms; 0: none)")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.samples < 1:
        sys.exit("be_kernels: --steps and --samples must be positive, --warmup not negative")

    import torch
    import transformers
    sys.path.insert(0, HERE)
    import lc_be_mix

    step = lc_be_mix.be_trainer(torch, transformers)
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]  # kernels only: CPU tracing would slow the launches
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        grids = {}
        ks = kernels_of(path, grids)
    if len(ks) < 2:
        sys.exit("be_kernels: the profile holds no kernels (is CUPTI available?)")

    durs = sorted((e - s) for s, e, _ in ks)
    busy = sum(durs)
    span = ks[-1][1] - ks[0][0]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": a.steps,
           "kernels": len(ks), "kernels_per_step": len(ks) / a.steps, "busy_ms_per_step": busy / a.steps / 1e3,
           "span_ms_per_step": span / a.steps / 1e3,
           "kernel_us": {"p50": pct(durs, 50), "p90": pct(durs, 90), "p99": pct(durs, 99), "max": durs[-1]},
           "busy_share_at_least": {}, "top": [], "residual_ms": {}}
    for ms in (0.1, 0.25, 0.5, 1, 2):
        res["busy_share_at_least"][str(ms)] = sum(d for d in durs if d >= ms * 1e3) / busy
    by = collections.defaultdict(list)
    for s, e, n in ks:
        by[n].append(e - s)
    top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:12]
    for n, ds in top:
        res["top"].append({"name": n[:90], "count_per_step": len(ds) / a.steps, "share": sum(ds) / busy,
                           "median_us": statistics.median(ds), "max_us": max(ds)})
    rng = random.Random(a.seed)
    for g in (1, 2, 4):
        r = residuals(ks, g, a.samples, rng)
        res["residual_ms"][str(g)] = {
            "p50": pct(r, 50) / 1e3, "p90": pct(r, 90) / 1e3, "p99": pct(r, 99) / 1e3, "max": r[-1] / 1e3,
            "above": {str(ms): sum(1 for x in r if x > ms * 1e3) / len(r) for ms in (0.5, 1, 2)}}

    print(f"{res['device']}, torch {res['torch']}: GPT-2-medium training, {a.steps} steps profiled")
    print(f"  {res['kernels_per_step']:.0f} kernels a step; GPU busy {res['busy_ms_per_step']:.1f} ms of "
          f"{res['span_ms_per_step']:.1f} ms a step ({busy / span:.0%})")
    k = res["kernel_us"]
    print(f"  kernel duration p50 {k['p50']:.0f} us, p90 {k['p90']:.0f}, p99 {k['p99']:.0f}, max {k['max']:.0f}")
    print("  share of busy time in kernels of at least: " +
          ", ".join(f"{ms} ms {v:.0%}" for ms, v in res["busy_share_at_least"].items()))
    print("  the kernels that take the most time (a step: count, share of busy time, median / max us):")
    for t in res["top"]:
        print(f"    {t['count_per_step']:5.1f}  {t['share']:5.1%}  {t['median_us']:7.0f} / {t['max_us']:7.0f}  {t['name']}")
    print("  BE work in the way of an LC request arriving at a random moment, R_g (ms):")
    print("    gate every   p50    p90    p99    max   >0.5 ms  >1 ms  >2 ms")
    for g, v in res["residual_ms"].items():
        ab = v["above"]
        print(f"    {g:>10}  {v['p50']:5.2f}  {v['p90']:5.2f}  {v['p99']:5.2f}  {v['max']:5.2f}   "
              f"{ab['0.5']:6.1%}  {ab['1']:5.1%}  {ab['2']:5.1%}")
    if a.long_ms > 0:
        long = sorted({n for s, e, n in ks if e - s >= a.long_ms * 1e3}, key=lambda n: -max(by[n]))
        res["long_shapes"] = []
        print(f"  launch shapes of the kernels of {a.long_ms} ms or more (grid / block / cluster: launches):")
        for n in long:
            shapes = [{"grid": list(g), "block": list(b), "cluster": list(c), "launches": k}
                      for (g, b, c), k in grids.get(n, {}).items()]
            res["long_shapes"].append({"name": n[:90], "max_us": max(by[n]), "shapes": shapes})
            print(f"    {max(by[n]):7.0f} us  {n[:90]}")
            for sh in shapes:
                print(f"      grid {sh['grid']} block {sh['block']} cluster {sh['cluster'] or '-'}: {sh['launches']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
