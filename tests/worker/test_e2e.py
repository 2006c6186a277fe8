"""A sweep through the real path: REST -> Celery (embedded broker, then Redis) -> runner -> recorder -> SQLite."""
from __future__ import annotations

import time
import uuid

import pytest

from tests.stack import Stack


@pytest.fixture(scope="module", params=["embedded", "redis"])
def stack(request, tmp_path_factory):
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        s = Stack(tmp_path_factory.mktemp("redis"), broker_url=url, queue=f"test-{uuid.uuid4().hex[:8]}")
    else:
        s = Stack(tmp_path_factory.mktemp("embedded"))
    s.start()
    yield s
    s.stop()


def test_sweep_runs_to_done_with_results_and_fingerprint(stack):
    sweep = stack.submit({"suite": "noop", "params": {"x": [1, 2, 3]}, "name": "e2e", "tags": {"ci": "yes"}})
    assert sweep["jobs"] == 3
    summary = stack.wait(sweep["id"])
    assert summary["status"] == "done" and summary["counts"]["done"] == 3
    rows = stack.results(sweep["id"])
    assert [r["metrics"]["value"] for r in rows] == [2.0, 4.0, 6.0]
    job = stack.client.get(f"/api/jobs/{rows[0]['job_id']}").json()
    assert job["env"]["torch"] and job["env"]["python"]
    assert job["worker"]


def test_attention_cell_on_cpu(stack):
    sweep = stack.submit({"suite": "attention", "params": {"impl": ["naive", "flash_pytorch"], "seq_len": 32,
                                                             "batch": 1, "heads": 2, "d_head": 16, "dtype": "fp32",
                                                             "pass": "fwd_bwd", "repeats": 2, "warmup": 1}})
    stack.wait(sweep["id"])
    rows = stack.results(sweep["id"])
    assert [r["state"] for r in rows] == ["done", "done"], rows
    for r in rows:
        assert r["metrics"]["median_ms"] > 0 and r["metrics"]["samples"] == 2 and r["metrics"]["tflops"] > 0


def test_leaderboard_cell_at_toy_scale_through_the_worker(stack):
    # two gloo ranks spawned by the runner the worker starts; the step and its split are recorded
    sweep = stack.submit({"suite": "leaderboard", "params": {
        "world_size": 2, "scale": 1 / 34, "d_model": 64, "d_ff": 128, "num_heads": 4, "vocab_size": 256,
        "device": "cpu", "attention": "sdpa", "sharding": "fsdp", "steps": 2, "warmup": 1}})
    stack.wait(sweep["id"])
    [row] = stack.results(sweep["id"])
    assert row["state"] == "done", row
    m = row["metrics"]
    assert m["samples"] == 2 and len(m["peak_mem_by_rank"]) == 2 and m["forward_ms"] > 0 and m["optimizer_ms"] > 0


def test_each_way_a_job_ends_is_recorded_and_the_worker_carries_on(stack):
    modes = ["raise", "crash", "oom", "skip", "ok"]
    sweep = stack.submit({"suite": "noop", "params": {"mode": modes}, "timeout_s": 60})
    stack.wait(sweep["id"])
    by_mode = {r["params"]["mode"]: r for r in stack.results(sweep["id"])}
    assert by_mode["raise"]["state"] == "failed" and "raised on purpose" in by_mode["raise"]["error"]
    assert by_mode["crash"]["state"] == "failed" and "runner process died" in by_mode["crash"]["error"]
    assert by_mode["oom"]["state"] == "oom"
    assert by_mode["skip"]["state"] == "skipped" and "asked to skip" in by_mode["skip"]["error"]
    assert by_mode["ok"]["state"] == "done"  # the job after the crash ran in a fresh runner


def test_timeout_is_recorded_and_next_job_runs(stack):
    sweep = stack.submit({"suite": "noop", "params": {"mode": ["hang", "ok"]}, "timeout_s": 3})
    stack.wait(sweep["id"], timeout=120)
    states = {r["params"]["mode"]: r for r in stack.results(sweep["id"])}
    assert states["hang"]["state"] == "timeout" and "timeout of 3 s" in states["hang"]["error"]
    assert states["ok"]["state"] == "done"


