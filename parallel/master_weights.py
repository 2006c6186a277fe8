"""fp32 master weights for an optimizer, kept beside the model's weights or on the host.

    opt = MasterWeights(model.parameters(), AdamW, device="cpu", lr=1e-4)

The model computes with its own parameters (bf16, say); the wrapped optimizer updates an fp32 copy
of each one on `device` (None: the parameter's own device) and the result is copied back. The
update is AdamW's own on fp32 values, so its semantics hold; only the copy the model reads is
rounded to its dtype.

Bytes per parameter, Adam: model weights in bf16 with offload = 2 (weight) + 2 (gradient) on the
GPU and 4 (master) + 8 (m, v) on the host, against 4 + 4 + 8 = 16 on the GPU in plain fp32. The
price is a gradient copy to the host, the optimizer step on the CPU and a weight copy back, each
step (ZeRO-Offload's trade).

Works under ShardedOptimizer (as its optimizer_cls, via functools.partial) and over FSDP's shards.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from kernels.optim import closure_loss


class MasterWeights(torch.optim.Optimizer):
    def __init__(self, params: Iterable, optimizer_cls: type[torch.optim.Optimizer], device: str | None = None,
                 **kwargs: Any):
        self.device = device
        self.optimizer_cls, self.optimizer_kwargs = optimizer_cls, kwargs
        self.masters: dict[torch.Tensor, torch.Tensor] = {}  # model parameter -> its fp32 master
        self.inner: torch.optim.Optimizer | None = None
        super().__init__(params, defaults=kwargs)  # calls add_param_group for each group

    def _master(self, p: torch.Tensor) -> torch.Tensor:
        pin = self.device == "cpu" and torch.cuda.is_available()  # pinned: copies overlap and run at full speed
        m = torch.empty(p.shape, dtype=torch.float32, device=self.device or p.device, pin_memory=pin)
        m.copy_(p.detach())
        self.masters[p] = m
        return m

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        inner_group = {k: v for k, v in group.items() if k != "params"}
        inner_group["params"] = [self._master(p) for p in group["params"]]
        if self.inner is None:
            self.inner = self.optimizer_cls([inner_group], **self.optimizer_kwargs)
        else:
            self.inner.add_param_group(inner_group)

    @property
    def state(self):  # the inner optimizer's state: what memory accounting and checkpoints look at
        return self.inner.state if self.inner is not None else {}

    @state.setter
    def state(self, value):  # torch.optim.Optimizer.__init__ assigns an empty dict; the inner one is used
        pass

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for outer, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update({k: v for k, v in outer.items() if k != "params"})  # a scheduler's lr, say
        for p, m in self.masters.items():
            m.grad = None if p.grad is None else p.grad.to(m.device, torch.float32, non_blocking=True)
        if self.device == "cpu" and torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()  # the gradients have landed before the CPU reads them
        self.inner.step()
        for p, m in self.masters.items():
            if m.grad is not None:
                p.copy_(m, non_blocking=True)
                m.grad = None
        return loss
