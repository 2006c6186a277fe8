"""/api/health: is the service working, and what it knows of its broker, schema, recorder and workers."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from sqlmodel import func, select

from backend.artifacts import usage
from backend.db import current_revision, session
from backend.models import DeadLetter, HealthPublic, WorkerRow

router = APIRouter(prefix="/api", tags=["health"])


def _database_facts(request: Request) -> tuple[str | None, int, int]:
    app = request.app
    with session(app.state.engine) as db:
        dead = db.exec(select(func.count()).select_from(DeadLetter)).one()
        cutoff = time.time() - app.state.settings.worker_lost_after_s
        alive = db.exec(select(func.count()).select_from(WorkerRow).where(WorkerRow.last_seen >= cutoff,
                                                                         WorkerRow.stopping == False)).one()  # noqa: E712 (SQL)
    return current_revision(app.state.engine), dead, alive


_USAGE: dict = {}  # artifact usage, re-measured at most once a minute (a walk of the artifact folder)


def _artifact_usage(app) -> dict[str, int]:
    root = app.state.settings.artifact_root
    cached = _USAGE.get(str(root))
    if cached is None or time.monotonic() - cached[0] > 60:
        cached = _USAGE[str(root)] = (time.monotonic(), usage(root))
    return cached[1]


@router.get("/health", response_model=HealthPublic)
async def health(request: Request) -> dict:
    app = request.app
    rec = app.state.recorder
    broker_ok, _ = await run_in_threadpool(app.state.dispatcher.reachable)
    revision, dead, alive = await run_in_threadpool(_database_facts, request)
    stored = await run_in_threadpool(_artifact_usage, app)
    return {"status": "ok" if broker_ok else "degraded", "time": time.time(),
            "broker": app.state.dispatcher.worker_settings.effective_broker_url.split("@")[-1],
            "broker_ok": broker_ok, "database": app.state.engine.dialect.name, "schema_revision": revision,
            "recorder": bool(rec and rec.is_alive()), "events_recorded": rec.applied if rec else 0,
            "dead_letters": dead, "workers_alive": alive, "held_waits": app.state.waiters.held,
            "artifacts_bytes": stored["bytes"], "artifacts_jobs": stored["jobs"]}
