"""Where one flash forward+backward spends its wall time: a GPU timeline of the timed loop.

The timed loop is the harness's (L2 flush, start event, fwd+bwd, end event). Under the PyTorch
profiler this records every GPU kernel and every CUDA runtime call of a few iterations, then
reports per iteration: each kernel's start (from the end of the flush) and duration, the idle
time between kernels, and which runtime calls the host made (a synchronising call, a cudaMalloc
or a slow launch shows up there). It also times the same loop replayed from a CUDA graph, which
has no launch gaps, so the difference bounds what launch overhead costs. `--sustained N` times N
iterations with events and the profiler at once while sampling the SM clock: if event time equals
the kernels' span, the time is in slower kernels (the chip clocks down under load), not in gaps.

    python -m benchmarks.flash_timeline --out flash_timeline.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from worker.profiling import chrome_trace


def _short(name: str) -> str:
    """A kernel's name without its argument list, at most 100 characters (enough to tell ATen's
    elementwise kernels apart by functor)."""
    return name.split("(")[0][:100]


def _fill_or_memset(event: dict) -> bool:
    """The flash loop's flush: its only fill kernel (256 MiB) or memset."""
    return "fill" in event["name"].lower() or event.get("cat") == "gpu_memset"


def timeline(trace: dict, iters: int, is_flush=_fill_or_memset) -> dict:
    """Split a Chrome trace of `iters` timed iterations at the flush kernels (`is_flush(event)`) and
    measure each one: span from the flush's end to the last kernel's end, kernel time, idle time."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                 key=lambda e: e["ts"])
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver"]
    # everything between two flushes is one iteration
    flush_idx = [i for i, e in enumerate(gpu) if is_flush(e)]
    rows = []
    for a, b in zip(flush_idx, flush_idx[1:] + [len(gpu)], strict=True):
        flush = gpu[a]
        t0 = flush["ts"] + flush["dur"]
        kernels, busy, prev_end = [], 0.0, t0
        idle = 0.0
        for e in gpu[a + 1:b]:
            idle += max(0.0, e["ts"] - prev_end)
            kernels.append({"name": _short(e["name"]), "start_us": round(e["ts"] - t0, 1),
                            "dur_us": round(e["dur"], 1)})
            busy += e["dur"]
            prev_end = max(prev_end, e["ts"] + e["dur"])
        rows.append({"span_us": round(prev_end - t0, 1), "kernel_us": round(busy, 1), "idle_us": round(idle, 1),
                     "kernels": kernels})
    calls: dict[str, list[float]] = {}
    for e in runtime:
        calls.setdefault(e["name"], []).append(e["dur"])
    return {"iterations": rows[-iters:],
            "runtime_calls": {k: {"count": len(v), "total_us": round(sum(v), 1), "max_us": round(max(v), 1)}
                              for k, v in sorted(calls.items(), key=lambda kv: -sum(kv[1]))}}


SMI_FIELDS = ("clocks.sm", "power.draw")
# what slows a chip whose clock reading has not moved: the instant power (power.draw averages over a
# second on Hopper) and nvidia-smi's bitmask of the active clock-event reasons
SMI_EXTRA_FIELDS = ("power.draw.instant", "clocks_event_reasons.active")
REASON_BITS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80}


def parse_smi(lines: list[str], fields: tuple[str, ...]) -> list[dict[str, float | int]]:
    """nvidia-smi's `--format=csv,noheader,nounits` lines as {field: value} rows; bitmask fields (hex)
    become ints, the rest floats; a line that does not parse whole (a header, "[N/A]") is skipped."""
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        try:
            rows.append({f: int(v, 16) if v.lower().startswith("0x") else float(v) for f, v in zip(fields, parts,
                                                                                                 strict=True)})
        except ValueError:
            continue
    return rows


def chip_summary(rows: list[dict]) -> dict:
    """Medians of the sampled clock and power, and the share of samples in which each clock-event reason of
    REASON_BITS was active (where sampled)."""
    import statistics

    out: dict = {"samples": len(rows)}
    for field in ("clocks.sm", "power.draw", "power.draw.instant"):
        xs = [r[field] for r in rows if field in r]
        out[field] = statistics.median(xs) if xs else None
    masks = [r["clocks_event_reasons.active"] for r in rows if "clocks_event_reasons.active" in r]
    for name, bit in REASON_BITS.items():
        out[f"{name}_share"] = sum(1 for m in masks if m & bit) / len(masks) if masks else None
    return out


def _smi_answers(fields: tuple[str, ...], device: int) -> bool:
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                               "-i", str(device)], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class SmiSampler:
    """nvidia-smi sampling one GPU's SM clock (MHz) and power draw (W) every `period_ms` from creation
    until stop(), which returns the two lists (empty where nvidia-smi is missing). With `extra`, also the
    instant power and the clock-event reasons (SMI_EXTRA_FIELDS) where this driver knows them; `rows`
    then holds every sample, and chip_summary(rows) sums them up."""

    _extra_known: dict[int, bool] = {}  # device -> whether its nvidia-smi answers SMI_EXTRA_FIELDS

    def __init__(self, device: int, period_ms: int = 50, extra: bool = False):
        import subprocess
        import tempfile

        if extra and device not in SmiSampler._extra_known:
            SmiSampler._extra_known[device] = _smi_answers(SMI_FIELDS + SMI_EXTRA_FIELDS, device)
        self.fields = SMI_FIELDS + (SMI_EXTRA_FIELDS if extra and SmiSampler._extra_known[device] else ())
        self.rows: list[dict] = []
        self.file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        try:
            self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(self.fields)}",
                                          "--format=csv,noheader,nounits", "-lms", str(period_ms),
                                          "-i", str(device)], stdout=self.file)
        except OSError:
            self.proc = None

    def stop(self) -> tuple[list[float], list[float]]:
        import os

        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        self.file.close()
        with open(self.file.name) as f:
            self.rows = parse_smi(f.read().splitlines(), self.fields)
        os.unlink(self.file.name)
        return [r["clocks.sm"] for r in self.rows], [r["power.draw"] for r in self.rows]


def sustained(fwd_bwd, clear, flush, iters: int) -> dict:
    """Events and profiler on the same `iters` iterations, with the SM clock sampled every 50 ms.

    Answers whether event time above the kernels' sum is idle GPU time (span > kernel time) or
    slower kernels (span == event time, kernel durations growing as the chip clocks down).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    sampler = SmiSampler(torch.cuda.current_device())
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for start, end in pairs:
            clear()
            flush()
            start.record()
            fwd_bwd()
            end.record()
        torch.cuda.synchronize()
    clocks, power = sampler.stop()
    rows = timeline(chrome_trace(prof), iters)["iterations"]
    event_ms = [s.elapsed_time(e) for s, e in pairs]
    names = sorted({k["name"] for r in rows for k in r["kernels"]})
    durs = {n: [k["dur_us"] for r in rows for k in r["kernels"] if k["name"] == n] for n in names}

    def mid(xs):
        return sorted(xs)[len(xs) // 2] if xs else None

    head, tail = slice(0, 10), slice(-10, None)
    return {"iters": iters,
            "event_ms": {"median": mid(event_ms), "first10": mid(event_ms[head]), "last10": mid(event_ms[tail])},
            "span_ms": {"median": mid([r["span_us"] / 1e3 for r in rows]),
                        "first10": mid([r["span_us"] / 1e3 for r in rows[head]]),
                        "last10": mid([r["span_us"] / 1e3 for r in rows[tail]])},
            "idle_us_median": mid([r["idle_us"] for r in rows]),
            "kernel_us_first10_last10": {n: [mid(d[head]), mid(d[tail])] for n, d in durs.items()},
            "sm_clock_mhz": {"samples": len(clocks), "min": min(clocks, default=None), "median": mid(clocks),
                             "max": max(clocks, default=None)},
            "power_w": {"median": mid(power), "max": max(power, default=None)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="16,16384,64")
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--trace", type=Path, default=None, help="also keep the raw Chrome trace here")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--sustained", type=int, default=0,
                    help="also run this many timed iterations under the profiler, events and sampled SM clocks")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernels import flash_triton as ft
    from kernels.flops import attention_flops
    from kernels.names import torch_dtype
    from worker.harness import L2Flusher, fingerprint, measure

    shape = tuple(int(x) for x in args.shape.split(","))
    dtype = torch_dtype(args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen).requires_grad_(True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)

    def fwd_bwd():
        ft.FlashAttentionTriton.apply(q, k, v, args.causal).backward(do)

    def clear():
        q.grad = k.grad = v.grad = None

    report = {"kind": "flash_timeline", **fingerprint(args.commit), "shape": list(shape), "causal": args.causal,
              "dtype": args.dtype}
    timed = measure(fwd_bwd, warmup=5, repeats=args.repeats, device="cuda", setup=clear)
    report["event_ms"] = {"median": timed.median_ms, "p20": timed.p20_ms, "p80": timed.p80_ms}

    flush = L2Flusher("cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            clear()
            flush()
            fwd_bwd()
        torch.cuda.synchronize()
    report["timeline"] = timeline(chrome_trace(prof, keep=args.trace), args.iters)

    # the same loop from a CUDA graph: no host in the way, so span - kernel time is launch-free
    try:
        clear()
        static_graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                clear()
                fwd_bwd()
        torch.cuda.current_stream().wait_stream(side)
        clear()
        with torch.cuda.graph(static_graph):
            fwd_bwd()
        graphed = measure(static_graph.replay, warmup=3, repeats=args.repeats, device="cuda")
        report["graph_replay_ms"] = {"median": graphed.median_ms, "p20": graphed.p20_ms, "p80": graphed.p80_ms}
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        report["graph_replay_error"] = str(exc).splitlines()[0][:300]

    if args.sustained:
        report["sustained"] = sustained(fwd_bwd, clear, flush, args.sustained)

    b = shape[0]
    h = shape[1] if len(shape) == 4 else 1
    flops = attention_flops(b, h, shape[-2], shape[-2], shape[-1], args.causal, "fwd_bwd")
    report["fwd_bwd_tflops"] = flops / (timed.median_ms * 1e-3) / 1e12
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    it = report["timeline"]["iterations"]
    print(json.dumps({"event_ms": report["event_ms"], "graph": report.get("graph_replay_ms"),
                      "sustained": report.get("sustained"),
                      "span_us": [r["span_us"] for r in it], "kernel_us": [r["kernel_us"] for r in it],
                      "idle_us": [r["idle_us"] for r in it]}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
