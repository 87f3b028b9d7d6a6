# SPDX-License-Identifier: Apache-2.0
"""bench/lc_be_mix.py's setups: the table of the ways of sharing the GPU it runs (setup_table), the
targets, the load patterns and the times its plan and its driver assume. Standard library only:
bench/plot_lc_be.py reads the setup names and targets through lc_be_mix, without torch.
"""
import collections

PCT = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"

# How a worker starts: the argv before `python3 lc_be_mix.py _worker ROLE ...`, and what is
# added to its environment.
Launch = collections.namedtuple("Launch", "prefix env")
# name; whether the MPS control daemon runs; how LC and BE start (None: not started); what it is.
Setup = collections.namedtuple("Setup", "name mps lc be about")

BASE_GPU, BASE_RES, BASE_BE, ROLES = "lc-alone-gpu", "lc-alone-res", "be-alone", "roles"
BASE_SIZED = "lc-alone-res-sized"
# The roles with an L2 persisting window for the LC task (one of the options the roles
# were to evaluate: an L2 persisting carve-out): its worker gives its capture stream a persisting access policy window over its
# largest weight (LCBE_L2_WINDOW), which the captured kernels keep (tests/gpu/l2_window_capture.cu);
# the set-aside itself is the MPS server's (--l2-persist-pct). Only when named in --setups.
ROLES_L2 = "roles-l2"
# BE alone under --best-effort (no LC task): what the role costs a BE task by itself. Only when named.
BE_ROLE_ALONE = "be-alone-role"
# What MPS costs the BE task by itself, apart from the role: BE alone as a plain MPS client, and
# under --best-effort without MPS (--no-mps). Only when named.
BE_MPS_ALONE, BE_ROLE_NOMPS_ALONE = "be-alone-mps", "be-alone-role-nomps"
# The roles' other ways for the BE task to make way (launch pacing), each a
# setup named in --setups: a deeper BE queue, and NVTASKSET_BE_YIELD's floor and run. Since
# nvtaskset sets CUDA_MPS_CLIENT_PRIORITY by role, every roles setup runs its BE at below-normal
# priority; mps-be-low is plain MPS with the BE client so (the GPU then prefers the LC's waiting
# blocks to the BE's).
PRIO_ENV, YIELD_ENV = "CUDA_MPS_CLIENT_PRIORITY", "NVTASKSET_BE_YIELD"
# A --best-effort task's launches in flight while an LC task exists (nvtaskset's options.hpp:
# 1-1024, default 64 under the gate, 4 under the hold); --be-depth sets it for every roles setup's BE.
BE_DEPTH_ENV = "NVTASKSET_BE_DEPTH"
MPS_BE_LOW = "mps-be-low"
# name -> (the BE's environment beyond the roles setup's, what it is)
ROLE_VARIANTS = {
    "roles-d8": ({BE_DEPTH_ENV: "8"}, f"BE queue of 8 launches ({BE_DEPTH_ENV}=8)"),
    "roles-d16": ({BE_DEPTH_ENV: "16"}, f"BE queue of 16 launches ({BE_DEPTH_ENV}=16)"),
    "roles-t250": ({BE_DEPTH_ENV: "256", "NVTASKSET_BE_QUEUE_US": "250"},
                   "BE queue bounded in time: 250 us, at most 256 launches"),
    "roles-t500": ({BE_DEPTH_ENV: "256", "NVTASKSET_BE_QUEUE_US": "500"},
                   "BE queue bounded in time: 500 us, at most 256 launches"),
    "roles-t1000": ({BE_DEPTH_ENV: "256", "NVTASKSET_BE_QUEUE_US": "1000"},
                    "BE queue bounded in time: 1 ms, at most 256 launches"),
    "roles-w250": ({"NVTASKSET_BE_WORK_US": "250"}, "BE queue bounded in learned work: 250 us"),
    "roles-w500": ({"NVTASKSET_BE_WORK_US": "500"}, "BE queue bounded in learned work: 500 us"),
    "roles-w1000": ({"NVTASKSET_BE_WORK_US": "1000"}, "BE queue bounded in learned work: 1 ms"),
    "roles-floor": ({YIELD_ENV: "floor"}, f"BE on its floor while LC bursts ({YIELD_ENV}=floor)"),
    "roles-fd4": ({"NVTASKSET_BE_FLOOR_DEPTH": "4"},
                  "BE queue of 4 launches on its floor too (NVTASKSET_BE_FLOOR_DEPTH=4; the default is 16)"),
    "roles-run": ({YIELD_ENV: "run"}, f"BE not held while LC bursts ({YIELD_ENV}=run)"),
    "roles-gate": ({YIELD_ENV: "gate"}, f"BE stopped on the GPU by its gate while LC bursts ({YIELD_ENV}=gate)"),
    "roles-hold": ({YIELD_ENV: "hold"}, f"BE held on the CPU while LC bursts ({YIELD_ENV}=hold)"),
    "roles-gate1": ({YIELD_ENV: "gate", "NVTASKSET_BE_GATE_EVERY": "1"},
                    f"BE stopped by its gate, one before every launch ({YIELD_ENV}=gate, NVTASKSET_BE_GATE_EVERY=1)"),
    "roles-gate2": ({YIELD_ENV: "gate", "NVTASKSET_BE_GATE_EVERY": "2"},
                    f"BE stopped by its gate, one every 2 launches ({YIELD_ENV}=gate, NVTASKSET_BE_GATE_EVERY=2)"),
    "roles-gate-d64": ({YIELD_ENV: "gate", "NVTASKSET_BE_DEPTH": "64"},
                       f"BE stopped by its gate, 64 launches queued ({YIELD_ENV}=gate, NVTASKSET_BE_DEPTH=64)"),
    "roles-gate2-d64": ({YIELD_ENV: "gate", "NVTASKSET_BE_GATE_EVERY": "2", "NVTASKSET_BE_DEPTH": "64"},
                        f"BE stopped by its gate, one every 2 launches, 64 launches queued ({YIELD_ENV}=gate, "
                        "NVTASKSET_BE_GATE_EVERY=2, NVTASKSET_BE_DEPTH=64)"),
    "roles-d16f16": ({BE_DEPTH_ENV: "16", "NVTASKSET_BE_FLOOR_DEPTH": "16"},
                     f"BE queue of 16 launches, 16 on its floor (the gate's defaults before run 77; {BE_DEPTH_ENV}=16, "
                     "NVTASKSET_BE_FLOOR_DEPTH=16)"),
    "roles-d64f64": ({BE_DEPTH_ENV: "64", "NVTASKSET_BE_FLOOR_DEPTH": "64"},
                     f"BE queue of 64 launches, 64 on its floor ({BE_DEPTH_ENV}=64, NVTASKSET_BE_FLOOR_DEPTH=64)"),
    "roles-b0": ({"NVTASKSET_BE_BORROW_US": "0"},
                 "every BE kernel borrows the idle reservation, long ones too (NVTASKSET_BE_BORROW_US=0)"),
    "roles-b2000": ({"NVTASKSET_BE_BORROW_US": "2000"},
                    "BE kernels timed at 2 ms or more keep off the idle reservation (NVTASKSET_BE_BORROW_US=2000)"),
    "roles-deep": ({BE_DEPTH_ENV: "1024", "NVTASKSET_BE_FLOOR_DEPTH": "1024"},
                   f"BE stopped by its gate, 1024 launches queued, on its floor too ({BE_DEPTH_ENV}=1024, "
                   "NVTASKSET_BE_FLOOR_DEPTH=1024)"),
}
# Other static shapes, LC -n L --exclusive / BE -n B --exclusive (only when named): how many TPCs the
# LC task needs beyond its reservation to run at its speed alone there next to the BE task (the
# memory system is shared; docs/runs.md, "A top-up that pays for the memory system").
STATIC_SHAPES = {f"static-{l}-{b}": (l, b) for l, b in ((20, 46), (24, 42), (28, 38), (32, 34))}
# The roles without the LC task's top-up (NVTASKSET_LC_TOPUP=off): its reservation only while saturated.
ROLES_NO_TOPUP = "roles-no-topup"
# The roles with a BE task that never borrows the reservation (--best-effort -n BE_N, chosen after
# the LC task's -n: the TPCs it leaves): an LC request then starts at once on its reservation
# instead of waiting there for the BE kernels in flight, at the cost of the training's use of it
# while the LC task is idle. Only when named.
ROLES_NO_BORROW = "roles-nb"
OPTIONAL = ((BASE_SIZED, ROLES_L2, BE_ROLE_ALONE, BE_MPS_ALONE, BE_ROLE_NOMPS_ALONE, MPS_BE_LOW, ROLES_NO_TOPUP,
             ROLES_NO_BORROW)
            + tuple(ROLE_VARIANTS) + tuple(STATIC_SHAPES))
