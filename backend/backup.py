"""Backup and transfer: sweeps with their jobs, results and environments as JSON lines.

    {"kind": "benchlab-export", "v": 1, "schema": "<revision>", "exported_at": ...}
    {"kind": "environment", "digest", "data", "created_at"}
    {"kind": "sweep", "uid", "suite", "name", "params", "tags", "repeats", "queue", ...}
    {"kind": "job", "sweep_uid", "cell_index", "repeat_index", "params", "state", ...}
    {"kind": "result", "sweep_uid", "cell_index", "repeat_index", "attempt", "state", "metrics", ...,
     "artifact_dir": "backup.jsonl.artifacts/result_7"}   (only where its artifacts were carried)

Rows refer to each other by stable keys (a sweep's uid, a job's cell and repeat, an environment's
digest), never by database ids, so an export loads into any database. Importing a sweep whose
uid is present already skips it: importing the same file twice changes nothing.

Artifacts (profiler traces, memory snapshots) travel as files in a folder beside the export file
(`ArtifactCopy`): each result's own folder, named in its line relative to the file's folder, as a
`benchlab run --out` file names its cells' folders.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from sqlmodel import Session, select

from backend.models import JOB_STATES, Environment, Job, Result, Sweep, SweepCreate, first_error, no_surrogates
from backend.service import SAFE_ARTIFACT_NAME, artifact_files, artifact_source, copy_artifacts
from worker.contract import MAX_INDEX, FinalState, clean_metrics
from worker.settings import artifact_dir

EXPORT_KIND = "benchlab-export"
EXPORT_VERSION = 1
_SWEEP_FIELDS = ("uid", "suite", "name", "params", "tags", "repeats", "queue", "timeout_s", "created_at",
                 "cancelled_at", "source", "fresh_process")
_JOB_FIELDS = ("cell_index", "repeat_index", "params", "state", "attempts", "worker", "progress", "error",
               "created_at", "started_at", "finished_at")
_RESULT_FIELDS = ("attempt", "state", "metrics", "nonfinite", "artifacts", "duration_s", "created_at")


@dataclass(frozen=True)
class ArtifactCopy:
    """Artifacts carried with an export: `root` is this database's artifact root (what an export reads,
    an import fills), `beside` the export file's folder, `folder` the name of theirs in it."""

    root: Path
    beside: Path
    folder: str

    @classmethod
    def for_file(cls, root: Path, path: Path) -> ArtifactCopy:
        return cls(root, path.parent, f"{path.name}.artifacts")


def export_lines(db: Session, schema: str, sweep_ids: list[int] | None = None,
                 artifacts: ArtifactCopy | None = None) -> Iterator[dict[str, Any]]:
    """The export's lines. With `artifacts`, each result's files still on disk are copied beside the file
    and its line names their folder (a file pruned by retention stays listed, and is not carried)."""
    n_results = 0
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
                line = {"kind": "result", **key, **{f: getattr(r, f) for f in _RESULT_FIELDS},
                        "nonfinite": r.nonfinite or [], "artifacts": r.artifacts or [], "metrics": r.metrics or {},
                        "env_digest": envs[r.env_id].digest if r.env_id else None}
                n_results += 1
                if artifacts is not None and r.artifacts:
                    rel = f"{artifacts.folder}/result_{n_results}"
                    files = artifact_files(artifact_dir(artifacts.root, j.id, r.attempt),
                                           [str(a.get("name", "")) for a in r.artifacts])
                    if copy_artifacts(files, artifacts.beside / rel):
                        line["artifact_dir"] = rel
                yield line


# What an import takes of each row, checked before anything is written: the kinds and bounds the API and
# the recorder would have stored (a hand-edited or foreign file cannot put a state no page knows, a NaN,
# or an integer the database cannot hold into the database).
Time = Field(None, allow_inf_nan=False)  # a moment that may be unknown
Created = Field(default_factory=time.time, allow_inf_nan=False)  # a row's creation: always known
Index = Field(ge=0, le=MAX_INDEX)


