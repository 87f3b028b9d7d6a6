# SPDX-License-Identifier: Apache-2.0
"""What the side-by-side bench scripts (startup_split.py, copy_queues.py) share: running a
program with a few variables added to the environment and reading its one result line, running
a group of configurations interleaved, and starting or stopping the MPS control daemon between
groups."""
import os
import random
import re
import subprocess
import time


def run_matching(cmd, env, pattern, timeout):
    """Runs cmd with env added to ours; the match of pattern in its stdout. A failed run, or one
    without the line, raises RuntimeError with the end of its stderr."""
    e = dict(os.environ)
    e.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    m = re.search(pattern, p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"{' '.join(cmd)}: rc={p.returncode} {p.stderr.strip()[-300:]}")
    return m


def mps(cmd, server_env=None):
    """cmd "start": starts the MPS control daemon, with server_env added to its environment (so to
    every server it starts); anything else stops it. Then waits a second for it to settle."""
    e = dict(os.environ)
    e.update(server_env or {})
    subprocess.run(["nvidia-cuda-mps-control"] + (["-d"] if cmd == "start" else []),
                   input=None if cmd == "start" else "quit\n", text=True, capture_output=True, timeout=30,
                   env=e)
    time.sleep(1.0)


def interleaved(group, rounds, run, results):
    """group: name -> (cmd, env). One untimed warm-up run of each (caches, page cache), then
    `rounds` rounds, each running every configuration once in a new random order, so that the
    machine's drift touches them alike; appends run(cmd, env) to results[name]."""
    for cmd, env in group.values():
        run(cmd, env)
    for _ in range(rounds):
        order = list(group)
        random.shuffle(order)
        for k in order:
            results[k].append(run(*group[k]))