ROLE_SETUPS = (ROLES, ROLES_L2, ROLES_NO_TOPUP, ROLES_NO_BORROW) + tuple(ROLE_VARIANTS)
L2_ENV = "LCBE_L2_WINDOW"
L2_PCT_ENV = "CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT"


def setup_table(nv, lc_n, be_n, be_depth=None):
    """THE table of setups."""
    plain = Launch([], {})
    be_role_env = {BE_DEPTH_ENV: str(be_depth)} if be_depth is not None else {}
    lc_res = Launch([nv, "-n", str(lc_n), "--exclusive"], {})
    return [
        Setup(BASE_GPU, False, plain, None, "LC alone, a plain process on the whole GPU (baseline)"),
        Setup(BASE_RES, True, lc_res, None, f"LC alone on its reservation, nvtaskset -n {lc_n} --exclusive (baseline)"),
        Setup(BASE_BE, False, None, plain, "BE alone, a plain process on the whole GPU (baseline)"),
        Setup("time-slicing", False, plain, plain, "both plain processes, no MPS"),
        Setup("mps", True, plain, plain, "both MPS clients, no limits"),
        Setup("mps-25-75", True, Launch([], {PCT: "25"}), Launch([], {PCT: "75"}),
              f"MPS clients, {PCT}=25 (LC) / 75 (BE)"),
        Setup("static", True, lc_res, Launch([nv, "-n", str(be_n), "--exclusive"], {}),
              f"nvtaskset -n {lc_n} --exclusive (LC) / -n {be_n} --exclusive (BE)"),
        # Only when named in --setups: is sizing the task to its partition (cudaDevAttrMultiProcessorCount
        # = its SMs) worth making the default of -n? (docs/runs.md, "Sizing the task to its partition")
        Setup(BASE_SIZED, True, Launch(lc_res.prefix + ["--partition-sm-count"], {}), None,
              f"LC alone on its reservation, sized to it: nvtaskset -n {lc_n} --exclusive --partition-sm-count"),
        # ---- HOOK: the roles. Only with --with-roles (checked against nvtaskset --help). ----
        Setup(ROLES, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {}),
              Launch([nv, "--best-effort"], be_role_env),
              f"nvtaskset -n {lc_n} --latency-critical (LC) / --best-effort (BE)"
              + (f", {BE_DEPTH_ENV}={be_depth}" if be_depth is not None else "")),
        Setup(BE_ROLE_ALONE, True, None, Launch([nv, "--best-effort"], be_role_env),
              "BE alone under nvtaskset --best-effort (an MPS client; no LC task)"),
        Setup(BE_MPS_ALONE, True, None, plain, "BE alone, a plain MPS client (no nvtaskset)"),
        Setup(BE_ROLE_NOMPS_ALONE, False, None, Launch([nv, "--no-mps", "--best-effort"], be_role_env),
              "BE alone under nvtaskset --no-mps --best-effort (no MPS, no LC task)"),
        Setup(MPS_BE_LOW, True, plain, Launch([], {PRIO_ENV: "1"}),
              f"both MPS clients, no limits, BE at below-normal priority ({PRIO_ENV}=1)"),
        Setup(ROLES_NO_TOPUP, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {"NVTASKSET_LC_TOPUP": "off"}),
              Launch([nv, "--best-effort"], be_role_env),
              "the roles, the LC task on its reservation only while saturated (NVTASKSET_LC_TOPUP=off)"),
        Setup(ROLES_NO_BORROW, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {}),
              Launch([nv, "-n", str(be_n), "--best-effort"], be_role_env),
              f"the roles, the BE task on the {be_n} TPCs the reservation leaves (-n {be_n} --best-effort): "
              "it never borrows the reservation"),
        Setup(ROLES_L2, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {L2_ENV: "1"}),
              Launch([nv, "--best-effort"], be_role_env),
              "the roles, the LC task's kernels with a persisting L2 window over its largest weight"),
    ] + [Setup(name, True, Launch([nv, "-n", str(lc_n), "--latency-critical"], {}),
               Launch([nv, "--best-effort"], dict(be_role_env, **env)), "the roles, " + about)
         for name, (env, about) in ROLE_VARIANTS.items()] + [
        Setup(name, True, Launch([nv, "-n", str(l), "--exclusive"], {}), Launch([nv, "-n", str(b), "--exclusive"], {}),
              f"nvtaskset -n {l} --exclusive (LC) / -n {b} --exclusive (BE)")
        for name, (l, b) in STATIC_SHAPES.items()]


