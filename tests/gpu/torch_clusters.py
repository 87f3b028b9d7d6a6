# SPDX-License-Identifier: Apache-2.0
"""Runs one real-library workload, so that the shim's exit-time log line
"cluster sizes launched: ..." (NVTASKSET_LOG=debug) tells which thread-block
cluster sizes that library launches.

    python3 torch_clusters.py WORKLOAD

WORKLOAD: cublas (bf16 matmuls of several shapes), gpt2m-train (bench/lc_be_mix.py's best-effort
training, 3 steps), cublas-fp8 (torch._scaled_mm),
triton (a Triton matmul kernel written here, num_ctas 1 and, when Triton
accepts it, 2), sdpa-flash, sdpa-efficient, sdpa-cudnn
(torch.nn.functional.scaled_dot_product_attention restricted to one back end).
Prints "ok WORKLOAD ..." or "skipped WORKLOAD: reason"; exit status 0 either way
(a back end the installed PyTorch lacks is a finding, not a failure), 1 on a
wrong result."""
import sys

import torch

w = sys.argv[1]
dev = "cuda"


def cublas():
    for m, n, k in ((8192, 8192, 8192), (4096, 4096, 4096), (1024, 4096, 4096), (128, 8192, 8192), (16, 4096, 4096)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        y = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            z = x @ y
    torch.cuda.synchronize()
    return f"last {tuple(z.shape)}"


def cublas_fp8():
    x = torch.randn(4096, 4096, device=dev).to(torch.float8_e4m3fn)
    y = torch.randn(4096, 4096, device=dev).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device=dev)
    for _ in range(3):
        z = torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    return f"fp8 {tuple(z.shape)}"


def triton_mm():
    import triton
    import triton.language as tl

    @triton.jit
    def mm(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + rm[:, None] * sam + (k0 + rk)[None, :] * sak)
            b = tl.load(b_ptr + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn)
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.bfloat16))

    M = N = K = 2048
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
    ref = (a.float() @ b.float())
    done = []
    for ctas in (1, 2):
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        grid = (M // 128, N // 128)
        try:
            mm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                     BM=128, BN=128, BK=64, num_warps=8, num_stages=3, num_ctas=ctas)
            torch.cuda.synchronize()
        except Exception as e:  # num_ctas > 1 is Hopper-only and not in every Triton
            done.append(f"num_ctas={ctas} refused ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
            continue
        err = (c.float() - ref).abs().max().item()
        if err > 2.0:
            print(f"wrong result: triton num_ctas={ctas} max error {err}")
            sys.exit(1)
        done.append(f"num_ctas={ctas} ok (max error {err:.3f})")
    return f"triton {triton.__version__}: " + "; ".join(done)


def sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
          "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    q, k, v = (torch.randn(8, 16, 2048, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel([be]):
        for causal in (False, True):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.sum().backward()  # the backward kernels too
    torch.cuda.synchronize()
    return f"sdpa {backend} {tuple(o.shape)}"


def gpt2m_train():
    """The best-effort task of bench/lc_be_mix.py: GPT-2-medium training (random weights, bf16 autocast,
    batch 8 x 512, AdamW), 3 steps."""
    import transformers
    cfg = transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16)
    with torch.device(dev):
        model = transformers.GPT2LMHeadModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (8, 512), device=dev)
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return f"gpt2-medium train, 3 steps, loss {loss.item():.2f}"


work = {"cublas": cublas, "gpt2m-train": gpt2m_train, "cublas-fp8": cublas_fp8, "triton": triton_mm,
        "sdpa-flash": lambda: sdpa("flash"), "sdpa-efficient": lambda: sdpa("efficient"),
        "sdpa-cudnn": lambda: sdpa("cudnn")}
if w not in work:
    print(f"unknown workload {w}; one of {', '.join(work)}")
    sys.exit(2)
try:
    print(f"ok {w}: {work[w]()}", flush=True)
except Exception as e:  # a back end not available here
    print(f"skipped {w}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", flush=True)
