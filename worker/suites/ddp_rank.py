"""What every rank of a `ddp` cell runs; worker/suites/ddp.py launches it and summarises the ranks.

Two variants of one training step, in the same processes:
  wrapped   the step under the cell's wrapper (DDP variants, torch DDP, ZeRO-1, FSDP);
  nocomm    the same step with no communication: the same model and optimizer inside the wrapper's
            `no_sync()` (ZeRO-1 also skips its parameter broadcasts). FSDP cannot compute without
            gathering its shards, so its nocomm step is an unsharded replica computing in the same
            dtype, whose optimizer (ShardStep: the same class) updates what FSDP's updates on this
            rank: a 1/N slice of each sharded parameter and every replicated one.
They are timed in alternating blocks (A B B A A B B A ...), so drift and clock changes hit both.

Per timed step: the GPU is idle and a gloo barrier aligns the ranks' hosts, then CUDA events on the
current stream bracket the step (CPU: a monotonic clock). Memory is probed in a step of its own
before timing; a few profiled steps after timing give the collectives' own GPU time (NCCL kernels)
and the time the GPU was busy at all.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from kernels.names import autocast_dtype

BLOCK = 5  # timed steps per block of one variant
PROFILED_STEPS = 3


def schedule(steps: int, block: int = BLOCK) -> list[str]:
    """The order of the timed steps: `steps` of each variant in alternating blocks, A B B A A B ..."""
    order: list[str] = []
    for i in range(-(-steps // block)):
        n = min(block, steps - i * block)
        first, second = ("wrapped", "nocomm") if i % 2 == 0 else ("nocomm", "wrapped")
        order += [first] * n + [second] * n
    return order


def storage_bytes(tensors, seen: set[int], device_type: str | None = None) -> int:
    """Bytes of the storages behind `tensors`, each storage once (a gradient that is a view of its
    bucket counts the bucket once); `seen` carries storages already counted by an earlier call.
    With `device_type`, tensors elsewhere (optimizer state offloaded to the host, say) are left out."""
    total = 0
    for t in tensors:
        if t is None or (device_type is not None and t.device.type != device_type):
            continue
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        total += st.nbytes()
    return total


def memory_split(model: nn.Module, opt: torch.optim.Optimizer, device: str) -> dict[str, int | None]:
    """This rank's bytes of parameters, gradients, optimizer state and everything else allocated on
    `device` (GPU; on CPU every tensor counts and `other` is None)."""
    seen: set[int] = set()
    kind = torch.device(device).type
    params = list(model.parameters())
    p_bytes = storage_bytes(params, seen, kind)
    g_bytes = storage_bytes((p.grad for p in params), seen, kind)
    inner = getattr(opt, "local", None) or opt  # ZeRO-1 keeps its shard's state in a local optimizer
    masters = getattr(inner, "masters", {})  # fp32 master weights (parallel/master_weights.py)
    s_bytes = storage_bytes([*(t for s in inner.state.values() for t in s.values() if torch.is_tensor(t)),
                             *masters.values()], seen, kind)
    other = torch.cuda.memory_allocated() - p_bytes - g_bytes - s_bytes if device.startswith("cuda") else None
    return {"params": p_bytes, "grads": g_bytes, "optimizer_state": s_bytes, "other": other}


def build_model(cfg: dict[str, Any], device: str) -> nn.Module:
    from kernels.model import TransformerLM

    torch.manual_seed(0)  # the same weights on every rank (same seed, same device type)
    # initialised on the device: the xl model's 3.4e9 weights took 126 s on a 2-core host's CPU, and
    # every cell (and FSDP's replica) paid that before its first step
    with torch.device(device):
        return TransformerLM(cfg["vocab_size"], cfg["context_length"], cfg["d_model"], cfg["num_layers"],
                             cfg["num_heads"], cfg["d_ff"], attention=cfg["attention"])


def make_optimizer(params, cfg: dict[str, Any]) -> torch.optim.Optimizer:
    return (torch.optim.AdamW if cfg["optimizer"] == "adamw" else torch.optim.SGD)(params, lr=1e-4)


class ShardStep:
    """The optimizer of FSDP's nocomm replica, doing this rank's share of FSDP's update: the optimizer
    `cfg` names over a slice of ceil(numel / N) elements of each parameter FSDP shards (this rank's, as
    parallel/fsdp.py cuts them; its gradient is a view of the replica's, so nothing is copied) and over
    every parameter FSDP replicates (norms). The slices are buffers of their own: the replica's weights
    stay as built, which changes no timing. zero_grad clears the replica's gradients as well."""

    def __init__(self, model: nn.Module, cfg: dict[str, Any], rank: int, world: int,
                 should_shard: Callable[[nn.Module], bool]):
        self.model = model
        self.pieces: list[tuple[nn.Parameter, torch.Tensor, int, int]] = []  # (param, slice buffer, lo, hi)
        sharded: set[int] = set()
        for mod in model.modules():
            if not should_shard(mod):
                continue
            for param in mod.parameters(recurse=False):
                if id(param) in sharded or not param.requires_grad:
                    continue  # a tied parameter is sharded once
                sharded.add(id(param))
                k = -(-param.numel() // world)
                lo, hi = min(rank * k, param.numel()), min((rank + 1) * k, param.numel())
                if hi > lo:
                    buf = param.detach().reshape(-1)[lo:hi].clone().requires_grad_()
                    self.pieces.append((param, buf, lo, hi))
        self.replicated = [q for q in model.parameters() if q.requires_grad and id(q) not in sharded]
        self.opt = make_optimizer([buf for _, buf, _, _ in self.pieces] + self.replicated, cfg)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)
        self.opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for param, buf, lo, hi in self.pieces:
            if param.grad is not None:
                buf.grad = param.grad.reshape(-1)[lo:hi]
        self.opt.step()


class Variant:
    """One way to take a step: module, optimizer, the finish call, a context (no_sync or nothing)."""

    def __init__(self, module: nn.Module, opt: torch.optim.Optimizer, finish: Callable[[], None],
                 context: Callable[[], Any], autocast: torch.dtype | None):
        self.module, self.opt, self.finish, self.context, self.autocast = module, opt, finish, context, autocast

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, between: Callable[[], None] | None = None) -> None:
        """zero_grad, forward, loss, backward, gradient synchronisation, [between()], optimizer step."""
        from kernels.model import cross_entropy

        with self.context():
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast(tokens.device.type, dtype=self.autocast, enabled=self.autocast is not None):
                logits = self.module(tokens)
            cross_entropy(logits, targets).backward()
            self.finish()
            if between is not None:
                between()
            self.opt.step()


