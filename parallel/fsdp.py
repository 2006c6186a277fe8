"""Fully sharded data parallelism (ZeRO-3 style) for the weights of chosen leaf layers.

    model = FSDP(model, compute_dtype=torch.bfloat16)
    loss = loss_fn(model(x)); loss.backward(); model.finish_gradient_synchronization()

Each chosen leaf module (default: nn.Linear, nn.Embedding and the project's Linear/Embedding) keeps
only a 1/N shard of each of its parameters, flattened and padded to a multiple of N, as an fp32
master Parameter. Just before the module runs, the shard is cast to the compute dtype and
all-gathered into the full weight (the next two sharded modules' gathers are launched ahead, async);
after the module runs, the full weight is dropped. Autograd saves no full weight: a saved-tensor
hook packs it as a reference to its shard and all-gathers it again when backward needs it. The
gather is an autograd Function whose backward reduce-scatters the full gradient (sum / N) onto the
owning shard, in fp32. Other parameters (norms) are replicated; their gradients are all-reduced in
finish_gradient_synchronization.

Memory per rank for sharded weights: 4 bytes/param/N (master) + 4/N (grad) + optimizer state/N,
plus at most three gathered layers in the compute dtype at a time in forward.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from parallel.ddp import broadcast_module_state, globally_used

SHARD_PREFIX = "_fsdp_shard_"
PREFETCH = 2


def default_should_shard(module: nn.Module) -> bool:
    from kernels.model import Embedding, Linear

    return isinstance(module, (nn.Linear, nn.Embedding, Linear, Embedding))


class _ShardedParam:
    """One sharded parameter: its fp32 master shard and the full shape. A tied parameter has one."""

    def __init__(self, full: torch.Tensor, rank: int, world: int, requires_grad: bool):
        self.shape = full.shape
        self.numel = full.numel()
        self.shard_numel = math.ceil(self.numel / world)
        flat = torch.zeros(self.shard_numel * world, dtype=full.dtype, device=full.device)
        flat[: self.numel] = full.detach().reshape(-1)
        self.shard = nn.Parameter(flat[rank * self.shard_numel:(rank + 1) * self.shard_numel].clone(),
                                  requires_grad=requires_grad)
        self.stats: dict[str, Any] = {}  # the owning FSDP's communication counters


class _Use:
    """One place a sharded parameter is used: module.<name>; holds a prefetched gather, if any."""

    def __init__(self, module: nn.Module, name: str, sp: _ShardedParam):
        self.module, self.name, self.sp = module, name, sp
        self.prefetched: tuple[torch.Tensor, object] | None = None


def _count(stats: dict[str, Any], t0: float, nbytes: int) -> None:
    if stats:
        stats["comm_s"] += time.perf_counter() - t0
        stats["collectives"] += 1
        stats["bytes"] += nbytes


def _gather(sp: _ShardedParam, dtype: torch.dtype, world: int, async_op: bool = False):
    """All-gather sp's shard in `dtype`: (flat full tensor, work handle if async)."""
    t0 = time.perf_counter()
    src = sp.shard.detach().to(dtype)
    out = torch.empty(sp.shard.numel() * world, dtype=dtype, device=sp.shard.device)
    work = dist.all_gather_into_tensor(out, src, async_op=async_op)
    _count(sp.stats, t0, out.numel() * out.element_size())  # async: launch time only
    return out, work


class _AllGather(torch.autograd.Function):
    """shard (fp32) -> full weight (compute dtype). Backward: reduce-scatter, average, to fp32."""

    @staticmethod
    def forward(ctx, shard, sp: _ShardedParam, dtype: torch.dtype, world: int, gathered):
        ctx.world, ctx.shard_dtype, ctx.sp = world, shard.dtype, sp
        flat = gathered if gathered is not None else _gather(sp, dtype, world)[0]
        return flat[: sp.numel].view(sp.shape)

    @staticmethod
    def backward(ctx, grad_full):
        sp, world = ctx.sp, ctx.world
        flat = torch.zeros(sp.shard_numel * world, dtype=grad_full.dtype, device=grad_full.device)
        flat[: sp.numel] = grad_full.reshape(-1)
        out = torch.empty(sp.shard_numel, dtype=grad_full.dtype, device=grad_full.device)
        t0 = time.perf_counter()
        dist.reduce_scatter_tensor(out, flat)
        _count(sp.stats, t0, flat.numel() * flat.element_size())
        return out.to(ctx.shard_dtype).div_(world), None, None, None, None


