"""What the routes, the recorder and the CLI do to the database, in one place."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import Text, cast, func
from sqlmodel import Session, select

from backend import commfit
from backend.dispatch import Dispatcher, SendError
from backend.grid import SweepInputError, expand_grid
from backend.models import (
    FINAL_STATES,
    JOB_STATES,
    RETRYABLE_STATES,
    UNFINISHED_STATES,
    DeadLetter,
    Environment,
    Job,
    Result,
    Sweep,
    SweepCreate,
    WorkerRow,
    first_error,
    no_surrogates,
)
from backend.settings import BackendSettings
from worker.contract import (
    HeartbeatEvent,
    JobPayload,
    ProgressEvent,
    ResultEvent,
    RunCell,
    RunHeader,
    StateEvent,
    parse_event,
)
from worker.placement import gpus_asked, route
from worker.settings import artifact_dir

SAFE_ARTIFACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class BrokerUnavailable(RuntimeError):
    """The broker cannot take messages now; the request changed nothing (answered 503)."""


def job_payload(job: Job, sweep: Sweep) -> dict[str, Any]:
    return JobPayload(job_id=job.id, sweep_id=sweep.id, sweep_uid=sweep.uid, suite=sweep.suite, params=job.params,
                      attempt=job.attempts, timeout_s=sweep.timeout_s, fresh=sweep.fresh_process).model_dump()


def placement_note(db: Session, queue: str, gpus: int, lost_after_s: float = 60.0) -> str | None:
    """Why a job needing `gpus` GPUs on `queue` may wait: no live worker consumes its GPU queue."""
    routed = route(queue, "noop", {"gpus": gpus})
    live = db.exec(select(WorkerRow).where(WorkerRow.last_seen >= time.time() - lost_after_s,
                                           WorkerRow.stopping == False)).all()  # noqa: E712 (SQL, not Python)
    if any(routed in (w.queues or []) for w in live):
        return None
    most = max((len(w.gpus or []) for w in live if queue in (w.queues or [])), default=0)
    return (f"waiting for a worker with {gpus} GPU(s) on queue {queue!r}: the live workers on it have at most "
            f"{most}")


def _send_or_record(db: Session, dispatcher: Dispatcher, sweep: Sweep, jobs: list[Job]) -> None:
    """Queue one message per job, on its routed queue (worker/placement.py). A send that fails part-way
    leaves the unsent jobs `failed` with the reason (never `queued` without a message); the caller
    checked the broker just before. A job no live worker can take yet says why in its progress."""
    by_queue: dict[str, list[Job]] = {}
    for j in jobs:
        by_queue.setdefault(route(sweep.queue, sweep.suite, j.params), []).append(j)
    unsent: list[Job] = []
    error = None
    for queue, batch in by_queue.items():
        if error is not None:
            unsent += batch
            continue
        try:
            dispatcher.send([job_payload(j, sweep) for j in batch], queue)
        except SendError as exc:
            error = exc
            unsent += batch[exc.sent:]
            continue
        gpus = gpus_asked(sweep.suite, batch[0].params)
        note = placement_note(db, sweep.queue, gpus) if gpus else None
        if note:
            for j in batch:
                j.progress = note
            db.add_all(batch)
    now = time.time()
    for j in unsent:
        j.state, j.error, j.finished_at = "failed", f"could not queue the job: {error}", now
    db.add_all(unsent)
    db.commit()


def create_sweep(db: Session, dispatcher: Dispatcher | None, body: SweepCreate, settings: BackendSettings,
                 source: str = "api") -> tuple[Sweep, list[Job]]:
    """Validate, store the sweep and its jobs, then queue one task per job. Raises SweepInputError.

    Returns the sweep and its jobs as created (all `queued`, or all `failed` if the broker refused them).
    """
    repeats = body.repeats or 1
    if dispatcher is not None and body.timeout_s is not None and body.timeout_s > dispatcher.max_job_timeout_s:
        raise SweepInputError([{"loc": ["body", "timeout_s"], "type": "less_than_equal",
                                "msg": f"timeout_s {body.timeout_s:g} is above the limit of "
                                       f"{dispatcher.max_job_timeout_s:g} s (BENCHLAB_MAX_JOB_TIMEOUT_S)"}])
    cells = expand_grid(body.suite, body.params, settings.max_grid_cells // repeats if repeats > 1
                        else settings.max_grid_cells)
    sweep = Sweep(suite=body.suite, name=body.name, params=body.params, tags=body.tags or {}, repeats=repeats,
                  queue=body.queue or settings.default_queue, timeout_s=body.timeout_s,
                  fresh_process=body.fresh_process, source=source)
    db.add(sweep)
    db.flush()
    # repeats run in rounds (every cell once, then every cell again): the jobs are created, and so
    # queued, in that order. A slow drift of the host or of the GPU's clock then falls on every cell
    # of a round alike instead of on whichever cells ran during it, and a cell's runs lie apart in time.
    jobs = [Job(sweep_id=sweep.id, cell_index=i, repeat_index=r, params=cell)
            for r in range(repeats) for i, cell in enumerate(cells)]
    db.add_all(jobs)
    if dispatcher is not None:
        dispatcher.check()  # raises BrokerUnavailable before anything is committed
    db.commit()
    if dispatcher is not None:
        _send_or_record(db, dispatcher, sweep, jobs)
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


_ROW_KEYS = ("job_id", "cell", "repeat", "params", "state", "metrics", "nonfinite", "error", "worker", "attempts",
             "started_at", "finished_at", "duration_s", "env_id", "artifacts")
_JSON_KEYS = {"params": "{}", "metrics": "{}", "nonfinite": "[]", "artifacts": "[]"}


def _results_query(sweep_id: int, raw_json: bool):
    """One row per job with its latest result. raw_json: JSON columns come back as their stored text."""
    latest = (select(Result.job_id, func.max(Result.id).label("rid")).join(Job, Job.id == Result.job_id)
              .where(Job.sweep_id == sweep_id).group_by(Result.job_id).subquery())
    as_text = (lambda c: cast(c, Text)) if raw_json else (lambda c: c)  # noqa: E731 (a one-line column mapper)
    return (select(Job.id, Job.cell_index, Job.repeat_index, as_text(Job.params), Job.state, as_text(Result.metrics),
                   as_text(Result.nonfinite), Job.error, Job.worker, Job.attempts, Job.started_at, Job.finished_at,
                   Result.duration_s, Job.env_id, as_text(Result.artifacts))
            .where(Job.sweep_id == sweep_id)
            .outerjoin(latest, latest.c.job_id == Job.id)
            .outerjoin(Result, Result.id == latest.c.rid)
            .order_by(Job.cell_index, Job.repeat_index))


def result_rows(db: Session, sweep_id: int) -> list[dict[str, Any]]:
    """One row per job: params, state, the latest attempt's metrics, error. One query, no ORM objects."""
    rows = []
    for values in db.exec(_results_query(sweep_id, raw_json=False)).all():
        row = dict(zip(_ROW_KEYS, values, strict=True))
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
            p + ((v if v and v != "null" else e) if j else enc(v))
            for p, v, j, e in zip(prefixes, values, json_keys, empties, strict=True)) + "}")
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
        val = lambda v: json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v)  # noqa: E731 (a one-line cell formatter)
        first_error_line = (r["error"] or "").split("\n", 1)[0]
        w.writerow([r["job_id"], r["cell"], r["repeat"], r["state"], *[val(r["params"].get(k)) for k in param_keys],
                    *[val(r["metrics"].get(k)) for k in metric_keys], first_error_line])
    return buf.getvalue()


