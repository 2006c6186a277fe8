"""Figure builders on plain rows (the browser tests draw them; these check what they contain)."""
from __future__ import annotations

import pytest

from frontend.charts import pool_runs, sweep_figures


def ddp_row(wrapper, bucket, median, host_bound=False, other=None):
    split = {"params": 4 << 20, "grads": 4 << 20, "optimizer_state": 8 << 20, "other": other}
    return {"params": {"wrapper": wrapper, "bucket_size_mb": bucket}, "state": "done", "job_id": 1, "error": None,
            "metrics": {"median_ms": median, "p20_ms": median * 0.98, "p80_ms": median * 1.02,
                        "exposed_comm_ms": median - 10, "exposed_comm_ci_low": median - 11,
                        "exposed_comm_ci_high": median - 9, "comm_ms": 3.0, "buckets": 7,
                        "gpu_busy": 0.38 if host_bound else 0.97, "host_bound": host_bound,
                        "memory_by_rank": [{"after_construction": split, "before_step": split,
                                            "after_step": split}] * 2}}


def test_bucket_chart_has_reference_lines_the_fitted_curve_and_host_bound_marks():
    rows = [ddp_row("bucketed", b, 20 + b / 100) for b in (1, 10, 100)]
    rows += [ddp_row("naive", 1, 30), ddp_row("overlap", 1, 25, host_bound=True)]
    model = {"sweep_id": 9, "o_ms": 0.03, "w_gbps": 300.0, "grad_bytes": 1e9, "best_bucket_mb": 95.0,
             "curve": {"bucket_mb": [1, 10, 100], "buckets": [954, 96, 10], "exposed_ms": [30, 3.4, 3.6]}}
    figs = sweep_figures("ddp", rows, model)
    step, exposed = figs[0], figs[1]
    names = [t["name"] for t in step["data"]]
    assert "bucketed" in names and "naive" in names
    assert any(n.startswith("overlap host-bound: 38 % GPU busy") for n in names)
    ref = next(t for t in step["data"] if t["name"] == "naive")
    assert ref["line"]["dash"] == "dash" and ref["y"] == [30, 30]
    curve = next(t for t in exposed["data"] if t["name"].startswith("model"))
    assert curve["y"] == [30, 3.4, 3.6]
    assert "sweep #9" in exposed["layout"]["title"]["text"]
    assert any("predicted best 95" in a["text"] for a in exposed["layout"]["annotations"])
    assert step["layout"]["xaxis"]["type"] == "log"


def test_cpu_rows_without_other_memory_still_draw():
    """On CPU `other` is None (no allocator to ask): the memory bars count it as 0, not an error."""
    figs = sweep_figures("ddp", [ddp_row("bucketed", 1, 20, other=None), ddp_row("bucketed", 10, 21, other=None)])
    mem = next(f for f in figs if "Memory" in f["layout"]["title"]["text"])
    other = next(t for t in mem["data"] if t["name"] == "other")
    assert other["y"] == [0] * 12  # 2 cells x 2 ranks x 3 stages
    cells, points = other["x"]  # two rows of labels: the cell once under its ranks and stages
    assert cells == ["1"] * 6 + ["10"] * 6 and points[:4] == ["r0 built", "r0 before step", "r0 after step", "r1 built"]
    assert mem["layout"]["xaxis"]["title"]["text"] == "bucket_size_mb"


def test_allreduce_latency_chart_draws_each_fit():
    rows = [{"params": {"size_mb": s, "world_size": 2}, "state": "done", "job_id": i, "error": None,
             "metrics": {"median_ms": 0.02 + s / 300, "busbw_gbps": 100.0}} for i, s in enumerate((1, 16, 256))]
    figs = sweep_figures("allreduce", rows, {"fits": {"2": {"o_ms": 0.02, "w_gbps": 314.6}}})
    latency = figs[1]
    assert any(t["name"].startswith("fit, 2 ranks: o = 20.0 us, w = 314.6 GB/s") for t in latency["data"])


