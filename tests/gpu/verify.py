#!/usr/bin/env python3
"""Real-GPU verification of nvtaskset (docs/verification.md records the results).

Run from the repository root on a machine with an NVIDIA GPU, with the build in
./build and the CUDA check programs (tests/gpu/*.cu, built with nvcc) in $GPUBIN:

    GPUBIN=.dev/gpu OUT=/tmp/out python3 tests/gpu/verify.py [section ...]

Every GPU command has a timeout. Each check prints PASS/FAIL with its evidence;
the exit status is the number of failures. Sections: calibrate, probe, lists,
gpc, live, mps, torch, bench, errors, multi (needs 2 GPUs), systemwide (default: all).
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
    until = os.path.join(OUT, f"until-{label}")
    ready = os.path.join(OUT, f"ready-{label}")
    for f in (until, ready):
        if os.path.exists(f):
            os.remove(f)
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
            region = os.path.exists(f"/dev/shm/nvtaskset.{p.pid}")
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


SECTIONS = ["calibrate", "probe", "lists", "gpc", "live", "mps", "torch", "bench", "errors", "multi", "systemwide"]

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
