"""Comparing two sweeps cell by cell with statistics that hold on noisy machines. Torch-free.

For each pair of matching cells (same params, apart from the ones the caller ignores), from their
raw per-iteration samples (`samples_ms`, pooled over a cell's repeats; worker.stats.timings keeps the
positive finite ones):

- ratio = median(B) / median(A), with a 95 % percentile-bootstrap interval: `resamples` draws of
  each side with replacement (seeded), the ratio of the two medians each time. When both sides hold
  MIN_RUNS_FOR_GROUPED or more runs (repeats) of the cell, the draws are two-level: runs, then
  samples within them (`interval_over: runs`), so run-to-run drift (clocks, a host-bound cell's
  host) widens the interval instead of passing for a difference. A sustained attention cell
  (`sustain_ms`) counts each of its rounds as a run (`round_samples` splits its samples), since the
  chip's clock moves between rounds: three rounds are enough for the two-level draws;
- a two-sided Mann-Whitney U p-value (normal approximation with tie correction);
- a verdict against a relative threshold t (default 5 %):
  `slower` when the whole interval lies above 1 + t, `faster` when it lies below 1 - t,
  `same` when it lies inside [1 - t, 1 + t], `inconclusive` otherwise (or without samples, or
  when the two cells ran on different environments and the caller did not allow it, or when a side
  was host-bound and the interval could only resample samples, not runs).
"""
from __future__ import annotations

import json
from itertools import accumulate, pairwise
from typing import Any

import numpy as np

from worker.stats import grouped_ratio_interval, mann_whitney_p, positive, ratio_interval, timings

MIN_RUNS_FOR_GROUPED = 3  # repeats per side from which the interval resamples runs, not just samples
ENV_KEYS = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "triton")
VERDICTS = ("slower", "faster", "same", "inconclusive")


def verdict(lo: float, hi: float, threshold: float) -> str:
    if lo > 1 + threshold:
        return "slower"
    if hi < 1 - threshold:
        return "faster"
    if lo >= 1 - threshold and hi <= 1 + threshold:
        return "same"
    return "inconclusive"


def _key(params: dict[str, Any], ignore: set[str]) -> str:
    """A cell's identity: its params less the ignored ones and those left unset (None). A parameter a
    later release added with an unset default (attention's `against`) then leaves its cells matching
    those recorded before it existed."""
    return json.dumps({k: v for k, v in params.items() if k not in ignore and v is not None}, sort_keys=True)


def cells_by_params(rows: list[dict[str, Any]], ignore: set[str]) -> dict[str, dict[str, Any]]:
    """Rows grouped by cell (params less the ignored ones): pooled samples, states, environments."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = out.setdefault(_key(r["params"], ignore), {"params": r["params"], "samples": [], "states": [],
                                                       "env_ids": set(), "medians": [], "groups": [],
                                                       "host_bound": []})
        c["states"].append(r["state"])
        metrics = r["metrics"] or {}
        for run in _runs(metrics):
            c["samples"] += run
            c["groups"].append(run)
            c["host_bound"].append(metrics.get("host_bound") is True)
        if (median := positive(metrics.get("median_ms"))) is not None:
            c["medians"].append(median)
        if r.get("env_id"):
            c["env_ids"].add(r["env_id"])
    return out


def _runs(metrics: dict[str, Any]) -> list[list[float]]:
    """A row's timed runs, each its usable samples: one, or a sustained cell's rounds where its
    `round_samples` (the number each round took, in order) account for every stored sample."""
    raw, counts = metrics.get("samples_ms"), metrics.get("round_samples")
    parts = [raw]
    if (isinstance(raw, list) and isinstance(counts, list) and len(counts) > 1
            and all(type(n) is int and n > 0 for n in counts) and sum(counts) == len(raw)):
        bounds = [0, *accumulate(counts)]  # each round's first and one-past-last sample
        parts = [raw[a:b] for a, b in pairwise(bounds)]
    return [run for run in map(timings, parts) if run]


def _host_bound(cell: dict[str, Any]) -> bool:
    """At least half of a cell's timed runs were host-bound (the suite's GPU-busy test, metrics.host_bound):
    pooled, their samples judge the host's drift as if it were the code's. On an H200, 4 of 20 A/A pairs
    of such a cell read `slower` (docs/results/h200/gating/README.md); judged over runs, none did."""
    flags = cell["host_bound"]
    return bool(flags) and 2 * sum(flags) >= len(flags)


def judge(a: dict[str, Any], b: dict[str, Any], threshold: float, resamples: int = 2000,
          seed: int = 0) -> dict[str, Any]:
    """Cell B against cell A (cells_by_params entries, both with samples): the ratio of medians with its
    interval (over runs when both hold MIN_RUNS_FOR_GROUPED or more, else over samples), the p-value and
    the verdict, `inconclusive` with the reason where a host-bound side could only be judged over samples.
    The comparison of two sweeps and a cell's history judge with it."""
    if len(a["groups"]) >= MIN_RUNS_FOR_GROUPED and len(b["groups"]) >= MIN_RUNS_FOR_GROUPED:
        ratio, lo, hi = grouped_ratio_interval(a["groups"], b["groups"], resamples, seed)
        over = "runs"
    else:
        ratio, lo, hi = ratio_interval(a["samples"], b["samples"], resamples, seed)
        over = "samples"
    out = {"ratio": ratio, "ci_low": lo, "ci_high": hi, "p_value": mann_whitney_p(a["samples"], b["samples"]),
           "verdict": verdict(lo, hi, threshold), "reason": None, "interval_over": over}
    bound = [side for side, c in (("A", a), ("B", b)) if _host_bound(c)]
    if bound and over == "samples":
        out.update(verdict="inconclusive", reason=(
            f"host-bound on side {' and '.join(bound)}: its time is the host's, which drifts between runs "
            f"more than within one; judge it with {MIN_RUNS_FOR_GROUPED} or more runs a side (repeats)"))
    return out


