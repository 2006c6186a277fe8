"""Backup and transfer: sweeps with their jobs, results and environments as JSON lines.

    {"kind": "benchlab-export", "v": 1, "schema": "<revision>", "exported_at": ...}
    {"kind": "environment", "digest", "data", "created_at"}
    {"kind": "sweep", "uid", "suite", "name", "params", "tags", "repeats", "queue", ...}
    {"kind": "job", "sweep_uid", "cell_index", "repeat_index", "params", "state", ...}
    {"kind": "result", "sweep_uid", "cell_index", "repeat_index", "attempt", "state", "metrics", ...}

Rows refer to each other by stable keys (a sweep's uid, a job's cell and repeat, an environment's
digest), never by database ids, so an export loads into any database. Importing a sweep whose
uid is present already skips it: importing the same file twice changes nothing.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from sqlmodel import Session, select

from backend.models import Environment, Job, Result, Sweep

EXPORT_KIND = "benchlab-export"
EXPORT_VERSION = 1
_SWEEP_FIELDS = ("uid", "suite", "name", "params", "tags", "repeats", "queue", "timeout_s", "created_at",
                 "cancelled_at", "source", "fresh_process")
_JOB_FIELDS = ("cell_index", "repeat_index", "params", "state", "attempts", "worker", "progress", "error",
               "created_at", "started_at", "finished_at")
_RESULT_FIELDS = ("attempt", "state", "metrics", "nonfinite", "artifacts", "duration_s", "created_at")


def export_lines(db: Session, schema: str, sweep_ids: list[int] | None = None) -> Iterator[dict[str, Any]]:
    yield {"kind": EXPORT_KIND, "v": EXPORT_VERSION, "schema": schema, "exported_at": time.time()}
    q = select(Sweep).order_by(Sweep.id)
    if sweep_ids:
        q = q.where(Sweep.id.in_(sweep_ids))
    sweeps = db.exec(q).all()
    envs: dict[int, Environment] = {}
    jobs_by_sweep = {}
    for s in sweeps:
        jobs = db.exec(select(Job).where(Job.sweep_id == s.id).order_by(Job.id)).all()
        jobs_by_sweep[s.id] = jobs
        env_ids = {j.env_id for j in jobs if j.env_id}
        env_ids |= {r.env_id for r in db.exec(select(Result).join(Job, Job.id == Result.job_id)
                                              .where(Job.sweep_id == s.id)).all() if r.env_id}
        for eid in env_ids - set(envs):
            envs[eid] = db.get(Environment, eid)
    for e in envs.values():
        yield {"kind": "environment", "digest": e.digest, "data": e.data, "created_at": e.created_at}
    for s in sweeps:
        yield {"kind": "sweep", **{f: getattr(s, f) for f in _SWEEP_FIELDS}}
        for j in jobs_by_sweep[s.id]:
            key = {"sweep_uid": s.uid, "cell_index": j.cell_index, "repeat_index": j.repeat_index}
            yield {"kind": "job", **key, **{f: getattr(j, f) for f in _JOB_FIELDS},
                   "env_digest": envs[j.env_id].digest if j.env_id else None}
            for r in db.exec(select(Result).where(Result.job_id == j.id).order_by(Result.attempt)).all():
                yield {"kind": "result", **key, **{f: getattr(r, f) for f in _RESULT_FIELDS},
                       "nonfinite": r.nonfinite or [], "artifacts": r.artifacts or [], "metrics": r.metrics or {},
                       "env_digest": envs[r.env_id].digest if r.env_id else None}


def import_lines(db: Session, lines: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Load an export; returns counts of what was added and skipped. Raises ValueError on a bad file."""
    lines = list(lines)
    if not lines or lines[0].get("kind") != EXPORT_KIND:
        raise ValueError(f"not a benchlab export: the first line must be {{\"kind\": \"{EXPORT_KIND}\", ...}}")
    if int(lines[0].get("v", 0)) > EXPORT_VERSION:
        raise ValueError(f"export version {lines[0].get('v')} is newer than this benchlab's {EXPORT_VERSION}")
    counts = {"sweeps": 0, "jobs": 0, "results": 0, "environments": 0, "sweeps_skipped": 0}
    env_ids: dict[str, int] = {}
    sweeps: dict[str, Sweep | None] = {}
    jobs: dict[tuple, Job] = {}
    for n, ln in enumerate(lines[1:], start=2):
        kind = ln.get("kind")
        try:
            if kind == "environment":
                found = db.exec(select(Environment).where(Environment.digest == ln["digest"])).first()
                if found is None:
                    found = Environment(digest=ln["digest"], data=ln["data"], created_at=ln["created_at"])
                    db.add(found)
                    db.flush()
                    counts["environments"] += 1
                env_ids[ln["digest"]] = found.id
            elif kind == "sweep":
                if db.exec(select(Sweep.id).where(Sweep.uid == ln["uid"])).first() is not None:
                    sweeps[ln["uid"]] = None
                    counts["sweeps_skipped"] += 1
                    continue
                s = Sweep(**{f: ln[f] for f in _SWEEP_FIELDS if f in ln})
                db.add(s)
                db.flush()
                sweeps[s.uid] = s
                counts["sweeps"] += 1
            elif kind == "job":
                s = sweeps[ln["sweep_uid"]]
                if s is None:
                    continue
                j = Job(sweep_id=s.id, env_id=env_ids.get(ln.get("env_digest")),
                        **{f: ln[f] for f in _JOB_FIELDS if f in ln})
                db.add(j)
                db.flush()
                jobs[(ln["sweep_uid"], ln["cell_index"], ln["repeat_index"])] = j
                counts["jobs"] += 1
            elif kind == "result":
                if sweeps[ln["sweep_uid"]] is None:
                    continue
                j = jobs[(ln["sweep_uid"], ln["cell_index"], ln["repeat_index"])]
                db.add(Result(job_id=j.id, env_id=env_ids.get(ln.get("env_digest")),
                              **{f: ln[f] for f in _RESULT_FIELDS if f in ln}))
                counts["results"] += 1
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (KeyError, TypeError) as exc:
            db.rollback()
            raise ValueError(f"line {n} ({kind}): missing or bad field {exc}") from None
        except ValueError as exc:
            db.rollback()
            raise ValueError(f"line {n}: {exc}") from None
    db.commit()
    return counts


def dumps_line(row: dict[str, Any]) -> str:
    return json.dumps(row, allow_nan=False)
