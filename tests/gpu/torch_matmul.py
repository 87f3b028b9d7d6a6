# SPDX-License-Identifier: Apache-2.0
"""bf16 matmul throughput under whatever partition this process runs in.

Prints "tflops <value>". Run it plainly and under nvtaskset; the ratio of the
two figures is the check (docs/verification.md)."""
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
iters = 20
t0 = time.perf_counter()
for _ in range(iters):
    a @ b
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(f"tflops {2 * n**3 * iters / dt / 1e12:.1f}")