class EnvironmentLine(BaseModel):
    digest: str = Field(min_length=1, max_length=64)
    data: dict[str, Any]
    created_at: float = Created


class SweepLine(BaseModel):
    uid: str = Field(min_length=1, max_length=64)
    suite: str
    name: str | None = None
    params: Any = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    repeats: int = 1
    queue: str = "default"
    timeout_s: float | None = None
    created_at: float = Created
    cancelled_at: float | None = Time
    source: str = Field("import", max_length=20)
    fresh_process: bool = False

    @model_validator(mode="after")
    def _as_the_api_takes_it(self):  # name, tags, params, repeats, queue and timeout within the API's limits
        SweepCreate.model_validate({"suite": self.suite, "name": self.name, "params": self.params, "tags": self.tags,
                                    "repeats": self.repeats, "queue": self.queue, "timeout_s": self.timeout_s})
        return self


class JobLine(BaseModel):
    sweep_uid: str
    cell_index: int = Index
    repeat_index: int = Field(0, ge=0, le=MAX_INDEX)
    params: dict[str, Any] = Field(default_factory=dict)
    state: str
    attempts: int = Field(1, ge=0, le=MAX_INDEX)
    worker: str | None = None
    progress: str | None = None
    error: str | None = None
    created_at: float = Created
    started_at: float | None = Time
    finished_at: float | None = Time
    env_digest: str | None = None

    @field_validator("state")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in JOB_STATES:
            raise ValueError(f"unknown job state {v!r}; expected one of {', '.join(JOB_STATES)}")
        return v


class ArtifactLine(BaseModel):
    name: str
    size: int = Field(ge=0, le=MAX_INDEX)

    @field_validator("name")
    @classmethod
    def _safe(cls, v: str) -> str:  # as an upload's name: the file it names lives in the job's own folder
        if not SAFE_ARTIFACT_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not an artifact name (letters, digits, '.', '_', '-'; 1-200)")
        return v


