"""The `noop` suite: a job that does (almost) nothing, to measure the queue's own overhead.

`mode` also provokes each way a job can end, for tests and for checking a deployment:
`raise` (the cell raises: `failed`), `crash` (the runner process dies: `failed`), `hang`
(sleeps past any timeout: `timeout`), `oom` (raises an out-of-memory error: `oom`),
`skip` (unsupported configuration: `skipped`).

With `work_ms` > 0 it is also a timed suite that needs no GPU: each of `repeats` timed iterations
(after `warmup` untimed ones) sleeps `work_ms`, spread by a relative `noise` drawn from a normal
distribution seeded by `seed`, and the cell reports the measured samples and their summary like the
real suites do. So a slowdown of known size can be produced on any machine (comparisons, CI gating).

With `gpus` > 0 the cell asks for that many GPUs (worker/placement.py routes and leases them) and
reports the CUDA_VISIBLE_DEVICES it ran with and when: placement can be checked without a GPU.

With `hold_mb` it fills that much host memory before its sleep and holds it until the cell ends:
a runner's memory limit (BENCHLAB_RUNNER_MEMORY_GB) can be checked without a large cell.

With `artifact` it first writes `noop.json` (its params and the time) as an artifact, whatever its
mode: where a deployment's artifacts go, and a retried job's, can be checked without a GPU.
"""
from __future__ import annotations

import json
import os
import time
from typing import Literal

from pydantic import Field

from worker.suites.common import Samples, SuiteParams

DESCRIPTION = "Does nothing (or fails on purpose): measures scheduling overhead and exercises failure handling"


class Params(SuiteParams):
    x: int = Field(0, description="any integer; a grid axis to make many cells")
    sleep_ms: float = Field(0.0, ge=0, le=3_600_000)
    mode: Literal["ok", "raise", "crash", "hang", "oom", "skip"] = "ok"
    work_ms: float = Field(0.0, ge=0, le=60_000, description="duration of each timed iteration (0: no timing)")
    noise: float = Field(0.0, ge=0, le=1, description="relative spread of that duration (normal, seeded)")
    seed: int = Field(0, description="seeds the noise")
    repeats: Samples = Field(10, description="timed iterations, with work_ms")
    warmup: int = Field(0, ge=0, le=1_000, description="untimed iterations first, with work_ms")
    gpus: int = Field(0, ge=0, le=64, description="GPUs the cell asks for (placement checks)")
    artifact: bool = Field(False, description="write noop.json as an artifact first (artifact checks)")
    hold_mb: int = Field(0, ge=0, le=1_048_576, description="host memory (MiB) filled and held through sleep_ms "
                                                            "(memory-limit checks)")


def timed_work(p: Params) -> dict:
    """The `work_ms` iterations: the planned durations come from the seeded noise, the samples are
    what the clock measured around each sleep."""
    import random

    from worker.harness import Timing

    rng = random.Random(p.seed)
    planned = [max(0.0, p.work_ms * (1 + p.noise * rng.gauss(0, 1))) for _ in range(p.warmup + p.repeats)]
    samples = []
    for i, ms in enumerate(planned):
        t0 = time.perf_counter_ns()
        time.sleep(ms / 1000)
        if i >= p.warmup:
            samples.append((time.perf_counter_ns() - t0) / 1e6)
    return Timing.from_samples(samples).as_dict()


def run(p: Params, ctx) -> dict:
    started = time.time()
    if p.artifact:
        ctx.artifact("noop.json").write_text(json.dumps({"params": p.model_dump(), "at": started}))
    held = bytearray(b"\x01") * (p.hold_mb << 20)  # written, so every page is resident
    if p.sleep_ms:
        time.sleep(p.sleep_ms / 1000)
    del held
    if p.mode == "raise":
        raise ValueError(f"noop cell x={p.x} raised on purpose")
    if p.mode == "crash":
        os._exit(3)  # the runner dies without a word, as a segfaulting kernel would
    if p.mode == "hang":
        time.sleep(10**6)
    if p.mode == "oom":
        raise MemoryError("simulated out of memory in noop cell")
    if p.mode == "skip":
        from worker.harness import SkipCell

        raise SkipCell("noop asked to skip")
    timing = timed_work(p) if p.work_ms else {}
    placed = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "started_at": started,
              "ended_at": time.time()} if p.gpus else {}
    return {"x": p.x, "value": float(p.x) * 2, **timing, **placed}
