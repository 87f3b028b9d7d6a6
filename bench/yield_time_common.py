# SPDX-License-Identifier: Apache-2.0
"""What both modes of bench/yield_time.py share: the TPCs of the LC and the BE, the script a worker
runs as, the BE's matmul for a kernel time, the private MPS daemon and a worker's "ready".
"""
import os
import subprocess
import time

LC_TPCS, BE_ALL, BE_FLOOR = "0-15", "0-65", "16-65"
# The script a worker runs as (`yield_time.py ROLE ...`, under nvtaskset): the entry beside this file.
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "yield_time.py")


def matmul_for(ms):
    """The BE matmul for a kernel of about MS ms on a whole GPU, as "NxK": N x K x N bf16. An
    N x K x N matmul does 2*N*N*K flops, about 700 TFLOP/s on a whole H100/H200
    (docs/results.md), so K ~ ms * 700e9 / (2 * N * N). N is 8192, and 2048 below 0.1 ms,
    where K would fall under 256 at 8192 (many short kernels: the gates' spacing by learned
    work, docs/design.md). The time a kernel took is measured and printed, not assumed."""
    n = 8192 if ms >= 0.1 else 2048
    return f"{n}x{max(256, int(ms * 700e9 / (2 * n * n)) // 256 * 256)}"


def matmul_dims(nk):
    n, k = (int(x) for x in nk.split("x"))
    return n, k


class Daemon:
    def __init__(self, root):
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(root, "pipe"),
                        CUDA_MPS_LOG_DIRECTORY=os.path.join(root, "log"))
        os.makedirs(self.env["CUDA_MPS_PIPE_DIRECTORY"])
        os.makedirs(self.env["CUDA_MPS_LOG_DIRECTORY"])
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True, timeout=30)

    def stop(self):
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=self.env, timeout=30)


def wait_ready(log, p, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.poll() is not None:
            raise RuntimeError(f"worker exited ({p.returncode}): {open(log + '.err').read()[-300:]}")
        try:
            if open(log).readline().strip() == "ready":
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"worker not ready in {timeout} s")