def retry_sweep(db: Session, dispatcher: Dispatcher | None, sweep: Sweep) -> int:
    """Re-queue the failed, OOM and timed-out cells (new attempt number). Returns how many."""
    if dispatcher is not None:
        dispatcher.check()
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
        _send_or_record(db, dispatcher, sweep, jobs)
    return len(jobs)


def cancel_sweep(db: Session, dispatcher: Dispatcher | None, sweep: Sweep) -> int:
    """Mark the sweep cancelled on the broker and in the database. Queued jobs become `cancelled` at
    once (a worker skips their messages); a worker running one of its jobs sees the mark within a
    second, kills the cell and reports it `cancelled`. Returns how many queued jobs were cancelled."""
    if dispatcher is not None:
        dispatcher.check()
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
            "metrics": latest.metrics if latest else {}, "nonfinite": (latest.nonfinite or []) if latest else [],
            "artifacts": latest.artifacts if latest else [],
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


def _add_result(db: Session, job: Job, attempt: int, state: str, replace: bool = False, **fields) -> bool:
    """Write the result of (job, attempt) unless one is stored already (results are idempotent), or
    with `replace` over the stored one. Returns whether it wrote."""
    row = db.exec(select(Result).where(Result.job_id == job.id, Result.attempt == attempt)).first()
    if row is None:
        db.add(Result(job_id=job.id, attempt=attempt, state=state, **fields))
        return True
    if not replace:
        return False
    row.state = state
    for name, value in fields.items():
        setattr(row, name, value)
    db.add(row)
    return True


