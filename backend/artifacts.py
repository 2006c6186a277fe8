"""Artifact storage on the API host: how much it takes, and retention.

Artifacts live in `<data dir>/artifacts/job_<id>/`. With `BENCHLAB_ARTIFACT_MAX_AGE_DAYS` and/or
`BENCHLAB_ARTIFACT_MAX_TOTAL_MB` set, the recorder removes whole job folders, oldest first (by the
newest file in each), until both limits hold. A removed artifact answers 404; its result row and
metrics stay.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path


def _folders(root: Path) -> list[tuple[float, int, Path]]:
    """(newest mtime, bytes, folder) of each job folder."""
    out = []
    if not root.is_dir():
        return out
    for d in root.iterdir():
        if not d.is_dir():
            continue
        size, newest = 0, d.stat().st_mtime
        for f in d.rglob("*"):
            if f.is_file():
                st = f.stat()
                size += st.st_size
                newest = max(newest, st.st_mtime)
        out.append((newest, size, d))
    return out


def usage(root: Path) -> dict[str, int]:
    folders = _folders(root)
    return {"bytes": sum(s for _, s, _ in folders), "jobs": len(folders)}


def enforce_retention(root: Path, max_age_days: float | None, max_total_mb: float | None,
                      now: float | None = None) -> list[str]:
    """Remove job folders past the age limit, then the oldest until the total fits. Returns their names."""
    if max_age_days is None and max_total_mb is None:
        return []
    now = now or time.time()
    folders = sorted(_folders(root))  # oldest first
    removed = []
    total = sum(s for _, s, _ in folders)
    for newest, size, d in folders:
        too_old = max_age_days is not None and now - newest > max_age_days * 86400
        too_big = max_total_mb is not None and total > max_total_mb * 1024 * 1024
        if not (too_old or too_big):
            continue
        shutil.rmtree(d, ignore_errors=True)
        total -= size
        removed.append(d.name)
    return removed
