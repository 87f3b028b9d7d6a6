# SPDX-License-Identifier: Apache-2.0
"""bench/lc_be_mix.py's worker process (run on the GPU machine): the LC task's GPT-2 inference captured
as one CUDA graph and its measurement windows, the BE task's GPT-2-medium training, and the
`lc_be_mix.py _worker lc|be` entry the driver starts. torch and transformers are imported inside
the functions that need them: importing this module needs neither.
"""
import argparse
import ctypes
import json
import os
import random
import select
import signal
import statistics
import sys
import time

from lc_be_mix_setups import BE_WARMUP_STEPS, L2_ENV, LC_WARMUP_REPLAYS


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
