"""Benchmark entry points the `ddp` and `allreduce` suites call (each runs inside every rank).

train_step_rank: time a data-parallel training step of a model under one wrapper, split the
step into communication and waiting, compare with the same step without communication, and
account memory per rank (parameters, gradients, optimizer state, the rest) at three points.

allreduce_rank: all-reduce latency of one message size (the caller derives algbw = bytes / time and
busbw = algbw * 2(n-1)/n, what each link carries in a ring all-reduce).

They return raw per-step samples; the suites summarise them (worker.harness.Timing).
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from kernels.names import autocast_dtype, torch_dtype
from parallel.names import WRAPPER_NAMES


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _tensor_bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def memory_split(model: nn.Module, opt: torch.optim.Optimizer, device: str) -> dict[str, int | None]:
    """Bytes of this rank's parameters, gradients, optimizer state, and everything else allocated."""
    params = list(model.parameters())
    p_bytes = _tensor_bytes(params)
    g_bytes = _tensor_bytes(p.grad for p in params)
    inner = getattr(opt, "local", None) or opt
    s_bytes = _tensor_bytes(t for s in inner.state.values() for t in s.values() if torch.is_tensor(t))
    other = None
    if device.startswith("cuda"):
        other = torch.cuda.memory_allocated() - p_bytes - g_bytes - s_bytes
    return {"params": p_bytes, "grads": g_bytes, "optimizer_state": s_bytes, "other": other}


def build_model(cfg: dict[str, Any], device: str) -> nn.Module:
    from kernels.model import TransformerLM

    torch.manual_seed(0)
    return TransformerLM(cfg["vocab_size"], cfg["context_length"], cfg["d_model"], cfg["num_layers"],
                         cfg["num_heads"], cfg["d_ff"], attention=cfg.get("attention", "sdpa")).to(device)


def wrap(model: nn.Module, cfg: dict[str, Any], device: str):
    """(wrapped module, optimizer, finish callable) for the named wrapper."""
    from parallel.ddp import WRAPPERS, BucketedDDP
    from parallel.fsdp import FSDP
    from parallel.sharded_optimizer import ShardedOptimizer

    name = cfg["wrapper"]
    opt_cls = torch.optim.AdamW if cfg.get("optimizer", "adamw") == "adamw" else torch.optim.SGD
    opt_kwargs = {"lr": 1e-4}
    if name == "none":
        wrapped = model
    elif name in WRAPPERS:
        wrapped = WRAPPERS[name](model, **({"bucket_size_mb": cfg["bucket_size_mb"]} if name == "bucketed" else {}))
    elif name == "torch_ddp":
        wrapped = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=cfg["bucket_size_mb"],
            device_ids=[torch.cuda.current_device()] if device.startswith("cuda") else None)
    elif name == "zero1":
        wrapped = BucketedDDP(model, bucket_size_mb=cfg["bucket_size_mb"])
    elif name == "fsdp":
        dtype = autocast_dtype(cfg.get("precision", "fp32"))
        wrapped = FSDP(model, compute_dtype=dtype)
    else:
        raise ValueError(f"unknown wrapper {name!r}; choose from {', '.join(WRAPPER_NAMES)}")
    if name == "zero1":
        opt = ShardedOptimizer(wrapped.parameters(), opt_cls, **opt_kwargs)
    else:
        opt = opt_cls(wrapped.parameters(), **opt_kwargs)
    finish = getattr(wrapped, "finish_gradient_synchronization", lambda: None)
    return wrapped, opt, finish


def _time_steps(wrapped, opt, finish, cfg, device, tokens, targets, probe=None):
    from kernels.model import cross_entropy

    autocast = autocast_dtype(cfg.get("precision", "fp32"))
    times, comm, wait = [], [], []
    mem: dict[str, Any] = {}
    for i in range(cfg["warmup"] + cfg["steps"]):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if autocast is not None and cfg["wrapper"] != "fsdp":
            with torch.autocast(device_type=device.split(":")[0], dtype=autocast):
                logits = wrapped(tokens)
        else:
            logits = wrapped(tokens)
        cross_entropy(logits, targets).backward()
        finish()
        if probe is not None and i == cfg["warmup"]:
            _sync(device)
            mem["before_step"] = probe()
        opt.step()
        _sync(device)
        dt = time.perf_counter() - t0
        if probe is not None and i == cfg["warmup"]:
            mem["after_step"] = probe()
        if i >= cfg["warmup"]:
            times.append(dt * 1e3)
            lc = getattr(wrapped, "last_comm", None) or {}
            comm.append(lc.get("comm_ms"))
            wait.append(lc.get("wait_ms"))
    return times, comm, wait, mem


