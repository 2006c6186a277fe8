"""The contract between benchlab's processes, in one torch-free module.

What crosses a process boundary is defined here and nowhere else:
- `JobPayload`: the body of a `benchlab.run_job` task (API -> worker, through the broker);
- the events on the `results` queue (worker -> recorder): `StateEvent`, `ProgressEvent`,
  `ResultEvent`, `HeartbeatEvent`, told apart by `type`; `parse_event` validates one;
- the rows of a `benchlab run --out` file: `RunHeader` then one `RunCell` per job;
- `JobState`, the states a job can be in, and the queue-name rule.

Every message carries `v`, the contract version. A receiver refuses a message from a newer
version instead of guessing (the recorder keeps it in its dead-letter store, see
docs/architecture.md). Non-finite metric values (NaN, inf) are not JSON: `clean_metrics` turns
them into null and the event lists their names in `nonfinite`.
"""
from __future__ import annotations

import math
import re
import time
from enum import StrEnum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

CONTRACT_VERSION = 1


class JobState(StrEnum):
    queued = "queued"
    running = "running"
    done = "done"
    skipped = "skipped"  # unsupported configuration, with the reason
    failed = "failed"
    oom = "oom"
    timeout = "timeout"
    cancelled = "cancelled"


JOB_STATES = tuple(s.value for s in JobState)
FINAL_STATES = ("done", "skipped", "failed", "oom", "timeout", "cancelled")
RETRYABLE_STATES = ("failed", "oom", "timeout")
FAILED_STATES = RETRYABLE_STATES  # what makes `submit --wait` and `run` exit 1
UNFINISHED_STATES = ("queued", "running")  # a job in these has no result yet
UNFINISHED_STATUSES = ("queued", "running")  # sweep statuses that a wait keeps waiting through
FinalState = Literal["done", "skipped", "failed", "oom", "timeout", "cancelled"]

MAX_REPEATS = 100  # runs of each cell one sweep may ask for (the API, `benchlab run`, a run file)
MAX_INDEX = 2**63 - 1  # ids, cell and run indexes: what a 64-bit database integer holds

# Queue names: what Redis keys and the embedded broker's file names can hold. The results queue
# and Celery's own names are benchlab's: a sweep sent there would be read as worker messages.
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"
RESERVED_QUEUE_PREFIXES = ("celery", "benchlab.", "results", "unacked", "_kombu")


def reserved_queue(name: str) -> bool:
    low = name.lower()
    return any(low == p.rstrip(".") or low.startswith(p) for p in RESERVED_QUEUE_PREFIXES)


def queue_problem(name: str) -> str | None:
    """Why `name` cannot be a job queue (a sweep's, or one a worker consumes), or None when it can. A worker
    on `results` would take the recorder's messages and drop them as unknown tasks."""
    if not re.fullmatch(QUEUE_PATTERN, name):
        return f"{name!r}: queue names are 1-100 letters, digits, '_', '.', '-', starting with a letter or digit"
    if reserved_queue(name):
        return f"queue {name!r} is reserved for benchlab's own messages"
    return None


def clean_metrics(metrics: Any, prefix: str = "") -> tuple[Any, list[str]]:
    """Replace NaN and +-inf (anywhere in nested dicts and lists) with None; return the names replaced."""
    if isinstance(metrics, float) and not math.isfinite(metrics):
        return None, [prefix or "value"]
    if isinstance(metrics, dict):
        out, bad = {}, []
        for k, v in metrics.items():
            out[k], b = clean_metrics(v, f"{prefix}.{k}" if prefix else str(k))
            bad += b
        return out, bad
    if isinstance(metrics, list):
        out, bad = [], []
        for i, v in enumerate(metrics):
            c, b = clean_metrics(v, f"{prefix}[{i}]")
            out.append(c)
            bad += b
        return out, bad
    return metrics, []


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    v: int = Field(CONTRACT_VERSION, ge=1)

    @model_validator(mode="after")
    def _known_version(self):
        if self.v > CONTRACT_VERSION:
            raise ValueError(f"contract version {self.v} is newer than this process's {CONTRACT_VERSION}")
        return self


