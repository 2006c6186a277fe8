"""The `ddp` suite: a data-parallel training step under each wrapper, on N ranks.

Reports step time (median over steps, rank 0), time inside collectives and waiting in
finish_gradient_synchronization, overhead = step time / the same step without communication,
and memory per rank (parameters, gradients, optimizer state, the rest) after construction,
before the optimizer step and after it. The model is the CS336 Transformer LM at the given dims.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from parallel.names import WRAPPER_NAMES
from worker.suites.common import Device, NonNegative, Positive, SuiteParams

DESCRIPTION = "Data-parallel training step: naive/flat/overlapped/bucketed DDP, torch DDP, ZeRO-1, FSDP on N ranks"


class Params(SuiteParams):
    wrapper: Literal[WRAPPER_NAMES] = "bucketed"
    bucket_size_mb: float = Field(25.0, gt=0, le=10_000, description="bucketed, torch_ddp and zero1")
    world_size: Positive = 2
    d_model: Positive = 512
    num_layers: Positive = 4
    num_heads: Positive = 8
    d_ff: Positive = 2048
    vocab_size: Positive = 10_000
    context_length: Positive = 128
    batch: Positive = Field(2, description="sequences per rank")
    precision: Literal["fp32", "bf16"] = "fp32"
    optimizer: Literal["adamw", "sgd"] = "adamw"
    warmup: NonNegative = 2
    steps: Positive = 5
    device: Device = "auto"
    threads_per_rank: NonNegative = Field(0, description="CPU only: torch threads per rank (0: torch's default)")

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} must be divisible by num_heads {self.num_heads}")
        return self


def run(p: Params, ctx) -> dict:
    from parallel.bench import train_step_rank
    from parallel.launch import launch
    from worker.harness import Timing, resolve_rank_device

    device = resolve_rank_device(p.device, p.world_size)
    cfg = {**p.model_dump(), "device": device, "attention": "sdpa"}
    ctx.progress(f"launching {p.world_size} ranks ({device})")
    per_rank = launch(train_step_rank, p.world_size, args=(cfg,), device=device, timeout_s=3600)
    r0 = per_rank[0]
    t, base = Timing.from_samples(r0["samples_ms"]), Timing.from_samples(r0["nocomm_samples_ms"])
    median = lambda xs: Timing.from_samples(xs).median_ms if xs else None  # noqa: E731 (a one-line summary helper)
    mem = r0["memory"]
    return {
        **t.as_dict(),
        "slowest_rank_median_ms": max(Timing.from_samples(r["samples_ms"]).median_ms for r in per_rank),
        "nocomm_median_ms": base.median_ms,
        "overhead": t.median_ms / base.median_ms,
        "comm_ms": median(r0["comm_samples_ms"]),
        "wait_ms": median(r0["wait_samples_ms"]),
        "memory_per_rank": mem.get("before_step"),
        "memory_after_construction": mem.get("after_construction"),
        "memory_after_step": mem.get("after_step"),
        "peak_mem_bytes": r0["peak_mem_bytes"],
        "backend": r0["backend"],
        "world_size": p.world_size,
    }
