"""Suites run directly (no queue): distributed ones spawn their ranks on CPU with gloo."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.suites import CellContext, get_suite, suite_names, validate_cell


def run(name, tmp_path, **params):
    return get_suite(name).run(validate_cell(name, params), CellContext(tmp_path))


def test_every_suite_is_torch_free_to_import_and_has_a_schema():
    import subprocess
    import sys

    code = ("import sys; from worker.suites import get_suite, suite_names\n"
            "for n in suite_names(): get_suite(n).Params.model_json_schema()\n"
            "import backend.main\n"
            "assert 'torch' not in sys.modules, 'the API side imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert set(suite_names()) >= {"attention", "model", "ddp", "allreduce", "noop"}


def test_model_params_validation():
    with pytest.raises(ValidationError, match="size=custom"):
        validate_cell("model", {"size": "custom", "d_model": 8})
    with pytest.raises(ValidationError, match="only apply with size=custom"):
        validate_cell("model", {"size": "small", "d_model": 8})
    with pytest.raises(ValidationError, match="checkpointing"):
        validate_cell("model", {"checkpointing": "sometimes"})
    assert validate_cell("model", {"size": "xl"}).dims() == (2560, 10240, 32, 32)


@pytest.mark.parametrize("wrapper", ["bucketed", "zero1", "fsdp", "torch_ddp"])
def test_ddp_suite_on_cpu(tmp_path, wrapper):
    m = run("ddp", tmp_path, wrapper=wrapper, world_size=2, d_model=32, num_layers=1, num_heads=2, d_ff=64,
            vocab_size=128, context_length=16, batch=1, warmup=1, steps=2, device="cpu", bucket_size_mb=0.05)
    assert m["backend"] == "gloo" and m["median_ms"] > 0 and m["overhead"] > 0
    mem = m["memory_per_rank"]
    assert mem["params"] > 0 and mem["grads"] > 0
    if wrapper != "torch_ddp":
        assert m["comm_ms"] is not None and m["wait_ms"] is not None


def test_zero1_holds_about_half_the_optimizer_state(tmp_path):
    common = dict(world_size=2, d_model=32, num_layers=2, num_heads=2, d_ff=64, vocab_size=256, context_length=8,
                  batch=1, warmup=0, steps=1, device="cpu")
    full = run("ddp", tmp_path, wrapper="bucketed", **common)["memory_after_step"]["optimizer_state"]
    half = run("ddp", tmp_path, wrapper="zero1", **common)["memory_after_step"]["optimizer_state"]
    assert 0.45 < half / full < 0.55


def test_allreduce_suite_on_cpu(tmp_path):
    m = run("allreduce", tmp_path, size_mb=1.0, world_size=2, warmup=1, repeats=3, device="cpu")
    assert m["bytes"] == 2**20 and m["backend"] == "gloo"
    assert m["busbw_gbps"] == pytest.approx(m["algbw_gbps"] * 2 * (2 - 1) / 2)


def test_attention_suite_skips_cuda_backends_on_cpu(tmp_path):
    from worker.harness import SkipCell

    with pytest.raises(SkipCell, match="CUDA backend"):
        run("attention", tmp_path, impl="sdpa_flash", device="cpu", seq_len=8)


def test_noop_work_reports_its_samples_like_the_timed_suites():
    import statistics

    from worker.suites import get_suite, validate_cell

    noop = get_suite("noop")
    m = noop.run(validate_cell("noop", {"work_ms": 2, "noise": 0.1, "seed": 3, "repeats": 7, "warmup": 2}), None)
    assert m["samples"] == 7 and len(m["samples_ms"]) == 7
    assert m["median_ms"] == statistics.median(m["samples_ms"]) and m["min_ms"] == min(m["samples_ms"])
    assert noop.run(validate_cell("noop", {"x": 2}), None) == {"x": 2, "value": 4.0}  # no work: no timing


def test_timing_keeps_the_raw_samples_in_order():
    from worker.harness import Timing

    t = Timing.from_samples([3.0, 1.0, 2.0])
    assert t.samples_ms == [3.0, 1.0, 2.0] and t.median_ms == 2.0 and t.samples == 3
    assert t.as_dict()["samples_ms"] == [3.0, 1.0, 2.0]
