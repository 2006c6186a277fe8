"""Data parallelism four ways, each with per-step communication accounting.

    model = BucketedDDP(model, bucket_size_mb=25)
    loss = loss_fn(model(x)); loss.backward()
    model.finish_gradient_synchronization()   # grads are now averaged over ranks
    optimizer.step(); print(model.last_comm)   # {"comm_ms", "wait_ms", "collectives", "bytes"}

NaiveDDP     one all-reduce per parameter after backward.
FlatDDP      one all-reduce of all gradients flattened into one buffer, after backward.
OverlapDDP   an async all-reduce per parameter, launched by its post-accumulate-grad hook during
             backward, waited for in finish_gradient_synchronization.
BucketedDDP  parameters grouped (reverse registration order, one dtype per bucket) into buckets of
             at most bucket_size_mb; a bucket's async all-reduce starts when its last gradient is in.
             Gradients are scaled by 1/N while copied into the bucket, and after the reduction each
             parameter's .grad is a view of its bucket (no copy back).

All: rank 0's parameters and buffers are broadcast at construction; a tied parameter is one
parameter (reduced once); parameters with requires_grad=False are never touched. Collectives must
be issued in the same order on every rank, so async launches go strictly in bucket order (a ready
bucket waits for the ones before it), and a parameter that got no gradient on this rank is
reduced as zeros. Parameters that got no gradient on ANY rank keep grad None, exactly as
single-process training would leave them (one tiny all-reduce of has-grad flags per step).

`with model.no_sync():` (as torch DDP's) leaves gradients local for the steps inside it: backward
launches nothing and finish_gradient_synchronization returns at once (gradient accumulation, or the
same step without communication when measuring what communication costs).

Accounting: comm_ms is the wall time from the first collective's launch to the last one's
completion (for the synchronous variants, the time of the collectives themselves); wait_ms is the
time finish_gradient_synchronization blocked. On GPU both include a device synchronize.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def chunks_by_bytes(tensors: list, cap_bytes: int, first_cap_bytes: int | None = None) -> list[list]:
    """Consecutive runs of `tensors`, one dtype per run, of at most cap_bytes each (the first run at most
    first_cap_bytes); a tensor larger than its cap is a run alone. Greedy: a tensor joins the current
    run if it fits, else starts the next."""
    runs: list[list] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        cap = min(cap_bytes, first_cap_bytes) if first_cap_bytes is not None and len(runs) == 1 else cap_bytes
        if runs and runs[-1][0].dtype == t.dtype and size + nbytes <= cap:
            runs[-1].append(t)
            size += nbytes
        else:
            runs.append([t])
            size = nbytes
    return runs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def broadcast_module_state(module: nn.Module, src: int = 0) -> None:
    """Make every rank's parameters and buffers equal to rank `src`'s (flattened per dtype and device)."""
    tensors = [p.data for p in module.parameters()] + [b for b in module.buffers()]
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for ts in groups.values():
        flat = _flatten_dense_tensors(ts)
        dist.broadcast(flat, src=src)
        for t, synced in zip(ts, _unflatten_dense_tensors(flat, ts), strict=True):
            t.copy_(synced)


def globally_used(params: list[nn.Parameter], locally_used: list[bool], device: torch.device) -> list[bool]:
    """Which params got a gradient on at least one rank (one small all-reduce of flags)."""
    flags = torch.tensor([1 if u else 0 for u in locally_used], dtype=torch.int32, device=device)
    dist.all_reduce(flags)
    return [bool(f) for f in flags.tolist()]


class SyncSwitch:
    """`with x.no_sync():` turns x's communication off inside the block (x.sync_enabled is False
    there): the same computation without its collectives, for measuring what they cost."""

    sync_enabled = True

    @contextlib.contextmanager
    def no_sync(self):
        before, self.sync_enabled = self.sync_enabled, False
        try:
            yield
        finally:
            self.sync_enabled = before


class _DDPBase(SyncSwitch, nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialise torch.distributed (e.g. parallel.launch) before wrapping a module")
        self.module = module
        self.world_size = dist.get_world_size()
        broadcast_module_state(module)
        # parameters() yields a tied parameter once: it is reduced once
        self.params = [p for p in module.parameters() if p.requires_grad]
        first = next(iter(module.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.last_comm: dict[str, Any] = {}
        self._reset_accounting()

    def _reset_accounting(self) -> None:
        self._comm_s = 0.0
        self._first_launch: float | None = None
        self._collectives = 0
        self._bytes = 0

    def forward(self, *args, **kwargs):
        self._reset_accounting()
        self._before_forward()
        return self.module(*args, **kwargs)

    def _before_forward(self) -> None:
        pass

    def _grads_or_zeros(self) -> tuple[list[torch.Tensor], list[bool]]:
        used = [p.grad is not None for p in self.params]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        return grads, used

    def _drop_unused(self, used_here: list[bool]) -> None:
        """Set grad None on params no rank produced a gradient for; keep averaged zeros elsewhere."""
        used = globally_used(self.params, used_here, self.device)
        for p, u in zip(self.params, used, strict=True):
            if not u:
                p.grad = None

    def _finish_accounting(self, wait_s: float) -> None:
        self.last_comm = {"comm_ms": self._comm_s * 1e3, "wait_ms": wait_s * 1e3,
                          "collectives": self._collectives, "bytes": self._bytes}

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError


class _ReduceAfterBackward(_DDPBase):
    """Synchronous variants: everything happens in finish_gradient_synchronization, timed as a whole."""

    def finish_gradient_synchronization(self) -> None:
        if not self.sync_enabled:
            return
        t0 = time.perf_counter()
        grads, used = self._grads_or_zeros()
        self._reduce(grads)
        _sync(self.device)
        self._comm_s = time.perf_counter() - t0
        self._drop_unused(used)
        self._finish_accounting(time.perf_counter() - t0)

    def _reduce(self, grads: list[torch.Tensor]) -> None:
        """Average `grads` (one per self.params, zeros where this rank has none) and set them as .grad."""
        raise NotImplementedError

    def _count(self, t: torch.Tensor) -> None:
        self._collectives += 1
        self._bytes += t.numel() * t.element_size()


class NaiveDDP(_ReduceAfterBackward):
    """One synchronous all-reduce per parameter after backward."""

    def _reduce(self, grads: list[torch.Tensor]) -> None:
        for p, g in zip(self.params, grads, strict=True):
            dist.all_reduce(g)
            p.grad = g.div_(self.world_size)
            self._count(g)


class FlatDDP(_ReduceAfterBackward):
    """All gradients flattened into one buffer per dtype, one all-reduce each, after backward."""

    def _reduce(self, grads: list[torch.Tensor]) -> None:
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, g in enumerate(grads):
            by_dtype.setdefault(g.dtype, []).append(i)
        for idx in by_dtype.values():
            ts = [grads[i] for i in idx]
            flat = _flatten_dense_tensors(ts)  # one copy in: numel * element_size bytes
            dist.all_reduce(flat)
            flat.div_(self.world_size)
            for i, synced in zip(idx, _unflatten_dense_tensors(flat, ts), strict=True):
                self.params[i].grad = synced
            self._count(flat)


FIRST_BUCKET_BYTES = 1024 * 1024


class _Bucket:
    def __init__(self, index: int, params: list[nn.Parameter]):
        self.index = index
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.buffer: torch.Tensor | None = None
        self.ready: set[int] = set()
        self.work = None

    def nbytes(self) -> int:
        return self.numel * self.params[0].element_size()


class BucketedDDP(_DDPBase):
    """Async all-reduce per bucket, started from gradient hooks as soon as the bucket is complete."""

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25.0):
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be positive, got {bucket_size_mb}")
        super().__init__(module)
        self.bucket_size_mb = bucket_size_mb
        self.buckets = self._make_buckets(int(bucket_size_mb * 1024 * 1024))
        self._bucket_of: dict[int, tuple[_Bucket, int]] = {}
        for b in self.buckets:
            offset = 0
            for p in b.params:
                self._bucket_of[id(p)] = (b, offset)
                offset += p.numel()
        self._next_launch = 0
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    def _make_buckets(self, cap_bytes: int) -> list[_Bucket]:
        """Greedy in reverse registration order (roughly the order backward produces gradients).

        The first bucket is capped at 1 MiB (as torch DDP does), so the first all-reduce starts as soon
        as the last layer's gradients exist instead of waiting for a whole bucket's worth of layers.
        """
        runs = chunks_by_bytes(list(reversed(self.params)), cap_bytes, first_cap_bytes=FIRST_BUCKET_BYTES)
        return [_Bucket(i, ps) for i, ps in enumerate(runs)]

    def _before_forward(self) -> None:
        self._next_launch = 0
        for b in self.buckets:
            b.ready.clear()
            b.work = None

    def _on_grad(self, p: nn.Parameter) -> None:
        if not self.sync_enabled:
            return
        bucket, offset = self._bucket_of[id(p)]
        self._stage(bucket, p, offset)
        bucket.ready.add(id(p))
        # launch, in order, every bucket that is complete and whose predecessors are launched
        while self._next_launch < len(self.buckets):
            b = self.buckets[self._next_launch]
            if len(b.ready) < len(b.params):
                break
            self._launch(b)

    def _stage(self, b: _Bucket, p: nn.Parameter, offset: int) -> None:
        """Put p's gradient, scaled by 1/N, into its bucket as soon as it exists (while it is hot in cache)."""
        inv = 1.0 / self.world_size
        if len(b.params) == 1:
            b.buffer = p.grad.mul_(inv)  # a one-parameter bucket reduces the gradient in place
            return
        if b.buffer is None:
            b.buffer = torch.empty(b.numel, dtype=p.dtype, device=p.device)
        dst = b.buffer[offset:offset + p.numel()]
        if p.grad.data_ptr() != dst.data_ptr():  # unless .grad already is this view (grads not set to None)
            torch.mul(p.grad.reshape(-1), inv, out=dst)
        else:
            dst.mul_(inv)

    def _launch(self, b: _Bucket) -> None:
        """Start the bucket's all-reduce; a parameter with no gradient on this rank contributes zeros."""
        if len(b.params) == 1 and b.params[0].grad is None:
            b.buffer = torch.zeros_like(b.params[0]).reshape(-1)
        elif len(b.params) > 1:
            if b.buffer is None:
                b.buffer = torch.empty(b.numel, dtype=b.params[0].dtype, device=b.params[0].device)
            offset = 0
            for q in b.params:
                if id(q) not in b.ready:
                    b.buffer[offset:offset + q.numel()].zero_()
                offset += q.numel()
        if self._first_launch is None:
            self._first_launch = time.perf_counter()
        b.work = dist.all_reduce(b.buffer, async_op=True)
        self._collectives += 1
        self._bytes += b.nbytes()
        self._next_launch += 1

    def finish_gradient_synchronization(self) -> None:
        if not self.sync_enabled:
            return
        t0 = time.perf_counter()
        used = [p.grad is not None for p in self.params]
        while self._next_launch < len(self.buckets):  # buckets some of whose params got no gradient
            self._launch(self.buckets[self._next_launch])
        for b in self.buckets:
            b.work.wait()
        _sync(self.device)
        done = time.perf_counter()
        for b in self.buckets:
            b.work = None
            if len(b.params) == 1:  # reduced in place (or zeros for a parameter with no gradient here)
                q = b.params[0]
                if q.grad is None:
                    q.grad = b.buffer.view_as(q)
                continue
            offset = 0
            for q in b.params:
                n = q.numel()
                q.grad = b.buffer[offset:offset + n].view_as(q)  # gradients become views of the bucket: no copy
                offset += n
        self._comm_s = done - (self._first_launch or t0)
        self._drop_unused(used)
        self._finish_accounting(time.perf_counter() - t0)


class OverlapDDP(BucketedDDP):
    """An async all-reduce per parameter, launched from its post-accumulate-grad hook."""

    def __init__(self, module: nn.Module):
        super().__init__(module, bucket_size_mb=1e-9)  # every parameter its own bucket

    def _make_buckets(self, cap_bytes: int) -> list[_Bucket]:
        return [_Bucket(i, [p]) for i, p in enumerate(reversed(self.params))]


WRAPPERS = {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP, "bucketed": BucketedDDP}
