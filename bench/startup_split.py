#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a task's own CUDA start-up time goes under nvtaskset (docs/results.md, Fig. 11a).

bench_startup shows main->kernel (the task's CUDA initialisation) slower under nvtaskset than
alone. This splits the candidates apart, side by side in one run, configurations interleaved
round by round: CUDA_DEVICE_MAX_CONNECTIONS=8 alone, the shim loaded with no partition, the
shim with a partition (through the CLI), outside MPS and as MPS clients. It prints, for each,
the median of main -> cudaDeviceSynchronize() returning after the first kernel (first_kernel's
main_ns and sync_ns, both CLOCK_MONOTONIC in the task) and its ratio to the plain program.

    python3 bench/startup_split.py [--rounds N] [--hold] [--channels] [BIN]
    (BIN: what bench/build_eval.sh built, default .dev/eval)

--hold: another process (first_kernel --hold, outside MPS) keeps the GPU open meanwhile, so the
driver does not bring the GPU up for each run.
--channels: instead, split the cost of the hardware channels: CUDA_DEVICE_MAX_CONNECTIONS (compute
and copy connections) against CUDA_DEVICE_MAX_COPY_CONNECTIONS (copy connections alone), outside
MPS and as MPS clients; then count how many clients holding their context one MPS server admits
at each setting (up to 48; --no-capacity skips this).
--server-env NAME=VALUE (repeatable): the MPS control daemon, so every server it starts, gets this
in its environment; the clients' environments are as before.
"""
import argparse
import os
import select
import statistics
import subprocess

from benchproc import interleaved, mps, run_matching


def run(cmd, env):
    m = run_matching(cmd, env, r"main_ns (\d+) kernel_ns (-?\d+) sync_ns (\d+)", 60)
    return (int(m.group(3)) - int(m.group(1))) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--hold", action="store_true", help="keep the GPU open from another process meanwhile")
    ap.add_argument("--channels", action="store_true", help="split compute and copy connections' cost")
    ap.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                    help="start the MPS control daemon (so its servers) with this in its environment")
    ap.add_argument("--no-capacity", action="store_true", help="with --channels, skip counting clients")
    ap.add_argument("bin", nargs="?", default=".dev/eval")
    a = ap.parse_args()
    server_env = {}
    for kv in a.server_env:
        name, sep, value = kv.partition("=")
        if not sep or not name:
            ap.error(f"--server-env {kv!r}: expected NAME=VALUE")
        server_env[name] = value
    child = os.path.join(a.bin, "cuda/first_kernel")
    nv = os.path.join(a.bin, "nvt/bin/nvtaskset")
    shim = os.path.join(a.bin, "nvt/lib/nvtaskset")
    conn = "CUDA_DEVICE_MAX_CONNECTIONS"
    copy = "CUDA_DEVICE_MAX_COPY_CONNECTIONS"
    channel_settings = {
        "": {},
        "conn8": {conn: "8"},
        "conn8 copy2": {conn: "8", copy: "2"},
        "conn8 copy1": {conn: "8", copy: "1"},
        "conn8 copy4": {conn: "8", copy: "4"},
        "conn4": {conn: "4"},
        "copy8": {copy: "8"},
        "copy4": {copy: "4"},
        "copy2": {copy: "2"},
    }
    if a.channels:
        configs = {("plain " + k).strip(): ([child], env) for k, env in channel_settings.items()}
        mps_configs = {("mps client " + k).strip(): ([child], env) for k, env in channel_settings.items()}
        mps_configs["nvtaskset -t 0-32 (mps)"] = ([nv, "-t", "0-32", child], {})
        mps_configs["nvtaskset -t 0-32 (mps) copy2"] = ([nv, "-t", "0-32", child], {copy: "2"})
        mps_configs["nvtaskset -t 0-32 (mps) conn4"] = ([nv, "-t", "0-32", child], {conn: "4"})
        mps_configs["nvtaskset -t 0-32 (mps) conn2"] = ([nv, "-t", "0-32", child], {conn: "2"})
    else:
        configs = {
            "plain": ([child], {}),
            "conn8": ([child], {conn: "8"}),
            "shim, no partition": ([child], {"LD_LIBRARY_PATH": shim}),
            "nvtaskset --no-mps -t 0-32": ([nv, "--no-mps", "-t", "0-32", child], {}),
        }
        mps_configs = {
            "mps client": ([child], {}),
            "mps client, conn8": ([child], {conn: "8"}),
            "mps client, shim, no partition": ([child], {"LD_LIBRARY_PATH": shim}),
            "nvtaskset -t 0-32 (mps)": ([nv, "-t", "0-32", child], {}),
        }
    times = {k: [] for k in list(configs) + list(mps_configs)}

    def measure(group):
        interleaved(group, a.rounds, run, times)

    holder = None
    if a.hold:
        holder = subprocess.Popen([child, "--hold"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        holder.stdout.readline()
    try:
        mps("stop")
        measure(configs)
        mps("start", server_env)
        measure(mps_configs)
        if a.channels and not a.no_capacity:
            admitted = {k: capacity(child, channel_settings[k]) for k in ("", "conn8", "conn8 copy4", "conn4")}
        mps("stop")
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=30)
    print(f"main -> first kernel done, in ms (median of {a.rounds}, interleaved)"
          + (", GPU held open by another process" if a.hold else ""))
    for base, group in (("plain", configs), ("mps client", mps_configs)):
        b = statistics.median(times[base])
        for k in group:
            med = statistics.median(times[k])
            print(f"  {k:34s} {med:8.1f}  {med / b:6.3f}x {base}")
    if server_env:
        print("MPS control daemon started with " + " ".join(f"{k}={v}" for k, v in server_env.items()))
    if a.channels and not a.no_capacity:
        print(f"MPS clients one server admitted, each holding its context (up to {CAPACITY_MAX}):")
        for k, n in admitted.items():
            print(f"  {k or 'default':34s} {n}")


CAPACITY_MAX = 48


def capacity(child, env):
    """How many clients, each holding its context open, the running MPS server admits."""
    e = dict(os.environ)
    e.update(env)
    held = []
    try:
        while len(held) < CAPACITY_MAX:
            p = subprocess.Popen([child, "--hold"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, env=e)
            ready, _, _ = select.select([p.stdout], [], [], 30)
            line = p.stdout.readline() if ready else ""
            if "ok 1" not in line:
                p.kill()
                p.wait(timeout=30)
                break
            held.append(p)
        return len(held)
    finally:
        for p in held:
            p.stdin.close()
        for p in held:
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
