"""The `allreduce` suite: all-reduce latency and bandwidth over message sizes on N ranks.

Each call is timed after a host barrier with the GPU idle, by CUDA events on the current stream
(NCCL's stream waits for it and it waits for NCCL's: the events bracket the collective); on CPU by
a monotonic clock. The figure per call is the slowest rank's.

algbw = bytes / time; busbw = algbw * 2(n-1)/n, the traffic each link carries in a ring. A sweep
over sizes fits time = o + bytes / w (backend/commfit.py), the model the bucket-size chart uses.
"""
from __future__ import annotations

from pydantic import Field

from worker.suites.common import Device, Dtype, Samples, SuiteParams, Untimed, WorldSize

DESCRIPTION = "All-reduce latency, algorithm and bus bandwidth vs message size and world size (NCCL or gloo)"


class Params(SuiteParams):
    size_mb: float = Field(16.0, gt=0, le=16_384)
    world_size: WorldSize = 2
    dtype: Dtype = "fp32"
    warmup: Untimed = Field(5, description="untimed all-reduces first")
    repeats: Samples = Field(20, description="timed all-reduces: the samples of one run")
    device: Device = "auto"


def allreduce_rank(rank: int, world: int, cfg: dict) -> dict:
    """Time all-reduce of cfg['size_mb'] MB in cfg['dtype'] on every rank: per-call samples and the byte count."""
    import time

    import torch
    import torch.distributed as dist

    from kernels.names import torch_dtype

    on_gpu = cfg["device"] == "cuda"
    dtype = torch_dtype(cfg["dtype"])
    elem = torch.tensor([], dtype=dtype).element_size()
    n = max(1, int(cfg["size_mb"] * 2**20 / elem))
    x = torch.ones(n, dtype=dtype, device=f"cuda:{rank}" if on_gpu else "cpu")
    host_group = dist.new_group(backend="gloo")
    samples = []
    for i in range(cfg["warmup"] + cfg["repeats"]):
        if on_gpu:
            torch.cuda.synchronize()
        dist.barrier(group=host_group)
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(x)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            dist.all_reduce(x)
            ms = (time.perf_counter() - t0) * 1e3
        if i >= cfg["warmup"]:
            samples.append(ms)
    return {"rank": rank, "samples_ms": samples, "bytes": n * elem, "backend": dist.get_backend()}


def run(p: Params, ctx) -> dict:
    from parallel.launch import launch
    from worker.harness import Timing, resolve_rank_device
    from worker.stats import slowest_rank

    device = resolve_rank_device(p.device, p.world_size)
    ranks = launch(allreduce_rank, p.world_size, args=({**p.model_dump(), "device": device},), device=device,
                      timeout_s=1800)
    r0 = ranks[0]
    t = Timing.from_samples(slowest_rank([r["samples_ms"] for r in ranks]))
    algbw = r0["bytes"] / (t.median_ms * 1e-3) / 1e9  # GB/s
    return {**t.as_dict(), "bytes": r0["bytes"], "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (p.world_size - 1) / p.world_size, "backend": r0["backend"],
            "rank_samples_ms": [r["samples_ms"] for r in ranks], "world_size": p.world_size}
