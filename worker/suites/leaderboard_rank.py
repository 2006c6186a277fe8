"""What every rank of a `leaderboard` cell runs; worker/suites/leaderboard.py launches it and summarises.

One rank: (empty caches), build the model, shard it, warm up, time `steps` steps split into
forward / backward / optimizer, profile one more step for the collectives, report.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from kernels.names import autocast_dtype


def fresh_caches() -> list[str]:
    """Point Triton's and inductor's caches at new empty folders (the course's cold-start rule)."""
    made = []
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ[var] = tempfile.mkdtemp(prefix=f"benchlab-{var.lower()}-")
        made.append(os.environ[var])
    return made


def optimizer_factory(cfg: dict[str, Any]) -> tuple[type[torch.optim.Optimizer] | Callable, dict[str, Any]]:
    """(optimizer class or factory, its kwargs) for cfg's optimizer, state_dtype, param_dtype and offload."""
    from kernels.optim import AdamW
    from parallel.master_weights import MasterWeights

    if cfg["optimizer"] == "torch_fused":
        cls, kwargs = functools.partial(torch.optim.AdamW, fused=True), {"lr": 1e-4}
    else:
        cls, kwargs = AdamW, {"lr": 1e-4, "state_dtype": torch.bfloat16 if cfg["state_dtype"] == "bf16" else None}
    if cfg["param_dtype"] == "bf16" or cfg["offload"]:
        cls = functools.partial(MasterWeights, optimizer_cls=cls, device="cpu" if cfg["offload"] else None)
    return cls, kwargs


def shard(model: nn.Module, cfg: dict[str, Any]) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None],
                                                          torch.dtype | None]:
    """(module to call, optimizer, gradient-synchronisation finish, autocast dtype) for cfg['sharding']."""
    from parallel.ddp import BucketedDDP
    from parallel.fsdp import FSDP
    from parallel.sharded_optimizer import ShardedOptimizer

    compute = autocast_dtype(cfg["precision"])
    opt_cls, opt_kwargs = optimizer_factory(cfg)
    if cfg["param_dtype"] == "bf16":
        model = model.to(torch.bfloat16)
    if cfg["sharding"] == "fsdp":
        wrapped = FSDP(model, compute_dtype=compute)  # casts to the compute dtype itself: no autocast
        return wrapped, opt_cls(wrapped.parameters(), **opt_kwargs), wrapped.finish_gradient_synchronization, None
    wrapped = BucketedDDP(model, bucket_size_mb=25.0)
    if cfg["sharding"] == "zero1":
        opt = ShardedOptimizer(wrapped.parameters(), opt_cls, **opt_kwargs)
    else:
        opt = opt_cls(wrapped.parameters(), **opt_kwargs)
    return wrapped, opt, wrapped.finish_gradient_synchronization, compute


class Marks:
    """Points in a step: CUDA events on the current stream (GPU) or a monotonic clock (CPU)."""

    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self.points: list[Any] = []

    def mark(self) -> None:
        if self.on_gpu:
            evt = torch.cuda.Event(enable_timing=True)
            evt.record()
            self.points.append(evt)
        else:
            self.points.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        if self.on_gpu:
            self.points[-1].synchronize()
            return [a.elapsed_time(b) for a, b in itertools.pairwise(self.points)]
        return [(b - a) * 1e3 for a, b in itertools.pairwise(self.points)]


def matmul_peak(device: str) -> float | None:
    """The measured bf16 matmul TFLOP/s, or None when the GPU is too full for its 8192^2 operands."""
    from worker.harness import measured_peak_tflops

    try:
        return measured_peak_tflops(device, torch.bfloat16)
    except torch.OutOfMemoryError:
        return None


def leaderboard_rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run inside each rank. cfg: the suite's params plus the resolved dims and device ('cpu' or 'cuda')."""
    from kernels.model import TransformerLM
    from worker.profiling import step_breakdown
    from worker.suites.ddp_rank import memory_split

    started = time.perf_counter()
    caches = fresh_caches() if cfg["cold_start"] else []
    on_gpu = cfg["device"] == "cuda"
    device = f"cuda:{rank}" if on_gpu else "cpu"
    host_group = dist.new_group(backend="gloo")

    def settle() -> None:
        if on_gpu:
            torch.cuda.synchronize()
        dist.barrier(group=host_group)

    try:
        torch.manual_seed(0)  # the same initial weights on every rank, as replicas and shards need
        with torch.device(device):
            model = TransformerLM(cfg["vocab_size"], cfg["context_length"], cfg["d_model"], cfg["num_layers"],
                                  cfg["num_heads"], cfg["d_ff"], attention=cfg["attention"],
                                  checkpointing=cfg["checkpointing"])
        n_params = sum(p.numel() for p in model.parameters())
        if cfg["compile"]:
            for block in model.layers:
                block.compile()
        module, opt, finish, autocast = shard(model, cfg)
        g = torch.Generator().manual_seed(1000 + rank)
        shape = (cfg["batch"], cfg["context_length"])
        tokens = torch.randint(0, cfg["vocab_size"], shape, generator=g).to(device)
        targets = torch.randint(0, cfg["vocab_size"], shape, generator=g).to(device)

        def step(marks: Marks | None = None) -> None:
            mark = marks.mark if marks else (lambda: None)
            mark()
            opt.zero_grad(set_to_none=True)
            ctx = torch.autocast(device.split(":")[0], dtype=autocast) if autocast else contextlib.nullcontext()
            with ctx:
                loss = module(tokens, targets=targets, loss_chunk=cfg["loss_chunk"])
            mark()
            loss.backward()
            finish()
            mark()
            opt.step()
            mark()

        for _ in range(cfg["warmup"]):
            settle()
            step()
        settle()
        first_step_s = time.perf_counter() - started
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        samples, parts = [], {"forward": [], "backward": [], "optimizer": []}
        for i in range(cfg["steps"]):
            settle()
            marks = Marks(on_gpu)
            step(marks)
            fwd, bwd, opt_ms = marks.intervals_ms()
            samples.append(fwd + bwd + opt_ms)
            for name, ms in zip(parts, (fwd, bwd, opt_ms), strict=True):
                parts[name].append(ms)
            if i == 0:
                memory = memory_split(module, opt, device)  # after a step: the optimizer state exists
        peak = torch.cuda.max_memory_allocated() if on_gpu else None

        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=activities) as prof:
            settle()
            step()
            settle()
        breakdown = step_breakdown(prof, 1, on_gpu)
        return {
            "rank": rank,
            "samples_ms": samples,
            "parts_ms": parts,
            **breakdown,
            "memory": memory,
            "peak_mem_bytes": peak,
            "first_step_s": first_step_s,
            "params": n_params,
            "peak_tflops_measured": matmul_peak(device) if on_gpu else None,
            "gpu_name": torch.cuda.get_device_name(device) if on_gpu else None,
            "backend": dist.get_backend(),
        }
    finally:
        for path in caches:
            shutil.rmtree(path, ignore_errors=True)
