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
import array
import bisect
import csv
import ctypes
import json
import math
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.getcwd()
ARGS = None
OUT = None
LOGS = None
BIN = None
NV = None
GW = None  # gpuwork
TOPO = None
NTPC = 0
T0 = time.monotonic()
DEADLINE = None
LOG = None
SUMMARY = []
PROCS = set()
LABEL = ["start"]  # what the GPU is doing now, for the NVML trace


class Terminated(Exception):
    pass


def on_signal(signum, frame):
    raise Terminated(f"signal {signum}")


def log(msg, summary=False):
    print(msg, flush=True)
    LOG.write(msg + "\n")
    LOG.flush()
    if summary:
        SUMMARY.append(msg)


def left():
    return DEADLINE - time.monotonic()


def run(cmd, timeout=60, env=None, input_text=None):
    """Runs cmd in its own session; kills the session on timeout. Returns (rc, out, err, s)."""
    e = dict(os.environ)
    if env:
        e.update(env)
    t0 = time.monotonic()
    try:
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, start_new_session=True)
    except OSError as x:  # a missing program is a failed command, not a crashed evaluation
        LOG.write(f"$ {' '.join(cmd)}  [cannot run: {x}]\n")
        return 127, "", str(x), 0.0
    try:
        out, err = p.communicate(input=input_text, timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        killpg(p.pid)
        try:
            out, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        rc, err = 124, (err or "") + "\n[TIMEOUT]"
    except BaseException:
        killpg(p.pid)
        raise
    dt = time.monotonic() - t0
    LOG.write(f"$ {' '.join(cmd)}  [rc={rc}, {dt:.2f}s]\n{(out or '')[-4000:]}{(err or '')[-4000:]}\n")
    LOG.flush()
    return rc, out or "", err or "", dt


def killpg(pid):
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


class Proc:
    """A long-running program in its own session, stdin and stdout on pipes
    (stdout read line by line by a thread), stderr to logs/NAME.err."""

    def __init__(self, cmd, name, env=None):
        e = dict(os.environ)
        if env:
            e.update(env)
        self.name = name
        self.errpath = os.path.join(LOGS, f"{name}.err")
        self._err = open(self.errpath, "w")
        LOG.write(f"$ {' '.join(cmd)} &  [{name}]\n")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                  env=e, start_new_session=True, bufsize=1)
        self.pid = self.p.pid
        self.q = queue.Queue()
        self.lines = []
        self.eof = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        PROCS.add(self)

    def _read(self):
        try:
            for line in self.p.stdout:
                self.q.put(line.rstrip("\n"))
        except (ValueError, OSError):
            pass
        self.q.put(None)

    def expect(self, regex, timeout):
        """Reads lines until one matches regex (returns the match) or timeout/EOF (None)."""
        end = time.monotonic() + timeout
        while not self.eof:
            rest = end - time.monotonic()
            if rest <= 0:
                return None
            try:
                line = self.q.get(timeout=min(rest, 0.5))
            except queue.Empty:
                if self.p.poll() is not None and self.q.empty() and not self.reader.is_alive():
                    self.eof = True
                continue
            if line is None:
                self.eof = True
                return None
            self.lines.append(line)
            m = re.search(regex, line)
            if m:
                return m
        return None

    def send(self, text):
        try:
            self.p.stdin.write(text + "\n")
            self.p.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def finish(self, timeout):
        """Waits for the exit (killing the session on timeout); drains stdout. Returns rc (124 on timeout)."""
        try:
            self.p.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            killpg(self.pid)
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            rc = 124
        # A daemon started by the task (the MPS control daemon) may hold the
        # pipe open: do not wait for end-of-file.
        self.reader.join(timeout=2)
        while True:
            try:
                line = self.q.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        self._err.close()
        PROCS.discard(self)
        LOG.write(f"[{self.name}] rc={rc}\n" + "\n".join(self.lines[-30:]) + "\n--- stderr tail\n" +
                  open(self.errpath).read()[-2000:] + "\n")
        LOG.flush()
        return rc

    def kill(self):
        killpg(self.pid)
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        PROCS.discard(self)


# ---- MPS -------------------------------------------------------------------------------------------------


def mps_pipe_dir():
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"


