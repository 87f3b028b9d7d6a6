#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The evaluation of nvtaskset against the paper's Figs. 11-13 (docs/results.md).

Run on a machine with an NVIDIA GPU, from the repository root, with the
programs built by bench/build_eval.sh in BIN (default .dev/eval):

    python3 bench/eval.py --quick|--full [--bin .dev/eval] [--out DIR] [--sections LIST] [--budget-s S]

Sections (default: all, in this order; each is skipped when the time budget
is spent):
  startup      Fig. 11a: exec -> first kernel, plain / MPS client / nvtaskset
               (no MPS, MPS warm, MPS cold); runs bench_startup.
  latency      Fig. 11b: launch -> first block start, plain vs nvtaskset.
  enforce      Fig. 12: an FP32 SGEMM in half the GPU next to an interferer
               (memory-bound, compute-bound, many short kernels) in the other
               half, under time-slicing, MPS, MPS with
               CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50, nvtaskset (striped TPC
               list and whole GPCs) and green contexts; plus three tasks
               (50% + 25% + 25%) under MPS percentages vs nvtaskset. NVML SM
               clock and power are sampled throughout (trace.csv).
  mechanisms   Fig. 13 (right): the partition sizes each mechanism offers.
  granularity  Fig. 13: SGEMM time at every partition size, packed by GPC
               and striped, changed live with nvtaskset -p.

Everything goes to OUT (CSV files, logs/, summary.txt). Every GPU command has
a timeout; MPS is stopped at the end, on errors and on SIGTERM/SIGINT.
"""
import argparse
import json
import os
import signal
import sys
import time

# The harness and the sections, one module each beside this file; the sections read the run's
# state, which main sets, as eval_harness.NAME.
import eval_harness as H
from eval_harness import NvmlSampler, Terminated, gpcs, log, left, mps_stop, on_signal, ranges, run, unknown_gpc_tpcs
from eval_startup_latency import section_latency, section_startup  # noqa: F401 - called by name
from eval_enforcement import section_enforce  # noqa: F401 - called by name
from eval_granularity import section_granularity, section_mechanisms  # noqa: F401 - called by name

# ---- main --------------------------------------------------------------------------------------------------


SECTIONS = ["startup", "latency", "enforce", "mechanisms", "granularity"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="fewer runs (about 6 minutes in all)")
    g.add_argument("--full", action="store_true", help="the paper's run counts (about 16 minutes in all: run the "
                   "startup section alone, the others together, each within 10 minutes)")
    ap.add_argument("--bin", default=".dev/eval", help="what bench/build_eval.sh built (default .dev/eval)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/nvtaskset-eval"), help="results directory")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of " + ", ".join(SECTIONS))
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting work after this many seconds "
                    "(default 390 quick, 520 full)")
    ap.add_argument("--enforce-n", type=int, default=3072, help="SGEMM size of the enforcement runs")
    ap.add_argument("--granularity-n", type=int, default=4096, help="SGEMM size of the granularity runs")
    H.ARGS = ap.parse_args()
    H.ARGS.quick = not H.ARGS.full
    wanted = [s for s in H.ARGS.sections.split(",") if s]
    bad = [s for s in wanted if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s): {', '.join(bad)}")
    H.OUT = os.path.abspath(H.ARGS.out)
    H.LOGS = os.path.join(H.OUT, "logs")
    os.makedirs(H.LOGS, exist_ok=True)
    H.BIN = os.path.abspath(H.ARGS.bin)
    H.NV = os.path.join(H.BIN, "nvt/bin/nvtaskset")
    H.GW = os.path.join(H.BIN, "cuda/gpuwork")
    H.DEADLINE = H.T0 + (H.ARGS.budget_s or (520 if H.ARGS.full else 390))
    H.LOG = open(os.path.join(H.OUT, "eval.log"), "w")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    missing = [p for p in (H.NV, H.GW, os.path.join(H.BIN, "cuda/first_kernel"),
                           os.path.join(H.BIN, "cuda/launch_latency"), os.path.join(H.BIN, "nvt/bench/bench_startup"))
               if not os.access(p, os.X_OK)]
    if missing:
        log(f"eval: missing programs (run bench/build_eval.sh): {', '.join(missing)}")
        return 2
    status = 0
    try:
        rc, out, err, _ = run(["nvidia-smi", "--query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit",
                               "--format=csv,noheader"], timeout=30)
        log(f"GPU: {out.strip()}  mode: {'full' if H.ARGS.full else 'quick'}", summary=True)
        mps_stop()
        rc, out, err, _ = run([H.NV, "--topology", "--json"], timeout=180)
        if rc != 0:
            log(f"eval: nvtaskset --topology failed: {err.strip()}", summary=True)
            return 1
        H.TOPO = json.loads(out)["devices"][0]
        H.NTPC = len(H.TOPO["tpcs"])
        with open(os.path.join(H.OUT, "topology.json"), "w") as f:
            json.dump(H.TOPO, f, indent=1)
        log(f"topology: {H.NTPC} TPCs, {len(H.TOPO['gpcs'])} GPCs (" +
            ", ".join(f"{g}: {len(t)}" for g, t in gpcs()) + f"), unknown GPC: {ranges(unknown_gpc_tpcs()) or 'none'}",
            summary=True)
        H.SAMPLER = NvmlSampler(H.TOPO["device"]["uuid"], 0.025)
        H.SAMPLER.start()
        for s in wanted:
            if left() < 20:
                log(f"SKIP {s}: time budget spent", summary=True)
                continue
            log(f"== {s} ({left():.0f} s left)")
            t = time.monotonic()
            try:
                globals()[f"section_{s}"]()
            except Terminated:
                raise
            except Exception as e:  # one broken section must not lose the others
                import traceback
                log(f"ERROR section {s}: {e!r}\n{traceback.format_exc()}", summary=True)
                status = 1
            log(f"== {s} took {time.monotonic() - t:.0f} s", summary=True)
    except Terminated as e:
        log(f"eval: terminated ({e})", summary=True)
        status = 130
    finally:
        for p in list(H.PROCS):
            p.kill()
        mps_stop()
        if H.SAMPLER:
            H.SAMPLER.stop()
        with open(os.path.join(H.OUT, "summary.txt"), "w") as f:
            f.write("\n".join(H.SUMMARY) + "\n")
        log(f"eval: done in {time.monotonic() - H.T0:.0f} s; results in {H.OUT}")
    return status


if __name__ == "__main__":
    sys.exit(main())
