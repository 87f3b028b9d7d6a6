#!/usr/bin/env python3
"""Real-GPU verification of nvtaskset (docs/verification.md records the results).

Run from the repository root on a machine with an NVIDIA GPU, with the build in
./build and the CUDA check programs (tests/gpu/*.cu, built with nvcc) in $GPUBIN:

    GPUBIN=.dev/gpu OUT=/tmp/out python3 tests/gpu/verify.py [section ...]

Every GPU command has a timeout. Each check prints PASS/FAIL with its evidence;
the exit status is the number of failures. Sections: calibrate, probe, lists,
gpc, live, mps, torch, bench, errors (default: all).
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
        rc_q, q, _, _ = run([NV, "-p", str(pid)], timeout=30)
        lines_before_change = open(outpath).read().count("\n")
        rc_c, c, cerr, dt = run([NV, "-p"] + spec_b + [str(pid)], timeout=30)
        lines_at_change = open(outpath).read().count("\n")
        time.sleep(0.5)
        open(until, "w").close()
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = -9
    lines = [l for l in open(outpath).read().splitlines() if l.startswith("iter ")]
    tps = [parse_ranges(l.split()[-1]) for l in lines]
    # The header line ("pid ...") precedes the iterations. Kernels printed
    # before -p started were launched before it; the first kernel not yet
    # printed when -p returned may have been launched before that; every
    # later one was launched after.
    before, after = tps[:max(lines_before_change - 1, 0)], tps[lines_at_change:]
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


def section_mps():
    n = ntpcs()
    half_a, half_b = f"0-{n // 2 - 1}", f"{n // 2}-{n - 1}"
    rc, out, err, full = run([f"{GPUBIN}/busy"], timeout=120)
    log(f"INFO busy alone on the whole GPU: {out.strip()} ({full:.2f}s wall)")
    rc, out, err, half = run([NV, "--no-mps", "-t", half_a, f"{GPUBIN}/busy"], timeout=120)
    check("busy on half the TPCs takes about twice as long", rc == 0 and 1.6 < half / full < 2.6,
          f"{half:.2f}s vs {full:.2f}s = {half / full:.2f}x")
    try:
        t0 = time.monotonic()
        pa = subprocess.Popen([NV, "-t", half_a, f"{GPUBIN}/busy"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        time.sleep(1.0)  # the first start also starts the daemon; let it come up
        pb = subprocess.Popen([NV, "-t", half_b, f"{GPUBIN}/busy"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        oa, ea = pa.communicate(timeout=180)
        ob, eb = pb.communicate(timeout=180)
        wall = time.monotonic() - t0
        log(f"INFO co-run a: {oa.strip()} {ea.strip()}")
        log(f"INFO co-run b: {ob.strip()} {eb.strip()}")
        ta = float(re.search(r"busy: ([\d.]+)", oa).group(1))
        tb = float(re.search(r"busy: ([\d.]+)", ob).group(1))
        check("nvtaskset started the MPS daemon and said how to stop it", "quit" in ea, ea.strip())
        check("two MPS clients on complementary halves co-run (each about as fast as alone on its half)",
              pa.returncode == 0 and pb.returncode == 0 and max(ta, tb) < 1.35 * half,
              f"a {ta:.2f}s, b {tb:.2f}s, alone on a half {half:.2f}s; sum if serialised {ta + tb:.2f}s; "
              f"wall {wall:.2f}s")
    finally:
        stop_mps()


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
                           "--shim-dir", SHIM_DIR], timeout=300)
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


SECTIONS = ["calibrate", "probe", "lists", "gpc", "live", "mps", "torch", "bench", "errors"]

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
