"""SQLModel tables: sweeps, jobs (one per grid cell and repeat), results (per attempt), environments."""
from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import JSON, Column
from sqlmodel import Field, SQLModel

JOB_STATES = ("queued", "running", "done", "skipped", "failed", "oom", "timeout", "cancelled")
FINAL_STATES = ("done", "skipped", "failed", "oom", "timeout", "cancelled")
UNFINISHED_STATUSES = ("queued", "running")  # sweep statuses that a wait keeps waiting through
RETRYABLE_STATES = ("failed", "oom", "timeout")


class SweepBase(SQLModel):
    suite: str = Field(index=True)
    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    tags: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON))
    repeats: int = 1
    queue: str = "default"
    timeout_s: float | None = None


class SweepCreate(SQLModel):
    """Body of POST /api/sweeps. A list value in params is a grid axis."""

    suite: str
    params: dict[str, Any] = Field(default_factory=dict)
    name: str | None = None
    tags: dict[str, str] | None = None
    repeats: int | None = Field(None, ge=1, le=100)
    queue: str | None = Field(None, max_length=100, regex=r"^[A-Za-z0-9_.\-]+$")
    timeout_s: float | None = Field(None, gt=0, le=7 * 24 * 3600)
    fresh_process: bool = False


class Sweep(SweepBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    # names the sweep on the broker (cancellation marks): ids restart in every new database, uids don't
    uid: str = Field(default_factory=lambda: uuid.uuid4().hex, index=True)
    created_at: float = Field(default_factory=time.time, index=True)
    cancelled_at: float | None = None
    source: str = "api"  # api | import
    fresh_process: bool = False


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
    """The metrics of one attempt of one job (a retried job keeps its earlier attempts)."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    attempt: int = 1
    state: str
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    artifacts: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON))
    duration_s: float | None = None
    env_id: int | None = Field(default=None, foreign_key="environment.id")
    created_at: float = Field(default_factory=time.time)
