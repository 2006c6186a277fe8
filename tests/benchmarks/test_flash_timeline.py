"""The timeline parser splits a profiler trace at the L2 flushes and counts idle time between kernels."""
from benchmarks.flash_timeline import timeline


def _k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_iterations_split_at_flush_and_idle_is_counted():
    trace = {"traceEvents": [
        _k("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>", 0, 50),
        _k("_fwd_kernel", 60, 100),          # 10 us idle after the flush
        _k("_bwd_dq_kernel", 170, 5),        # 10 us idle
        _k("_bwd_dkdv_kernel", 175, 200),    # back to back
        _k("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>", 400, 50),
        _k("_fwd_kernel", 450, 100),         # no idle
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 4},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9, "dur": 6},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 9, "dur": 600},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 5},
    ]}
    out = timeline(trace, iters=5)
    first, second = out["iterations"]
    assert [k["name"] for k in first["kernels"]] == ["_fwd_kernel", "_bwd_dq_kernel", "_bwd_dkdv_kernel"]
    assert first["idle_us"] == 20.0 and first["kernel_us"] == 305.0 and first["span_us"] == 325.0
    assert first["kernels"][0]["start_us"] == 10.0
    assert second["idle_us"] == 0.0 and second["span_us"] == 100.0
    assert out["runtime_calls"]["cudaLaunchKernel"] == {"count": 2, "total_us": 10.0, "max_us": 6.0}
    assert list(out["runtime_calls"])[0] == "cudaDeviceSynchronize"  # biggest total first


def test_keeps_only_the_last_iterations():
    fill = "FillFunctor"
    trace = {"traceEvents": [e for i in range(4) for e in (_k(fill, i * 100, 10), _k("_fwd_kernel", i * 100 + 10, 50))]}
    out = timeline(trace, iters=2)
    assert len(out["iterations"]) == 2
    assert all(r["kernel_us"] == 50.0 for r in out["iterations"])


def test_a_step_with_fills_of_its_own_splits_only_at_the_given_flush():
    flush = "vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>"
    trace = {"traceEvents": [_k(flush, 0, 50), _k("fill_bf16", 60, 5), _k("_fwd_kernel", 70, 100),
                             _k(flush, 200, 50), _k("fill_bf16", 250, 5), _k("_fwd_kernel", 255, 100)]}
    out = timeline(trace, iters=5, is_flush=lambda e: "FillFunctor<int>" in e["name"])
    assert [[k["name"] for k in r["kernels"]] for r in out["iterations"]] == [["fill_bf16", "_fwd_kernel"]] * 2
    assert [r["span_us"] for r in out["iterations"]] == [120.0, 105.0]


def test_smi_lines_parse_into_rows_with_bitmasks_and_skip_what_does_not_parse():
    from benchmarks.flash_timeline import SMI_EXTRA_FIELDS, SMI_FIELDS, parse_smi

    fields = SMI_FIELDS + SMI_EXTRA_FIELDS
    rows = parse_smi(["1980, 120.5, 130.0, 0x0000000000000000", "clocks.sm, power.draw, x, y",
                      "1755, 690.1, [N/A], 0x0000000000000004", "1740, 699.0, 702.3, 0x000000000000000C", "1700, 1"],
                     fields)
    assert rows == [{"clocks.sm": 1980.0, "power.draw": 120.5, "power.draw.instant": 130.0,
                     "clocks_event_reasons.active": 0},
                    {"clocks.sm": 1740.0, "power.draw": 699.0, "power.draw.instant": 702.3,
                     "clocks_event_reasons.active": 12}]


def test_the_chip_summary_gives_medians_and_the_share_of_samples_under_each_reason():
    from benchmarks.flash_timeline import chip_summary

    rows = [{"clocks.sm": c, "power.draw": 600.0, "power.draw.instant": p, "clocks_event_reasons.active": m}
            for c, p, m in ((1980.0, 500.0, 0x0), (1800.0, 700.0, 0x4), (1750.0, 710.0, 0x4 | 0x8),
                            (1700.0, 720.0, 0x4))]
    out = chip_summary(rows)
    assert out["samples"] == 4 and out["clocks.sm"] == 1775.0 and out["power.draw.instant"] == 705.0
    assert out["sw_power_cap_share"] == 0.75 and out["hw_slowdown_share"] == 0.25 and out["sw_thermal_share"] == 0.0
    bare = chip_summary([{"clocks.sm": 1900.0, "power.draw": 300.0}])  # a driver without the extra fields
    assert bare["clocks.sm"] == 1900.0 and bare["power.draw.instant"] is None and bare["sw_power_cap_share"] is None
    assert chip_summary([])["samples"] == 0
