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


@pytest.mark.parametrize("suite,params,field", [
    ("noop", {"x": True}, "x"), ("noop", {"sleep_ms": False}, "sleep_ms"), ("attention", {"seq_len": True}, "seq_len"),
    ("attention", {"precision": True}, "precision"), ("ddp", {"bucket_size_mb": True}, "bucket_size_mb"),
])
def test_true_or_false_is_refused_where_a_number_or_name_is_meant(suite, params, field):
    with pytest.raises(ValidationError, match=rf"{field}\n.*(true|false) is not"):
        validate_cell(suite, params)


def test_true_or_false_still_sets_a_flag():
    assert validate_cell("attention", {"causal": False}).causal is False
    assert validate_cell("noop", {"artifact": True}).artifact is True


TINY = dict(world_size=2, d_model=32, num_layers=1, num_heads=2, d_ff=64, vocab_size=128, context_length=16,
            batch=1, device="cpu")


@pytest.mark.parametrize("wrapper", ["none", "naive", "flat", "overlap", "bucketed", "zero1", "fsdp", "torch_ddp"])
def test_ddp_suite_runs_every_wrapper_on_cpu(tmp_path, wrapper):
    m = run("ddp", tmp_path, wrapper=wrapper, warmup=1, steps=6, bucket_size_mb=0.05, **TINY)
    assert m["backend"] == "gloo" and m["median_ms"] > 0
    # the figure per step is the slowest rank's, and both variants got every timed step
    assert len(m["samples_ms"]) == len(m["nocomm_samples_ms"]) == 6
    assert m["samples_ms"] == [max(a, b) for a, b in zip(*m["rank_samples_ms"], strict=True)]
    assert m["exposed_comm_ci_low"] <= m["exposed_comm_ms"] <= m["exposed_comm_ci_high"]
    assert m["overhead"] == pytest.approx(m["median_ms"] / m["nocomm_median_ms"])
    assert m["gpu_busy"] is None and m["host_bound"] is False  # no GPU: nothing to be bound by
    mem = m["memory_per_rank"]
    assert mem["params"] > 0 and mem["grads"] > 0 and mem["other"] is None
    if wrapper == "none":
        assert m["comm_ms"] == 0 and m["comm_by_kind_ms"] == {}
    else:  # gloo's collectives, timed on its own threads
        assert m["comm_ms"] > 0 and m["comm_by_kind_ms"]
    # the upper figure is the rank with the most collective time, the transfer figure the one with the least
    assert len(m["comm_ms_by_rank"]) == 2
    assert m["comm_ms"] == max(m["comm_ms_by_rank"]) and m["comm_transfer_ms"] == min(m["comm_ms_by_rank"])
    assert m["model"] == {"size": "custom", "d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2,
                          "context_length": 16, "batch": 1}


@pytest.mark.gpu
def test_ddp_suite_on_the_gpus_there_are(tmp_path):
    """CUDA-event timing, the profiler's kernel accounting and GPU busy, on every visible GPU."""
    import torch

    world = torch.cuda.device_count()
    m = run("ddp", tmp_path, wrapper="bucketed", world_size=world, size="small", context_length=256, batch=2,
            precision="bf16", warmup=1, steps=10, device="cuda")
    assert m["backend"] == "nccl" and len(m["rank_samples_ms"]) == world
    assert 0 < m["gpu_busy"] <= 1 and m["host_bound"] == (m["gpu_busy"] < 0.8)
    assert m["memory_per_rank"]["optimizer_state"] > 0 and m["memory_per_rank"]["other"] is not None
    if world > 1:
        assert m["comm_ms"] > 0 and "AllReduce" in m["comm_by_kind_ms"]


def test_ddp_variants_alternate_in_blocks():
    """A B B A ...: the step without communication is timed between the wrapped steps, not after them."""
    from worker.suites.ddp_rank import schedule

    w, n = "wrapped", "nocomm"
    assert schedule(12, block=5) == [w] * 5 + [n] * 5 + [n] * 5 + [w] * 5 + [w] * 2 + [n] * 2
    assert schedule(20).count(w) == schedule(20).count(n) == 20