class JobPayload(_Message):
    """One job (a grid cell and repeat) as the worker receives it."""

    job_id: int = Field(ge=1)
    sweep_id: int = Field(ge=1)
    sweep_uid: str = Field(pattern=r"^[A-Za-z0-9]{1,64}$")
    suite: str
    params: dict[str, Any]
    attempt: int = Field(1, ge=1)
    timeout_s: float | None = Field(None, gt=0)
    fresh: bool = False


class StateEvent(_Message):
    type: Literal["state"] = "state"
    job_id: int
    attempt: int = Field(1, ge=1)
    state: Literal["running"] = "running"
    worker: str | None = None
    at: float = Field(default_factory=time.time)


class ProgressEvent(_Message):
    type: Literal["progress"] = "progress"
    job_id: int
    attempt: int = Field(1, ge=1)
    message: str = Field(max_length=2000)
    at: float = Field(default_factory=time.time)


class ResultEvent(_Message):
    type: Literal["result"] = "result"
    job_id: int
    attempt: int = Field(1, ge=1)
    state: FinalState
    metrics: dict[str, Any] = Field(default_factory=dict)
    nonfinite: list[str] = Field(default_factory=list, description="metrics stored as null: NaN or inf")
    error: str | None = None
    env: dict[str, Any] | None = None
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    duration_s: float | None = None
    worker: str | None = None
    at: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _finite_metrics(self):
        self.metrics, bad = clean_metrics(self.metrics)
        self.nonfinite = sorted(set(self.nonfinite) | set(bad))
        if self.duration_s is not None and not math.isfinite(self.duration_s):
            self.duration_s = None
        return self


class RunningJob(BaseModel):
    job_id: int
    attempt: int = 1


class HeartbeatEvent(_Message):
    """A worker's sign of life, every `BENCHLAB_HEARTBEAT_S`: what it consumes and what it runs."""

    type: Literal["heartbeat"] = "heartbeat"
    worker: str
    hostname: str = ""
    pid: int = 0
    queues: list[str] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list)
    commit: str | None = None
    current: RunningJob | None = None
    stopping: bool = False
    at: float = Field(default_factory=time.time)


Event = Annotated[Union[StateEvent, ProgressEvent, ResultEvent, HeartbeatEvent], Field(discriminator="type")]
_EVENT = TypeAdapter(Event)


def parse_event(body: Any) -> StateEvent | ProgressEvent | ResultEvent | HeartbeatEvent:
    """Validate one message of the `results` queue; raises pydantic.ValidationError naming the field."""
    return _EVENT.validate_python(body)


# a sweep's params: one grid {name: value or [values]}, or a list of grids run as one sweep
GridParams = dict[str, Any] | list[dict[str, Any]]


class RunHeader(_Message):
    """First line of a `benchlab run --out` file."""

    kind: Literal["sweep"] = "sweep"
    suite: str
    params: GridParams = Field(default_factory=dict)
    name: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    repeats: int = Field(1, ge=1, le=MAX_REPEATS)
    env: dict[str, Any] | None = None
    created_at: float | None = None
    # the run's own id, written by `benchlab run`: importing the same file twice makes one sweep
    # (files written before it have none, and import as a new sweep each time)
    uid: str | None = Field(None, min_length=1, max_length=64)


class RunCell(_Message):
    """One job of a `benchlab run --out` file."""

    kind: Literal["cell"] = "cell"
    cell: int = Field(ge=0, le=MAX_INDEX)
    repeat: int = Field(0, ge=0, le=MAX_INDEX)
    params: dict[str, Any]
    state: FinalState
    metrics: dict[str, Any] = Field(default_factory=dict)
    nonfinite: list[str] = Field(default_factory=list)
    error: str | None = None
    env: dict[str, Any] | None = None
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    duration_s: float | None = None
    worker: str | None = None
    artifact_dir: str | None = Field(None, description="the cell's artifacts, relative to the run file's folder")
    started_at: float | None = None
    finished_at: float | None = None

    @model_validator(mode="after")
    def _finite_metrics(self):
        self.metrics, bad = clean_metrics(self.metrics)
        self.nonfinite = sorted(set(self.nonfinite) | set(bad))
        return self
