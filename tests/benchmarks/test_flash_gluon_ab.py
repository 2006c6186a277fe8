"""flash_gluon_ab's configs parse, its accuracy check sees a single wrong row, and its rounds rotate the calls."""
import argparse
import math
from types import SimpleNamespace

import pytest
import torch

from benchmarks.flash_gluon_ab import config_name, parse_config, reference, row_errors


def test_configs_parse_and_bad_ones_are_named():
    assert parse_config("64,64,3,4") == (64, 64, 3, 4, "overlap")
    assert parse_config("128,64,3,8,plain") == (128, 64, 3, 8, "plain")
    assert parse_config("128,128,2,4,ws") == (128, 128, 2, 4, "ws")
    assert config_name((64, 64, 3, 4, "overlap")) == "gluon_64x64x3x4"
    assert config_name((64, 64, 3, 4, "plain")) == "gluon_64x64x3x4_plain"
    assert config_name((128, 128, 2, 4, "ws")) == "gluon_128x128x2x4_ws"
    for bad in ("64,64,3", "64,64,3,4,fast", "64,0,3,4", "a,b,c,d"):
        with pytest.raises(argparse.ArgumentTypeError, match="BLOCK_M,BLOCK_N,STAGES,WARPS"):
            parse_config(bad)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_softmax_attention_with_its_logsumexp(causal):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 8, generator=gen) for _ in range(3))
    o, lse = reference(q, k, v, causal, 1)
    s = q[1].double() @ k[1].double().T / math.sqrt(8)
    if causal:
        s = s + torch.full((5, 5), float("-inf"), dtype=torch.float64).triu(1)
    assert torch.allclose(lse, torch.logsumexp(s, -1))
    assert torch.allclose(o, torch.softmax(s, -1) @ v[1].double())
    if causal:  # the first query sees only the first key
        assert torch.allclose(o[0], v[1, 0].double())


def test_one_wrong_row_shows_in_the_row_maximum_not_the_median():
    gen = torch.Generator().manual_seed(1)
    ref_o, ref_lse = torch.randn(64, 16, generator=gen).double(), torch.randn(64, generator=gen).double()
    o, lse = ref_o.float().clone(), ref_lse.float().clone()
    o[63] += 0.5  # a ragged last row gone wrong
    err = row_errors(o, lse, ref_o, ref_lse)
    assert err["o_row_max"] == pytest.approx(0.5, abs=1e-6) and err["o_row_median"] < 1e-6
    assert err["lse_max"] < 1e-6


def test_each_round_starts_one_call_later(monkeypatch):
    # the calls run in turns, and the order rotates by one each round, so no call always runs first (on a
    # chip cooled by the compiles) or behind the same heavy call; each call's list keeps its rounds in order
    import worker.harness
    from benchmarks.flash_gluon_ab import time_in_turns

    order = []

    def fake_measure(fn, **kwargs):
        order.append(fn())
        return SimpleNamespace(median_ms=float(len(order)))

    monkeypatch.setattr(worker.harness, "measure", fake_measure)
    ms = time_in_turns({name: (lambda n=name: n) for name in "abc"}, rounds=4, repeats=5)
    assert order == list("abc" "bca" "cab" "abc")
    assert ms == {"a": [1.0, 6.0, 8.0, 10.0], "b": [2.0, 4.0, 9.0, 11.0], "c": [3.0, 5.0, 7.0, 12.0]}


def test_host_times_are_kept_per_round_and_the_head_start_is_passed_on(monkeypatch):
    # the host's time to issue each call goes beside its GPU time, so a launch cost that shows as GPU time
    # (the GPU idle between the flush and the kernel) can be told apart; --head-start reaches measure
    import worker.harness
    from benchmarks.flash_gluon_ab import time_in_turns

    seen = []

    def fake_measure(fn, **kwargs):
        seen.append(kwargs["head_start"])
        return SimpleNamespace(median_ms=1.0, host_median_ms={"a": 1, "b": 10}[fn()] * len(seen))

    monkeypatch.setattr(worker.harness, "measure", fake_measure)
    host: dict = {}
    time_in_turns({name: (lambda n=name: n) for name in "ab"}, rounds=2, repeats=5, host=host, head_start=True)
    assert seen == [True] * 4
    assert host == {"a": [1, 4], "b": [20, 30]}  # round 2 runs b (3rd call) then a (4th)
