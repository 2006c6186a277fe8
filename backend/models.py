"""SQLModel tables and the API's request and response models.

Tables: sweeps, jobs (one per grid cell and repeat), results (one per attempt of a job),
environments (fingerprints, stored once), workers (the last heartbeat of each), dead letters
(results-queue messages the recorder could not apply). The schema is versioned by Alembic
(backend/migrations); a change to a table here needs a migration there.
"""
from __future__ import annotations

import re
import time
import uuid
from typing import Any

from pydantic import ValidationError, field_validator
from sqlalchemy import JSON, Column, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from worker.contract import (  # noqa: F401 (re-exported)
    FINAL_STATES,
    JOB_STATES,
    MAX_REPEATS,
    QUEUE_PATTERN,
    RETRYABLE_STATES,
    UNFINISHED_STATES,
    UNFINISHED_STATUSES,
    GridParams,
    queue_problem,
    reserved_queue,
)

MAX_NAME_CHARS = 200
MAX_TAGS = 50
MAX_TAG_CHARS = 200
SURROGATE = re.compile("[\ud800-\udfff]")


def no_surrogates(value: Any, where: str) -> None:
    """Lone surrogates can be sent as JSON escapes but not stored or encoded as UTF-8: refuse them."""
    if isinstance(value, str):
        if SURROGATE.search(value):
            raise ValueError(f"{where} holds a lone UTF-16 surrogate, which is not valid text")
    elif isinstance(value, dict):
        for k, v in value.items():
            no_surrogates(k, where)
            no_surrogates(v, f"{where}.{k}")
    elif isinstance(value, list):
        for v in value:
            no_surrogates(v, where)


def first_error(exc: ValidationError) -> str:
    """A validation error's first problem as `field.path: message` (the imports' words for a bad line)."""
    first = exc.errors(include_url=False)[0]
    return f"{'.'.join(map(str, first['loc'])) or 'the row'}: {first['msg']}"


# -- sweeps ------------------------------------------------------------------------------------------
class SweepBase(SQLModel):
    suite: str = Field(index=True)
    name: str | None = None
    params: GridParams = Field(default_factory=dict, sa_column=Column(JSON))
    tags: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON))
    repeats: int = 1
    queue: str = "default"
    timeout_s: float | None = None


