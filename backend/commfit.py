"""The communication model behind the bucket-size chart, torch-free.

An all-reduce of b bytes takes t(b) = o + b / w: a fixed cost o per call and an effective (algorithm)
bandwidth w. Both are fitted to an `allreduce` sweep's medians by least squares on relative error
(each point weighted by 1 / t, so the 20 us calls count as much as the 20 ms ones).

Bucketed DDP with n_b buckets over s bytes of gradients overlaps all but the last bucket with
backward; what is left after backward is the last bucket's transfer plus a fixed cost per bucket:

    overhead(n_b) = s / (n_b * w) + n_b * o

d/dn_b = -s / (n_b^2 w) + o = 0  ->  n_b* = sqrt(s / (w o)),  best bucket size b* = s / n_b* = sqrt(s w o).
E.g. s = 13.6 GB (3.4e9 fp32 gradients), w = 300 GB/s, o = 30 us: b* = sqrt(1.36e10 * 3e11 * 3e-5) = 350 MB.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from worker.stats import positive

MB = 2**20


def fit_latency_bandwidth(points: list[tuple[float, float]]) -> dict[str, float]:
    """{"o_ms", "w_gbps", "points"} from (bytes, ms) pairs; at least two distinct sizes."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("the fit needs all-reduce times at two or more message sizes")
    x = np.array([b for b, _ in points], dtype=float)
    t = np.array([ms for _, ms in points], dtype=float)
    weights = 1.0 / t  # relative error: rows scaled by 1 / t
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    (o_ms, ms_per_byte), *_ = np.linalg.lstsq(design, t * weights, rcond=None)
    if ms_per_byte <= 0:
        raise ValueError("all-reduce time does not grow with message size: no bandwidth to fit")
    return {"o_ms": float(max(o_ms, 0.0)), "w_gbps": float(1e-9 / (ms_per_byte * 1e-3)), "points": len(points)}


def allreduce_ms(nbytes: float, fit: dict[str, float]) -> float:
    return fit["o_ms"] + nbytes / (fit["w_gbps"] * 1e9) * 1e3


def exposed_overhead_ms(total_bytes: float, n_buckets: int, fit: dict[str, float]) -> float:
    """s / (n_b w) + n_b o, in ms."""
    return total_bytes / n_buckets / (fit["w_gbps"] * 1e9) * 1e3 + n_buckets * fit["o_ms"]


def best_bucket_bytes(total_bytes: float, fit: dict[str, float]) -> float:
    """sqrt(s w o), capped at s (one bucket)."""
    w = fit["w_gbps"] * 1e9  # bytes/s
    o = fit["o_ms"] * 1e-3  # s
    return min(total_bytes, math.sqrt(total_bytes * w * o)) if o > 0 else total_bytes


def bucket_curve(total_bytes: float, fit: dict[str, float], lo_mb: float, hi_mb: float,
                 points: int = 60) -> dict[str, list[float]]:
    """The predicted overhead over bucket sizes lo..hi (log-spaced), with n_b = ceil(s / b)."""
    sizes = np.geomspace(lo_mb, hi_mb, points)
    n_b = [max(1, math.ceil(total_bytes / (mb * MB))) for mb in sizes]
    return {"bucket_mb": [float(mb) for mb in sizes], "buckets": n_b,
            "exposed_ms": [exposed_overhead_ms(total_bytes, n, fit) for n in n_b]}


def allreduce_points(rows: list[dict[str, Any]], world_size: int | None = None) -> list[tuple[float, float]]:
    """(bytes, median ms) of an allreduce sweep's finished cells (of one world size, if given)."""
    out = []
    for r in rows:
        m = r.get("metrics") or {}
        size, ms = positive(m.get("bytes")), positive(m.get("median_ms"))
        if r.get("state") != "done" or size is None or ms is None:
            continue
        if world_size is not None and r["params"].get("world_size") != world_size:
            continue
        out.append((size, ms))
    return out
