"""Field types shared by the suites' parameter models (torch-free)."""
from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

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


def admits_bool(annotation: Any) -> bool:
    """True when a field of this type may hold True/False (bool itself, or a union or Literal with it)."""
    if annotation is bool:
        return True
    if typing.get_origin(annotation) is Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    return any(admits_bool(a) for a in typing.get_args(annotation))


class SuiteParams(BaseModel):
    """Base of every suite's params: unknown names are errors, not silently ignored, and true/false
    is refused where a number is meant (pydantic would read true as 1)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and not admits_bool(annotation):
            wanted = "a number" if annotation in (int, float) else "one of the allowed values"
            raise ValueError(f"{str(value).lower()} is not {wanted}")
        return value

