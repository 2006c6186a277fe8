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
    from worker.harness import Timing, resolve_rank_device

    device = resolve_rank_device(p.device, p.world_size)
    per_rank = launch(allreduce_rank, p.world_size, args=({**p.model_dump(), "device": device},), device=device,
                      timeout_s=1800)
    r0 = per_rank[0]
    t = Timing.from_samples(r0["samples_ms"])
    algbw = r0["bytes"] / (t.median_ms * 1e-3) / 1e9  # GB/s
    return {**t.as_dict(), "bytes": r0["bytes"], "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (p.world_size - 1) / p.world_size, "backend": r0["backend"],
            "world_size": p.world_size}
