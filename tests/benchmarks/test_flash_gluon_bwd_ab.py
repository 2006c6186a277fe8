"""flash_gluon_bwd_ab's configs parse, its reference is autograd's, and its row check sees one wrong or
unwritten row."""
import argparse
import math

import pytest
import torch

from benchmarks.flash_gluon_bwd_ab import FUSED_DQ_MODES, ORDERS, config_name, parse_config, reference_grads, row_errors


def test_configs_parse_and_bad_ones_are_named():
    assert parse_config("64,64,2,4") == (64, 64, 2, 4, "overlap", None)
    assert parse_config("64,64,3,4,defer") == (64, 64, 3, 4, "defer", None)
    assert parse_config("64,64,2,4,r168") == (64, 64, 2, 4, "overlap", 168)
    assert parse_config("64,64,3,4,plain,r128") == (64, 64, 3, 4, "plain", 128)
    assert parse_config("32,64,3,4,overlap-rs") == (32, 64, 3, 4, "overlap-rs", None)
    assert config_name((64, 64, 2, 4, "overlap", None)) == "64x64x2x4"
    assert config_name((64, 64, 3, 4, "defer", 168)) == "64x64x3x4_defer_r168"
    assert parse_config("64,128,3,4,ws-p") == (64, 128, 3, 4, "ws-p", None)
    # the benchmark's own copy of the dK/dV and fused kernels' orders (it parses configs without importing Gluon)
    from kernels.flash_gluon_bwd import DKDV_ORDERS, DQ_MODES, FUSED_ORDERS
    assert sorted(ORDERS) == sorted(set(DKDV_ORDERS + FUSED_ORDERS))
    assert sorted(FUSED_DQ_MODES + ("probe",)) == sorted(DQ_MODES)  # and of the fused kernel's dQ modes
    for bad in ("64,64,2", "64,64,2,4,fast", "64,0,2,4", "r168", "64,64,2,4,r168,defer"):
        with pytest.raises(argparse.ArgumentTypeError, match="BLOCK_M,BLOCK_N,STAGES,WARPS"):
            parse_config(bad)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_gradients_are_autograds_of_softmax_attention(causal):
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(6, 8, generator=gen) for _ in range(4))
    dq, dk, dv = reference_grads(q, k, v, do, causal)
    qs, ks, vs = (t.double().requires_grad_() for t in (q, k, v))
    s = qs @ ks.T / math.sqrt(8)
    if causal:
        s = s + torch.full((6, 6), float("-inf"), dtype=torch.float64).triu(1)
    (torch.softmax(s, -1) @ vs).backward(do.double())
    for got, want in ((dq, qs.grad), (dk, ks.grad), (dv, vs.grad)):
        assert got.dtype == torch.float64 and torch.allclose(got, want)
    if causal:  # the last key is seen by the last query alone
        p_last = torch.softmax(s, -1)[-1, -1]
        assert torch.allclose(dv[-1], p_last * do[-1].double())


def test_one_wrong_or_unwritten_row_shows_in_the_row_maximum_not_the_median():
    gen = torch.Generator().manual_seed(1)
    ref = {name: torch.randn(64, 16, generator=gen).double() for name in ("dk", "dv")}
    got = {name: t.float().clone() for name, t in ref.items()}
    got["dk"][37] += 0.5  # one wrong key row
    got["dv"][63] = float("nan")  # one row a kernel never wrote (the outputs start as NaN)
    err = row_errors(got, ref)
    assert err["dk_row_max"] == pytest.approx(0.5, rel=1e-5) and err["dk_row_median"] < 1e-6
    assert math.isnan(err["dv_row_max"])


def test_back_to_back_runs_its_calls_in_order_in_one_call():
    from benchmarks.flash_gluon_bwd_ab import back_to_back

    seen = []
    back_to_back(lambda: seen.append("dq"), lambda: seen.append("dkdv"))()
    twice = lambda: seen.append("twice")  # noqa: E731
    back_to_back(twice, twice)()
    assert seen == ["dq", "dkdv", "twice", "twice"]


def test_a_baseline_is_refused_by_name_before_anything_runs(tmp_path, capsys):
    from benchmarks.flash_gluon_bwd_ab import main

    other = tmp_path / "other.py"
    other.write_text("def fused_backward(*args):\n    pass\n")  # no launch
    fused = ["--fused-config", "64,128,3,4,ws"]
    for argv, named in ((["--baseline", str(tmp_path / "missing.py"), *fused], "does not exist"),
                        (["--baseline", str(other), *fused], "not a flash_gluon_bwd module"),
                        (["--baseline", str(other)], "give it a --fused-config")):
        with pytest.raises(SystemExit):
            main([*argv, "--out", str(tmp_path / "r.json")])
        assert named in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