def mps_processes():
    """(daemon alive, server alive) for our pipe directory: processes whose
    CUDA_MPS_PIPE_DIRECTORY (the default when unset) names it."""
    control = server = False
    ours = mps_pipe_dir()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                base = os.path.basename(f.read(4096).split(b"\0")[0].decode(errors="replace"))
            if base not in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if (env.get(b"CUDA_MPS_PIPE_DIRECTORY", b"").decode(errors="replace") or "/tmp/nvidia-mps") != ours:
            continue
        control |= base == "nvidia-cuda-mps-control"
        server |= base == "nvidia-cuda-mps-server"
    return control, server


def mps_up():
    c, s = mps_processes()
    return c or s or os.path.exists(os.path.join(mps_pipe_dir(), "control"))


def mps_stop():
    """echo quit | nvidia-cuda-mps-control; waits (at most 20 s) until no daemon or server is left."""
    if not mps_up():
        return True
    try:
        run(["nvidia-cuda-mps-control"], timeout=30, input_text="quit\n")
    except OSError as e:
        log(f"INFO stopping MPS: {e!r}")
    end = time.monotonic() + 20
    while time.monotonic() < end:
        c, s = mps_processes()
        if not c and not s:
            return True
        time.sleep(0.02)
    log("WARN MPS daemon or server still running 20 s after quit")
    return False


def mps_start():
    if os.path.exists(os.path.join(mps_pipe_dir(), "control")) and mps_processes()[0]:
        return True
    # Output to a file, not a pipe: the daemonized process may keep its stdout
    # and stderr open for its whole life, so a pipe would never reach EOF.
    err = ""
    try:
        with open(os.path.join(LOGS, "mps-control-start.log"), "a") as f:
            rc = subprocess.run(["nvidia-cuda-mps-control", "-d"], stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                timeout=30).returncode
    except (OSError, subprocess.TimeoutExpired) as e:
        rc, err = -1, repr(e)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if os.path.exists(os.path.join(mps_pipe_dir(), "control")):
            return True
        time.sleep(0.02)
    log(f"WARN could not start the MPS daemon: rc={rc} {err} (see logs/mps-control-start.log)")
    return False


# ---- NVML trace (libnvidia-ml.so.1 through ctypes; no headers needed) --------------------------------------


class NvmlSampler:
    """Samples the SM clock, power, temperature and clock-event reasons of the
    GPU every `interval` s in a thread; rows go to trace.csv with LABEL."""

    def __init__(self, uuid, interval):
        self.rows = []
        self.ok = False
        self.interval = interval
        self.stop_ev = threading.Event()
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            self.lib.nvmlInit_v2.restype = ctypes.c_int
            if self.lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit failed")
            self.h = ctypes.c_void_p()
            self.lib.nvmlDeviceGetHandleByUUID.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
            if self.lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(self.h)) != 0:
                self.lib.nvmlDeviceGetHandleByIndex_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
                if self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.h)) != 0:
                    raise OSError("no NVML handle")
            for fn, args in (("nvmlDeviceGetClockInfo", [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)]),
                             ("nvmlDeviceGetPowerUsage", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]),
                             ("nvmlDeviceGetTemperature", [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)])):
                getattr(self.lib, fn).argtypes = args
            # Why the clock is where it is (power cap, thermal, ...): renamed
            # from "throttle" to "event" reasons in newer drivers; optional.
            self.reasons_fn = None
            for fn in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
                if hasattr(self.lib, fn):
                    self.reasons_fn = getattr(self.lib, fn)
                    self.reasons_fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]
                    break
            self.ok = True
        except (OSError, AttributeError) as e:
            log(f"WARN NVML unavailable, no clock/power trace: {e!r}")
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self):
        clk, mw, temp = ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0)
        reasons = ctypes.c_ulonglong(0)
        r1 = self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(clk))  # NVML_CLOCK_SM
        r2 = self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(mw))
        r3 = self.lib.nvmlDeviceGetTemperature(self.h, 0, ctypes.byref(temp))  # NVML_TEMPERATURE_GPU
        r4 = self.reasons_fn(self.h, ctypes.byref(reasons)) if self.reasons_fn else -1
        return (clk.value if r1 == 0 else "", mw.value / 1000 if r2 == 0 else "", temp.value if r3 == 0 else "",
                hex(reasons.value) if r4 == 0 else "")

    def _loop(self):
        while not self.stop_ev.is_set():
            t = time.monotonic_ns()
            try:
                self.rows.append((t, LABEL[0]) + self.sample())
            except OSError:
                pass
            self.stop_ev.wait(self.interval)

    def start(self):
        if self.ok:
            self.thread.start()

    def stop(self):
        self.stop_ev.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        with open(os.path.join(OUT, "trace.csv"), "w") as f:
            f.write("t_s,t_mono_ns,label,sm_mhz,power_w,temp_c,clock_event_reasons\n")
            for t, label, clk, pw, temp, rs in list(self.rows):
                f.write(f"{(t - T0_NS) / 1e9:.3f},{t},{label},{clk},{pw},{temp},{rs}\n")

    def between(self, t0, t1):
        """Median SM clock and power between two CLOCK_MONOTONIC stamps."""
        clk = [r[2] for r in self.rows if t0 <= r[0] <= t1 and r[2] != ""]
        pw = [r[3] for r in self.rows if t0 <= r[0] <= t1 and r[3] != ""]
        return (median(clk) if clk else float("nan"), median(pw) if pw else float("nan"))


