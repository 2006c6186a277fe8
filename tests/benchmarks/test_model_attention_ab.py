"""The model A/B on CPU: a tiny run writes every sample of both implementations and the ratio's interval."""
import json

import pytest

from benchmarks.model_attention_ab import main


def test_a_small_cpu_run_reports_both_implementations(tmp_path):
    out = tmp_path / "ab.json"
    assert main(["--out", str(out), "--size", "small", "--precision", "fp32", "--impls", "naive,sdpa",
                 "--batch", "1", "--context-length", "16", "--rounds", "2", "--steps", "2", "--device", "cpu"]) == 0
    report = json.loads(out.read_text())
    assert report["impls"] == ["naive", "sdpa"] and report["rounds_done"] == 2
    assert [len(report["samples_ms"][n]) for n in ("naive", "sdpa")] == [4, 4]
    assert report["params"]["batch"] == 1 and report["params"]["context_length"] == 16
    r = report["ratio_b_over_a"]
    assert r["low"] <= r["median"] <= r["high"]
    assert not (tmp_path / "ab.json.tmp").exists()


def test_three_implementations_are_refused(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x.json"), "--impls", "naive,sdpa,flash_pytorch", "--device", "cpu"])
    assert exc.value.code == 2
    assert not (tmp_path / "x.json").exists()
