from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from worker.harness import (
    SUSTAIN_ESTIMATE_CALLS,
    Timing,
    is_oom,
    measure,
    measure_rounds,
    measure_sustained,
    measure_turns,
    quantile,
)


def test_quantiles_and_timing_summary():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    t = Timing.from_samples(xs)
    assert t.median_ms == 3.0 and t.samples == 5 and t.min_ms == 1.0
    assert quantile(sorted(xs), 0.2) == pytest.approx(1.8) and t.p80_ms == pytest.approx(4.2)
    with pytest.raises(ValueError):
        Timing.from_samples([])


def test_measure_runs_warmup_then_repeats_with_setup():
    calls = {"fn": 0, "setup": 0}
    t = measure(lambda: calls.__setitem__("fn", calls["fn"] + 1), warmup=2, repeats=4,
                setup=lambda: calls.__setitem__("setup", calls["setup"] + 1))
    assert calls == {"fn": 6, "setup": 6} and t.samples == 4


def test_turns_take_each_sample_of_every_callable_before_the_next_and_rotate_who_goes_first():
    log = []
    a, b = measure_turns([lambda: log.append("A"), lambda: log.append("B")], warmup=1, repeats=3,
                         setup=lambda: log.append("s"))
    assert "".join(log) == "sAsB" + "sAsB" + "sBsA" + "sAsB"  # warm-up, then AB, BA, AB
    assert a.samples == b.samples == 3 and len(a.samples_ms) == 3
    three = []
    measure_turns([lambda i=i: three.append(i) for i in range(3)], warmup=0, repeats=3)
    assert three == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    with pytest.raises(ValueError, match="repeats"):
        measure_turns([lambda: None], repeats=0)
    with pytest.raises(ValueError, match="no callables"):
        measure_turns([])


def fake_clock(monkeypatch) -> dict:
    """worker.harness's clock replaced by one that only the test's calls advance (`ns`)."""
    import types

    import worker.harness as harness

    clock = {"ns": 0}
    monkeypatch.setattr(harness, "time", types.SimpleNamespace(perf_counter_ns=lambda: clock["ns"]))
    return clock


def test_turns_see_the_same_drift(monkeypatch):
    """Two identical calls while the host slows down call by call (a clock that each call advances by
    a growing step): cell after cell, the second reads slower; in turns the two read alike."""
    clock = fake_clock(monkeypatch)
    clock["step"] = 100_000

    def call():
        clock["ns"] += clock["step"]
        clock["step"] += 10_000  # every call makes the next 0.01 ms slower: drift

    first = measure(call, warmup=0, repeats=10)
    second = measure(call, warmup=0, repeats=10)
    assert second.median_ms == pytest.approx(first.median_ms + 0.1)  # 10 calls later, 0.1 ms slower
    a, b = measure_turns([call, call], warmup=0, repeats=10)
    assert abs(a.median_ms - b.median_ms) <= 0.01  # at most one call's drift apart


def test_sustained_rounds_run_each_callable_alone_for_its_time_and_rotate(monkeypatch):
    clock, log = fake_clock(monkeypatch), []

    def call(name):
        def fn():
            log.append(name)
            clock["ns"] += 1_000_000  # 1 ms a call
        return fn

    a, b = measure_sustained([call("A"), call("B")], sustain_ms=4, rounds=2, warmup=1,
                             setup=lambda: log.append("s"))
    each = 1 + SUSTAIN_ESTIMATE_CALLS + 4  # warm-up, the estimate's calls, then 4 ms of 1 ms calls
    assert "".join(x for x in log if x != "s") == "A" * each + "B" * each + "B" * each + "A" * each
    assert log.count("s") == 4 * each  # setup before every call, timed or not
    assert [t.samples for t in a] == [4, 4] and a[0].samples_ms == [1.0] * 4 and len(b) == 2
    assert Timing.pooled(a).samples == 8


def test_sustained_calls_are_at_least_one_and_at_most_max_calls(monkeypatch):
    clock = fake_clock(monkeypatch)

    def fn():
        clock["ns"] += 2_000_000  # 2 ms a call

    assert measure_sustained([fn], sustain_ms=0.5, rounds=1, warmup=0)[0][0].samples == 1
    assert measure_sustained([fn], sustain_ms=1000, rounds=1, warmup=0, max_calls=7)[0][0].samples == 7
    for bad, match in (({"rounds": 0}, "rounds"), ({"sustain_ms": 0}, "sustain_ms"), ({"max_calls": 0}, "max_calls")):
        with pytest.raises(ValueError, match=match):
            measure_sustained([fn], **{"sustain_ms": 1, **bad})
    with pytest.raises(ValueError, match="no callables"):
        measure_sustained([], sustain_ms=1)


