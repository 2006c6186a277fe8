"""The planner's formulas against numbers worked out by hand (docs/planner.md)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.main import create_app
from backend.planner import (
    Cluster,
    Model,
    Precision,
    comm_bytes,
    max_devices_before_comm_bound,
    memory,
    plan,
    plan_one,
    predict_measured,
    recipe_precision,
    step_flops,
)
from backend.settings import BackendSettings

# a small model whose numbers are easy to follow: D 1000, F 4000, 10 layers, V 1000, S 100
M = Model(d_model=1000, d_ff=4000, num_layers=10, num_heads=10, vocab_size=1000, seq_len=100)
P = Precision()  # fp32 weights / grads / comm, Adam 8 bytes, bf16 activations


def test_parameter_count():
    # per layer 4 D^2 + 3 D F = 4e6 + 12e6 = 16e6; 10 layers 160e6; embedding + head 2 V D = 2e6
    assert M.layer_params == 16_000_000 and M.params == 162_000_000


def test_flops_of_a_step():
    # batch 2: T = 200 tokens. matmuls 2 T (L (4D^2 + 3DF) + V D) = 400 * 161e6 = 64.4e9
    # attention 2 T S D L = 2 * 200 * 100 * 1000 * 10 = 0.4e9 (causal half of 4 T S D)
    f = step_flops(M, batch=2)
    assert f["fwd"] == pytest.approx(64.4e9 + 0.4e9) and f["step"] == pytest.approx(3 * 64.8e9)


def test_communication_per_device_by_strategy():
    n = 4
    # the weights in fp32: 162e6 * 4 = 648 MB
    # DP: a ring all-reduce sends 2 (N-1)/N of the gradients: 2 * 3/4 * 648e6 = 972e6, all in backward
    dp = comm_bytes(M, 2, "dp", n, 1, P)
    assert dp["fwd"] == 0 and dp["bwd"] == pytest.approx(972e6)
    # FSDP: gather in forward (3/4 * 648e6 = 486e6), gather + reduce-scatter in backward (972e6)
    fsdp = comm_bytes(M, 2, "fsdp", n, 1, P)
    assert fsdp["fwd"] == pytest.approx(486e6) and fsdp["bwd"] == pytest.approx(972e6)
    # TP: per layer 2 all-reduces of T D bf16 activations each way: 2 * (2 * 3/4 * 200 * 1000 * 2) = 1.2e6
    tp = comm_bytes(M, 2, "tp", 1, n, P)
    assert tp["fwd"] == pytest.approx(10 * 1.2e6) and tp["bwd"] == pytest.approx(10 * 1.2e6)
    # ZeRO-1: DP's all-reduce plus broadcasting the updated parameters: 3/4 * 648e6 = 486e6 more
    assert comm_bytes(M, 2, "zero1", n, 1, P)["step"] == pytest.approx(972e6 + 486e6)
    # FSDP+TP 2 x 2: FSDP over a half shard (3 * 1/2 * 324e6 = 486e6), TP over half the tokens
    both = comm_bytes(M, 2, "fsdp_tp", 2, 2, P)
    assert both["data"] == pytest.approx(486e6)
    assert both["tensor"] == pytest.approx(10 * 2 * 2 * 2 * 0.5 * 100 * 1000 * 2)


def test_memory_per_device():
    # DP keeps everything: 162e6 * (4 + 4 + 8) = 2.592e9; FSDP over 4 a quarter of it
    assert sum(v for k, v in memory(M, 8, "dp", 4, 1, P).items() if k != "activations") == pytest.approx(2.592e9)
    assert memory(M, 8, "fsdp", 4, 1, P)["optimizer_state"] == pytest.approx(162e6 * 8 / 4)
    assert memory(M, 8, "zero1", 4, 1, P)["params"] == pytest.approx(162e6 * 4)  # only optimizer state split
    assert memory(M, 8, "zero1", 4, 1, P)["optimizer_state"] == pytest.approx(162e6 * 2)
    # activations, DP over 4: T' = 8 * 100 / 4 = 200 tokens; per layer T' D (10 + 24) * 2 / 2 = 6.8e6
    assert memory(M, 8, "dp", 4, 1, P)["activations"] == pytest.approx(10 * 6.8e6)
    # checkpointing keeps each layer's input (T' D 2 = 0.4e6) and one layer's full set
    assert memory(M, 8, "dp", 4, 1, P, checkpointing=True)["activations"] == pytest.approx(10 * 0.4e6 + 6.8e6)


def test_when_data_parallelism_becomes_communication_bound():
    # DP compute per device: 3 * 64.8e9 * (batch/2) / N / C; comm: 2 (N-1)/N 648e6 / W.
    # batch 64: step FLOPs 3 * 64.8e9 * 32 = 6.2208e12. C = 1e12, W = 1e9:
    # N = 2: compute 3.11 s, comm 0.648 s -> compute-bound; N = 8: 0.778 s vs 1.134 s -> bound
    c = Cluster(devices=8, memory_bytes=80e9, flops=1e12, bandwidth=1e9)
    assert not plan_one(M, 64, c, "dp", 2, 1, P)["comm_bound"]
    row = plan_one(M, 64, c, "dp", 8, 1, P)
    assert row["compute_s"] == pytest.approx(6.2208e12 / 8 / 1e12) and row["comm_s"] == pytest.approx(1.134)
    assert row["comm_bound"] and row["step_s"] == pytest.approx(1.134)
    # N = 4: 1.5552 s vs 0.972 s: the largest power of two that is not bound
    assert max_devices_before_comm_bound(M, 64, c, "dp", P) == 4
    no_overlap = plan_one(M, 64, Cluster(8, 80e9, 1e12, 1e9, overlap=False), "dp", 8, 1, P)
    assert no_overlap["step_s"] == pytest.approx(0.7776 + 1.134)


def test_plan_lists_every_split_and_prefers_what_fits():
    result = plan(M, 64, Cluster(devices=8, memory_bytes=80e9, flops=1e12, bandwidth=1e9))
    assert [r["strategy"] for r in result["strategies"]] == ["dp", "fsdp", "tp"]
    assert sorted((r["n_fsdp"], r["n_tp"]) for r in result["fsdp_tp_splits"]) == [(2, 4), (4, 2)]
    assert result["best_split"]["step_s"] == min(r["step_s"] for r in result["fsdp_tp_splits"])


def test_measured_cells_get_their_predictions():
    rows = [{"job_id": 1, "state": "done", "params": {"wrapper": "bucketed", "world_size": 2},
             "metrics": {"backend": "nccl", "world_size": 2, "median_ms": 100.0, "peak_mem_bytes": 4e9,
                         "model": {"d_model": 1000, "d_ff": 4000, "num_layers": 10, "num_heads": 10,
                                   "context_length": 100, "batch": 4}}},
            {"job_id": 2, "state": "done", "params": {"wrapper": "none"}, "metrics": {"backend": "nccl"}}]
    [r] = predict_measured(rows, Cluster(2, 80e9, 1e12, 1e9))
    expected = plan_one(Model(1000, 4000, 10, 10, 10_000, 100), 8, Cluster(2, 80e9, 1e12, 1e9), "dp", 2, 1, P)
    assert r["predicted_step_ms"] == pytest.approx(expected["step_s"] * 1e3)
    assert r["step_ratio"] == pytest.approx(100.0 / r["predicted_step_ms"])


@pytest.mark.parametrize("junk", ["fast", [1, 2], {"a": 1}, None, True, -1.0])
def test_a_measured_cell_whose_metrics_are_not_the_suites_shape_is_left_out_not_a_failure(junk):
    good = {"job_id": 1, "state": "done", "params": {"wrapper": "bucketed", "world_size": 2},
            "metrics": {"backend": "nccl", "world_size": 2, "median_ms": 100.0, "peak_mem_bytes": 4e9,
                        "model": {"d_model": 1000, "d_ff": 4000, "num_layers": 10, "num_heads": 10,
                                  "context_length": 100, "batch": 4}}}
    odd_model = {**good, "job_id": 2, "metrics": {**good["metrics"], "model": {"d_model": junk}}}
    odd_times = {**good, "job_id": 3, "metrics": {**good["metrics"], "median_ms": junk, "peak_mem_bytes": junk}}
    rows = predict_measured([good, odd_model, odd_times], Cluster(2, 80e9, 1e12, 1e9))
    assert [r["job_id"] for r in rows] == [1, 3]  # a model it cannot read: no prediction; times: none measured
    assert rows[1]["measured_step_ms"] is None and rows[1]["step_ratio"] is None and rows[1]["memory_ratio"] is None


def test_leaderboard_cells_are_predicted_with_their_sharding_batch_and_checkpointing():
    model = {"d_model": 1000, "d_ff": 4000, "num_layers": 10, "num_heads": 10, "vocab_size": 1000,
             "context_length": 100}
    rows = [{"job_id": 7, "state": "done",
             "params": {"sharding": "fsdp", "batch": 1, "checkpointing": "block", "world_size": 2},
             "metrics": {"backend": "nccl", "world_size": 2, "median_ms": 50.0, "peak_mem_bytes": 4e9,
                         "model": model}},
            {"job_id": 8, "state": "oom", "params": {"sharding": "none"}, "metrics": None}]
    c = Cluster(2, 80e9, 1e12, 1e9)
    [r] = predict_measured(rows, c)
    expected = plan_one(M, 2, c, "fsdp", 2, 1, P, checkpointing=True)  # one sequence on each of 2 GPUs
    assert r["wrapper"] == "leaderboard fsdp"
    assert r["predicted_step_ms"] == pytest.approx(expected["step_s"] * 1e3)
    assert r["memory_ratio"] == pytest.approx(4e9 / expected["memory_total"])


def test_recipe_precision_counts_what_each_leaderboard_option_keeps_on_the_gpu():
    assert recipe_precision({}) == (P, None)
    assert recipe_precision({"state_dtype": "bf16"})[0].optim_bytes == 4  # m and v at 2 bytes each
    bf16 = recipe_precision({"param_dtype": "bf16"})[0]
    assert (bf16.param_bytes, bf16.grad_bytes, bf16.optim_bytes, bf16.comm_bytes) == (2, 2, 4 + 8, 2)
    off, note = recipe_precision({"param_dtype": "bf16", "state_dtype": "bf16", "offload": True})
    assert (off.param_bytes, off.grad_bytes, off.optim_bytes) == (2, 2, 0) and "host" in note


def test_an_offloaded_leaderboard_cell_gets_its_memory_predicted_and_no_step_ratio():
    model = {"d_model": 1000, "d_ff": 4000, "num_layers": 10, "num_heads": 10, "vocab_size": 1000,
             "context_length": 100}
    par = {"sharding": "none", "batch": 1, "checkpointing": "block", "world_size": 1, "param_dtype": "bf16",
           "state_dtype": "bf16", "offload": True}
    rows = [{"job_id": 3, "state": "done", "params": par,
             "metrics": {"backend": "nccl", "world_size": 1, "median_ms": 900.0, "peak_mem_bytes": 1e9,
                         "model": model}}]
    [r] = predict_measured(rows, Cluster(1, 80e9, 1e12, 1e9))
    # on the GPU: bf16 weights and gradients (2 + 2 bytes a parameter), no optimizer state; activations
    # with checkpointing: 10 layers' inputs (100 tokens x 1000 x 2 bytes) plus one layer's full set
    acts = 10 * 100 * 1000 * 2 + 100 * 1000 * (10 + 24) * 2 / 2
    assert r["predicted_memory_bytes"] == pytest.approx(M.params * 4 + acts)
    assert r["step_ratio"] is None and "host" in r["note"]
    assert r["memory_ratio"] == pytest.approx(1e9 / r["predicted_memory_bytes"])


def test_the_plan_takes_c_from_the_newest_measured_matmul_peak_model_or_leaderboard(tmp_path):
    from backend.db import make_engine, migrate, session
    from backend.service import import_results

    settings = BackendSettings(data_dir=tmp_path)
    engine = make_engine(settings)
    migrate(engine)

    def sweep(suite, peak):
        return [{"kind": "sweep", "suite": suite, "params": {}},
                {"kind": "cell", "cell": 0, "params": {}, "state": "done", "metrics": {"peak_tflops_measured": peak},
                 "env": {"gpu_name": "G", "torch": "x", "python": "3"}}]
    with session(engine) as db:
        import_results(db, sweep("model", 600.0))
        newest = import_results(db, sweep("leaderboard", 700.0))
        import_results(db, sweep("model", "fast"))  # newer, but no number a plan can use
    with TestClient(create_app(settings, with_recorder=False)) as c:
        r = c.get("/api/plan", params={"size": "small", "devices": 2})
        assert r.json()["sources"]["flops"] == f"leaderboard sweep #{newest.id} (measured matmul peak)"
        assert r.json()["cluster"]["flops"] == pytest.approx(700e12)


def test_plan_api_validates_and_names_its_sources(tmp_path):
    with TestClient(create_app(BackendSettings(data_dir=tmp_path), with_recorder=False)) as c:
        r = c.get("/api/plan", params={"size": "small", "devices": 4, "tflops": 500})
        assert r.status_code == 200 and r.json()["sources"]["flops"] == "entered"
        assert "datasheet" in r.json()["sources"]["bandwidth"]
        assert c.get("/api/plan", params={"size": "huge"}).status_code == 422
        assert c.get("/api/plan", params={"size": "custom", "d_model": 64}).status_code == 422
        assert c.get("/planner", params={"tflops": "fast"}).status_code == 422


@pytest.mark.parametrize("field, value, words", [
    ("tflops", "inf", "finite number"), ("tflops", "nan", "finite number"), ("memory_gb", "-1", "greater than 0"),
    ("bandwidth_gbps", "0", "greater than 0"), ("d_model", "-1", "greater than 0"),
    ("num_heads", "0", "greater than 0"), ("num_heads", "3", "num_heads (3) must divide d_model (64)"),
    ("vocab_size", "9" * 40, "less than or equal"),
    ("devices", "70000", "less than or equal"), ("seq_len", "x", "valid integer")])
def test_the_planner_page_and_api_refuse_the_same_input_by_name(tmp_path, field, value, words):
    with TestClient(create_app(BackendSettings(data_dir=tmp_path), with_recorder=False)) as c:
        api = c.get("/api/plan", params={field: value, **({"d_model": "64"} if field == "num_heads" else {})})
        assert api.status_code == 422 and api.json()["detail"][0]["loc"] == ["query", field], api.text
        assert words in api.json()["detail"][0]["msg"]
        page = c.get("/planner", params={field: value, **({"d_model": "64"} if field == "num_heads" else {})},
                     headers={"accept": "text/html"})
        assert page.status_code == 422 and f"query parameter &#39;{field}&#39;: " in page.text
        assert words in page.text


def test_the_planner_page_takes_empty_fields_as_left_out_and_echoes_what_was_entered(tmp_path):
    with TestClient(create_app(BackendSettings(data_dir=tmp_path), with_recorder=False)) as c:
        page = c.get("/planner", params={"size": "small", "d_model": "", "tflops": " ", "devices": "16"})
        assert page.status_code == 200
        assert 'id="p-devices" name="devices" value="16"' in page.text
        assert 'id="p-tflops" name="tflops" value=" "' in page.text and "16 devices" in page.text
