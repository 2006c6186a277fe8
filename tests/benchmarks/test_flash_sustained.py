"""The sustained-load grid benchmark's shapes, turns, speed-ups and table (its numbers need a GPU)."""
import statistics

import pytest
import yaml

from benchmarks.flash_sustained import DEFAULT_SPEC, main, spec_shapes, speedups, summary_md, turns


def _spec(tmp_path, params, suite="attention"):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"suite": suite, "name": "t", "params": params}, sort_keys=False))
    return path


def test_spec_shapes_keep_bf16_fwd_bwd_cells_once_in_order_from_min_seq(tmp_path):
    base = {"heads": 2, "d_head": 64, "dtype": "bf16", "pass": "fwd_bwd", "impl": "flash_triton"}
    path = _spec(tmp_path, [
        {**base, "batch": 4, "seq_len": [1024, 4096], "causal": [True, False], "against": ["sdpa_flash", "sdpa_cudnn"]},
        {**base, "batch": 4, "seq_len": 4096, "causal": True, "pass": "fwd"},     # another pass: left out
        {**base, "batch": 1, "seq_len": 8192, "causal": True, "dtype": "fp16"},   # another dtype: left out
        {**base, "batch": 2, "seq_len": 2048, "causal": False},
    ])
    assert spec_shapes(path) == [(4, 2, 1024, 64, True), (4, 2, 1024, 64, False), (4, 2, 4096, 64, True),
                                 (4, 2, 4096, 64, False), (2, 2, 2048, 64, False)]
    assert spec_shapes(path, min_seq=2048) == [(4, 2, 4096, 64, True), (4, 2, 4096, 64, False),
                                               (2, 2, 2048, 64, False)]


def test_the_default_spec_gives_distinct_shapes_with_the_leaderboards():
    shapes = spec_shapes(DEFAULT_SPEC, min_seq=2048)
    assert len(shapes) == len(set(shapes)) and all(s[2] >= 2048 for s in shapes)
    assert (16, 1, 16384, 64, True) in shapes
    assert {s[3] for s in shapes} == {64, 128} and {s[4] for s in shapes} == {True, False}


def test_a_head_dim_keeps_only_its_shapes_and_one_with_none_is_named():
    d128 = spec_shapes(DEFAULT_SPEC, min_seq=4096, head_dim=128)
    assert d128 == [s for s in spec_shapes(DEFAULT_SPEC, min_seq=4096) if s[3] == 128] and len(d128) == 6
    with pytest.raises(ValueError, match="d_head 96"):
        spec_shapes(DEFAULT_SPEC, min_seq=4096, head_dim=96)


def test_a_spec_of_another_suite_or_with_nothing_to_time_is_named(tmp_path):
    with pytest.raises(ValueError, match="not an attention sweep spec"):
        spec_shapes(_spec(tmp_path, {"world_size": 1}, suite="ddp"))
    path = _spec(tmp_path, {"batch": 1, "heads": 2, "seq_len": 512, "d_head": 64, "dtype": "bf16"})
    with pytest.raises(ValueError, match="seq_len >= 4096"):
        spec_shapes(path, min_seq=4096)
    bad = tmp_path / "bad.yaml"
    bad.write_text("suite: attention\nparams: [unclosed\n")
    with pytest.raises(ValueError, match="not readable YAML"):
        spec_shapes(bad)
    with pytest.raises(ValueError, match="batch"):  # the suite's own validation names the field
        spec_shapes(_spec(tmp_path, {"batch": 0, "heads": 2, "seq_len": 512, "d_head": 64}))


class _Probe:
    def __init__(self, log, clocks):
        self.log, self.clocks = log, clocks
        log.append("start")

    def stop(self):
        self.log.append("stop")
        return self.clocks, [float(c) / 3 for c in self.clocks]


def test_turns_rotate_the_first_and_keep_each_rounds_samples_and_chip_readings():
    log = []
    steps = {"a": lambda: log.append("A"), "b": lambda: log.append("B"), "c": lambda: log.append("C")}
    ms = {"a": [1.0, 2.0, 6.0], "b": [2.0, 2.0], "c": [3.0]}

    def bench(step):
        step()
        return ms[log[-1].lower()]

    out = turns(steps, 4, bench, sampler=lambda: _Probe(log, [1800.0, 1900.0]))
    assert [o for o in out["order"]] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert "".join(x for x in log if len(x) == 1) == "ABC" "BCA" "CAB" "ABC"
    assert log[:3] == ["start", "A", "stop"]  # the chip is sampled around each bench, not across the round
    assert out["samples"]["a"] == [[1.0, 2.0, 6.0]] * 4
    assert out["median_ms"]["a"] == [2.0] * 4 and out["mean_ms"]["a"] == [3.0] * 4
    assert out["sm_clock_mhz"]["b"] == [1850.0] * 4 and out["power_w"]["c"] == [statistics.median([600, 1900 / 3])] * 4
    assert out["drift"]["a"] == [6.0] * 4 and out["drift"]["c"] == [1.0] * 4
    assert [c["samples"] for c in out["chip"]["a"]] == [0] * 4  # this probe keeps no rows