def apply_event(db: Session, event: StateEvent | ProgressEvent | ResultEvent | HeartbeatEvent | dict) -> bool:
    """Write one worker message to the database (a dict is validated first: pydantic.ValidationError).
    Returns whether it changed anything.

    Stale messages (an earlier attempt of a retried job, a `running` after a final state, a second
    result for the same attempt) are dropped. One exception: the result of an attempt the reaper
    declared lost (and nobody retried since) replaces that verdict, since the worker did finish it.
    """
    if isinstance(event, dict):
        event = parse_event(event)
    if isinstance(event, HeartbeatEvent):
        record_heartbeat(db, event)
        return True
    job = db.get(Job, event.job_id)
    if job is None or event.attempt < job.attempts:
        return False
    if isinstance(event, StateEvent):
        if job.state in FINAL_STATES:
            return False
        job.state, job.worker, job.started_at = event.state, event.worker, event.at
    elif isinstance(event, ProgressEvent):
        if job.state in FINAL_STATES:
            return False
        job.progress = event.message
    else:
        if job.state == "cancelled" and event.state == "cancelled":
            return False
        env_id = environment_id(db, event.env)
        # the reaper's verdict was a guess from silence: the worker's own result is what happened
        if not _add_result(db, job, event.attempt, event.state, replace=_declared_lost(job, event.attempt),
                           metrics=event.metrics, nonfinite=event.nonfinite, artifacts=event.artifacts,
                           duration_s=event.duration_s, env_id=env_id):
            return False
        job.state, job.error = event.state, event.error
        job.worker = event.worker or job.worker
        job.finished_at = event.at
        job.env_id = env_id or job.env_id
        if job.started_at is None and event.duration_s is not None:
            job.started_at = job.finished_at - event.duration_s
    db.add(job)
    db.commit()
    return True


def record_heartbeat(db: Session, hb: HeartbeatEvent) -> None:
    row = db.get(WorkerRow, hb.worker)
    if row is None:
        row = WorkerRow(name=hb.worker, first_seen=hb.at, last_seen=hb.at)
    elif row.last_seen > hb.at:
        return  # an older heartbeat delivered late
    row.hostname, row.pid, row.queues, row.gpus, row.commit = hb.hostname, hb.pid, hb.queues, hb.gpus, hb.commit
    row.current_job = hb.current.job_id if hb.current else None
    row.current_attempt = hb.current.attempt if hb.current else None
    row.last_seen, row.stopping = hb.at, hb.stopping
    db.add(row)
    db.commit()


LOST = "worker lost: "  # the start of the error of every job the reaper closed


def _declared_lost(job: Job, attempt: int) -> bool:
    """Whether `attempt` is the job's latest and the reaper, not its worker, closed it."""
    return attempt == job.attempts and job.state == "failed" and (job.error or "").startswith(LOST)


def _fail_lost(db: Session, job: Job, reason: str, now: float) -> None:
    _add_result(db, job, job.attempts, "failed", metrics={}, nonfinite=[], artifacts=[],
                duration_s=(now - job.started_at) if job.started_at else None)
    job.state, job.error, job.finished_at, job.progress = "failed", LOST + reason, now, None
    db.add(job)


