"""The `ddp` suite: a data-parallel training step under each wrapper, on N ranks, timed on the GPU.

Each rank (worker/suites/ddp_rank.py) times the wrapped step and the same step without
communication in alternating blocks, with CUDA events. Per step the figure is the slowest rank's
(ranks are aligned by a barrier before every step); per-rank samples are kept. From them:

  exposed_comm_ms = median(step) - median(nocomm step), with a 95 % bootstrap interval
  overhead        = median(step) / median(nocomm step), likewise
  comm_ms         = GPU time of the collectives per step (NCCL kernels; gloo's on CPU) on the rank with
                    the most. A collective's kernel starts when its rank reaches it and spins until every
                    rank has, so this includes waiting for the last rank: an upper bound
  comm_transfer_ms = the same on the rank with the least, the one that reached the collectives last
                    and so waited least: the nearest figure to the transfers themselves (with overlap
                    still stretched by the compute kernels running beside them)
  gpu_busy        = time a kernel was running / step time; below HOST_BOUND the cell is host-bound:
                    the host's launching, not the GPU's work, sets its pace, and its figures are not
                    a measure of the wrapper

Memory per rank (parameters, gradients, optimizer state, the rest; each storage counted once) after
construction, before the optimizer step and after it.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kernels.names import MODEL_ATTENTION_IMPLS, MODEL_SIZES
from parallel.names import WRAPPER_NAMES
from worker.harness import HOST_BOUND
from worker.suites.common import Device, NonNegative, Positive, Samples, SuiteParams, Untimed, WorldSize

DESCRIPTION = "Data-parallel training step: naive/flat/overlapped/bucketed DDP, torch DDP, ZeRO-1, FSDP on N ranks"

CPU_DIMS = {"d_model": 512, "d_ff": 2048, "num_layers": 4, "num_heads": 8}  # size=auto on CPU
GPU_SIZE = "xl"  # size=auto on a GPU: big enough that the GPUs, not the host, set the pace
DEFAULT_CONTEXT = {"cpu": 128, "cuda": 512}
DEFAULT_BATCH = {"cpu": 2, "cuda": 4}


class Params(SuiteParams):
    wrapper: Literal[WRAPPER_NAMES] = "bucketed"
    bucket_size_mb: float = Field(25.0, gt=0, le=10_000, description="bucketed, torch_ddp and zero1")
    world_size: WorldSize = 2
    size: Literal[("auto", *MODEL_SIZES, "custom")] = Field(
        "auto", description=f"auto: {GPU_SIZE} on GPUs; on CPU the custom dims (default "
                            f"d_model {CPU_DIMS['d_model']}, {CPU_DIMS['num_layers']} layers)")
    d_model: Positive | None = Field(None, description="with size=custom (or auto on CPU)")
    num_layers: Positive | None = Field(None, description="with size=custom (or auto on CPU)")
    num_heads: Positive | None = Field(None, description="with size=custom (or auto on CPU)")
    d_ff: Positive | None = Field(None, description="with size=custom (or auto on CPU)")
    vocab_size: Positive = 10_000
    context_length: Positive | None = Field(None, description="default: 512 on GPUs, 128 on CPU")
    batch: Positive | None = Field(None, description="sequences per rank; default: 4 on GPUs, 2 on CPU")
    precision: Literal["fp32", "bf16"] = "fp32"
    optimizer: Literal["adamw", "sgd"] = "adamw"
    attention: Literal[MODEL_ATTENTION_IMPLS] = "sdpa"
    warmup: Untimed = Field(2, description="untimed steps of each variant")
    steps: Samples = Field(20, description="timed steps of each variant: the samples of one run")
    device: Device = "auto"
    threads_per_rank: NonNegative = Field(0, description="CPU only: torch threads per rank (0: torch's default)")

    @model_validator(mode="after")
    def _dims(self):
        given = {k: getattr(self, k) for k in CPU_DIMS if getattr(self, k) is not None}
        if given and self.size not in ("auto", "custom"):
            raise ValueError(f"{', '.join(given)} only apply with size=custom (size is {self.size!r})")
        d_model, heads = given.get("d_model", CPU_DIMS["d_model"]), given.get("num_heads", CPU_DIMS["num_heads"])
        if d_model % heads:
            raise ValueError(f"d_model {d_model} must be divisible by num_heads {heads}")
        return self

    def resolve(self, device: str) -> dict:
        """The cell's model and batch on `device` ('cpu' or 'cuda'): dims, context, batch."""
        given = {k: getattr(self, k) for k in CPU_DIMS if getattr(self, k) is not None}
        size = self.size
        if size == "auto":
            size = "custom" if device == "cpu" or given else GPU_SIZE
        dims = {**CPU_DIMS, **given} if size == "custom" else vars(MODEL_SIZES[size]).copy()
        return {**dims, "size": size, "context_length": self.context_length or DEFAULT_CONTEXT[device],
                "batch": self.batch or DEFAULT_BATCH[device]}


