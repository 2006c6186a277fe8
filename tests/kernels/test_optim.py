"""The course AdamW's bf16 state option: the same update, only the moments' storage rounded."""
from __future__ import annotations

import pytest
import torch

from kernels.optim import AdamW, make_optimizer


def test_bf16_state_stores_moments_in_bf16_and_tracks_fp32_state():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(64, 32))
    b = torch.nn.Parameter(a.detach().clone())
    start = a.detach().clone()
    opt_a = AdamW([a], lr=1e-2)
    opt_b = AdamW([b], lr=1e-2, state_dtype=torch.bfloat16)
    for _ in range(20):
        g = torch.randn(64, 32)
        a.grad, b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    assert opt_b.state[b]["m"].dtype == torch.bfloat16 and opt_b.state[b]["v"].dtype == torch.bfloat16
    assert b.dtype == torch.float32
    drift = (a - b).abs().max().item()
    moved = (a - start).abs().max().item()  # 20 steps of about lr = 1e-2 each
    assert 0 < drift < moved / 20, (drift, moved)  # the moments' rounding: well under one step's size


def test_state_dtype_is_checked_and_course_only():
    with pytest.raises(ValueError, match="state_dtype"):
        AdamW([torch.nn.Parameter(torch.zeros(2))], state_dtype=torch.float16)
    with pytest.raises(ValueError, match="course optimizer"):
        make_optimizer("torch", [torch.nn.Parameter(torch.zeros(2))], state_dtype=torch.bfloat16)
