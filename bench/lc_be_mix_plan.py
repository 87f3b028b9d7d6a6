# SPDX-License-Identifier: Apache-2.0
"""bench/lc_be_mix.py's checks and plan: what nvtaskset and the GPU's Python offer, the visits a round
makes (visit_groups), the estimated time and the plan --dry-run prints.
"""
import json
import subprocess
import sys

from lc_be_mix_setups import (CHECK_S, MPS_TOGGLE_S, ROLE_OPTIONS, ROLE_SETUPS, ROLES_IDLE_S, SETTLE_S, STARTUP_S,
                              TEARDOWN_S, WINDOW_OVERHEAD_S, window_s)


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

