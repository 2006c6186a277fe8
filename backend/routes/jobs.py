from __future__ import annotations

import re
import shutil

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse

from backend import service
from backend.deps import ReadAuth, SessionDep, SettingsDep, WriteAuth
from backend.models import Job

router = APIRouter(prefix="/api/jobs", tags=["jobs"])
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def _get_job(db, job_id: int) -> Job:
    job = db.get(Job, job_id)
    if job is None:
        raise HTTPException(404, detail=f"job {job_id} not found")
    return job


def _artifact_path(settings, job_id: int, name: str):
    if not _SAFE_NAME.match(name):
        raise HTTPException(422, detail=f"bad artifact name {name!r}: letters, digits, '.', '_', '-' only")
    return settings.artifact_root / f"job_{job_id}" / name


@router.get("/{job_id}", dependencies=[ReadAuth])
def get_job(job_id: int, db: SessionDep) -> dict:
    return service.job_detail(db, _get_job(db, job_id))


@router.get("/{job_id}/artifacts/{name}", dependencies=[ReadAuth])
def get_artifact(job_id: int, name: str, db: SessionDep, settings: SettingsDep):
    _get_job(db, job_id)
    path = _artifact_path(settings, job_id, name)
    if not path.is_file():
        raise HTTPException(404, detail=f"job {job_id} has no artifact {name!r}")
    return FileResponse(path, filename=name)  # streamed from disk in chunks


@router.put("/{job_id}/artifacts/{name}", status_code=201, dependencies=[WriteAuth])
async def put_artifact(job_id: int, name: str, request: Request, db: SessionDep, settings: SettingsDep) -> dict:
    """Upload an artifact (a GPU host that shares no disk with the API). The body is streamed to disk."""
    _get_job(db, job_id)
    path = _artifact_path(settings, job_id, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    size = 0
    with tmp.open("wb") as f:
        async for chunk in request.stream():
            f.write(chunk)
            size += len(chunk)
    shutil.move(tmp, path)
    return {"job_id": job_id, "name": name, "size": size}
