"""The host-time benchmark's sampling and summary (its numbers need a GPU), and its --parts run end to end
under the interpreter, which checks the script."""
import json
import math
import os
import threading

from benchmarks.flash_host_time import handed_off_us, host_summary, interleaved_samples, on_cpu, pinning


def test_samples_are_taken_in_turns_with_a_rotating_first():
    order = []

    def timer(fn, calls):
        order.append(fn)
        return float(calls)

    got = interleaved_samples({"a": "A", "b": "B", "c": "C"}, samples=4, calls=7, timer=timer)
    assert "".join(order) == "ABC" "BCA" "CAB" "ABC"
    assert got == {"a": [7.0] * 4, "b": [7.0] * 4, "c": [7.0] * 4}


def test_a_burst_falls_on_every_implementation_alike():
    # the host is slow for the 4th to 6th timings of the run: with turns, each implementation gets one
    clock = iter(range(100))

    def timer(fn, calls):
        return 300.0 if 3 <= next(clock) < 6 else (100.0 if fn == "A" else 200.0)

    got = interleaved_samples({"a": "A", "b": "B", "c": "C"}, samples=5, calls=1, timer=timer)
    assert [xs.count(300.0) for xs in got.values()] == [1, 1, 1]


def test_summary_drops_nan_samples_and_reports_the_ratio_to_the_reference():
    samples = {"sdpa_flash": [100.0, 110.0, 90.0, 105.0, 95.0],
               "flash_triton": [150.0, 165.0, float("nan"), 135.0, 157.5, 142.5]}
    out = host_summary(samples, "sdpa_flash")
    assert out["flash_triton"]["kept"] == 5 and out["sdpa_flash"]["kept"] == 5
    assert out["sdpa_flash"]["median"] == 100.0 and "vs_sdpa_flash" not in out["sdpa_flash"]
    vs = out["flash_triton"]["vs_sdpa_flash"]
    assert math.isclose(vs["ratio"], 1.5) and vs["low"] <= 1.5 <= vs["high"]
    assert out["flash_triton"]["p10"] < out["flash_triton"]["median"]


def test_an_implementation_with_no_kept_samples_has_no_ratio():
    out = host_summary({"sdpa_flash": [100.0, 101.0], "flash_triton": [float("nan")]}, "sdpa_flash")
    assert out["flash_triton"]["kept"] == 0 and math.isnan(out["flash_triton"]["median"])
    assert "vs_sdpa_flash" not in out["flash_triton"]


def test_leaderboard_inputs_name_a_bad_form_before_touching_the_gpu():
    import pytest

    from benchmarks.flash_host_time import leaderboard_inputs

    with pytest.raises(ValueError, match="'stacked'"):
        leaderboard_inputs("stacked")


def test_the_profile_sets_only_the_l2_flush_apart():
    from worker.harness import L2Flusher

    _is_flush = L2Flusher.is_flush_kernel

    assert _is_flush("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, "
                     "std::array<char*, 1ul> >(int, at::native::FillFunctor<int>, std::array<char*, 1ul>)")
    # a step's own fills and int-typed kernels stay in the list
    bf16_fill = "at::native::FillFunctor<c10::BFloat16>"
    assert not _is_flush(f"void at::native::vectorized_elementwise_kernel<4, {bf16_fill}, std::array<char*, 1ul> >"
                         f"(int, {bf16_fill}, std::array<char*, 1ul>)")
    assert not _is_flush("_bwd_dq_kernel")


