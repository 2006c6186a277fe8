"""/api/jobs: one job's detail, and its artifacts (download; upload by workers that share no disk)."""
from __future__ import annotations

import os
import uuid
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import FileResponse

from backend import service
from backend.deps import ReadAuth, SessionDep, SettingsDep, WriteAuth
from backend.errors import CONFLICT, NOT_FOUND
from backend.models import ArtifactStored, ErrorPublic, Job, JobPublic
from worker.contract import MAX_INDEX

router = APIRouter(prefix="/api/jobs", tags=["jobs"])
_SAFE_NAME = service.SAFE_ARTIFACT_NAME
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="a job's id")]
TOO_LARGE = {413: {"model": ErrorPublic, "description": "Artifact over BENCHLAB_MAX_ARTIFACT_MB"}}


def _get_job(db, job_id: int) -> Job:
    job = db.get(Job, job_id)
    if job is None:
        raise HTTPException(404, detail=f"job {job_id} not found")
    return job


Attempt = Annotated[int | None, Query(ge=1, le=MAX_INDEX, description="which attempt of the job (a retry is "
                                                                      "another); default: the newest that has it")]


def _artifact_path(settings, job_id: int, name: str, attempt: int = 1):
    if not _SAFE_NAME.fullmatch(name) or name.endswith(".part"):
        raise HTTPException(422, detail=[{"loc": ["path", "name"], "type": "value_error",
                                          "msg": f"bad artifact name {name!r}: 1-200 letters, digits, '.', '_', "
                                                 f"'-', starting with a letter or digit, not ending in .part"}])
    return settings.artifact_dir(job_id, attempt) / name


@router.get("/{job_id}", dependencies=[ReadAuth], response_model=JobPublic, responses=NOT_FOUND)
def get_job(job_id: JobId, db: SessionDep) -> dict:
    return service.job_detail(db, _get_job(db, job_id))


DOWNLOAD = {200: {"description": "the artifact's bytes, as an attachment",
                  "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


@router.get("/{job_id}/artifacts/{name}", dependencies=[ReadAuth], responses={**DOWNLOAD, **NOT_FOUND},
            response_class=FileResponse)
def get_artifact(job_id: JobId, name: str, db: SessionDep, settings: SettingsDep, attempt: Attempt = None):
    job = _get_job(db, job_id)
    tries = [attempt] if attempt is not None else range(max(job.attempts, 1), 0, -1)
    path = next((p for p in (_artifact_path(settings, job_id, name, a) for a in tries) if p.is_file()), None)
    if path is None:
        where = f" from attempt {attempt}" if attempt is not None else ""
        raise HTTPException(404, detail=f"job {job_id} has no artifact {name!r}{where}")
    # an attachment of a neutral type: a download, never rendered by the browser as a page
    return FileResponse(path, filename=name, media_type="application/octet-stream",
                        content_disposition_type="attachment", headers={"X-Content-Type-Options": "nosniff"})


@router.put("/{job_id}/artifacts/{name}", status_code=201, dependencies=[WriteAuth], response_model=ArtifactStored,
            responses={**NOT_FOUND, **CONFLICT, **TOO_LARGE})
async def put_artifact(job_id: JobId, name: str, request: Request, db: SessionDep, settings: SettingsDep,
                       attempt: Annotated[int, Query(ge=1, le=MAX_INDEX, description="the job's attempt that wrote "
                                                                                      "it")] = 1) -> dict:
    """Upload an artifact of one attempt of a job (a GPU host that shares no disk with the API). The
    body is streamed to a temporary file of its own, which becomes the artifact only when complete; an
    existing artifact of that attempt is never replaced (409). A retry uploads as its own attempt."""
    _get_job(db, job_id)
    path = _artifact_path(settings, job_id, name, attempt)
    if path.exists():
        raise HTTPException(409, detail=f"job {job_id} already has an artifact {name!r} from attempt {attempt}")
    cap = int(settings.max_artifact_mb * 1024 * 1024)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        raise HTTPException(413, detail=f"artifact of {int(length)} bytes is over the limit of "
                                        f"{settings.max_artifact_mb:g} MB (BENCHLAB_MAX_ARTIFACT_MB)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{name}.{uuid.uuid4().hex}.part"
    size = 0
    try:
        with tmp.open("wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise HTTPException(413, detail=f"artifact over the limit of {settings.max_artifact_mb:g} MB "
                                                    f"(BENCHLAB_MAX_ARTIFACT_MB)")
                f.write(chunk)
        try:
            os.link(tmp, path)  # atomic, and fails if the name was taken meanwhile
        except FileExistsError:
            raise HTTPException(409, detail=f"job {job_id} already has an artifact {name!r} from attempt "
                                            f"{attempt}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return {"job_id": job_id, "name": name, "size": size, "attempt": attempt}