def test_retry_requeues_only_failed_cells(stack):
    sweep = stack.submit({"suite": "noop", "params": {"mode": ["raise", "ok"]}})
    stack.wait(sweep["id"])
    r = stack.client.post(f"/api/sweeps/{sweep['id']}/retry")
    assert r.json()["requeued"] == 1
    stack.wait(sweep["id"])
    rows = {x["params"]["mode"]: x for x in stack.results(sweep["id"])}
    assert rows["raise"]["attempts"] == 2 and rows["ok"]["attempts"] == 1
    job = stack.client.get(f"/api/jobs/{rows['raise']['job_id']}").json()
    assert [h["attempt"] for h in job["history"]] == [1, 2]  # the first attempt's result is kept


def test_a_retried_jobs_artifacts_are_kept_per_attempt(stack):
    sweep = stack.submit({"suite": "noop", "params": {"mode": "raise", "artifact": True}})
    stack.wait(sweep["id"])
    stack.client.post(f"/api/sweeps/{sweep['id']}/retry")
    stack.wait(sweep["id"])
    [row] = stack.results(sweep["id"])
    assert row["attempts"] == 2 and [a["name"] for a in row["artifacts"]] == ["noop.json"], row
    url = f"/api/jobs/{row['job_id']}/artifacts/noop.json"
    first, second = (stack.client.get(url, params={"attempt": n}).json()["at"] for n in (1, 2))
    assert first < second  # the retry wrote its own file; the first attempt's is still there
    assert stack.client.get(url).json()["at"] == second  # unnamed: the newest attempt's


def queued_messages(stack) -> int:
    """Messages still waiting on the broker for this stack's queue (claimed ones count too)."""
    url = stack.env.get("BENCHLAB_BROKER_URL")
    if url:
        import redis

        return redis.Redis.from_url(url).llen(stack.queue)
    return len([p for p in (stack.data_dir / "broker" / "queue").iterdir() if f".{stack.queue}.msg" in p.name])


def test_cancel_mid_way_starts_no_new_cells(stack):
    sweep = stack.submit({"suite": "noop", "params": {"x": list(range(30)), "sleep_ms": 200}})
    deadline = time.monotonic() + 60
    while stack.client.get(f"/api/sweeps/{sweep['id']}").json()["counts"]["done"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = stack.client.post(f"/api/sweeps/{sweep['id']}/cancel")
    assert r.status_code == 200
    cancelled_at = time.time()
    # every message of the sweep has reached the worker (which skips cancelled ones): only then
    # could a cell have started after the cancel
    deadline = time.monotonic() + 60
    while queued_messages(stack) > 0:
        assert time.monotonic() < deadline, "the worker did not take the sweep's messages"
        time.sleep(0.05)
    summary = stack.wait(sweep["id"])
    assert summary["status"] == "cancelled"
    rows = stack.results(sweep["id"])
    started_after = [x for x in rows if x["started_at"] and x["started_at"] > cancelled_at + 0.05]
    assert not started_after, started_after
    assert summary["counts"]["cancelled"] >= 20
    assert summary["counts"]["done"] + summary["counts"]["cancelled"] == 30


def test_model_cell_with_profile_artifacts_downloadable(stack):
    sweep = stack.submit({"suite": "model", "params": {
        "size": "custom", "d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 2, "context_length": 16,
        "batch": 2, "vocab_size": 64, "steps": 2, "warmup": 1, "profile": True, "memory_detail": True,
        "scope": ["fwd", "fwd_bwd", "step"]}})
    stack.wait(sweep["id"], timeout=180)
    rows = stack.results(sweep["id"])
    assert all(r["state"] == "done" for r in rows), rows
    step = next(r for r in rows if r["params"]["scope"] == "step")
    names = {a["name"]: a["size"] for a in step["artifacts"]}
    assert {"trace.json", "kernels.json"} <= set(names)
    r = stack.client.get(f"/api/jobs/{step['job_id']}/artifacts/trace.json")
    assert r.status_code == 200 and len(r.content) == names["trace.json"]
    assert "traceEvents" in r.json()
    assert step["metrics"]["saved_bytes_per_block"] > 0
    assert stack.client.get(f"/api/jobs/{step['job_id']}/artifacts/nope.json").status_code == 404
