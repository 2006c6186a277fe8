"""Two API processes (each with its recorder) on one PostgreSQL database and one Redis, with a worker:
both serve the same sweeps, the recorders share the results queue safely, every cell is recorded once."""
from __future__ import annotations

import uuid

import psycopg

from tests.stack import Stack


def test_two_api_processes_on_one_postgres_database(tmp_path, redis_url, postgres_url):
    database_url = postgres_url
    env = {"BENCHLAB_DATABASE_URL": database_url}
    queue = f"pg-{uuid.uuid4().hex[:8]}"
    a = Stack(tmp_path / "a", broker_url=redis_url, queue=queue, extra_env=env)
    b = Stack(tmp_path / "b", broker_url=redis_url, queue=queue, extra_env=env)
    try:
        a.start_api()
        b.start_api()  # two processes migrate the same database at once: one waits for the other
        a.start_worker()
        ids = [a.submit({"suite": "noop", "params": {"x": list(range(10))}})["id"],
               b.submit({"suite": "noop", "params": {"x": list(range(10, 20))}})["id"]]
        for sid in ids:
            assert a.wait(sid)["counts"]["done"] == 10
            assert b.client.get(f"/api/sweeps/{sid}").json()["counts"]["done"] == 10  # the same data
        assert [s["id"] for s in a.client.get("/api/sweeps").json()] == \
               [s["id"] for s in b.client.get("/api/sweeps").json()]
        with psycopg.connect(database_url) as con:
            dup = con.execute("SELECT job_id, attempt FROM result GROUP BY job_id, attempt HAVING count(*) > 1")
            assert dup.fetchall() == []
            assert con.execute("SELECT count(*) FROM result").fetchone()[0] == 20
            assert con.execute("SELECT version_num FROM alembic_version").fetchall() != []
    finally:
        a.stop()
        b.stop()
