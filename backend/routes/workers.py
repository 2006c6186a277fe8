"""/api/workers (what each worker last said of itself) and /api/dead-letters (messages the recorder
could not apply)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Query
from sqlmodel import SQLModel, select

from backend.deps import ReadAuth, SessionDep, SettingsDep
from backend.models import DeadLetter, WorkerPublic, WorkerRow

router = APIRouter(prefix="/api", tags=["workers"], dependencies=[ReadAuth])


class DeadLetterPublic(SQLModel):
    id: int
    received_at: float
    body: str
    error: str
    tries: int


@router.get("/workers", response_model=list[WorkerPublic])
def list_workers(db: SessionDep, settings: SettingsDep) -> list[dict]:
    cutoff = time.time() - settings.worker_lost_after_s
    rows = db.exec(select(WorkerRow).order_by(WorkerRow.last_seen.desc()).limit(500)).all()
    return [{**r.model_dump(), "alive": r.last_seen >= cutoff and not r.stopping} for r in rows]


@router.get("/dead-letters", response_model=list[DeadLetterPublic])
def list_dead_letters(db: SessionDep, limit: int = Query(100, ge=1, le=1000),
                      offset: int = Query(0, ge=0, le=2**31)) -> list[DeadLetter]:
    return db.exec(select(DeadLetter).order_by(DeadLetter.id.desc()).offset(offset).limit(limit)).all()
