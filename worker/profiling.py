"""Reading the PyTorch profiler, in one place: the model suite and the tuning tools use it.

- `op_times_ms(prof, steps, on_gpu)`: time per step of each kernel (GPU: the device-side kernel
  events, self time) or each op (CPU: self CPU time, so nothing is counted twice);
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


def chrome_trace(prof, keep: Path | None = None) -> dict:
    """The profiler's Chrome trace as a dict; also written to `keep` if given."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = keep or Path(tmp) / "trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())