def test_ddp_size_resolution():
    p = validate_cell("ddp", {})
    assert p.resolve("cuda")["size"] == "xl" and p.resolve("cuda")["context_length"] == 512
    assert p.resolve("cpu") == {"size": "custom", "d_model": 512, "d_ff": 2048, "num_layers": 4, "num_heads": 8,
                                "context_length": 128, "batch": 2}
    assert validate_cell("ddp", {"d_model": 64, "num_heads": 4}).resolve("cuda")["d_model"] == 64
    assert validate_cell("ddp", {"size": "small", "batch": 3}).resolve("cuda")["d_model"] == 768
    with pytest.raises(ValidationError, match="only apply with size=custom"):
        validate_cell("ddp", {"size": "small", "d_model": 64})
    with pytest.raises(ValidationError, match="divisible"):
        validate_cell("ddp", {"d_model": 100, "num_heads": 3})


def test_fsdps_step_without_communication_updates_this_ranks_share_as_fsdp_does():
    import math

    import torch

    from kernels.model import TransformerLM
    from parallel.fsdp import default_should_shard
    from worker.suites.ddp_rank import ShardStep

    torch.manual_seed(0)
    model = TransformerLM(64, 8, 24, 2, 2, 40)  # vocab, context, d_model, layers, heads, d_ff
    steps = [ShardStep(model, {"optimizer": "sgd"}, rank, 3, default_should_shard) for rank in range(3)]
    sharded = {id(q): q for m in model.modules() if default_should_shard(m) for q in m.parameters(recurse=False)}
    for q in sharded.values():  # the three ranks' slices cover each sharded parameter once, in FSDP's cut
        cuts = [(lo, hi) for s in steps for (p, _, lo, hi) in s.pieces if p is q]
        k = math.ceil(q.numel() / 3)
        assert cuts == [(r * k, min((r + 1) * k, q.numel())) for r in range(3) if r * k < q.numel()]
    norms = [q for q in model.parameters() if id(q) not in sharded]
    assert norms and all([id(q) for q in s.replicated] == [id(q) for q in norms] for s in steps)
    step = steps[1]
    step.zero_grad()
    torch.nn.functional.mse_loss(model(torch.zeros(1, 8, dtype=torch.long)), torch.ones(1, 8, 64)).backward()
    param, buf, lo, hi = step.pieces[0]
    before, grad = buf.detach().clone(), param.grad.reshape(-1)[lo:hi].clone()
    step.step()
    assert torch.allclose(buf.detach(), before - 1e-4 * grad)  # SGD, lr 1e-4: this rank's slice, its own grad
    step.zero_grad()
    assert all(q.grad is None for q in model.parameters())


def test_memory_counts_each_storage_once():
    import torch

    from worker.suites.ddp_rank import storage_bytes

    bucket = torch.zeros(100)
    views = [bucket[:40], bucket[40:]]  # gradients that are views of one bucket
    seen: set[int] = set()
    assert storage_bytes(views, seen) == 400
    assert storage_bytes([bucket], seen) == 0  # already counted
    assert storage_bytes([torch.zeros(10), None], seen) == 40


def test_zero1_holds_about_half_the_optimizer_state(tmp_path):
    common = dict(world_size=2, d_model=32, num_layers=2, num_heads=2, d_ff=64, vocab_size=256, context_length=8,
                  batch=1, warmup=0, steps=1, device="cpu")
    full = run("ddp", tmp_path, wrapper="bucketed", **common)["memory_after_step"]["optimizer_state"]
    half = run("ddp", tmp_path, wrapper="zero1", **common)["memory_after_step"]["optimizer_state"]
    assert 0.45 < half / full < 0.55


def test_allreduce_suite_on_cpu(tmp_path):
    m = run("allreduce", tmp_path, size_mb=1.0, world_size=2, warmup=1, repeats=3, device="cpu")
    assert m["bytes"] == 2**20 and m["backend"] == "gloo"
    assert m["samples_ms"] == [max(a, b) for a, b in zip(*m["rank_samples_ms"], strict=True)]
    assert m["busbw_gbps"] == pytest.approx(m["algbw_gbps"] * 2 * (2 - 1) / 2)


def test_attention_suite_skips_cuda_backends_on_cpu(tmp_path):
    from worker.harness import SkipCell

    with pytest.raises(SkipCell, match="CUDA backend"):
        run("attention", tmp_path, impl="sdpa_flash", device="cpu", seq_len=8)


def test_attention_suite_records_its_error_against_float64(tmp_path):
    m = run("attention", tmp_path, impl="naive", device="cpu", batch=1, heads=3, seq_len=40, d_head=16,
            dtype="fp32", repeats=2, warmup=0)
    assert 0 < m["out_rel_err"] < 1e-5 and 0 < m["out_max_abs_err"] < 1e-5  # fp32 on the CPU: rounding only
    half = run("attention", tmp_path, impl="naive", device="cpu", batch=1, heads=3, seq_len=40, d_head=16,
               dtype="fp16", repeats=2, warmup=0)
    assert half["out_rel_err"] > 10 * m["out_rel_err"] and half["precision"] is None


