# SPDX-License-Identifier: Apache-2.0
"""bench/eval.py's sections mechanisms and granularity (Fig. 13): the partition sizes each mechanism
offers, and SGEMM time at every partition size, packed by GPC and striped, changed live with -p.
"""
import random
import re

import eval_harness as H
from eval_harness import (LABEL, Measured, fmt, gpcs, left, log, median, mps_start, mps_stop, packed_order, ranges, run,
                          write_csv)


# ---- Fig. 13: granularity ----------------------------------------------------------------------------------


MECH_ROWS = []


def section_mechanisms():
    LABEL[0] = "mechanisms"
    sms = H.TOPO["device"]["sm_count"]
    per_tpc = sms // H.NTPC if H.NTPC else 2
    mps_stop()
    rc, out, err, _ = run([H.GW, "green-query"], timeout=120)
    for m in re.finditer(r"green_sizes flags (\d+) count (\d+) sizes (\S*)", out):
        what = "green contexts" + (" (no co-scheduling guarantee)" if m.group(1) != "0" else "")
        MECH_ROWS.append((what, "measured (cuDevSmResourceSplitByCount)", int(m.group(2)), m.group(3).replace(",", " "),
                          "one split: groups of this size plus a remainder"))
    if rc != 0:
        log(f"WARN green-query rc={rc} {err.strip()[-300:]}", summary=True)
    if mps_start():
        rc, out, err, _ = run([H.GW, "mps-affinity", "--max-s", "60" if H.ARGS.full else "30"], timeout=120)
        m = re.search(r"mps_affinity asked (\d+) of (\d+) count (\d+) sizes (\S*)", out)
        if m:
            MECH_ROWS.append(("MPS SM limit (context execution affinity)",
                              f"measured (cuCtxCreate affinity, {m.group(1)} of {m.group(2)} counts asked)",
                              int(m.group(3)), m.group(4).replace(",", " "),
                              "a limit on how many SMs, not which: clients may share SMs"))
        else:
            log(f"WARN mps-affinity rc={rc} {out.strip()[-200:]} {err.strip()[-300:]}", summary=True)
        mps_stop()
    gs = gpcs()
    gsz = sorted({sum(len(gs[i][1]) for i in range(len(gs)) if mask >> i & 1) * per_tpc
                  for mask in range(1, 1 << len(gs))})
    MECH_ROWS.append(("nvtaskset -t (TPC lists)", "by construction (measured: docs/verification.md)", H.NTPC,
                      " ".join(str(k * per_tpc) for k in range(1, H.NTPC + 1)),
                      f"any of the 2^{H.NTPC}-1 TPC sets, changeable live"))
    MECH_ROWS.append(("nvtaskset -g (whole GPCs)", "from this GPU's topology", len(gsz), " ".join(map(str, gsz)),
                      f"any of the 2^{len(gpcs())}-1 GPC sets"))
    MECH_ROWS.append(("MiG (H100/H200)", "NVIDIA MIG user guide, not measured (MIG off)", 5,
                      "1/7 2/7 3/7 4/7 7/7 of the SMs (1g 2g 3g 4g 7g)",
                      "static, GPU reset to change; compute and memory"))
    MECH_ROWS.append(("MPS static SM partitions", "NVIDIA MPS docs, not measured", "",
                      "multiples of the server's chunk size", "fixed when the daemon starts (-S)"))
    write_csv("mechanisms.csv", ["mechanism", "source", "distinct_sizes", "sizes_sms", "note"],
              [tuple(str(x).replace(",", ";") for x in r) for r in MECH_ROWS])
    log("partition sizes each mechanism offers (SMs):", summary=True)
    for r in MECH_ROWS:
        sizes = r[3] if len(r[3]) < 90 else r[3][:87] + "..."
        log(f"  {r[0]:<62} {str(r[2]):>4} sizes [{r[1]}]: {sizes}", summary=True)


def section_granularity():
    samples = 10 if H.ARGS.full else 3
    n = H.ARGS.granularity_n
    if H.ARGS.full:
        sizes = list(range(1, H.NTPC + 1))
    else:
        sizes = sorted({1, 2, 3, 4, H.NTPC // 2, H.NTPC} | set(range(6, H.NTPC, 6)))
    mps_stop()  # a --no-mps task would otherwise become a client of a running daemon
    full = ranges(range(H.NTPC))
    m = Measured([H.NV, "--no-mps", "-t", full], {}, "granularity", n, "granularity")
    if not m.ok:
        return
    log(f"INFO granularity: {m.info}")
    rows = []
    order = {"packed": packed_order(), "striped": list(range(H.NTPC))}
    rng = random.Random(13)

    def point(layout, k, lst):
        rc, out, err, _ = run([H.NV, "-p", "-t", ranges(lst), str(m.p.pid)], timeout=30)
        if rc != 0:
            log(f"WARN granularity: -p -t {ranges(lst)} rc={rc} {err.strip()}", summary=True)
            return False
        res = m.batch(f"gran-{layout}-{k}", samples, 120 + samples * 5)
        if res is None:
            log(f"WARN granularity: batch {layout} {k} failed", summary=True)
            return False
        for i, t0, t1, g0, g1 in res:
            rows.append((layout, k, len(lst) * (H.TOPO["device"]["sm_count"] // H.NTPC), ranges(lst), i,
                         (t1 - t0) / 1e6))
        return True

    try:
        point("all-start", H.NTPC, list(range(H.NTPC)))
        for k in sizes:
            if left() < 25:
                log(f"WARN granularity: time budget spent at {k} TPCs", summary=True)
                break
            layouts = ["packed", "striped"]
            rng.shuffle(layouts)
            for layout in layouts:
                if not point(layout, k, order[layout][:k]):
                    break
        point("all-end", H.NTPC, list(range(H.NTPC)))
    finally:
        m.close()
        write_csv("granularity.csv", ["layout", "tpcs", "sms", "list", "i", "ms"], rows)
    log(f"granularity: SGEMM n={n} time (median of {samples}) by partition size, ms", summary=True)
    log(f"{'TPCs':>5} {'packed':>9} {'striped':>9} {'striped/packed':>15}", summary=True)
    srows = []
    for k in sizes:
        p = [r[5] for r in rows if r[0] == "packed" and r[1] == k]
        s = [r[5] for r in rows if r[0] == "striped" and r[1] == k]
        if not p and not s:
            continue
        mp, ms = median(p), median(s)
        log(f"{k:>5} {fmt(mp, 2):>9} {fmt(ms, 2):>9} {fmt(ms / mp if p and s else float('nan')):>15}", summary=True)
        srows.append((k, mp, ms))
    a0 = [r[5] for r in rows if r[0] == "all-start"]
    a1 = [r[5] for r in rows if r[0] == "all-end"]
    if a0 and a1:
        log(f"all TPCs at the start {fmt(median(a0), 2)} ms, at the end {fmt(median(a1), 2)} ms", summary=True)
    write_csv("granularity_summary.csv", ["tpcs", "packed_median_ms", "striped_median_ms"], srows)


