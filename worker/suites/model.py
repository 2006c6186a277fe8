"""The `model` suite: forward, forward+backward or a full training step of the CS336 Transformer LM.

What CS336 asks of a systems person: per-scope time, what mixed precision and torch.compile buy,
where memory goes, and how activation checkpointing trades compute for memory.

Model FLOPs (kernels.flops.transformer_flops): ~ 2*params*tokens forward plus causal attention,
backward 2x forward. MFU = achieved FLOP/s over the device's measured dense-matmul peak in the
compute dtype (measured once per runner process, an 8192^3 matmul).
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, model_validator

from kernels.names import MODEL_ATTENTION_IMPLS, MODEL_SIZES
from kernels.names import autocast_dtype as autocast_dtype_of
from worker.suites.common import Device, NonNegative, Positive, SuiteParams

DESCRIPTION = "CS336 Transformer LM: forward / backward / training step across sizes, precision, compile, checkpointing"

Size = Literal[(*MODEL_SIZES, "custom")]
Scope = Literal["fwd", "fwd_bwd", "step"]


class Params(SuiteParams):
    size: Size = "small"
    d_model: Positive | None = Field(None, description="with size=custom")
    d_ff: Positive | None = Field(None, description="with size=custom")
    num_layers: Positive | None = Field(None, description="with size=custom")
    num_heads: Positive | None = Field(None, description="with size=custom")
    context_length: Positive = 512
    batch: Positive = 4
    vocab_size: Positive = 10_000
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32",
                                                       description="bf16/fp16: autocast; fp16 adds loss scaling")
    compile: bool = False
    attention: Literal[MODEL_ATTENTION_IMPLS] = "naive"
    checkpointing: str = Field("none", pattern=r"^(none|block|nested|every_[1-9][0-9]*)$")
    optimizer: Literal["course", "torch", "torch_fused", "sgd"] = "course"
    scope: Scope = "step"
    warmup: NonNegative = Field(3, description="untimed steps first; 0 shows first-call costs")
    steps: Positive = 10
    device: Device = "auto"
    profile: bool = Field(False, description="write a profiler trace, kernel summary and memory snapshot")
    memory_detail: bool = Field(False, description="count saved-for-backward bytes per block")

    @model_validator(mode="after")
    def _custom_dims(self):
        dims = ("d_model", "d_ff", "num_layers", "num_heads")
        given = [d for d in dims if getattr(self, d) is not None]
        if self.size == "custom" and len(given) != 4:
            raise ValueError(f"size=custom needs all of {', '.join(dims)}")
        if self.size != "custom" and given:
            raise ValueError(f"{', '.join(given)} only apply with size=custom (size is {self.size!r})")
        if self.size == "custom" and self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} must be divisible by num_heads {self.num_heads}")
        return self

    def dims(self) -> tuple[int, int, int, int]:
        """(d_model, d_ff, num_layers, num_heads)."""
        if self.size == "custom":
            return self.d_model, self.d_ff, self.num_layers, self.num_heads  # type: ignore[return-value]
        s = MODEL_SIZES[self.size]
        return s.d_model, s.d_ff, s.num_layers, s.num_heads


_PEAK_CACHE: dict[tuple[str, str], float] = {}

KERNEL_CATEGORIES = (
    ("communication", ("nccl", "allreduce", "all_reduce", "allgather", "reduce_scatter")),
    ("attention", ("flash", "attn", "_fwd_kernel", "_bwd_", "fmha", "sdpa", "cudnn")),
    ("matmul", ("gemm", "matmul", "sm90_xmma", "cutlass", "nvjet", "wgmma", "::mm", "bmm", "addmm", "linear")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "fused_adam", "_amp_")),
    ("softmax", ("softmax", "logsumexp")),
)


def kernel_category(name: str) -> str:
    """Bucket a CUDA kernel name into matmul / attention / softmax / optimizer / communication / elementwise."""
    low = name.lower()
    for category, needles in KERNEL_CATEGORIES:
        if any(n in low for n in needles):
            return category
    return "elementwise"


def measured_peak_tflops(device: str, dtype) -> float | None:
    """Dense matmul TFLOP/s of this device in `dtype` (8192^3, median of 10), cached per process."""
    import torch

    from worker.harness import measure

    if not device.startswith("cuda"):
        return None
    key = (device, str(dtype))
    if key not in _PEAK_CACHE:
        n = 8192
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        t = measure(lambda: a @ b, warmup=3, repeats=10, device=device, flush_l2=False)
        _PEAK_CACHE[key] = 2 * n**3 / (t.median_ms * 1e-3) / 1e12
    return _PEAK_CACHE[key]


def saved_bytes_per_block(model, tokens) -> int:
    """Bytes one block saves for backward (saved-tensor hooks; a storage counted once), measured on
    block 0 alone so that counting never needs a whole un-checkpointed model's activations."""
    import torch

    seen: set[int] = set()
    total = 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    x = model.token_embeddings(tokens).detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model.layers[0](x)
    del out
    return total


