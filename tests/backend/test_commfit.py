"""The all-reduce model behind the bucket-size chart: the fit and the overhead formula."""
from __future__ import annotations

import math
import random

import pytest

from backend.commfit import (
    MB,
    allreduce_points,
    best_bucket_bytes,
    bucket_curve,
    exposed_overhead_ms,
    fit_latency_bandwidth,
)


def test_the_fit_recovers_latency_and_bandwidth_from_noisy_timings():
    rng = random.Random(0)
    o_ms, w_gbps = 0.025, 310.0
    sizes = [2**k * 1024 for k in range(4, 21)]  # 16 KiB .. 1 GiB
    points = [(b, (o_ms + b / (w_gbps * 1e9) * 1e3) * rng.uniform(0.97, 1.03)) for b in sizes for _ in range(3)]
    fit = fit_latency_bandwidth(points)
    assert fit["o_ms"] == pytest.approx(o_ms, rel=0.1)
    assert fit["w_gbps"] == pytest.approx(w_gbps, rel=0.05)
    assert fit["points"] == len(points)


def test_the_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="two or more"):
        fit_latency_bandwidth([(1e6, 1.0), (1e6, 1.1)])
    with pytest.raises(ValueError, match="does not grow"):
        fit_latency_bandwidth([(1e6, 2.0), (1e8, 1.0)])


def test_overhead_and_best_bucket_by_hand():
    fit = {"o_ms": 0.03, "w_gbps": 300.0}
    s = 13.6e9
    # s / (n_b w) + n_b o with n_b = 40: 13.6e9 / 40 / 3e11 s = 1.1333 ms, plus 40 * 0.03 = 1.2 ms
    assert exposed_overhead_ms(s, 40, fit) == pytest.approx(1.1333 + 1.2, rel=1e-3)
    best = best_bucket_bytes(s, fit)
    assert best == pytest.approx(math.sqrt(13.6e9 * 3e11 * 3e-5))  # sqrt(s w o) = 349 MB
    n_star = s / best  # the optimum of the continuous formula: neighbours are no better
    assert exposed_overhead_ms(s, n_star, fit) <= min(exposed_overhead_ms(s, n_star * f, fit) for f in (0.5, 2))
    assert best_bucket_bytes(1e6, fit) == 1e6  # never more than one bucket's worth


def test_curve_counts_buckets_and_spans_the_range():
    c = bucket_curve(100 * MB, {"o_ms": 0.02, "w_gbps": 100.0}, 1, 1000, points=10)
    assert c["bucket_mb"][0] == pytest.approx(1) and c["bucket_mb"][-1] == pytest.approx(1000)
    assert c["buckets"][0] == 100 and c["buckets"][-1] == 1


def test_points_come_from_finished_cells_of_one_world_size():
    rows = [{"state": "done", "params": {"world_size": 2}, "metrics": {"bytes": 1024, "median_ms": 0.1}},
            {"state": "done", "params": {"world_size": 4}, "metrics": {"bytes": 1024, "median_ms": 0.2}},
            {"state": "failed", "params": {"world_size": 2}, "metrics": {}},
            {"state": "done", "params": {"world_size": 2}, "metrics": {"bytes": "1k", "median_ms": 0.1}},
            {"state": "done", "params": {"world_size": 2}, "metrics": {"bytes": 2048, "median_ms": None}}]
    assert allreduce_points(rows, 2) == [(1024.0, 0.1)]  # a size or time that is not a positive number: no point
