"""Reading the PyTorch profiler, in one place: the model suite and the tuning tools use it.

- `op_times_ms(prof, steps, on_gpu)`: time per step of each kernel (GPU: the device-side kernel
  events, self time) or each op (CPU: self CPU time, so nothing is counted twice);
- `step_breakdown(prof, steps, on_gpu)`: per step, the time of the collectives by kind (GPU: the
  NCCL kernels' device time; CPU: gloo's collectives, which run on gloo's own threads) and, on GPU,
  the time at least one kernel was running (the union of kernel intervals: "GPU busy");
- `kernel_category(name)`: matmul / attention / softmax / optimizer / communication / elementwise;
- `chrome_trace(prof, keep)`: the Chrome trace as a dict, optionally kept as a file.
"""
from __future__ import annotations

import json
from pathlib import Path


def op_times_ms(prof, steps: int, on_gpu: bool) -> dict[str, dict]:
    """{name: {"ms_per_step", "calls_per_step"}} of every kernel (GPU) or op (CPU) with time."""
    out: dict[str, dict] = {}
    for evt in prof.key_averages():
        if getattr(evt, "is_user_annotation", False):
            continue  # a named range (record_function, Optimizer.step#...): its kernels are counted already
        if on_gpu:
            if str(getattr(evt, "device_type", "")).split(".")[-1] != "CUDA":
                continue  # host-side ops: their kernels are counted as device events
            us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
        else:
            us = evt.self_cpu_time_total
        if not us or not evt.key or evt.key.startswith("ProfilerStep"):
            continue
        row = out.setdefault(evt.key, {"ms_per_step": 0.0, "calls_per_step": 0})
        row["ms_per_step"] += us / 1000 / steps
        row["calls_per_step"] += evt.count // steps
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms_per_step"]))


KERNEL_CATEGORIES = (
    ("communication", ("nccl", "allreduce", "all_reduce", "allgather", "reduce_scatter")),
    ("attention", ("flash", "attn", "_fwd_kernel", "_bwd_", "fmha", "sdpa", "cudnn")),
    ("matmul", ("gemm", "matmul", "sm90_xmma", "cutlass", "nvjet", "wgmma", "::mm", "bmm", "addmm", "linear")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "fused_adam", "_amp_")),
    ("softmax", ("softmax", "logsumexp")),
)


def kernel_category(name: str) -> str:
    """Bucket a CUDA kernel name into matmul / attention / softmax / optimizer / communication / elementwise."""
    low = name.lower()
    for category, needles in KERNEL_CATEGORIES:
        if any(n in low for n in needles):
            return category
    return "elementwise"


NCCL_KINDS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "SendRecv", "Reduce")


def collective_kind(name: str, on_gpu: bool) -> str | None:
    """'AllReduce' for an NCCL kernel such as ncclDevKernel_AllReduce_Sum_bf16_RING_LL, 'all_reduce' for
    gloo's gloo:all_reduce; None for anything that is not a collective (barriers included). An NCCL
    kernel whose name says no kind (ncclDevKernel_Generic_1, say) is named by its kernel."""
    if on_gpu:
        if "nccl" not in name.lower():
            return None
        return next((k for k in NCCL_KINDS if k.lower() in name.lower()), name.split("(")[0])
    if name.startswith("gloo:") and name != "gloo:barrier":
        return name.split(":", 1)[1]
    return None


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def step_breakdown(prof, steps: int, on_gpu: bool) -> dict:
    """{"comm_ms", "comm_by_kind_ms": {kind: ms}, "busy_ms", "exposed_comm_ms"}, per step.

    busy_ms: time any kernel ran; exposed_comm_ms: time only collectives ran (no compute kernel
    beside them), i.e. busy time minus compute-kernel time, both as unions of intervals. Both are
    None on CPU, where gloo's collectives run on host threads.
    """
    by_kind: dict[str, float] = {}
    kernels: list[tuple[float, float]] = []
    compute: list[tuple[float, float]] = []
    for evt in prof.events():
        on_device = str(getattr(evt, "device_type", "")).split(".")[-1] == "CUDA"
        if on_gpu != on_device:
            continue
        if on_device and getattr(evt, "is_user_annotation", False):
            continue  # a range drawn on the GPU timeline (nccl:_all_gather_base, say) over kernels counted already
        kind = collective_kind(evt.name, on_gpu)
        if on_device:
            kernels.append((evt.time_range.start, evt.time_range.end))
            if kind is None:
                compute.append((evt.time_range.start, evt.time_range.end))
        if kind is not None:
            by_kind[kind] = by_kind.get(kind, 0.0) + evt.time_range.elapsed_us() / 1000 / steps
    busy = _union_us(kernels) / 1000 / steps if on_gpu else None
    return {"comm_ms": sum(by_kind.values()), "comm_by_kind_ms": dict(sorted(by_kind.items())), "busy_ms": busy,
            "exposed_comm_ms": busy - _union_us(compute) / 1000 / steps if on_gpu else None}


def chrome_trace(prof, keep: Path | None = None) -> dict:
    """The profiler's Chrome trace as a dict; also written to `keep` if given."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = keep or Path(tmp) / "trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())