def compare(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], envs: dict[int, dict[str, Any]],
            threshold: float = 0.05, ignore: list[str] | None = None, allow_env_mismatch: bool = False,
            resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The comparison of two sweeps' result rows (service.result_rows), as GET /api/compare answers it."""
    ignore_set = set(ignore or [])
    ca, cb = cells_by_params(rows_a, ignore_set), cells_by_params(rows_b, ignore_set)
    cells, mismatched = [], []
    for key in [k for k in ca if k in cb]:
        a, b = ca[key], cb[key]
        fa = {json.dumps({k: envs.get(i, {}).get(k) for k in ENV_KEYS}, sort_keys=True) for i in a["env_ids"]}
        fb = {json.dumps({k: envs.get(i, {}).get(k) for k in ENV_KEYS}, sort_keys=True) for i in b["env_ids"]}
        env_differs = bool(fa and fb and fa != fb)
        if env_differs:
            mismatched.append({k: v for k, v in a["params"].items() if k not in ignore_set})
        cell = {"params": {k: v for k, v in a["params"].items() if k not in ignore_set},
                "a": {"median_ms": float(np.median(a["samples"])) if a["samples"] else None, "n": len(a["samples"]),
                      "states": a["states"]},
                "b": {"median_ms": float(np.median(b["samples"])) if b["samples"] else None, "n": len(b["samples"]),
                      "states": b["states"]},
                "ratio": None, "ci_low": None, "ci_high": None, "p_value": None, "verdict": "inconclusive",
                "reason": None, "interval_over": None}
        if (not a["samples"] or not b["samples"]) and a["medians"] and b["medians"]:
            # results recorded before raw samples were kept: the stored medians, with no interval
            ma, mb = float(np.median(a["medians"])), float(np.median(b["medians"]))
            cell["a"]["median_ms"], cell["b"]["median_ms"] = ma, mb
            cell["ratio"] = mb / ma if ma else None
            cell["reason"] = "no raw samples (older results): the ratio of the stored medians, not judged"
        elif not a["samples"] or not b["samples"]:
            cell["reason"] = "no timing samples on " + ("both sides" if not a["samples"] and not b["samples"]
                                                        else "side A" if not a["samples"] else "side B")
        else:
            cell.update(judge(a, b, threshold, resamples, seed))
            if env_differs and not allow_env_mismatch:
                cell["verdict"], cell["reason"] = "inconclusive", "the two sides ran on different environments"
        cells.append(cell)
    missing = ([{"side": "a", "params": ca[k]["params"]} for k in ca if k not in cb]
               + [{"side": "b", "params": cb[k]["params"]} for k in cb if k not in ca])
    summary = {v: sum(1 for c in cells if c["verdict"] == v) for v in VERDICTS}
    return {"threshold": threshold, "ignore": sorted(ignore_set), "cells": cells, "missing": missing,
            "fingerprint_mismatch": mismatched, "summary": summary}


def markdown(result: dict[str, Any]) -> str:
    """The comparison as a markdown table, fit for a pull-request comment."""
    varying = sorted({k for c in result["cells"] for k in c["params"]
                      if len({json.dumps(x["params"].get(k)) for x in result["cells"]}) > 1})
    head = [*varying, "A ms", "B ms", "B / A", "95 % interval", "p", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in result["cells"]:
        def f(x, spec=".3f"):
            return "" if x is None else format(x, spec)
        lines.append("| " + " | ".join([*(str(c["params"].get(k)) for k in varying), f(c["a"]["median_ms"]),
                                         f(c["b"]["median_ms"]), f(c["ratio"]),
                                         f"{f(c['ci_low'])}-{f(c['ci_high'])}" if c["ci_low"] is not None else "",
                                         f(c["p_value"], ".3g"), c["verdict"] + (f" ({c['reason']})"
                                                                                  if c["reason"] else "")]) + " |")
    s = result["summary"]
    lines.append("")
    lines.append(f"{s['slower']} slower, {s['faster']} faster, {s['same']} same, {s['inconclusive']} inconclusive "
                 f"(threshold {result['threshold']:.0%}); {len(result['missing'])} cell(s) on one side only")
    return "\n".join(lines)
