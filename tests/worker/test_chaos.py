"""Faults injected into real processes: kill -9 of a worker, of Redis, of the API; stop signals.

Every job ends in a final state, no process of a stopped stack remains, and each attempt has at
most one result row.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.stack import ROOT, Stack, alive, child_running, children_of, free_port, wait_until

LOST_ENV = {"BENCHLAB_WORKER_LOST_AFTER_S": "4", "BENCHLAB_REAP_INTERVAL_S": "0.5", "BENCHLAB_HEARTBEAT_S": "1"}


def runners_of(pid: int) -> set[int]:
    """The runner processes among `pid`'s descendants (not multiprocessing's resource tracker)."""
    found = set()
    for child in children_of(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"multiprocessing" in cmd and b"resource_tracker" not in cmd:
            found.add(child)
    return found


def job_state(stack: Stack, job_id: int) -> dict:
    return stack.client.get(f"/api/jobs/{job_id}").json()


@pytest.fixture(params=["embedded", "redis"])
def stack(request, tmp_path):
    kw = {"extra_env": LOST_ENV}
    if request.param == "redis":
        kw.update(broker_url=request.getfixturevalue("redis_url"), queue=f"chaos-{uuid.uuid4().hex[:8]}")
    s = Stack(tmp_path, **kw).start()
    yield s
    s.stop()


def test_kill_9_of_the_worker_mid_job_ends_the_job_and_leaves_no_runner(stack):
    sweep = stack.submit({"suite": "noop", "params": {"sleep_ms": 8_000}, "timeout_s": 120})
    job = stack.results(sweep["id"])[0]["job_id"]
    wait_until(lambda: job_state(stack, job)["state"] == "running", 60, "job running")
    worker_pid = stack.worker_proc.pid
    tree = wait_until(lambda: children_of(worker_pid), 10, "runner started")
    os.kill(worker_pid, signal.SIGKILL)
    stack.worker_proc.wait(10)
    wait_until(lambda: not any(alive(p) for p in tree), 10, "runner of the dead worker gone")
    stack.start_worker()  # a replacement: with the embedded broker it gets the claimed job back
    final = wait_until(lambda: (j := job_state(stack, job))["state"] not in ("queued", "running") and j,
                       60, "job final")
    # done after redelivery to the replacement, or declared lost by the reaper: never left hanging
    assert final["state"] == "done" or (final["state"] == "failed" and final["error"].startswith("worker lost")), \
        final
    assert len(final["history"]) == 1  # one result for the attempt


def test_a_worker_stopped_by_sigterm_says_goodbye(tmp_path):
    # the default silence limit (30 s) is far off: only the worker's last heartbeat, `stopping`, can
    # mark it gone within the wait below
    s = Stack(tmp_path).start()
    try:
        workers = wait_until(lambda: s.client.get("/api/workers").json(), 60, "the worker's first heartbeat")
        assert [w["alive"] for w in workers] == [True]
        s._stop(s.worker_proc)
        assert s.worker_proc.returncode == 0
        wait_until(lambda: not s.client.get("/api/workers").json()[0]["alive"], 15, "the worker's goodbye")
        assert "Traceback" not in (tmp_path / "worker.log").read_text()
    finally:
        s.stop()


def test_a_worker_stopped_while_it_starts_exits_cleanly(tmp_path):
    # SIGTERM as soon as the banner is out: Celery is still starting and has no handlers of its own yet
    s = Stack(tmp_path)
    s.start_api()
    try:
        s.start_worker()
        log = tmp_path / "worker.log"
        wait_until(lambda: log.exists() and "benchlab worker" in log.read_text(), 60, "the worker's banner")
        s._stop(s.worker_proc)
        assert s.worker_proc.returncode == 0, log.read_text()[-3000:]
        assert "Traceback" not in log.read_text()
        # the goodbye went out: the worker is listed, and not alive
        workers = wait_until(lambda: s.client.get("/api/workers").json(), 15, "the worker's goodbye")
        assert [w["alive"] for w in workers] == [False]
    finally:
        s.stop()


def test_cancel_stops_a_running_cell(stack):
    sweep = stack.submit({"suite": "noop", "params": {"mode": "hang"}, "timeout_s": 600})
    job = stack.results(sweep["id"])[0]["job_id"]
    wait_until(lambda: job_state(stack, job)["state"] == "running", 60, "job running")
    runner = wait_until(lambda: runners_of(stack.worker_proc.pid), 10, "runner")
    assert stack.client.post(f"/api/sweeps/{sweep['id']}/cancel").status_code == 200
    final = wait_until(lambda: (j := job_state(stack, job))["state"] == "cancelled" and j, 30, "cancelled")
    assert "killed" in final["error"]
    wait_until(lambda: not any(alive(p) for p in runner), 10, "cell killed")
    after = stack.submit({"suite": "noop", "params": {"x": 5}})  # the worker carries on
    assert stack.wait(after["id"])["counts"]["done"] == 1


def _up(tmp_path: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "BENCHLAB_DATA_DIR": str(tmp_path), "BENCHLAB_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "backend.cli", "up"], cwd=ROOT, env=env,
                            stdout=open(tmp_path / "up.log", "ab"), stderr=subprocess.STDOUT)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_to_up_alone_ends_every_process_of_the_stack(tmp_path, sig):
    import httpx

    port = free_port()
    up = _up(tmp_path, port)
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        wait_until(lambda: _ok(client), 60, "api up")
        sid = client.post("/api/sweeps", json={"suite": "noop", "params": {"mode": "hang"}}).json()["id"]
        job = client.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
        wait_until(lambda: client.get(f"/api/jobs/{job}").json()["state"] == "running", 60, "running")
        tree = children_of(up.pid)
        assert len(tree) >= 2  # worker and its runner
        os.kill(up.pid, sig)  # to `up` alone, not its process group
        up.wait(10)
        wait_until(lambda: not any(alive(p) for p in tree), 10, "every process of the stack gone")
    finally:
        if up.poll() is None:
            up.kill()


def _ok(client) -> bool:
    import httpx

    try:
        return client.get("/api/health").status_code == 200
    except httpx.HTTPError:
        return False


def test_up_restarts_its_worker_when_it_dies(tmp_path):
    import httpx

    port = free_port()
    up = _up(tmp_path, port)
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        wait_until(lambda: _ok(client), 60, "api up")
        worker = wait_until(lambda: child_running(up.pid, "worker"), 30, "worker started")
        os.kill(worker, signal.SIGKILL)
        sid = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1, 2]}}).json()["id"]
        s = client.get(f"/api/sweeps/{sid}", params={"wait_s": 60}).json()
        assert s["counts"]["done"] == 2, s
        assert "restarting" in (tmp_path / "up.log").read_text()
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(15)


@pytest.fixture
def own_redis(tmp_path):
    """A Redis of this test's own with AOF on, as docker-compose.yml runs it, so it can be killed."""
    if not shutil.which("redis-server"):
        pytest.skip("no redis-server")
    port = free_port()
    folder = tmp_path / "redis"
    folder.mkdir()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--appendonly", "yes",
           "--appendfsync", "always", "--save", ""]

    def start():
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _redis_up(port), 20, "redis up")
        return proc

    holder = {"proc": start(), "start": start}
    yield f"redis://127.0.0.1:{port}/0", holder
    holder["proc"].kill()
    holder["proc"].wait(5)