T0_NS = time.monotonic_ns()
SAMPLER = None


# ---- helpers ---------------------------------------------------------------------------------------------


def ranges(ids):
    ids = sorted(set(ids))
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def median(v):
    s = sorted(v)
    n = len(s)
    if not n:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def pstats(v):
    """min, median, p99 (nearest rank), max."""
    s = sorted(v)
    if not s:
        return dict(n=0, min=float("nan"), med=float("nan"), p99=float("nan"), max=float("nan"))
    k = max(1, math.ceil(0.99 * len(s)))
    return dict(n=len(s), min=s[0], med=median(s), p99=s[k - 1], max=s[-1])


def fmt(x, nd=3):
    return "nan" if x != x else f"{x:.{nd}f}"


def gpcs():
    return sorted(((g["gpc"], sorted(g["tpcs"])) for g in TOPO["gpcs"]), key=lambda g: g[0])


def unknown_gpc_tpcs():
    return sorted(t["tpc"] for t in TOPO["tpcs"] if t["gpc"] is None)


def gpc_half():
    """Whole GPCs holding as close to half the TPCs as possible (then fewer rather
    than more): (GPC list, their TPCs, every other TPC)."""
    gs = gpcs()
    target = NTPC // 2
    best = None
    for mask in range(1, 1 << len(gs)):
        chosen = [gs[i] for i in range(len(gs)) if mask >> i & 1]
        s = sum(len(t) for _, t in chosen)
        key = (abs(s - target), s > target, mask)
        if best is None or key < best[0]:
            best = (key, chosen)
    chosen = best[1]
    mine = sorted(t for _, ts in chosen for t in ts)
    return [g for g, _ in chosen], mine, sorted(set(range(NTPC)) - set(mine))


def packed_order():
    """TPCs GPC by GPC (each GPC's TPCs together), TPCs of unknown GPC last."""
    order = [t for _, ts in gpcs() for t in ts]
    return order + [t for t in unknown_gpc_tpcs() if t not in order]


def parse_calib(lines):
    """{tag: (offset_ns, halfwidth_ns, at_ns, ok)} from 'calib TAG ...' lines."""
    out = {}
    for l in lines:
        m = re.match(r"calib (\S+) offset_ns (-?\d+) halfwidth_ns (-?\d+) at_ns (\d+) ok (\d)", l)
        if m:
            out[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5) == "1")
    return out


def to_host(stamps, calib):
    """%globaltimer stamps -> CLOCK_MONOTONIC, with the offset interpolated between
    the 'begin' and 'end' calibrations (one of them when the other is missing)."""
    b, e = calib.get("begin"), calib.get("end")
    if not b and not e:
        return None
    b = b or e
    e = e or b
    o0, _, a0, _ = b
    o1, _, a1, _ = e
    slope = (o1 - o0) / (a1 - a0) if a1 != a0 else 0.0
    return sorted(g - (o0 + slope * ((g - o0) - a0)) for g in stamps)


def read_u64(path):
    a = array.array("Q")
    try:
        with open(path, "rb") as f:
            a.frombytes(f.read())
    except OSError:
        return []
    return list(a)