class SweepCreate(SweepBase):
    """Body of POST /api/sweeps. A list value in params is a grid axis; a list of params objects is
    several grids run as one sweep (backend/grid.py)."""

    suite: str = Field(max_length=100)
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)
    params: GridParams = Field(default_factory=dict)
    tags: dict[str, str] | None = Field(None, description=f"at most {MAX_TAGS}, names and values "
                                                          f"<= {MAX_TAG_CHARS} chars")
    timeout_s: float | None = Field(None, gt=0, description="per job; at most BENCHLAB_MAX_JOB_TIMEOUT_S")
    repeats: int | None = Field(None, ge=1, le=MAX_REPEATS)
    queue: str | None = Field(None, max_length=100, schema_extra={"pattern": QUEUE_PATTERN})
    fresh_process: bool = False

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, v: str | None) -> str | None:
        problem = None if v is None else queue_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("tags")
    @classmethod
    def _tag_limits(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > MAX_TAGS:
            raise ValueError(f"at most {MAX_TAGS} tags, got {len(v)}")
        for k, val in v.items():
            if not k or len(k) > MAX_TAG_CHARS or len(val) > MAX_TAG_CHARS:
                raise ValueError(f"tag names are 1-{MAX_TAG_CHARS} characters and values at most {MAX_TAG_CHARS}")
        no_surrogates(v, "tags")
        return v

    @field_validator("name", "suite")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        no_surrogates(v, "text")
        return v

    @field_validator("params")
    @classmethod
    def _params_text(cls, v: dict[str, Any]) -> dict[str, Any]:
        no_surrogates(v, "params")
        return v


class Sweep(SweepBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    # names the sweep on the broker (cancellation marks): ids restart in every new database, uids don't
    uid: str = Field(default_factory=lambda: uuid.uuid4().hex, index=True)
    created_at: float = Field(default_factory=time.time, index=True)
    cancelled_at: float | None = None
    source: str = "api"  # api | import
    fresh_process: bool = False


class SweepCreated(SQLModel):
    id: int
    status: str
    jobs: int


class SweepPublic(SQLModel):
    id: int
    name: str | None
    suite: str
    params: GridParams
    tags: dict[str, str]
    repeats: int
    queue: str
    created_at: float
    status: str
    jobs: int
    counts: dict[str, int]
    source: str


class SweepAction(SQLModel):
    id: int
    requeued: int | None = None
    cancelled: int | None = None


class ResultRow(SQLModel):
    """One row of GET /api/sweeps/{id}/results: a job with its latest attempt's metrics."""

    job_id: int
    cell: int
    repeat: int
    params: dict[str, Any]
    state: str
    metrics: dict[str, Any]
    nonfinite: list[str]
    error: str | None
    worker: str | None
    attempts: int
    started_at: float | None
    finished_at: float | None
    duration_s: float | None
    env_id: int | None
    artifacts: list[dict[str, Any]]


# -- jobs and results ------------------------------------------------------------------------------
class Environment(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    digest: str = Field(index=True, unique=True)
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    created_at: float = Field(default_factory=time.time)


class Job(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    sweep_id: int = Field(foreign_key="sweep.id", index=True)
    cell_index: int
    repeat_index: int = 0
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    state: str = Field(default="queued", index=True)
    attempts: int = 1
    worker: str | None = None
    progress: str | None = None
    error: str | None = None
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    env_id: int | None = Field(default=None, foreign_key="environment.id")


class Result(SQLModel, table=True):
    """The metrics of one attempt of one job (a retried job keeps its earlier attempts).

    (job_id, attempt) is unique: a redelivered message does not write a second row, and a result
    arriving after the reaper declared the worker lost replaces the reaper's row.
    """

    __table_args__ = (UniqueConstraint("job_id", "attempt", name="uq_result_job_attempt"),)
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    attempt: int = 1
    state: str
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    nonfinite: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    artifacts: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON))
    duration_s: float | None = None
    env_id: int | None = Field(default=None, foreign_key="environment.id")
    created_at: float = Field(default_factory=time.time)


class JobPublic(SQLModel):
    id: int
    sweep_id: int
    cell: int
    repeat: int
    params: dict[str, Any]
    state: str
    attempts: int
    worker: str | None
    progress: str | None
    error: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    metrics: dict[str, Any]
    nonfinite: list[str]
    artifacts: list[dict[str, Any]]
    env: dict[str, Any] | None
    history: list[dict[str, Any]]


class ArtifactStored(SQLModel):
    job_id: int
    name: str
    size: int
    attempt: int = 1


# -- workers and the recorder ------------------------------------------------------------------------
class WorkerRow(SQLModel, table=True):
    """The last heartbeat of each worker; the reaper reads it to find jobs whose worker is gone."""

    __tablename__ = "worker"
    name: str = Field(primary_key=True)
    hostname: str = ""
    pid: int = 0
    queues: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    gpus: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    commit: str | None = None
    current_job: int | None = None
    current_attempt: int | None = None
    first_seen: float = Field(default_factory=time.time)
    last_seen: float = Field(default_factory=time.time, index=True)
    stopping: bool = False


class DeadLetter(SQLModel, table=True):
    """A results-queue message the recorder could not apply: kept, listed and counted, never retried forever."""

    __tablename__ = "dead_letter"
    id: int | None = Field(default=None, primary_key=True)
    received_at: float = Field(default_factory=time.time, index=True)
    body: str = Field(sa_column=Column(Text, nullable=False))
    error: str = Field(sa_column=Column(Text, nullable=False))
    tries: int = 1


# -- named API tokens ----------------------------------------------------------------------------------
TOKEN_SCOPES = ("read", "write", "admin")  # each includes the ones before it


class ApiTokenBase(SQLModel):
    name: str = Field(max_length=100, schema_extra={"pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"})
    scope: str = Field("write", schema_extra={"pattern": "^(read|write|admin)$"})


class ApiTokenCreate(ApiTokenBase):
    """Body of POST /api/tokens."""


class ApiToken(ApiTokenBase, table=True):
    """A named token: only the SHA-256 of its secret is stored (secrets are 32 random bytes, so a fast
    hash loses nothing); `prefix` is what lists show of it."""

    __tablename__ = "api_token"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    token_hash: str = Field(index=True, unique=True)
    prefix: str
    created_at: float = Field(default_factory=time.time)
    last_used_at: float | None = None
    revoked_at: float | None = None


class ApiTokenPublic(ApiTokenBase):
    prefix: str
    created_at: float
    last_used_at: float | None
    revoked_at: float | None


class ApiTokenCreated(ApiTokenPublic):
    token: str = Field(description="the secret: shown this once, never stored")


class WorkerPublic(SQLModel):
    name: str
    hostname: str
    queues: list[str]
    gpus: list[str]
    commit: str | None
    current_job: int | None
    last_seen: float
    alive: bool


class HealthPublic(SQLModel):
    status: str
    time: float
    broker: str
    broker_ok: bool
    database: str
    schema_revision: str | None
    recorder: bool
    events_recorded: int
    dead_letters: int
    workers_alive: int
    held_waits: int
    artifacts_bytes: int
    artifacts_jobs: int


class ErrorPublic(SQLModel):
    """Every 4xx/5xx answer: `detail` says what was wrong (a string, or a list of {loc, msg} for input)."""

    detail: Any
