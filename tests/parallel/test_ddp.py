"""Every DDP variant against single-process training on the union of the ranks' batches (gloo, 2 ranks).

Exactness: the wrapped run averages gradients of two half-batches, the reference computes the
full-batch gradient at once. The two differ only in summation order, so bitwise equality is not a
property any implementation can have; parameters are compared with rtol 1e-5 in fp32.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from parallel.ddp import BucketedDDP, FlatDDP, NaiveDDP, OverlapDDP
from parallel.launch import launch
from tests.parallel.toy import batches, loss_fn, make_model, make_opt

STEPS = 4


def _wrap(kind: str, model, bucket_mb):
    if kind == "bucketed":
        return BucketedDDP(model, bucket_size_mb=bucket_mb)
    return {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP}[kind](model)


def _train_and_compare(rank, world, kind, opt_name, bucket_mb):
    ref = make_model(0)
    ddp = _wrap(kind, make_model(0 if rank == 0 else 100 + rank), bucket_mb)
    # construction broadcast rank 0's parameters and buffers
    for (n, p), q in zip(ref.named_parameters(), ddp.module.parameters(), strict=True):
        assert torch.equal(p, q), f"{n} not broadcast"
    assert torch.equal(ref.scale, ddp.module.scale)
    frozen_before = ddp.module.frozen.weight.detach().clone()
    ref_opt, opt = make_opt(opt_name, ref.parameters()), make_opt(opt_name, ddp.parameters())
    for x, y in batches(STEPS):
        ref_opt.zero_grad(set_to_none=True)
        loss_fn(ref(x), y).backward()
        ref_opt.step()
        lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x[lo:hi]), y[lo:hi]).backward()
        ddp.finish_gradient_synchronization()
        assert ddp.module.unused.weight.grad is None, "a parameter no rank used must keep grad None"
        assert ddp.last_comm["collectives"] >= 1 and ddp.last_comm["comm_ms"] >= 0
        opt.step()
        for (n, p), q in zip(ref.named_parameters(), ddp.module.parameters(), strict=True):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{kind} {n}: {m}")
    assert torch.equal(ddp.module.frozen.weight, frozen_before), "frozen parameters must be left alone"
    assert ddp.module.frozen.weight.grad is None
    return ddp.last_comm


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", ["naive", "flat", "overlap"])
def test_ddp_matches_single_process(kind, opt_name):
    comm = launch(_train_and_compare, 2, args=(kind, opt_name, None), device="cpu", timeout_s=120)
    assert all(c["bytes"] > 0 for c in comm)


@pytest.mark.parametrize("bucket_mb", [1e-4, 0.002, 1000.0])  # tiny (one param each), medium, huge (one bucket)
def test_bucketed_matches_single_process(bucket_mb):
    launch(_train_and_compare, 2, args=("bucketed", "adamw", bucket_mb), device="cpu", timeout_s=120)


def _bucket_counts(rank, world, bucket_mb):
    model = BucketedDDP(make_model(0), bucket_size_mb=bucket_mb)
    sizes = [b.nbytes() for b in model.buckets]
    n_params = len(model.params)
    return len(model.buckets), max(sizes), n_params


def test_bucket_sizes_respect_the_cap():
    (tiny, _, n), = launch(_bucket_counts, 1, args=(1e-4,), device="cpu")
    assert tiny == n  # every parameter alone
    (huge, _, _), = launch(_bucket_counts, 1, args=(1000.0,), device="cpu")
    assert huge == 1
    cap = 0.002
    (k, biggest, _), = launch(_bucket_counts, 1, args=(cap,), device="cpu")
    assert 1 < k < n
    # a bucket exceeds the cap only when a single parameter alone is larger than it
    assert biggest <= max(cap * 2**20, 50 * 16 * 4)


def _raise_on_rank_one(rank, world):
    if rank == 1:
        raise ValueError("rank one exploded on purpose")
    dist.barrier()  # rank 0 would wait here forever if the launcher did not fail fast
    return rank


def test_a_failing_rank_fails_the_launch_with_its_traceback():
    from parallel.launch import RankError

    with pytest.raises(RankError) as info:
        launch(_raise_on_rank_one, 2, device="cpu", timeout_s=60)
    assert info.value.rank == 1
    assert "rank one exploded on purpose" in str(info.value)
    assert "Traceback" in info.value.detail