def reap_lost_jobs(db: Session, now: float, lost_after_s: float, default_timeout_s: float,
                   grace_s: float, heard: tuple[float, float] | None = None) -> list[int]:
    """Mark `failed: worker lost` (retryable) every job that cannot end on its own:
    - the job a worker was running (or `running` under a worker's name) when that worker went silent
      for `lost_after_s`, or stopped;
    - a `running` job past its timeout plus `grace_s` (its worker would have killed it by then).
    `heard` = (since, until) is the span over which the caller received every heartbeat sent: for
    the recorder, from its last connect to the broker to the last time it found the queue empty.
    Silence outside it is the recorder's own (a restart, a backlog), so a worker is gone only when
    it was silent for `lost_after_s` inside it. None: heard everything until `now`.
    Returns the ids of the jobs marked.
    """
    reaped: list[int] = []
    since, until = heard or (float("-inf"), now)
    cutoff = until - lost_after_s
    gone = {w.name: w for w in db.exec(select(WorkerRow).where(WorkerRow.last_seen < cutoff)).all()
            } if since <= cutoff else {}
    live_current = {(w.current_job, w.current_attempt) for w in db.exec(
        select(WorkerRow).where(WorkerRow.last_seen >= cutoff)).all() if w.current_job} if gone else set()
    for w in gone.values():
        if w.current_job is None:
            continue
        job = db.get(Job, w.current_job)
        if (job is not None and job.state in UNFINISHED_STATES and job.attempts == w.current_attempt
                and (job.id, job.attempts) not in live_current):
            _fail_lost(db, job, f"{w.name} stopped sending heartbeats {now - w.last_seen:.0f} s ago", now)
            reaped.append(job.id)
    running = db.exec(select(Job, Sweep.timeout_s).join(Sweep, Sweep.id == Job.sweep_id)
                      .where(Job.state == "running")).all()
    for job, timeout_s in running:
        if job.id in reaped:
            continue
        if job.worker in gone and (job.id, job.attempts) not in live_current:
            _fail_lost(db, job, f"{job.worker} stopped sending heartbeats "
                                f"{now - gone[job.worker].last_seen:.0f} s ago", now)
            reaped.append(job.id)
        elif job.started_at is not None and now > job.started_at + (timeout_s or default_timeout_s) + grace_s:
            _fail_lost(db, job, f"still running {now - job.started_at:.0f} s after it started, past its timeout "
                                f"of {timeout_s or default_timeout_s:g} s plus {grace_s:g} s", now)
            reaped.append(job.id)
    if reaped:
        db.commit()
    return reaped


MAX_DEAD_LETTER_BYTES = 65536


def store_dead_letter(db: Session, body: Any, error: str, tries: int = 1) -> DeadLetter:
    try:
        text = body if isinstance(body, str) else json.dumps(body, default=repr)
    except (TypeError, ValueError):
        text = repr(body)
    text = text.encode("utf-8", "replace").decode("utf-8")[:MAX_DEAD_LETTER_BYTES]
    row = DeadLetter(body=text, error=error[:4000], tries=tries)
    db.add(row)
    db.commit()
    return row


def artifact_source(source_dir: Path, rel: str) -> Path:
    """The folder a file names for its artifacts, `rel` to the file's folder: a ValueError unless it lies
    inside that folder and is there."""
    folder = (source_dir / rel).resolve()
    if not folder.is_relative_to(source_dir.resolve()):
        raise ValueError(f"artifact folder {rel!r} is outside the file's folder")
    if not folder.is_dir():
        raise ValueError(f"artifact folder {rel!r} is missing beside the file")
    return folder


def artifact_files(folder: Path, names: Iterable[str] | None = None) -> list[Path]:
    """The plain files with safe names in `folder` (only those of `names` it holds, when given; a name
    that is not safe, '../x' say, is never looked up)."""
    names = sorted(f.name for f in folder.iterdir()) if names is None else names
    files = [folder / n for n in names if SAFE_ARTIFACT_NAME.fullmatch(n)]
    return [f for f in files if f.is_file() and not f.is_symlink()]