def make_variants(cfg: dict[str, Any], device: str) -> tuple[Variant, Callable[[], Variant], nn.Module]:
    """(wrapped, a builder of the nocomm variant, the unwrapped model) for cfg['wrapper']."""
    from parallel.ddp import WRAPPERS, BucketedDDP
    from parallel.fsdp import FSDP, default_should_shard
    from parallel.sharded_optimizer import ShardedOptimizer

    name = cfg["wrapper"]
    autocast = autocast_dtype(cfg["precision"])
    model = build_model(cfg, device)
    none = contextlib.nullcontext
    if name == "none":
        opt = make_optimizer(model.parameters(), cfg)
        v = Variant(model, opt, lambda: None, none, autocast)
        return v, lambda: v, model
    if name == "fsdp":
        wrapped = FSDP(model, compute_dtype=autocast)
        v = Variant(wrapped, make_optimizer(wrapped.parameters(), cfg), wrapped.finish_gradient_synchronization,
                    none, None)  # FSDP casts to its compute dtype itself

        def replica() -> Variant:
            m = build_model(cfg, device)
            return Variant(m, ShardStep(m, cfg, wrapped.rank, wrapped.world_size, default_should_shard),
                           lambda: None, none, autocast)
        return v, replica, model
    if name == "torch_ddp":
        wrapped = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=cfg["bucket_size_mb"],
            device_ids=[torch.cuda.current_device()] if device.startswith("cuda") else None)
        opt = make_optimizer(wrapped.parameters(), cfg)
        v = Variant(wrapped, opt, lambda: None, none, autocast)
        return v, lambda: Variant(wrapped, opt, lambda: None, wrapped.no_sync, autocast), model
    if name == "zero1":
        wrapped = BucketedDDP(model, bucket_size_mb=cfg["bucket_size_mb"])
        opt = ShardedOptimizer(wrapped.parameters(),
                               torch.optim.AdamW if cfg["optimizer"] == "adamw" else torch.optim.SGD, lr=1e-4)

        @contextlib.contextmanager
        def no_comm():
            with wrapped.no_sync(), opt.no_sync():
                yield
    else:
        kwargs = {"bucket_size_mb": cfg["bucket_size_mb"]} if name == "bucketed" else {}
        wrapped = WRAPPERS[name](model, **kwargs)
        opt = make_optimizer(wrapped.parameters(), cfg)
        no_comm = wrapped.no_sync
    v = Variant(wrapped, opt, wrapped.finish_gradient_synchronization, none, autocast)
    return v, lambda: Variant(wrapped, opt, wrapped.finish_gradient_synchronization, no_comm, autocast), model