def _redis_up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _one_result_per_attempt(data_dir: Path) -> None:
    import sqlite3

    con = sqlite3.connect(data_dir / "benchlab.db")
    dup = con.execute("SELECT job_id, attempt, count(*) FROM result GROUP BY job_id, attempt HAVING count(*) > 1")
    assert dup.fetchall() == []


def test_kill_9_of_redis_mid_sweep_with_aof_restart(tmp_path, own_redis):
    url, redis = own_redis
    s = Stack(tmp_path / "stack", broker_url=url, extra_env=LOST_ENV).start()
    try:
        sweep = s.submit({"suite": "noop", "params": {"x": list(range(12)), "sleep_ms": 300}})
        wait_until(lambda: s.client.get(f"/api/sweeps/{sweep['id']}").json()["counts"]["done"] >= 2, 60, "2 done")
        redis["proc"].kill()
        redis["proc"].wait(5)
        time.sleep(1.0)
        redis["proc"] = redis["start"]()
        summary = s.wait(sweep["id"], timeout=180)
        assert sum(summary["counts"][k] for k in ("done", "failed")) == 12, summary
        assert summary["counts"]["queued"] == summary["counts"]["running"] == 0
        _one_result_per_attempt(tmp_path / "stack")
    finally:
        s.stop()


def test_kill_9_of_the_api_mid_sweep_and_restart(tmp_path, redis_url):
    s = Stack(tmp_path, broker_url=redis_url, queue=f"chaos-{uuid.uuid4().hex[:8]}", extra_env=LOST_ENV).start()
    try:
        sweep = s.submit({"suite": "noop", "params": {"x": list(range(10)), "sleep_ms": 200}})
        wait_until(lambda: s.client.get(f"/api/sweeps/{sweep['id']}").json()["counts"]["done"] >= 2, 60, "2 done")
        os.killpg(s.api_proc.pid, signal.SIGKILL)
        s.api_proc.wait(5)
        # down longer than BENCHLAB_WORKER_LOST_AFTER_S: results and heartbeats pile up on the broker,
        # and the restarted API must not take its own silence for the worker's
        time.sleep(5.0)
        s.start_api()
        summary = s.wait(sweep["id"], timeout=120)
        assert summary["counts"]["done"] == 10, summary
        _one_result_per_attempt(tmp_path)
    finally:
        s.stop()
