"""/api/sweeps: create (expand the grid, queue the jobs), list, read (optionally held until finished),
results, retry, cancel."""
from __future__ import annotations

import time
from collections import Counter
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from backend import service
from backend.db import session
from backend.deps import ChangesDep, DispatcherDep, ReadAuth, SessionDep, SettingsDep, WriteAuth
from backend.errors import BROKER_DOWN, NOT_FOUND, TOO_MANY_WAITERS
from backend.grid import SweepInputError
from backend.models import UNFINISHED_STATUSES, ResultRow, Sweep, SweepAction, SweepCreate, SweepCreated, SweepPublic

router = APIRouter(prefix="/api/sweeps", tags=["sweeps"])
MAX_DB_ID = 2**63 - 1  # ids are 64-bit: larger ones cannot exist (422, not a database overflow)
SweepId = Annotated[int, Path(ge=1, le=MAX_DB_ID, description="a sweep's id")]


def _get_sweep(db, sweep_id: int) -> Sweep:
    sweep = db.get(Sweep, sweep_id)
    if sweep is None:
        raise HTTPException(404, detail=f"sweep {sweep_id} not found")
    return sweep


@router.post("", status_code=201, dependencies=[WriteAuth], response_model=SweepCreated, responses=BROKER_DOWN)
def create_sweep(body: SweepCreate, db: SessionDep, settings: SettingsDep, dispatcher: DispatcherDep) -> dict:
    try:
        sweep, jobs = service.create_sweep(db, dispatcher, body, settings)
    except SweepInputError as exc:
        raise HTTPException(422, detail=exc.errors) from exc
    # the status of the jobs just written, without reading them back
    return {"id": sweep.id, "status": service.sweep_status(Counter(j.state for j in jobs), False), "jobs": len(jobs)}


@router.get("", dependencies=[ReadAuth], response_model=list[SweepPublic])
def list_sweeps(db: SessionDep, limit: int = Query(100, ge=1, le=1000),
                offset: int = Query(0, ge=0, le=2**31)) -> list[dict]:
    return service.list_sweeps(db, limit, offset)


# how often a waiting request re-reads the database even without news from this process's recorder
WAIT_RECHECK_S = 0.25


def _read_summary(engine, sweep_id: int) -> dict | None:
    with session(engine) as db:  # a short session: no connection is held while the request waits
        sweep = db.get(Sweep, sweep_id)
        return None if sweep is None else service.get_summary(db, sweep)


@router.get("/{sweep_id}", dependencies=[ReadAuth], response_model=SweepPublic,
            responses={**NOT_FOUND, **TOO_MANY_WAITERS})
async def get_sweep(sweep_id: SweepId, request: Request, changes: ChangesDep,
                    wait_s: float = Query(0.0, ge=0.0, le=60.0,
                                          description="hold the answer up to this many seconds until the sweep has "
                                                      "finished (no queued or running cells)")) -> dict:
    engine = request.app.state.engine
    seen = changes.version  # read before the query, so a write after it ends the wait below
    summary = await run_in_threadpool(_read_summary, engine, sweep_id)
    if summary is None:
        raise HTTPException(404, detail=f"sweep {sweep_id} not found")
    if wait_s <= 0 or summary["status"] not in UNFINISHED_STATUSES:
        return summary
    waiters = request.app.state.waiters
    if not waiters.try_acquire():
        raise HTTPException(429, detail=f"too many held waits ({waiters.limit}, BENCHLAB_MAX_WAITERS): "
                                        f"poll without wait_s or try again", headers={"Retry-After": "1"})
    try:
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            if summary["status"] not in UNFINISHED_STATUSES or left <= 0:
                return summary
            await changes.wait_async(seen, min(left, WAIT_RECHECK_S))
            seen = changes.version
            if await request.is_disconnected():
                return summary
            summary = await run_in_threadpool(_read_summary, engine, sweep_id) or summary
    finally:
        waiters.release()


@router.get("/{sweep_id}/baseline", dependencies=[ReadAuth], response_model=SweepPublic, responses=NOT_FOUND)
def get_baseline(sweep_id: SweepId, db: SessionDep,
                 branch: str = Query("main", max_length=200, description="the baseline's `branch` tag"),
                 ignore: str = Query("", max_length=1000, description="comma-separated params not matched on")
                 ) -> dict:
    """The sweep this one is judged against by default: the newest finished sweep before it of the same
    suite and grid (params less `ignore`), tagged `branch` (as `benchlab ci --baseline auto` picks)."""
    from backend.ci import find_baseline

    sweep = _get_sweep(db, sweep_id)
    candidates = [s for s in service.list_sweeps(db, limit=1000) if s["id"] < sweep_id]
    base = find_baseline(candidates, sweep.suite, sweep.params,
                         [p.strip() for p in ignore.split(",") if p.strip()], branch)
    if base is None:
        raise HTTPException(404, detail=f"no finished {sweep.suite} sweep of this grid tagged branch={branch!r} "
                                        f"before sweep {sweep_id}")
    return base


CSV_ROWS = {200: {"description": "one row per job; `?format=csv`: the rows as CSV, a column per param and metric",
                  "content": {"text/csv": {"schema": {"type": "string"}}}}}


@router.get("/{sweep_id}/results", dependencies=[ReadAuth], response_model=list[ResultRow],
            responses={**CSV_ROWS, **NOT_FOUND})
def get_results(sweep_id: SweepId, db: SessionDep, format: str = Query("json", pattern="^(json|csv)$")):
    _get_sweep(db, sweep_id)
    if format == "csv":
        return Response(service.rows_to_csv(service.result_rows(db, sweep_id)), media_type="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="sweep_{sweep_id}.csv"'})
    # the stored JSON is spliced into the answer unparsed: no per-row decode and re-encode
    return Response(service.result_rows_json(db, sweep_id), media_type="application/json")


@router.post("/{sweep_id}/retry", dependencies=[WriteAuth], response_model=SweepAction,
             response_model_exclude_none=True,
             responses={**NOT_FOUND, **BROKER_DOWN})
def retry(sweep_id: SweepId, db: SessionDep, dispatcher: DispatcherDep) -> dict:
    n = service.retry_sweep(db, dispatcher, _get_sweep(db, sweep_id))
    return {"id": sweep_id, "requeued": n}


@router.post("/{sweep_id}/cancel", dependencies=[WriteAuth], response_model=SweepAction,
             response_model_exclude_none=True,
             responses={**NOT_FOUND, **BROKER_DOWN})
def cancel(sweep_id: SweepId, db: SessionDep, dispatcher: DispatcherDep) -> dict:
    n = service.cancel_sweep(db, dispatcher, _get_sweep(db, sweep_id))
    return {"id": sweep_id, "cancelled": n}
