"""The `allreduce` suite: all-reduce latency and bandwidth over message sizes on N ranks.

algbw = bytes / time; busbw = algbw * 2(n-1)/n, the traffic each link carries in a ring.
"""
from __future__ import annotations

from pydantic import Field

from worker.suites.common import Device, Dtype, NonNegative, Positive, SuiteParams

DESCRIPTION = "All-reduce latency, algorithm and bus bandwidth vs message size and world size (NCCL or gloo)"


class Params(SuiteParams):
    size_mb: float = Field(16.0, gt=0, le=16_384)
    world_size: Positive = 2
    dtype: Dtype = "fp32"
    warmup: NonNegative = 5
    repeats: Positive = 20
    device: Device = "auto"


def run(p: Params, ctx) -> dict:
    from parallel.bench import allreduce_rank
    from parallel.launch import launch
    from worker.harness import resolve_rank_device

    device = resolve_rank_device(p.device, p.world_size)
    per_rank = launch(allreduce_rank, p.world_size, args=({**p.model_dump(), "device": device},), device=device,
                      timeout_s=1800)
    r0 = per_rank[0]
    return {k: r0[k] for k in ("median_ms", "p20_ms", "p80_ms", "mean_ms", "std_ms", "min_ms", "samples", "bytes",
                               "algbw_gbps", "busbw_gbps", "backend")} | {"world_size": p.world_size}
