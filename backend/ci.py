"""What `benchlab ci` needs besides the API: tags from the CI environment and the baseline choice.
Torch-free, no I/O."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from worker.contract import GridParams

# tag -> the CI variables that may hold it, first found wins (GitHub Actions, GitLab CI, generic)
CI_TAG_VARIABLES = {
    "commit": ("BENCHLAB_COMMIT", "GITHUB_SHA", "CI_COMMIT_SHA"),
    "branch": ("BENCHLAB_BRANCH", "GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME"),
    "runner": ("BENCHLAB_RUNNER", "RUNNER_NAME", "CI_RUNNER_DESCRIPTION"),
    "pipeline": ("GITHUB_RUN_ID", "CI_PIPELINE_ID"),
}


def ci_tags(environ: Mapping[str, str]) -> dict[str, str]:
    """Tags for a sweep submitted from CI, read from the environment (empty values skipped)."""
    tags = {}
    for tag, names in CI_TAG_VARIABLES.items():
        value = next((environ[n] for n in names if environ.get(n)), None)
        if value:
            tags[tag] = value[:200]
    return tags


def _grid(params: GridParams, ignore: set[str]) -> str:
    grids = params if isinstance(params, list) else [params]
    return json.dumps([{k: v for k, v in g.items() if k not in ignore} for g in grids], sort_keys=True)


def find_baseline(sweeps: list[dict[str, Any]], suite: str, params: GridParams, ignore: list[str] | None = None,
                  branch: str = "main", exclude: int | None = None) -> dict[str, Any] | None:
    """The newest finished sweep (`status` done) of the same suite and grid (params less `ignore`)
    tagged with `branch`, from a list of sweep summaries (GET /api/sweeps); None if there is none."""
    ignore_set = set(ignore or [])
    want = _grid(params, ignore_set)
    found = [s for s in sweeps if s["suite"] == suite and s["status"] == "done" and s["id"] != exclude
             and (s.get("tags") or {}).get("branch") == branch and _grid(s["params"], ignore_set) == want]
    return max(found, key=lambda s: s["id"]) if found else None