def test_sustained_timing_sees_what_each_callable_does_to_the_chip_and_turns_do_not(monkeypatch):
    """A chip that slows with recent load, as one at its power limit does: A heats it, B does not, and
    both do the same work. Alternating sample by sample, each runs at the mixture's heat and they read
    alike; each alone for a while, A reads slower than B, as do_bench would read them."""
    clock, chip = fake_clock(monkeypatch), {"heat": 0.0}

    def call(heats: float):
        def fn():
            chip["heat"] = 0.9 * chip["heat"] + heats  # settles at 10 * heats
            clock["ns"] += int(100_000 * (1 + chip["heat"] / 10))
        return fn

    hot, cool = call(1.0), call(0.0)
    a, b = measure_turns([hot, cool], warmup=10, repeats=40)
    assert b.median_ms / a.median_ms == pytest.approx(1.0, abs=0.1)
    rounds = measure_sustained([hot, cool], sustain_ms=20, rounds=2, warmup=10)
    alone_a, alone_b = Timing.pooled(rounds[0]), Timing.pooled(rounds[1])
    assert alone_a.median_ms / alone_b.median_ms > 1.8  # A at 2x B's time per call once the heat settles


def test_timing_keeps_the_host_samples_beside_the_device_ones():
    t = Timing.from_samples([2.0, 1.0, 3.0], host_samples_ms=[0.5, 0.1, 0.3])
    assert t.host_median_ms == 0.3 and t.host_samples_ms == [0.5, 0.1, 0.3]
    assert Timing.from_samples([1.0]).host_median_ms is None  # off CUDA the host's time is the sample


@pytest.mark.gpu
def test_a_head_start_times_the_gpu_alone_when_the_host_is_slower():
    """A call that sleeps 5 ms on the host and then runs a short kernel: back to back, its CUDA-event
    samples read the host's 5 ms; with a head start they read the kernel alone."""
    import time

    from worker.harness import HOST_BOUND, gpu_busy

    x = torch.randn(1 << 20, device="cuda")

    def host_slow():
        time.sleep(0.005)
        x.mul_(1.0)

    paced = measure(host_slow, warmup=2, repeats=10, device="cuda")
    alone = measure(host_slow, warmup=2, repeats=10, device="cuda", head_start=True)
    assert paced.median_ms > 4.5 and paced.host_median_ms > 4.5
    assert alone.median_ms < 1.0 and alone.host_median_ms > 4.5  # the host's time is the same either way
    assert gpu_busy(paced, alone) < HOST_BOUND


@pytest.mark.gpu
def test_turns_on_cuda_keep_event_and_host_samples_for_each_callable():
    x = torch.randn(1 << 22, device="cuda")
    small, large = measure_turns([lambda: x[:1 << 10].mul_(1.0), lambda: x.mul_(1.0).mul_(1.0)], warmup=2,
                                 repeats=10, device="cuda")
    for t in (small, large):
        assert t.samples == 10 and len(t.host_samples_ms) == 10 and t.median_ms > 0
    assert large.median_ms > small.median_ms  # the events bracket each callable's own work


@pytest.mark.gpu
def test_sustained_on_cuda_keeps_event_and_host_samples_per_round():
    x = torch.randn(1 << 22, device="cuda")
    small, large = measure_sustained([lambda: x[:1 << 10].mul_(1.0), lambda: x.mul_(1.0).mul_(1.0)],
                                     sustain_ms=20, rounds=2, device="cuda")
    for rounds in (small, large):
        assert len(rounds) == 2
        for t in rounds:
            assert t.samples > 1 and len(t.host_samples_ms) == t.samples and t.median_ms > 0
    assert Timing.pooled(large).median_ms > Timing.pooled(small).median_ms


@pytest.mark.parametrize("exc,expected", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), True),
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
    (MemoryError(), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("out of memory"), False),
])
def test_oom_classifier_on_real_exception_types(exc, expected):
    assert is_oom(exc) is expected


