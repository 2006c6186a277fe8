"""The `noop` suite: a job that does (almost) nothing, to measure the queue's own overhead.

`mode` also provokes each way a job can end, for tests and for checking a deployment:
`raise` (the cell raises: `failed`), `crash` (the runner process dies: `failed`), `hang`
(sleeps past any timeout: `timeout`), `oom` (raises an out-of-memory error: `oom`),
`skip` (unsupported configuration: `skipped`).
"""
from __future__ import annotations

import os
import time
from typing import Literal

from pydantic import Field

from worker.suites.common import SuiteParams

DESCRIPTION = "Does nothing (or fails on purpose): measures scheduling overhead and exercises failure handling"


class Params(SuiteParams):
    x: int = Field(0, description="any integer; a grid axis to make many cells")
    sleep_ms: float = Field(0.0, ge=0, le=3_600_000)
    mode: Literal["ok", "raise", "crash", "hang", "oom", "skip"] = "ok"


def run(p: Params, ctx) -> dict:
    if p.sleep_ms:
        time.sleep(p.sleep_ms / 1000)
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
    return {"x": p.x, "value": float(p.x) * 2}
