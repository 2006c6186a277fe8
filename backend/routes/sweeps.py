from __future__ import annotations

import time
from collections import Counter

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from backend import service
from backend.deps import ChangesDep, DispatcherDep, ReadAuth, SessionDep, SettingsDep, WriteAuth
from backend.grid import SweepInputError
from backend.models import UNFINISHED_STATUSES, Sweep, SweepCreate

router = APIRouter(prefix="/api/sweeps", tags=["sweeps"])


def _get_sweep(db, sweep_id: int) -> Sweep:
    sweep = db.get(Sweep, sweep_id)
    if sweep is None:
        raise HTTPException(404, detail=f"sweep {sweep_id} not found")
    return sweep


@router.post("", status_code=201, dependencies=[WriteAuth])
def create_sweep(body: SweepCreate, db: SessionDep, settings: SettingsDep, dispatcher: DispatcherDep) -> dict:
    try:
        sweep, jobs = service.create_sweep(db, dispatcher, body, settings)
    except SweepInputError as exc:
        raise HTTPException(422, detail=exc.errors) from exc
    # the status of the jobs just written, without reading them back
    return {"id": sweep.id, "status": service.sweep_status(Counter(j.state for j in jobs), False), "jobs": len(jobs)}


@router.get("", dependencies=[ReadAuth])
def list_sweeps(db: SessionDep, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0)) -> list[dict]:
    return service.list_sweeps(db, limit, offset)


# how often a waiting request re-reads the database even without news from this process's recorder
WAIT_RECHECK_S = 0.25


@router.get("/{sweep_id}", dependencies=[ReadAuth])
def get_sweep(sweep_id: int, db: SessionDep, changes: ChangesDep,
              wait_s: float = Query(0.0, ge=0.0, le=60.0,
                                    description="hold the answer up to this many seconds until the sweep has "
                                                "finished (no queued or running cells)")) -> dict:
    sweep = _get_sweep(db, sweep_id)
    deadline = time.monotonic() + wait_s
    while True:
        seen = changes.version  # read before the query, so a write after it ends the wait below
        summary = service.get_summary(db, sweep)
        left = deadline - time.monotonic()
        if summary["status"] not in UNFINISHED_STATUSES or left <= 0:
            return summary
        changes.wait(seen, min(left, WAIT_RECHECK_S))
        db.rollback()  # end this read snapshot: the next query sees what was committed since


@router.get("/{sweep_id}/results", dependencies=[ReadAuth])
def get_results(sweep_id: int, db: SessionDep, format: str = Query("json", pattern="^(json|csv)$")):
    _get_sweep(db, sweep_id)
    if format == "csv":
        return Response(service.rows_to_csv(service.result_rows(db, sweep_id)), media_type="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="sweep_{sweep_id}.csv"'})
    # the stored JSON is spliced into the answer unparsed: no per-row decode and re-encode
    return Response(service.result_rows_json(db, sweep_id), media_type="application/json")


@router.post("/{sweep_id}/retry", dependencies=[WriteAuth])
def retry(sweep_id: int, db: SessionDep, dispatcher: DispatcherDep) -> dict:
    n = service.retry_sweep(db, dispatcher, _get_sweep(db, sweep_id))
    return {"id": sweep_id, "requeued": n}


@router.post("/{sweep_id}/cancel", dependencies=[WriteAuth])
def cancel(sweep_id: int, db: SessionDep, dispatcher: DispatcherDep) -> dict:
    n = service.cancel_sweep(db, dispatcher, _get_sweep(db, sweep_id))
    return {"id": sweep_id, "cancelled": n}
