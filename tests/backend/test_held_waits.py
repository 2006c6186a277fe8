"""Held waits (GET /api/sweeps/{id}?wait_s=) against a real API process: they hold no thread and no
database connection, so writes and health checks stay served; beyond the cap they answer 429."""
from __future__ import annotations

import threading
import time

import httpx

from tests.stack import Stack


def test_sixty_held_waits_leave_writes_and_health_served(tmp_path):
    s = Stack(tmp_path, extra_env={"BENCHLAB_MAX_WAITERS": "60"})
    s.start_api()  # no worker: the sweep stays queued and every wait is held
    try:
        sid = s.submit({"suite": "noop"})["id"]
        answers: list[int] = []

        def hold():
            with httpx.Client(base_url=s.url, timeout=60) as c:
                answers.append(c.get(f"/api/sweeps/{sid}", params={"wait_s": 30}).status_code)

        threads = [threading.Thread(target=hold) for _ in range(60)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while s.client.get("/api/health").json()["held_waits"] < 60:
            assert time.monotonic() < deadline, "the 60 waits were not all held"
            time.sleep(0.1)
        with httpx.Client(base_url=s.url, timeout=5) as fast:  # a deadline, not a timing assertion
            assert fast.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1, 2]}}).status_code == 201
            assert fast.get("/api/health").json()["status"] == "ok"
            assert fast.get(f"/api/sweeps/{sid}/results").status_code == 200
            over = fast.get(f"/api/sweeps/{sid}", params={"wait_s": 5})
            assert over.status_code == 429 and "BENCHLAB_MAX_WAITERS" in over.json()["detail"]
            assert fast.get(f"/api/sweeps/{sid}").status_code == 200  # a plain read is never refused
            assert fast.post(f"/api/sweeps/{sid}/cancel").status_code == 200  # wakes every waiter
        for t in threads:
            t.join(15)
        assert answers == [200] * 60
        assert s.client.get("/api/health").json()["held_waits"] == 0
    finally:
        s.stop()
