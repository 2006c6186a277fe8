"""What the routes, the recorder and the CLI do to the database, in one place."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import time
from typing import Any

from sqlalchemy import Text, cast, func
from sqlmodel import Session, select

from backend.dispatch import Dispatcher
from backend.grid import expand_grid
from backend.models import (FINAL_STATES, JOB_STATES, RETRYABLE_STATES, Environment, Job, Result, Sweep,
                            SweepCreate)
from backend.settings import BackendSettings


def job_payload(job: Job, sweep: Sweep) -> dict[str, Any]:
    return {"job_id": job.id, "sweep_id": sweep.id, "sweep_uid": sweep.uid, "suite": sweep.suite, "params": job.params,
            "attempt": job.attempts, "timeout_s": sweep.timeout_s, "fresh": sweep.fresh_process}


def create_sweep(db: Session, dispatcher: Dispatcher | None, body: SweepCreate, settings: BackendSettings,
                 source: str = "api") -> tuple[Sweep, list[Job]]:
    """Validate, store the sweep and its jobs, then queue one task per job. Raises SweepInputError.

    Returns the sweep and its jobs as created (all `queued`, or all `failed` if the broker refused them).
    """
    repeats = body.repeats or 1
    cells = expand_grid(body.suite, body.params, settings.max_grid_cells // repeats if repeats > 1
                        else settings.max_grid_cells)
    sweep = Sweep(suite=body.suite, name=body.name, params=body.params, tags=body.tags or {}, repeats=repeats,
                  queue=body.queue or settings.default_queue, timeout_s=body.timeout_s,
                  fresh_process=body.fresh_process, source=source)
    db.add(sweep)
    db.flush()
    jobs = [Job(sweep_id=sweep.id, cell_index=i, repeat_index=r, params=cell)
            for i, cell in enumerate(cells) for r in range(repeats)]
    db.add_all(jobs)
    db.commit()
    if dispatcher is not None:
        try:
            dispatcher.send([job_payload(j, sweep) for j in jobs], sweep.queue)
        except Exception as exc:  # noqa: BLE001 - the broker is down: say so on every job, lose nothing
            for j in jobs:
                j.state, j.error, j.finished_at = "failed", f"could not queue the job: {exc}", time.time()
            db.add_all(jobs)
            db.commit()
    return sweep, jobs


def state_counts(db: Session, sweep_ids: list[int]) -> dict[int, dict[str, int]]:
    rows = db.exec(select(Job.sweep_id, Job.state, func.count()).where(Job.sweep_id.in_(sweep_ids))
                   .group_by(Job.sweep_id, Job.state)).all()
    out: dict[int, dict[str, int]] = {sid: {} for sid in sweep_ids}
    for sid, state, n in rows:
        out[sid][state] = n
    return out


def sweep_status(counts: dict[str, int], cancelled: bool) -> str:
    total = sum(counts.values())
    if total == 0:
        return "empty"
    final = sum(counts.get(s, 0) for s in FINAL_STATES)
    if final == total:
        if cancelled and counts.get("cancelled"):
            return "cancelled"
        return "done"
    if counts.get("running") or final:
        return "running"
    return "queued"


def sweep_summary(sweep: Sweep, counts: dict[str, int]) -> dict[str, Any]:
    return {"id": sweep.id, "name": sweep.name, "suite": sweep.suite, "params": sweep.params, "tags": sweep.tags,
            "repeats": sweep.repeats, "queue": sweep.queue, "created_at": sweep.created_at,
            "status": sweep_status(counts, sweep.cancelled_at is not None),
            "jobs": sum(counts.values()), "counts": {s: counts.get(s, 0) for s in JOB_STATES},
            "source": sweep.source}


def list_sweeps(db: Session, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
    sweeps = db.exec(select(Sweep).order_by(Sweep.id.desc()).offset(offset).limit(limit)).all()
    counts = state_counts(db, [s.id for s in sweeps])
    return [sweep_summary(s, counts[s.id]) for s in sweeps]


def get_summary(db: Session, sweep: Sweep) -> dict[str, Any]:
    return sweep_summary(sweep, state_counts(db, [sweep.id])[sweep.id])


_ROW_KEYS = ("job_id", "cell", "repeat", "params", "state", "metrics", "error", "worker", "attempts",
             "started_at", "finished_at", "duration_s", "env_id", "artifacts")
_JSON_KEYS = {"params": "{}", "metrics": "{}", "artifacts": "[]"}


def _results_query(sweep_id: int, raw_json: bool):
    """One row per job with its latest result. raw_json: JSON columns come back as their stored text."""
    latest = (select(Result.job_id, func.max(Result.id).label("rid")).join(Job, Job.id == Result.job_id)
              .where(Job.sweep_id == sweep_id).group_by(Result.job_id).subquery())
    as_text = (lambda c: cast(c, Text)) if raw_json else (lambda c: c)  # noqa: E731
    return (select(Job.id, Job.cell_index, Job.repeat_index, as_text(Job.params), Job.state, as_text(Result.metrics),
                   Job.error, Job.worker, Job.attempts, Job.started_at, Job.finished_at, Result.duration_s,
                   Job.env_id, as_text(Result.artifacts))
            .where(Job.sweep_id == sweep_id)
            .outerjoin(latest, latest.c.job_id == Job.id)
            .outerjoin(Result, Result.id == latest.c.rid)
            .order_by(Job.cell_index, Job.repeat_index))


def result_rows(db: Session, sweep_id: int) -> list[dict[str, Any]]:
    """One row per job: params, state, the latest attempt's metrics, error. One query, no ORM objects."""
    rows = []
    for values in db.exec(_results_query(sweep_id, raw_json=False)).all():
        row = dict(zip(_ROW_KEYS, values))
        for k, empty in _JSON_KEYS.items():
            row[k] = row[k] or json.loads(empty)
        rows.append(row)
    return rows