def run(p: Params, ctx) -> dict:
    from parallel.launch import launch
    from worker.harness import Timing, require_runnable_attention, resolve_rank_device
    from worker.stats import difference_interval, ratio_interval, slowest_rank
    from worker.suites.ddp_rank import train_step_rank

    device = resolve_rank_device(p.device, p.world_size)
    require_runnable_attention(p.attention, device)
    model = p.resolve(device)
    cfg = {**p.model_dump(), **model, "device": device}
    ctx.progress(f"launching {p.world_size} ranks ({device}, {model['size']} model)")
    ranks = launch(train_step_rank, p.world_size, args=(cfg,), device=device, timeout_s=3600)

    step = slowest_rank([r["samples_ms"] for r in ranks])
    nocomm = slowest_rank([r["nocomm_samples_ms"] for r in ranks])
    t, base = Timing.from_samples(step), Timing.from_samples(nocomm)
    exposed, exposed_lo, exposed_hi = difference_interval(nocomm, step)
    overhead, overhead_lo, overhead_hi = ratio_interval(nocomm, step)
    most_comm = max(ranks, key=lambda r: r["comm_ms"])
    busy = [r["busy_ms"] for r in ranks if r["busy_ms"] is not None]
    # kernel time per profiled step over the unprofiled median step; profiled steps can run a little
    # longer, so a GPU-bound cell can read just over 1: capped
    gpu_busy = min(1.0, min(busy) / t.median_ms) if busy else None
    r0 = ranks[0]
    return {
        **t.as_dict(),
        "rank_samples_ms": [r["samples_ms"] for r in ranks],
        **base.as_dict("nocomm_"),
        "nocomm_rank_samples_ms": [r["nocomm_samples_ms"] for r in ranks],
        "exposed_comm_ms": exposed, "exposed_comm_ci_low": exposed_lo, "exposed_comm_ci_high": exposed_hi,
        "overhead": overhead, "overhead_ci_low": overhead_lo, "overhead_ci_high": overhead_hi,
        "comm_ms": most_comm["comm_ms"],
        "comm_transfer_ms": min(r["comm_ms"] for r in ranks),
        "comm_ms_by_rank": [r["comm_ms"] for r in ranks],
        "comm_by_kind_ms": most_comm["comm_by_kind_ms"],
        "gpu_busy": gpu_busy,
        "host_bound": gpu_busy is not None and gpu_busy < HOST_BOUND,
        "memory_per_rank": r0["memory"].get("before_step"),
        "memory_after_construction": r0["memory"].get("after_construction"),
        "memory_after_step": r0["memory"].get("after_step"),
        "memory_by_rank": [r["memory"] for r in ranks],
        "peak_mem_bytes": max((r["peak_mem_bytes"] for r in ranks if r["peak_mem_bytes"] is not None), default=None),
        "params_total": r0["params_total"],
        "grad_bytes": r0["grad_bytes"],
        "buckets": r0["buckets"],
        "model": model,
        "backend": r0["backend"],
        "world_size": p.world_size,
    }