def test_turns_without_a_sampler_or_readings_record_none():
    out = turns({"a": lambda: None}, 2, lambda step: [1.0], sampler=lambda: _Probe([], []))
    assert out["sm_clock_mhz"]["a"] == [None, None] and out["power_w"]["a"] == [None, None]
    out = turns({"a": lambda: None}, 1, lambda step: [1.0])
    assert out["sm_clock_mhz"]["a"] == [None]


def test_speedups_divide_within_a_round_not_across_rounds():
    # the chip slows everything by 20 % in round 2: each round's ratio still reads 1.5
    timed = {"median_ms": {"flash_triton": [2.0, 2.4, 2.0], "sdpa_cudnn": [3.0, 3.6, 3.0],
                           "sdpa_flash": [1.0, 1.2, 1.5]}}
    out = speedups(timed, "flash_triton", ("sdpa_flash", "sdpa_cudnn", "sdpa_missing"))
    assert set(out) == {"sdpa_flash", "sdpa_cudnn"}
    assert out["sdpa_cudnn"]["rounds"] == pytest.approx([1.5, 1.5, 1.5])
    assert out["sdpa_flash"]["median"] == pytest.approx(0.5)
    assert (out["sdpa_flash"]["low"], out["sdpa_flash"]["high"]) == pytest.approx((0.5, 0.75))


def test_the_summary_has_a_row_per_shape_with_medians_ratios_and_clocks():
    cell = {"batch": 2, "heads": 16, "seq_len": 8192, "d_head": 128, "causal": True,
            "median_ms": {"flash_triton": [2.0, 2.2], "sdpa_flash": [3.0, 3.1], "sdpa_cudnn": [1.8, 1.9]},
            "sm_clock_mhz": {"flash_triton": [1700.0, None], "sdpa_flash": [None, None],
                             "sdpa_cudnn": [1900.0, 1910.0]}}
    cell["drift"] = {"flash_triton": [1.08, 1.10], "sdpa_cudnn": [1.02, 1.04]}
    cell["chip"] = {"flash_triton": [{"sw_power_cap_share": 0.5}, {"sw_power_cap_share": 1.0}],
                    "sdpa_cudnn": [{"sw_power_cap_share": None}]}
    timed = {"median_ms": cell["median_ms"]}
    cell["speedup"] = speedups(timed, "flash_triton", ("sdpa_flash", "sdpa_cudnn"))
    md = summary_md({"rep_ms": 100, "warmup_ms": 25, "rounds": 2, "gpu_name": "G", "torch": "t", "triton": "x",
                     "git_commit": "abc", "shapes": [cell]})
    row = [ln for ln in md.splitlines() if ln.startswith("| (2, 16, 8192, 128)")]
    assert len(row) == 1
    assert "| yes | 2.100 | 3.050 | 1.850 |" in row[0]
    assert f"{statistics.median([3.0 / 2.0, 3.1 / 2.2]):.3f}x" in row[0]
    assert "| 1700 / 1905 | 1.090 / 1.030 | 75 % / ? |" in row[0] and "commit abc" in md


def test_bad_arguments_stop_before_any_gpu_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x.json"), "--spec", str(_spec(tmp_path, {"world_size": 1}, suite="ddp"))])
    assert exc.value.code == 2 and "not an attention sweep spec" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x.json"), "--rounds", "0"])
    assert exc.value.code == 2 and "--rounds" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_without_a_gpu_it_says_so(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and "no GPU is visible" in capsys.readouterr().err


def test_do_bench_turns_hands_do_bench_its_settings_and_samples_the_chip(monkeypatch):
    import torch
    import triton.testing

    import benchmarks.flash_timeline as timeline
    from benchmarks.flash_sustained import do_bench_turns

    calls, probes = [], []

    def fake_do_bench(fn, **kw):
        fn()
        calls.append(kw)
        return [1.0, 2.0, 3.0]

    class Probe(_Probe):
        def __init__(self, device, period_ms, extra):
            probes.append((device, period_ms, extra))
            super().__init__([], [1900.0])

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(timeline, "SmiSampler", Probe)
    ran = []
    leaves = ["q"]
    out = do_bench_turns({"a": lambda: ran.append("a"), "b": lambda: ran.append("b")}, 2, 700, 40,
                         grad_to_none=leaves, period_ms=20)
    assert ran == ["a", "b", "b", "a"]
    assert calls == [dict(warmup=40, rep=700, grad_to_none=leaves, return_mode="all")] * 4
    assert probes == [(3, 20, True)] * 4
    assert out["median_ms"]["a"] == [2.0, 2.0] and out["sm_clock_mhz"]["b"] == [1900.0, 1900.0]