def result_rows_json(db: Session, sweep_id: int) -> str:
    """The same rows as a JSON array, with the stored JSON columns spliced in unparsed: the fast path
    for large sweeps (decoding and re-encoding 10,000 rows' params and metrics costs most of the time)."""
    def enc(v) -> str:
        if v is None:
            return "null"
        if type(v) is int or (type(v) is float and math.isfinite(v)):
            return repr(v)
        return json.dumps(v)

    json_keys = [k in _JSON_KEYS for k in _ROW_KEYS]
    prefixes = [f'"{k}":' for k in _ROW_KEYS]
    empties = [_JSON_KEYS.get(k) for k in _ROW_KEYS]
    parts = []
    for values in db.exec(_results_query(sweep_id, raw_json=True)).all():
        parts.append("{" + ",".join(
            p + ((v or e) if j else enc(v)) for p, v, j, e in zip(prefixes, values, json_keys, empties)) + "}")
    return "[" + ",".join(parts) + "]"


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    """Flatten params.* and metrics.* into columns (nested values as JSON)."""
    param_keys = sorted({k for r in rows for k in r["params"]})
    metric_keys = sorted({k for r in rows for k in r["metrics"]})
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["job_id", "cell", "repeat", "state", *[f"param.{k}" for k in param_keys],
                *[f"metric.{k}" for k in metric_keys], "error"])
    for r in rows:
        val = lambda v: json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v)  # noqa: E731
        first_error_line = (r["error"] or "").split("\n", 1)[0]
        w.writerow([r["job_id"], r["cell"], r["repeat"], r["state"], *[val(r["params"].get(k)) for k in param_keys],
                    *[val(r["metrics"].get(k)) for k in metric_keys], first_error_line])
    return buf.getvalue()


def retry_sweep(db: Session, dispatcher: Dispatcher | None, sweep: Sweep) -> int:
    """Re-queue the failed, OOM and timed-out cells (new attempt number). Returns how many."""
    jobs = db.exec(select(Job).where(Job.sweep_id == sweep.id, Job.state.in_(RETRYABLE_STATES))).all()
    for j in jobs:
        j.state, j.attempts, j.error, j.progress = "queued", j.attempts + 1, None, None
        j.started_at = j.finished_at = None
    if sweep.cancelled_at is not None and jobs:
        sweep.cancelled_at = None
        if dispatcher is not None:
            dispatcher.cancels.uncancel(sweep.uid)
        db.add(sweep)
    db.add_all(jobs)
    db.commit()
    if dispatcher is not None and jobs:
        dispatcher.send([job_payload(j, sweep) for j in jobs], sweep.queue)
    return len(jobs)


def cancel_sweep(db: Session, dispatcher: Dispatcher | None, sweep: Sweep) -> int:
    """Mark the sweep cancelled on the broker (workers skip its queued jobs) and in the database."""
    if dispatcher is not None:
        dispatcher.cancels.cancel(sweep.uid)
    sweep.cancelled_at = time.time()
    jobs = db.exec(select(Job).where(Job.sweep_id == sweep.id, Job.state == "queued")).all()
    for j in jobs:
        j.state, j.finished_at, j.error = "cancelled", time.time(), "cancelled before it started"
    db.add(sweep)
    db.add_all(jobs)
    db.commit()
    return len(jobs)


