"""The comparison statistics on synthetic samples: false alarms, detection, interval coverage."""
from __future__ import annotations

import numpy as np

from backend.compare import compare, markdown, verdict
from worker.stats import mann_whitney_p, ratio_interval


def draws(rng, n, median, noise):
    return list(median * (1 + noise * rng.standard_normal(n)))


def test_a_against_a_with_8_percent_noise_is_rarely_called_slower():
    rng = np.random.default_rng(1)
    slower = 0
    for seed in range(1000):
        a, b = draws(rng, 20, 20.0, 0.08), draws(rng, 20, 20.0, 0.08)
        _, lo, hi = ratio_interval(a, b, resamples=2000, seed=seed)
        slower += verdict(lo, hi, 0.05) == "slower"
    assert slower <= 10  # <= 1 % of 1,000


def test_a_10_percent_slowdown_with_3_percent_noise_is_called_slower():
    rng = np.random.default_rng(2)
    caught = 0
    for seed in range(300):
        a, b = draws(rng, 20, 20.0, 0.03), draws(rng, 20, 22.0, 0.03)
        _, lo, hi = ratio_interval(a, b, resamples=2000, seed=seed)
        caught += verdict(lo, hi, 0.05) == "slower"
    assert caught >= 0.95 * 300


def test_intervals_cover_the_true_ratio_near_their_nominal_rate():
    rng = np.random.default_rng(3)
    covered = 0
    for seed in range(400):
        a, b = draws(rng, 30, 10.0, 0.05), draws(rng, 30, 11.0, 0.05)
        _, lo, hi = ratio_interval(a, b, resamples=2000, seed=seed)
        covered += lo <= 1.1 <= hi
    assert 0.90 * 400 <= covered <= 0.99 * 400  # 95 % nominal; the percentile bootstrap of a median is coarse


def test_mann_whitney_tells_shifted_from_equal_samples():
    rng = np.random.default_rng(4)
    assert mann_whitney_p(draws(rng, 20, 10, 0.02), draws(rng, 20, 11, 0.02)) < 1e-4
    assert mann_whitney_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0


def test_verdict_thresholds():
    assert verdict(1.06, 1.2, 0.05) == "slower" and verdict(0.8, 0.94, 0.05) == "faster"
    assert verdict(0.97, 1.04, 0.05) == "same" and verdict(0.99, 1.08, 0.05) == "inconclusive"


def row(params, samples, state="done", env_id=1):
    return {"params": params, "metrics": {"samples_ms": samples} if samples else {}, "state": state,
            "env_id": env_id}


def test_compare_matches_cells_ignores_params_and_reports_missing_and_mismatched_environments():
    rng = np.random.default_rng(5)
    a = [row({"impl": "naive", "seq": s}, draws(rng, 20, 10, 0.02)) for s in (1, 2, 3)]
    b = [row({"impl": "flash", "seq": 1}, draws(rng, 20, 13, 0.02)),
         row({"impl": "flash", "seq": 2}, draws(rng, 20, 10, 0.02), env_id=2),
         row({"impl": "flash", "seq": 4}, draws(rng, 20, 10, 0.02))]
    envs = {1: {"gpu_name": "H200", "torch": "2.11"}, 2: {"gpu_name": "H100", "torch": "2.11"}}
    out = compare(a, b, envs, ignore=["impl"])
    by_seq = {c["params"]["seq"]: c for c in out["cells"]}
    assert by_seq[1]["verdict"] == "slower" and 1.25 < by_seq[1]["ratio"] < 1.35
    assert by_seq[2]["verdict"] == "inconclusive" and "different environments" in by_seq[2]["reason"]
    assert out["fingerprint_mismatch"] == [{"seq": 2}]
    assert compare(a, b, envs, ignore=["impl"], allow_env_mismatch=True)["cells"][1]["verdict"] == "same"
    assert sorted((m["side"], m["params"]["seq"]) for m in out["missing"]) == [("a", 3), ("b", 4)]
    assert out["summary"] == {"slower": 1, "faster": 0, "same": 0, "inconclusive": 1}
    assert compare(a, b, envs)["cells"] == []  # without ignoring impl, nothing matches
    table = markdown(out)
    assert "| seq |" in table and "slower" in table and "2 cell(s) on one side only" in table


def test_a_param_added_later_with_an_unset_default_still_matches_older_cells():
    rng = np.random.default_rng(6)
    old = [row({"impl": "naive", "seq": 1}, draws(rng, 20, 10, 0.02))]
    new = [row({"impl": "naive", "seq": 1, "against": None}, draws(rng, 20, 10, 0.02)),
           row({"impl": "naive", "seq": 1, "against": "sdpa"}, draws(rng, 20, 10, 0.02))]
    out = compare(old, new, {1: {}})
    assert [c["params"].get("against") for c in out["cells"]] == [None]  # unset matches absent
    assert [m["params"]["against"] for m in out["missing"]] == ["sdpa"]  # a set value stays its own cell


def test_cells_without_samples_are_inconclusive_with_the_reason():
    out = compare([row({"x": 1}, [])], [row({"x": 1}, [1.0, 2.0])], {})
    assert out["cells"][0]["verdict"] == "inconclusive" and out["cells"][0]["reason"] == "no timing samples on side A"


def test_results_without_samples_fall_back_to_the_stored_medians_unjudged():
    old = lambda m: {"params": {"x": 1}, "metrics": {"median_ms": m}, "state": "done", "env_id": None}  # noqa: E731 (a row)
    out = compare([old(10.0)], [old(12.0)], {})
    cell = out["cells"][0]
    assert cell["ratio"] == 1.2 and cell["ci_low"] is None and cell["verdict"] == "inconclusive"
    assert "stored medians" in cell["reason"]