def _leaderboard_row(sharding, state="done", step_ms=9000.0):
    metrics = None if state != "done" else {
        "median_ms": step_ms, "forward_ms": 2500.0, "backward_ms": 6000.0, "optimizer_ms": 500.0,
        "exposed_comm_ms": 300.0, "mfu": 0.3, "tokens_per_s": 7000.0,
        "memory_by_rank": [{"params": 2**30, "grads": 2**30, "optimizer_state": 2**31, "other": None}] * 2,
        "peak_mem_by_rank": [50 * 2**30, 52 * 2**30]}
    return {"params": {"sharding": sharding, "scale": 1.0}, "metrics": metrics, "state": state, "error": None}


def test_leaderboard_charts_split_the_step_and_name_the_recipes_that_did_not_run():
    rows = [_leaderboard_row("fsdp"), _leaderboard_row("zero1", step_ms=12000.0), _leaderboard_row("none", "oom")]
    step, memory = sweep_figures("leaderboard", rows)
    bars = {t["name"]: t for t in step["data"] if t["type"] == "bar"}
    assert list(bars) == ["forward", "backward", "optimizer"]
    assert bars["backward"]["x"] == ["sharding=fsdp", "sharding=zero1"] and bars["backward"]["y"] == [6.0, 6.0]
    assert "sharding=none: oom" in step["layout"]["title"]["text"]
    peak = next(t for t in memory["data"] if t["name"] == "peak in the step")
    assert peak["y"] == [50, 52, 50, 52] and len(memory["data"][0]["x"]) == 4  # two recipes x two ranks


def test_collective_time_chart_bars_down_to_the_rank_that_waited_least():
    rows = [ddp_row("bucketed", b, 20) for b in (1, 10)]
    for r in rows:
        r["metrics"]["comm_transfer_ms"] = 2.0  # comm_ms (the rank with the most) is 3.0
    comm = next(f for f in sweep_figures("ddp", rows) if "collectives" in f["layout"]["title"]["text"])
    bucketed = next(t for t in comm["data"] if t["name"] == "bucketed")
    assert bucketed["y"] == [3.0, 3.0] and bucketed["error_y"]["arrayminus"] == [1.0, 1.0]
    assert bucketed["error_y"]["array"] == [0.0, 0.0]
    # rows recorded before comm_transfer_ms existed draw their points without a bar
    old = next(f for f in sweep_figures("ddp", [ddp_row("bucketed", b, 20) for b in (1, 10)])
               if "collectives" in f["layout"]["title"]["text"])
    assert "error_y" not in old["data"][0] or not old["data"][0]["error_y"].get("array")


def test_attention_latency_draws_a_host_bound_cell_hollow_and_says_why():
    def row(seq, median, busy):
        return {"params": {"impl": "flash_triton", "seq_len": seq}, "state": "done", "job_id": seq, "error": None,
                "metrics": {"median_ms": median, "p20_ms": median, "p80_ms": median, "tflops": 1.0,
                            "gpu_busy": busy, "host_bound": busy < 0.8}}

    figs = sweep_figures("attention", [row(128, 0.5, 0.06), row(4096, 2.0, 0.97)])
    latency = next(f for f in figs if f["layout"]["title"]["text"].startswith("Latency"))
    trace = latency["data"][0]
    assert list(trace["marker"]["symbol"]) == ["circle-open", "circle"]
    assert list(trace["hovertext"]) == ["host-bound: 6 % GPU busy", ""]


def test_cells_timed_in_turns_chart_the_speed_up_with_its_interval():
    def row(seq, against, speedup, sustain_ms=None):
        return {"params": {"impl": "flash_triton", "against": against, "seq_len": seq, "sustain_ms": sustain_ms},
                "state": "done",
                "job_id": seq, "error": None,
                "metrics": {"median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0, "tflops": 1.0, "against_median_ms": speedup,
                            "speedup_vs_against": speedup, "speedup_vs_against_low": speedup - 0.1,
                            "speedup_vs_against_high": speedup + 0.2}}

    figs = sweep_figures("attention", [row(128, "sdpa_flash", 0.9), row(1024, "sdpa_flash", 1.3)])
    chart = next(f for f in figs if f["layout"]["title"]["text"] == "Speed-up over sdpa_flash, timed in turns")
    (trace,) = chart["data"]
    assert list(trace["y"]) == [0.9, 1.3]
    assert list(trace["error_y"]["array"]) == pytest.approx([0.2, 0.2])
    assert list(trace["error_y"]["arrayminus"]) == pytest.approx([0.1, 0.1])
    both = sweep_figures("attention", [row(128, "sdpa_flash", 0.9), row(128, "sdpa_cudnn", 1.1)])
    chart = next(f for f in both if f["layout"]["title"]["text"].startswith("Speed-up over the implementation"))
    assert sorted(t["name"] for t in chart["data"]) == ["against=sdpa_cudnn", "against=sdpa_flash"]
    plain = sweep_figures("attention", [row(128, None, 1.0)])  # no cell timed in turns: no such chart
    assert not any("timed in turns" in f["layout"]["title"]["text"] for f in plain)
    titles = [f["layout"]["title"]["text"] for f in sweep_figures("attention", [row(128, "sdpa_cudnn", 0.97, 1000)])]
    assert "Speed-up over sdpa_cudnn, each timed alone (sustained)" in titles
    mixed = sweep_figures("attention", [row(128, "sdpa_cudnn", 0.97, 1000), row(128, "sdpa_cudnn", 1.02)])
    titles = [f["layout"]["title"]["text"] for f in mixed]
    assert "Speed-up over sdpa_cudnn, timed in turns or alone (sustain_ms)" in titles