def test_attention_suite_off_cuda_has_no_gpu_time_and_is_not_host_bound(tmp_path):
    m = run("attention", tmp_path, impl="naive", device="cpu", batch=1, heads=2, seq_len=16, d_head=16,
            dtype="fp32", repeats=2, warmup=0)
    assert m["gpu_ms"] is None and m["gpu_busy"] is None and m["host_bound"] is False
    assert m["host_median_ms"] is None and len(m["samples_ms"]) == 2


@pytest.mark.gpu
def test_attention_suite_says_whether_the_host_or_the_gpu_set_a_cells_time(tmp_path):
    """A tiny cell is host-bound (the GPU's work alone is far shorter than calls issued back to back);
    a large one is not, and there its GPU time alone is close to the measured time."""
    tiny = run("attention", tmp_path, impl="flash_pytorch", device="cuda", batch=1, heads=1, seq_len=64, d_head=64,
               dtype="bf16", repeats=10, warmup=2)
    big = run("attention", tmp_path, impl="sdpa", device="cuda", batch=8, heads=16, seq_len=4096, d_head=64,
              dtype="bf16", repeats=10, warmup=2)
    for m in (tiny, big):
        assert 0 < m["gpu_busy"] <= 1 and m["host_bound"] == (m["gpu_busy"] < 0.8)
        assert len(m["gpu_samples_ms"]) == 10 and m["host_median_ms"] > 0
    assert tiny["host_bound"] and not big["host_bound"]
    assert big["gpu_ms"] == pytest.approx(big["median_ms"], rel=0.2)


def test_attention_against_times_two_implementations_in_turns_with_a_speed_up_and_interval(tmp_path):
    from worker.stats import ratio_interval

    m = run("attention", tmp_path, impl="flash_pytorch", against="naive", device="cpu", batch=1, heads=2,
            seq_len=64, d_head=16, dtype="fp32", repeats=6, warmup=1)
    assert len(m["samples_ms"]) == len(m["against_samples_ms"]) == 6
    assert m["against_median_ms"] > 0 and m["out_rel_err"] < 1e-5  # the error is impl's own
    speedup, low, high = ratio_interval(m["samples_ms"], m["against_samples_ms"])
    assert m["speedup_vs_against"] == speedup == m["against_median_ms"] / m["median_ms"]
    assert (m["speedup_vs_against_low"], m["speedup_vs_against_high"]) == (low, high) and low <= speedup <= high
    plain = run("attention", tmp_path, impl="naive", device="cpu", batch=1, heads=2, seq_len=16, d_head=16,
                dtype="fp32", repeats=2, warmup=0)
    assert not any(k.startswith(("against", "speedup")) for k in plain)  # no against: no such figures
    with pytest.raises(ValidationError, match="against"):
        validate_cell("attention", {"against": "cudnn"})


def test_attention_sustained_times_each_implementation_alone_in_rounds(tmp_path):
    from worker.stats import grouped_ratio_interval

    m = run("attention", tmp_path, impl="flash_pytorch", against="naive", device="cpu", batch=1, heads=2,
            seq_len=32, d_head=16, dtype="fp32", sustain_ms=5, rounds=2, warmup=1)
    for side in ("", "against_"):
        sizes = m[f"{side}round_samples"]
        assert len(sizes) == len(m[f"{side}round_median_ms"]) == len(m[f"{side}round_drift"]) == 2
        assert min(sizes) >= 1 and sum(sizes) == len(m[f"{side}samples_ms"])  # every round's samples kept
    def split(side):  # the pooled samples back into their rounds
        first = m[f"{side}round_samples"][0]
        return [m[f"{side}samples_ms"][:first], m[f"{side}samples_ms"][first:]]
    speedup, low, high = grouped_ratio_interval(split(""), split("against_"))
    assert (m["speedup_vs_against"], m["speedup_vs_against_low"], m["speedup_vs_against_high"]) == (speedup, low, high)
    assert m["speedup_vs_against_rounds"] == [b / a for a, b in zip(m["round_median_ms"], m["against_round_median_ms"],
                                                                   strict=True)]
    alone = run("attention", tmp_path, impl="naive", device="cpu", batch=1, heads=2, seq_len=16, d_head=16,
                dtype="fp32", sustain_ms=2, warmup=0)
    assert len(alone["round_samples"]) == 3 and "speedup_vs_against" not in alone  # the default rounds, one impl
    plain = run("attention", tmp_path, impl="naive", device="cpu", batch=1, heads=2, seq_len=16, d_head=16,
                dtype="fp32", repeats=2, warmup=0)
    assert "round_samples" not in plain


