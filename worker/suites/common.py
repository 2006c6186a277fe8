"""Field types shared by the suites' parameter models (torch-free)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernels.names import DTYPES

Positive = Annotated[int, Field(gt=0)]
NonNegative = Annotated[int, Field(ge=0)]
# timed calls or steps of one run, and untimed ones before them: enough for any interval, while a run's
# raw samples (kept in its result row, resampled by every comparison) stay a few hundred KB
MAX_SAMPLES = 10_000
Samples = Annotated[int, Field(gt=0, le=MAX_SAMPLES)]
Untimed = Annotated[int, Field(ge=0, le=MAX_SAMPLES)]
# ranks of a multi-rank cell, all on the worker's host (one process each): more GPUs than a host has;
# on CPU a host takes at most one rank per core (worker.harness.resolve_rank_device)
MAX_WORLD_SIZE = 64
WorldSize = Annotated[int, Field(gt=0, le=MAX_WORLD_SIZE, description="ranks, one process each, on one host")]
Dtype = Literal[tuple(DTYPES)]
Device = Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto: cuda when present, else cpu")]


class SuiteParams(BaseModel):
    """Base of every suite's params: unknown names are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

