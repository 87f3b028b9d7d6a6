# SPDX-License-Identifier: Apache-2.0
"""bench/eval.py's harness: the run's state (set by eval.py's main: its options, output and program
paths, the GPU's topology, the time budget), the log and summary, commands and long-running
programs with timeouts (run, Proc, Measured: gpuwork sgemm --serve), the MPS daemon, the NVML
trace and the helpers every section shares. The sections read the state as eval_harness.NAME.
"""
import array
import csv
import ctypes
import math
import os
import queue
import re
import subprocess
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


# ---- the measured task (Figs. 12 and 13) -------------------------------------------------------------------


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