@pytest.mark.parametrize("params,match", [
    ({"rounds": 3}, "rounds applies with sustain_ms only"), ({"sustain_ms": 0}, "sustain_ms"),
    ({"sustain_ms": 20_000}, "sustain_ms"), ({"sustain_ms": True}, "true is not"),
    ({"sustain_ms": 100, "rounds": 0}, "rounds"), ({"sustain_ms": 100, "rounds": 50}, "rounds"),
])
def test_attention_sustained_refuses_what_it_cannot_time(params, match):
    with pytest.raises(ValidationError, match=match):
        validate_cell("attention", params)


def test_attention_against_must_run_where_the_cell_runs(tmp_path):
    from worker.harness import SkipCell

    with pytest.raises(SkipCell, match="CUDA backend"):
        run("attention", tmp_path, impl="naive", against="sdpa_flash", device="cpu", seq_len=8)


@pytest.mark.gpu
def test_attention_against_on_cuda_times_both_in_turns(tmp_path):
    m = run("attention", tmp_path, impl="flash_triton", against="sdpa_flash", device="cuda", batch=1, heads=16,
            seq_len=1024, d_head=64, dtype="bf16", repeats=20, warmup=3)
    assert len(m["against_samples_ms"]) == 20 and len(m["against_host_samples_ms"]) == 20
    assert m["speedup_vs_against_low"] <= m["speedup_vs_against"] <= m["speedup_vs_against_high"]
    assert m["gpu_ms"] > 0 and m["peak_mem_bytes"] > 0  # impl's own GPU time and memory, as without against


@pytest.mark.gpu
def test_attention_sustained_on_cuda_keeps_rounds_of_event_samples(tmp_path):
    m = run("attention", tmp_path, impl="flash_triton", against="sdpa_flash", device="cuda", batch=1, heads=16,
            seq_len=1024, d_head=64, dtype="bf16", sustain_ms=50, rounds=2, warmup=3)
    assert len(m["round_samples"]) == 2 and min(m["round_samples"]) > 1
    assert len(m["against_host_samples_ms"]) == sum(m["against_round_samples"])
    assert m["speedup_vs_against_low"] <= m["speedup_vs_against"] <= m["speedup_vs_against_high"]
    assert m["gpu_ms"] > 0 and len(m["gpu_samples_ms"]) == 10  # the GPU-alone measurement keeps `repeats`


def test_attention_error_catches_a_wrong_implementation():
    import torch

    from kernels.attention import naive_attention
    from worker.suites.attention import output_error

    q, k, v = (torch.randn(1, 2, 50, 16) for _ in range(3))
    assert output_error(naive_attention, q, k, v, True, rows=16)["out_rel_err"] < 1e-6
    # causal output scored as non-causal (a mask bug) reads as a large error, computed across row chunks
    assert output_error(lambda *a: naive_attention(*a[:3], False), q, k, v, True, rows=16)["out_rel_err"] > 0.1


def test_attention_precision_is_fp32_only_and_skips_what_an_impl_cannot_do(tmp_path):
    from worker.harness import SkipCell

    with pytest.raises(ValidationError, match="fp32 only"):
        validate_cell("attention", {"dtype": "bf16", "precision": "ieee"})
    with pytest.raises(ValidationError, match="precision"):
        validate_cell("attention", {"dtype": "fp32", "precision": "fp64"})
    with pytest.raises(SkipCell, match="no tf32x3"):
        run("attention", tmp_path, impl="naive", device="cpu", dtype="fp32", precision="tf32x3", seq_len=8)
    with pytest.raises(SkipCell, match="leave precision unset"):
        run("attention", tmp_path, impl="sdpa", device="cpu", dtype="fp32", precision="ieee", seq_len=8)
    m = run("attention", tmp_path, impl="flash_triton", device="cpu", dtype="fp32", precision="tf32x3",
            batch=1, heads=2, seq_len=33, d_head=16, repeats=1, warmup=0)
    assert m["precision"] == "tf32x3" and m["out_rel_err"] < 1e-4


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


