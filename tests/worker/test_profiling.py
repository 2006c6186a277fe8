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


class _Range:
    def __init__(self, start, end):
        self.start, self.end = start, end

    def elapsed_us(self):
        return self.end - self.start


class _Evt:
    def __init__(self, name, start, end, device="CUDA", annotation=False):
        self.name, self.time_range = name, _Range(start, end)
        self.device_type = f"DeviceType.{device}"
        self.is_user_annotation = annotation


class _Prof:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_step_breakdown_counts_nccl_kernels_by_kind_and_the_union_of_kernel_time():
    from worker.profiling import step_breakdown

    prof = _Prof([
        _Evt("ampere_bf16_gemm", 0, 1000),
        _Evt("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 500, 1500),  # overlaps the gemm: busy once
        _Evt("nccl:all_reduce", 500, 1500, annotation=True),  # a GPU-timeline range over it: not counted
        _Evt("ncclDevKernel_Generic_1(y)", 3000, 3200),
        _Evt("aten::mm", 0, 5000, device="CPU"),  # host side: not a kernel
    ])
    b = step_breakdown(prof, steps=2, on_gpu=True)
    assert b["comm_by_kind_ms"] == {"AllReduce": 0.5, "ncclDevKernel_Generic_1": 0.1}
    assert b["comm_ms"] == 0.6
    assert b["busy_ms"] == (1500 + 200) / 1000 / 2
    # only collectives ran in [1000, 1500) and [3000, 3200): the exposed communication
    assert b["exposed_comm_ms"] == (500 + 200) / 1000 / 2


def test_step_breakdown_on_cpu_reads_gloo_collectives_and_skips_barriers():
    from worker.profiling import step_breakdown

    prof = _Prof([_Evt("gloo:all_reduce", 0, 4000, device="CPU", annotation=True),
                  _Evt("gloo:barrier", 0, 9000, device="CPU", annotation=True)])
    assert step_breakdown(prof, steps=1, on_gpu=False) == {"comm_ms": 4.0, "comm_by_kind_ms": {"all_reduce": 4.0},
                                                           "busy_ms": None, "exposed_comm_ms": None}
