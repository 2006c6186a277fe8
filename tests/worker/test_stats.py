"""worker/stats.py helpers not covered through the comparison engine (tests/backend/test_compare.py)."""
from __future__ import annotations

import pytest

from worker.stats import drift, slowest_rank, timings


def test_slowest_rank_takes_each_steps_slowest_and_refuses_ragged_ranks():
    assert slowest_rank([[1.0, 5.0, 2.0], [3.0, 4.0, 2.5]]) == [3.0, 5.0, 2.5]
    assert slowest_rank([[7.0, 8.0]]) == [7.0, 8.0]
    with pytest.raises(ValueError):
        slowest_rank([[1.0, 2.0], [1.0]])  # a rank that took fewer steps is a bug, not a figure


def test_timings_keep_positive_finite_numbers_and_nothing_else():
    assert timings([2.0, 1, None, float("nan"), float("inf"), 0.0, -1.0, True, "3", [4.0], 5.5]) == [2.0, 1.0, 5.5]
    for not_a_list in (None, 3.0, "1,2", {"a": 1.0}, True):
        assert timings(not_a_list) == []


def test_bootstrap_medians_are_drawn_in_blocks_with_the_same_stream_and_flat_memory():
    import tracemalloc

    import numpy as np

    from worker.stats import _resampled_medians

    x = list(np.random.default_rng(3).random(20_000))
    med, draws = _resampled_medians(x, np.random.default_rng(0), 2000)
    xs = np.asarray(x)
    whole = np.median(xs[np.random.default_rng(0).integers(0, len(xs), (7, len(xs)))], axis=1)
    assert med == float(np.median(xs)) and np.array_equal(draws[:7], whole)  # what one draw of all gives
    tracemalloc.start()
    _resampled_medians(x, np.random.default_rng(0), 2000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20  # all 2,000 x 20,000 indexes at once would be 305 MiB


def test_drift_is_the_last_quarter_over_the_first():
    assert drift([1.0, 1.0, 1.1, 1.2, 1.1, 1.2, 1.3, 1.3]) == pytest.approx(1.3)
    assert drift([2.0, 4.0]) == pytest.approx(2.0) and drift([3.0]) == 1.0
    assert drift([4.0, 4.0, 2.0, 2.0]) == pytest.approx(0.5)  # a run that sped up
    with pytest.raises(ValueError, match="no samples"):
        drift([])
