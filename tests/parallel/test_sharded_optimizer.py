"""ShardedOptimizer (ZeRO-1) against the optimizer it wraps: bit for bit (gloo, 2 ranks).

Every rank computes the same full-batch gradients, so the only difference between the two runs is
who computes each parameter's update: identical arithmetic, hence exact equality.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from parallel.launch import launch
from parallel.sharded_optimizer import ShardedOptimizer, chunks_by_bytes
from tests.parallel.toy import batches, loss_fn, make_model


def _exact(rank, world, opt_cls_name, broadcast_bucket_mb=256.0):
    opt_cls = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "adam": torch.optim.Adam}[opt_cls_name]
    kwargs = {"lr": 1e-2} | ({"weight_decay": 0.05} if opt_cls_name == "adamw" else {"momentum": 0.9}
                             if opt_cls_name == "sgd" else {})
    ref, model = make_model(0), make_model(0)
    extra_ref, extra = nn.Parameter(torch.ones(7)), nn.Parameter(torch.ones(7))
    ref_opt = opt_cls(ref.parameters(), **kwargs)
    # a generator of params, as users pass model.parameters()
    opt = ShardedOptimizer((p for p in model.parameters()), opt_cls, broadcast_bucket_mb=broadcast_bucket_mb,
                           **kwargs)
    assert isinstance(opt, torch.optim.Optimizer)
    for step, (x, y) in enumerate(batches(5)):
        if step == 2:  # a param group added during training
            ref_opt.add_param_group({"params": [extra_ref], "lr": 5e-3})
            opt.add_param_group({"params": [extra], "lr": 5e-3})
        for m, o, e in ((ref, ref_opt, extra_ref), (model, opt, extra)):
            o.zero_grad(set_to_none=True)
            (loss_fn(m(x), y) + (e * e).sum() * (step >= 2)).backward()
        ref_opt.step()
        opt.step()
        for (n, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
            assert torch.equal(p, q), f"{opt_cls_name} step {step}: {n} differs"
        assert torch.equal(extra_ref, extra)
    full = opt.consolidated_state_dict(to_rank=0)
    if rank == 0:
        ref_sd = ref_opt.state_dict()
        assert sorted(full["state"]) == sorted(ref_sd["state"])
        for i, s in ref_sd["state"].items():
            for k, v in s.items():
                if torch.is_tensor(v):
                    assert torch.equal(full["state"][i][k], v.cpu()), (i, k)
        assert [len(g["params"]) for g in full["param_groups"]] == [len(g["params"]) for g in ref_sd["param_groups"]]
    else:
        assert full is None
    total = sum(t.numel() * t.element_size() for s in ref_opt.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    return opt.local_state_bytes(), total


@pytest.mark.parametrize("opt_name", ["adamw", "sgd", "adam"])
def test_sharded_equals_unsharded_bitwise(opt_name):
    launch(_exact, 2, args=(opt_name,), device="cpu", timeout_s=120)


def test_small_broadcast_chunks_stay_exact():
    # 1 KiB chunks: the toy's weight matrices go alone and in place, its biases several to a flat buffer
    launch(_exact, 2, args=("adamw", 1 / 1024), device="cpu", timeout_s=120)


def test_chunks_by_bytes_keeps_order_and_cap():
    ts = [torch.zeros(n) for n in (10, 300, 5, 5, 200, 1)]  # fp32: 40, 1200, 20, 20, 800, 4 bytes
    chunks = chunks_by_bytes(ts, cap_bytes=1000)
    assert [[t.numel() for t in c] for c in chunks] == [[10], [300], [5, 5, 200, 1]]
    assert [t for c in chunks for t in c] == ts
    assert chunks_by_bytes([], 1000) == []


def _bad_bucket(rank, world):
    with pytest.raises(ValueError, match="broadcast_bucket_mb must be positive, got 0"):
        ShardedOptimizer(nn.Linear(2, 2).parameters(), torch.optim.SGD, broadcast_bucket_mb=0, lr=0.1)


def test_broadcast_bucket_must_be_positive():
    launch(_bad_bucket, 1, device="cpu", timeout_s=60)


def _state_split(rank, world):
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
    opt = ShardedOptimizer(layers.parameters(), torch.optim.AdamW, lr=1e-3)
    for p in layers.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    full = sum(p.numel() for p in layers.parameters()) * 4 * 2  # fp32 m and v
    return opt.local_state_bytes(), full


def test_state_per_rank_is_about_one_over_n():
    res = launch(_state_split, 2, device="cpu", timeout_s=120)
    total = sum(local for local, _ in res)
    full = res[0][1]
    for local, _ in res:
        # m and v (plus a scalar step per param) split evenly: within 5% of full/N
        assert abs(local - full / 2) <= 0.05 * full / 2
    assert abs(total - full) <= 0.05 * full