ROLE_OPTIONS = ("--latency-critical", "--best-effort")

# The mix's targets: pattern -> (baseline the LC p99 is compared with, max ratio, BE minimum,
# whether that minimum is a ratio to BE alone or it/s).
TARGETS = {
    "poisson44": ("gpu", 1.25, 0.90, "ratio"),
    "poisson87": ("gpu", 1.50, 0.80, "ratio"),
    "closed": ("res", 1.10, 8.6, "it/s"),
}

# For the estimate and the time budget (seconds); the run measures the real start-up time and
# uses the largest it saw.
CHECK_S, STARTUP_S, SETTLE_S, TEARDOWN_S, WINDOW_OVERHEAD_S, MPS_TOGGLE_S = 8, 17, 0.5, 2, 0.4, 2
BE_RESUME_S = 0.3  # after BE resumes, before a window starts
# Before each window of the roles setup, the LC idles this long (BE running): the roles keep state
# across windows (the LC's burst budget and the BE's hold budget, exponentially weighted shares of
# time busy; burst_budget.hpp), so a window that follows the closed loop would otherwise start with
# bursting stopped, and on its reservation the LC is busy enough at 44 or 87 req/s (6.6-8.7 ms a
# request, H100) that it might not resume within the window. 1.5 s idle takes the LC's share (time
# constant 1 s) from at most 1 (a long closed loop) to 0.22, below its resume share (0.35), and the
# BE's (200 ms) to nothing. (1 s was enough after 2-s closed windows, whose share ends near 0.6,
# but not after 12-s ones: run 38 had an open-loop window that never burst.)
ROLES_IDLE_S = 1.5
LC_WARMUP_REPLAYS = 10
BE_WARMUP_STEPS = 3


def patterns_of(rates):
    """[(name, rate)]: rate None is the closed loop."""
    return [("closed", None)] + [(f"poisson{r:g}", r) for r in rates]


def window_s(a, rate):
    return a.closed_s if rate is None else a.window_s
