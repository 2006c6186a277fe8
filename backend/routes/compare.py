"""/api/compare: two sweeps judged cell by cell (backend/compare.py)."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from sqlmodel import SQLModel

from backend import service
from backend.compare import compare
from backend.deps import ReadAuth, SessionDep
from backend.errors import NOT_FOUND, invalid_query
from backend.models import Sweep

router = APIRouter(prefix="/api", tags=["compare"], dependencies=[ReadAuth])
SweepQ = Annotated[int, Query(ge=1, le=2**63 - 1)]


class CompareCell(SQLModel):
    params: dict[str, Any]
    a: dict[str, Any]
    b: dict[str, Any]
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    verdict: str
    reason: str | None
    interval_over: str | None = None


class ComparePublic(SQLModel):
    threshold: float
    ignore: list[str]
    cells: list[CompareCell]
    missing: list[dict[str, Any]]
    fingerprint_mismatch: list[dict[str, Any]]
    summary: dict[str, int]


@router.get("/compare", response_model=ComparePublic, responses=NOT_FOUND)
def get_compare(a: SweepQ, b: SweepQ, db: SessionDep,
                   threshold: float = Query(0.05, gt=0, lt=1, description="relative: 0.05 is 5 %"),
                   ignore: str = Query("", max_length=1000, description="comma-separated params not matched on"),
                   allow_env_mismatch: bool = Query(False, description="judge cells whose environments differ")):
    """Matching cells of sweeps A and B: ratio of medians B/A with a 95 % bootstrap interval, a
    Mann-Whitney p-value and a verdict (slower / faster / same / inconclusive)."""
    rows_a, rows_b, envs = load_sweeps(db, a, b)
    names, error = check_ignore(ignore, a, b, rows_a + rows_b)
    if error:  # a typo would otherwise match on the param it meant to leave out, and say nothing
        raise invalid_query("ignore", error)
    return compare(rows_a, rows_b, envs, threshold=threshold, ignore=names, allow_env_mismatch=allow_env_mismatch)


def load_sweeps(db, a: int, b: int) -> tuple[list[dict], list[dict], dict[int, dict]]:
    """Both sweeps' result rows and the environments they name (404 if a sweep is missing; 422 if the two
    ran different suites, whose cells measure different things even where their params coincide)."""
    sweeps = [db.get(Sweep, sid) for sid in (a, b)]
    for sid, sweep in zip((a, b), sweeps, strict=True):
        if sweep is None:
            raise HTTPException(404, detail=f"sweep {sid} not found")
    if sweeps[0].suite != sweeps[1].suite:
        raise invalid_query("b", f"sweep {a} ran the {sweeps[0].suite} suite and sweep {b} the {sweeps[1].suite} "
                                 "suite: only sweeps of one suite compare")
    rows_a, rows_b = service.result_rows(db, a), service.result_rows(db, b)
    return rows_a, rows_b, service.environments(db, rows_a + rows_b)


def check_ignore(ignore: str, a: int, b: int, rows: list[dict]) -> tuple[list[str], str | None]:
    """The comma-separated `ignore` of sweeps a and b as (the names some row's params have, the message
    naming those none has, or None). With no rows there is nothing to match, and every name is kept."""
    names = [p.strip() for p in ignore.split(",") if p.strip()]
    known = {k for r in rows for k in r["params"]}
    unknown = [p for p in names if p not in known] if known else []
    if not unknown:
        return names, None
    message = (f"no cell of sweep {a} or {b} has a param named {', '.join(map(repr, unknown))}; "
               f"their params: {', '.join(sorted(known))}")
    return [p for p in names if p in known], message