def write_csv(name, header, rows):
    # The csv module quotes a field that holds a comma (granularity.csv's TPC list "0-1,8-9,16").
    with open(os.path.join(OUT, name), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for r in rows:
            w.writerow("" if x is None else (fmt(x, 4) if isinstance(x, float) else str(x)) for x in r)


# ---- Fig. 11a: start-up ------------------------------------------------------------------------------------


def section_startup():
    """Start-up with the GPU idle (no process holds it), then with it held open by another process
    (first_kernel --hold, outside MPS): the driver then skips bringing the GPU up."""
    rounds = 100 if ARGS.full else 20
    for held in (False, True):
        budget = min(left() - 30, 480 if ARGS.full else 110)
        if budget < 20:
            log("SKIP startup: no time left")
            return
        tag = "_held" if held else ""
        cmd = [os.path.join(BIN, "nvt/bench/bench_startup"), "--child", os.path.join(BIN, "cuda/first_kernel"),
               "--nvtaskset", NV, "--list", f"0-{NTPC // 2 - 1}", "--rounds", str(rounds),
               "--csv", os.path.join(OUT, f"startup{tag}.csv"),
               "--summary-csv", os.path.join(OUT, f"startup{tag}_summary.csv"),
               "--log", os.path.join(LOGS, f"startup{tag}.log"), "--budget-s", str(int(budget)), "--timeout-s", "60"]
        holder = None
        # mps-client-q (an MPS client with nvtaskset's hardware queues) splits nvtaskset's own cost from the
        # queues'. The cold configuration is left out when held: it stops the MPS daemon, which the holder does
        # not need.
        cmd += ["--configs", "plain,nvt-nomps," + ("" if held else "nvt-cold,") + "mps-client,nvt-warm,mps-client-q"]
        if held:
            holder = subprocess.Popen([os.path.join(BIN, "cuda/first_kernel"), "--hold"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            if not holder.stdout.readline().startswith("first_kernel"):
                log("WARN startup: the process holding the GPU open did not start", summary=True)
        LABEL[0] = "startup" + (" (GPU held open)" if held else " (GPU idle)")
        log(f"-- {LABEL[0]}", summary=True)
        try:
            rc, out, err, dt = run(cmd, timeout=budget + 200)
        finally:
            if holder is not None:
                holder.stdin.close()
                try:
                    holder.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    holder.kill()
        for line in out.strip().splitlines():
            log(line, summary=True)
        if rc != 0:
            log(f"WARN bench_startup rc={rc} ({dt:.0f} s): {err.strip()[-600:]}", summary=True)
        mps_stop()


# ---- Fig. 11b: launch latency ------------------------------------------------------------------------------


def section_latency():
    rounds = 7 if ARGS.full else 3
    launches = 10000 if ARGS.full else 2000
    half, full = f"0-{NTPC // 2 - 1}", f"0-{NTPC - 1}"
    configs = [("plain", [], False), (f"nvt-nomps -t {half}", [NV, "--no-mps", "-t", half], False),
               (f"nvt-nomps -t {full}", [NV, "--no-mps", "-t", full], False),
               ("mps-client", [], True), (f"nvt-mps -t {half}", [NV, "-t", half], True)]
    rows, summ = [], {c[0]: [] for c in configs}
    rng = random.Random(11)
    path = os.path.join(LOGS, "latency-samples.csv")
    done = 0
    for r in range(rounds):
        if left() < 60:
            log("WARN latency: time budget spent; stopping early", summary=True)
            break
        for use_mps in (False, True):
            (mps_start if use_mps else mps_stop)()
            group = [c for c in configs if c[2] == use_mps]
            rng.shuffle(group)
            for name, prefix, _ in group:
                LABEL[0] = f"latency/{name}"
                rc, out, err, _ = run(prefix + [os.path.join(BIN, "cuda/launch_latency"), "--launches", str(launches),
                                                "--samples-out", path], timeout=180)
                m = re.search(r"summary .* halfwidth_ns (\d+) drift_ns (-?\d+)", out)
                res = re.search(r"timer_resolution_ns (\d+)", out)
                if rc != 0 or not m:
                    log(f"WARN latency {name} round {r}: rc={rc} {err.strip()[-300:]}", summary=True)
                    continue
                with open(path) as f:
                    next(f)
                    for i, line in enumerate(f):
                        lat, call, rt, lastb = (float(x) for x in line.split(","))
                        rows.append((r, name, i, lat / 1e3, call / 1e3, rt / 1e3, lastb / 1e3))
                summ[name].append((r, int(m.group(1)), int(m.group(2)), int(res.group(1)) if res else -1))
        done += 1
    mps_stop()
    write_csv("latency.csv", ["round", "config", "i", "latency_us", "call_us", "roundtrip_us", "last_block_us"], rows)
    by = {c[0]: [x[3] for x in rows if x[1] == c[0]] for c in configs}
    calls = {c[0]: [x[4] for x in rows if x[1] == c[0]] for c in configs}
    per_round = {}
    for x in rows:
        per_round.setdefault((x[1], x[0]), []).append(x[3])
    pmed = stats_or_nan(by["plain"])
    log(f"launch latency (host stamp before the launch -> first block's %globaltimer), us; {done} rounds of "
        f"{launches} launches per configuration, interleaved", summary=True)
    log(f"{'config':<22} {'n':>6} {'min':>8} {'median':>8} {'p99':>8} {'max':>9} {'x plain':>8} {'paired':>7} "
        f"{'call med':>9} {'+-clock':>8} {'timer res':>9}", summary=True)
    srows = []
    for name, _, _ in configs:
        s = pstats(by[name])
        paired = [median(per_round[(name, r)]) / median(per_round[("plain", r)]) for r in range(rounds)
                  if (name, r) in per_round and ("plain", r) in per_round]
        hw = max((x[1] for x in summ[name]), default=-1) / 1e3
        res = max((x[3] for x in summ[name]), default=-1)
        ratio = s["med"] / pmed if pmed == pmed else float("nan")
        log(f"{name:<22} {s['n']:>6} {fmt(s['min'], 2):>8} {fmt(s['med'], 2):>8} {fmt(s['p99'], 2):>8} "
            f"{fmt(s['max'], 1):>9} {fmt(ratio):>7}x {fmt(median(paired)):>6}x {fmt(median(calls[name]), 2):>9} "
            f"{fmt(hw, 2):>8} {res:>7}ns", summary=True)
        srows.append((name, s["n"], s["min"], s["med"], s["p99"], s["max"], ratio, median(paired), median(calls[name]),
                      hw, res))
    write_csv("latency_summary.csv", ["config", "n", "min_us", "median_us", "p99_us", "max_us", "ratio_to_plain",
                                      "paired_ratio_to_plain", "call_median_us", "clock_halfwidth_us",
                                      "timer_resolution_ns"], srows)
    log("(+-clock: the half-width of the host/GPU clock calibration, a bound on the error of each latency; "
        "paired: median of per-round median ratios)", summary=True)


def stats_or_nan(v):
    return median(v) if v else float("nan")


# ---- Fig. 12: enforcement ----------------------------------------------------------------------------------


class Measured:
    """gpuwork sgemm --serve under a mechanism's prefix/environment."""

    def __init__(self, prefix, env, name, n, trace):
        self.trace = trace
        self.p = Proc(prefix + [GW, "sgemm", "--serve", "--n", str(n)], name, env)
        self.ok = self.p.expect(r"^ready$", 180) is not None
        info = [l for l in self.p.lines if l.startswith("sgemm ")]
        self.info = info[0] if info else ""
        if not self.ok:
            self.p.finish(10)
            log(f"WARN {name}: the measured task did not start: {open(self.p.errpath).read().strip()[-400:]}",
                summary=True)

    def batch(self, label, count, timeout):
        LABEL[0] = f"{self.trace}/{label}"
        start = len(self.p.lines)
        if not self.p.send(f"run {label} {count}") or not self.p.expect(rf"^done {re.escape(label)} ", timeout):
            return None
        out = []
        for l in self.p.lines[start:]:
            m = re.match(r"s (\S+) (\d+) (\d+) (\d+) (\d+) (\d+)$", l)
            if m and m.group(1) == label:
                out.append(tuple(int(m.group(k)) for k in range(2, 7)))  # i, t0, t1, g0, g1
        return out

    def close(self):
        self.p.send("quit")
        return self.p.finish(30)


class Interf:
    """gpuwork interfere KIND under a prefix/environment, stopped through a file."""

    def __init__(self, prefix, env, kind, tag):
        self.kind, self.tag = kind, tag
        self.stamps = os.path.join(LOGS, f"{tag}.u64")
        self.stopf = os.path.join(LOGS, f"{tag}.stop")
        for f in (self.stamps, self.stopf):
            if os.path.exists(f):
                os.remove(f)
        self.p = Proc(prefix + [GW, "interfere", "--kind", kind, "--stamps", self.stamps, "--stop-file", self.stopf,
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
    if samples and SAMPLER and SAMPLER.ok and trace_window:
        clk, pw = SAMPLER.between(samples[0][1], samples[-1][2])
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
    prefix = os.path.join(LOGS, "enf-green")
    LABEL[0] = "enforce/green/all"
    p = Proc([GW, "green", "--n", str(n), "--samples", str(samples), "--kinds", "mem,compute,short",
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
    samples = 1000 if ARGS.full else 100
    n = ARGS.enforce_n
    half = NTPC // 2
    striped_m, striped_i = ranges(range(half)), ranges(range(half, NTPC))
    q = half + (NTPC - half) // 2
    g_list, g_mine, g_rest = gpc_half()
    log(f"INFO enforcement partitions: striped measured -t {striped_m} / interferer -t {striped_i}; GPC-aligned "
        f"measured -g {ranges(g_list)} ({len(g_mine)} TPCs: {ranges(g_mine)}) / interferer -t {ranges(g_rest)}; "
        f"three tasks: -t {striped_m} / -t {ranges(range(half, q))} / -t {ranges(range(q, NTPC))}", summary=True)
    p50 = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    p25 = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    mechs_nomps = [dict(name="timeslice", m=([], {}), i=([], {}))]
    mechs_mps = [
        dict(name="mps", m=([], {}), i=([], {})),
        dict(name="mps50", m=([], p50), i=([], p50), three=(([], p25), ([], p25))),
        dict(name="nvt-striped", m=([NV, "-t", striped_m], {}), i=([NV, "-t", striped_i], {}),
             three=(([NV, "-t", ranges(range(half, q))], {}), ([NV, "-t", ranges(range(q, NTPC))], {}))),
        dict(name="nvt-gpc", m=([NV, "-g", ranges(g_list)], {}), i=([NV, "-t", ranges(g_rest)], {})),
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


# ---- Fig. 13: granularity ----------------------------------------------------------------------------------


MECH_ROWS = []


def section_mechanisms():
    LABEL[0] = "mechanisms"
    sms = TOPO["device"]["sm_count"]
    per_tpc = sms // NTPC if NTPC else 2
    mps_stop()
    rc, out, err, _ = run([GW, "green-query"], timeout=120)
    for m in re.finditer(r"green_sizes flags (\d+) count (\d+) sizes (\S*)", out):
        what = "green contexts" + (" (no co-scheduling guarantee)" if m.group(1) != "0" else "")
        MECH_ROWS.append((what, "measured (cuDevSmResourceSplitByCount)", int(m.group(2)), m.group(3).replace(",", " "),
                          "one split: groups of this size plus a remainder"))
    if rc != 0:
        log(f"WARN green-query rc={rc} {err.strip()[-300:]}", summary=True)
    if mps_start():
        rc, out, err, _ = run([GW, "mps-affinity", "--max-s", "60" if ARGS.full else "30"], timeout=120)
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
    MECH_ROWS.append(("nvtaskset -t (TPC lists)", "by construction (measured: docs/verification.md)", NTPC,
                      " ".join(str(k * per_tpc) for k in range(1, NTPC + 1)),
                      f"any of the 2^{NTPC}-1 TPC sets, changeable live"))
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
    samples = 10 if ARGS.full else 3
    n = ARGS.granularity_n
    if ARGS.full:
        sizes = list(range(1, NTPC + 1))
    else:
        sizes = sorted({1, 2, 3, 4, NTPC // 2, NTPC} | set(range(6, NTPC, 6)))
    mps_stop()  # a --no-mps task would otherwise become a client of a running daemon
    full = ranges(range(NTPC))
    m = Measured([NV, "--no-mps", "-t", full], {}, "granularity", n, "granularity")
    if not m.ok:
        return
    log(f"INFO granularity: {m.info}")
    rows = []
    order = {"packed": packed_order(), "striped": list(range(NTPC))}
    rng = random.Random(13)

    def point(layout, k, lst):
        rc, out, err, _ = run([NV, "-p", "-t", ranges(lst), str(m.p.pid)], timeout=30)
        if rc != 0:
            log(f"WARN granularity: -p -t {ranges(lst)} rc={rc} {err.strip()}", summary=True)
            return False
        res = m.batch(f"gran-{layout}-{k}", samples, 120 + samples * 5)
        if res is None:
            log(f"WARN granularity: batch {layout} {k} failed", summary=True)
            return False
        for i, t0, t1, g0, g1 in res:
            rows.append((layout, k, len(lst) * (TOPO["device"]["sm_count"] // NTPC), ranges(lst), i, (t1 - t0) / 1e6))
        return True

    try:
        point("all-start", NTPC, list(range(NTPC)))
        for k in sizes:
            if left() < 25:
                log(f"WARN granularity: time budget spent at {k} TPCs", summary=True)
                break
            layouts = ["packed", "striped"]
            rng.shuffle(layouts)
            for layout in layouts:
                if not point(layout, k, order[layout][:k]):
                    break
        point("all-end", NTPC, list(range(NTPC)))
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


# ---- main --------------------------------------------------------------------------------------------------


SECTIONS = ["startup", "latency", "enforce", "mechanisms", "granularity"]


def main():
    global ARGS, OUT, LOGS, BIN, NV, GW, TOPO, NTPC, DEADLINE, LOG, SAMPLER
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
    ARGS = ap.parse_args()
    ARGS.quick = not ARGS.full
    wanted = [s for s in ARGS.sections.split(",") if s]
    bad = [s for s in wanted if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s): {', '.join(bad)}")
    OUT = os.path.abspath(ARGS.out)
    LOGS = os.path.join(OUT, "logs")
    os.makedirs(LOGS, exist_ok=True)
    BIN = os.path.abspath(ARGS.bin)
    NV = os.path.join(BIN, "nvt/bin/nvtaskset")
    GW = os.path.join(BIN, "cuda/gpuwork")
    DEADLINE = T0 + (ARGS.budget_s or (520 if ARGS.full else 390))
    LOG = open(os.path.join(OUT, "eval.log"), "w")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    missing = [p for p in (NV, GW, os.path.join(BIN, "cuda/first_kernel"), os.path.join(BIN, "cuda/launch_latency"),
                           os.path.join(BIN, "nvt/bench/bench_startup")) if not os.access(p, os.X_OK)]
    if missing:
        log(f"eval: missing programs (run bench/build_eval.sh): {', '.join(missing)}")
        return 2
    status = 0
    try:
        rc, out, err, _ = run(["nvidia-smi", "--query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit",
                               "--format=csv,noheader"], timeout=30)
        log(f"GPU: {out.strip()}  mode: {'full' if ARGS.full else 'quick'}", summary=True)
        mps_stop()
        rc, out, err, _ = run([NV, "--topology", "--json"], timeout=180)
        if rc != 0:
            log(f"eval: nvtaskset --topology failed: {err.strip()}", summary=True)
            return 1
        TOPO = json.loads(out)["devices"][0]
        NTPC = len(TOPO["tpcs"])
        with open(os.path.join(OUT, "topology.json"), "w") as f:
            json.dump(TOPO, f, indent=1)
        log(f"topology: {NTPC} TPCs, {len(TOPO['gpcs'])} GPCs (" +
            ", ".join(f"{g}: {len(t)}" for g, t in gpcs()) + f"), unknown GPC: {ranges(unknown_gpc_tpcs()) or 'none'}",
            summary=True)
        SAMPLER = NvmlSampler(TOPO["device"]["uuid"], 0.025)
        SAMPLER.start()
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
        for p in list(PROCS):
            p.kill()
        mps_stop()
        if SAMPLER:
            SAMPLER.stop()
        with open(os.path.join(OUT, "summary.txt"), "w") as f:
            f.write("\n".join(SUMMARY) + "\n")
        log(f"eval: done in {time.monotonic() - T0:.0f} s; results in {OUT}")
    return status


if __name__ == "__main__":
    sys.exit(main())
