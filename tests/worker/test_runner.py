"""The warm runner: reuse, replacement, and every way a job can end."""
from __future__ import annotations

import functools
import os
import signal
import threading
import time

import pytest

from worker.runner import Runner


@pytest.fixture(scope="module")
def runner():
    r = Runner(max_jobs=100)
    yield r
    r.stop()


def job(tmp_path, **params):
    return {"suite": "noop", "params": params, "artifact_dir": str(tmp_path / "a")}


def test_runner_is_reused_between_jobs(runner, tmp_path):
    assert runner.run(job(tmp_path, x=1), timeout_s=60).state == "done"
    pid = runner.pid
    out = runner.run(job(tmp_path, x=2), timeout_s=60)
    assert out.state == "done" and out.metrics["value"] == 4.0 and runner.pid == pid
    assert out.env["python"]


def test_killed_mid_job_is_failed_with_reason_then_replaced(runner, tmp_path):
    runner.run(job(tmp_path), timeout_s=60)
    pid = runner.pid
    threading.Timer(0.5, lambda: os.kill(pid, signal.SIGKILL)).start()
    out = runner.run(job(tmp_path, sleep_ms=10_000), timeout_s=60)
    assert out.state == "failed" and "died" in out.error and "signal 9" in out.error
    nxt = runner.run(job(tmp_path, x=3), timeout_s=60)
    assert nxt.state == "done" and runner.pid != pid


def within(seconds: float, fn):
    """fn() run on a thread that must finish within `seconds` (a deadline, not a measurement)."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"did not return within {seconds} s"
    return box["out"]


def test_timeout_kills_and_replaces(runner, tmp_path):
    out = within(30, lambda: runner.run(job(tmp_path, mode="hang"), timeout_s=1.5))
    assert out.state == "timeout"
    assert runner.run(job(tmp_path), timeout_s=60).state == "done"


def test_fresh_process_on_request(runner, tmp_path):
    runner.run(job(tmp_path), timeout_s=60)
    pid = runner.pid
    runner.run(job(tmp_path), timeout_s=60, fresh=True)
    assert runner.pid != pid


def test_max_jobs_replaces_the_runner(tmp_path):
    r = Runner(max_jobs=2)
    try:
        pids = []
        for _ in range(3):
            assert r.run(job(tmp_path), timeout_s=60).state == "done"
            pids.append(r.pid)
        assert pids[0] == pids[1] != pids[2]
    finally:
        r.stop()


def test_states_from_the_suite(runner, tmp_path):
    assert runner.run(job(tmp_path, mode="oom"), timeout_s=60).state == "oom"
    assert runner.run(job(tmp_path, mode="skip"), timeout_s=60).state == "skipped"
    bad = runner.run({"suite": "noop", "params": {"x": "nope"}, "artifact_dir": str(tmp_path)}, timeout_s=60)
    assert bad.state == "failed" and "x" in bad.error


def test_progress_is_forwarded(runner, tmp_path):
    seen = []
    out = runner.run({"suite": "model", "params": {"size": "custom", "d_model": 16, "d_ff": 32, "num_layers": 1,
                                                     "num_heads": 2, "context_length": 8, "batch": 1,
                                                     "vocab_size": 32, "steps": 1, "warmup": 0},
                      "artifact_dir": str(tmp_path)}, timeout_s=120, on_progress=seen.append)
    assert out.state == "done", out.error
    assert any("warm-up" in s for s in seen)


def test_job_timeout_does_not_count_the_runner_start(tmp_path):
    # a start that takes 2 s (as torch's import can on a busy host) must not eat a 1 s job budget
    r = Runner(prepare=functools.partial(time.sleep, 2.0))
    try:
        out = r.run(job(tmp_path, x=1), timeout_s=1.0)
        assert out.state == "done", out.error
    finally:
        r.stop()


def test_runner_that_dies_while_starting_is_a_failed_job(tmp_path):
    r = Runner(prepare=functools.partial(os._exit, 3))
    out = r.run(job(tmp_path), timeout_s=60)
    assert out.state == "failed" and "exited before it was ready (exit code 3)" in out.error
    assert "did not run" in out.error and r.pid is None


def test_runner_start_is_bounded(tmp_path):
    r = Runner(startup_timeout_s=1.0, prepare=functools.partial(time.sleep, 60))
    out = within(30, lambda: r.run(job(tmp_path), timeout_s=60))
    assert out.state == "failed" and "did not start within 1 s" in out.error
    assert r.pid is None


def test_startup_timeout_must_be_positive():
    with pytest.raises(ValueError, match="startup_timeout_s"):
        Runner(startup_timeout_s=0)


def test_memory_limit_kills_the_job_as_oom_then_replaces(tmp_path):
    r = Runner(memory_limit_gb=0.8)  # torch's import leaves the runner well under this
    try:
        assert r.run(job(tmp_path, hold_mb=16), timeout_s=60).state == "done"
        pid = r.pid
        out = within(60, lambda: r.run(job(tmp_path, hold_mb=1024, sleep_ms=60_000), timeout_s=120))
        assert out.state == "oom" and "past the runner's limit of 0.8 GB" in out.error
        assert r.pid is None or r.pid != pid
        assert r.run(job(tmp_path, x=1), timeout_s=60).state == "done"
    finally:
        r.stop()


def test_memory_limit_counts_every_process_of_the_group():
    import multiprocessing as mp

    from worker.runner import group_rss_bytes

    group = os.getpgid(os.getpid())
    child = mp.get_context("spawn").Process(target=time.sleep, args=(30,))
    child.start()  # a process of this test's group, as a rank is of its runner's
    try:
        time.sleep(1.0)  # the child's interpreter starts up
        with_child = group_rss_bytes(group)
    finally:
        child.kill()
        child.join()
    assert with_child > group_rss_bytes(group) > 0  # the child's interpreter is megabytes
    assert group_rss_bytes(-1) == 0  # no such group: nothing counted


def test_memory_limit_must_be_positive():
    with pytest.raises(ValueError, match="memory_limit_gb"):
        Runner(memory_limit_gb=0)