class ResultLine(BaseModel):
    sweep_uid: str
    cell_index: int = Index
    repeat_index: int = Field(0, ge=0, le=MAX_INDEX)
    attempt: int = Field(1, ge=1, le=MAX_INDEX)
    state: FinalState
    metrics: dict[str, Any] = Field(default_factory=dict)
    nonfinite: list[str] = Field(default_factory=list)
    artifacts: list[ArtifactLine] = Field(default_factory=list)
    duration_s: float | None = Time
    created_at: float = Created
    env_digest: str | None = None
    artifact_dir: str | None = Field(None, min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _finite_metrics(self):  # as the recorder stores them: NaN and infinities as null, named
        self.metrics, bad = clean_metrics(self.metrics)
        self.nonfinite = sorted(set(self.nonfinite) | set(bad))
        return self


_LINES = {"environment": EnvironmentLine, "sweep": SweepLine, "job": JobLine, "result": ResultLine}


def _checked(n: int, line: Any) -> BaseModel:
    """Line n as its kind's row model, or a ValueError naming the line and the field."""
    if not isinstance(line, dict) or line.get("kind") not in _LINES:
        kind = line.get("kind") if isinstance(line, dict) else type(line).__name__
        raise ValueError(f"line {n}: unknown kind {kind!r}")
    no_surrogates(line, f"line {n}")
    try:
        return _LINES[line["kind"]].model_validate(line)
    except ValidationError as exc:
        raise ValueError(f"line {n} ({line['kind']}): {first_error(exc)}") from None


def _set(row: BaseModel, fields: tuple[str, ...]) -> dict[str, Any]:
    """The given fields of a checked row that the file gave (left out: the table's default)."""
    return {f: getattr(row, f) for f in fields if f in row.model_fields_set}


def _artifact_source(n: int, row: ResultLine, artifacts: ArtifactCopy | None) -> Path | None:
    """The folder a result line's artifacts are carried in, checked (service.artifact_source); None where
    the line names none or the import takes no artifacts."""
    if row.artifact_dir is None or artifacts is None:
        return None
    try:
        return artifact_source(artifacts.beside, row.artifact_dir)
    except ValueError as exc:
        raise ValueError(f"line {n} (result): {exc}") from None


def import_lines(db: Session, lines: Iterable[dict[str, Any]], artifacts: ArtifactCopy | None = None
                 ) -> dict[str, int]:
    """Load an export; returns counts of what was added and skipped. Raises ValueError on a bad file.
    With `artifacts`, the files carried beside the file go to each imported result's attempt folder."""
    lines = list(lines)
    if not lines or not isinstance(lines[0], dict) or lines[0].get("kind") != EXPORT_KIND:
        raise ValueError(f"not a benchlab export: the first line must be {{\"kind\": \"{EXPORT_KIND}\", ...}}")
    version = lines[0].get("v", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"not a benchlab export: its version {version!r} is not a whole number")
    if version > EXPORT_VERSION:
        raise ValueError(f"export version {lines[0].get('v')} is newer than this benchlab's {EXPORT_VERSION}")
    rows = [(n, _checked(n, ln)) for n, ln in enumerate(lines[1:], start=2)]  # all of them, before any write
    sources = {n: _artifact_source(n, row, artifacts) for n, row in rows if isinstance(row, ResultLine)}
    counts = {"sweeps": 0, "jobs": 0, "results": 0, "environments": 0, "sweeps_skipped": 0, "artifacts": 0}
    copies: list[tuple[list[Path], Path]] = []  # made once the rows are committed (service.copy_artifacts)
    env_ids: dict[str, int] = {}
    sweeps: dict[str, Sweep | None] = {}
    jobs: dict[tuple, Job] = {}
    for n, row in rows:
        try:
            if isinstance(row, EnvironmentLine):
                found = db.exec(select(Environment).where(Environment.digest == row.digest)).first()
                if found is None:
                    found = Environment(digest=row.digest, data=row.data, **_set(row, ("created_at",)))
                    db.add(found)
                    db.flush()
                    counts["environments"] += 1
                env_ids[row.digest] = found.id
            elif isinstance(row, SweepLine):
                if db.exec(select(Sweep.id).where(Sweep.uid == row.uid)).first() is not None:
                    sweeps[row.uid] = None
                    counts["sweeps_skipped"] += 1
                    continue
                s = Sweep(**_set(row, _SWEEP_FIELDS))
                db.add(s)
                db.flush()
                sweeps[s.uid] = s
                counts["sweeps"] += 1
            elif isinstance(row, JobLine):
                s = sweeps[row.sweep_uid]
                if s is None:
                    continue
                j = Job(sweep_id=s.id, env_id=env_ids.get(row.env_digest), **_set(row, _JOB_FIELDS))
                db.add(j)
                db.flush()
                jobs[(row.sweep_uid, row.cell_index, row.repeat_index)] = j
                counts["jobs"] += 1
            else:
                if sweeps[row.sweep_uid] is None:
                    continue
                j = jobs[(row.sweep_uid, row.cell_index, row.repeat_index)]
                fields = {f: getattr(row, f) for f in ("attempt", "state", "metrics", "nonfinite", "duration_s")}
                db.add(Result(job_id=j.id, env_id=env_ids.get(row.env_digest), **fields,
                              artifacts=[a.model_dump() for a in row.artifacts], **_set(row, ("created_at",))))
                counts["results"] += 1
                if sources[n] is not None:
                    files = artifact_files(sources[n], [a.name for a in row.artifacts])
                    copies.append((files, artifact_dir(artifacts.root, j.id, row.attempt)))
        except KeyError as exc:
            db.rollback()
            raise ValueError(f"line {n}: it names {exc} before the line that defines it") from None
    db.commit()
    for files, dest in copies:
        counts["artifacts"] += copy_artifacts(files, dest)
    return counts


def dumps_line(row: dict[str, Any]) -> str:
    return json.dumps(row, allow_nan=False)