def copy_artifacts(files: Iterable[Path], dest: Path) -> int:
    """Copy artifact files into a job attempt's folder; how many. Call it once the rows that list them are
    committed: a rolled-back job's id is handed out again, and its folder must not hold files then."""
    n = 0
    for f in files:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest / f.name)
        n += 1
    return n


class AlreadyImported(Exception):
    """The run file's uid names a sweep in the database already."""

    def __init__(self, sweep_id: int):
        super().__init__(f"this run was imported already, as sweep {sweep_id}")
        self.sweep_id = sweep_id


def import_results(db: Session, lines: list[dict[str, Any]], name: str | None = None,
                   source_dir: Path | None = None, artifact_root: Path | None = None) -> Sweep:
    """Load a `benchlab run --out` file: a header line {"kind": "sweep", ...} then one {"kind": "cell", ...} per job.
    With `source_dir` and `artifact_root`, each cell's artifacts are copied from beside the file.
    A header with a uid that a sweep has already raises AlreadyImported and adds nothing."""
    from pydantic import ValidationError

    from worker.suites import suite_names

    raw_header = next((ln for ln in lines if isinstance(ln, dict) and ln.get("kind") == "sweep"), None)
    raw_cells = [ln for ln in lines if isinstance(ln, dict) and ln.get("kind") == "cell"]
    if raw_header is None or not raw_cells:
        raise ValueError("not a benchlab run file: it needs a 'sweep' header line and at least one 'cell' line")
    try:
        for i, line in enumerate(lines, 1):
            no_surrogates(line, f"line {i}")
        header = RunHeader.model_validate(raw_header)
        cells = [RunCell.model_validate(c) for c in raw_cells]
        # the header's name, tags and params as the API takes a sweep's (lengths, counts)
        SweepCreate.model_validate({"suite": header.suite, "name": name or header.name, "params": header.params,
                                    "tags": header.tags, "repeats": header.repeats})
    except ValidationError as exc:
        raise ValueError(first_error(exc)) from None
    if header.suite not in suite_names():
        raise ValueError(f"unknown suite {header.suite!r} in the header; known: {', '.join(suite_names())}")
    if header.uid is not None:
        found = db.exec(select(Sweep.id).where(Sweep.uid == header.uid)).first()
        if found is not None:
            raise AlreadyImported(found)
    # every artifact folder checked before anything is written
    folders = {i: artifact_source(source_dir, c.artifact_dir) for i, c in enumerate(cells)
               if c.artifact_dir and source_dir is not None and artifact_root is not None}
    sweep = Sweep(suite=header.suite, name=name or header.name, params=header.params, tags=header.tags,
                  repeats=header.repeats, source="import")
    if header.uid is not None:
        sweep.uid = header.uid
    db.add(sweep)
    db.flush()
    copies = []
    for i, c in enumerate(cells):
        env_id = environment_id(db, c.env or header.env)
        job = Job(sweep_id=sweep.id, cell_index=c.cell, repeat_index=c.repeat, params=c.params, state=c.state,
                  error=c.error, worker=c.worker, env_id=env_id, started_at=c.started_at, finished_at=c.finished_at)
        db.add(job)
        db.flush()
        files = artifact_files(folders[i]) if i in folders else []  # listed once: the row and the copy agree
        if files:
            copies.append((files, artifact_dir(artifact_root, job.id)))
        db.add(Result(job_id=job.id, state=c.state, metrics=c.metrics, nonfinite=c.nonfinite,
                      artifacts=[{"name": f.name, "size": f.stat().st_size} for f in files],
                      duration_s=c.duration_s, env_id=env_id))
    db.commit()
    for files, dest in copies:
        copy_artifacts(files, dest)
    return sweep


def progress_lines(db: Session, sweep_id: int) -> dict[int, str]:
    """The latest progress line of each running job of a sweep."""
    rows = db.exec(select(Job.id, Job.progress).where(Job.sweep_id == sweep_id, Job.state == "running")).all()
    return {jid: p for jid, p in rows if p}