def test_a_memory_chart_with_no_measured_cell_is_left_out_but_failures_still_show_on_latency():
    """CPU cells record no peak memory: the memory chart would hold only the skipped cell's mark."""
    def row(impl, seq, state="done", median=1.0, mem=None):
        metrics = {"median_ms": median, "p20_ms": median, "p80_ms": median, "tflops": 1.0, "peak_mem_bytes": mem}
        return {"params": {"impl": impl, "seq_len": seq}, "state": state, "job_id": seq, "error": None,
                "metrics": metrics if state == "done" else {}}

    cpu = [row("naive", 64), row("naive", 128), row("flash_triton", 64, state="skipped")]
    titles = [f["layout"]["title"]["text"] for f in sweep_figures("attention", cpu)]
    assert not any(t.startswith("Peak memory") for t in titles)
    latency = next(f for f in sweep_figures("attention", cpu) if f["layout"]["title"]["text"].startswith("Latency"))
    assert any(t["name"].endswith("(skipped)") for t in latency["data"])

    gpu = [row("naive", 64, mem=2**20), row("naive", 128, mem=2**21), row("flash_triton", 64, state="oom")]
    memory = next(f for f in sweep_figures("attention", gpu) if f["layout"]["title"]["text"].startswith("Peak memory"))
    assert [list(t["y"]) for t in memory["data"] if t["name"] == "impl=naive"] == [[1.0, 2.0]]
    assert any(t["name"].endswith("(oom)") for t in memory["data"])

    failed_only = [row("flash_triton", 64, state="oom"), row("flash_triton", 128, state="failed")]
    titles = [f["layout"]["title"]["text"] for f in sweep_figures("attention", failed_only)]
    assert any(t.startswith("Latency") for t in titles) and not any(t.startswith("Peak memory") for t in titles)


def _run(cell, repeat, impl, seq, median, busy=0.9, state="done"):
    metrics = {"median_ms": median, "p20_ms": median * 0.9, "p80_ms": median * 1.1, "tflops": 1 / median,
               "samples_ms": [median] * 3, "gpu_busy": busy, "host_bound": busy < 0.8} if state == "done" else {}
    return {"cell": cell, "repeat": repeat, "params": {"impl": impl, "seq_len": seq}, "state": state,
            "job_id": 10 * cell + repeat, "error": None if state == "done" else "CUDA out of memory",
            "metrics": metrics}


