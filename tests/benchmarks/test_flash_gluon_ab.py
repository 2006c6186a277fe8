"""flash_gluon_ab's configs parse, its accuracy check sees a single wrong row, its rounds rotate the calls, and a
baseline version is checked before anything runs and compared config by config."""
import argparse
import math

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
    # Q in registers: each mode with "-rs", the default one named too
    assert parse_config("64,64,3,4,overlap-rs") == (64, 64, 3, 4, "overlap-rs")
    assert parse_config("64,64,3,4,overlap") == parse_config("64,64,3,4")
    assert config_name(parse_config("128,64,3,4,ws-rs")) == "gluon_128x64x3x4_ws-rs"
    for bad in ("64,64,3", "64,64,3,4,fast", "64,64,3,4,rs", "64,0,3,4", "a,b,c,d"):
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


@pytest.mark.parametrize(("argv", "named"), [(["--sustain-ms", "0"], "--sustain-ms must be > 0"),
                                             (["--sustain-ms", "100", "--head-start"], "--head-start")])
@pytest.mark.parametrize("script", ["flash_gluon_ab", "flash_gluon_bwd_ab"])  # the forward's and the backward's
def test_bad_timing_arguments_are_named_before_anything_runs(tmp_path, capsys, argv, named, script):
    import importlib

    main = importlib.import_module(f"benchmarks.{script}").main
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path / "r.json")])
    assert named in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_a_cell_counts_the_median_round_when_sustained_and_the_best_in_turns(monkeypatch):
    # time_cell (both Gluon A/B scripts): --sustain-ms times each call alone and takes the median round;
    # in turns the best round counts, and the host times come along
    import worker.harness
    from benchmarks import flash_gluon_ab

    per_round = {"a": [3.0, 1.0, 2.0], "b": [4.0, 6.0, 5.0]}
    seen = {}

    def alone(calls, *, rounds, repeats, sustain_ms):
        seen["sustain_ms"] = sustain_ms
        return {n: list(v) for n, v in per_round.items()}

    def in_turns(calls, *, rounds, repeats, device, head_start, host):
        host.update({n: [0.1] for n in calls})
        return {n: list(v) for n, v in per_round.items()}

    monkeypatch.setattr(flash_gluon_ab, "time_calls", alone)
    monkeypatch.setattr(worker.harness, "measure_rounds", in_turns)
    calls = dict.fromkeys(per_round)
    run = argparse.Namespace(rounds=3, repeats=5, head_start=False, sustain_ms=400.0)
    cell = {}
    assert flash_gluon_ab.time_cell(cell, calls, run) == {"a": 2.0, "b": 5.0}
    assert seen == {"sustain_ms": 400.0} and cell["ms"] == per_round and "host_ms" not in cell
    cell = {}
    assert flash_gluon_ab.time_cell(cell, calls, argparse.Namespace(**{**vars(run), "sustain_ms": None})) == {
        "a": 1.0, "b": 4.0}
    assert cell["host_ms"] == {"a": [0.1], "b": [0.1]}


def test_a_baseline_that_is_not_a_gluon_forward_module_is_named_before_anything_runs(tmp_path, capsys):
    from benchmarks.flash_gluon_ab import main

    other = tmp_path / "other.py"
    other.write_text("def flash_attention_forward(*args):\n    pass\n")  # no launch_spec
    for path, named in ((tmp_path / "missing.py", "does not exist"), (other, "not a flash_gluon module")):
        with pytest.raises(SystemExit):
            main(["--baseline", str(path), "--out", str(tmp_path / "r.json")])
        assert named in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_each_config_is_compared_with_the_baselines_own_run_of_it():
    from benchmarks.flash_gluon_ab import speedups_vs_baseline

    best = {"triton": 1.0, "gluon_192x128x4x4_ws": 0.9, "base_gluon_192x128x4x4_ws": 1.08,
            "gluon_128x128x3x4_ws": 1.2, "sdpa_cudnn": 0.95}  # the 128-row config failed in the baseline
    assert speedups_vs_baseline(best) == {"gluon_192x128x4x4_ws": pytest.approx(1.2)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is visible")
def test_without_a_gpu_the_flash_ab_benchmarks_say_so_and_write_nothing(tmp_path, capsys):
    from benchmarks import flash_ab, flash_gluon_ab, flash_gluon_bwd_ab

    for main, extra in ((flash_gluon_ab.main, ["--config", "192,128,4,4,ws-p"]),
                        (flash_gluon_bwd_ab.main, ["--fused-config", "64,128,3,4,ws-p", "--dq-mode", "halves"]),
                        (flash_ab.main, ["--options", "fused_persistent=true"])):
        out = tmp_path / "ab.json"
        with pytest.raises(SystemExit):
            main([*extra, "--shape", "1,2,4096,64", "--sustain-ms", "300", "--out", str(out)])
        assert "no GPU is visible" in capsys.readouterr().err and not out.exists()