def sweep_version(db: Session, sweep_id: int, counts: dict[str, int] | None = None, suite: str | None = None) -> str:
    """A short key that changes whenever anything the sweep page shows changes: job states, results
    (their newest id), attempts and progress lines; for a `ddp` sweep also the newest all-reduce
    result anywhere, since its charts draw the fit of the latest all-reduce sweep (comm_model).
    `counts`: the job states if already read."""
    jobs = db.exec(select(func.count(), func.sum(Job.attempts), func.max(Job.finished_at), func.max(Job.started_at))
                   .where(Job.sweep_id == sweep_id)).one()
    newest = db.exec(select(func.max(Result.id)).join(Job, Job.id == Result.job_id)
                     .where(Job.sweep_id == sweep_id)).one()
    progress = sorted(progress_lines(db, sweep_id).items())
    counts = sorted((counts if counts is not None else state_counts(db, [sweep_id])[sweep_id]).items())
    fit_source = None
    if suite == "ddp":
        fit_source = db.exec(select(func.max(Result.id)).join(Job, Job.id == Result.job_id)
                             .join(Sweep, Sweep.id == Job.sweep_id).where(Sweep.suite == "allreduce")).one()
    raw = json.dumps([list(jobs), newest, counts, progress, fit_source], default=str)
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def environments(db: Session, rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The fingerprints the rows' jobs ran with, by environment id."""
    return {i: db.get(Environment, i).data for i in {r["env_id"] for r in rows if r["env_id"]}}


def _gpu_of(db: Session, rows: list[dict[str, Any]]) -> str | None:
    env_id = next((r["env_id"] for r in rows if r.get("env_id")), None)
    env = db.get(Environment, env_id) if env_id else None
    return (env.data or {}).get("gpu_name") if env else None


def comm_model(db: Session, sweep: Sweep, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The all-reduce fit (backend/commfit.py) a sweep's charts draw, or None.

    allreduce sweep: fitted on its own cells, one fit per world size.
    ddp sweep: fitted on the latest allreduce sweep with two or more sizes at the same world size and
    collective backend, on the same GPU model; with the predicted overhead curve over the bucket
    sizes and the predicted best bucket size for the model's gradient bytes.
    """
    if sweep.suite == "allreduce":
        fits = {}
        for ws in sorted({r["params"].get("world_size") for r in rows if r["state"] == "done"}, key=str):
            try:
                fits[str(ws)] = commfit.fit_latency_bandwidth(commfit.allreduce_points(rows, ws))
            except ValueError:
                continue
        return {"fits": fits} if fits else None
    if sweep.suite != "ddp":
        return None
    done = [r for r in rows if r["state"] == "done" and (r["metrics"] or {}).get("grad_bytes")]
    if not done:
        return None
    m = done[0]["metrics"]
    world, backend, gpu = m.get("world_size"), m.get("backend"), _gpu_of(db, done)
    candidates = db.exec(select(Sweep).where(Sweep.suite == "allreduce").order_by(Sweep.id.desc()).limit(50)).all()
    for cand in candidates:
        cand_rows = result_rows(db, cand.id)
        same = [r for r in cand_rows if r["state"] == "done" and (r["metrics"] or {}).get("backend") == backend]
        if gpu != _gpu_of(db, same):
            continue
        try:
            fit = commfit.fit_latency_bandwidth(commfit.allreduce_points(same, world))
        except ValueError:
            continue
        total = float(m["grad_bytes"])
        sizes = [r["params"].get("bucket_size_mb") for r in done if isinstance(r["params"].get("bucket_size_mb"),
                                                                              (int, float))]
        lo, hi = min([*sizes, 1.0]) / 2, max([*sizes, 1000.0]) * 2
        return {"sweep_id": cand.id, **fit, "grad_bytes": total,
                "best_bucket_mb": commfit.best_bucket_bytes(total, fit) / commfit.MB,
                "curve": commfit.bucket_curve(total, fit, lo, hi)}
    return None