def test_pool_runs_gives_a_cell_the_medians_of_its_finished_runs_and_keeps_the_rest():
    rows = [_run(0, 0, "a", 64, 1.0, busy=0.5), _run(0, 1, "a", 64, 3.0, busy=0.9), _run(0, 2, "a", 64, 2.0, busy=0.3),
            _run(0, 3, "a", 64, 0, state="oom"), _run(1, 0, "a", 128, 5.0)]
    pooled = pool_runs(rows)
    cell0 = next(r for r in pooled if r["cell"] == 0 and r["state"] == "done")
    m = cell0["metrics"]
    assert m["median_ms"] == 2.0 and m["runs"] == 3 and m["runs_range"]["median_ms"] == [1.0, 3.0]
    assert m["tflops"] == 1 / 2.0 and m["gpu_busy"] == 0.5
    assert m["host_bound"] is True  # two of its three runs were
    assert cell0["repeat"] == 2 and m["samples_ms"] == [2.0] * 3  # the rest from the run of median median_ms
    assert [r["state"] for r in pooled if r["cell"] == 0].count("oom") == 1  # the failed run stays, marked
    assert next(r for r in pooled if r["cell"] == 1) == rows[4]  # a cell run once is left as it is
    assert pool_runs(rows[4:]) == rows[4:]
    # two sweeps' files read as one, each numbering its cells from 0: other params, other cells
    other_sweep = [_run(0, 0, "a", 256, 7.0), _run(0, 0, "b", 64, 9.0)]
    assert pool_runs(rows[4:] + other_sweep) == rows[4:] + other_sweep


def test_a_sweep_with_repeats_draws_one_point_per_cell_with_the_runs_range():
    rows = [_run(c, rep, impl, seq, base * (1 + rep)) for rep in range(3)
            for c, (impl, seq, base) in enumerate([("a", 64, 1.0), ("a", 128, 2.0), ("b", 64, 0.5), ("b", 128, 1.0)])]
    latency = next(f for f in sweep_figures("attention", rows) if f["layout"]["title"]["text"].startswith("Latency"))
    assert "up to 3 times" in latency["layout"]["title"]["text"]
    a = next(t for t in latency["data"] if t["name"] == "impl=a")
    assert list(a["x"]) == [64, 128] and list(a["y"]) == [2.0, 4.0]  # medians of 1, 2, 3 and 2, 4, 6
    assert list(a["error_y"]["array"]) == [1.0, 2.0] and list(a["error_y"]["arrayminus"]) == [1.0, 2.0]
    assert list(a["hovertext"]) == ["median of 3 runs: 1-3", "median of 3 runs: 2-6"]


def test_model_charts_keep_configurations_apart_that_differ_in_any_param():
    """Two context lengths of one size used to fold into one bar (labels named size and precision only)."""
    base = {"size": "custom", "batch": 2, "compile": False, "device": "cpu"}
    scopes = (("fwd", 1.0), ("fwd_bwd", 3.0), ("step", 4.0))
    rows = [{"params": {**base, "context_length": ctx, "precision": prec, "scope": scope}, "state": "done",
             "job_id": 1, "error": None,
             "metrics": {"median_ms": t * (2 if ctx == 64 else 1) * (0.5 if prec == "bf16" else 1)}}
            for ctx in (32, 64) for prec in ("fp32", "bf16") for scope, t in scopes]
    figs = {f["layout"]["title"]["text"]: f for f in sweep_figures("model", rows)}
    stacked = figs["Time per scope (median ms)"]
    forward = next(t for t in stacked["data"] if t["name"] == "forward")
    labels = list(forward["x"])
    assert len(labels) == 4 and len(set(labels)) == 4
    assert dict(zip(labels, forward["y"], strict=True))["context_length=64, precision=fp32"] == 2.0
    speedup = figs["bf16 autocast speed-up over fp32"]["data"][0]
    assert len(set(speedup["x"])) == 6 and "context_length=32, scope=fwd" in speedup["x"]
    assert list(speedup["y"]) == [2.0] * 6


def test_a_series_keeps_its_colour_across_a_pages_charts_even_where_a_chart_lacks_others():
    rows = [{"params": {"impl": impl, "seq_len": s}, "state": "done", "job_id": 1, "error": None,
             "metrics": {"median_ms": ms * s, "tflops": 1.0 / ms}}
            for impl, ms in (("flash_pytorch", 0.5), ("naive", 1.0), ("sdpa", 0.2)) for s in (64, 128)]
    figs = sweep_figures("attention", rows)
    latency = next(f for f in figs if f["layout"]["title"]["text"].startswith("Latency"))
    speedup = next(f for f in figs if f["layout"]["title"]["text"].startswith("Speed-up"))
    color = {t["name"]: t["line"]["color"] for t in latency["data"]}
    assert len(set(color.values())) == 3
    assert {t["name"] for t in speedup["data"]} == {"impl=flash_pytorch", "impl=sdpa"}  # no naive line there
    assert all(t["line"]["color"] == color[t["name"]] for t in speedup["data"])