def test_runs_resampled_when_repeats_exist_keep_drift_from_passing_for_a_difference():
    """A/A where every run carries its own offset (drift, 4 % spread) and little noise within runs:
    pooling samples judges most such pairs different; resampling runs keeps false alarms rare."""
    from worker.stats import grouped_ratio_interval

    def side(rng, runs=4, n=15):
        offsets = 10 * (1 + rng.normal(0, 0.04, runs))  # one per run
        return [list(off * (1 + rng.normal(0, 0.005, n))) for off in offsets]

    rng = np.random.default_rng(0)
    flat_alarms = grouped_alarms = 0
    trials = 60
    for seed in range(trials):
        a, b = side(rng), side(rng)
        _, lo, hi = ratio_interval(sum(a, []), sum(b, []), resamples=500, seed=seed)
        flat_alarms += verdict(lo, hi, 0.02) == "slower"
        _, lo, hi = grouped_ratio_interval(a, b, resamples=500, seed=seed)
        grouped_alarms += verdict(lo, hi, 0.02) == "slower"
    assert flat_alarms >= 5  # the pooled interval is blind to drift: false alarms
    assert grouped_alarms <= 0.05 * trials


def test_compare_resamples_runs_from_three_repeats():
    rng = np.random.default_rng(1)

    def rows(repeats):
        return [{"params": {"x": 1}, "state": "done", "env_id": None,
                 "metrics": {"samples_ms": list(rng.normal(10, 0.1, 10))}} for _ in range(repeats)]

    assert compare(rows(3), rows(3), {})["cells"][0]["interval_over"] == "runs"
    assert compare(rows(2), rows(3), {})["cells"][0]["interval_over"] == "samples"


def test_a_sustained_cells_rounds_are_its_runs():
    # one row a side, three rounds each: each round sits at its own clock (offsets of 6 %), with
    # little noise within it. Its rounds are resampled as runs, so the offsets widen the interval
    rng = np.random.default_rng(7)

    def row(offsets, n=30, round_samples=True):
        samples = [x for off in offsets for x in rng.normal(10 * off, 0.02, n)]
        counts = {"round_samples": [n] * len(offsets)} if round_samples else {}
        return [{"params": {"x": 1}, "state": "done", "env_id": None, "metrics": {"samples_ms": samples, **counts}}]

    a, b = row([0.94, 1.0, 1.06]), row([1.0, 1.06, 0.94])
    cell = compare(a, b, {})["cells"][0]
    assert cell["interval_over"] == "runs" and cell["a"]["n"] == 90
    assert cell["ci_low"] < 0.97 and cell["ci_high"] > 1.03  # the rounds' spread, not the samples' noise
    pooled = compare(row([0.94, 1.0, 1.06], round_samples=False), row([1.0, 1.06, 0.94], round_samples=False), {})
    assert pooled["cells"][0]["interval_over"] == "samples"
    # counts that do not account for every sample are not trusted: the row is one run
    bad = row([1.0, 1.0, 1.0])
    bad[0]["metrics"]["round_samples"] = [30, 30, 29]
    assert compare(bad, row([1.0, 1.0, 1.0]), {})["cells"][0]["interval_over"] == "samples"


def test_cells_whose_stored_samples_are_not_all_usable_times_compare_on_the_rest():
    # a sample stored as null (a NaN on the way in), a zero, a bare number or text where a list belongs:
    # the comparison and history read the usable times instead of failing on the whole sweep
    def rows(samples, median=None):
        return [{"params": {"x": 1}, "state": "done", "env_id": None,
                 "metrics": {"samples_ms": samples, **({"median_ms": median} if median is not None else {})}}]

    good = [10.0, 10.2, 9.9, 10.1, 10.0]
    result = compare(rows([*good, None, 0.0]), rows([*good, float("nan"), -1.0]), {})
    cell = result["cells"][0]
    assert cell["a"]["n"] == cell["b"]["n"] == 5 and cell["verdict"] == "same"
    for junk in (3.0, "fast", {"a": 1}, True, [None, None]):
        cell = compare(rows(junk, median="fast"), rows(good), {})["cells"][0]
        assert cell["verdict"] == "inconclusive" and cell["reason"] == "no timing samples on side A", junk


def test_a_host_bound_cell_is_judged_only_over_runs():
    rng = np.random.default_rng(4)

    def rows(median, runs, bound):
        return [{"params": {"x": 1}, "state": "done", "env_id": None,
                 "metrics": {"samples_ms": list(rng.normal(median, 0.05, 20)), "host_bound": b}}
                for b in bound[:runs]]

    # one run a side, B clearly slower: pooled samples cannot tell the host's drift from the code's
    cell = compare(rows(10, 1, [False]), rows(13, 1, [True]), {})["cells"][0]
    assert cell["verdict"] == "inconclusive" and "host-bound on side B" in cell["reason"]
    assert cell["ratio"] > 1.25  # the figures are still there
    # three runs a side: the interval resamples runs, and the verdict stands
    cell = compare(rows(10, 3, [True] * 3), rows(13, 3, [True] * 3), {})["cells"][0]
    assert cell["interval_over"] == "runs" and cell["verdict"] == "slower"
    # host-bound in fewer than half of its runs: judged as before
    cell = compare(rows(10, 2, [False, False]), rows(13, 3, [True, False, False]), {})["cells"][0]
    assert cell["verdict"] == "slower" and cell["reason"] is None
