#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Real-GPU verification of nvtaskset (docs/verification.md records the results).

Run from the repository root on a machine with an NVIDIA GPU, with the build in
./build and the CUDA check programs (tests/gpu/*.cu, built with nvcc) in $GPUBIN:

    GPUBIN=.dev/gpu OUT=/tmp/out python3 tests/gpu/verify.py [section ...]

Every GPU command has a timeout. Each check prints PASS/FAIL with its evidence;
the exit status is the number of failures. Sections: calibrate, probe, lists,
gpc, live, mps, torch, bench, errors, multi (needs 2 GPUs), systemwide, graphs,
clusters, libclusters, torchgraphs, graphoverhead, graphbench, hardening, sharing,
racing, multiuser, smcount, startupcache, roles,
trust (never silently unpartitioned; needs root; tests/gpu/run_trust.sh runs it)
(default: all).
"""
import json
import os
import random
import re
import subprocess
import sys
import time

ROOT = os.getcwd()
BUILD = os.path.join(ROOT, os.environ.get("NVT_BUILD", "build"))
NV = os.path.join(BUILD, "bin/nvtaskset")
SHIM_DIR = os.path.join(BUILD, "lib/nvtaskset")
GPUBIN = os.path.abspath(os.environ.get("GPUBIN", ".dev/gpu"))
OUT = os.environ.get("OUT", "/tmp/nvtaskset-verify")
os.makedirs(OUT, exist_ok=True)
LOG = open(os.path.join(OUT, "verify.log"), "w")
failures = 0
topo = None  # device 0 topology (JSON)


def log(msg):
    print(msg, flush=True)
    LOG.write(msg + "\n")
    LOG.flush()


def run(cmd, timeout=60, env=None, quiet=False):
    """Runs cmd (a list); returns (rc, stdout, stderr, seconds)."""
    e = dict(os.environ)
    if env:
        e.update(env)
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as x:
        rc, out, err = 124, x.stdout or "", (x.stderr or "") + "\n[TIMEOUT]"
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        if isinstance(err, bytes):
            err = err.decode(errors="replace")
    dt = time.monotonic() - t0
    if not quiet:
        LOG.write(f"$ {' '.join(cmd)}  [rc={rc}, {dt:.2f}s]\n{out}{err}\n")
        LOG.flush()
    return rc, out, err, dt


def check(name, ok, detail=""):
    global failures
    if not ok:
        failures += 1
    log(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")


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


def parse_ranges(s):
    ids = set()
    for part in s.split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            ids.update(range(int(a), int(b) + 1))
        else:
            ids.add(int(part))
    return ids


def probe_tpcs(prefix, timeout=60, env=None):
    """Runs smid_probe (1 kernel) under `prefix`; returns the TPC set or None."""
    rc, out, err, _ = run(prefix + [f"{GPUBIN}/smid_probe", "--iters", "1"], timeout=timeout, env=env)
    m = re.search(r"iter 0 sms \d+ tpcs (\S+)", out)
    return (parse_ranges(m.group(1)) if m and rc == 0 else None), rc, err


def ntpcs():
    return len(topo["tpcs"])


def section_calibrate():
    global topo
    times, maps = [], []
    for i in range(3):
        rc, out, err, dt = run([NV, "--calibrate", "--json"], timeout=180)
        check(f"calibration run {i + 1}", rc == 0, f"{dt:.2f}s wall, rc={rc} {err.strip()[-300:]}")
        if rc != 0:
            continue
        d = json.loads(out)["devices"][0]
        times.append(dt)
        maps.append(d)
    if not maps:
        return
    topo = maps[0]
    with open(os.path.join(OUT, "topology.json"), "w") as f:
        json.dump(topo, f, indent=1)
    key = lambda d: json.dumps([d["tpcs"], d["gpcs"]], sort_keys=True)
    check("calibration repeatable", all(key(m) == key(maps[0]) for m in maps),
          f"{len(maps)} runs, identical maps: {len({key(m) for m in maps}) == 1}")
    check("calibration under 5 s", max(times) < 5.0, "wall times " + ", ".join(f"{t:.2f}s" for t in times))
    bits = [t["bit"] for t in topo["tpcs"]]
    log(f"INFO map: {len(bits)} TPCs, bits {sorted(bits)}")
    log(f"INFO bits >= 64: {sum(b >= 64 for b in bits)}; max bit {max(bits)}; identity: {bits == list(range(len(bits)))}")
    log(f"INFO gpcs: " + "; ".join(f"gpc {g['gpc']}: {len(g['tpcs'])} tpcs max_cluster {g['max_cluster']}" for g in topo["gpcs"]))
    unknown = [t["tpc"] for t in topo["tpcs"] if t["gpc"] is None]
    log(f"INFO TPCs of unknown GPC: {ranges(unknown) or 'none'}")
    rc, out, err, _ = run([NV, "--topology"], timeout=60)
    check("--topology prints from the cache", rc == 0, out.splitlines()[0] if out else err)
    with open(os.path.join(OUT, "topology.txt"), "w") as f:
        f.write(out)


def section_probe():
    n = ntpcs()
    tp, rc, err = probe_tpcs([], env={"LD_LIBRARY_PATH": SHIM_DIR + ":" + os.environ.get("LD_LIBRARY_PATH", "")})
    check("no partition: shim loaded, all TPCs used", tp == set(range(n)), f"tpcs {ranges(tp or [])} rc={rc}")
    # --physical: every working bit except those of two TPCs.
    a, b = 0, n // 2 + 3
    bits = {t["tpc"]: t["bit"] for t in topo["tpcs"]}
    mask = 0
    for t, bit in bits.items():
        if t not in (a, b):
            mask |= 1 << bit
    tp, rc, err = probe_tpcs([NV, "--no-mps", "--physical", hex(mask)])
    check("--physical: exactly the two TPCs whose bits are off vanish", tp == set(range(n)) - {a, b},
          f"disabled bits {bits[a]},{bits[b]} (TPCs {a},{b}); ran on {ranges(tp or [])}")
    dead = [k for k in range(128) if k not in bits.values()]
    rc, out, err, dt = run([NV, "--no-mps", "--physical", hex(1 << dead[0]), f"{GPUBIN}/smid_probe"], timeout=30)
    check("--physical with only a non-working bit is refused, no hang", rc == 1 and dt < 20,
          f"bit {dead[0]}: rc={rc} {err.strip()}")


def section_lists():
    n = ntpcs()
    rng = random.Random(2026)
    lists = [[0], [n - 1], list(range(n))]
    while len(lists) < 22:
        k = rng.randint(1, n - 1)
        lists.append(sorted(rng.sample(range(n), k)))
    ok_all = True
    for ids in lists:
        tp, rc, err = probe_tpcs([NV, "--no-mps", "-t", ranges(ids)])
        ok = tp == set(ids)
        ok_all &= ok
        check(f"-t {ranges(ids)}", ok, f"ran on {ranges(tp or [])} rc={rc} {err.strip()[-200:]}")
    mask = sum(1 << i for i in range(8, 16))
    tp, rc, err = probe_tpcs([NV, "--no-mps", hex(mask)])
    check("hex mask 0xff00 -> TPCs 8-15", tp == set(range(8, 16)), f"ran on {ranges(tp or [])}")


def section_gpc():
    gpcs = {g["gpc"]: g for g in topo["gpcs"]}
    rng = random.Random(7)
    for sel in ([0], sorted(rng.sample(sorted(gpcs), 2)), sorted(rng.sample(sorted(gpcs), 3))):
        want = set()
        for g in sel:
            want |= set(gpcs[g]["tpcs"])
        tp, rc, err = probe_tpcs([NV, "--no-mps", "-g", ranges(sel)])
        check(f"-g {ranges(sel)}", tp == want, f"want {ranges(want)} ran on {ranges(tp or [])} rc={rc}")
    best = max(gpcs.values(), key=lambda g: g["max_cluster"])
    size = best["max_cluster"]
    rc, out, err, dt = run([NV, "--no-mps", "-g", str(best["gpc"]), f"{GPUBIN}/cluster_probe", "--size", str(size)],
                           timeout=60)
    m = re.search(r"tpcs:([\d ]+)", out)
    ran = {int(x) for x in m.group(1).split()} if m else set()
    check(f"-g {best['gpc']} runs a cluster kernel of its largest size {size}",
          rc == 0 and ran and ran <= set(best["tpcs"]), f"rc={rc} ran on {ranges(ran)} {err.strip()[-200:]}")
    # A partition that cannot hold the cluster: warned at launch.
    small = [best["tpcs"][0]]
    rc, out, err, dt = run([NV, "--no-mps", "-t", ranges(small), "true"], timeout=30)
    check("a one-TPC partition warns about cluster sizes", rc == 0 and "cluster" in err, err.strip())


def live(spec_a, spec_b, want_a, want_b, label):
    until, ready = fresh_path(f"until-{label}"), fresh_path(f"ready-{label}")
    outpath = os.path.join(OUT, f"live-{label}.txt")
    with open(outpath, "w") as out:
        p = subprocess.Popen([NV, "--no-mps"] + spec_a + [f"{GPUBIN}/smid_probe", "--interval-ms", "5",
                                                          "--until-file", until, "--ready-file", ready],
                             stdout=out, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while not os.path.exists(ready) and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        time.sleep(0.2)
        pid = p.pid
        iters = lambda: sum(l.startswith("iter ") for l in open(outpath).read().splitlines())
        rc_q, q, _, _ = run([NV, "-p", str(pid)], timeout=30)
        lines_before_change = iters()
        rc_c, c, cerr, dt = run([NV, "-p"] + spec_b + [str(pid)], timeout=30)
        lines_at_change = iters()
        time.sleep(0.5)
        open(until, "w").close()
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = -9
    lines = [l for l in open(outpath).read().splitlines() if l.startswith("iter ")]
    tps = [parse_ranges(l.split()[-1]) for l in lines]
    # Kernels printed before -p started were launched before it; the first
    # kernel not yet printed when -p returned may have been launched before
    # that; every later one was launched after.
    before, after = tps[:lines_before_change], tps[lines_at_change + 1:]
    check(f"live {label}: -p query", rc_q == 0, q.strip())
    check(f"live {label}: -p change output", rc_c == 0, c.strip().replace("\n", " | ") + f" ({dt * 1000:.1f} ms)")
    check(f"live {label}: kernels before the change on the old TPCs", before and all(t == want_a for t in before),
          f"{len(before)} kernels")
    check(f"live {label}: every kernel after -p returned on the new TPCs",
          len(after) > 10 and all(t == want_b for t in after), f"{len(after)} kernels; first after: "
          f"{ranges(after[0]) if after else '-'}; task rc={rc}")


def section_live():
    n = ntpcs()
    live(["-t", "0-9"], ["-t", "20-29"], set(range(10)), set(range(20, 30)), "tpc")
    bits = {t["tpc"]: t["bit"] for t in topo["tpcs"]}
    ma = sum(1 << bits[t] for t in range(0, n, 2))
    mb = sum(1 << bits[t] for t in range(1, n, 2))
    live(["--physical", hex(ma)], ["--physical", hex(mb)], set(range(0, n, 2)), set(range(1, n, 2)), "physical")


def stop_mps():
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, timeout=30, capture_output=True)


def busy_pair(spec_a, spec_b, mps):
    """Two busy copies started together; returns ((ta, start, end), (tb, ...), stderr a)."""
    start_at = int(time.time() * 1000) + 4000  # room for process and MPS start-up
    base = [NV] + ([] if mps else ["--no-mps"])
    procs = [subprocess.Popen(base + spec + [f"{GPUBIN}/busy", "--start-at", str(start_at)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for spec in (spec_a, spec_b)]
    res, errs = [], []
    for p in procs:
        o, e = p.communicate(timeout=180)
        LOG.write(f"busy {'mps' if mps else 'no-mps'}: rc={p.returncode} {o}{e}\n")
        m = re.search(r"busy: ([\d.]+) s start (\d+) end (\d+)", o)
        res.append((float(m.group(1)), int(m.group(2)), int(m.group(3))) if m and p.returncode == 0 else None)
        errs.append(e)
    return res, errs


def section_mps():
    n = ntpcs()
    half_a, half_b = ["-t", f"0-{n // 2 - 1}"], ["-t", f"{n // 2}-{n - 1}"]
    rc, out, err, _ = run([f"{GPUBIN}/busy"], timeout=120)
    full = float(re.search(r"busy: ([\d.]+)", out).group(1))
    rc, out, err, _ = run([NV, "--no-mps"] + half_a + [f"{GPUBIN}/busy"], timeout=120)
    half = float(re.search(r"busy: ([\d.]+)", out).group(1))
    check("busy on half the TPCs takes about twice as long as on all", 1.6 < half / full < 2.6,
          f"{half:.3f}s vs {full:.3f}s = {half / full:.2f}x")
    try:
        (a, b), (ea, eb) = busy_pair(half_a, half_b, mps=True)
        check("nvtaskset started the MPS daemon and said how to stop it",
              "started the MPS control daemon" in ea + eb and "quit" in ea + eb, (ea + eb).strip())
        ok = a and b
        overlap = ok and min(a[2], b[2]) - max(a[1], b[1])
        check("two MPS clients on complementary halves run at the same time, each as fast as alone on its half",
              ok and overlap > 0.8 * min(a[0], b[0]) * 1000 and max(a[0], b[0]) < 1.35 * half,
              f"a {a[0]:.3f}s, b {b[0]:.3f}s (alone on a half: {half:.3f}s), kernels overlapped {overlap} ms"
              if ok else f"failed: {ea} {eb}")
    finally:
        stop_mps()
    (a, b), _ = busy_pair(half_a, half_b, mps=False)
    if a and b:
        log(f"INFO without MPS the same pair takes a {a[0]:.3f}s, b {b[0]:.3f}s (time-sliced; alone on a half "
            f"{half:.3f}s)")


def tflops(prefix):
    rc, out, err, _ = run(prefix + ["python3", os.path.join(ROOT, "tests/gpu/torch_matmul.py")], timeout=180)
    m = re.search(r"tflops ([\d.]+)", out)
    return float(m.group(1)) if m else None, rc, err


def section_torch():
    n = ntpcs()
    base, rc, err = tflops([])
    under_all, rc2, err2 = tflops([NV, "--no-mps", "-t", f"0-{n - 1}"])
    check("PyTorch runs unchanged under the shim (all TPCs)", under_all is not None and abs(under_all / base - 1) < 0.05,
          f"plain {base} TFLOP/s, under nvtaskset -t 0-{n - 1}: {under_all} {err2.strip()[-200:]}")
    half, rc, err = tflops([NV, "--no-mps", "-t", f"0-{n // 2 - 1}"])
    check("bf16 matmul on half the TPCs runs at about half the throughput",
          half is not None and 0.4 < half / base < 0.62, f"{half} vs {base} = {half / base if half else 0:.2f}x")
    points = []
    for k in (4, 8, 16, 33, 50, n):
        v, rc, err = tflops([NV, "--no-mps", "-t", f"0-{k - 1}"])
        points.append((k, v))
    log("INFO matmul scaling (TPCs, TFLOP/s, per-TPC): " +
        "; ".join(f"{k}: {v} ({v / k:.2f})" for k, v in points if v))
    per = [v / k for k, v in points if v]
    check("matmul throughput scales roughly linearly with TPCs", len(per) == len(points) and
          max(per) / min(per) < 1.6, f"per-TPC spread {max(per) / min(per):.2f}x")


def section_bench():
    real = os.environ.get("REAL_LIBCUDA", "/usr/local/nvidia/lib64/libcuda.so.1")
    rc, out, err, _ = run([os.path.join(BUILD, "bench/bench_launch_overhead"), "--real", real,
                           "--shim-dir", SHIM_DIR, "--uuid", topo["device"]["uuid"], "--rounds", "9"], timeout=400)
    log("INFO " + out.strip().replace("\n", "\nINFO "))
    m = re.search(r"ratio:\s+([\d.]+)x", out)
    check("launch overhead with shim + partition <= 1.01x (UUID-keyed partition)", m and float(m.group(1)) <= 1.01,
          m.group(0) if m else err)
    rc, out, err, _ = run([os.path.join(BUILD, "bench/bench_repartition")], timeout=300,
                          env={"NVTASKSET_REAL_LIBCUDA": real})
    log("INFO " + out.strip().replace("\n", "\nINFO "))
    m = re.search(r"PID:\s+([\d.]+) ms", out)
    check("repartition under 10 ms", m and float(m.group(1)) < 10, m.group(0) if m else err)


def section_errors():
    n = ntpcs()
    for args, what in (([f"-t", f"{n}"], "a TPC that does not exist"),
                       (["-g", "99"], "a GPC that does not exist"),
                       (["-d", "9", "-t", "0"], "a GPU that does not exist"),
                       (["-t", "0-3:0"], "a malformed list")):
        rc, out, err, dt = run([NV, "--no-mps"] + args + ["true"], timeout=60)
        check(f"refused: {what}", rc == 1 and err.count("\n") == 1 and dt < 30, err.strip())


def probe_all(prefix, env=None):
    """smid_probe --all-devices under prefix: {device: tpc set}."""
    rc, out, err, _ = run(prefix + [f"{GPUBIN}/smid_probe", "--all-devices", "--iters", "1"], timeout=90, env=env)
    return {int(m.group(1)): parse_ranges(m.group(2)) for m in re.finditer(r"dev (\d+) iter 0 sms \d+ tpcs (\S+)", out)}, rc, err


def section_multi():
    rc, out, err, _ = run([NV, "--topology", "--json"], timeout=240)
    devs = json.loads(out)["devices"] if rc == 0 else []
    check("--topology calibrates and lists every GPU", len(devs) >= 2, f"{len(devs)} GPUs rc={rc} {err.strip()[-200:]}")
    if len(devs) < 2:
        return
    n0, n1 = len(devs[0]["tpcs"]), len(devs[1]["tpcs"])
    got, rc, err = probe_all([NV, "--no-mps", "-d", "0", "-t", "0-7", "-d", "1", "-t", "8-15"])
    check("-d 0 -t 0-7 -d 1 -t 8-15: each GPU on its own list", got == {0: set(range(8)), 1: set(range(8, 16))},
          f"{ {d: ranges(t) for d, t in got.items()} } rc={rc} {err.strip()[-200:]}")
    got, rc, err = probe_all([NV, "--no-mps", "-d", "1", "-t", "0-3"])
    check("-d 1 -t 0-3: GPU 1 partitioned, GPU 0 unrestricted", got == {0: set(range(n0)), 1: set(range(4))},
          f"{ {d: ranges(t) for d, t in got.items()} }")
    for spec in (devs[1]["device"]["uuid"], devs[1]["device"]["uuid"][:12], devs[1]["device"]["pci_bus_id"]):
        got, rc, err = probe_all([NV, "--no-mps", "-d", spec, "-t", "5"])
        check(f"-d {spec} selects GPU 1", got == {0: set(range(n0)), 1: {5}}, f"{ {d: ranges(t) for d, t in got.items()} }")
    tp, rc, err = probe_tpcs([NV, "--no-mps", "-t", "0-3"], env={"CUDA_VISIBLE_DEVICES": "1"})
    check("CUDA_VISIBLE_DEVICES=1: device 0 is that GPU, by UUID", tp == set(range(4)), f"ran on {ranges(tp or [])}")
    # -n per GPU, from the device cache the launches above filled.
    rc, out, err, _ = run([NV, "--no-mps", "-v", "-d", "0", "-n", "8", "-d", "1", "-n", "12", f"{GPUBIN}/smid_probe",
                           "--all-devices", "--iters", "1"], timeout=90)
    chosen = {int(m.group(1)): parse_ranges(m.group(2)) for m in re.finditer(r"-n \d+ on device (\d+): TPCs (\S+)", err)}
    got = {int(m.group(1)): parse_ranges(m.group(2)) for m in re.finditer(r"dev (\d+) iter 0 sms \d+ tpcs (\S+)", out)}
    check("-d 0 -n 8 -d 1 -n 12: each GPU on exactly the TPCs chosen for it",
          rc == 0 and len(chosen.get(0, ())) == 8 and len(chosen.get(1, ())) == 12 and got == chosen,
          f"chose { {d: ranges(t) for d, t in chosen.items()} } ran { {d: ranges(t) for d, t in got.items()} } rc={rc}")
    # CUDA_VISIBLE_DEVICES changed inside the task (after nvtaskset chose GPU 0 by UUID).
    rc, out, err, _ = run([NV, "--no-mps", "-t", "0-3", "env", "CUDA_VISIBLE_DEVICES=1", f"{GPUBIN}/smid_probe",
                           "--iters", "1"], timeout=60)
    check("task changes CUDA_VISIBLE_DEVICES=1 away from its partitioned GPU 0: the shim stops it in one line, "
          "no kernel",
          rc != 0 and "tpcs" not in out and "does not see" in err
          and len([l for l in err.splitlines() if l.startswith("nvtaskset[")]) == 1,
          f"rc={rc} {err.strip()}")
    got, rc, err = probe_all([NV, "--no-mps", "-d", "1", "-t", "0-3", "env", "CUDA_VISIBLE_DEVICES=1"])
    check("-d 1 -t 0-3 and the task sets CUDA_VISIBLE_DEVICES=1: its device 0 (GPU 1) on 0-3",
          rc == 0 and got == {0: set(range(4))}, f"{ {d: ranges(t) for d, t in got.items()} } rc={rc} {err.strip()[-200:]}")
    got, rc, err = probe_all([NV, "--no-mps", "-t", "0-3", "env", "CUDA_VISIBLE_DEVICES=1,0"])
    check("-t 0-3 (GPU 0) and the task reorders CUDA_VISIBLE_DEVICES=1,0: its device 1 on 0-3, device 0 unrestricted",
          rc == 0 and got == {0: set(range(n1)), 1: set(range(4))}, f"{ {d: ranges(t) for d, t in got.items()} } rc={rc}")
    # Live change of one GPU's partition in a two-GPU task.
    until, ready = os.path.join(OUT, "until-multi"), os.path.join(OUT, "ready-multi")
    outpath = os.path.join(OUT, "live-multi.txt")
    with open(outpath, "w") as out:
        p = subprocess.Popen([NV, "--no-mps", "-d", "1", "-t", "0-3", f"{GPUBIN}/smid_probe", "--all-devices",
                              "--interval-ms", "5", "--until-file", until, "--ready-file", ready], stdout=out,
                             stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while not os.path.exists(ready) and time.monotonic() - t0 < 90:
            time.sleep(0.01)
        time.sleep(0.2)
        rc_q, q, _, _ = run([NV, "-p", str(p.pid)], timeout=30)
        rc_c, c, cerr, dt = run([NV, "-p", "-d", "1", "-t", "4-7", str(p.pid)], timeout=60)
        mark = sum(l.startswith("dev ") for l in open(outpath).read().splitlines())
        time.sleep(0.5)
        open(until, "w").close()
        p.wait(timeout=60)
    lines = [l for l in open(outpath).read().splitlines() if l.startswith("dev ")][mark + 2:]
    after = [(int(m.group(1)), parse_ranges(m.group(2))) for m in
             (re.match(r"dev (\d+) iter \d+ sms \d+ tpcs (\S+)", l) for l in lines) if m]
    check("multi-GPU -p query", rc_q == 0, q.strip())
    check("multi-GPU -p -d 1 change", rc_c == 0, c.strip().replace("\n", " | "))
    check("after -p -d 1 -t 4-7: GPU 1 on 4-7, GPU 0 still unrestricted",
          len(after) > 10 and all(t == (set(range(4, 8)) if d == 1 else set(range(n0))) for d, t in after),
          f"{len(after)} kernels after the change")


def section_systemwide():
    """--system-wide enable: a CUDA program started without nvtaskset loads the
    shim through the loader cache and can be moved with -p."""
    rc, out, err, _ = run([NV, "--system-wide", "enable"], timeout=60)
    check("--system-wide enable", rc == 0, (out + err).strip().replace("\n", " | "))
    try:
        rc, out, err, _ = run(["sh", "-c", "ldconfig -p | grep 'libcuda.so.1 '"], timeout=30)
        check("the loader cache lists the shim first", out.splitlines()[0].endswith(SHIM_DIR + "/libcuda.so.1")
              if out else False, out.strip().replace("\n", " | "))
        until, ready = os.path.join(OUT, "until-sw"), os.path.join(OUT, "ready-sw")
        outpath = os.path.join(OUT, "live-sw.txt")
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ""  # let the loader cache decide, as for any program on the machine
        with open(outpath, "w") as o:
            p = subprocess.Popen([f"{GPUBIN}/smid_probe", "--interval-ms", "5", "--until-file", until, "--ready-file",
                                  ready], stdout=o, stderr=subprocess.STDOUT, env=env)
            t0 = time.monotonic()
            while not os.path.exists(ready) and time.monotonic() - t0 < 60:
                time.sleep(0.01)
            # The control region is an anonymous memory file the task holds (docs/design.md).
            region = any(os.readlink(f"/proc/{p.pid}/fd/{fd}").startswith(f"/memfd:nvtaskset.{p.pid}")
                         for fd in os.listdir(f"/proc/{p.pid}/fd") if os.path.exists(f"/proc/{p.pid}/fd/{fd}"))
            rc_q, q, qerr, _ = run([NV, "-p", str(p.pid)], timeout=60)
            rc_c, c, cerr, _ = run([NV, "-p", "-t", "0-3", str(p.pid)], timeout=60)
            iters = sum(l.startswith("iter ") for l in open(outpath).read().splitlines())
            time.sleep(0.5)
            open(until, "w").close()
            p.wait(timeout=60)
        tps = [parse_ranges(l.split()[-1]) for l in open(outpath).read().splitlines() if l.startswith("iter ")]
        check("a program started without nvtaskset loaded the shim (it has a control region)", region, f"pid {p.pid}")
        check("... and runs on all TPCs until moved", rc_q == 0 and tps[0] == set(range(ntpcs())),
              q.strip() + qerr.strip())
        check("... then -p -t 0-3 moves it", rc_c == 0 and len(tps[iters + 1:]) > 10 and
              all(t == set(range(4)) for t in tps[iters + 1:]), c.strip().replace("\n", " | ") + cerr.strip())
    finally:
        rc, out, err, _ = run([NV, "--system-wide", "disable"], timeout=60)
        check("--system-wide disable", rc == 0, (out + err).strip())


# ---- CUDA graphs, thread-block clusters, PyTorch graphs (gpu-checks) ------------------------------------


def fresh_path(name):
    """OUT/name with no file there from an earlier run (the until- and ready-files tasks poll for)."""
    path = os.path.join(OUT, name)
    if os.path.exists(path):
        os.remove(path)
    return path


class Task:
    """A task started in its own session (process group), stdout and stderr to
    files under OUT; killed with its whole group when the block ends, on every
    path. nvtaskset exec()s the command, so pid is the task's PID."""

    def __init__(self, cmd, name, env=None):
        e = dict(os.environ)
        if env:
            e.update(env)
        self.outpath = os.path.join(OUT, f"{name}.out")
        self.errpath = os.path.join(OUT, f"{name}.err")
        self.cmd = cmd
        self._out = open(self.outpath, "w")
        self._err = open(self.errpath, "w")
        LOG.write(f"$ {' '.join(cmd)} &  [{name}]\n")
        self.p = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, env=e, start_new_session=True)
        self.pid = self.p.pid
        self.rc = None

    def text(self):
        with open(self.outpath) as f:
            return f.read()

    def err(self):
        with open(self.errpath) as f:
            return f.read()

    def wait_ready(self, timeout=60):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if re.search(r"^ready$", self.text(), re.M):
                return True
            if self.p.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def kill(self):
        try:
            os.killpg(self.p.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def finish(self, timeout=30):
        """Waits for the task; on timeout kills it and returns 124."""
        try:
            self.rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.rc = 124
        return self.rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.p.poll() is None:
            self.kill()
        self._out.close()
        self._err.close()
        LOG.write(f"[{self.cmd[-1] if self.cmd else ''}] rc={self.p.returncode}\n--- stdout (tail)\n"
                  f"{self.text()[-3000:]}\n--- stderr (tail)\n{self.err()[-3000:]}\n")
        LOG.flush()
        return False


def run_group(cmd, timeout, env=None):
    """Like run(), but the command gets its own process group, which is killed
    whole on timeout (a hung CUDA task, its helpers). Returns (rc, out, err, s)."""
    e = dict(os.environ)
    if env:
        e.update(env)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        rc, err = 124, (err or "") + "\n[TIMEOUT]"
    dt = time.monotonic() - t0
    LOG.write(f"$ {' '.join(cmd)}  [rc={rc}, {dt:.2f}s]\n{out}{err}\n")
    LOG.flush()
    return rc, out, err, dt


def mps_pipe_dir():
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")


def stop_mps_safely():
    """echo quit | nvidia-cuda-mps-control, never raising; waits until the
    daemon's control socket is gone (at most 15 s)."""
    try:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, timeout=30, capture_output=True)
    except Exception as e:  # a wedged daemon, a missing binary
        log(f"INFO stopping MPS: {e!r}")
    control = os.path.join(mps_pipe_dir(), "control")
    t0 = time.monotonic()
    while os.path.exists(control) and time.monotonic() - t0 < 15:
        time.sleep(0.05)


def tpc_gpc():
    return {t["tpc"]: t["gpc"] for t in topo["tpcs"]}


def whole_gpcs_of(tpcs):
    """The TPCs of every GPC that holds one of tpcs (a TPC of unknown GPC stands for itself)."""
    g_of = tpc_gpc()
    gpcs = {g["gpc"]: set(g["tpcs"]) for g in topo["gpcs"]}
    out = set()
    for t in tpcs:
        out |= gpcs[g_of[t]] if g_of[t] is not None else {t}
    return out


def max_sms_of_one_gpc(tpcs):
    g_of = tpc_gpc()
    cap = {t["tpc"]: t.get("cluster_capable", True) for t in topo["tpcs"]}
    per = {}
    for t in tpcs:
        if g_of[t] is not None and cap[t]:
            per[g_of[t]] = per.get(g_of[t], 0) + 2
    return max(per.values(), default=0)


def p_query(pid):
    """`nvtaskset -p PID` and `nvtaskset -p --json PID`: (text rc, text, json rc, dict or None, json text)."""
    rc_q, q, qerr, _ = run([NV, "-p", str(pid)], timeout=30)
    rc_j, j, jerr, _ = run([NV, "-p", "--json", str(pid)], timeout=30)
    try:
        d = json.loads(j) if rc_j == 0 else None
    except ValueError:
        d = None
    return rc_q, (q + qerr).strip(), rc_j, d, (j + jerr).strip()


GRAPH_MODES = ["plain", "child", "destroyed", "update", "disabled", "threads", "eager"]
GRAPH_CHANGES = 11  # live changes per mode


def graph_mode(mode, rng):
    """graph_probe MODE under `nvtaskset --no-mps -t A`, then GRAPH_CHANGES
    `nvtaskset -p -t B PID` in a row; every replay launched after a -p returned
    (and before the next began) must have run on exactly that -p's TPCs."""
    n = ntpcs()
    lists = [sorted(rng.sample(range(n), rng.randint(1, n))) for _ in range(GRAPH_CHANGES + 1)]
    lists[0] = list(range(n // 2))  # start on a known, roomy set
    until = fresh_path(f"until-graph-{mode}")
    marks = []  # (start ns, return ns, list, rc, output)
    with Task([NV, "--no-mps", "-t", ranges(lists[0]), f"{GPUBIN}/graph_probe", "--mode", mode, "--duration-ms",
               "30000", "--interval-ms", "3", "--until-file", until], f"graph-{mode}") as t:
        if not t.wait_ready(60):
            check(f"graphs {mode}: probe started and printed ready", False, (t.text() + t.err()).strip()[-400:])
            return
        time.sleep(0.12)
        for L in lists[1:]:
            s = time.monotonic_ns()
            rc, out, err, _ = run([NV, "-p", "-t", ranges(L), str(t.pid)], timeout=30)
            r = time.monotonic_ns()
            marks.append((s, r, set(L), rc, (out + err).strip().replace("\n", " | ")))
            time.sleep(0.12)
        rc_q, q, rc_j, d, jtext = p_query(t.pid)
        open(until, "w").close()
        rc = t.finish(30)
        text, err = t.text(), t.err()
    check(f"graphs {mode}: every -p change accepted", all(m[3] == 0 for m in marks),
          "; ".join(f"rc={m[3]} {m[4]}" for m in marks if m[3] != 0) or f"{len(marks)} changes, each rc=0")
    rows = []
    for m in re.finditer(r"^(\d+) (\d+) (\S+)(?: t(\d+))?$", text, re.M):
        tp = set() if m.group(3) == "none" else parse_ranges(m.group(3))
        rows.append((int(m.group(2)), tp, m.group(4)))
    # Windows: [task start, first -p start) on lists[0]; (-p i returned, -p i+1 started) on list i.
    bounds = [(0, marks[0][0], set(lists[0]), "before any change")]
    for i, m in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else 1 << 62
        bounds.append((m[1], end, m[2], f"after change {i + 1}/{len(marks)}"))
    in_flight = sum(1 for ts, _, _ in rows if any(m[0] <= ts <= m[1] for m in marks))
    for lo, hi, want, label in bounds:
        got = [(tp, th) for ts, tp, th in rows if lo < ts < hi]
        bad = [tp for tp, _ in got if tp != want]
        threads_seen = {th for _, th in got}
        enough = len(got) >= 5 and (mode != "threads" or threads_seen == {"0", "1"})
        check(f"graphs {mode}: {label} (-t {ranges(want)})", enough and not bad,
              f"{len(got)} replays, {len(got) - len(bad)} on exactly these TPCs"
              + (f", threads {sorted(threads_seen)}" if mode == "threads" else "")
              + (f"; first wrong: {ranges(bad[0]) or 'none'}" if bad else ""))
    log(f"INFO graphs {mode}: {len(rows)} replays, {in_flight} launched while a -p was running (not judged)")
    check(f"graphs {mode}: the probe ended cleanly", rc == 0, f"rc={rc} {err.strip()[-300:]}")
    if mode == "disabled":
        m1 = re.search(r"marker while disabled: (-?\d+)", text)
        m2 = re.search(r"marker after re-enabling: (-?\d+)", text)
        check("graphs disabled: the node the user disabled never ran across the partition changes",
              m1 is not None and int(m1.group(1)) == 1, m1.group(0) if m1 else "no marker line")
        check("graphs disabled: re-enabled by the user, it runs again (on the last partition)",
              m2 is not None and int(m2.group(1)) == 2 and rows and rows[-1][1] == marks[-1][2],
              (m2.group(0) if m2 else "no marker line") + (f"; last replay on {ranges(rows[-1][1])}" if rows else ""))
    if mode == "update":
        m = re.search(r"^updates (\d+)", text, re.M)
        log(f"INFO graphs update: {m.group(0) if m else 'no updates line'}")
    # The query shows the graph counters.
    want_graphs = {"eager": 0, "threads": 2}.get(mode, 1)
    last = ranges(marks[-1][2])
    mg = re.search(r"pid (\d+)'s CUDA graphs: (\d+) follow the partition, (\d+) cannot", q)
    # The query prints the graphs line only when the task has instantiated graphs.
    if want_graphs == 0:
        counters_ok = mg is None
    else:
        counters_ok = (mg is not None and int(mg.group(2)) >= want_graphs and int(mg.group(3)) == 0
                       and int(mg.group(1)) == t.pid)
    check(f"graphs {mode}: -p query shows the TPC list and the graph counters",
          rc_q == 0 and f"current TPC list: {last}" in q and counters_ok,
          f"want list {last}, {want_graphs} graph(s) following, 0 not: {q.replace(chr(10), ' | ')}")
    keys = ("pid", "tpcs", "graphs_following", "graphs_not_following", "max_cluster", "kernels_launched")
    jok = (rc_j == 0 and isinstance(d, dict) and all(k in d for k in keys) and d["pid"] == t.pid
           and parse_ranges(str(d["tpcs"])) == marks[-1][2]
           and (d["graphs_following"] == 0 if want_graphs == 0 else d["graphs_following"] >= want_graphs)
           and d["graphs_not_following"] == 0 and isinstance(d["kernels_launched"], int) and d["kernels_launched"] > 0)
    check(f"graphs {mode}: -p --json", jok, jtext[:400])


def section_graphs():
    rng = random.Random(2027)
    for mode in GRAPH_MODES:
        graph_mode(mode, rng)


CLUSTER_MSG = r"nvtaskset\[(\d+)\]: (?:[a-z]+: )?kernel with clusters of {c} cannot run on TPCs {lst} \(at most {m} SMs of one GPC\); stopping"


def cluster_misfit_abort(mps):
    """(a): -t 0-3 + clusters of 8: one line, SIGABRT, within seconds."""
    tag = "MPS" if mps else "no MPS"
    base = [NV] + ([] if mps else ["--no-mps"])
    part = [0, 1, 2, 3]
    m_sms = max_sms_of_one_gpc(part)
    rc, out, err, dt = run_group(base + ["-t", "0-3", f"{GPUBIN}/cluster_probe", "--size", "8"], timeout=20)
    pat = re.compile(CLUSTER_MSG.format(c=8, lst="0-3", m=m_sms))
    hits = [l for l in err.splitlines() if "cannot run on TPCs" in l]
    ok_msg = len(hits) == 1 and pat.fullmatch(hits[0].strip()) is not None
    check(f"clusters ({tag}): -t 0-3 + clusters of 8 stops at the launch with one line, SIGABRT, no hang",
          rc == -6 and ok_msg and "ran" not in out and dt < 10,
          f"rc={rc} (want -6, SIGABRT) in {dt:.2f}s (limit 10 s, timeout 20 s); want 'at most {m_sms} SMs'; "
          f"stderr: {err.strip().replace(chr(10), ' | ')[-400:]}")


def cluster_small_fits():
    """(a2) controls: on one TPC, an explicit cluster dimension of 1 and clusters of 2 (one TPC = 2 SMs of one
    GPC) run; the debug histogram counts the launch under its size."""
    t0 = next(t["tpc"] for t in topo["tpcs"] if t["gpc"] is not None and t.get("cluster_capable", True))
    for size in (1, 2):
        rc, out, err, dt = run_group([NV, "--no-mps", "-t", str(t0), f"{GPUBIN}/cluster_probe", "--size", str(size)],
                                     timeout=20, env={"NVTASKSET_LOG": "debug"})
        m = re.search(r"tpcs:([\d ]+)", out)
        ran = {int(x) for x in m.group(1).split()} if m else set()
        h = re.findall(r"cluster sizes launched: (.*)", err)
        hist = dict(re.findall(r"(\d+):\s*(\d+)", h[-1])) if h else {}
        check(f"clusters (no MPS): -t {t0} + cluster dimension {size} runs, on TPC {t0}, and is counted",
              rc == 0 and ran == {t0} and int(hist.get(str(size), 0)) >= 1,
              f"rc={rc} {dt:.2f}s ran on {ranges(ran)}; histogram: {h[-1] if h else '-'}")


def cluster_big_gpc(mps):
    """(b): -g G (a GPC with >= 16 SMs) + clusters of 16 runs."""
    tag = "MPS" if mps else "no MPS"
    big = [g for g in topo["gpcs"] if g["max_cluster"] >= 16]
    if not big:
        check(f"clusters ({tag}): a GPC hosts clusters of 16", False, "none in the topology")
        return
    g = big[0]
    base = [NV] + ([] if mps else ["--no-mps"])
    rc, out, err, dt = run_group(base + ["-g", str(g["gpc"]), f"{GPUBIN}/cluster_probe", "--size", "16"], timeout=30)
    m = re.search(r"tpcs:([\d ]+)", out)
    ran = {int(x) for x in m.group(1).split()} if m else set()
    inside = mps or (ran and ran <= set(g["tpcs"]))  # %smid is virtual under MPS
    check(f"clusters ({tag}): -g {g['gpc']} + clusters of 16 runs" + ("" if mps else " on that GPC"),
          rc == 0 and "cluster size 16 ran" in out and inside,
          f"rc={rc} {dt:.2f}s ran on {ranges(ran)} (GPC {g['gpc']}: {ranges(g['tpcs'])}) {err.strip()[-200:]}")


def cluster_widen(mps):
    """(c): NVTASKSET_ON_CLUSTER_MISFIT=widen, -t 0-3 + clusters of 8 runs on the whole GPCs of TPCs 0-3."""
    tag = "MPS" if mps else "no MPS"
    base = [NV] + ([] if mps else ["--no-mps"])
    env = {"NVTASKSET_ON_CLUSTER_MISFIT": "widen"}
    wide = whole_gpcs_of([0, 1, 2, 3])
    rc, out, err, dt = run_group(base + ["-t", "0-3", f"{GPUBIN}/cluster_probe", "--size", "8"], timeout=30, env=env)
    m = re.search(r"tpcs:([\d ]+)", out)
    ran = {int(x) for x in m.group(1).split()} if m else set()
    inside = mps or (ran and ran <= wide and not ran <= {0, 1, 2, 3})
    check(f"clusters ({tag}): widen: -t 0-3 + clusters of 8 runs" +
          ("" if mps else " inside the whole GPCs of TPCs 0-3, beyond TPCs 0-3"),
          rc == 0 and "cluster size 8 ran" in out and inside,
          f"rc={rc} {dt:.2f}s ran on {ranges(ran)}; whole GPCs: {ranges(wide)}; stderr: "
          f"{err.strip().replace(chr(10), ' | ')[-300:]}")
    if mps:
        return
    # Only the cluster launch widens: the task's ordinary kernels stay on 0-3.
    with Task([NV, "--no-mps", "-t", "0-3", f"{GPUBIN}/cluster_live", "--size", "8", "--duration-ms", "400"],
              "cluster-widen-live", env=env) as t:
        rc = t.finish(40)
        text = t.text()
    rows = [(parse_ranges(a), parse_ranges(b)) for a, b in re.findall(r"^\d+ \d+ cluster (\S+) plain (\S+)$", text, re.M)]
    check("clusters (no MPS): widen: cluster kernels inside the whole GPCs, the ordinary kernels next to them on 0-3",
          rc == 0 and len(rows) >= 5 and all(c <= wide for c, _ in rows) and all(p == {0, 1, 2, 3} for _, p in rows),
          f"rc={rc}, {len(rows)} iterations; cluster TPCs {sorted({ranges(c) for c, _ in rows})[:3]}, plain TPCs "
          f"{sorted({ranges(p) for _, p in rows})[:3]}")


def cluster_live_refusal():
    """(d): a task that launched clusters of 8 keeps its partition when -p asks for one that cannot host 8."""
    hosts8 = [g for g in topo["gpcs"] if g["max_cluster"] >= 8]
    if len(hosts8) < 2:
        check("clusters: two GPCs host clusters of 8", False, f"{len(hosts8)} do")
        return
    g1, g2 = hosts8[0], hosts8[1]
    until = fresh_path("until-cluster-live")
    with Task([NV, "--no-mps", "-g", str(g1["gpc"]), f"{GPUBIN}/cluster_live", "--size", "8", "--duration-ms",
               "30000", "--until-file", until], "cluster-live") as t:
        if not t.wait_ready(60):
            check("clusters: cluster_live started", False, (t.text() + t.err()).strip()[-300:])
            return
        time.sleep(0.1)
        rc_q, q, rc_j, d, jtext = p_query(t.pid)
        rc_c, c, cerr, _ = run([NV, "-p", "-t", "0-3", str(t.pid)], timeout=30)
        r1 = time.monotonic_ns()
        time.sleep(0.2)
        rc_q2, q2, _, d2, _ = p_query(t.pid)
        # Positive control: another GPC that hosts 8 is accepted.
        s2 = time.monotonic_ns()
        rc_ok, ok_out, ok_err, _ = run([NV, "-p", "-g", str(g2["gpc"]), str(t.pid)], timeout=30)
        r2 = time.monotonic_ns()
        time.sleep(0.2)
        open(until, "w").close()
        rc = t.finish(30)
        text = t.text()
    m = re.search(r"largest thread-block cluster: (\d+)", q)
    check("clusters: -p query shows the largest cluster launched (8)", rc_q == 0 and m and int(m.group(1)) == 8,
          q.replace("\n", " | "))
    check("clusters: -p --json max_cluster is 8", isinstance(d, dict) and d.get("max_cluster") == 8, jtext[:300])
    lines = [l for l in (c + cerr).splitlines() if l.strip()]
    check("clusters: -p -t 0-3 on a task that launched clusters of 8 is refused (exit 1, one line)",
          rc_c == 1 and len(lines) == 1, f"rc={rc_c} stdout={c.strip()!r} stderr={cerr.strip()!r}")
    g1_list = ranges(g1["tpcs"])
    # The query answers in the terms the partition was set in (-g: a GPC list); JSON "tpcs" is TPCs.
    unchanged = ((isinstance(d2, dict) and parse_ranges(str(d2.get("tpcs", ""))) == set(g1["tpcs"]))
                 or f"current GPC list: {g1['gpc']}" in q2 or f"current TPC list: {g1_list}" in q2)
    check("clusters: after the refusal the task's partition is unchanged",
          rc_q2 == 0 and unchanged, f"GPC {g1['gpc']} = TPCs {g1_list}; query: {q2.replace(chr(10), ' | ')}")
    rows = [(int(ts), parse_ranges(a), parse_ranges(b))
            for ts, a, b in re.findall(r"^\d+ (\d+) cluster (\S+) plain (\S+)$", text, re.M)]
    mid = [r for r in rows if r1 < r[0] < s2]
    late = [r for r in rows if r[0] > r2]
    check("clusters: kernels after the refusal still ran on the old GPC",
          len(mid) >= 5 and all(c <= set(g1["tpcs"]) and p == set(g1["tpcs"]) for _, c, p in mid),
          f"{len(mid)} iterations")
    check(f"clusters: control: -p -g {g2['gpc']} (hosts 8) is accepted and applies",
          rc_ok == 0 and len(late) >= 5 and all(c <= set(g2["tpcs"]) and p == set(g2["tpcs"]) for _, c, p in late)
          and rc == 0, f"rc={rc_ok} {ok_out.strip().replace(chr(10), ' | ')} {ok_err.strip()}; {len(late)} iterations "
          f"after; task rc={rc}")


def section_clusters():
    # (a)-(d) outside MPS: exact TPCs.
    cluster_misfit_abort(mps=False)
    cluster_small_fits()
    cluster_big_gpc(mps=False)
    cluster_widen(mps=False)
    cluster_live_refusal()
    # (e) the same (a)-(c) as MPS clients: %smid is virtual, so status, messages and completion only.
    try:
        cluster_misfit_abort(mps=True)
        cluster_big_gpc(mps=True)
        cluster_widen(mps=True)
    finally:
        stop_mps_safely()


LIB_WORKLOADS = ["cublas", "cublas-fp8", "triton", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"]


def section_libclusters():
    """(f): which cluster sizes real libraries launch, from the shim's exit-time histogram."""
    n = ntpcs()
    table = []
    for w in LIB_WORKLOADS:
        rc, out, err, dt = run_group([NV, "--no-mps", "-t", f"0-{n - 1}", "python3",
                                      os.path.join(ROOT, "tests/gpu/torch_clusters.py"), w], timeout=180,
                                     env={"NVTASKSET_LOG": "debug"})
        hist = re.findall(r"cluster sizes launched: (.*)", err)
        status = (out.strip().splitlines() or ["(no output)"])[-1]
        check(f"libclusters {w}: ran under the shim and logged its cluster-size histogram",
              rc == 0 and len(hist) >= 1, f"rc={rc} {dt:.1f}s {status[:200]}; histogram: {hist[-1] if hist else '-'}")
        table.append((w, hist[-1].strip() if hist else "-", status[:120]))
    log("INFO cluster sizes launched (size:launches), all TPCs, NVTASKSET_LOG=debug:")
    log("INFO | workload | cluster sizes launched | run |")
    log("INFO | --- | --- | --- |")
    for w, h, s in table:
        log(f"INFO | {w} | {h} | {s} |")


def torch_run(variant, prefix, name, duration, change=None):
    """torch_graphs.py VARIANT under prefix; with change=(delay s, -p args), runs
    `nvtaskset -p ARGS PID` that long after ready. Returns (intervals, s, r, rc, p_out, info):
    intervals [(start ns, end ns, TFLOP/s)], s/r the -p start/return (ns)."""
    s = r = None
    p_out = ""
    with Task(prefix + ["python3", os.path.join(ROOT, "tests/gpu/torch_graphs.py"), variant, "--duration",
                        str(duration)], name) as t:
        if not t.wait_ready(240):
            return [], None, None, t.finish(5), "", (t.text() + t.err()).strip()[-400:]
        if change:
            time.sleep(change[0])
            s = time.monotonic_ns()
            rc_c, o, e, _ = run([NV, "-p"] + change[1] + [str(t.pid)], timeout=30)
            r = time.monotonic_ns()
            p_out = f"rc={rc_c} " + (o + e).strip().replace("\n", " | ")
        rc = t.finish(duration + 60)
        text = t.text()
    info = (re.search(r"^info .*$", text, re.M) or re.search(r"$", "")).group(0)
    m0 = re.search(r"^(\d+) start$", text, re.M)
    pts = [(int(a), float(b)) for a, b in re.findall(r"^(\d+) ([\d.]+)$", text, re.M)]
    intervals = []
    prev = int(m0.group(1)) if m0 else None
    for ts, v in pts:
        if prev is not None:
            intervals.append((prev, ts, v))
        prev = ts
    return intervals, s, r, rc, p_out, info


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def section_torchgraphs():
    """Eager, CUDAGraph and torch.compile(reduce-overhead) matmuls on all TPCs;
    `nvtaskset -p -t 0-7` after ~2 s must cut throughput to about 8/n within one interval."""
    n = ntpcs()
    share = 8 / n
    rows = []
    try:
        for mps in (True, False):  # all MPS runs first: a running daemon would make --no-mps tasks clients too
            if not mps:
                stop_mps_safely()
            tag = "MPS" if mps else "no MPS"
            for variant in ("eager", "cudagraph", "compile"):
                prefix = [NV] + ([] if mps else ["--no-mps"]) + ["-t", f"0-{n - 1}"]
                iv, s, r, rc, p_out, info = torch_run(variant, prefix, f"torchgraphs-{variant}-{'mps' if mps else 'nomps'}",
                                                      3.5, change=(2.0, ["-t", "0-7"]))
                if s is None:
                    check(f"torchgraphs {variant} ({tag}): started", False, f"rc={rc} {info}")
                    continue
                before = [v for a, b, v in iv if b < s][1:]  # the first interval may still warm up
                straddle = [v for a, b, v in iv if a < r and b >= s]
                after = [(a, v) for a, b, v in iv if a >= r]
                bmed = median(before)
                first = after[0][1] if after else float("nan")
                amed = median([v for _, v in after[1:]]) if len(after) > 1 else float("nan")
                check(f"torchgraphs {variant} ({tag}): the first interval after -p -t 0-7 runs at < 0.3x of before",
                      rc == 0 and len(before) >= 5 and after and first < 0.3 * bmed,
                      f"before {bmed:.1f} TFLOP/s (median of {len(before)}), first after {first:.1f} "
                      f"({first / bmed:.3f}x), later {amed:.1f} ({amed / bmed:.3f}x; 8/{n} = {share:.3f}); -p {p_out}; "
                      f"{info}; rc={rc}")
                rows.append((variant, tag, bmed, straddle[0] if straddle else float("nan"),
                             [v for _, v in after[:3]], amed))
                log(f"INFO torchgraphs {variant} ({tag}) TFLOP/s by interval, ms relative to the -p return: " +
                    ", ".join(f"{(b - r) / 1e6:+.0f}:{v:.0f}" for a, b, v in iv if -600e6 < b - r < 600e6))
    finally:
        stop_mps_safely()
    log("INFO | variant | MPS | before (TFLOP/s) | interval with the -p | 1st, 2nd, 3rd after | later median | after / before |")
    log("INFO | --- | --- | --- | --- | --- | --- | --- |")
    for variant, tag, b, st, a3, am in rows:
        log(f"INFO | {variant} | {tag} | {b:.1f} | {st:.1f} | {', '.join(f'{v:.1f}' for v in a3)} | {am:.1f} | "
            f"{am / b:.3f} (8/{n} = {share:.3f}) |")


def section_graphoverhead():
    """CUDAGraph replays with no partition change: under `nvtaskset --no-mps -t 0-(n-1)`
    vs plain, alternated; plain / nvtaskset throughput must be <= 1.01."""
    n = ntpcs()
    stop_mps_safely()
    ratios, plain_v, nvt_v = [], [], []
    for i in range(3):
        pair = []
        for label, prefix in (("plain", []), ("nvtaskset", [NV, "--no-mps", "-t", f"0-{n - 1}"])):
            iv, _, _, rc, _, info = torch_run("cudagraph", prefix, f"graphoverhead-{label}-{i}", 2.0)
            v = median([x for _, _, x in iv][1:])
            pair.append(v if rc == 0 else float("nan"))
            LOG.write(f"graphoverhead round {i} {label}: {v:.1f} TFLOP/s rc={rc} {info}\n")
        plain_v.append(pair[0])
        nvt_v.append(pair[1])
        ratios.append(pair[0] / pair[1])
    r = median(ratios)
    check("graphoverhead: CUDAGraph replay throughput, plain / under nvtaskset (all TPCs) <= 1.01", r <= 1.01,
          f"median ratio {r:.4f}; per round " + ", ".join(f"{p:.1f}/{q:.1f}={x:.4f}" for p, q, x in
                                                          zip(plain_v, nvt_v, ratios)))


def section_graphbench():
    real = os.environ.get("REAL_LIBCUDA", "/usr/local/nvidia/lib64/libcuda.so.1")
    rc, out, err, _ = run_group([os.path.join(BUILD, "bench/bench_graph_launch"), "--real", real, "--shim-dir", SHIM_DIR,
                                 "--nvtaskset", NV, "--uuid", topo["device"]["uuid"], "--lists",
                                 f"0-{ntpcs() - 1},0-{ntpcs() // 2 - 1}"], timeout=400)
    log("INFO " + (out + err).strip().replace("\n", "\nINFO "))
    for nodes in (1, 100):
        m = re.search(rf"graph of {nodes} nodes?: .*ratio ([\d.]+)x", out)
        check(f"graphbench: cuGraphLaunch of {nodes} node(s), shim without a change <= 1.01x of plain",
              rc == 0 and m and float(m.group(1)) <= 1.01, m.group(0) if m else f"rc={rc}")
    m = re.findall(r"first launch after a change, (\d+) nodes: ([\d.]+) us", out)
    check("graphbench: re-encode cost after a change measured for 1, 100, 1000 nodes", rc == 0 and len(m) == 3,
          "; ".join(f"{a} nodes {b} us" for a, b in m))


HARD = "/tmp/nvtaskset-hardening"  # a copy every user can read; the repository may sit under /root


def as_user(name):
    """preexec_fn: drop to the Unix user NAME (created by section_hardening)."""
    import pwd
    pw = pwd.getpwnam(name)

    def drop():
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
    return drop


def user_env(name):
    e = dict(os.environ)
    e["HOME"] = os.path.join(HARD, "home-" + name)
    e.pop("XDG_CACHE_HOME", None)
    return e


def two_users():
    """Users nvt-a and nvt-b, and a copy of nvtaskset and smid_probe in HARD that both can run."""
    import shutil
    shutil.rmtree(HARD, ignore_errors=True)
    os.makedirs(HARD)
    shutil.copytree(BUILD + "/bin", HARD + "/bin")
    shutil.copytree(BUILD + "/lib", HARD + "/lib")
    shutil.copy(f"{GPUBIN}/smid_probe", HARD + "/smid_probe")
    for u in ("nvt-a", "nvt-b"):
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", u], capture_output=True)
        os.makedirs(os.path.join(HARD, "home-" + u), exist_ok=True)
        subprocess.run(["chown", u, os.path.join(HARD, "home-" + u)])
    subprocess.run(["chmod", "-R", "a+rX", HARD])
    # Every user writes its until/ready files here. Sticky, as /tmp: nvtaskset refuses a topology file in a
    # directory where another user could replace it (docs/security.md).
    os.chmod(HARD, 0o1777)


def smid_rows(path):
    return [parse_ranges(l.split()[-1]) for l in open(path).read().splitlines() if l.startswith("iter ")]


def hardening_second_user():
    """A task of user A on TPCs 0-7; user B tries to steer it, to read its region, to write into it."""
    two_users()
    nv = HARD + "/bin/nvtaskset"
    until, ready = HARD + "/until", HARD + "/ready"
    outpath = os.path.join(OUT, "hard-user-a.txt")
    with open(outpath, "w") as out:
        p = subprocess.Popen([nv, "--no-mps", "-t", "0-7", HARD + "/smid_probe", "--interval-ms", "5", "--until-file",
                              until, "--ready-file", ready], stdout=out, stderr=subprocess.STDOUT,
                             preexec_fn=as_user("nvt-a"), env=user_env("nvt-a"), start_new_session=True)
        t0 = time.monotonic()
        while not os.path.exists(ready) and time.monotonic() - t0 < 60 and p.poll() is None:
            time.sleep(0.01)
        time.sleep(0.2)

        def b(args):
            r = subprocess.run(args, capture_output=True, text=True, timeout=30, preexec_fn=as_user("nvt-b"),
                               env=user_env("nvt-b"))
            LOG.write(f"$ [nvt-b] {' '.join(args)} [rc={r.returncode}]\n{r.stdout}{r.stderr}\n")
            return r
        steer = b([nv, "-p", "-t", "0-65", str(p.pid)])
        fds = b(["sh", "-c", f"ls -l /proc/{p.pid}/fd; cat /proc/{p.pid}/fd/* > /dev/null"])
        own = subprocess.run([nv, "-p", str(p.pid)], capture_output=True, text=True, timeout=30,
                             preexec_fn=as_user("nvt-a"), env=user_env("nvt-a"))
        n_before = len(smid_rows(outpath))
        time.sleep(0.5)
        open(until, "w").close()
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            rc = -9
    rows = smid_rows(outpath)
    check("hardening: another user's -p is refused with one line", steer.returncode != 0
          and len(steer.stderr.strip().splitlines()) == 1, f"rc={steer.returncode} {steer.stderr.strip()}")
    check("hardening: another user cannot open the task's descriptors (the region)", fds.returncode != 0,
          f"rc={fds.returncode} {fds.stderr.strip()[:200]}")
    check("hardening: the owner still queries its task", own.returncode == 0 and "0-7" in own.stdout,
          (own.stdout + own.stderr).strip())
    check("hardening: user A's task ran on exactly TPCs 0-7 throughout (as a non-root user)",
          rc == 0 and len(rows) > 20 and all(t == set(range(8)) for t in rows),
          f"rc={rc}, {len(rows)} kernels ({n_before} before the end), TPC sets seen: "
          f"{sorted({ranges(t) for t in rows})[:4]}")


def hardening_killed_writers():
    """PyTorch matmuls on all TPCs; 300 -p writers killed at random moments; the task goes on, a last -p lands."""
    n = ntpcs()
    rng = random.Random(8)
    script = os.path.join(OUT, "hard_loop.py")
    with open(script, "w") as f:
        f.write("import sys, time, torch\n"
                "a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)\n"
                "print('ready', flush=True)\n"
                "t_end = time.time() + float(sys.argv[1])\n"
                "k = 0\n"
                "while time.time() < t_end:\n"
                "    for _ in range(20): a @ a\n"
                "    torch.cuda.synchronize(); k += 1\n"
                "    print('step', k, time.time_ns(), flush=True)\n"
                "print('done', k, flush=True)\n")
    with Task([NV, "--no-mps", "-t", f"0-{n - 1}", "python3", script, "25"], "hard-killed") as t:
        if not t.wait_ready(90):
            check("hardening: PyTorch task started", False, t.err()[-300:])
            return
        killed = 0
        for i in range(300):
            L = sorted(rng.sample(range(n), rng.randint(1, n)))
            w = subprocess.Popen([NV, "-p", "-t", ranges(L), str(t.pid)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0, 0.004))
            if w.poll() is None:
                w.kill()
                killed += 1
            w.wait()
        steps_mid = len(re.findall(r"^step ", t.text(), re.M))
        s = time.monotonic()
        rc_c, c, cerr, dt = run([NV, "-p", "-t", "0-7", str(t.pid)], timeout=30)
        q_rc, q, qerr, _ = run([NV, "-p", str(t.pid)], timeout=30)
        rc = t.finish(60)
        text = t.text()
    steps = len(re.findall(r"^step ", text, re.M))
    check("hardening: 300 -p writers, killed mid-way at random, neither hang nor stop a PyTorch task",
          rc == 0 and "done" in text and steps > steps_mid > 0,
          f"{killed} of 300 writers killed before they finished; task rc={rc}, steps {steps_mid} then {steps}")
    check("hardening: after the killed writers, a -p lands and the query shows it",
          rc_c == 0 and q_rc == 0 and "current TPC list: 0-7" in q, f"{c.strip()} | {q.strip()} {cerr}{qerr}")


def hardening_preload_real_driver():
    real = os.environ.get("REAL_LIBCUDA", "/usr/local/nvidia/lib64/libcuda.so.1")
    rc, out, err, dt = run([NV, "--no-mps", "-t", "0-7", f"{GPUBIN}/smid_probe", "--iters", "1"], timeout=60,
                           env={"LD_PRELOAD": real})
    check("hardening: LD_PRELOAD of the real driver is refused (one line, no kernel run)",
          rc != 0 and len(err.strip().splitlines()) == 1 and "tpcs" not in out and "iter" not in out,
          f"rc={rc} {err.strip()}")


def hardening_gpc_unknown_clusters():
    unknown = [t["tpc"] for t in topo["tpcs"] if t["gpc"] is None]
    if not unknown:
        log("INFO no TPC of unknown GPC on this chip")
        return
    for size in (1, 2):
        rc, out, err, dt = run_group([NV, "--no-mps", "-t", ranges(unknown), f"{GPUBIN}/cluster_probe", "--size",
                                      str(size)], timeout=20)
        log(f"INFO clusters of {size} on the TPCs of unknown GPC {ranges(unknown)}: rc={rc} {dt:.2f}s "
            f"{out.strip()[-200:]} {err.strip()[-300:]}")


def section_hardening():
    hardening_preload_real_driver()
    hardening_second_user()
    hardening_killed_writers()
    hardening_gpc_unknown_clusters()


def section_sharing():
    """-n by count (exact TPCs by %smid, outside MPS), a cluster-8 kernel in -n 4, --status with three MPS tasks."""
    g_of = tpc_gpc()
    gpcs = {g["gpc"]: set(g["tpcs"]) for g in topo["gpcs"]}
    for n in (4, 8, 9, 16, 20, 33):
        rc, out, err, _ = run([NV, "--no-mps", "-v", "-n", str(n), f"{GPUBIN}/smid_probe", "--iters", "1"], timeout=60)
        m = re.search(r"-n \d+ on device \d+: TPCs (\S+)", err)
        chosen = parse_ranges(m.group(1)) if m else set()
        t = re.search(r"tpcs:([\d ]+)", out)
        ran = {int(x) for x in t.group(1).split()} if t else None
        if ran is None:
            ran = set()
            for line in out.splitlines():
                if line.startswith("iter "):
                    ran = parse_ranges(line.split()[-1])
        touched = {g_of[k] for k in chosen}
        whole = sum(1 for g in touched if g is not None and gpcs[g] <= chosen)
        check(f"sharing: -n {n} ran on exactly the {n} TPCs it chose", rc == 0 and len(chosen) == n and ran == chosen,
              f"rc={rc} chose {ranges(chosen)} (GPCs {sorted(x for x in touched if x is not None)}, {whole} whole), "
              f"ran on {ranges(ran)}")
    rc, out, err, dt = run_group([NV, "--no-mps", "-v", "-n", "4", f"{GPUBIN}/cluster_probe", "--size", "8"], timeout=30)
    check("sharing: -n 4 (one whole GPC) runs clusters of 8", rc == 0 and "cluster size 8 ran" in out,
          f"rc={rc} {dt:.2f}s {out.strip()[-120:]} {err.strip()[-200:]}")
    # Three tasks under MPS, each -n 16 --exclusive: disjoint, listed by --status with their counters.
    until = fresh_path("until-sharing")
    tasks = []
    try:
        for i in range(3):
            t = Task([NV, "-n", "16", "--exclusive", f"{GPUBIN}/smid_probe", "--interval-ms", "20", "--until-file", until],
                     f"sharing-{i}")
            tasks.append(t)
            time.sleep(1.5)
        time.sleep(1.0)
        rc, out, err, _ = run([NV, "--status", "--json"], timeout=30)
        rc_t, text, _, _ = run([NV, "--status"], timeout=30)
        log("INFO --status:\n" + text)
        try:
            st = json.loads(out)["tasks"]
        except ValueError:
            st = []
        mine = [e for e in st if e["pid"] in {t.pid for t in tasks}]
        sets = [parse_ranges(e["tpcs"]) for e in mine]
        disjoint = len(sets) == 3 and all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
        check("sharing: --status lists three MPS tasks of -n 16 --exclusive, disjoint, on 2 GPCs each, counting",
              rc == 0 and disjoint and all(e.get("gpcs_touched") == 2 and e.get("kernels_launched", 0) > 0 for e in mine),
              "; ".join(f"{e['pid']}: {e['tpcs']} GPCs {e.get('gpcs')} whole {e.get('gpcs_whole')} kernels "
                        f"{e.get('kernels_launched')}" for e in mine) or out[-300:])
        free = ntpcs() - sum(len(x) for x in sets)
        rc4, o4, e4, _ = run([NV, "-n", str(free + 1), "--exclusive", "true"], timeout=30)
        check(f"sharing: -n {free + 1} --exclusive with {free} TPCs free is refused in one line",
              rc4 == 1 and len(e4.strip().splitlines()) == 1, f"rc={rc4} {e4.strip()}")
    finally:
        open(until, "w").close()
        for t in tasks:
            t.finish(30)
            t.__exit__(None, None, None)
        stop_mps_safely()


def section_racing():
    """Four -n 16 --exclusive launches that choose at the same moment (each held 300 ms between reading the
    status and publishing its choice): the ones that start are disjoint, by --status and by %smid."""
    until = fresh_path("until-racing")
    tasks = []
    try:
        for i in range(4):
            tasks.append(Task([NV, "--no-mps", "--exclusive", "-n", "16", f"{GPUBIN}/smid_probe", "--interval-ms", "20",
                               "--until-file", until, "--ready-file", os.path.join(OUT, f"ready-racing-{i}")],
                              f"racing-{i}", env={"NVTASKSET_CLAIM_DELAY_MS": "300"}))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and not all(
                os.path.exists(os.path.join(OUT, f"ready-racing-{i}")) or tasks[i].p.poll() is not None
                for i in range(4)):
            time.sleep(0.05)
        time.sleep(0.5)
        rc, out, err, _ = run([NV, "--status", "--json"], timeout=30)
        listed = {e["pid"]: parse_ranges(e["tpcs"]) for e in json.loads(out)["tasks"]} if rc == 0 else {}
        started = [t for t in tasks if t.p.poll() is None]
        refused = [t for t in tasks if t.p.poll() is not None]
        ran = {}
        for t in started:
            lines = [l for l in t.text().splitlines() if l.startswith("iter ")]
            ran[t.pid] = parse_ranges(lines[-1].split()[-1]) if lines else set()
        sets = [listed.get(t.pid, set()) for t in started]
        disjoint = all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
        check("racing: -n 16 --exclusive launched at the same moment: those that start are disjoint and run on "
              "exactly their listed TPCs; the others are refused in one line",
              len(started) >= 1 and disjoint and all(len(x) == 16 for x in sets)
              and all(ran[t.pid] == listed.get(t.pid) for t in started)
              and all(t.p.returncode == 1 and len(t.err().strip().splitlines()) == 1 for t in refused),
              "; ".join(f"{t.pid}: listed {ranges(listed.get(t.pid, []))} ran {ranges(ran[t.pid])}" for t in started)
              + " | refused: " + "; ".join(t.err().strip() for t in refused))
    finally:
        open(until, "w").close()
        for t in tasks:
            t.finish(30)
            t.__exit__(None, None, None)


def section_multiuser():
    """Two Unix users and one MPS server: the second is told whom the server serves (NVTASKSET_MPS_OTHER_USER)."""
    stop_mps_safely()
    two_users()
    nv = HARD + "/bin/nvtaskset"
    until, ready = HARD + "/until", HARD + "/ready"
    # Both users read the layout root calibrated (no calibration as a user while a server runs).
    rc, out, err, _ = run([nv, "--topology", "--json"], timeout=120)
    with open(HARD + "/topology.json", "w") as f:
        f.write(json.dumps(json.loads(out)["devices"][0]))
    os.chmod(HARD + "/topology.json", 0o644)
    # The control daemon, started by root as an admin would: it runs a server for whichever user connects.
    subprocess.run(["nvidia-cuda-mps-control", "-d"], timeout=30)
    p = None
    try:
        env_a = user_env("nvt-a")
        env_a["NVTASKSET_TOPOLOGY"] = HARD + "/topology.json"
        p = subprocess.Popen([nv, "-t", "0-7", HARD + "/smid_probe", "--interval-ms", "20", "--until-file", until,
                              "--ready-file", ready], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=as_user("nvt-a"), env=env_a, start_new_session=True)
        t0 = time.monotonic()
        while not os.path.exists(ready) and time.monotonic() - t0 < 60 and p.poll() is None:
            time.sleep(0.05)
        time.sleep(0.5)
        env_b = user_env("nvt-b")
        env_b["NVTASKSET_TOPOLOGY"] = HARD + "/topology.json"
        t0 = time.monotonic()
        b = subprocess.run([nv, "-t", "8-15", "true"], capture_output=True, text=True, timeout=60,
                           preexec_fn=as_user("nvt-b"), env=env_b)
        dt = time.monotonic() - t0
        env_b["NVTASKSET_MPS_OTHER_USER"] = "fail"
        bf = subprocess.run([nv, "-t", "8-15", "true"], capture_output=True, text=True, timeout=60,
                            preexec_fn=as_user("nvt-b"), env=env_b)
        st = subprocess.run([nv, "--status"], capture_output=True, text=True, timeout=60)
        LOG.write(f"multiuser b: {b.returncode} {b.stderr}\nfail: {bf.returncode} {bf.stderr}\nstatus: {st.stdout}\n")
        check("multiuser: user B is told in one line that the MPS server serves user A (and it starts)",
              b.returncode == 0 and "serves user nvt-a with 1 client: this task waits" in b.stderr,
              f"rc={b.returncode} {dt:.2f}s {b.stderr.strip()}")
        check("multiuser: with NVTASKSET_MPS_OTHER_USER=fail it is refused in one line",
              bf.returncode == 1 and len(bf.stderr.strip().splitlines()) == 1, f"rc={bf.returncode} {bf.stderr.strip()}")
        check("multiuser: --status names the server and its user",
              re.search(r"mps: server pid \d+ serves user nvt-a, 1 client", st.stdout) is not None,
              st.stdout.strip()[-300:])
    finally:
        open(until, "w").close()
        if p is not None:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        stop_mps_safely()


def section_smcount():
    """--partition-sm-count: what a task reads as the SM count, through every door, with and without MPS; PyTorch."""
    full = ntpcs() * 2
    pat = r"sms driver=(\d+) procaddr=(\d+) runtime=(\d+) props=(\d+)"
    for mps in (False, True):
        pre = [NV] + ([] if mps else ["--no-mps"])
        for flag, want in (([], full), (["--partition-sm-count"], 32), (["--hide-unallocated"], 32)):
            rc, out, err, _ = run(pre + flag + ["-n", "16", f"{GPUBIN}/sm_count"], timeout=60)
            m = re.search(pat, out)
            got = [int(x) for x in m.groups()] if m else []
            check(f"smcount: -n 16 {' '.join(flag) or '(no option)'}{' under MPS' if mps else ''}: every door says {want}",
                  rc == 0 and got == [want] * 4, f"rc={rc} {out.strip()} {err.strip()[-200:]}")
        if mps:
            stop_mps_safely()
    code = "import torch; print('torch sms', torch.cuda.get_device_properties(0).multi_processor_count)"
    for flag, want in (([], full), (["--partition-sm-count"], 32)):
        rc, out, err, _ = run([NV, "--no-mps"] + flag + ["-n", "16", "python3", "-c", code], timeout=120)
        check(f"smcount: PyTorch multi_processor_count {' '.join(flag) or '(no option)'} is {want}",
              rc == 0 and f"torch sms {want}" in out, f"rc={rc} {out.strip()} {err.strip()[-200:]}")


def section_queues():
    """The hardware queues an MPS client gets from nvtaskset: streams whose kernels or copies falsely wait for each
    other (tests/gpu/queues.cu), against a plain process and an MPS client alone."""
    pat = r"queues (compute|copy) streams (\d+) ms \d+ blocked_pairs (\d+) of (\d+)"

    def blocked(cmd):
        rc, out, err, _ = run(cmd, timeout=60)
        got = {m[0]: int(m[2]) for m in re.findall(pat, out)}
        return rc, got, (out.strip() + " " + err.strip())[-300:]

    for streams in (8, 16):
        probe = [f"{GPUBIN}/queues", "--streams", str(streams), "--ms", "40"]
        stop_mps_safely()
        rc_p, plain, o_p = blocked(probe)
        rc_n, nomps, o_n = blocked([NV, "--no-mps", "-t", "0-32"] + probe)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], timeout=30, capture_output=True)
        time.sleep(1.0)
        rc_c, client, o_c = blocked(probe)
        rc_t, task, o_t = blocked([NV, "-t", "0-32"] + probe)
        # The user's choice of copy queues is kept (a plain process's 4 here).
        rc_u, user4, o_u = blocked(["env", "CUDA_DEVICE_MAX_COPY_CONNECTIONS=4", NV, "-t", "0-32"] + probe)
        stop_mps_safely()
        log(f"INFO queues, {streams} streams, blocked pairs: plain {plain}, --no-mps {nomps}, MPS client {client}, "
            f"nvtaskset (MPS) {task}, nvtaskset with the user's 4 copy queues {user4}")
        ok = all(len(g) == 2 for g in (plain, nomps, client, task, user4)) and 0 == rc_p == rc_n == rc_c == rc_t == rc_u
        # N streams spread over K queues make at most N(N/K - 1) ordered pairs that share one; fewer
        # when the driver spreads them better, which varies from run to run (H100 run 13, H200 run 14:
        # a plain process's copies 0-8 of 56 with 8 streams, 14-48 of 240 with 16).
        copy4 = streams * (streams // 4 - 1)
        copy2 = streams * (streams // 2 - 1)
        check(f"queues: {streams} streams: an MPS client alone has kernels falsely waiting (why nvtaskset sets 8)",
              ok and client["compute"] > 0, f"MPS client {client} {o_c}")
        check(f"queues: {streams} streams under nvtaskset (MPS): no kernel waits falsely, copies at most as with "
              f"its 2 copy queues ({copy2})", ok and task["compute"] == 0 and task["copy"] <= copy2,
              f"nvtaskset {task} plain {plain} {o_t}")
        check(f"queues: {streams} streams under nvtaskset (MPS) with CUDA_DEVICE_MAX_COPY_CONNECTIONS=4 from the "
              f"user: no kernel waits falsely, copies at most as with 4 copy queues ({copy4})",
              ok and user4["compute"] == 0 and user4["copy"] <= copy4, f"nvtaskset {user4} {o_u}")
        check(f"queues: {streams} streams under nvtaskset --no-mps and plain: no kernel waits falsely, copies at most "
              f"as with 4 copy queues ({copy4})",
              ok and nomps["compute"] == plain["compute"] == 0 and max(nomps["copy"], plain["copy"]) <= copy4,
              f"--no-mps {nomps} plain {plain} {o_n} {o_p}")


def section_forks():
    """A task that forks without exec: the child, under the shim from its own cuInit, is listed by --status and
    runs on the partition; -a -p moves parent and child (exact TPCs by %smid, outside MPS)."""
    until = fresh_path("until-forks")
    old, new = set(range(10)), set(range(20, 30))

    def by_pid(text):
        out = {}
        for m in re.finditer(r"^pid (\d+) iter \d+ sms \d+ tpcs (\S+)$", text, re.M):
            out.setdefault(int(m.group(1)), []).append(parse_ranges(m.group(2)))
        return out

    t = Task([NV, "--no-mps", "-t", "0-9", f"{GPUBIN}/smid_probe", "--fork", "--interval-ms", "20",
              "--until-file", until], "forks")
    try:
        t0 = time.monotonic()
        while len(by_pid(t.text())) < 2 and t.p.poll() is None and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        seen = by_pid(t.text())
        child = next((p for p in seen if p != t.pid), None)
        check("forks: parent and forked child both launch kernels", t.pid in seen and child is not None,
              f"pids {sorted(seen)}, task {t.pid}; {t.err().strip()[-200:]}")
        if child is None:
            return
        rc, out, _, _ = run([NV, "--status", "--json"], timeout=30)
        try:
            st = {e["pid"]: e for e in json.loads(out)["tasks"]}
        except (ValueError, KeyError):
            st = {}
        check("forks: --status lists the parent and the forked child, each on TPCs 0-9",
              all(st.get(p, {}).get("tpcs") == "0-9" for p in (t.pid, child)),
              "; ".join(f"{p}: {st.get(p, {}).get('tpcs')}" for p in (t.pid, child)))
        before = {p: len(v) for p, v in by_pid(t.text()).items()}
        rc, out, err, dt = run([NV, "-a", "-p", "-t", "20-29", str(t.pid)], timeout=30)
        at = {p: len(v) for p, v in by_pid(t.text()).items()}
        check("forks: -a -p -t 20-29 changes the parent and the child",
              rc == 0 and all(f"pid {p}'s new TPC list: 20-29" in out for p in (t.pid, child)),
              f"rc={rc} {out.strip()} {err.strip()} ({dt * 1000:.1f} ms)")
        time.sleep(1.0)
        open(until, "w").close()
        t.finish(60)
        lines = by_pid(t.text())
        for p, who in ((t.pid, "parent"), (child, "child")):
            pre, post = lines.get(p, [])[:before.get(p, 0)], lines.get(p, [])[at.get(p, 0) + 1:]
            check(f"forks: the {who}'s kernels ran on exactly 0-9 before the change and 20-29 after it",
                  pre and all(x == old for x in pre) and len(post) > 5 and all(x == new for x in post),
                  f"{len(pre)} before, {len(post)} after; first after: {ranges(post[0]) if post else '-'}")
        check("forks: the task (parent and child) ended cleanly", t.rc == 0, f"rc={t.rc}")
    finally:
        open(until, "w").close()
        t.finish(30)
        t.__exit__(None, None, None)


def section_startupcache():
    """The device cache: the second launch does not initialise the driver in the CLI, and still lands exactly."""
    env = {"NVTASKSET_LOG": "debug"}
    for f in os.listdir(os.path.expanduser("~/.cache/nvtaskset")) if os.path.isdir(os.path.expanduser("~/.cache/nvtaskset")) else []:
        if f.startswith("devices-"):
            os.remove(os.path.join(os.path.expanduser("~/.cache/nvtaskset"), f))
    rc1, _, e1, d1 = run([NV, "--no-mps", "-t", "0-65", "true"], timeout=60, env=env)
    rc2, _, e2, d2 = run([NV, "--no-mps", "-t", "0-65", "true"], timeout=60, env=env)
    check("startupcache: the first launch asks the driver and caches the device list",
          rc1 == 0 and "device list cached in" in e1, f"rc={rc1} {d1:.3f}s")
    check("startupcache: the second launch takes it from the cache (no cuInit in the CLI)",
          rc2 == 0 and "device list from cache" in e2 and "device list cached in" not in e2, f"rc={rc2} {d2:.3f}s")
    times = {"cold": [], "cached": []}
    for i in range(10):
        for label in ("cold", "cached"):
            if label == "cold":
                for f in os.listdir(os.path.expanduser("~/.cache/nvtaskset")):
                    if f.startswith("devices-"):
                        os.remove(os.path.join(os.path.expanduser("~/.cache/nvtaskset"), f))
            rc, _, _, dt = run([NV, "--no-mps", "-t", "0-65", "true"], timeout=60, quiet=True)
            times[label].append(dt)
            if label == "cold":
                run([NV, "--no-mps", "-t", "0-65", "true"], timeout=60, quiet=True)  # refill
    log(f"INFO startupcache: `nvtaskset --no-mps -t 0-65 true` median {median(times['cold']) * 1000:.0f} ms with the "
        f"driver initialised, {median(times['cached']) * 1000:.0f} ms from the cache (10 rounds, alternating)")
    # Still exact: a list from the cached device list lands on exactly its TPCs.
    rc, out, err, _ = run([NV, "--no-mps", "-t", "3,9,20-23", f"{GPUBIN}/smid_probe", "--iters", "1"], timeout=60, env=env)
    ran = set()
    t = re.search(r"tpcs:([\d ]+)", out)
    if t:
        ran = {int(x) for x in t.group(1).split()}
    else:
        for line in out.splitlines():
            if line.startswith("iter "):
                ran = parse_ranges(line.split()[-1])
    check("startupcache: -t 3,9,20-23 from the cached list ran on exactly those TPCs",
          rc == 0 and ran == {3, 9, 20, 21, 22, 23} and "device list from cache" in err, f"rc={rc} ran {ranges(ran)}")
    rc, out, err, _ = run([NV, "--verify", "--seed", "7"], timeout=120)
    check("startupcache: --verify passes with the cached device list", rc == 0, out.strip()[-200:] + err.strip()[-200:])


# ---- "never silently unpartitioned" (trust) ----------------------------------------------------

TRUST = "/tmp/nvtaskset-trust"  # scratch files every user can reach (under HARD's copies, made by two_users)


def real_driver():
    """(path of the real libcuda.so.1, [libcuda.so.1 entries of the loader cache in order]): REAL_LIBCUDA,
    else the first cache entry that is not a shim, else where container runtimes put the driver."""
    shim = os.path.realpath(os.path.join(SHIM_DIR, "libcuda.so.1"))
    rc, out, _, _ = run(["ldconfig", "-p"], timeout=30, quiet=True)
    cache = [l.split("=>")[-1].strip() for l in out.splitlines() if l.strip().startswith("libcuda.so.1 ")]
    cands = ([os.environ["REAL_LIBCUDA"]] if os.environ.get("REAL_LIBCUDA") else []) + cache + [
        "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1"]
    for c in cands:
        if os.path.exists(c) and os.path.realpath(c) != shim and "/nvtaskset/" not in os.path.realpath(c):
            return c, cache
    return None, cache


def maps_files(text):
    """The file paths of /proc/PID/maps text."""
    out = set()
    for line in text.splitlines():
        f = line.split(None, 5)
        if len(f) == 6 and f[5].startswith("/"):
            out.add(f[5].replace(" (deleted)", ""))
    return out


def probe_lines(text):
    """smid_probe's output: ([TPC set per kernel], its pid or None)."""
    rows = [parse_ranges(m.group(1)) for m in re.finditer(r"^iter \d+ sms \d+ tpcs (\S+)$", text, re.M)]
    m = re.search(r"^pid (\d+) device ", text, re.M)
    return rows, int(m.group(1)) if m else None


def wait_files(paths, procs, timeout):
    """Until every path exists (or a process in procs ended, or timeout); returns whether all exist."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if all(os.path.exists(p) for p in paths):
            return True
        if any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.02)
    return all(os.path.exists(p) for p in paths)


def mps_control_daemons(pipe_dir):
    """PIDs of nvidia-cuda-mps-control daemons whose environment names pipe_dir."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/comm") as f:
                if not f.read().startswith("nvidia-cuda-mps"):
                    continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() in env:
            out.append(int(d))
    return out


def quit_mps_at(pipe_dir):
    """echo quit | CUDA_MPS_PIPE_DIRECTORY=pipe_dir nvidia-cuda-mps-control, where a daemon is there; never raises."""
    if not os.path.exists(os.path.join(pipe_dir, "control")) and not mps_control_daemons(pipe_dir):
        return
    try:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, timeout=30, capture_output=True,
                       env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_dir))
    except Exception as e:
        log(f"INFO stopping MPS at {pipe_dir}: {e!r}")
    t0 = time.monotonic()
    while mps_control_daemons(pipe_dir) and time.monotonic() - t0 < 15:
        time.sleep(0.1)
    for pid in mps_control_daemons(pipe_dir):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def trust_wrapper(real):
    """a. smid_probe under a shell that replaces LD_LIBRARY_PATH (the real driver's directory first), exec'd and
    as the shell's child: exactly TPCs 0-3."""
    llp = f"{os.path.dirname(real)}:/usr/local/cuda/lib64"  # the real driver's directory first
    probe = f"{GPUBIN}/smid_probe"
    for how, script in (("exec'd by", f"echo shell-pid $$; export LD_LIBRARY_PATH={llp}; exec {probe} --iters 2"),
                        ("a child of", f"echo shell-pid $$; export LD_LIBRARY_PATH={llp}; {probe} --iters 2; "
                                       f"rc=$?; echo shell-done; exit $rc")):
        rc, out, err, _ = run_group([NV, "--no-mps", "-t", "0-3", "sh", "-c", script], timeout=60)
        rows, ppid = probe_lines(out)
        m = re.search(r"^shell-pid (\d+)$", out, re.M)
        spid = int(m.group(1)) if m else None
        shape = (ppid == spid) if how.startswith("exec") else (ppid is not None and spid is not None and ppid != spid)
        check(f"trust a: smid_probe {how} `sh -c 'export LD_LIBRARY_PATH={llp}; ...'` under --no-mps -t 0-3 runs "
              f"on exactly TPCs 0-3", rc == 0 and len(rows) == 2 and all(r == set(range(4)) for r in rows) and shape,
              f"rc={rc} shell pid {spid}, probe pid {ppid}; ran on {[ranges(r) for r in rows]} {err.strip()[-300:]}")


def trust_torch(llp):
    """b. PyTorch through the same wrapper under -t 0-7 runs at a fraction of all TPCs' bf16 matmul throughput."""
    script = os.path.join(ROOT, "tests/gpu/torch_matmul.py")
    rc, _, err, _ = run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"], timeout=120)
    if rc != 0:
        check("trust b: PyTorch with a GPU is available", False, err.strip()[-300:])
        return
    base, rc0, err0 = tflops([])
    rc, out, err, _ = run_group([NV, "--no-mps", "-t", "0-7", "sh", "-c",
                                 f"export LD_LIBRARY_PATH={llp}; exec {sys.executable} {script}"], timeout=180)
    m = re.search(r"tflops ([\d.]+)", out)
    part = float(m.group(1)) if m and rc == 0 else None
    ratio = part / base if part and base else None
    log(f"INFO trust b: bf16 matmul {base} TFLOP/s on all {ntpcs()} TPCs (plain), {part} TFLOP/s under -t 0-7 "
        f"through the wrapper: ratio {ratio if ratio is None else round(ratio, 3)} (8/{ntpcs()} = "
        f"{8 / ntpcs():.3f})")
    check("trust b: PyTorch under `sh -c 'export LD_LIBRARY_PATH=...; exec python3 ...'` and -t 0-7 is partitioned "
          "(bf16 matmul throughput ratio to all TPCs < 0.3)", ratio is not None and ratio < 0.3,
          f"{part} vs {base} TFLOP/s = {ratio if ratio is None else round(ratio, 3)}x; rc={rc} {err.strip()[-300:]} "
          f"{err0.strip()[-200:]}")


def trust_maps(real):
    """c. A process that never calls the driver (cat, exec'd by nvtaskset or a shell's child) maps the shim, not
    the real driver."""
    shim = os.path.realpath(os.path.join(SHIM_DIR, "libcuda.so.1"))
    real_r = os.path.realpath(real)
    for label, cmd in (("cat exec'd by nvtaskset", ["cat", "/proc/self/maps"]),
                       ("cat, a shell's child", ["sh", "-c", "cat /proc/self/maps; echo shell-done"])):
        rc, out, err, _ = run_group([NV, "--no-mps", "-t", "0-3"] + cmd, timeout=30)
        files = maps_files(out)
        cuda = sorted(f for f in files if os.path.basename(f).startswith("libcuda"))
        regions = sorted(l.split(None, 5)[5] for l in out.splitlines() if "memfd:nvtaskset." in l)
        check(f"trust c: {label} under --no-mps -t 0-3 maps the shim ({shim}) but not the real driver ({real_r})",
              rc == 0 and shim in files and real_r not in files and cuda == [shim],
              f"rc={rc}; libcuda files mapped: {cuda}; {err.strip()[-200:]}")
        log(f"INFO trust c: {label}: control region mappings: {sorted(set(regions)) or 'none'}")


def trust_shell_child_after_p():
    """d. A task (python, never calling the driver) waits; -p -t 20-29; then it starts smid_probe through
    os.system, subprocess(shell=True), and through setpriv as another user: all on exactly 20-29; the one of
    the other user holds no descriptor or mapping of the task's region."""
    import pwd
    nv = HARD + "/bin/nvtaskset"
    probe = HARD + "/smid_probe"
    go, until, ready = f"{TRUST}/go-d", f"{TRUST}/until-d", f"{TRUST}/ready-d"
    out1, out2, out3 = (os.path.join(OUT, f"trust-d-{k}.txt") for k in ("system", "shell", "setpriv"))
    for p in (go, until, ready, out1, out2, out3):
        if os.path.exists(p):
            os.remove(p)
    pw = pwd.getpwnam("nvt-b")
    inner = (f"echo child-pid $$ uid $(id -u); echo '--- fds'; ls -l /proc/$$/fd; echo '--- maps'; "
             f"cat /proc/$$/maps; echo '--- probe'; exec {probe} --interval-ms 20 --until-file {until} "
             f"--ready-file {ready}")
    import shlex
    if shutil_which("setpriv"):
        switch = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]
    else:  # the same with Python, where util-linux's setpriv is missing
        switch = [sys.executable, "-c", f"import os, sys; os.setgroups([]); os.setgid({pw.pw_gid}); "
                                        f"os.setuid({pw.pw_uid}); os.execvp(sys.argv[1], sys.argv[1:])"]
    switch_cmd = " ".join(shlex.quote(x) for x in switch + ["env", f"HOME={HARD}/home-nvt-b", "sh", "-c", inner])
    parent = os.path.join(TRUST, "parent_d.py")
    with open(parent, "w") as f:
        f.write("import os, subprocess, sys, time\n"
                "go, probe, out1, out2, switch, out3 = sys.argv[1:7]\n"
                "print('ready', flush=True)\n"
                "t0 = time.time()\n"
                "while not os.path.exists(go):\n"
                "    if time.time() - t0 > 60: sys.exit(3)\n"
                "    time.sleep(0.01)\n"
                "r1 = os.system(f'{probe} --iters 2 > {out1} 2>&1')\n"
                "r2 = subprocess.run(f'echo shell-pid $$ > {out2}; {probe} --iters 2 >> {out2} 2>&1; rc=$?; "
                "echo shell-done >> {out2}; exit $rc', shell=True).returncode\n"
                "r3 = os.system(f'{switch} > {out3} 2>&1')\n"
                "print('children', r1, r2, r3, flush=True)\n"
                "sys.exit(0 if r1 == r2 == r3 == 0 else 1)\n")
    os.chmod(parent, 0o644)
    fds, maps, status = "", "", ""
    with Task([nv, "--no-mps", "-t", "0-9", sys.executable, parent, go, probe, out1, out2, switch_cmd, out3],
              "trust-d") as t:
        try:
            if not t.wait_ready(60):
                check("trust d: the parent task started", False, t.err()[-300:])
                return
            rc_p, pout, perr, dt = run([nv, "-p", "-t", "20-29", str(t.pid)], timeout=30)
            rc_q, q, qerr, _ = run([nv, "-p", str(t.pid)], timeout=30)
            check("trust d: -p -t 20-29 on the waiting parent (a python task that never called the driver)",
                  rc_p == 0 and rc_q == 0 and "20-29" in q, f"{pout.strip()} | {q.strip()} {perr.strip()} {qerr.strip()}")
            open(go, "w").close()
            if wait_files([ready], [t.p], 90):
                child = int(open(ready).read().split()[0])
                try:
                    links = []
                    for n in os.listdir(f"/proc/{child}/fd"):
                        try:
                            links.append(f"{n} -> {os.readlink(f'/proc/{child}/fd/{n}')}")
                        except OSError:
                            pass
                    fds = "\n".join(links)
                    maps = open(f"/proc/{child}/maps").read()
                    status = open(f"/proc/{child}/status").read()
                except OSError as e:
                    fds = f"[cannot read /proc/{child}: {e}]"
                time.sleep(0.3)
            open(until, "w").close()
            rc = t.finish(90)
        finally:
            open(until, "w").close()
    tag = f"memfd:nvtaskset.{t.pid}"
    r1, _ = probe_lines(open(out1).read() if os.path.exists(out1) else "")
    text2 = open(out2).read() if os.path.exists(out2) else ""
    r2, p2 = probe_lines(text2)
    m = re.search(r"^shell-pid (\d+)$", text2, re.M)
    s2 = int(m.group(1)) if m else None
    text3 = open(out3).read() if os.path.exists(out3) else ""
    r3, p3 = probe_lines(text3)
    want = set(range(20, 30))
    check("trust d: os.system() child started after -p runs on exactly the current TPCs 20-29",
          len(r1) == 2 and all(r == want for r in r1), f"ran on {[ranges(r) for r in r1]}; task rc={t.rc} "
          f"{t.text().strip()[-100:]}")
    check("trust d: subprocess(shell=True) child (forked by the shell) started after -p runs on exactly 20-29",
          len(r2) == 2 and all(r == want for r in r2) and p2 is not None and p2 != s2,
          f"shell pid {s2}, probe pid {p2}; ran on {[ranges(r) for r in r2]}")
    uid_m = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.M)
    check(f"trust d: a child switched to user nvt-b ({' '.join(switch[:1])}) runs on exactly 20-29",
          len(r3) >= 2 and all(r == want for r in r3) and uid_m is not None and int(uid_m.group(2)) == pw.pw_uid,
          f"uid {uid_m.groups() if uid_m else '?'}; {len(r3)} kernels on {sorted({ranges(r) for r in r3})}; "
          f"{text3.strip()[-200:] if not r3 else ''}")
    inside = text3.split("--- probe")[0]
    check(f"trust d: the nvt-b child holds no descriptor or mapping of the task's region ({tag}): inside its shell "
          "and, while its kernels run, from /proc",
          "--- maps" in inside and tag not in inside and fds != "" and not fds.startswith("[") and tag not in fds
          and maps != "" and tag not in maps,
          f"shell fds listed: {'--- fds' in inside}, {tag} in shell fds/maps: {tag in inside}; probe pid fds: "
          f"{len(fds.splitlines())} ({'memfd' if 'memfd:' in fds else 'no memfd'}: "
          f"{[l for l in fds.splitlines() if 'memfd:' in l]}), {tag} in its maps: {tag in maps}")


def shutil_which(name):
    import shutil
    return shutil.which(name)


def trust_bypass(real, cache):
    """e. A task that reaches the real driver without the shim: its kernels run outside its list; -p refuses it
    (runs on all TPCs), --status says partitioned false; a partitioned task beside it says true."""
    n = ntpcs()
    shim = os.path.realpath(os.path.join(SHIM_DIR, "libcuda.so.1"))
    first = os.path.realpath(cache[0]) if cache else None
    # The loader must find the real driver with the shim out of the environment: through its cache, unless
    # that lists none (or the shim first: --system-wide), then through the driver's own directory.
    llp = "/nonexistent" if first is not None and first != shim and "/nvtaskset/" not in first \
        else os.path.dirname(real)
    log(f"INFO trust e: bypass with LD_LIBRARY_PATH={llp} (loader cache's first libcuda.so.1: {cache[:1]})")
    until = f"{TRUST}/until-e"
    ready_a, ready_b = f"{TRUST}/ready-e-a", f"{TRUST}/ready-e-b"
    renamed = f"{TRUST}/libnvrenamed-copy.so"
    for p in (until, ready_a, ready_b):
        if os.path.exists(p):
            os.remove(p)
    import shutil
    shutil.copy(real, renamed)
    dl = os.path.join(TRUST, "dlopen_renamed.py")
    with open(dl, "w") as f:
        f.write("import ctypes, os, sys, time\n"
                "lib = ctypes.CDLL(sys.argv[1])\n"
                "r = lib.cuInit(0)\n"
                "n = ctypes.c_int(-1)\n"
                "lib.cuDeviceGetCount(ctypes.byref(n))\n"
                "print('cuInit', r, 'devices', n.value, flush=True)\n"
                "print('ready', flush=True)\n"
                "t0 = time.time()\n"
                "while not os.path.exists(sys.argv[2]) and time.time() - t0 < 120:\n"
                "    time.sleep(0.02)\n")
    probe = f"{GPUBIN}/smid_probe"
    a = b = c = None
    try:
        a = Task([NV, "--no-mps", "-t", "0-3", "sh", "-c",
                  f"exec env -u LD_PRELOAD LD_LIBRARY_PATH={llp} {probe} --interval-ms 20 --until-file {until} "
                  f"--ready-file {ready_a}"], "trust-e-bypass")
        b = Task([NV, "--no-mps", "-t", "4-7", probe, "--interval-ms", "20", "--until-file", until, "--ready-file",
                  ready_b], "trust-e-partitioned")
        c = Task([NV, "--no-mps", "-t", "0-3", sys.executable, dl, renamed, until], "trust-e-renamed")
        up = wait_files([ready_a, ready_b], [a.p, b.p], 90) and c.wait_ready(90)
        time.sleep(0.3)
        rc_a, oa, ea, _ = run([NV, "-p", str(a.pid)], timeout=30)
        rc_b, ob, eb, _ = run([NV, "-p", str(b.pid)], timeout=30)
        rc_c, oc, ec, _ = run([NV, "-p", str(c.pid)], timeout=30)
        rc_ca, oca, eca, _ = run([NV, "-p", "-t", "8-11", str(a.pid)], timeout=30)
        rc_s, sj, se, _ = run([NV, "--status", "--json"], timeout=30)
        rc_t, st, ste, _ = run([NV, "--status"], timeout=30)
        log("INFO trust e: --status:\n" + st + ste)
        try:
            entries = {e["pid"]: e for e in json.loads(sj)["tasks"]}
        except (ValueError, KeyError, TypeError):
            entries = {}
        open(until, "w").close()
        for t in (a, b, c):
            t.finish(60)
        rows_a, _ = probe_lines(a.text())
        rows_b, _ = probe_lines(b.text())
    finally:
        open(until, "w").close()
        for t in (a, b, c):
            if t is not None:
                t.finish(30)
                t.__exit__(None, None, None)
        if os.path.exists(renamed):
            os.remove(renamed)
    check("trust e: the bypassing task and a partitioned one started", up,
          f"{a.err().strip()[-200:]} {b.err().strip()[-200:]} {c.err().strip()[-200:]}")
    check(f"trust e: `sh -c 'exec env -u LD_PRELOAD LD_LIBRARY_PATH={llp} smid_probe'` under -t 0-3 really bypasses: "
          "every kernel runs on more than TPCs 0-3",
          len(rows_a) >= 3 and all(not r <= set(range(4)) for r in rows_a),
          f"{len(rows_a)} kernels on {sorted({ranges(r) for r in rows_a})} (all TPCs: 0-{n - 1})")

    def one_line_all(rc, err):
        return rc == 1 and len(err.strip().splitlines()) == 1 and "runs on all TPCs" in err

    check("trust e: `nvtaskset -p PID` of the bypassing task exits 1 with \"runs on all TPCs\" (one line)",
          one_line_all(rc_a, ea), f"rc={rc_a} {oa.strip()} {ea.strip()}")
    check("trust e: `nvtaskset -p -t 8-11 PID` of the bypassing task is refused the same way",
          one_line_all(rc_ca, eca), f"rc={rc_ca} {oca.strip()} {eca.strip()}")
    check("trust e: `nvtaskset -p PID` of a task that dlopen()ed a renamed copy of the driver exits 1 with \"runs on "
          "all TPCs\"", one_line_all(rc_c, ec), f"rc={rc_c} {oc.strip()} {ec.strip()}; task: "
          f"{c.text().strip()[:80]}")
    check("trust e: the partitioned task beside them answers -p and ran on exactly 4-7",
          rc_b == 0 and "4-7" in ob and len(rows_b) >= 3 and all(r == set(range(4, 8)) for r in rows_b),
          f"rc={rc_b} {ob.strip()} {eb.strip()}; {len(rows_b)} kernels on {sorted({ranges(r) for r in rows_b})}")

    def reason(e):
        for k in ("unpartitioned_reason", "reason", "why"):
            if isinstance(e.get(k), str) and e[k]:
                return e[k]
        return None

    ea_, ec_, eb_ = entries.get(a.pid, {}), entries.get(c.pid, {}), entries.get(b.pid, {})
    check("trust e: --status --json lists the bypassing task with \"partitioned\": false and a reason",
          rc_s == 0 and ea_.get("partitioned") is False and reason(ea_) is not None,
          f"rc={rc_s} pid {a.pid}: partitioned {ea_.get('partitioned')}, tpcs {ea_.get('tpcs')}, reason "
          f"{reason(ea_)!r} {se.strip()[-200:]}")
    check("trust e: --status --json lists the task with the renamed driver copy with \"partitioned\": false",
          rc_s == 0 and ec_.get("partitioned") is False and reason(ec_) is not None,
          f"pid {c.pid}: partitioned {ec_.get('partitioned')}, tpcs {ec_.get('tpcs')}, reason {reason(ec_)!r}")
    check("trust e: --status --json lists the partitioned task beside them with \"partitioned\": true on 4-7",
          rc_s == 0 and eb_.get("partitioned") is True and eb_.get("tpcs") == "4-7",
          f"pid {b.pid}: partitioned {eb_.get('partitioned')}, tpcs {eb_.get('tpcs')}, reason {reason(eb_)!r}")
    row = next((l for l in st.splitlines() if l.split()[:1] == [str(a.pid)]), "")
    check("trust e: the --status table shows the bypassing task as UNPARTITIONED", rc_t == 0 and "UNPARTITIONED" in row,
          f"row: {row.strip() or '(none)'}")


def trust_secure_exec():
    """f. Programs the kernel would run in secure-execution mode are refused before they start; without the bit
    the same copy runs on exactly its TPCs."""
    import grp
    import pwd
    base = None
    for d in (TRUST, "/var/tmp", os.path.expanduser("~"), ROOT):
        if os.path.isdir(d) and not os.statvfs(d).f_flag & os.ST_NOSUID:
            base = d
            break
    nnp = re.search(r"^NoNewPrivs:\s+1", open("/proc/self/status").read(), re.M) is not None
    if base is None or nnp:
        log(f"INFO trust f: skipped: no file system without nosuid ({base}) or no_new_privs set ({nnp}): the kernel "
            "would grant no set-id here")
        return
    d = os.path.join(base, "nvt-trust-setid")
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    os.chmod(d, 0o755)
    gname = grp.getgrgid(pwd.getpwnam("nvt-b").pw_gid).gr_name
    try:
        sgid = os.path.join(d, "sgid_probe")
        shutil.copy(f"{GPUBIN}/smid_probe", sgid)
        subprocess.run(["chgrp", gname, sgid], check=True, timeout=10)
        os.chmod(sgid, 0o2755)
        log(f"INFO trust f: {subprocess.run(['ls', '-l', sgid], capture_output=True, text=True).stdout.strip()} "
            f"(file system of {base}: no nosuid)")

        def refused(cmd, label, want, user=None):
            if user:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=as_user(user),
                                   env=user_env(user), start_new_session=True)
                rc, out, err = p.returncode, p.stdout, p.stderr
                LOG.write(f"$ [{user}] {' '.join(cmd)} [rc={rc}]\n{out}{err}\n")
            else:
                rc, out, err, _ = run_group(cmd, timeout=60)
            lines = err.strip().splitlines()
            check(f"trust f: {label}: refused before it starts (exit 1, one line, no kernel)",
                  rc == 1 and len(lines) == 1 and lines[0].startswith("nvtaskset") and all(w in err for w in want)
                  and "secure-execution mode" in err and "iter " not in out and "device" not in out,
                  f"rc={rc} {err.strip()[:400]} {out.strip()[:100]}")

        refused([NV, "--no-mps", "-t", "0-3", sgid, "--iters", "1"], f"a set-gid copy of smid_probe (group {gname})",
                [f"is set-gid (group {gname})"])
        script = os.path.join(d, "script")
        with open(script, "w") as f:
            f.write(f"#!{sgid}\n")
        os.chmod(script, 0o755)
        refused([NV, "--no-mps", "-t", "0-3", script], "a script whose interpreter is that set-gid copy",
                ["is set-gid", "the interpreter of"])
        suid = os.path.join(d, "suid_probe")
        shutil.copy(f"{GPUBIN}/smid_probe", suid)
        subprocess.run(["chown", "nvt-b", suid], check=True, timeout=10)
        os.chmod(suid, 0o4755)
        refused([NV, "--no-mps", "-t", "0-3", suid, "--iters", "1"], "a set-uid copy of smid_probe (owner nvt-b)",
                ["is set-uid (owner nvt-b)"])
        os.chmod(sgid, 0o755)  # the bit off (the group stays)
        rc, out, err, _ = run_group([NV, "--no-mps", "-t", "0-3", sgid, "--iters", "2"], timeout=60)
        rows, _ = probe_lines(out)
        check("trust f: the same copy without the set-gid bit runs on exactly TPCs 0-3",
              rc == 0 and len(rows) == 2 and all(r == set(range(4)) for r in rows),
              f"rc={rc} ran on {[ranges(r) for r in rows]} {err.strip()[-200:]}")
        # File capabilities: refused for a user, run partitioned by root.
        capf = os.path.join(d, "cap_probe")
        shutil.copy(f"{GPUBIN}/smid_probe", capf)
        os.chmod(capf, 0o755)
        # What `setcap cap_sys_nice+ep` writes (vfs_cap_data revision 2: magic with the effective flag, then
        # permitted/inheritable per 32-bit word; CAP_SYS_NICE is 23), written directly where setcap is missing.
        try:
            import struct
            os.setxattr(capf, "security.capability", struct.pack("<5I", 0x02000001, 1 << 23, 0, 0, 0))
        except OSError as e:
            log(f"INFO trust f: file capabilities cannot be set here ({e}): not checked")
            return
        refused([HARD + "/bin/nvtaskset", "--no-mps", "-t", "0-3", capf, "--iters", "1"],
                "user nvt-a runs a copy carrying file capabilities (cap_sys_nice+ep)", ["carries file capabilities"],
                user="nvt-a")
        rc, out, err, _ = run_group([NV, "--no-mps", "-t", "0-3", capf, "--iters", "2"], timeout=60)
        rows, _ = probe_lines(out)
        check("trust f: root runs that copy with file capabilities partitioned, on exactly TPCs 0-3",
              rc == 0 and len(rows) == 2 and all(r == set(range(4)) for r in rows),
              f"rc={rc} ran on {[ranges(r) for r in rows]} {err.strip()[-200:]}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def trust_mps_pipe_dir():
    """g. An MPS pipe directory owned by another user is refused in one line, and no daemon starts there; one of
    root's own starts one (then stopped)."""
    base = "/tmp/nvtaskset-trust-mps"  # root's, 0755: only the pipe directory's owner differs
    foreign, own, logdir = f"{base}/foreign", f"{base}/own", f"{base}/log"
    import shutil
    for p in (foreign, own):
        if os.path.isdir(p):
            quit_mps_at(p)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    os.chmod(base, 0o755)
    for p in (foreign, own, logdir):
        os.makedirs(p)
        os.chmod(p, 0o755)
    subprocess.run(["chown", "nvt-b:", foreign], check=True, timeout=10)
    try:
        env = {"CUDA_MPS_PIPE_DIRECTORY": foreign, "CUDA_MPS_LOG_DIRECTORY": logdir}
        rc, out, err, dt = run_group([NV, "-t", "0-3", "true"], timeout=60, env=env)
        time.sleep(0.5)
        daemons = mps_control_daemons(foreign)
        lines = err.strip().splitlines()
        check("trust g: CUDA_MPS_PIPE_DIRECTORY owned by user nvt-b: `nvtaskset -t 0-3 true` (MPS, as root) is refused "
              "in one line", rc != 0 and len(lines) == 1 and lines[0].startswith("nvtaskset"),
              f"rc={rc} {dt:.2f}s {err.strip()[:400]}")
        check("trust g: ... and no MPS daemon was started there", not daemons and not os.listdir(foreign),
              f"daemons with that pipe dir: {daemons}; dir holds {os.listdir(foreign)}")
        env = {"CUDA_MPS_PIPE_DIRECTORY": own, "CUDA_MPS_LOG_DIRECTORY": logdir}
        rc, out, err, dt = run_group([NV, "-t", "0-3", "true"], timeout=90, env=env)
        check("trust g: the same with a pipe directory of root's own starts (the refusal is about the owner)",
              rc == 0, f"rc={rc} {dt:.2f}s {err.strip()[:300]}; daemons there: {mps_control_daemons(own)}")
    finally:
        quit_mps_at(foreign)
        quit_mps_at(own)
        left = mps_control_daemons(foreign) + mps_control_daemons(own)
        if left:
            log(f"INFO trust g: MPS daemons still running after quit: {left}")


def section_trust():
    """Never silently unpartitioned: the shim survives a replaced LD_LIBRARY_PATH, shell children follow
    -p (also after a user switch, holding nothing of the task's region), a bypass is detected (-p, --status),
    secure-execution programs and foreign MPS pipe directories are refused. Exact TPCs by %smid, --no-mps."""
    import shutil
    two_users()
    shutil.rmtree(TRUST, ignore_errors=True)
    os.makedirs(TRUST)
    os.chmod(TRUST, 0o777)
    real, cache = real_driver()
    log(f"INFO trust: real driver {real} -> {real and os.path.realpath(real)}; loader cache libcuda.so.1: {cache}; "
        f"shim {os.path.realpath(os.path.join(SHIM_DIR, 'libcuda.so.1'))}")
    if real is None:
        check("trust: the real driver found", False, "no libcuda.so.1 other than the shim")
        return
    llp = f"{os.path.dirname(real)}:/usr/local/cuda/lib64"  # the real driver's directory first
    steps = [("a", lambda: trust_wrapper(real)), ("b", lambda: trust_torch(llp)), ("c", lambda: trust_maps(real)),
             ("d", trust_shell_child_after_p), ("e", lambda: trust_bypass(real, cache)), ("f", trust_secure_exec),
             ("g", trust_mps_pipe_dir)]
    only = os.environ.get("TRUST_PARTS")  # e.g. "ade": a subset, for a rerun
    for name, fn in steps:
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            fn()
        except Exception as e:  # one broken part is a failure, the others still run
            import traceback
            LOG.write(traceback.format_exc())
            check(f"trust {name} completed", False, repr(e))
        log(f"INFO trust {name}: {time.monotonic() - t0:.1f}s")


def status_of(pid):
    """pid's entry in `nvtaskset --status --json` (None when it has none)."""
    rc, out, err, _ = run([NV, "--status", "--json"], timeout=60)
    try:
        return next((t for t in json.loads(out)["tasks"] if t["pid"] == pid), None)
    except (ValueError, KeyError):
        return None


def wait_state(pid, want, timeout=15):
    """Polls --status until pid's controller state is `want`; returns the last state seen."""
    t0, state = time.monotonic(), None
    while time.monotonic() - t0 < timeout:
        e = status_of(pid)
        state = ((e or {}).get("controller") or {}).get("state")
        if state == want:
            break
        time.sleep(0.2)
    return state


def roles_lc_task(tpcs, name, interval_ms=100, mps=False):
    """An LC smid_probe on -t tpcs that launches one kernel every interval_ms until its until-file exists."""
    until, ready = fresh_path(f"{name}-until"), fresh_path(f"{name}-ready")
    cmd = [NV] + ([] if mps else ["--no-mps"]) + ["-t", tpcs, "--latency-critical", f"{GPUBIN}/smid_probe",
                                                  "--interval-ms", str(interval_ms), "--until-file", until,
                                                  "--ready-file", ready]
    return Task(cmd, name), until, ready


def section_roles():
    """The roles (--latency-critical / --best-effort) on the hardware, outside MPS (exact TPCs by %smid): two LC tasks burst around each
    other's reservations, a third that overlaps is refused; a best-effort task keeps off the reservation of a
    stopped (stale) LC task and of a saturated one, and gets it back when the LC task dies; the same for a BE
    task of another Unix user. Under MPS, by throughput: a BE task's compute-bound work next to a stale LC task
    on -n 16 takes about 66/50 of its time alone."""
    import signal
    stop_mps_safely()
    allt, rc, err = probe_tpcs([NV, "--no-mps", "--best-effort"])
    check("roles a: a best-effort task with no LC task runs on every TPC", allt is not None and len(allt) == ntpcs(),
          f"{ranges(allt or [])} ({err.strip()[-200:]})")
    res = {}
    for t in ("0-7", "8-15", "0-15"):
        res[t], _, _ = probe_tpcs([NV, "--no-mps", "-t", t])
    if allt is None or any(v is None for v in res.values()):
        check("roles: the reference probes ran", False, str(res))
        return
    # b. Two LC tasks: each bursts onto every TPC but the other's reservation.
    tb, ub, rb = roles_lc_task("8-15", "roles-lc-b")
    with tb:
        ok_b = wait_files([rb], [tb.p], 60)
        ta, ua, ra = roles_lc_task("0-7", "roles-lc-a")
        with ta:
            ok_a = wait_files([ra], [ta.p], 60)
            time.sleep(1.0)
            rc3, o3, e3, _ = run([NV, "--no-mps", "-t", "4-11", "--latency-critical", "true"], timeout=60)
            check("roles b: a third LC task that overlaps both (-t 4-11) is refused in one line",
                  rc3 != 0 and len(e3.strip().splitlines()) == 1, f"rc={rc3}: {e3.strip()}")
            sa = status_of(ta.pid)
            open(ua, "w").close()
            ta.finish(30)
            rows_a = smid_rows(ta.outpath)
        time.sleep(0.5)
        open(ub, "w").close()
        tb.finish(30)
        rows_b = smid_rows(tb.outpath)
    want_a, want_b = allt - res["8-15"], allt - res["0-7"]
    check("roles b: LC -t 0-7 next to LC -t 8-15 bursts onto every TPC but 8-15 (last kernel)",
          ok_a and ok_b and rows_a and rows_a[-1] == want_a,
          f"{len(rows_a)} kernels, last {ranges(rows_a[-1]) if rows_a else '-'}, want {ranges(want_a)}; "
          f"--status: {(sa or {}).get('tpcs')} {(sa or {}).get('controller')}")
    check("roles b: LC -t 8-15 ran on everything, or everything but 0-7 while LC -t 0-7 lived, and on each",
          rows_b and all(r in (allt, want_b) for r in rows_b) and want_b in rows_b and allt in rows_b,
          f"{len(rows_b)} kernels: {sorted(set(ranges(r) for r in rows_b))}")
    # c. A stopped LC task: its controller goes stale, BE keeps off its reservation without waiting for it.
    #    Killed: its reservation is free again.
    tc, uc, rc_ = roles_lc_task("8-15", "roles-lc-stale")
    with tc:
        ready = wait_files([rc_], [tc.p], 60)
        os.kill(tc.pid, signal.SIGSTOP)
        time.sleep(0.6)
        state = wait_state(tc.pid, "stale", 5)
        t0 = time.monotonic()
        be, rcb, errb = probe_tpcs([NV, "--no-mps", "--best-effort"])
        dt = time.monotonic() - t0
        check("roles c: LC -t 8-15 stopped (SIGSTOP): --status says its controller is stale",
              ready and state == "stale", f"state {state}")
        check("roles c: a BE task next to it runs on every TPC but 8-15, without waiting for it (< 10 s)",
              be == allt - res["8-15"] and dt < 10, f"{ranges(be or [])} in {dt:.1f}s rc={rcb} {errb.strip()[-200:]}")
        os.kill(tc.pid, signal.SIGKILL)
        os.kill(tc.pid, signal.SIGCONT)
        tc.finish(30)
    be2, _, _ = probe_tpcs([NV, "--no-mps", "--best-effort"])
    check("roles c: LC task killed (SIGKILL): a BE task runs on every TPC again", be2 == allt, ranges(be2 or []))
    # d. A saturated LC task (compute-bound, back to back, on -t 0-15): it runs on its reservation and BE
    #    kernels on their floor, as the same BE probe of another Unix user does.
    rc, out, err, dt = run([f"{GPUBIN}/busy", "--work", "40"], timeout=120)
    m = re.search(r"busy: ([\d.]+) s", out)
    per = float(m.group(1)) / 40 if m else 0.01
    work = max(40, int(6.0 / max(per, 1e-4)))  # about 6 s on every TPC
    two_users()
    rc, out, err, _ = run([NV, "--topology", "--json"], timeout=120)
    with open(HARD + "/topology.json", "w") as f:  # nvt-b reads the layout root found
        f.write(json.dumps(json.loads(out)["devices"][0]))
    os.chmod(HARD + "/topology.json", 0o644)

    def run_as(user, cmd):
        e = user_env(user)
        e["NVTASKSET_TOPOLOGY"] = HARD + "/topology.json"
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=as_user(user), env=e)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = 124, "", "[TIMEOUT]"
        LOG.write(f"$ [as {user}] {' '.join(cmd)}  [rc={rc}]\n{out}{err}\n")
        return rc, out, err

    # (Without its top-up, which f checks: its floor is then every TPC but its reservation.)
    with Task([NV, "--no-mps", "-t", "0-15", "--latency-critical", f"{GPUBIN}/busy", "--work", str(work)],
              "roles-lc-sat", env={"NVTASKSET_LC_TOPUP": "off"}) as ts:
        state = wait_state(ts.pid, "saturated", 15)
        check("roles d: LC -t 0-15 running compute-bound kernels back to back: --status says saturated",
              state == "saturated", f"state {state} (busy --work {work}, {per * 1e3:.2f} ms a kernel alone)")
        rc, out, err, _ = run([NV, "--no-mps", "--best-effort", f"{GPUBIN}/smid_probe", "--iters", "3"], timeout=60)
        rows = [parse_ranges(l.split()[-1]) for l in out.splitlines() if l.startswith("iter ")]
        st = wait_state(ts.pid, "saturated", 1)
        check("roles d: a BE task's kernels next to it run on every TPC but 0-15 (its floor)",
              rc == 0 and len(rows) == 3 and all(r == allt - res["0-15"] for r in rows) and st == "saturated",
              f"{[ranges(r) for r in rows]} rc={rc} (LC still {st}) {err.strip()[-200:]}")
        # Kernels with thread-block clusters (bf16 cuBLAS matmuls launch clusters of 2 and 4) go on the floor
        # too, where it hosts them: 1024 blocks of one block per SM cover every SM they may use.
        for size in (2, 8):
            rc, out, err, _ = run([NV, "--no-mps", "--best-effort", f"{GPUBIN}/cluster_probe", "--size", str(size),
                                   "--clusters", str(1024 // size)], timeout=60)
            m = re.search(r"tpcs:([\d ]+)", out)
            ran = {int(x) for x in m.group(1).split()} if m else set()
            floor = allt - res["0-15"]
            st = wait_state(ts.pid, "saturated", 1)
            check(f"roles d: a BE task's kernels with clusters of {size} next to it run on its floor, which hosts them",
                  rc == 0 and ran and ran <= floor and len(ran) >= len(floor) // 2 and st == "saturated",
                  f"ran on {ranges(ran)} (floor {ranges(floor)}) rc={rc} (LC still {st}) {err.strip()[-200:]}")
        rc, out, err = run_as("nvt-b", [HARD + "/bin/nvtaskset", "--no-mps", "--best-effort", HARD + "/smid_probe",
                                        "--iters", "2"])
        rows2 = [parse_ranges(l.split()[-1]) for l in out.splitlines() if l.startswith("iter ")]
        check("roles d: the same BE task as another Unix user (nvt-b) keeps off it too",
              rc == 0 and len(rows2) == 2 and all(r == allt - res["0-15"] for r in rows2),
              f"{[ranges(r) for r in rows2]} rc={rc} {err.strip()[-200:]}")
        rcp, op, ep = run_as("nvt-b", [HARD + "/bin/nvtaskset", "-p", "-t", "16-31", str(ts.pid)])
        check("roles d: the other user cannot steer the LC task (-p -t 16-31)", rcp != 0, f"rc={rcp} {ep.strip()}")
        ts.kill()
    # f. The top-up (NVTASKSET_LC_TOPUP): a saturated LC task takes TPCs beyond its reservation, and BE
    #    kernels keep off them. NVTASKSET_TEST_TOPUP fixes it at 8 (where the controller's measurement
    #    would put it is the benchmark's to show: bench/lc_be_mix.py); --status names them, and the BE
    #    task's kernels run on every TPC but the reservation and those (%smid, no MPS).
    with Task([NV, "--no-mps", "-t", "0-15", "--latency-critical", f"{GPUBIN}/busy", "--work", str(work)],
              "roles-lc-topup", env={"NVTASKSET_TEST_TOPUP": "8"}) as tt:
        state = wait_state(tt.pid, "saturated", 15)
        t0, c = time.monotonic(), {}
        while time.monotonic() - t0 < 10:
            c = (status_of(tt.pid) or {}).get("controller") or {}
            if c.get("topup_size") == 8 and c.get("topup_tpcs"):
                break
            time.sleep(0.2)
        topup = parse_ranges(c.get("topup_tpcs") or "") if c.get("topup_tpcs") else set()
        check("roles f: a saturated LC -t 0-15 with a top-up of 8: --status names 8 TPCs outside its reservation",
              state == "saturated" and len(topup) == 8 and not (topup & res["0-15"]),
              f"state {state}, topup_tpcs {c.get('topup_tpcs')!r}, topup_size {c.get('topup_size')}")
        rc, out, err, _ = run([NV, "--no-mps", "--best-effort", f"{GPUBIN}/smid_probe", "--iters", "3"], timeout=60)
        rows = [parse_ranges(l.split()[-1]) for l in out.splitlines() if l.startswith("iter ")]
        st = wait_state(tt.pid, "saturated", 1)
        check("roles f: a BE task's kernels next to it run on every TPC but its reservation and its top-up",
              rc == 0 and len(rows) == 3 and all(r == allt - res["0-15"] - topup for r in rows) and st == "saturated",
              f"{[ranges(r) for r in rows]} (want {ranges(allt - res['0-15'] - topup)}) rc={rc} (LC still {st}) "
              f"{err.strip()[-200:]}")
        rc, out, err, _ = run([NV, "--status"], timeout=30)
        line = next((l for l in out.splitlines() if l.startswith(str(tt.pid) + " ")), "")
        check("roles f: the --status table says it is topped up", "(topped up with " in line, line.strip())
        tt.kill()
    # g. A `-p` that changes a saturated LC task's reservation voids its durations alone (measured on the old
    #    TPCs): its controller probes again at once, not at its next probe 4 s after the last. Taken just after
    #    a probe, so that the next regular one is 4 s away; --status counts them (topup_probes).
    # (About 18 s of work: waiting for saturation and then for a probe takes up to 5 s; with 6 s the task had
    #  ended before the -p in run 65.) `busy` queues deeper than a probe lasts, so its probes time nothing and
    #  are also retried every 0.5 s: the check shows the probe comes at once (0.02 s in runs 63 and 66), but
    #  cannot alone tell the -p's from a retry; the unit test TopUp.ANewReservationIsProbedAtOnce can.
    with Task([NV, "--no-mps", "-t", "0-15", "--latency-critical", f"{GPUBIN}/busy", "--work", str(3 * work)],
              "roles-lc-forget") as tg:
        state = wait_state(tg.pid, "saturated", 15)
        t0, c, seen = time.monotonic(), {}, None
        while time.monotonic() - t0 < 12:
            c = (status_of(tg.pid) or {}).get("controller") or {}
            n = c.get("topup_probes")
            if seen is not None and isinstance(n, int) and n > seen and not c.get("probing"):
                break
            seen = n if isinstance(n, int) else seen
            time.sleep(0.05)
        before, t_probe = c.get("topup_probes"), time.monotonic()
        rcp, op, ep, _ = run([NV, "-p", "-t", "0-23", str(tg.pid)], timeout=30)
        t_p = time.monotonic()
        after, c2 = before, {}
        while time.monotonic() - t_p < 1.5:
            c2 = (status_of(tg.pid) or {}).get("controller") or {}
            after = c2.get("topup_probes")
            if isinstance(after, int) and isinstance(before, int) and after > before:
                break
            time.sleep(0.05)
        dt = time.monotonic() - t_p
        check("roles g: -p -t 0-23 on a saturated LC -t 0-15 makes its controller probe again at once (< 1.5 s; "
              "the regular probe is 4 s after the last)",
              state == "saturated" and rcp == 0 and isinstance(before, int) and isinstance(after, int)
              and after > before and time.monotonic() - t_probe < 4.0,
              f"state {state}, -p rc={rcp} {ep.strip()[-200:]}, probes {before} -> {after} in {dt:.2f} s, "
              f"{c2.get('state')}, tpcs {(status_of(tg.pid) or {}).get('tpcs')}")
        tg.kill()
    # e. Under MPS, by throughput: BE's compute-bound work alone, next to a stale LC task on -n 16, and after
    #    the LC task died.
    times = {}
    tl = None
    try:
        rc, out, err, _ = run([NV, "--best-effort", f"{GPUBIN}/busy", "--work", str(work // 3)], timeout=120)
        m = re.search(r"busy: ([\d.]+) s", out)
        times["alone"] = float(m.group(1)) if m else None
        # The reference: the same work on a plain partition of as many TPCs as the floor has (a BE kernel's
        # blocks come in waves, so the time is not simply proportional to the TPC count).
        rc, out, err, _ = run([NV, "-n", str(ntpcs() - 16), f"{GPUBIN}/busy", "--work", str(work // 3)], timeout=120)
        m = re.search(r"busy: ([\d.]+) s", out)
        times["n_floor"] = float(m.group(1)) if m else None
        until, ready = fresh_path("roles-mps-until"), fresh_path("roles-mps-ready")
        tl = Task([NV, "-n", "16", "--latency-critical", f"{GPUBIN}/smid_probe", "--interval-ms", "100",
                   "--until-file", until, "--ready-file", ready], "roles-mps-lc")
        with tl:
            ok = wait_files([ready], [tl.p], 60)
            os.kill(tl.pid, signal.SIGSTOP)
            state = wait_state(tl.pid, "stale", 5)
            rc, out, err, _ = run([NV, "--best-effort", f"{GPUBIN}/busy", "--work", str(work // 3)], timeout=120)
            m = re.search(r"busy: ([\d.]+) s", out)
            times["stale"] = float(m.group(1)) if m else None
            os.kill(tl.pid, signal.SIGKILL)
            os.kill(tl.pid, signal.SIGCONT)
            tl.finish(30)
        rc, out, err, _ = run([NV, "--best-effort", f"{GPUBIN}/busy", "--work", str(work // 3)], timeout=120)
        m = re.search(r"busy: ([\d.]+) s", out)
        times["after"] = float(m.group(1)) if m else None
    finally:
        stop_mps_safely()
    if None in times.values() or len(times) < 4:
        check("roles e: the MPS throughput runs completed", False, str(times))
        return
    want = times["n_floor"] / times["alone"]
    r1, r2 = times["stale"] / times["alone"], times["after"] / times["alone"]
    check(f"roles e (MPS): BE work next to a stale LC task on -n 16 takes what it takes on -n {ntpcs() - 16} "
          f"({want:.2f}x its time alone, +-12%)",
          ok and state == "stale" and want > 1.1 and abs(r1 / want - 1) < 0.12, f"{r1:.3f}x ({times}; LC {state})")
    check("roles e (MPS): after the LC task died, BE work takes its time alone again (+-8%)", abs(r2 - 1) < 0.08,
          f"{r2:.3f}x")


SECTIONS = ["calibrate", "probe", "lists", "gpc", "live", "mps", "torch", "bench", "errors", "multi", "systemwide",
            "graphs", "clusters", "libclusters", "torchgraphs", "graphoverhead", "graphbench", "hardening", "sharing", "racing", "multiuser", "smcount", "startupcache", "queues", "forks", "roles", "trust"]

if __name__ == "__main__":
    wanted = sys.argv[1:] or SECTIONS
    rc, out, err, _ = run(["nvidia-smi", "--query-gpu=name,uuid,driver_version", "--format=csv,noheader"])
    log(f"INFO GPU: {out.strip()}")
    if "calibrate" not in wanted:
        rc, out, err, _ = run([NV, "--topology", "--json"], timeout=180)
        topo = json.loads(out)["devices"][0]
    for s in wanted:
        log(f"== {s}")
        try:
            globals()[f"section_{s}"]()
        except Exception as e:  # a broken section is a failure, not a crash of the whole run
            check(f"section {s} completed", False, repr(e))
    log(f"== {failures} failure(s)")
    sys.exit(min(failures, 100))
