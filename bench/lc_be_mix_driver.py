# SPDX-License-Identifier: Apache-2.0
"""bench/lc_be_mix.py's driver: the MPS control daemon in its own pipe directory, the workers of a visit
(started as `lc_be_mix.py _worker ROLE`), the rounds of visits within the time budget, the GPU's
power and clock (Sampler), the roles' --status trace (RolesPoller) and one row per window.
"""
import collections
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from lc_be_mix_plan import visit_estimate_s, visit_groups
from lc_be_mix_report import be_stopped_share, pct, row_line
from lc_be_mix_setups import (BE_RESUME_S, L2_PCT_ENV, MPS_TOGGLE_S, ROLE_SETUPS, ROLES_IDLE_S, SETTLE_S, STARTUP_S,
                              window_s)

# The script a worker runs as, `python3 lc_be_mix.py _worker ROLE ...`: the entry beside this file.
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lc_be_mix.py")


# ================================ the driver ================================


class VisitError(Exception):
    pass


class Interrupted(Exception):
    pass


def on_sigterm(*_):
    raise Interrupted("SIGTERM")



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

