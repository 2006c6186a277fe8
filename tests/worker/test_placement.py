"""Placement: routing by the GPUs a cell asks for, and host-wide GPU leases."""
from __future__ import annotations

import itertools

import pytest

from tests.stack import Stack, wait_until
from worker.placement import GpuLease, gpus_asked, gpus_used, route, worker_queues


def test_routing_by_gpus_asked():
    assert gpus_asked("ddp", {"device": "cuda", "world_size": 4}) == 4
    assert gpus_asked("attention", {"device": "cuda:0"}) == 1
    assert gpus_asked("ddp", {"device": "auto", "world_size": 4}) == 0  # auto may run on the CPU
    assert gpus_asked("noop", {"gpus": 2}) == 2
    assert gpus_asked("leaderboard", {"device": "cuda", "world_size": 2}) == 2  # one GPU per rank
    assert route("default", "ddp", {"device": "cuda", "world_size": 2}) == "default.gpus2"
    assert route("default", "ddp", {"device": "cpu", "world_size": 2}) == "default"
    assert worker_queues(["default", "h200"], 2) == ["default", "default.gpus1", "default.gpus2",
                                                     "h200", "h200.gpus1", "h200.gpus2"]
    assert worker_queues(["default"], 0) == ["default"]


def test_auto_uses_the_gpus_only_when_there_are_enough():
    assert gpus_used("ddp", {"device": "auto", "world_size": 2}, visible=2) == 2
    assert gpus_used("ddp", {"device": "auto", "world_size": 2}, visible=1) == 0
    assert gpus_used("model", {"device": "auto"}, visible=1) == 1
    assert gpus_used("model", {"device": "cpu"}, visible=8) == 0


def test_leases_never_share_a_gpu(tmp_path):
    ids = ["0", "1", "2"]
    a = GpuLease(2, ids, tmp_path)
    assert a.acquire() == ["0", "1"]
    b = GpuLease(2, ids, tmp_path, poll_s=0.01)
    assert not b._try_take() and b.held == []  # only one is free: it takes none (all or nothing)
    c = GpuLease(1, ids, tmp_path)
    assert c.acquire() == ["2"]
    a.release()
    assert b.acquire() == ["0", "1"]
    with pytest.raises(InterruptedError):
        GpuLease(1, ids, tmp_path, poll_s=0.01, cancelled=lambda: True).acquire()
    with pytest.raises(ValueError, match="needs 4 GPUs; this worker has 3"):
        GpuLease(4, ids, tmp_path)


@pytest.fixture
def two_gpu_workers(tmp_path):
    """One API and two workers on one host, each advertising the same two (fake) GPUs."""
    env = {"BENCHLAB_GPUS": "FakeGPU,FakeGPU", "BENCHLAB_GPU_LOCK_DIR": str(tmp_path / "locks"),
           "BENCHLAB_HEARTBEAT_S": "0.5"}
    s = Stack(tmp_path / "data", extra_env=env)
    s.start_api()
    s.start_worker()
    second = s._spawn("worker", "--queues", s.queue, "--name", "second", log="worker2.log")
    wait_until(lambda: len(s.client.get("/api/workers").json()) == 2, 60, "both workers to beat")
    yield s
    Stack._stop(second)
    s.stop()


def test_two_workers_never_run_two_jobs_on_one_gpu(two_gpu_workers):
    s = two_gpu_workers
    sid = s.submit({"suite": "noop", "params": {"gpus": [1, 2], "x": [0, 1, 2], "sleep_ms": 400}})["id"]
    assert s.wait(sid, timeout=180)["status"] == "done"
    runs = [r["metrics"] for r in s.results(sid)]
    assert all(m["cuda_visible_devices"] for m in runs)
    assert sorted(len(m["cuda_visible_devices"].split(",")) for m in runs) == [1, 1, 1, 2, 2, 2]
    for a, b in itertools.combinations(runs, 2):
        overlap = a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"]
        if overlap:
            assert not set(a["cuda_visible_devices"].split(",")) & set(b["cuda_visible_devices"].split(","))


def test_a_job_needing_more_gpus_than_any_worker_waits_with_its_reason_and_cancels(two_gpu_workers):
    s = two_gpu_workers
    sid = s.submit({"suite": "noop", "params": {"gpus": 4}})["id"]
    job = s.results(sid)[0]
    assert job["state"] == "queued"
    detail = s.client.get(f"/api/jobs/{job['job_id']}").json()
    assert "waiting for a worker with 4 GPU(s)" in detail["progress"] and "at most 2" in detail["progress"]
    assert s.client.post(f"/api/sweeps/{sid}/cancel").status_code == 200
    assert s.wait(sid, timeout=30)["status"] == "cancelled"