def test_a_leaderboard_variant_names_its_pins_and_options_and_rejects_a_bad_one():
    import argparse

    import pytest

    from benchmarks.flash_host_time import parse_leaderboard_variant

    assert parse_leaderboard_variant("big:fwd=256,64,8,3+dkdv=32,128,8,3,128") == (
        "big", {"pinned": {"fwd": (256, 64, 8, 3), "dkdv": (32, 128, 8, 3, 128)}})
    assert parse_leaderboard_variant("g:head_group=16+bwd_head_group=1+dq=128,64,4,3") == (
        "g", {"pinned": {"dq": (128, 64, 4, 3)}, "head_group": 16, "bwd_head_group": 1})
    for bad in ("big", "big:", "sdpa_x:fwd=128,64,4,3", "flash_triton_eager:fwd=128,64,4,3",
                "big:fwd=128,64", "big:attn=128,64,4,3", "g:head_group=0", "g:bwd_head_group=x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_leaderboard_variant(bad)


def test_duplicate_leaderboard_variant_names_stop_before_any_gpu_work(capsys):
    import pytest

    from benchmarks.flash_host_time import main

    with pytest.raises(SystemExit):
        main(["--out", "/nonexistent/x.json", "--leaderboard-only",
              "--leaderboard-variant", "a:fwd=128,64,4,3", "--leaderboard-variant", "a:dq=128,64,4,3"])
    assert "must differ" in capsys.readouterr().err


def test_a_bad_parts_shape_stops_before_any_gpu_work(capsys):
    import pytest

    from benchmarks.flash_host_time import main

    with pytest.raises(SystemExit):
        main(["--out", "/nonexistent/x.json", "--parts", "--parts-shape", "8,16,0,64"])
    assert "--parts-shape" in capsys.readouterr().err


def test_a_handoff_runs_each_call_on_the_worker_after_the_callers_work_and_times_it_there():
    events = []
    main = threading.get_ident()

    def between():
        events.append(("between", threading.get_ident() == main))

    def call():
        events.append(("call", threading.get_ident() == main))

    times = handed_off_us(call, between, 3)
    assert events == [("between", True), ("call", False)] * 3
    assert len(times) == 3 and all(t >= 0 for t in times)


def test_a_handoff_on_one_cpu_keeps_both_threads_there_and_gives_the_caller_its_cpus_back():
    before = os.sched_getaffinity(0)
    cpu = min(before)
    seen = []

    def where():
        seen.append(os.sched_getaffinity(0))

    handed_off_us(where, where, 2, cpu=cpu)
    assert seen == [{cpu}] * 4
    assert os.sched_getaffinity(0) == before


def test_on_cpu_and_pinning_move_only_the_calling_thread():
    before = os.sched_getaffinity(0)
    cpu = max(before)
    with on_cpu(cpu):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before

    seen = []
    thread = threading.Thread(target=pinning(lambda: seen.append(os.sched_getaffinity(0)), cpu))
    thread.start()
    thread.join()
    assert seen == [{cpu}] and os.sched_getaffinity(0) == before
    with on_cpu(None):
        assert os.sched_getaffinity(0) == before


def test_parts_runs_every_piece_and_question_on_the_interpreter_and_leaves_the_launcher_as_it_was(tmp_path):
    from benchmarks.flash_host_time import main
    from kernels import flash_triton as ft

    launcher, affinity = ft.flash_attention_backward, os.sched_getaffinity(0)
    out = tmp_path / "new" / "parts.json"  # a folder that does not exist yet
    assert main(["--parts", "--parts-shape", "1,2,16,16,causal", "--rounds", "2", "--calls", "1",
                 "--out", str(out), "--commit", "abc"]) == 0
    report = json.loads(out.read_text())
    assert report["kind"] == "flash_host_parts" and report["git_commit"] == "abc"
    assert report["shape"] == [1, 2, 16, 16] and report["causal"] is True
    us = report["us"]
    for name in ("forward_launcher", "backward_launcher", "fwd_bwd", "sdpa_fwd_bwd", "fwd_bwd_same_cpu",
                 "sdpa_fwd_bwd_given_grad_same_cpu"):
        assert len(us[name]) == 2 and all(t > 0 for t in us[name]), name  # one sample a round
    # the launcher timed where the engine calls it: once per fwd_bwd call; on a thread and handed off: the
    # first (cold) call left out; on one CPU: the call that moved the engine's thread left out
    assert len(us["backward_launcher_inside_engine"]) == 2
    for name in ("backward_launcher_on_a_thread", "backward_launcher_handed_off",
                 "backward_launcher_handed_off_same_cpu"):
        assert len(us[name]) == 1, name
    # on one CPU the launcher runs for fwd_bwd and fwd_bwd_given_grad, once a round each
    assert len(us["backward_launcher_inside_engine_same_cpu"]) == 2 * 2
    assert set(report["median_us"]) == set(us)
    for profile in ("parts.prof.txt", "parts.copied.prof.txt"):
        assert "function calls" in (out.parent / profile).read_text()
    assert ft.flash_attention_backward is launcher and os.sched_getaffinity(0) == affinity
