"""Statistics on raw timing samples, torch-free: the comparison engine (backend/compare.py) and the
suites that contrast two variants measured in one process (worker/suites/ddp.py) use them.

- `ratio_interval(a, b)`: median(b) / median(a) with a percentile-bootstrap interval;
- `difference_interval(a, b)`: median(b) - median(a), the same way;
- `median_interval(a)`: median(a) with a percentile-bootstrap interval;
- `grouped_ratio_interval(groups_a, groups_b)`: the ratio of pooled medians when each side is several
  runs (repeats) of samples: a two-level bootstrap draws runs with replacement, then samples within
  each drawn run, so drift from run to run widens the interval instead of passing for a difference;
- `mann_whitney_p(a, b)`: two-sided Mann-Whitney U p-value;
- `slowest_rank(per_rank)`: step i's figure of a multi-rank measurement, the slowest rank's;
- `drift(ms)`: how much a run of calls slowed while it ran (its last quarter over its first).
Bootstraps draw each side with replacement, `resamples` times, from a seeded generator.
"""
from __future__ import annotations

import math

import numpy as np

RESAMPLE_BLOCK = 1 << 21  # bootstrap indexes drawn at once (16 MiB of int64)


def positive(x) -> float | None:
    """x as a float when it is a positive finite real number (a stored time, size or rate), else None:
    a null (a NaN or infinity on the way in), a zero, a negative, a bool or a non-number."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
    return float(x) if ok else None


def timings(value) -> list[float]:
    """The usable times of a stored samples list (ms): its positive finite numbers (positive), and none
    from a value that is not a list, so a ratio of medians is always defined."""
    if not isinstance(value, list):
        return []
    return [t for t in map(positive, value) if t is not None]


def drift(ms: list[float]) -> float:
    """How much a run of calls issued back to back slowed while it ran: the median of its last quarter of
    samples over the median of its first (1.0: no change; at least one sample a quarter)."""
    if not ms:
        raise ValueError("no samples")
    k = max(len(ms) // 4, 1)
    return float(np.median(ms[-k:]) / np.median(ms[:k]))


def slowest_rank(per_rank: list[list[float]]) -> list[float]:
    """Step i's figure: the slowest rank's time for step i (ranks are barrier-aligned before each step)."""
    return [max(step) for step in zip(*per_rank, strict=True)]


def _resampled_medians(x: list[float], rng, resamples: int):
    """The median of x, and the medians of `resamples` bootstrap draws of it. The draws are made
    RESAMPLE_BLOCK indexes at a time (the same stream as all at once, so the same medians): memory
    stays flat however many samples a cell holds (2,000 draws of 100,000 samples at once are 1.6 GB)."""
    xs = np.asarray(x, dtype=float)
    n = len(xs)
    if n == 0:
        raise ValueError("both sides need at least one sample")
    medians = np.empty(resamples)
    rows = max(1, RESAMPLE_BLOCK // n)
    for start in range(0, resamples, rows):
        k = min(rows, resamples - start)
        medians[start:start + k] = np.median(xs[rng.integers(0, n, (k, n))], axis=1)
    return float(np.median(xs)), medians


def _bootstrap_medians(a: list[float], b: list[float], resamples: int, seed: int):
    rng = np.random.default_rng(seed)
    med_a, ma = _resampled_medians(a, rng, resamples)
    med_b, mb = _resampled_medians(b, rng, resamples)
    return med_a, med_b, ma, mb


def _percentiles(draws, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(draws, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def ratio_interval(a: list[float], b: list[float], resamples: int = 2000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float]:
    """(median(b) / median(a), low, high) with a percentile bootstrap interval at `level`."""
    med_a, med_b, ma, mb = _bootstrap_medians(a, b, resamples, seed)
    return (med_b / med_a, *_percentiles(mb / ma, level))


def difference_interval(a: list[float], b: list[float], resamples: int = 2000, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float, float]:
    """(median(b) - median(a), low, high) with a percentile bootstrap interval at `level`."""
    med_a, med_b, ma, mb = _bootstrap_medians(a, b, resamples, seed)
    return (med_b - med_a, *_percentiles(mb - ma, level))


def median_interval(a: list[float], resamples: int = 2000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float, float]:
    """(median(a), low, high) with a percentile bootstrap interval at `level`."""
    med, draws = _resampled_medians(a, np.random.default_rng(seed), resamples)
    return (med, *_percentiles(draws, level))


def _grouped_medians(groups: list[list[float]], rng, resamples: int):
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        raise ValueError("both sides need at least one sample")
    draws = np.empty(resamples)
    for i in range(resamples):
        picked = rng.integers(0, len(arrays), len(arrays))
        draws[i] = np.median(np.concatenate([arrays[j][rng.integers(0, len(arrays[j]), len(arrays[j]))]
                                             for j in picked]))
    return float(np.median(np.concatenate(arrays))), draws


def grouped_ratio_interval(groups_a: list[list[float]], groups_b: list[list[float]], resamples: int = 2000,
                           seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(median(pooled b) / median(pooled a), low, high), resampling runs, then samples within runs."""
    rng = np.random.default_rng(seed)
    med_a, ma = _grouped_medians(groups_a, rng, resamples)
    med_b, mb = _grouped_medians(groups_b, rng, resamples)
    return (med_b / med_a, *_percentiles(mb / ma, level))


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie-corrected)."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n1, n2 = len(xa), len(xb)
    both = np.concatenate([xa, xb])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(len(both))
    sorted_vals = both[order]
    i = 0
    while i < len(both):  # average ranks over ties
        j = i
        while j + 1 < len(both) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    _, counts = np.unique(both, return_counts=True)
    n = n1 + n2
    sigma2 = n1 * n2 / 12 * ((n + 1) - (counts ** 3 - counts).sum() / (n * (n - 1)))
    if sigma2 <= 0:
        return 1.0
    z = (abs(u1 - mu) - 0.5) / math.sqrt(sigma2)
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))
