"""MasterWeights: AdamW on fp32 masters of bf16 weights (on the weights' device or the host)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kernels.optim import AdamW
from parallel.master_weights import MasterWeights


@pytest.mark.parametrize("device", [None, "cpu"])
def test_masters_follow_fp32_adamw_exactly_and_the_weights_are_their_rounding(device):
    torch.manual_seed(0)
    w = torch.randn(32, 16).to(torch.bfloat16).float()  # a start both sides hold exactly
    ref = nn.Parameter(w.clone())
    low = nn.Parameter(w.to(torch.bfloat16))
    opt_ref = AdamW([ref], lr=1e-2)
    opt = MasterWeights([low], AdamW, device=device, lr=1e-2)
    for _ in range(5):
        g = torch.randn(32, 16).to(torch.bfloat16)  # gradients a bf16 model produces
        ref.grad, low.grad = g.float(), g.clone()
        opt_ref.step()
        opt.step()
        opt.zero_grad()
    master = opt.masters[low]
    assert master.dtype == torch.float32 and torch.equal(master, ref.detach())
    assert low.dtype == torch.bfloat16 and torch.equal(low.detach(), ref.detach().to(torch.bfloat16))
    assert low.grad is None and set(opt.state[master]) == {"step", "m", "v"}


def test_parameters_without_gradients_are_left_alone_and_empty_input_is_named():
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    opt = MasterWeights([a, b], AdamW, lr=0.1)
    a.grad = torch.ones(3)
    opt.step()
    assert not torch.equal(a.detach(), torch.ones(3)) and torch.equal(b.detach(), torch.ones(3))
    with pytest.raises(ValueError, match="empty parameter list"):
        MasterWeights([], AdamW)


def test_param_groups_keep_their_hyperparameters_and_follow_changes():
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    opt = MasterWeights([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.0}], AdamW)
    opt.param_groups[1]["lr"] = 0.2  # as a scheduler would
    a.grad, b.grad = torch.ones(3), torch.ones(3)
    opt.step()
    assert [g["lr"] for g in opt.inner.param_groups] == [0.1, 0.2]
    assert (a.detach() < 1).all() and (b.detach() < a.detach()).all()
