"""worker/profiling.py on real CPU profiles."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from worker.profiling import chrome_trace, op_times_ms


def profiled(steps: int = 3):
    a, b = torch.ones(128, 128), torch.ones(128, 128)
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # a profile can be exported once
        for _ in range(steps):
            with record_function("step#range"):
                (a @ b).relu_()
    return prof


def test_chrome_trace_reads_back_the_profile_and_keeps_it_when_asked(tmp_path):
    trace = chrome_trace(profiled())
    assert any("mm" in e.get("name", "") for e in trace["traceEvents"])
    kept = tmp_path / "sub" / "t.json"
    assert chrome_trace(profiled(), keep=kept)["traceEvents"] and kept.is_file()


def test_op_times_are_per_step_self_times_sorted_slowest_first():
    times = op_times_ms(profiled(steps=3), steps=3, on_gpu=False)
    assert "aten::mm" in times and "aten::relu_" in times
    assert "step#range" not in times  # a named range is not an op of its own
    assert times["aten::mm"]["calls_per_step"] == 1 and times["aten::relu_"]["calls_per_step"] == 1
    ms = [t["ms_per_step"] for t in times.values()]
    assert ms == sorted(ms, reverse=True) and all(x > 0 for x in ms)
    # self times: the matmul op's own time, not counted again under a parent op
    assert "aten::matmul" not in times or times["aten::matmul"]["ms_per_step"] < times["aten::mm"]["ms_per_step"]
    assert op_times_ms(profiled(steps=3), steps=3, on_gpu=True) == {}  # no device events on a CPU profile
