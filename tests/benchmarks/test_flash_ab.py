"""The A/B benchmark loads another flash_triton.py by path and names what is wrong with a bad one."""
import argparse
from pathlib import Path

import pytest

from benchmarks.flash_ab import (
    _call,
    launch_options,
    load_module,
    main,
    parse_fuse,
    parse_options,
    parse_pin,
    parse_sdpa,
    parse_shape,
    parse_variant,
    round_stat,
    ship_fused,
    time_calls,
    variant_options,
)


def test_loads_a_flash_module_from_a_path():
    path = Path(__file__).resolve().parents[2] / "kernels" / "flash_triton.py"
    mod = load_module(path, "flash_copy_for_test")
    assert mod.__name__ == "flash_copy_for_test" and hasattr(mod, "FlashAttentionTriton")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_module(tmp_path / "nope.py")


def test_a_file_without_the_kernels_is_refused(tmp_path):
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    with pytest.raises(AttributeError, match="flash_attention_forward"):
        load_module(other)


def test_shapes_parse_and_bad_ones_are_named():
    assert parse_shape("16,16384,64,causal") == ((16, 16384, 64), True)
    assert parse_shape("8, 16, 2048, 128") == ((8, 16, 2048, 128), False)
    for bad in ("16,16384", "16,x,64", "1,2,3,4,5", "16,0,64", "causal"):
        with pytest.raises(argparse.ArgumentTypeError, match="want 3 or 4 positive sizes"):
            parse_shape(bad)


def test_the_backward_pass_compares_each_versions_gradients_on_its_own_forward():
    """--pass bwd times flash_attention_backward on the version's own (O, L); CPU interpreter, one tiny shape."""
    import os

    import torch

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the kernels in Triton's CPU interpreter")
    from kernels import flash_triton

    q, k, v, do = (torch.randn(1, 2, 40, 16) for _ in range(4))
    out, lse = flash_triton.flash_attention_forward(q, k, v, True)
    dq, dk, dv = _call(flash_triton, "bwd", q, k, v, do, True, out, lse)()
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = torch.softmax((qr @ kr.transpose(-1, -2) / 4).masked_fill(torch.ones(40, 40).triu(1).bool(), -1e9), -1) @ vr
    ref.backward(do)
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    (o2, _l2) = _call(flash_triton, "fwd", q, k, v, do, True, out, lse)()
    torch.testing.assert_close(o2, out)


def test_launch_options_and_sdpa_backends_parse_and_bad_ones_are_named():
    assert parse_options("autotune=false, head_group=8") == {"autotune": False, "head_group": 8}
    assert parse_options("") == {}
    assert parse_options("gluon_dkdv=false") == {"gluon_dkdv": False}
    assert parse_options("gluon_dq=true") == {"gluon_dq": True}
    assert parse_options("gluon_fwd=true") == {"gluon_fwd": True}
    assert parse_options("gluon_fused=false,fused_min_seq=1") == {"gluon_fused": False, "fused_min_seq": 1}
    assert parse_options("fused_persistent=true") == {"fused_persistent": True}
    with pytest.raises(argparse.ArgumentTypeError,
                       match="NAME one of autotune, tma, gluon_dkdv, gluon_dq, gluon_fwd, gluon_fused, "
                             "fused_persistent, head_group"):
        parse_options("backward=fused")
    with pytest.raises(argparse.ArgumentTypeError, match="tma is true or false"):
        parse_options("tma=maybe")
    for bad in ("head_group=0", "head_group=two", "head_group=-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="head_group is a positive integer"):
            parse_options(bad)
    assert parse_sdpa("cudnn,flash") == ["cudnn", "flash"]
    with pytest.raises(argparse.ArgumentTypeError, match="choose from cudnn, flash"):
        parse_sdpa("math")


def test_a_variant_parses_into_a_name_and_options_and_bad_ones_are_named():
    assert parse_variant("g4:head_group=4") == ("g4", {"head_group": 4})
    assert parse_variant("plain:") == ("plain", {})
    for bad in ("g4", "current:head_group=4", "sdpa_x:tma=false", "two words:tma=false", ":tma=false"):
        with pytest.raises(argparse.ArgumentTypeError, match="want NAME:OPTIONS"):
            parse_variant(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="head_group is a positive integer"):
        parse_variant("g0:head_group=0")


def test_a_variant_keeps_the_current_pins_and_options_under_its_own():
    current = {"tma": False, "head_group": 4, "pinned": {"dq": (128, 64, 4, 3)}}
    assert variant_options(current, {"head_group": 1}) == {"tma": False, "head_group": 1,
                                                         "pinned": {"dq": (128, 64, 4, 3)}}
    assert variant_options(current, {}) == current and current["head_group"] == 4


def test_two_variants_of_one_name_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x.json"), "--options", "head_group=2", "--variant", "a:head_group=1",
              "--variant", "a:head_group=4"])
    assert exc.value.code == 2
    assert "share a name" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_comparison_of_the_tree_with_itself_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x.json"), "--options", "autotune=true", "--baseline-options", "autotune=true"])
    assert exc.value.code == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_pin_parses_into_a_kernel_and_its_config():
    assert parse_pin("dkdv=32,64,4,3") == ("dkdv", (32, 64, 4, 3))
    assert parse_pin("dq=128,64,4,3,168") == ("dq", (128, 64, 4, 3, 168))