class FSDP(nn.Module):
    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 should_shard: Callable[[nn.Module], bool] | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialise torch.distributed before wrapping a module in FSDP")
        self.module = module
        self.compute_dtype = compute_dtype
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        broadcast_module_state(module)
        should_shard = should_shard or default_should_shard
        self.sharded: list[_ShardedParam] = []
        self.uses: list[_Use] = []
        self._full_names: dict[int, str] = {}  # id(shard param) -> name in the unwrapped module
        by_param: dict[int, _ShardedParam] = {}
        for mod_name, mod in list(module.named_modules()):
            if not should_shard(mod):
                continue
            for pname, p in list(mod.named_parameters(recurse=False)):
                sp = by_param.get(id(p))
                if sp is None:  # first use of this parameter (a tied one is sharded once)
                    sp = by_param[id(p)] = _ShardedParam(p.data, self.rank, self.world_size, p.requires_grad)
                    self.sharded.append(sp)
                    self._full_names[id(sp.shard)] = f"{mod_name}.{pname}" if mod_name else pname
                del mod._parameters[pname]
                mod.register_parameter(SHARD_PREFIX + pname, sp.shard)
                setattr(mod, pname, None)
                self.uses.append(_Use(mod, pname, sp))
        self._by_module: dict[int, list[_Use]] = {}
        self._order: list[nn.Module] = []
        for u in self.uses:
            if id(u.module) not in self._by_module:
                self._order.append(u.module)
            self._by_module.setdefault(id(u.module), []).append(u)
        self._position = {id(m): i for i, m in enumerate(self._order)}
        shard_ids = {id(sp.shard) for sp in self.sharded}
        self.replicated = [p for p in module.parameters() if p.requires_grad and id(p) not in shard_ids]
        for m in self._order:
            m.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
            m.register_forward_hook(self._post_forward)
        # gathered weights now attached to their modules, by storage address, each held until its
        # module's forward ends: while held, no other tensor can occupy that address, so _pack never
        # mistakes an activation for a weight (which would make one rank gather and not the other)
        self._gathered: dict[int, tuple[_ShardedParam, torch.Tensor]] = {}
        self.stats: dict[str, Any] = {"comm_s": 0.0, "collectives": 0, "bytes": 0}
        for sp in self.sharded:
            sp.stats = self.stats
        self.last_comm: dict[str, Any] = {}

    # -- forward -------------------------------------------------------------------------------
    def _prefetch(self, module: nn.Module) -> None:
        for u in self._by_module[id(module)]:
            if u.prefetched is None:
                u.prefetched = _gather(u.sp, self.compute_dtype or u.sp.shard.dtype, self.world_size,
                                       async_op=True)

    def _drop_prefetched(self) -> None:
        """Wait for and forget gathers issued for layers that did not run: they hold the weights as
        they were, and the next forward must gather the updated ones."""
        for u in self.uses:
            if u.prefetched is not None:
                u.prefetched[1].wait()
                u.prefetched = None

    def _pre_forward(self, module, args, kwargs):
        pos = self._position[id(module)]
        # issue the next layers' gathers first; not inside backward, where an activation-checkpoint
        # recompute runs these hooks too and "the next layers" already ran (their prefetched gathers
        # would outlive the optimizer step and feed stale weights to the next forward)
        if torch._C._current_graph_task_id() == -1:
            for nxt in self._order[pos + 1: pos + 1 + PREFETCH]:
                self._prefetch(nxt)
        for u in self._by_module[id(module)]:
            gathered = None
            if u.prefetched is not None:
                gathered, work = u.prefetched
                t0 = time.perf_counter()
                work.wait()
                _count(self.stats, t0, 0)
                self.stats["collectives"] -= 1  # the wait, not a new collective
                u.prefetched = None
            dtype = self.compute_dtype or u.sp.shard.dtype
            full = _AllGather.apply(u.sp.shard, u.sp, dtype, self.world_size, gathered)
            self._detach_full(u)  # one left by a recompute that stopped early (see _release_gathered)
            self._gathered[full.untyped_storage().data_ptr()] = (u.sp, full)
            setattr(module, u.name, full)
        if self.compute_dtype is not None:
            cast = lambda t: t.to(self.compute_dtype) if torch.is_tensor(t) and t.is_floating_point() else t  # noqa: E731 (a one-line cast helper)
            return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}
        return None

    def _detach_full(self, u: _Use) -> None:
        full = getattr(u.module, u.name)
        if full is not None:
            self._gathered.pop(full.untyped_storage().data_ptr(), None)
        setattr(u.module, u.name, None)  # the full weight is freed once nothing else holds it

    def _post_forward(self, module, args, output):
        for u in self._by_module[id(module)]:
            self._detach_full(u)
        return output

    def _release_gathered(self) -> None:
        """Detach every gathered weight. An activation-checkpoint recompute stops as soon as it has
        rebuilt what backward needs (torch's early stop), so the modules after that point ran their
        pre-hook (gather) but never their post-hook: their full weights stay attached until this."""
        for u in self.uses:
            self._detach_full(u)

    def _pack(self, t: torch.Tensor):
        entry = self._gathered.get(t.untyped_storage().data_ptr()) if t.device.type != "meta" else None
        if entry is None:
            return t
        sp = entry[0]
        # a gathered weight (or a view of it): keep only how to rebuild it
        return (sp, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())

    def _unpack(self, packed):
        if torch.is_tensor(packed):
            return packed
        sp, dtype, shape, stride, offset = packed
        flat, _ = _gather(sp, dtype, self.world_size)
        return flat.as_strided(shape, stride, offset)

    def forward(self, *args, **kwargs):
        self.stats.update(comm_s=0.0, collectives=0, bytes=0)
        self._release_gathered()
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            out = self.module(*args, **kwargs)
        self._drop_prefetched()  # a prefetched layer that did not run this time
        return out

    # -- after backward ------------------------------------------------------------------------
    def finish_gradient_synchronization(self) -> None:
        """Average the replicated parameters' gradients (sharded ones were reduce-scattered in backward).

        last_comm: comm_ms = time in the synchronous gathers and reduce-scatters of forward and backward,
        waits on prefetched gathers, and this all-reduce; wait_ms = time spent here.
        """
        self._release_gathered()  # before the optimizer step, so no stale full weight outlives it
        t0 = time.perf_counter()
        self._sync_replicated()
        if self.replicated and self.replicated[0].device.type == "cuda":
            torch.cuda.synchronize()
        wait = time.perf_counter() - t0
        self.stats["comm_s"] += wait
        self.last_comm = {"comm_ms": self.stats["comm_s"] * 1e3, "wait_ms": wait * 1e3,
                          "collectives": self.stats["collectives"], "bytes": self.stats["bytes"]}

    def _sync_replicated(self) -> None:
        if not self.replicated:
            return
        used_here = [p.grad is not None for p in self.replicated]
        for p in self.replicated:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad.div_(self.world_size)
        flags = globally_used(self.replicated, used_here, self.replicated[0].device)
        for q, used in zip(self.replicated, flags, strict=True):
            if not used:
                q.grad = None

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Full fp32 tensors keyed by the unwrapped module's parameter names. A collective."""
        out: dict[str, torch.Tensor] = {}
        shard_ids = {id(sp.shard): sp for sp in self.sharded}
        for name, p in self.module.named_parameters():
            sp = shard_ids.get(id(p))
            if sp is None:
                out[name] = p.detach().clone()
            else:
                flat, _ = _gather(sp, sp.shard.dtype, self.world_size)
                out[self._full_names[id(p)]] = flat[: sp.numel].view(sp.shape).clone()
        return out