def job_detail(db: Session, job: Job) -> dict[str, Any]:
    results = db.exec(select(Result).where(Result.job_id == job.id).order_by(Result.id)).all()
    latest = results[-1] if results else None
    env = db.get(Environment, job.env_id) if job.env_id else None
    return {"id": job.id, "sweep_id": job.sweep_id, "cell": job.cell_index, "repeat": job.repeat_index,
            "params": job.params, "state": job.state, "attempts": job.attempts, "worker": job.worker,
            "progress": job.progress, "error": job.error, "created_at": job.created_at,
            "started_at": job.started_at, "finished_at": job.finished_at,
            "metrics": latest.metrics if latest else {}, "artifacts": latest.artifacts if latest else [],
            "env": env.data if env else None,
            "history": [{"attempt": r.attempt, "state": r.state, "duration_s": r.duration_s} for r in results]}


_ENV_IDS: dict[tuple[str, str], int] = {}  # (database url, digest) -> id: a fingerprint is looked up once


def environment_id(db: Session, env: dict[str, Any] | None) -> int | None:
    """Store a fingerprint once; return its id."""
    if not env:
        return None
    digest = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:32]
    key = (str(db.get_bind().url), digest)
    if key in _ENV_IDS:
        return _ENV_IDS[key]
    found = db.exec(select(Environment).where(Environment.digest == digest)).first()
    if found:
        _ENV_IDS[key] = found.id
        return found.id
    e = Environment(digest=digest, data=env)
    db.add(e)
    db.flush()
    return e.id


def apply_event(db: Session, event: dict[str, Any]) -> bool:
    """Write one worker message (state, progress or result) to the database. Returns whether it applied.

    Stale messages (an earlier attempt of a retried job, a `running` after a final state) are dropped.
    """
    job = db.get(Job, int(event["job_id"]))
    if job is None:
        return False
    attempt = int(event.get("attempt") or job.attempts)
    if attempt < job.attempts:
        return False
    kind = event.get("type")
    if kind == "state":
        if job.state in FINAL_STATES:
            return False
        job.state, job.worker, job.started_at = event["state"], event.get("worker"), event.get("at", time.time())
    elif kind == "progress":
        if job.state in FINAL_STATES:
            return False
        job.progress = event.get("message")
    elif kind == "result":
        state = event["state"]
        if state not in FINAL_STATES:
            state = "failed"
        if job.state == "cancelled" and state == "cancelled":
            return False
        env_id = environment_id(db, event.get("env"))
        db.add(Result(job_id=job.id, attempt=attempt, state=state, metrics=event.get("metrics") or {},
                      artifacts=event.get("artifacts") or [], duration_s=event.get("duration_s"), env_id=env_id))
        job.state, job.error = state, event.get("error")
        job.worker = event.get("worker") or job.worker
        job.finished_at = event.get("at", time.time())
        job.env_id = env_id or job.env_id
        if job.started_at is None and event.get("duration_s") is not None:
            job.started_at = job.finished_at - float(event["duration_s"])
    else:
        return False
    db.add(job)
    db.commit()
    return True


def import_results(db: Session, lines: list[dict[str, Any]], name: str | None = None) -> Sweep:
    """Load a `benchlab run --out` file: a header line {"kind": "sweep", ...} then one {"kind": "cell", ...} per job."""
    from worker.suites import suite_names

    header = next((ln for ln in lines if ln.get("kind") == "sweep"), None)
    cells = [ln for ln in lines if ln.get("kind") == "cell"]
    if header is None or not cells:
        raise ValueError("not a benchlab run file: it needs a 'sweep' header line and at least one 'cell' line")
    if header.get("suite") not in suite_names():
        raise ValueError(f"unknown suite {header.get('suite')!r} in the header; known: {', '.join(suite_names())}")
    sweep = Sweep(suite=header["suite"], name=name or header.get("name"), params=header.get("params", {}),
                  tags=header.get("tags") or {}, repeats=header.get("repeats", 1), source="import")
    db.add(sweep)
    db.flush()
    for c in cells:
        if c.get("state") not in JOB_STATES:
            raise ValueError(f"cell {c.get('cell')} has unknown state {c.get('state')!r}")
        env_id = environment_id(db, c.get("env") or header.get("env"))
        job = Job(sweep_id=sweep.id, cell_index=c["cell"], repeat_index=c.get("repeat", 0), params=c["params"],
                  state=c["state"], error=c.get("error"), worker=c.get("worker"), env_id=env_id,
                  started_at=c.get("started_at"), finished_at=c.get("finished_at"))
        db.add(job)
        db.flush()
        db.add(Result(job_id=job.id, state=c["state"], metrics=c.get("metrics") or {}, artifacts=[],
                      duration_s=c.get("duration_s"), env_id=env_id))
    db.commit()
    return sweep


def progress_lines(db: Session, sweep_id: int) -> dict[int, str]:
    """The latest progress line of each running job of a sweep."""
    rows = db.exec(select(Job.id, Job.progress).where(Job.sweep_id == sweep_id, Job.state == "running")).all()
    return {jid: p for jid, p in rows if p}
