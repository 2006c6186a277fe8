"""The course's AdamW, step for step.

Per parameter p with gradient g, state m, v and step t (starting at 1):
    p -= lr * wd * p                                   (decoupled decay, applied first)
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
State per parameter: two tensors the size of p (8 bytes/param in fp32). With state_dtype=bfloat16
they are stored in bf16 (4 bytes/param) and every update still computes in fp32: the moments are
widened, updated and rounded back, so only the storage of m and v is rounded.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch


def closure_loss(closure):
    """An optimizer step's closure run with gradients on (its loss), or None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class AdamW(torch.optim.Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, state_dtype: torch.dtype | None = None):
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps < 0 or weight_decay < 0:
            raise ValueError("eps and weight_decay must be >= 0")
        if state_dtype not in (None, torch.float32, torch.bfloat16):
            raise ValueError(f"state_dtype must be float32 or bfloat16, got {state_dtype}")
        self.state_dtype = state_dtype
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p, dtype=self.state_dtype)
                    state["v"] = torch.zeros_like(p, dtype=self.state_dtype)
                state["step"] += 1
                t = state["step"]
                stored_m, stored_v, g = state["m"], state["v"], p.grad
                widen = stored_m.dtype != p.dtype
                m, v = (stored_m.to(p.dtype), stored_v.to(p.dtype)) if widen else (stored_m, stored_v)
                p.mul_(1 - lr * wd)
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-step_size)
                if widen:
                    stored_m.copy_(m)
                    stored_v.copy_(v)
        return loss


def make_optimizer(name: str, params, lr: float = 1e-3, weight_decay: float = 0.01,
                   state_dtype: torch.dtype | None = None) -> torch.optim.Optimizer:
    """'course' (this module's AdamW), 'torch' (torch.optim.AdamW, foreach), 'torch_fused', 'sgd'.
    state_dtype (bf16 moments) applies to 'course' only."""
    if state_dtype not in (None, torch.float32) and name != "course":
        raise ValueError(f"state_dtype {state_dtype} needs the course optimizer (torch's AdamW keeps its state in "
                         "the parameters' dtype)")
    if name == "course":
        return AdamW(params, lr=lr, weight_decay=weight_decay, state_dtype=state_dtype)
    if name == "torch":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "torch_fused":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; choose from course, torch, torch_fused, sgd")
