"""A cell's history over sweeps (commits): its median with a 95 % interval in each finished sweep of
the suite, and each point judged against the one before it with the comparison engine's rules
(backend/compare.py), so a regression is marked where it entered. Torch-free."""
from __future__ import annotations

import json
from typing import Any

from backend.compare import cells_by_params, judge
from worker.stats import median_interval


def matches(params: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(params.get(k) == v for k, v in want.items())


def history(sweeps: list[tuple[dict[str, Any], list[dict[str, Any]]]], want: dict[str, Any],
            threshold: float = 0.05, seed: int = 0, ignore: set[str] | None = None) -> list[dict[str, Any]]:
    """One series per distinct cell whose params include `want` (cells told apart by their params
    less `ignore`), from (sweep summary, result rows) pairs oldest first; each point: sweep, commit (the
    sweep's `commit` tag, else the summary's `ran_at_commit`: the commit its cells' fingerprints name),
    branch, median with interval, and the verdict against the previous point (`regression` when slower)."""
    ignore = ignore or set()
    series: dict[str, dict[str, Any]] = {}
    for summary, rows in sweeps:
        tags = summary.get("tags") or {}
        for key, cell in cells_by_params(rows, ignore).items():
            if not matches(cell["params"], {k: v for k, v in want.items() if k not in ignore}) or not cell["samples"]:
                continue
            shown = {k: v for k, v in cell["params"].items() if k not in ignore}
            s = series.setdefault(key, {"params": shown, "points": [], "_last": None})
            med, lo, hi = median_interval(cell["samples"], seed=seed)
            commit = tags.get("commit") or summary.get("ran_at_commit")  # the tag, else the cells' fingerprint
            point = {"sweep_id": summary["id"], "created_at": summary["created_at"], "commit": commit,
                     "branch": tags.get("branch"), "median_ms": med, "ci_low": lo, "ci_high": hi,
                     "n": len(cell["samples"]), "ratio": None, "verdict": None, "reason": None,
                     "regression": False}
            if s["_last"] is not None:  # judged as a comparison of the two sweeps judges the cell
                j = judge(s["_last"], cell, threshold, seed=seed)
                point.update(ratio=j["ratio"], verdict=j["verdict"], reason=j["reason"],
                             regression=j["verdict"] == "slower")
            s["points"].append(point)
            s["_last"] = cell
    out = []
    for s in series.values():
        s.pop("_last")
        out.append(s)
    return sorted(out, key=lambda s: json.dumps(s["params"], sort_keys=True))