def _profiled_allreduce(rank, world):
    """Rank body: three 8 MB all-reduces, each bracketed by the host clock, under the profiler."""
    import time

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from worker.profiling import step_breakdown

    x = torch.ones(2 * 2**20)
    walls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            walls.append((time.perf_counter() - t0) * 1e3)
    return step_breakdown(prof, steps=3, on_gpu=False), sum(walls) / 3


def test_collective_time_of_a_known_all_reduce_lies_within_the_call():
    """The profiler's time for an all-reduce is part of the host's bracket around the same call:
    positive, no longer than the call, and most of it (the rest is Python around the collective)."""
    from parallel.launch import launch

    for breakdown, wall_ms in launch(_profiled_allreduce, 2, device="cpu"):
        assert set(breakdown["comm_by_kind_ms"]) == {"all_reduce"}
        assert 0.3 * wall_ms <= breakdown["comm_ms"] <= wall_ms * 1.05


LEADERBOARD_TOY = dict(world_size=2, scale=1 / 34, d_model=64, d_ff=128, num_heads=4, vocab_size=256, device="cpu",
                       attention="sdpa", steps=2, warmup=1, loss_chunk=300)  # context 964: 4 chunks, one ragged


def test_leaderboard_params_scale_the_course_model_and_refuse_what_cannot_run():
    from worker.suites.leaderboard import COURSE

    assert validate_cell("leaderboard", {}).dims() == COURSE  # scale 1: the course's model, unchanged
    toy = validate_cell("leaderboard", {"scale": 2 / 34, "d_model": 64, "num_heads": 4}).dims()
    assert toy["num_layers"] == 2 and toy["context_length"] == round(32768 * 2 / 34) and toy["d_ff"] == 11008
    with pytest.raises(ValidationError, match="optimizer=course"):
        validate_cell("leaderboard", {"state_dtype": "bf16", "optimizer": "torch_fused"})
    with pytest.raises(ValidationError, match="divisible"):
        validate_cell("leaderboard", {"d_model": 100})
    with pytest.raises(ValidationError, match="scale"):
        validate_cell("leaderboard", {"scale": 0})


def test_leaderboard_step_at_toy_scale_shards_what_each_recipe_says(tmp_path):
    # 2 ranks with gloo: the same step under each sharding; memory per rank shows what is sharded
    cells = {s: run("leaderboard", tmp_path, sharding=s, **LEADERBOARD_TOY) for s in ("none", "zero1", "fsdp")}
    params = cells["none"]["params"]
    for name, m in cells.items():
        assert m["samples"] == 2 and len(m["rank_samples_ms"]) == 2, name
        assert m["samples_ms"] == [max(a, b) for a, b in zip(*m["rank_samples_ms"], strict=True)], name
        assert 0 < m["forward_ms"] < m["median_ms"] and 0 < m["backward_ms"] < m["median_ms"], name
        assert m["first_step_s"] > 0 and m["tokens_per_s"] > 0 and m["comm_ms"] > 0, name
        assert m["model"]["num_layers"] == 1 and m["model"]["context_length"] == round(32768 / 34), name
    replica, zero1, fsdp = (cells[s]["memory_by_rank"][0] for s in ("none", "zero1", "fsdp"))
    assert replica["params"] == params * 4 and replica["optimizer_state"] >= 2 * params * 4
    assert zero1["params"] == params * 4 and zero1["optimizer_state"] < 0.75 * replica["optimizer_state"]
    assert fsdp["params"] < 0.6 * params * 4 and fsdp["optimizer_state"] < 0.6 * replica["optimizer_state"]
    assert "all_gather" in cells["fsdp"]["comm_by_kind_ms"] and "broadcast" in cells["zero1"]["comm_by_kind_ms"]


def test_leaderboard_bf16_state_halves_the_optimizer_state(tmp_path):
    fp32 = run("leaderboard", tmp_path, sharding="none", **LEADERBOARD_TOY)
    bf16 = run("leaderboard", tmp_path, sharding="none", state_dtype="bf16", **LEADERBOARD_TOY)
    a, b = fp32["memory_by_rank"][0]["optimizer_state"], bf16["memory_by_rank"][0]["optimizer_state"]
    assert b == pytest.approx(a / 2, rel=0.01)


def test_leaderboard_bf16_weights_with_offloaded_masters_run_under_zero1(tmp_path):
    m = run("leaderboard", tmp_path, sharding="zero1", param_dtype="bf16", offload=True, **LEADERBOARD_TOY)
    mem = m["memory_by_rank"][0]
    assert mem["params"] == m["params"] * 2  # the model holds bf16 weights
    assert m["samples"] == 2 and m["optimizer_ms"] > 0