def predicted_activation_bytes(policy: str, num_layers: int, per_block: int, residual: int) -> int:
    """What checkpointing should keep alive at the start of backward, from the per-block numbers.

    none: every block's saved tensors, L * S. every_k: the input of each region (L/k residual
    tensors) plus one region's saved tensors during its recompute, k * S. nested with region g:
    L/g region inputs + g block inputs + one block's saved tensors.
    """
    from kernels.model import parse_checkpointing

    k, nested = parse_checkpointing(policy, num_layers)
    if k == 0:
        return num_layers * per_block
    regions = -(-num_layers // k)
    if nested:
        return regions * residual + k * residual + per_block
    return regions * residual + k * per_block


def run(p: Params, ctx) -> dict:
    import contextlib

    import torch

    from kernels.flops import transformer_flops
    from kernels.model import TransformerLM, count_parameters, cross_entropy
    from kernels.optim import make_optimizer
    from worker.harness import (
        SkipCell,
        measure,
        peak_memory_bytes,
        require_runnable_attention,
        reset_peak_memory,
        resolve_device,
    )

    device = resolve_device(p.device)
    d_model, d_ff, num_layers, num_heads = p.dims()
    require_runnable_attention(p.attention, device)
    if p.compile and device == "cpu":
        raise SkipCell("torch.compile cells are GPU-only here (CPU inductor needs a C++ toolchain per cell)")

    torch.manual_seed(0)
    ctx.progress("building model")
    with torch.device(device):  # initialise on the device: an xl model's 3.4B weights in seconds
        model = TransformerLM(p.vocab_size, p.context_length, d_model, num_layers, num_heads, d_ff,
                              attention=p.attention, checkpointing=p.checkpointing)
    n_params = count_parameters(model)
    param_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    opt = make_optimizer(p.optimizer, model.parameters())
    tokens = torch.randint(0, p.vocab_size, (p.batch, p.context_length), device=device)
    targets = torch.randint(0, p.vocab_size, (p.batch, p.context_length), device=device)

    autocast_dtype = autocast_dtype_of(p.precision)
    autocast = (lambda: torch.autocast(device_type=device.split(":")[0], dtype=autocast_dtype)) \
        if autocast_dtype else contextlib.nullcontext
    scaler = torch.amp.GradScaler(device.split(":")[0]) if p.precision == "fp16" else None
    fwd_model = torch.compile(model) if p.compile else model

    def forward_loss():
        with autocast():
            return cross_entropy(fwd_model(tokens), targets)

    def backward(loss):
        (scaler.scale(loss) if scaler else loss).backward()

    def zero():
        opt.zero_grad(set_to_none=True)

    if p.scope == "fwd":
        def step():
            with torch.no_grad():
                forward_loss()
        setup = None
    elif p.scope == "fwd_bwd":
        def step():
            backward(forward_loss())
        setup = zero
    else:
        def step():
            zero()
            backward(forward_loss())
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
        setup = None

    ctx.progress(f"warm-up ({p.warmup} steps)")
    timing = measure(step, warmup=p.warmup, repeats=p.steps, device=device, setup=setup, flush_l2=False)
    ctx.progress("measuring memory")
    zero()
    reset_peak_memory(device)
    if setup:
        setup()
    step()
    peak = peak_memory_bytes(device)
    opt_state_bytes = sum(t.numel() * t.element_size() for s in opt.state.values()
                          for t in s.values() if torch.is_tensor(t))

    flops = transformer_flops(p.batch, p.context_length, d_model, d_ff, num_layers, p.vocab_size)
    scope_flops = flops["fwd"] if p.scope == "fwd" else flops["fwd_bwd"]
    achieved = scope_flops / (timing.median_ms * 1e-3)
    peak_tflops = measured_peak_tflops(device, autocast_dtype or torch.float32)
    metrics = {
        **timing.as_dict(),
        "tokens_per_s": p.batch * p.context_length / (timing.median_ms * 1e-3),
        "model_flops": scope_flops,
        "tflops": achieved / 1e12,
        "peak_tflops_measured": peak_tflops,
        "mfu": achieved / (peak_tflops * 1e12) if peak_tflops else None,
        "params": n_params,
        "param_bytes": param_bytes,
        "optimizer_state_bytes": opt_state_bytes,
        "peak_mem_bytes": peak,
        "residual_stream_bytes": p.batch * p.context_length * d_model * (2 if autocast_dtype else 4),
        "device": device,
        "optimizer_impl": {"course": "course AdamW (kernels.optim)", "torch": "torch.optim.AdamW foreach",
                           "torch_fused": "torch.optim.AdamW fused", "sgd": "torch.optim.SGD"}[p.optimizer],
        "fp32_matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
    }
    if p.memory_detail:
        ctx.progress("counting saved tensors per block")
        zero()
        with autocast():
            per_block = saved_bytes_per_block(model, tokens)
        metrics["saved_bytes_per_block"] = per_block
        metrics["predicted_activation_bytes"] = predicted_activation_bytes(
            p.checkpointing, num_layers, per_block, metrics["residual_stream_bytes"])
    if p.profile:
        ctx.progress("profiling")
        metrics["kernel_breakdown_ms"] = _profile(step, setup, device, ctx)
    return metrics


def _profile(step, setup, device: str, ctx) -> dict[str, float]:
    """Profile 3 steps: Chrome trace, kernel summary by category, and (CUDA) a memory snapshot."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from worker.profiling import op_times_ms

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities, record_shapes=False) as prof:
        for _ in range(3):
            if setup:
                setup()
            step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(ctx.artifact("trace.json")))
    by_category: dict[str, float] = {}
    top = []
    for name, t in op_times_ms(prof, steps=3, on_gpu=device.startswith("cuda")).items():
        cat = kernel_category(name)
        by_category[cat] = by_category.get(cat, 0.0) + t["ms_per_step"]
        top.append({"name": name[:200], "ms_per_step": t["ms_per_step"], "calls": t["calls_per_step"],
                    "category": cat})
    ctx.artifact("kernels.json").write_text(json.dumps({"by_category_ms": by_category, "top": top[:50]}, indent=1))
    if device.startswith("cuda"):
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        try:
            if setup:
                setup()
            step()
            torch.cuda.synchronize()
            torch.cuda.memory._dump_snapshot(str(ctx.artifact("memory_snapshot.pickle")))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    return by_category
