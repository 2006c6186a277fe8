"""/api/history: one cell's median over the sweeps of a suite, regressions marked (backend/history.py)."""
from __future__ import annotations

import json
import math
from typing import Any

from fastapi import APIRouter, Query
from sqlmodel import SQLModel, select

from backend import service
from backend.deps import ReadAuth, SessionDep
from backend.errors import invalid_query
from backend.history import history
from backend.models import Sweep, no_surrogates
from worker.suites import suite_names

router = APIRouter(prefix="/api", tags=["history"], dependencies=[ReadAuth])


class HistoryPoint(SQLModel):
    sweep_id: int
    created_at: float
    commit: str | None
    branch: str | None
    median_ms: float
    ci_low: float
    ci_high: float
    n: int
    ratio: float | None
    verdict: str | None
    reason: str | None = None
    regression: bool


class HistorySeries(SQLModel):
    params: dict[str, Any]
    points: list[HistoryPoint]


class HistoryPublic(SQLModel):
    suite: str
    params: dict[str, Any]
    threshold: float
    sweeps: int
    ignore: list[str]
    series: list[HistorySeries]


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_params(text: str) -> dict[str, Any]:
    """The `params` filter: a JSON object of param values, strict JSON (no NaN, no infinities, no lone
    surrogates: no stored cell holds them), else a 422 naming it."""
    example = 'e.g. {"impl": "naive"}'
    try:
        want = json.loads(text or "{}", parse_float=_finite, parse_constant=_not_json)
        no_surrogates(want, "params")
    except ValueError as exc:  # json.JSONDecodeError among them
        raise invalid_query("params", f"params must be a JSON object of param values ({example}): {exc}") from None
    if not isinstance(want, dict):
        raise invalid_query("params", f"params must be a JSON object of param values, {example}")
    return want


def load_history(db, suite: str, params: str, threshold: float, limit: int, branch: str | None,
                 ignore: str = "") -> dict:
    if suite not in suite_names():
        raise invalid_query("suite", f"unknown suite {suite!r}; known suites: {', '.join(suite_names())}")
    want = parse_params(params)
    newest = db.exec(select(Sweep).where(Sweep.suite == suite).order_by(Sweep.id.desc()).limit(limit * 4)).all()
    picked = []
    for sweep in newest:
        summary = service.get_summary(db, sweep)
        if summary["status"] != "done" or (branch and (sweep.tags or {}).get("branch") != branch):
            continue
        rows = service.result_rows(db, sweep.id)
        if not (sweep.tags or {}).get("commit"):  # untagged: the commit its cells ran at, where they agree
            commits = {env.get("git_commit") for env in service.environments(db, rows).values()}
            if len(commits) == 1 and None not in commits:
                summary = {**summary, "ran_at_commit": commits.pop()}
        picked.append((summary, rows))
        if len(picked) == limit:
            break
    picked.reverse()  # oldest first
    ignored = {x.strip() for x in ignore.split(",") if x.strip()}
    return {"suite": suite, "params": want, "threshold": threshold, "sweeps": len(picked),
            "ignore": sorted(ignored), "series": history(picked, want, threshold, ignore=ignored)}


@router.get("/history", response_model=HistoryPublic)
def get_history(db: SessionDep, suite: str = Query(..., max_length=100),
                params: str = Query("{}", max_length=4000, description="JSON object: the cells whose params "
                                                                       "include these values"),
                threshold: float = Query(0.05, gt=0, lt=1), limit: int = Query(50, ge=2, le=500),
                branch: str | None = Query(None, max_length=200, description="only sweeps tagged with it"),
                ignore: str = Query("", max_length=1000, description="comma-separated params that do not tell "
                                                                     "cells apart (as in /api/compare)")):
    """For each matching cell, its median with a 95 % interval in each finished sweep of the suite
    (oldest first, the newest `limit`), each point judged against the one before (`regression`)."""
    return load_history(db, suite, params, threshold, limit, branch, ignore)
