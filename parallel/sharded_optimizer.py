"""ZeRO stage 1: optimizer state sharded over ranks.

    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)

Every parameter is owned by one rank (greedy by element count: largest first onto the least
loaded rank, identical on every rank). Each rank keeps a real `optimizer_cls` over the parameters
it owns, so AdamW's m and v (8 bytes/param in fp32) exist once across the job instead of on every
rank: per-rank state ~ 1/N. After the local step, each rank broadcasts the parameters it owns so all
ranks hold the same updated model: per dtype, in chunks of at most `broadcast_bucket_mb` flattened
into one buffer, and a parameter as large as a chunk on its own, in place. A chunk bounds the extra
memory: one flat buffer of everything a rank owns is half the model on two ranks (16 GB in fp32 for
the 8B leaderboard model, which then ran out of memory), while 256 MB chunks cost 16 GB / 256 MB = 64
broadcasts, about 64 x 0.08 ms of per-call cost on NVLink. The update of a parameter is the
wrapped optimizer's own computation on the same gradient: results equal the unsharded optimizer's
bit for bit.

`with opt.no_sync():` steps only the local shard and broadcasts nothing (ranks then disagree): the
same optimizer work without its communication, for measuring what the broadcasts cost.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from parallel.ddp import SyncSwitch, chunks_by_bytes


class ShardedOptimizer(SyncSwitch, torch.optim.Optimizer):
    def __init__(self, params: Iterable, optimizer_cls: type[torch.optim.Optimizer], *,
                 broadcast_bucket_mb: float = 256.0, **kwargs: Any):
        if not dist.is_initialized():
            raise RuntimeError("initialise torch.distributed before creating a ShardedOptimizer")
        if not broadcast_bucket_mb > 0:
            raise ValueError(f"broadcast_bucket_mb must be positive, got {broadcast_bucket_mb}")
        self.broadcast_bucket_bytes = int(broadcast_bucket_mb * 2**20)
        self.optimizer_cls = optimizer_cls
        self.optimizer_kwargs = kwargs
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.owner: dict[int, int] = {}  # id(param) -> rank
        self.loads = [0] * self.world_size  # elements owned per rank
        self.local: torch.optim.Optimizer | None = None
        super().__init__(params, defaults=kwargs)  # calls add_param_group for each group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)  # validates, fills defaults, keeps the full group
        group = self.param_groups[-1]
        for p in sorted(group["params"], key=lambda p: -p.numel()):  # sorted() is stable: same on all ranks
            if id(p) not in self.owner:
                r = min(range(self.world_size), key=lambda i: self.loads[i])
                self.owner[id(p)] = r
                self.loads[r] += p.numel()
        local_group = {k: v for k, v in group.items() if k != "params"}
        local_group["params"] = [p for p in group["params"] if self.owner[id(p)] == self.rank]
        if self.local is None:
            self.local = self.optimizer_cls([local_group], **self.optimizer_kwargs)
        else:
            self.local.add_param_group(local_group)

    def _sync_hyperparameters(self) -> None:
        """Carry changes made to self.param_groups (an LR scheduler, say) into the local groups."""
        for full, local in zip(self.param_groups, self.local.param_groups, strict=True):
            for k, v in full.items():
                if k != "params":
                    local[k] = v

    @torch.no_grad()
    def step(self, closure=None):
        self._sync_hyperparameters()
        loss = self.local.step(closure) if closure is not None else self.local.step()
        if self.sync_enabled:
            self._broadcast_updated()
        return loss

    def _broadcast_updated(self) -> None:
        for src in range(self.world_size):
            owned = [p for g in self.param_groups for p in g["params"] if self.owner[id(p)] == src]
            groups: dict[tuple, list[torch.Tensor]] = {}
            for p in owned:
                groups.setdefault((p.dtype, p.device), []).append(p.data)
            for ts in groups.values():
                for chunk in chunks_by_bytes(ts, self.broadcast_bucket_bytes):
                    if len(chunk) == 1 and chunk[0].is_contiguous():
                        dist.broadcast(chunk[0], src=src)  # in place: no copy
                        continue
                    flat = _flatten_dense_tensors(chunk)
                    dist.broadcast(flat, src=src)
                    if self.rank != src:
                        for t, new in zip(chunk, _unflatten_dense_tensors(flat, chunk), strict=True):
                            t.copy_(new)

    def local_state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds."""
        return sum(t.numel() * t.element_size() for s in self.local.state.values() for t in s.values()
                   if torch.is_tensor(t))

    def consolidated_state_dict(self, to_rank: int = 0) -> dict[str, Any] | None:
        """The unsharded optimizer's state_dict, assembled on `to_rank` (None elsewhere). A collective."""
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        local_state = {index[id(p)]: {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in s.items()}
                       for p, s in self.local.state.items()}
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, local_state)
        if self.rank != to_rank:
            return None
        state: dict[int, Any] = {}
        for part in gathered:
            state.update(part)
        groups, start = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(start, start + n))})
            start += n
        return {"state": state, "param_groups": groups}

