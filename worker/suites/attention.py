"""The `attention` suite: latency, TFLOP/s and peak memory of one attention implementation.

Inputs are q, k, v shaped (batch, heads, seq_len, d_head), contiguous. FLOPs (kernels/flops.py):
forward 4*b*h*s^2*d (halved when causal), backward 2.5x, forward+backward 3.5x.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from kernels.names import ATTENTION_IMPLS
from worker.suites.common import Device, Dtype, NonNegative, Positive, SuiteParams

DESCRIPTION = "Attention kernels (naive, SDPA, FlashAttention-2 in PyTorch and Triton): latency, TFLOP/s, memory"

Impl = Literal[ATTENTION_IMPLS]
Pass = Literal["fwd", "bwd", "fwd_bwd"]


class Params(SuiteParams):
    impl: Impl = "flash_triton"
    batch: Positive = 4
    heads: Positive = 8
    seq_len: Positive = 1024
    d_head: int = Field(64, gt=0, le=256)
    dtype: Dtype = "bf16"
    causal: bool = True
    pass_: Pass = Field("fwd_bwd", alias="pass")
    device: Device = "auto"
    warmup: NonNegative = 3
    repeats: Positive = 10


def time_attention(fn, q, k, v, causal: bool, pass_: str, *, warmup: int, repeats: int, device: str):
    """Time one scope of `fn(q, k, v, causal)`. Returns (Timing, peak_extra_bytes or None).

    fwd: a forward with no autograd graph. bwd: backward alone, graph built once and retained.
    fwd_bwd: forward then backward. Memory is measured on one extra, untimed run of the scope.
    """
    import torch

    from worker.harness import measure, peak_memory_bytes, reset_peak_memory

    def clear_grads():
        q.grad = k.grad = v.grad = None

    if pass_ == "fwd":
        def step():
            with torch.no_grad():
                fn(q, k, v, causal)
        setup = None
    elif pass_ == "bwd":
        out = fn(q, k, v, causal)
        grad = torch.randn_like(out)

        def step():
            out.backward(grad, retain_graph=True)
        setup = clear_grads
    else:
        grad = torch.randn(q.shape, dtype=q.dtype, device=q.device)

        def step():
            fn(q, k, v, causal).backward(grad)
        setup = clear_grads
    timing = measure(step, warmup=warmup, repeats=repeats, device=device, setup=setup)

    peak_extra = None
    if device.startswith("cuda"):
        clear_grads()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        reset_peak_memory(device)
        step()
        peak_extra = peak_memory_bytes(device) - before
        clear_grads()
    return timing, peak_extra


def run(p: Params, ctx) -> dict:
    import torch

    from kernels.flops import attention_flops
    from kernels.impls import get_attention
    from kernels.names import torch_dtype
    from worker.harness import SkipCell, require_runnable_attention, resolve_device

    device = resolve_device(p.device)
    dtype = torch_dtype(p.dtype)
    require_runnable_attention(p.impl, device)
    fn = get_attention(p.impl)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (p.batch, p.heads, p.seq_len, p.d_head)
    needs_grad = p.pass_ != "fwd"
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=gen).requires_grad_(needs_grad)
               for _ in range(3))
    try:
        timing, peak_extra = time_attention(fn, q, k, v, p.causal, p.pass_, warmup=p.warmup,
                                            repeats=p.repeats, device=device)
    except RuntimeError as exc:
        if "No available kernel" in str(exc) or "not supported" in str(exc).lower():
            raise SkipCell(f"{p.impl} cannot run this configuration: {str(exc).splitlines()[0]}") from exc
        raise
    flops = attention_flops(p.batch, p.heads, p.seq_len, p.seq_len, p.d_head, p.causal, p.pass_)
    return {
        **timing.as_dict(),
        "tflops": flops / (timing.median_ms * 1e-3) / 1e12,
        "flops": flops,
        "peak_mem_bytes": peak_extra,
        "device": device,
    }