def train_step_rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run inside each rank. cfg: model dims, wrapper, bucket_size_mb, batch (per rank), warmup, steps,
    precision, optimizer, device ('cpu' or 'cuda')."""
    device = f"cuda:{rank}" if cfg["device"] == "cuda" else "cpu"
    if device == "cpu" and cfg.get("threads_per_rank"):
        torch.set_num_threads(cfg["threads_per_rank"])
    g = torch.Generator().manual_seed(1000 + rank)
    tokens = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["context_length"]), generator=g).to(device)
    targets = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["context_length"]), generator=g).to(device)

    # the same step with no communication at all: the baseline for overhead
    model = build_model(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    base_cfg = {**cfg, "wrapper": "none"}
    base_times, _, _, _ = _time_steps(model, opt, lambda: None, base_cfg, device, tokens, targets)
    del model, opt
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    dist.barrier()

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    model = build_model(cfg, device)
    wrapped, opt, finish = wrap(model, cfg, device)
    inner = wrapped.module if hasattr(wrapped, "module") else wrapped
    probe = lambda: memory_split(inner, opt, device)  # noqa: E731 (a one-line probe)
    mem = {"after_construction": probe()}
    times, comm, wait, mem_steps = _time_steps(wrapped, opt, finish, cfg, device, tokens, targets, probe)
    mem.update(mem_steps)
    return {
        "rank": rank,
        "samples_ms": times,
        "nocomm_samples_ms": base_times,
        "comm_samples_ms": [c for c in comm if c is not None],
        "wait_samples_ms": [w for w in wait if w is not None],
        "memory": mem,
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if device.startswith("cuda") else None,
        "params_total": sum(p.numel() for p in inner.parameters()) if cfg["wrapper"] not in ("fsdp",) else None,
        "backend": dist.get_backend(),
    }


def allreduce_rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Time all-reduce of cfg['size_mb'] MB in cfg['dtype'] on every rank: per-call samples and the byte count."""
    device = f"cuda:{rank}" if cfg["device"] == "cuda" else "cpu"
    dtype = torch_dtype(cfg["dtype"])
    elem = torch.tensor([], dtype=dtype).element_size()
    n = max(1, int(cfg["size_mb"] * 2**20 / elem))
    x = torch.ones(n, dtype=dtype, device=device)
    samples = []
    for i in range(cfg["warmup"] + cfg["repeats"]):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        _sync(device)
        if i >= cfg["warmup"]:
            samples.append((time.perf_counter() - t0) * 1e3)
    return {"rank": rank, "samples_ms": samples, "bytes": n * elem, "backend": dist.get_backend()}


def interleaved_rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """BucketedDDP and torch's DistributedDataParallel with the same bucket size, stepped alternately in
    one process (A, B, A, B, ...) so both see the same machine state: a fair side-by-side on a noisy host."""
    from kernels.model import cross_entropy

    device = "cpu" if cfg["device"] == "cpu" else f"cuda:{rank}"
    if device == "cpu" and cfg.get("threads_per_rank"):
        torch.set_num_threads(cfg["threads_per_rank"])
    g = torch.Generator().manual_seed(1000 + rank)
    tokens = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["context_length"]), generator=g).to(device)
    contenders = {}
    for name in ("bucketed", "torch_ddp"):
        wrapped, opt, finish = wrap(build_model(cfg, device), {**cfg, "wrapper": name}, device)
        contenders[name] = (wrapped, opt, finish, [])
    for i in range(cfg["warmup"] + cfg["steps"]):
        for wrapped, opt, finish, times in contenders.values():
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            cross_entropy(wrapped(tokens), tokens).backward()
            finish()
            opt.step()
            _sync(device)
            if i >= cfg["warmup"]:
                times.append((time.perf_counter() - t0) * 1e3)
    return {"rank": rank, **{name: times for name, (_, _, _, times) in contenders.items()}}
