"""The course's AdamW, step for step.

Per parameter p with gradient g, state m, v and step t (starting at 1):
    p -= lr * wd * p                                   (decoupled decay, applied first)
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
State per parameter: two fp32-like tensors the size of p (8 bytes/param in fp32).
"""
from __future__ import annotations

import math
from typing import Iterable

import torch


class AdamW(torch.optim.Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps < 0 or weight_decay < 0:
            raise ValueError("eps and weight_decay must be >= 0")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v, g = state["m"], state["v"], p.grad
                p.mul_(1 - lr * wd)
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-step_size)
        return loss


def make_optimizer(name: str, params, lr: float = 1e-3, weight_decay: float = 0.01) -> torch.optim.Optimizer:
    """'course' (this module's AdamW), 'torch' (torch.optim.AdamW, foreach), 'torch_fused', 'sgd'."""
    if name == "course":
        return AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "torch":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "torch_fused":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; choose from course, torch, torch_fused, sgd")
