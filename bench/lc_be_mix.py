#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPT-2 inference next to GPT-2-medium training, side by side in one run: a latency-critical (LC)
inference task next to a best-effort (BE) training task, under each way of sharing one GPU.

LC: Hugging Face transformers GPT-2 (GPT2Config's defaults: 12 layers, 768 wide), random weights,
fp16, batch 4 x 256 tokens, forward only, captured once as one CUDA graph and replayed. BE:
GPT-2-medium (24 layers, 1024 wide, 16 heads) training, bf16 autocast, batch 8 x 512, AdamW.
LC load patterns: the closed loop (steps back to back) and the open loop (Poisson arrivals at 44
and 87 requests/s, served one at a time in arrival order, latency from arrival: queueing counts).

Setups (SETUPS, one table): LC alone on the whole GPU and on its reservation (nvtaskset -n 16
--exclusive), BE alone, and both together under time-slicing, MPS without limits, MPS 25/75
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and static nvtaskset -n 16 / -n 50 --exclusive. --with-roles
adds the roles (-n 16 --latency-critical / --best-effort), once nvtaskset has them.

Each round makes every visit once, in a random order (the visits that need the MPS control
daemon grouped, the groups' order random too). A visit starts the workers (this file, hidden
subcommand `_worker lc|be`) once, which build their model once (starting them costs about 15 s,
9 s of it importing transformers' GPT-2), and serves every window of a mix and of the baselines
that start the same way: LC alone runs with the BE worker paused (its context idle, no work
queued), BE alone with the LC worker idle. The windows of a visit (setup x pattern) run in a
random order; every setup of a round gets the same Poisson arrivals (the roles setup's windows
each after 1 s with the LC idle: the roles' budgets carry over from one window to the next). A
window in which the BE task did not progress (fewer than 2 steps, or a stall) is rejected.

Prints, per setup and pattern: LC p50/p99/p99.9 (ms), median [min-max] over rounds; their ratios
to LC alone on the whole GPU and to LC alone on its reservation at the same pattern; BE it/s and
its ratio to BE alone; GPU power (W) and SM clock (MHz), mean/min over the window (NVML, else
nvidia-smi, every 200 ms); and whether the target (TARGETS) is met. For each roles setup, also the
share of each window in which the BE task was stopped for the LC task (held_ms in --status), the
BE's ceiling that leaves (1 minus that share) and the BE's throughput as a share of it. In the
open loop, for each setup of both tasks, the p99 of every round's requests pooled, over LC alone's
pooled the same way (a window's p99 is its few slowest requests; the verdict stays on the medians).

    python3 bench/lc_be_mix.py --out DIR [--nvtaskset PATH] [--reps 3] [--window-s 4] [--with-roles]
    python3 bench/lc_be_mix.py --dry-run          # the plan and its estimated time; starts nothing
    python3 bench/lc_be_mix.py --quick --out DIR  # a smoke of about 2 minutes: 1 round, short windows

Writes DIR/lc_be_mix.csv (one row per setup x pattern x round), DIR/lc_be_mix.json (the summary),
DIR/summary.txt (the tables) and DIR/workers.log. The MPS control daemon it needs runs in its own
pipe and log directories under a temp dir (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, for
the daemon and every client), and is stopped at the end: nothing else on the machine is touched.
torch and transformers are needed on the GPU machine only; --dry-run and --help run without them.
"""
import argparse
import collections
import csv
import ctypes
import json
import math
import os
import random
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)
PCT = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"

# How a worker starts: the argv before `python3 lc_be_mix.py _worker ROLE ...`, and what is
# added to its environment.
Launch = collections.namedtuple("Launch", "prefix env")
# name; whether the MPS control daemon runs; how LC and BE start (None: not started); what it is.
Setup = collections.namedtuple("Setup", "name mps lc be about")

BASE_GPU, BASE_RES, BASE_BE, ROLES = "lc-alone-gpu", "lc-alone-res", "be-alone", "roles"
BASE_SIZED = "lc-alone-res-sized"
# The roles with an L2 persisting window for the LC task (one of the options the roles
# were to evaluate: an L2 persisting carve-out): its worker gives its capture stream a persisting access policy window over its
# largest weight (LCBE_L2_WINDOW), which the captured kernels keep (tests/gpu/l2_window_capture.cu);
# the set-aside itself is the MPS server's (--l2-persist-pct). Only when named in --setups.
ROLES_L2 = "roles-l2"
# BE alone under --best-effort (no LC task): what the role costs a BE task by itself. Only when named.
BE_ROLE_ALONE = "be-alone-role"
# What MPS costs the BE task by itself, apart from the role: BE alone as a plain MPS client, and
# under --best-effort without MPS (--no-mps). Only when named.
BE_MPS_ALONE, BE_ROLE_NOMPS_ALONE = "be-alone-mps", "be-alone-role-nomps"
# The roles' other ways for the BE task to make way (launch pacing), each a
# setup named in --setups: a deeper BE queue, and NVTASKSET_BE_YIELD's floor and run. Since
# nvtaskset sets CUDA_MPS_CLIENT_PRIORITY by role, every roles setup runs its BE at below-normal
# priority; mps-be-low is plain MPS with the BE client so (the GPU then prefers the LC's waiting
# blocks to the BE's).
PRIO_ENV, YIELD_ENV = "CUDA_MPS_CLIENT_PRIORITY", "NVTASKSET_BE_YIELD"
# A --best-effort task's launches in flight while an LC task exists (nvtaskset's options.hpp:
# 1-1024, default 64 under the gate, 4 under the hold); --be-depth sets it for every roles setup's BE.
BE_DEPTH_ENV = "NVTASKSET_BE_DEPTH"
MPS_BE_LOW = "mps-be-low"
# name -> (the BE's environment beyond the roles setup's, what it is)
ROLE_VARIANTS = {
    "roles-d8": ({BE_DEPTH_ENV: "8"}, f"BE queue of 8 launches ({BE_DEPTH_ENV}=8)"),
    "roles-d16": ({BE_DEPTH_ENV: "16"}, f"BE queue of 16 launches ({BE_DEPTH_ENV}=16)"),
    "roles-t250": ({BE_DEPTH_ENV: "256", "NVTASKSET_BE_QUEUE_US": "250"},
                   "BE queue bounded in time: 250 us, at most 256 launches"),
    "roles-t500": ({BE_DEPTH_ENV: "256", "NVTASKSET_BE_QUEUE_US": "500"},
                   "BE queue bounded in time: 500 us, at most 256 launches"),
    "roles-t1000": ({BE_DEPTH_ENV: "256", "NVTASKSET_BE_QUEUE_US": "1000"},
                    "BE queue bounded in time: 1 ms, at most 256 launches"),
    "roles-w250": ({"NVTASKSET_BE_WORK_US": "250"}, "BE queue bounded in learned work: 250 us"),
    "roles-w500": ({"NVTASKSET_BE_WORK_US": "500"}, "BE queue bounded in learned work: 500 us"),
    "roles-w1000": ({"NVTASKSET_BE_WORK_US": "1000"}, "BE queue bounded in learned work: 1 ms"),
    "roles-floor": ({YIELD_ENV: "floor"}, f"BE on its floor while LC bursts ({YIELD_ENV}=floor)"),
    "roles-fd4": ({"NVTASKSET_BE_FLOOR_DEPTH": "4"},
                  "BE queue of 4 launches on its floor too (NVTASKSET_BE_FLOOR_DEPTH=4; the default is 16)"),
    "roles-run": ({YIELD_ENV: "run"}, f"BE not held while LC bursts ({YIELD_ENV}=run)"),
    "roles-gate": ({YIELD_ENV: "gate"}, f"BE stopped on the GPU by its gate while LC bursts ({YIELD_ENV}=gate)"),
    "roles-hold": ({YIELD_ENV: "hold"}, f"BE held on the CPU while LC bursts ({YIELD_ENV}=hold)"),
    "roles-gate1": ({YIELD_ENV: "gate", "NVTASKSET_BE_GATE_EVERY": "1"},
                    f"BE stopped by its gate, one before every launch ({YIELD_ENV}=gate, NVTASKSET_BE_GATE_EVERY=1)"),
    "roles-gate2": ({YIELD_ENV: "gate", "NVTASKSET_BE_GATE_EVERY": "2"},
                    f"BE stopped by its gate, one every 2 launches ({YIELD_ENV}=gate, NVTASKSET_BE_GATE_EVERY=2)"),
    "roles-gate-d64": ({YIELD_ENV: "gate", "NVTASKSET_BE_DEPTH": "64"},
                       f"BE stopped by its gate, 64 launches queued ({YIELD_ENV}=gate, NVTASKSET_BE_DEPTH=64)"),
    "roles-gate2-d64": ({YIELD_ENV: "gate", "NVTASKSET_BE_GATE_EVERY": "2", "NVTASKSET_BE_DEPTH": "64"},
                        f"BE stopped by its gate, one every 2 launches, 64 launches queued ({YIELD_ENV}=gate, "
                        "NVTASKSET_BE_GATE_EVERY=2, NVTASKSET_BE_DEPTH=64)"),
    "roles-d16f16": ({BE_DEPTH_ENV: "16", "NVTASKSET_BE_FLOOR_DEPTH": "16"},
                     f"BE queue of 16 launches, 16 on its floor (the gate's defaults before run 77; {BE_DEPTH_ENV}=16, "
                     "NVTASKSET_BE_FLOOR_DEPTH=16)"),
    "roles-d64f64": ({BE_DEPTH_ENV: "64", "NVTASKSET_BE_FLOOR_DEPTH": "64"},
                     f"BE queue of 64 launches, 64 on its floor ({BE_DEPTH_ENV}=64, NVTASKSET_BE_FLOOR_DEPTH=64)"),
    "roles-b0": ({"NVTASKSET_BE_BORROW_US": "0"},
                 "every BE kernel borrows the idle reservation, long ones too (NVTASKSET_BE_BORROW_US=0)"),
    "roles-b2000": ({"NVTASKSET_BE_BORROW_US": "2000"},
                    "BE kernels timed at 2 ms or more keep off the idle reservation (NVTASKSET_BE_BORROW_US=2000)"),
    "roles-deep": ({BE_DEPTH_ENV: "1024", "NVTASKSET_BE_FLOOR_DEPTH": "1024"},
                   f"BE stopped by its gate, 1024 launches queued, on its floor too ({BE_DEPTH_ENV}=1024, "
                   "NVTASKSET_BE_FLOOR_DEPTH=1024)"),
}
# Other static shapes, LC -n L --exclusive / BE -n B --exclusive (only when named): how many TPCs the
# LC task needs beyond its reservation to run at its speed alone there next to the BE task (the
# memory system is shared; docs/runs.md, "A top-up that pays for the memory system").
STATIC_SHAPES = {f"static-{l}-{b}": (l, b) for l, b in ((20, 46), (24, 42), (28, 38), (32, 34))}
# The roles without the LC task's top-up (NVTASKSET_LC_TOPUP=off): its reservation only while saturated.
ROLES_NO_TOPUP = "roles-no-topup"
# The roles with a BE task that never borrows the reservation (--best-effort -n BE_N, chosen after
# the LC task's -n: the TPCs it leaves): an LC request then starts at once on its reservation
# instead of waiting there for the BE kernels in flight, at the cost of the training's use of it
# while the LC task is idle. Only when named.
ROLES_NO_BORROW = "roles-nb"
OPTIONAL = ((BASE_SIZED, ROLES_L2, BE_ROLE_ALONE, BE_MPS_ALONE, BE_ROLE_NOMPS_ALONE, MPS_BE_LOW, ROLES_NO_TOPUP,
             ROLES_NO_BORROW)
            + tuple(ROLE_VARIANTS) + tuple(STATIC_SHAPES))
ROLE_SETUPS = (ROLES, ROLES_L2, ROLES_NO_TOPUP, ROLES_NO_BORROW) + tuple(ROLE_VARIANTS)
L2_ENV = "LCBE_L2_WINDOW"
L2_PCT_ENV = "CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT"


def setup_table(nv, lc_n, be_n, be_depth=None):
    """THE table of setups."""
    plain = Launch([], {})
    be_role_env = {BE_DEPTH_ENV: str(be_depth)} if be_depth is not None else {}
    lc_res = Launch([nv, "-n", str(lc_n), "--exclusive"], {})
    return [
        Setup(BASE_GPU, False, plain, None, "LC alone, a plain process on the whole GPU (baseline)"),
        Setup(BASE_RES, True, lc_res, None, f"LC alone on its reservation, nvtaskset -n {lc_n} --exclusive (baseline)"),
        Setup(BASE_BE, False, None, plain, "BE alone, a plain process on the whole GPU (baseline)"),
        Setup("time-slicing", False, plain, plain, "both plain processes, no MPS"),
        Setup("mps", True, plain, plain, "both MPS clients, no limits"),
        Setup("mps-25-75", True, Launch([], {PCT: "25"}), Launch([], {PCT: "75"}),
              f"MPS clients, {PCT}=25 (LC) / 75 (BE)"),
        Setup("static", True, lc_res, Launch([nv, "-n", str(be_n), "--exclusive"], {}),
              f"nvtaskset -n {lc_n} --exclusive (LC) / -n {be_n} --exclusive (BE)"),
        # Only when named in --setups: is sizing the task to its partition (cudaDevAttrMultiProcessorCount
        # = its SMs) worth making the default of -n? (docs/runs.md, "Sizing the task to its partition")
        Setup(BASE_SIZED, True, Launch(lc_res.prefix + ["--partition-sm-count"], {}), None,
              f"LC alone on its reservation, sized to it: nvtaskset -n {lc_n} --exclusive --partition-sm-count"),
        # ---- HOOK: the roles. Only with --with-roles (checked against nvtaskset --help). ----
        Setup(ROLES, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {}),
              Launch([nv, "--best-effort"], be_role_env),
              f"nvtaskset -n {lc_n} --latency-critical (LC) / --best-effort (BE)"
              + (f", {BE_DEPTH_ENV}={be_depth}" if be_depth is not None else "")),
        Setup(BE_ROLE_ALONE, True, None, Launch([nv, "--best-effort"], be_role_env),
              "BE alone under nvtaskset --best-effort (an MPS client; no LC task)"),
        Setup(BE_MPS_ALONE, True, None, plain, "BE alone, a plain MPS client (no nvtaskset)"),
        Setup(BE_ROLE_NOMPS_ALONE, False, None, Launch([nv, "--no-mps", "--best-effort"], be_role_env),
              "BE alone under nvtaskset --no-mps --best-effort (no MPS, no LC task)"),
        Setup(MPS_BE_LOW, True, plain, Launch([], {PRIO_ENV: "1"}),
              f"both MPS clients, no limits, BE at below-normal priority ({PRIO_ENV}=1)"),
        Setup(ROLES_NO_TOPUP, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {"NVTASKSET_LC_TOPUP": "off"}),
              Launch([nv, "--best-effort"], be_role_env),
              "the roles, the LC task on its reservation only while saturated (NVTASKSET_LC_TOPUP=off)"),
        Setup(ROLES_NO_BORROW, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {}),
              Launch([nv, "-n", str(be_n), "--best-effort"], be_role_env),
              f"the roles, the BE task on the {be_n} TPCs the reservation leaves (-n {be_n} --best-effort): "
              "it never borrows the reservation"),
        Setup(ROLES_L2, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {L2_ENV: "1"}),
              Launch([nv, "--best-effort"], be_role_env),
              "the roles, the LC task's kernels with a persisting L2 window over its largest weight"),
    ] + [Setup(name, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {}),
               Launch([nv, "--best-effort"], dict(be_role_env, **env)), "the roles, " + about)
         for name, (env, about) in ROLE_VARIANTS.items()] + [
        Setup(name, True, Launch([nv, "-n", str(l), "--exclusive"], {}), Launch([nv, "-n", str(b), "--exclusive"], {}),
              f"nvtaskset -n {l} --exclusive (LC) / -n {b} --exclusive (BE)")
        for name, (l, b) in STATIC_SHAPES.items()]


ROLE_OPTIONS = ("--latency-critical", "--best-effort")

# The mix's targets: pattern -> (baseline the LC p99 is compared with, max ratio, BE minimum,
# whether that minimum is a ratio to BE alone or it/s).
TARGETS = {
    "poisson44": ("gpu", 1.25, 0.90, "ratio"),
    "poisson87": ("gpu", 1.50, 0.80, "ratio"),
    "closed": ("res", 1.10, 8.6, "it/s"),
}

# For the estimate and the time budget (seconds); the run measures the real start-up time and
# uses the largest it saw.
CHECK_S, STARTUP_S, SETTLE_S, TEARDOWN_S, WINDOW_OVERHEAD_S, MPS_TOGGLE_S = 8, 17, 0.5, 2, 0.4, 2
BE_RESUME_S = 0.3  # after BE resumes, before a window starts
# Before each window of the roles setup, the LC idles this long (BE running): the roles keep state
# across windows (the LC's burst budget and the BE's hold budget, exponentially weighted shares of
# time busy; burst_budget.hpp), so a window that follows the closed loop would otherwise start with
# bursting stopped, and on its reservation the LC is busy enough at 44 or 87 req/s (6.6-8.7 ms a
# request, H100) that it might not resume within the window. 1.5 s idle takes the LC's share (time
# constant 1 s) from at most 1 (a long closed loop) to 0.22, below its resume share (0.35), and the
# BE's (200 ms) to nothing. (1 s was enough after 2-s closed windows, whose share ends near 0.6,
# but not after 12-s ones: run 38 had an open-loop window that never burst.)
ROLES_IDLE_S = 1.5
LC_WARMUP_REPLAYS = 10
BE_WARMUP_STEPS = 3


def patterns_of(rates):
    """[(name, rate)]: rate None is the closed loop."""
    return [("closed", None)] + [(f"poisson{r:g}", r) for r in rates]


def window_s(a, rate):
    return a.closed_s if rate is None else a.window_s


# ================================ workers (run on the GPU machine) ================================


def die_with(driver_pid):
    """SIGKILL this worker when its parent dies (nvtaskset execs in place, so that is the
    driver); stdin's EOF, and the driver killing the worker's process group, are the other ways."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    try:
        os.kill(driver_pid, 0)
    except ProcessLookupError:
        os._exit(3)  # the driver died before the line above


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def gpt2_config(transformers, impl, **kw):
    """GPT2Config with an attention implementation (None: the library's default)."""
    if impl is None:
        return transformers.GPT2Config(**kw)
    try:
        return transformers.GPT2Config(attn_implementation=impl, **kw)
    except TypeError:
        cfg = transformers.GPT2Config(**kw)
        cfg._attn_implementation = impl
        return cfg


def build_model(torch, transformers, cfg):
    """GPT2LMHeadModel with random weights, built on the GPU (on the CPU if that fails)."""
    try:
        with torch.device("cuda"):
            return transformers.GPT2LMHeadModel(cfg)
    except Exception as e:  # noqa: BLE001 - any failure: the slower, plain way
        print(f"building on the GPU failed ({e!r}); building on the CPU", flush=True)
        return transformers.GPT2LMHeadModel(cfg).to("cuda")


def versions(torch, transformers):
    return {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
            "device": torch.cuda.get_device_name(0)}


L2_INFO = {}


def l2_window(torch, model, stream):
    """Gives `stream` a persisting L2 access policy window over the model's largest weight, sized
    to the set-aside this context has (outside MPS it asks for the most; under MPS the server's
    CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT decides). Returns what it read back."""
    path = next((l.split()[-1] for l in open("/proc/self/maps") if "libcudart.so" in l), None)
    if path is None:
        return {"error": "no libcudart mapped"}
    rt = ctypes.CDLL(path)
    dev = torch.cuda.current_device()
    v = ctypes.c_int()
    rt.cudaDeviceGetAttribute(ctypes.byref(v), 108, dev)  # cudaDevAttrMaxPersistingL2CacheSize
    max_persist = v.value
    rt.cudaDeviceGetAttribute(ctypes.byref(v), 109, dev)  # cudaDevAttrMaxAccessPolicyWindowSize
    max_window = v.value
    set_rc = rt.cudaDeviceSetLimit(0x06, ctypes.c_size_t(max_persist))  # cudaLimitPersistingL2CacheSize
    got = ctypes.c_size_t()
    rt.cudaDeviceGetLimit(ctypes.byref(got), 0x06)
    w = max(model.parameters(), key=lambda t: t.numel() * t.element_size())
    nbytes = min(w.numel() * w.element_size(), max_window)
    hit = min(1.0, got.value / nbytes) if nbytes else 0.0

    class Window(ctypes.Structure):
        _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                    ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int), ("pad", ctypes.c_char * 36)]
    win = Window(w.data_ptr(), nbytes, hit, 2, 1)  # hit: persisting; miss: streaming
    rc = rt.cudaStreamSetAttribute(ctypes.c_void_p(stream.cuda_stream), 1, ctypes.byref(win))
    back = Window()
    rt.cudaStreamGetAttribute(ctypes.c_void_p(stream.cuda_stream), 1, ctypes.byref(back))
    return {"max_persisting": max_persist, "max_window": max_window, "set_limit_rc": set_rc,
            "set_aside": got.value, "weight_bytes": w.numel() * w.element_size(), "window_bytes": back.num_bytes,
            "hit_ratio": round(back.hitRatio, 3), "set_attr_rc": rc}


def capture_lc(torch, transformers):
    """The LC forward as one CUDA graph; returns (replay, attention implementation). Tries the
    library's default attention, then eager attention if the default cannot be captured."""
    err = None
    for impl in (None, "eager"):
        try:
            cfg = gpt2_config(transformers, impl)
            model = build_model(torch, transformers, cfg).to(dtype=torch.float16).eval()
            ids = torch.randint(0, cfg.vocab_size, (4, 256), device="cuda")
            cap = torch.cuda.Stream()
            if os.environ.get(L2_ENV):
                L2_INFO.update(l2_window(torch, model, cap))
                print(f"LC: L2 window {L2_INFO}", flush=True)
            with torch.no_grad():
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        model(input_ids=ids, use_cache=False)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=cap):
                    out = model(input_ids=ids, use_cache=False).logits
            torch.cuda.synchronize()

            def replay(graph=graph, keep=(model, ids, out)):
                graph.replay()
                torch.cuda.synchronize()

            return replay, getattr(cfg, "_attn_implementation", None) or impl or "default"
        except Exception as e:  # noqa: BLE001 - reported, then the next implementation
            err = e
            print(f"LC: CUDA graph capture with attention {impl or 'default'} failed: {e!r}", flush=True)
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - the next attempt says more
                pass
    raise RuntimeError(f"LC: the forward could not be captured as a CUDA graph: {err!r}")


def wait_until(t):
    d = t - time.monotonic()
    if d > 0.002:
        time.sleep(d - 0.001)
    while time.monotonic() < t:
        pass


def lc_window(replay, cmd):
    """One measurement window: the closed loop for `seconds`, or Poisson arrivals at `rate` over
    `seconds` (the same for every setup with the same seed), served one at a time in order."""
    for _ in range(LC_WARMUP_REPLAYS):
        replay()
    lat, svc, at = [], [], []
    if cmd["rate"] is None:
        t0 = time.monotonic()
        end = t0 + cmd["seconds"]
        e = t0
        while e < end:
            s = time.monotonic()
            replay()
            e = time.monotonic()
            lat.append(e - s)
            at.append(s - t0)
        svc = lat
        t1 = e
    else:
        rng = random.Random(cmd["seed"])
        arrivals, t = [], rng.expovariate(cmd["rate"])
        while t < cmd["seconds"]:
            arrivals.append(t)
            t += rng.expovariate(cmd["rate"])
        t0 = time.monotonic() + 0.05
        for a in arrivals:
            when = t0 + a
            wait_until(when)
            s = time.monotonic()
            replay()
            e = time.monotonic()
            lat.append(e - when)
            svc.append(e - s)
        at = arrivals
        t1 = max(time.monotonic(), t0 + cmd["seconds"])
    return {"t0": t0, "t1": t1, "lat_ms": [round(x * 1e3, 4) for x in lat], "at_s": [round(x, 4) for x in at],
            "svc_ms": [round(x * 1e3, 4) for x in svc] if cmd["rate"] is not None else []}


def lc_worker(ctl):
    import torch
    import transformers
    replay, impl = capture_lc(torch, transformers)
    times = []
    for _ in range(20):
        s = time.monotonic()
        replay()
        times.append((time.monotonic() - s) * 1e3)
    info = versions(torch, transformers)
    info.update({"attn": impl, "step_ms": statistics.median(times)})
    if L2_INFO:
        info["l2"] = L2_INFO
    write_json(os.path.join(ctl, "lc-ready.json"), info)
    while True:
        line = sys.stdin.readline()
        if not line:
            return  # the driver is gone
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            return
        write_json(os.path.join(ctl, f"lc-win-{cmd['id']}.json"), lc_window(replay, cmd))


def next_command(block):
    """The driver's next command; None when none waits (block=False). EOF (the driver is gone)
    reads as quit. The driver sends one command and waits for its answer before the next."""
    if not block and not select.select([sys.stdin], [], [], 0)[0]:
        return None
    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else {"cmd": "quit"}


def be_trainer(torch, transformers):
    """The BE task's work: GPT-2-medium training (random weights, bf16 autocast, batch 8 x 512,
    AdamW); returns one training step (bench/be_cost.py runs it too)."""
    cfg = gpt2_config(transformers, None, n_layer=24, n_embd=1024, n_head=16)
    model = build_model(torch, transformers, cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def be_worker(ctl):
    """Trains until told to quit, except while paused (then no work is queued on the GPU; the
    context stays). Appends each step's completion time (CLOCK_MONOTONIC, read as the step's
    event completes, one step queued behind it so the GPU never waits on us) to be-steps.txt."""
    import torch
    import transformers
    step = be_trainer(torch, transformers)
    s = time.monotonic()
    for _ in range(BE_WARMUP_STEPS):
        step()
    torch.cuda.synchronize()
    info = versions(torch, transformers)
    info.update({"warmup_step_ms": (time.monotonic() - s) * 1e3 / BE_WARMUP_STEPS})
    write_json(os.path.join(ctl, "be-ready.json"), info)
    prev, running = None, True
    with open(os.path.join(ctl, "be-steps.txt"), "a", buffering=1) as log:
        while True:
            cmd = next_command(block=not running)
            if cmd is not None:
                if cmd["cmd"] == "quit":
                    break
                if cmd["cmd"] == "pause" and prev is not None:
                    prev.synchronize()
                    log.write(f"{time.monotonic():.6f}\n")
                    prev = None
                torch.cuda.synchronize()
                running = cmd["cmd"] == "run"
                write_json(os.path.join(ctl, f"be-ack-{cmd['id']}.json"), {"running": running})
                continue
            step()
            ev = torch.cuda.Event()
            ev.record()
            if prev is not None:
                prev.synchronize()
                log.write(f"{time.monotonic():.6f}\n")
            prev = ev
    torch.cuda.synchronize()


def worker_main(argv):
    ap = argparse.ArgumentParser(prog="lc_be_mix.py _worker")
    ap.add_argument("role", choices=("lc", "be"))
    ap.add_argument("--ctl", required=True)
    ap.add_argument("--driver-pid", type=int, required=True)
    w = ap.parse_args(argv)
    die_with(w.driver_pid)
    write_json(os.path.join(w.ctl, f"{w.role}-started.json"), {"pid": os.getpid(), "t": time.monotonic()})
    (lc_worker if w.role == "lc" else be_worker)(w.ctl)


# ================================ the driver ================================


class VisitError(Exception):
    pass


class Interrupted(Exception):
    pass


def on_sigterm(*_):
    raise Interrupted("SIGTERM")


def pct(xs, q):
    """The q-th percentile, linearly interpolated (numpy's default)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    f = int(math.floor(k))
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


class Sampler:
    """GPU power (W) and SM clock (MHz) every `period` s, stamped with CLOCK_MONOTONIC: NVML
    through ctypes (libnvidia-ml.so.1), else `nvidia-smi -lms`."""

    def __init__(self, period=0.2, limit_s=900):
        self.samples, self.period, self.source = [], period, "none"
        self.stop_ev = threading.Event()
        self.proc = None
        self.lib = self._nvml()
        if self.lib is not None:
            self.source = "nvml"
            self.thread = threading.Thread(target=self._nvml_loop, daemon=True)
        elif shutil.which("nvidia-smi"):
            self.source = "nvidia-smi"
            cmd = ["timeout", str(int(limit_s)), "nvidia-smi", "--query-gpu=power.draw,clocks.sm",
                   "--format=csv,noheader,nounits", "-lms", str(int(period * 1000)), "-i", "0"]
            if shutil.which("stdbuf"):
                cmd = ["stdbuf", "-oL"] + cmd
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                         start_new_session=True)
            self.thread = threading.Thread(target=self._smi_loop, daemon=True)
        else:
            self.thread = None
        if self.thread:
            self.thread.start()

    def _nvml(self):
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
            self.h = ctypes.c_void_p()
            lib.nvmlDeviceGetHandleByIndex_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
            if lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.h)) != 0:
                return None
            lib.nvmlDeviceGetClockInfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)]
            lib.nvmlDeviceGetPowerUsage.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]
            return lib
        except (OSError, AttributeError):
            return None

    def _nvml_loop(self):
        while not self.stop_ev.is_set():
            clk, mw = ctypes.c_uint(0), ctypes.c_uint(0)
            if (self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(clk)) == 0  # NVML_CLOCK_SM
                    and self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(mw)) == 0):
                self.samples.append((time.monotonic(), mw.value / 1000, float(clk.value)))
            self.stop_ev.wait(self.period)

    def _smi_loop(self):
        for line in self.proc.stdout:
            try:
                w, mhz = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), w, mhz))

    def window(self, t0, t1):
        s = [x for x in list(self.samples) if t0 <= x[0] <= t1]
        if not s:
            return {"power_mean_w": "", "power_min_w": "", "sm_mhz_mean": "", "sm_mhz_min": "", "samples": 0}
        return {"power_mean_w": round(statistics.mean(x[1] for x in s), 1), "power_min_w": round(min(x[1] for x in s), 1),
                "sm_mhz_mean": round(statistics.mean(x[2] for x in s)), "sm_mhz_min": round(min(x[2] for x in s)),
                "samples": len(s)}

    def stop(self):
        self.stop_ev.set()
        if self.proc is not None:
            kill_group(self.proc)
        if self.thread and self.thread.is_alive():
            self.thread.join(timeout=5)


class RolesPoller:
    """What the roles' controller did during a window: `nvtaskset --status --json` every POLL_S
    (the LC task's state, may_burst, launches and completions, busy periods, stops; the BE task's
    state and its held, floor, queue-wait and floor-skipped counts), kept with the row."""
    POLL_S = 0.2

    def __init__(self, nv, env):
        self.nv, self.env, self.trace = nv, env, []
        self.done = threading.Event()
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self):
        while not self.done.is_set():
            t = time.monotonic()
            try:
                p = subprocess.run([self.nv, "--status", "--json"], env=self.env, capture_output=True, text=True,
                                   timeout=5)
                tasks = json.loads(p.stdout).get("tasks", []) if p.returncode == 0 else []
            except (subprocess.SubprocessError, ValueError, OSError):
                tasks = []
            rec = {"t": round(t, 3)}
            for task in tasks:
                c = task.get("controller") or {}
                if task.get("role") == "latency-critical":
                    rec["lc"] = {k: c.get(k) for k in ("state", "may_burst", "launches", "completed", "busy_periods",
                                                       "busy_ms", "saturations", "heartbeat_age_ms", "probing",
                                                       "topup_size", "topup_ratio", "topup_probes")}
                elif task.get("role") == "best-effort":
                    rec["be"] = {k: c.get(k) for k in ("state", "launches_held", "held_ms", "launches_on_floor",
                                                       "queue_waits", "floor_skipped", "kept_off")}
            self.trace.append(rec)
            self.done.wait(max(0.0, self.POLL_S - (time.monotonic() - t)))

    def stop(self):
        self.done.set()
        self.t.join(timeout=10)
        return self.trace

    @staticmethod
    def summary(trace):
        """Counts of the LC states seen, and the change of the counters over the window."""
        lcs = [r["lc"] for r in trace if "lc" in r]
        bes = [r["be"] for r in trace if "be" in r]
        out = {"polls": len(trace), "lc_states": dict(collections.Counter(x.get("state") for x in lcs))}
        def delta(xs, k):
            v = [x.get(k) for x in xs if isinstance(x.get(k), (int, float))]
            return round(v[-1] - v[0], 1) if len(v) > 1 else None
        for k in ("launches", "completed", "busy_periods", "busy_ms", "saturations"):
            out["lc_" + k] = delta(lcs, k)
        out["lc_max_heartbeat_age_ms"] = max((x.get("heartbeat_age_ms") or 0 for x in lcs), default=None)
        # The top-up (NVTASKSET_LC_TOPUP): its sizes while saturated, and the probes seen.
        out["lc_topup_sizes"] = dict(collections.Counter(
            str(x.get("topup_size")) for x in lcs if x.get("state") == "saturated" and not x.get("probing")))
        out["lc_probing_polls"] = sum(1 for x in lcs if x.get("probing"))
        out["lc_last_topup_ratio"] = next((x.get("topup_ratio") for x in reversed(lcs) if x.get("topup_ratio")), None)
        out["lc_topup_probes"] = delta(lcs, "topup_probes")
        out["be_states"] = dict(collections.Counter(x.get("state") for x in bes))
        for k in ("launches_held", "held_ms", "launches_on_floor", "queue_waits", "floor_skipped", "kept_off"):
            out["be_" + k] = delta(bes, k)
        return out


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def tail(path, n=4000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


class Worker:
    def __init__(self, role, proc, vdir):
        self.role, self.p, self.vdir = role, proc, vdir
        self.log = os.path.join(vdir, role + ".log")

    def failure(self, what):
        lines = [ln for ln in tail(self.log).splitlines() if ln.strip()]
        return VisitError(f"{self.role} worker {what}: {lines[-1].strip() if lines else 'no output'}")

    def wait_json(self, name, timeout):
        path = os.path.join(self.vdir, name)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if os.path.exists(path):
                with open(path) as f:
                    return json.load(f)
            if self.p.poll() is not None:
                raise self.failure(f"exited with status {self.p.returncode}")
            time.sleep(0.02)
        raise self.failure(f"did not write {name} within {timeout:g} s")

    def send(self, obj):
        try:
            self.p.stdin.write(json.dumps(obj) + "\n")
            self.p.stdin.flush()
        except OSError:
            pass


class Driver:
    def __init__(self, a, setups, patterns):
        self.a, self.setups, self.patterns = a, setups, patterns
        self.tmp = tempfile.mkdtemp(prefix="lc_be_mix-")
        self.pipe = os.path.join(self.tmp, "mps-pipe")
        self.mps_log = os.path.join(self.tmp, "mps-log")
        os.makedirs(self.pipe)
        os.makedirs(self.mps_log)
        self.mps_on = False
        self.live = set()
        self.sampler = None
        self.startups = []
        self.t_begin = time.monotonic()
        self.rows, self.visits, self.skipped, self.failed = [], [], [], {}
        self.lines = []

    def say(self, line=""):
        print(line, flush=True)
        self.lines.append(line)

    def env(self, extra):
        e = dict(os.environ)
        e.update({"CUDA_MPS_PIPE_DIRECTORY": self.pipe, "CUDA_MPS_LOG_DIRECTORY": self.mps_log,
                  "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
                  "PYTHONUNBUFFERED": "1"})
        e.update(extra)
        return e

    # ---- the MPS control daemon, in our own pipe directory ----
    def daemon_listens(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(os.path.join(self.pipe, "control"))
            return True
        except OSError:
            return False
        finally:
            s.close()

    def set_mps(self, on):
        if on == self.mps_on:
            return
        if on:
            daemon_env = {L2_PCT_ENV: str(self.a.l2_persist_pct)} if self.a.l2_persist_pct else {}
            p = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env(daemon_env), capture_output=True, text=True,
                               timeout=30)
            if p.returncode != 0:
                raise SystemExit(f"lc_be_mix.py: nvidia-cuda-mps-control -d failed: {(p.stderr or p.stdout).strip()}")
        else:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=self.env({}), capture_output=True,
                           text=True, timeout=30)
        end = time.monotonic() + 15
        while self.daemon_listens() != on and time.monotonic() < end:
            time.sleep(0.1)
        if self.daemon_listens() != on:  # else the setups would silently run in the other mode
            raise SystemExit(f"lc_be_mix.py: the MPS control daemon in {self.pipe} did not "
                             f"{'start' if on else 'stop'} within 15 s")
        time.sleep(0.5)
        self.mps_on = on

    # ---- workers ----
    def start(self, vdir, role, launch):
        cmd = launch.prefix + [sys.executable, HERE, "_worker", role, "--ctl", vdir, "--driver-pid", str(os.getpid())]
        with open(os.path.join(vdir, role + ".log"), "w") as log:
            p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True,
                                 env=self.env(launch.env), start_new_session=True)
        self.live.add(p)
        return Worker(role, p, vdir)

    def stop(self, workers):
        for w in workers:
            w.send({"cmd": "quit"})
            try:
                w.p.stdin.close()
            except OSError:
                pass
        end = time.monotonic() + 30
        for w in workers:
            try:
                w.p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"  {w.role} worker did not quit within 30 s: killed")
            kill_group(w.p)
            self.live.discard(w.p)

    # ---- one visit: a group's workers, every window of its setups ----
    def visit(self, group, rep, seeds):
        """Starts the group's workers once; runs each of its setups' windows, in a random order;
        pauses BE for the windows of a setup without BE (LC alone)."""
        vdir = os.path.join(self.tmp, f"r{rep}-{group[0].name}")
        os.makedirs(vdir)
        lc_launch = next((g.lc for g in group if g.lc), None)
        be_launch = next((g.be for g in group if g.be), None)
        windows = [(g, p, r) for g in group for p, r in (self.patterns if g.lc else [("-", None)])]
        random.shuffle(windows)
        workers = []
        t_start = time.monotonic()
        try:
            lc = be = None
            if lc_launch:
                lc = self.start(vdir, "lc", lc_launch)
                workers.append(lc)
                lc.wait_json("lc-started.json", 60)  # its nvtaskset has published its TPCs: BE chooses after it
            if be_launch:
                be = self.start(vdir, "be", be_launch)
                workers.append(be)
            info = {w.role: w.wait_json(f"{w.role}-ready.json", self.a.ready_timeout) for w in workers}
            startup = time.monotonic() - t_start
            self.startups.append(startup)
            time.sleep(SETTLE_S)
            be_running = True
            for i, (setup, pname, rate) in enumerate(windows):
                if be:
                    be_running = self.set_be(be, bool(setup.be), be_running, i)
                if setup.name in ROLE_SETUPS:
                    time.sleep(ROLES_IDLE_S)
                if setup.lc:
                    poller = RolesPoller(self.a.nvtaskset, self.env({})) if setup.name in ROLE_SETUPS else None
                    lc.send({"cmd": "window", "id": i, "rate": rate, "seconds": window_s(self.a, rate),
                             "seed": seeds[pname]})
                    try:
                        res = lc.wait_json(f"lc-win-{i}.json", window_s(self.a, rate) * 3 + 60)
                    finally:
                        if poller:
                            res_trace = poller.stop()
                    if poller:
                        res["roles_trace"] = res_trace
                else:
                    res = {"t0": time.monotonic()}
                    while time.monotonic() < res["t0"] + self.a.window_s and be.p.poll() is None:
                        time.sleep(0.05)
                    res["t1"] = time.monotonic()
                self.rows.append(self.row(setup, rep, pname, rate, res, be if setup.be else None, vdir))
                if be and be.p.poll() is not None:
                    raise be.failure(f"exited with status {be.p.returncode}")
        finally:
            self.stop(workers)
        self.visits.append({"setups": [g.name for g in group], "rep": rep, "startup_s": round(startup, 2),
                            "workers": info})

    def set_be(self, be, running, now_running, i):
        """Runs or pauses BE; returns its new state. A pause returns once BE has no work queued."""
        if running == now_running:
            return running
        be.send({"cmd": "run" if running else "pause", "id": i})
        be.wait_json(f"be-ack-{i}.json", 60)
        if running:
            time.sleep(BE_RESUME_S)
        return running

    def row(self, setup, rep, pname, rate, res, be, vdir):
        t0, t1 = res["t0"], res["t1"]
        r = {"rep": rep, "setup": setup.name, "pattern": pname, "rate": rate if rate is not None else "",
             "window_s": round(t1 - t0, 3), "valid": 1, "reject_reason": ""}
        lat = res.get("lat_ms")
        if lat is not None:
            r.update({"lc_n": len(lat), "lc_p50_ms": pct(lat, 50), "lc_p99_ms": pct(lat, 99),
                      "lc_p999_ms": pct(lat, 99.9), "lc_mean_ms": statistics.mean(lat) if lat else "",
                      "lc_max_ms": max(lat) if lat else "",
                      "lc_service_p50_ms": pct(res["svc_ms"], 50) if res["svc_ms"] else "",
                      "lc_service_p99_ms": pct(res["svc_ms"], 99) if res["svc_ms"] else ""})
            r["_lat"] = lat
            # The slowest 2% of the window's requests, [start or arrival (s after t0), ms], in time
            # order: where in the window (against the roles' trace) the tail comes from.
            at = res.get("at_s") or []
            if len(at) == len(lat):
                k = max(1, len(lat) // 50)
                r["_slowest"] = sorted([a, x] for a, x in sorted(zip(at, lat), key=lambda p: -p[1])[:k])
            if not lat:
                r.update({"valid": 0, "reject_reason": "LC served no request"})
        if be is not None:
            r.update(be_stats(os.path.join(vdir, "be-steps.txt"), t0, t1))
            why = be_rejection(r, self.a.be_max_gap_s)
            if why and setup.name in ROLE_SETUPS:
                # The roles hold BE's launches back by design (at most 100 ms in a row, best_effort_policy.hpp):
                # a BE that stalls longer is a result of this setup, not a broken window, and
                # rejecting it would drop the very windows that miss the target. Kept, its it/s
                # over the whole window (the stall included), the reason in `note`.
                r["be_its"] = r["be_steps"] / (t1 - t0) if t1 > t0 else 0.0
                r["note"] = "kept (roles): " + why
            elif why and r["valid"]:
                r.update({"valid": 0, "reject_reason": why})
        r.update(self.sampler.window(t0, t1) if self.sampler else {})
        r["t0_mono"] = round(t0, 3)
        if "roles_trace" in res:
            r["_roles_trace"] = res["roles_trace"]
            r["roles"] = RolesPoller.summary(res["roles_trace"])
            stopped = be_stopped_share(r)
            if stopped is not None:
                r["be_stopped"] = stopped
        self.say("  " + row_line(r))
        return r

    # ---- the run ----
    def budget_left(self, group):
        startup = max(self.startups) if self.startups else STARTUP_S
        need = visit_estimate_s(self.a, group, self.patterns, startup) + MPS_TOGGLE_S
        return time.monotonic() - self.t_begin + need <= self.a.budget_s

    def rounds(self):
        for rep in range(self.a.reps):
            seeds = {p: random.Random(f"{self.a.seed}/{rep}/{p}").randrange(2**31) for p, _ in self.patterns}
            by_mode = [[g for g in visit_groups(self.setups) if g[0].mps == m] for m in (False, True)]
            random.shuffle(by_mode)
            for gs in by_mode:
                random.shuffle(gs)
            for group in [g for gs in by_mode for g in gs]:
                names = " + ".join(g.name for g in group)
                if any(g.name in self.failed for g in group):
                    continue
                if not self.budget_left(group):
                    self.skipped.append(f"r{rep + 1} {names}")
                    self.say(f"round {rep + 1}: {names} skipped, the time budget (--budget-s {self.a.budget_s:g}) is spent")
                    continue
                self.set_mps(group[0].mps)
                self.say(f"round {rep + 1}/{self.a.reps}: {names}, {time.monotonic() - self.t_begin:.0f} s into the run")
                try:
                    self.visit(group, rep, seeds)
                except VisitError as e:
                    self.say(f"  FAILED, not run again: {e}")
                    for g in group:
                        self.failed[g.name] = str(e)
                        self.rows.append({"rep": rep, "setup": g.name, "pattern": "", "valid": 0,
                                          "reject_reason": "error: " + str(e)})

    def cleanup(self):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not stop the cleanup
        for p in list(self.live):
            kill_group(p)
        if self.sampler:
            self.sampler.stop()
        try:
            if self.mps_on or self.daemon_listens():
                self.mps_on = True
                self.set_mps(False)
        except (subprocess.TimeoutExpired, SystemExit, OSError) as e:
            print(f"lc_be_mix.py: could not stop the MPS daemon in {self.pipe}: {e}", file=sys.stderr)

    def save_worker_logs(self, out):
        with open(os.path.join(out, "workers.log"), "w") as f:
            for d in sorted(os.listdir(self.tmp)):
                vd = os.path.join(self.tmp, d)
                for name in sorted(os.listdir(vd)) if os.path.isdir(vd) else []:
                    if name.endswith(".log"):
                        f.write(f"==== {d}/{name} (last 20000 characters)\n{tail(os.path.join(vd, name), 20000)}\n")


def be_stats(path, t0, t1):
    try:
        with open(path) as f:
            times = []
            for ln in f:
                try:
                    times.append(float(ln))
                except ValueError:
                    pass
    except OSError:
        times = []
    inside = [t for t in times if t0 <= t <= t1]
    edges = [t0] + inside + [t1]
    gaps = [b - a for a, b in zip(edges, edges[1:])]
    steps = [b - a for a, b in zip(inside, inside[1:])]
    its = (len(inside) - 1) / (inside[-1] - inside[0]) if len(inside) >= 2 and inside[-1] > inside[0] else 0.0
    return {"be_steps": len(inside), "be_its": its, "be_max_gap_s": round(max(gaps), 3),
            "be_median_step_s": round(statistics.median(steps), 4) if steps else ""}


def be_rejection(r, max_gap_s):
    """Why this window is rejected for BE not progressing during it; '' when it did."""
    if r["be_steps"] < 2:
        return f"BE made {r['be_steps']} steps in the window"
    limit = max(max_gap_s, 4 * r["be_median_step_s"]) if r["be_median_step_s"] != "" else max_gap_s
    if r["be_max_gap_s"] > limit:
        return f"BE stalled {r['be_max_gap_s']:.2f} s (limit {limit:.2f} s)"
    return ""


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


# ---- checks and the plan ----

def nvtaskset_knows_roles(nv):
    try:
        p = subprocess.run([nv, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = p.stdout + p.stderr
    return all(o in text for o in ROLE_OPTIONS)


def check_gpu_python(d):
    """torch and transformers import, and CUDA is there (also warms the page cache)."""
    code = ("import json, importlib.util, importlib.metadata as md, torch\n"
            "if importlib.util.find_spec('transformers') is None: raise ImportError('no module named transformers')\n"
            "try: v = md.version('transformers')\n"
            "except md.PackageNotFoundError: v = '?'\n"
            "print(json.dumps({'torch': torch.__version__, 'transformers': v, 'cuda': torch.cuda.is_available()}))")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=d.env({}))
    except subprocess.TimeoutExpired:
        raise SystemExit("lc_be_mix.py: importing torch took over 240 s")
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"lc_be_mix.py: {sys.executable} cannot import torch and transformers: {last}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    if not info["cuda"]:
        raise SystemExit("lc_be_mix.py: torch sees no CUDA GPU")
    return info


def query(cmd, env=None, timeout=30):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def uses_nvtaskset(a, setups):
    return any(a.nvtaskset in ((s.lc.prefix if s.lc else []) + (s.be.prefix if s.be else [])) for s in setups)


def visit_groups(setups):
    """The setups that one visit's workers serve: each mix (LC and BE) with the baselines that
    start the same way, in the same MPS mode (LC alone joins the mix with its LC launch, BE
    paused meanwhile; BE alone joins the mix with its BE launch, LC idle). Worker start-up
    (about 15 s: importing transformers' GPT-2 alone takes 9 s) so happens once per group."""
    groups = [[s] for s in setups if s.lc and s.be]
    for s in setups:
        if s.lc and s.be:
            continue
        home = next((g for g in groups if g[0].lc and g[0].be and g[0].mps == s.mps
                     and (s.lc == g[0].lc if s.lc else s.be == g[0].be)), None)
        if home is not None:
            home.append(s)
        else:
            groups.append([s])
    return groups


def visit_estimate_s(a, group, patterns, startup_s):
    n, w = 0, 0.0
    for s in group:
        n += len(patterns) if s.lc else 1
        w += sum(window_s(a, r) for _, r in patterns) if s.lc else a.window_s
        w += ROLES_IDLE_S * len(patterns) if s.name in ROLE_SETUPS else 0
    return startup_s + SETTLE_S + w + n * WINDOW_OVERHEAD_S + TEARDOWN_S


def estimate_s(a, setups, patterns):
    per_round = sum(visit_estimate_s(a, g, patterns, STARTUP_S) for g in visit_groups(setups))
    modes = {s.mps for s in setups}
    return CHECK_S + a.reps * (per_round + MPS_TOGGLE_S * len(modes))


def show_cmd(launch, role):
    env = " ".join(f"{k}={v}" for k, v in launch.env.items())
    return " ".join(x for x in (env, " ".join(launch.prefix), f"python3 lc_be_mix.py _worker {role}") if x)


def print_plan(a, setups, patterns):
    print(f"setups ({len(setups)}; every worker gets CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY under a temp dir):")
    for s in setups:
        print(f"  {s.name:14s} MPS daemon {'on ' if s.mps else 'off'}  {s.about}")
        for role, launch in (("LC", s.lc), ("BE", s.be)):
            if launch:
                print(f"  {'':14s}   {role}: {show_cmd(launch, role.lower())}")
    print("patterns: " + ", ".join(f"{p} ({window_s(a, r):g}-s window)" for p, r in patterns)
          + f"; BE alone: one {a.window_s:g}-s window per round")
    print("visits (one start of the workers each; LC alone runs with BE paused, BE alone with LC idle): "
          + "; ".join(" + ".join(s.name for s in g) for g in visit_groups(setups)))
    print(f"rounds: {a.reps}; each makes every visit once (MPS-off and MPS-on visits grouped, random order), the "
          f"windows of a visit in a random order, the same Poisson arrivals for every setup of a round")
    print(f"estimated time: {estimate_s(a, setups, patterns) / 60:.1f} min (assuming {STARTUP_S} s to start a setup's "
          f"workers); the run stops starting setups once --budget-s {a.budget_s:g} would be passed")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="lc_be_mix-out", help="directory for the CSV, JSON, summary and logs")
    ap.add_argument("--nvtaskset", default="build/bin/nvtaskset", help="the nvtaskset binary (default %(default)s)")
    ap.add_argument("--reps", type=int, help="rounds (default 3; --quick: 1)")
    ap.add_argument("--window-s", type=float, help="open-loop and BE-alone window, s (default 4; --quick: 2)")
    ap.add_argument("--closed-s", type=float, help="closed-loop window, s (default 3; --quick: 1.5)")
    ap.add_argument("--rates", default="44,87",
                    help="open-loop arrival rates, requests/s, or none for the closed loop only (default %(default)s)")
    ap.add_argument("--lc-tpcs", type=int, default=16, help="the LC reservation, -n (default %(default)s)")
    ap.add_argument("--be-tpcs", type=int, default=50, help="BE's static partition, -n (default %(default)s)")
    ap.add_argument("--setups", help="comma-separated subset of the setups (default: all)")
    ap.add_argument("--with-roles", action="store_true",
                    help="add the roles setup (nvtaskset --latency-critical / --best-effort)")
    ap.add_argument("--be-depth", type=int, default=None,
                    help=f"{BE_DEPTH_ENV} (launches in flight, 1-1024) for the roles setup's BE only (default: unset)")
    ap.add_argument("--quick", action="store_true", help="a smoke of about 2 minutes: 1 round, 2-s windows")
    ap.add_argument("--budget-s", type=float, default=550, help="start no setup that would end after this (default %(default)s)")
    ap.add_argument("--ready-timeout", type=float, default=180, help="s a worker may take to build its model")
    ap.add_argument("--be-max-gap-s", type=float, default=1.0,
                    help="reject a window where BE completed no step for longer than this (or 4 of its median steps)")
    ap.add_argument("--seed", type=int, default=None, help="order and arrivals (default: random, printed)")
    ap.add_argument("--l2-persist-pct", type=int, default=0,
                    help=f"start the MPS control daemon with {L2_PCT_ENV}=P (the L2 set-aside for persisting "
                         "accesses; the setup roles-l2 uses it)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its estimated time; start nothing")
    a = ap.parse_args(argv)
    for name, normal, quick in (("reps", 3, 1), ("window_s", 4.0, 2.0), ("closed_s", 3.0, 1.5)):
        if getattr(a, name) is None:
            setattr(a, name, quick if a.quick else normal)
    closed_only = a.rates.strip() == "none"
    try:
        a.rates = [] if closed_only else [float(x) for x in a.rates.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--rates {a.rates!r}: expected numbers separated by commas, e.g. 44,87, or none")
    if (not a.rates and not closed_only) or any(r <= 0 for r in a.rates):
        ap.error("--rates: positive requests/s expected (or none: the closed loop only)")
    for name in ("reps", "lc_tpcs", "be_tpcs"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("window_s", "closed_s", "budget_s", "ready_timeout", "be_max_gap_s"):
        if not getattr(a, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if a.window_s > 120 or a.closed_s > 120:
        ap.error("--window-s and --closed-s are at most 120 s")
    if a.be_depth is not None and not 1 <= a.be_depth <= 1024:
        ap.error("--be-depth takes 1..1024")
    a.nvtaskset = os.path.abspath(a.nvtaskset)
    table = setup_table(a.nvtaskset, a.lc_tpcs, a.be_tpcs, a.be_depth)
    names = [s.name for s in table]
    if a.setups:
        want = [x.strip() for x in a.setups.split(",") if x.strip()]
        bad = [x for x in want if x not in names]
        if bad:
            ap.error(f"--setups: unknown {', '.join(bad)}; known: {', '.join(names)}")
        if ROLES in want and not a.with_roles:
            ap.error("--setups roles needs --with-roles")
        setups = [s for s in table if s.name in want]
    else:
        setups = [s for s in table if (s.name != ROLES or a.with_roles) and s.name not in OPTIONAL]
    if a.with_roles and ROLES not in [s.name for s in setups]:
        setups.append(table[names.index(ROLES)])
    if a.be_depth is not None and ROLES not in [s.name for s in setups]:
        ap.error("--be-depth sets the roles setup's BE: it needs --with-roles")
    if a.seed is None:
        a.seed = random.randrange(10**6)
    return a, setups


def check_nvtaskset(a, setups):
    """One line and exit 1 when a setup needs nvtaskset and it is missing, or --with-roles and it
    does not know the roles."""
    if not uses_nvtaskset(a, setups):
        return
    if not os.access(a.nvtaskset, os.X_OK):
        raise SystemExit(f"lc_be_mix.py: {a.nvtaskset}: not an executable nvtaskset; build it, or pass --nvtaskset PATH")
    if any(s.name in ROLE_SETUPS for s in setups) and not nvtaskset_knows_roles(a.nvtaskset):
        raise SystemExit(f"lc_be_mix.py: --with-roles: {a.nvtaskset} --help lists no {' / '.join(ROLE_OPTIONS)} "
                         "(the roles are not in this build)")


def main(argv):
    a, setups = parse_args(argv)
    patterns = patterns_of(a.rates)
    random.seed(a.seed)
    if a.dry_run:
        print_plan(a, setups, patterns)
        try:
            check_nvtaskset(a, setups)
        except SystemExit as e:
            print(f"note: a real run would stop here: {e}")
        return
    check_nvtaskset(a, setups)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        if not shutil.which(tool):
            raise SystemExit(f"lc_be_mix.py: {tool} not found in PATH")
    os.makedirs(a.out, exist_ok=True)
    d = Driver(a, setups, patterns)
    signal.signal(signal.SIGTERM, on_sigterm)
    interrupted = None
    try:
        versions_info = check_gpu_python(d)
        gpu = query(["nvidia-smi", "-i", "0", "--query-gpu=name,driver_version,power.limit,clocks.max.sm",
                     "--format=csv,noheader"])
        others = query(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"])
        d.say(f"lc_be_mix: {gpu}; torch {versions_info['torch']}, transformers {versions_info['transformers']}; "
              f"seed {a.seed}; {a.reps} rounds; estimated {estimate_s(a, setups, patterns) / 60:.1f} min")
        if others:
            d.say(f"WARNING: other processes use the GPU: {' | '.join(others.splitlines())}")
        topology = ""
        if uses_nvtaskset(a, setups):  # calibrates the GPU's layout now, if it must, not inside a visit
            topology = query([a.nvtaskset, "--topology"], env=d.env({}), timeout=180)
            d.say("nvtaskset --topology: " + (" | ".join(topology.splitlines()[:3]) or "no output"))
        d.sampler = Sampler(limit_s=a.budget_s + 300)
        d.say(f"power and SM clock from {d.sampler.source}")
        try:
            d.rounds()
        except (Interrupted, KeyboardInterrupt) as e:
            interrupted = repr(e)
            d.say(f"INTERRUPTED ({interrupted}): what was measured so far follows")
    finally:
        d.cleanup()
        d.save_worker_logs(a.out)
    summary = summarize(d.rows, setups, patterns)
    report(d, summary)
    meta = {"argv": sys.argv, "gpu": gpu, "versions": versions_info, "seed": a.seed, "reps": a.reps,
            "window_s": a.window_s, "closed_s": a.closed_s, "rates": a.rates, "lc_tpcs": a.lc_tpcs,
            "be_tpcs": a.be_tpcs, "be_depth": a.be_depth, "be_depth_inherited": os.environ.get(BE_DEPTH_ENV),
            "nvtaskset": a.nvtaskset, "topology": topology, "power_source": d.sampler.source,
            "elapsed_s": round(time.monotonic() - d.t_begin, 1),
            "setups": [{"name": s.name, "mps": s.mps, "about": s.about,
                        "lc": show_cmd(s.lc, "lc") if s.lc else None, "be": show_cmd(s.be, "be") if s.be else None}
                       for s in setups]}
    d.say(f"elapsed {meta['elapsed_s']:.0f} s; written to {a.out}: lc_be_mix.csv, lc_be_mix.json, summary.txt, workers.log")
    meta["interrupted"] = interrupted
    write_outputs(d, summary, meta)
    shutil.rmtree(d.tmp, ignore_errors=True)
    if interrupted or d.failed:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
