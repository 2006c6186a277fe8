"""The `model` suite: forward, forward+backward or a full training step of the CS336 Transformer LM.

What CS336 asks of a systems person: per-scope time, what mixed precision and torch.compile buy,
where memory goes, and how activation checkpointing trades compute for memory.

Model FLOPs (kernels.flops.transformer_flops): ~ 2*params*tokens forward plus causal attention,
backward 2x forward. MFU = achieved FLOP/s over the device's measured dense-matmul peak in the
compute dtype (measured once per runner process, an 8192^3 matmul).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import Field, model_validator

from kernels.names import MODEL_ATTENTION_IMPLS, MODEL_SIZES
from kernels.names import autocast_dtype as autocast_dtype_of
from worker.suites.common import Device, Positive, Samples, SuiteParams, Untimed

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
    warmup: Untimed = Field(3, description="untimed steps first; 0 shows first-call costs")
    steps: Samples = Field(10, description="timed steps: the samples of one run")
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


def run(p: Params, ctx) -> dict:
    """Build the model and its step, time the step, then measure memory (and profile, if asked)."""
    from worker.harness import SkipCell, require_runnable_attention, resolve_device

    device = resolve_device(p.device)
    require_runnable_attention(p.attention, device)
    if p.compile and device == "cpu":
        raise SkipCell("torch.compile cells are GPU-only here (CPU inductor needs a C++ toolchain per cell)")
    cell = build(p, device, ctx)
    return measure_cell(p, cell, ctx)


@dataclass
class Cell:
    """A built model cell: the model, its optimizer and inputs, and the step the scope times."""

    model: Any
    opt: Any
    tokens: Any
    autocast: Callable[[], Any]
    autocast_dtype: Any
    step: Callable[[], None]
    setup: Callable[[], None] | None  # runs before each timed step, untimed (zero_grad for fwd_bwd)
    zero: Callable[[], None]
    device: str


def build(p: Params, device: str, ctx) -> Cell:
    import contextlib

    import torch

    from kernels.model import TransformerLM, cross_entropy
    from kernels.optim import make_optimizer

    d_model, d_ff, num_layers, num_heads = p.dims()
    torch.manual_seed(0)
    ctx.progress("building model")
    with torch.device(device):  # initialise on the device: an xl model's 3.4B weights in seconds
        model = TransformerLM(p.vocab_size, p.context_length, d_model, num_layers, num_heads, d_ff,
                              attention=p.attention, checkpointing=p.checkpointing)
    opt = make_optimizer(p.optimizer, model.parameters())
    tokens = torch.randint(0, p.vocab_size, (p.batch, p.context_length), device=device)
    targets = torch.randint(0, p.vocab_size, (p.batch, p.context_length), device=device)

    dtype = autocast_dtype_of(p.precision)
    autocast = (lambda: torch.autocast(device_type=device.split(":")[0], dtype=dtype)) if dtype \
        else contextlib.nullcontext
    scaler = torch.amp.GradScaler(device.split(":")[0]) if p.precision == "fp16" else None
    fwd_model = torch.compile(model) if p.compile else model

    def forward_loss():
        with autocast():
            return cross_entropy(fwd_model(tokens), targets)

    def backward(loss):
        (scaler.scale(loss) if scaler else loss).backward()

    def zero():
        opt.zero_grad(set_to_none=True)

    def forward_only():
        with torch.no_grad():
            forward_loss()

    def forward_backward():
        backward(forward_loss())

    def train_step():
        zero()
        backward(forward_loss())
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    step, setup = {"fwd": (forward_only, None), "fwd_bwd": (forward_backward, zero),
                   "step": (train_step, None)}[p.scope]
    return Cell(model, opt, tokens, autocast, dtype, step, setup, zero, device)


def measure_cell(p: Params, cell: Cell, ctx) -> dict:
    import torch

    from kernels.flops import transformer_flops
    from kernels.model import count_parameters
    from worker.harness import measure, measured_peak_tflops, peak_memory_bytes, reset_peak_memory

    d_model, d_ff, num_layers, _ = p.dims()
    device = cell.device
    ctx.progress(f"warm-up ({p.warmup} steps)")
    timing = measure(cell.step, warmup=p.warmup, repeats=p.steps, device=device, setup=cell.setup, flush_l2=False)
    ctx.progress("measuring memory")
    cell.zero()
    reset_peak_memory(device)
    if cell.setup:
        cell.setup()
    cell.step()
    peak = peak_memory_bytes(device)

    # model FLOPs: ~2 * params * tokens forward plus causal attention, backward twice the forward
    flops = transformer_flops(p.batch, p.context_length, d_model, d_ff, num_layers, p.vocab_size)
    scope_flops = flops["fwd"] if p.scope == "fwd" else flops["fwd_bwd"]
    achieved = scope_flops / (timing.median_ms * 1e-3)
    peak_tflops = measured_peak_tflops(device, cell.autocast_dtype or torch.float32)
    metrics = {
        **timing.as_dict(),
        "tokens_per_s": p.batch * p.context_length / (timing.median_ms * 1e-3),
        "model_flops": scope_flops,
        "tflops": achieved / 1e12,
        "peak_tflops_measured": peak_tflops,
        "mfu": achieved / (peak_tflops * 1e12) if peak_tflops else None,
        "params": count_parameters(cell.model),
        "param_bytes": sum(t.numel() * t.element_size() for t in cell.model.parameters()),
        "optimizer_state_bytes": sum(t.numel() * t.element_size() for s in cell.opt.state.values()
                                     for t in s.values() if torch.is_tensor(t)),
        "peak_mem_bytes": peak,
        "residual_stream_bytes": p.batch * p.context_length * d_model * (2 if cell.autocast_dtype else 4),
        "device": device,
        "optimizer_impl": {"course": "course AdamW (kernels.optim)", "torch": "torch.optim.AdamW foreach",
                           "torch_fused": "torch.optim.AdamW fused", "sgd": "torch.optim.SGD"}[p.optimizer],
        "fp32_matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
    }
    if p.memory_detail:
        from kernels.memory import predicted_activation_bytes, saved_bytes_per_block

        ctx.progress("counting saved tensors per block")
        cell.zero()
        with cell.autocast():
            per_block = saved_bytes_per_block(cell.model, cell.tokens)
        metrics["saved_bytes_per_block"] = per_block
        metrics["predicted_activation_bytes"] = predicted_activation_bytes(
            p.checkpointing, num_layers, per_block, metrics["residual_stream_bytes"])
    if p.profile:
        ctx.progress("profiling")
        metrics["kernel_breakdown_ms"] = _profile(cell.step, cell.setup, device, ctx)
    return metrics


def _profile(step, setup, device: str, ctx) -> dict[str, float]:
    """Profile 3 steps: Chrome trace, kernel summary by category, and (CUDA) a memory snapshot."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from worker.profiling import kernel_category, op_times_ms

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