@pytest.mark.parametrize("bad", ["dkdv=32,64,4", "dkdv=32,64,4,3,128,1", "bwd=32,64,4,3", "dq=a,b,c,d", "fwd",
                                 "fwd=0,64,4,3"])
def test_a_bad_pin_is_named(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="expected KERNEL=BM,BN,WARPS,STAGES"):
        parse_pin(bad)


def test_pins_become_the_versions_own_configs_with_their_register_cap():
    from kernels import flash_triton as ft

    opts = launch_options(ft, {"head_group": 8, "pinned": {"dkdv": (32, 64, 4, 3, 128), "dq": (128, 64, 4, 3)}})
    assert opts.head_group == 8
    assert opts.pinned["dkdv"].kwargs == {"BLOCK_M": 32, "BLOCK_N": 64} and opts.pinned["dkdv"].maxnreg == 128
    assert opts.pinned["dq"].num_warps == 4 and opts.pinned["dq"].maxnreg is None


@pytest.mark.parametrize("sustain_ms", [None, 5.0])
def test_each_version_gets_one_median_a_round_in_bursts_and_sustained(sustain_ms):
    """On the CPU's clock: in bursts each callable runs warm-up + repeats calls a round; sustained, as many
    as fill sustain_ms, at least one timed call after the warm-up and the sizing calls."""
    from worker.harness import SUSTAIN_ESTIMATE_CALLS

    counts = {"a": 0, "b": 0}

    def call(name):
        def run():
            counts[name] += 1
        return run

    ms = time_calls({"a": call("a"), "b": call("b")}, rounds=2, repeats=4, sustain_ms=sustain_ms, device="cpu")
    assert set(ms) == {"a", "b"} and all(len(v) == 2 and min(v) >= 0 for v in ms.values())
    if sustain_ms is None:
        assert counts == {"a": 2 * (3 + 4), "b": 2 * (3 + 4)}
    else:
        assert min(counts.values()) >= 2 * (3 + SUSTAIN_ESTIMATE_CALLS + 1)


def test_sustained_rounds_come_back_under_their_versions_names(monkeypatch):
    """measure_sustained answers per callable in the order given; time_calls must hand each list to its name."""
    from worker import harness

    def fake(fns, *, sustain_ms, rounds, warmup, device):
        return [[harness.Timing.from_samples([fn() + r]) for r in range(rounds)] for fn in fns]

    monkeypatch.setattr(harness, "measure_sustained", fake)
    ms = time_calls({"slow": lambda: 9.0, "fast": lambda: 1.0}, rounds=3, repeats=1, sustain_ms=100.0)
    assert ms == {"slow": [9.0, 10.0, 11.0], "fast": [1.0, 2.0, 3.0]}


def test_a_speedup_takes_the_median_round_when_sustained_and_the_best_in_bursts():
    assert round_stat([3.0, 1.0, 2.0], sustained=True) == 2.0
    assert round_stat([3.0, 1.0, 2.0], sustained=False) == 1.0


@pytest.mark.parametrize(("args", "msg"), [(["--sustain-ms", "0"], "--sustain-ms must be > 0"),
                                           (["--rounds", "0"], "at least 1"), (["--repeats", "0"], "at least 1")])
def test_bad_timing_arguments_are_named(tmp_path, capsys, args, msg):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x.json"), "--options", "head_group=2", *args])
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_fused_key_parses_and_bad_ones_are_named():
    assert parse_fuse("64") == (64, False)
    assert parse_fuse("128,causal") == (128, True)
    for bad in ("96", "64,nc", "x", "", "64,causal,1"):
        with pytest.raises(argparse.ArgumentTypeError, match="want D or D,causal"):
            parse_fuse(bad)


def test_fusing_a_key_ships_the_fused_kernel_there_for_this_process_only(monkeypatch):
    from kernels import flash_gluon_bwd as gb

    # a table without non-causal d=64 (as it stood before that shipped)
    monkeypatch.setattr(gb, "SHIPPED_FUSED", {key: cfg for key, cfg in gb.SHIPPED_FUSED.items() if key != (64, False)})
    assert gb.shipped_config("fused", 64, False) is None and "64,nc" not in ship_fused([])
    report = ship_fused([(64, False)])
    assert gb.shipped_config("fused", 64, False) == gb.FUSED_CONFIG_WS
    assert report["64,nc"] == list(gb.FUSED_CONFIG_WS) and report["64,causal"] == list(gb.SHIPPED_FUSED[(64, True)])
    assert ship_fused([]) == report  # nothing more to add: the table as it stands