def test_oom_on_cpu_allocator_is_classified():
    try:
        torch.empty(1 << 62, dtype=torch.uint8)
    except Exception as exc:  # noqa: BLE001 (the test inspects whatever was raised)
        assert is_oom(exc), repr(exc)
    else:
        pytest.skip("the allocator accepted an exabyte")


def test_fingerprint_prefers_the_given_commit_over_git(monkeypatch):
    # a GPU host may get a tree whose .git is stale: an explicit commit must be what is recorded, given as an
    # argument (a benchmark's --commit) or, for every benchmark of a run at once, as BENCHLAB_COMMIT
    import subprocess
    from pathlib import Path

    from worker.harness import fingerprint

    assert fingerprint("abc1234")["git_commit"] == "abc1234"
    monkeypatch.setenv("BENCHLAB_COMMIT", "def5678")
    assert fingerprint(None)["git_commit"] == "def5678"
    assert fingerprint("abc1234")["git_commit"] == "abc1234"
    monkeypatch.delenv("BENCHLAB_COMMIT")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                          text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    # without one, git's answer (asked here independently), marked -dirty when the tree has changes
    assert fingerprint(None)["git_commit"].removesuffix("-dirty") == head.stdout.strip()


def test_cpu_ranks_are_at_most_one_per_cpu_of_the_worker_but_two_always_run():
    import os

    from worker.harness import SkipCell, resolve_rank_device

    cpus = max(2, len(os.sched_getaffinity(0)))
    assert resolve_rank_device("cpu", 2) == "cpu" and resolve_rank_device("cpu", cpus) == "cpu"
    with pytest.raises(SkipCell, match=f"this host gives the worker {cpus} CPUs"):
        resolve_rank_device("cpu", cpus + 1)


def test_turn_order_rotates_the_first_and_keeps_the_cycle():
    from worker.harness import turn_order

    assert [turn_order(["a", "b", "c"], i) for i in range(4)] == [["a", "b", "c"], ["b", "c", "a"],
                                                                  ["c", "a", "b"], ["a", "b", "c"]]
    assert turn_order([1], 5) == [1]


def test_rounds_take_the_callables_in_turns_and_each_round_starts_one_later(monkeypatch):
    # no callable always runs first (on a chip cooled by the compiles) or behind the same heavy one; each
    # callable's list keeps its rounds in order
    import worker.harness

    order = []

    def fake_measure(fn, **kwargs):
        order.append(fn())
        return SimpleNamespace(median_ms=float(len(order)), host_median_ms=0.0)

    monkeypatch.setattr(worker.harness, "measure", fake_measure)
    ms = worker.harness.measure_rounds({name: (lambda n=name: n) for name in "abc"}, rounds=4, repeats=5)
    assert order == list("abc" "bca" "cab" "abc")
    assert ms == {"a": [1.0, 6.0, 8.0, 10.0], "b": [2.0, 4.0, 9.0, 11.0], "c": [3.0, 5.0, 7.0, 12.0]}


def test_rounds_keep_host_times_per_round_and_pass_the_head_start_and_counts_on(monkeypatch):
    # the host's time to issue each callable goes beside its GPU time, so a launch cost that shows as GPU
    # time (the GPU idle between the flush and the kernel) can be told apart
    import worker.harness

    seen = []

    def fake_measure(fn, **kwargs):
        seen.append((kwargs["head_start"], kwargs["warmup"], kwargs["repeats"], kwargs["device"]))
        return SimpleNamespace(median_ms=1.0, host_median_ms={"a": 1, "b": 10}[fn()] * len(seen))

    monkeypatch.setattr(worker.harness, "measure", fake_measure)
    host: dict = {}
    worker.harness.measure_rounds({name: (lambda n=name: n) for name in "ab"}, rounds=2, repeats=5, warmup=2,
                                  device="cuda", head_start=True, host=host)
    assert seen == [(True, 2, 5, "cuda")] * 4
    assert host == {"a": [1, 4], "b": [20, 30]}  # round 2 runs b (3rd call) then a (4th)


def test_rounds_of_real_calls_on_the_cpu_count_warmup_and_repeats():
    counts = {"a": 0, "b": 0}

    def call(name):
        def run():
            counts[name] += 1
        return run

    ms = measure_rounds({"a": call("a"), "b": call("b")}, rounds=3, repeats=4, warmup=2)
    assert counts == {"a": 3 * (2 + 4), "b": 3 * (2 + 4)}
    assert all(len(v) == 3 and min(v) >= 0 for v in ms.values())