def train_step_rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run inside each rank. cfg: the resolved model dims, wrapper, bucket_size_mb, batch (per rank),
    warmup, steps, precision, optimizer, attention, device ('cpu' or 'cuda')."""
    on_gpu = cfg["device"] == "cuda"
    device = f"cuda:{rank}" if on_gpu else "cpu"
    if not on_gpu and cfg.get("threads_per_rank"):
        torch.set_num_threads(cfg["threads_per_rank"])
    host_group = dist.new_group(backend="gloo")  # barriers on the host: no kernel in the profile

    def settle() -> None:  # the GPU idle, then every rank's host at the same point
        if on_gpu:
            torch.cuda.synchronize()
        dist.barrier(group=host_group)

    g = torch.Generator().manual_seed(1000 + rank)
    shape = (cfg["batch"], cfg["context_length"])
    tokens = torch.randint(0, cfg["vocab_size"], shape, generator=g).to(device)
    targets = torch.randint(0, cfg["vocab_size"], shape, generator=g).to(device)

    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    wrapped, make_nocomm, model = make_variants(cfg, device)
    n_params = sum(p.numel() for p in model.parameters()) if cfg["wrapper"] != "fsdp" else \
        sum(sp.numel for sp in wrapped.module.sharded) + sum(p.numel() for p in wrapped.module.replicated)
    probe = lambda: memory_split(model, wrapped.opt, device)  # noqa: E731 (a one-line probe)
    memory = {"after_construction": probe()}
    settle()
    wrapped.step(tokens, targets)  # creates the optimizer state, so the probe step sees all of it
    settle()
    wrapped.step(tokens, targets, between=lambda: memory.update(before_step=probe()))  # the probe step
    memory["after_step"] = probe()
    peak = torch.cuda.max_memory_allocated() if on_gpu else None
    nocomm = make_nocomm()

    def timed(v: Variant) -> float:
        settle()
        if not on_gpu:
            t0 = time.perf_counter()
            v.step(tokens, targets)
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        v.step(tokens, targets)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    for _ in range(cfg["warmup"]):
        timed(wrapped)
        timed(nocomm)
    variants = {"wrapped": wrapped, "nocomm": nocomm}
    samples: dict[str, list[float]] = {"wrapped": [], "nocomm": []}
    for key in schedule(cfg["steps"]):
        samples[key].append(timed(variants[key]))

    from torch.profiler import ProfilerActivity, profile

    from worker.profiling import step_breakdown

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            settle()
            wrapped.step(tokens, targets)
        settle()
    breakdown = step_breakdown(prof, PROFILED_STEPS, on_gpu)
    return {
        "rank": rank,
        "samples_ms": samples["wrapped"],
        "nocomm_samples_ms": samples["nocomm"],
        **breakdown,
        "memory": memory,
        "peak_mem_bytes": peak,
        "params_total": n_params,
        "grad_bytes": n_params * 4,  # fp32 gradients: what a data-parallel step all-reduces
        "buckets": len(getattr(wrapped.module, "buckets", [])) or None,
        "backend": dist.get_backend(),
    }
