"""The recorder with the real embedded broker: contract checks, dead letters, the reaper."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from kombu import Producer
from sqlmodel import select

from backend.db import session
from backend.main import create_app
from backend.models import DeadLetter, Job, Result, WorkerRow
from backend.service import apply_event, reap_lost_jobs
from backend.settings import BackendSettings
from tests.stack import wait_until
from worker.celery_app import RESULTS_EXCHANGE, RESULTS_QUEUE


@contextmanager
def _serving(settings: BackendSettings):
    """A client of the API with its recorder running, consuming."""
    app = create_app(settings)
    with TestClient(app) as c:
        c.app_ref = app
        assert app.state.recorder.ready.wait(20)
        yield c


@pytest.fixture
def live(tmp_path, database_url):
    with _serving(BackendSettings(data_dir=tmp_path, reap_interval_s=0.2, worker_lost_after_s=1.0,
                                  database_url=database_url)) as c:
        yield c


def send_raw(app, body, content_type="application/json", serializer=None):
    with app.state.dispatcher.app.connection_for_write() as conn:
        producer = Producer(conn.default_channel)
        if serializer:
            producer.publish(body, exchange=RESULTS_EXCHANGE, routing_key="results", serializer=serializer,
                             declare=[RESULTS_QUEUE])
        else:
            producer.publish(body, exchange=RESULTS_EXCHANGE, routing_key="results", content_type=content_type,
                             content_encoding="utf-8", declare=[RESULTS_QUEUE])


def test_garbage_goes_to_the_dead_letters_and_never_blocks_the_queue(live):
    app = live.app_ref
    sid = live.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1, 2]}}).json()["id"]
    jobs = [r["job_id"] for r in live.get(f"/api/sweeps/{sid}/results").json()]
    send_raw(app, {"type": "result", "job_id": jobs[0], "state": "exploded"}, serializer="json")  # bad state
    send_raw(app, {"hello": "world"}, serializer="json")  # no type
    send_raw(app, "not json at all {", content_type="application/json")  # undecodable
    send_raw(app, {"type": "result", "job_id": jobs[1], "state": "done", "v": 99}, serializer="json")  # newer
    send_raw(app, {"type": "result", "job_id": jobs[0], "attempt": 1, "state": "done", "metrics": {"x": 1}},
             serializer="json")  # and a good one after them
    wait_until(lambda: live.get(f"/api/jobs/{jobs[0]}").json()["state"] == "done", what="the good message applied")
    health = wait_until(lambda: (h := live.get("/api/health").json())["dead_letters"] == 4 and h, what="4 dead letters")
    assert health["recorder"] is True
    letters = live.get("/api/dead-letters").json()
    assert len(letters) == 4
    errors = " ".join(d["error"] for d in letters)
    assert "state" in errors and "cannot be decoded" in errors and "contract version 99" in errors
    assert any("exploded" in d["body"] for d in letters)
    assert live.get(f"/api/jobs/{jobs[1]}").json()["state"] == "queued"  # the v99 message changed nothing


def test_a_result_delivered_twice_writes_one_row(live):
    sid = live.post("/api/sweeps", json={"suite": "noop"}).json()["id"]
    job = live.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
    event = {"type": "result", "job_id": job, "attempt": 1, "state": "done", "metrics": {"x": 1}}
    for _ in range(3):
        send_raw(live.app_ref, event, serializer="json")
    wait_until(lambda: live.app_ref.state.recorder.applied >= 1, what="first delivery applied")
    time.sleep(0.5)  # let the copies arrive; they must change nothing
    with session(live.app_ref.state.engine) as db:
        assert len(db.exec(select(Result).where(Result.job_id == job)).all()) == 1


def _reaper_closes_the_job_of_a_silent_worker(live):
    """A worker's heartbeat and `running`, then silence: the reaper marks its job lost, and only that one."""
    sid = live.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1, 2]}}).json()["id"]
    a, b = [r["job_id"] for r in live.get(f"/api/sweeps/{sid}/results").json()]
    now = time.time()
    hb = {"type": "heartbeat", "worker": "gpu1:benchlab@gpu1", "queues": ["default"], "current": {"job_id": a}}
    send_raw(live.app_ref, {**hb, "at": now}, serializer="json")
    send_raw(live.app_ref, {"type": "state", "job_id": a, "worker": "gpu1:benchlab@gpu1", "at": now},
             serializer="json")
    # two messages sent in one millisecond may be taken in either order (the filesystem broker names
    # its files by the millisecond, then a random id): wait for both
    wait_until(lambda: live.get(f"/api/jobs/{a}").json()["state"] == "running", what="running")
    workers = wait_until(lambda: live.get("/api/workers").json(), what="the heartbeat applied")
    assert [w["name"] for w in workers] == ["gpu1:benchlab@gpu1"]
    # no further heartbeat: after worker_lost_after_s the reaper marks it
    job = wait_until(lambda: (j := live.get(f"/api/jobs/{a}").json())["state"] == "failed" and j, what="reaped")
    assert job["error"].startswith("worker lost: gpu1:benchlab@gpu1 stopped sending heartbeats")
    assert [h["attempt"] for h in job["history"]] == [1]
    assert live.get(f"/api/jobs/{b}").json()["state"] == "queued"  # a job nobody took stays queued
    assert live.get("/api/workers").json()[0]["alive"] is False
    # retryable, and the late result of the lost attempt is dropped
    assert live.post(f"/api/sweeps/{sid}/retry").json()["requeued"] == 1
    send_raw(live.app_ref, {"type": "result", "job_id": a, "attempt": 1, "state": "done"}, serializer="json")
    time.sleep(0.5)
    assert live.get(f"/api/jobs/{a}").json()["state"] == "queued"


def test_the_reaper_closes_jobs_of_silent_workers(live):
    _reaper_closes_the_job_of_a_silent_worker(live)


@pytest.fixture
def live_on_redis(tmp_path, redis_url, monkeypatch):
    """The API and its recorder on the Redis broker, in a database of Redis of its own, emptied first
    (a result left on the shared `results` queue by another test would name this test's job ids)."""
    import redis

    url = redis_url.rsplit("/", 1)[0] + "/9"
    redis.Redis.from_url(url).flushdb()
    monkeypatch.setenv("BENCHLAB_BROKER_URL", url)
    with _serving(BackendSettings(data_dir=tmp_path, reap_interval_s=0.2, worker_lost_after_s=1.0)) as c:
        yield c


def test_the_reaper_closes_jobs_of_silent_workers_on_redis(live_on_redis):
    # the recorder judges heartbeats only after finding the queue empty: Redis's drain must say so too
    _reaper_closes_the_job_of_a_silent_worker(live_on_redis)
    assert live_on_redis.app_ref.state.recorder.caught_up_at is not None


def test_reaper_times_out_running_jobs_past_timeout_plus_grace(tmp_path):
    from backend.db import make_engine, migrate

    engine = make_engine(BackendSettings(data_dir=tmp_path))
    migrate(engine)
    app = create_app(BackendSettings(data_dir=tmp_path), with_recorder=False)
    with TestClient(app) as c:
        sid = c.post("/api/sweeps", json={"suite": "noop", "timeout_s": 10}).json()["id"]
        job = c.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
    with session(engine) as db:
        apply_event(db, {"type": "state", "job_id": job, "worker": "w", "at": 1000.0})
        db.add(WorkerRow(name="w", last_seen=2000.0))  # alive at 2000
        db.commit()
        assert reap_lost_jobs(db, now=1000.0 + 10 + 5, lost_after_s=30, default_timeout_s=1800, grace_s=10) == []
        assert reap_lost_jobs(db, now=1000.0 + 10 + 11, lost_after_s=30, default_timeout_s=1800,
                              grace_s=10) == [job]
        j = db.get(Job, job)
        assert j.state == "failed" and "past its timeout of 10 s plus 10 s" in j.error
        assert len(db.exec(select(DeadLetter)).all()) == 0
        assert json.loads(json.dumps(j.model_dump()))  # plain values


def _running_job_of_a_silent_worker(tmp_path):
    """A job `running` on worker `w`, whose last heartbeat (naming the job) came at t=1000."""
    from backend.db import make_engine, migrate

    settings = BackendSettings(data_dir=tmp_path)
    engine = make_engine(settings)
    migrate(engine)
    with TestClient(create_app(settings, with_recorder=False)) as c:
        sid = c.post("/api/sweeps", json={"suite": "noop"}).json()["id"]
        job = c.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
    with session(engine) as db:
        apply_event(db, {"type": "heartbeat", "worker": "w", "queues": ["default"], "at": 1000.0,
                         "current": {"job_id": job}})
        apply_event(db, {"type": "state", "job_id": job, "worker": "w", "at": 1000.0})
    return engine, job


def test_the_reaper_does_not_count_a_silence_from_before_it_listened(tmp_path):
    engine, job = _running_job_of_a_silent_worker(tmp_path)
    with session(engine) as db:
        # silent for 20 s, but the recorder reconnected 10 s ago: its own gap, not the worker's
        assert reap_lost_jobs(db, now=1020.0, lost_after_s=15, default_timeout_s=1800, grace_s=10,
                              heard=(1010.0, 1020.0)) == []
        assert db.get(Job, job).state == "running"
        # listening for 20 s, but behind a backlog: everything sent after 1012 is still queued
        assert reap_lost_jobs(db, now=1030.0, lost_after_s=15, default_timeout_s=1800, grace_s=10,
                              heard=(1010.0, 1012.0)) == []
        # 16 s heard whole and still nothing: now the worker is gone
        assert reap_lost_jobs(db, now=1030.0, lost_after_s=15, default_timeout_s=1800, grace_s=10,
                              heard=(1010.0, 1026.0)) == [job]


def test_the_recorder_judges_workers_only_over_what_it_heard_whole(tmp_path):
    engine, job = _running_job_of_a_silent_worker(tmp_path)
    app = create_app(BackendSettings(data_dir=tmp_path), with_recorder=False)
    from backend.recorder import Recorder

    rec = Recorder(app.state.dispatcher.app, engine, lost_after_s=15)
    assert rec.reap(now=1100.0) == []  # never listened: silence proves nothing
    rec.listening_since = 1080.0
    assert rec.reap(now=1100.0) == []  # connected, but never found the queue empty
    rec.caught_up_at = 1090.0
    assert rec.reap(now=1100.0) == []  # heard 10 s whole of the 15 it needs
    rec.caught_up_at = 1099.0
    assert rec.reap(now=1100.0) == [job]


def test_the_workers_own_result_replaces_the_reapers_verdict(tmp_path):
    engine, job = _running_job_of_a_silent_worker(tmp_path)
    with session(engine) as db:
        assert reap_lost_jobs(db, now=1100.0, lost_after_s=15, default_timeout_s=1800, grace_s=10) == [job]
        assert db.get(Job, job).error.startswith("worker lost")
        assert apply_event(db, {"type": "result", "job_id": job, "attempt": 1, "state": "done", "worker": "w",
                                "metrics": {"x": 1}, "at": 1101.0})
        j = db.get(Job, job)
        assert (j.state, j.error) == ("done", None)
        rows = db.exec(select(Result).where(Result.job_id == job)).all()
        assert [(r.attempt, r.state, r.metrics) for r in rows] == [(1, "done", {"x": 1})]
        # a copy of that result, or a later one for the attempt, changes nothing now
        assert not apply_event(db, {"type": "result", "job_id": job, "attempt": 1, "state": "failed", "at": 1102.0})
        assert db.get(Job, job).state == "done"


def test_a_broker_outage_is_logged_in_full_once_then_in_lines_and_its_end_is_said(tmp_path, monkeypatch, caplog):
    import logging
    import shutil
    import subprocess

    from backend import recorder as rec_mod
    from tests.conftest import REQUIRE_REDIS
    from tests.stack import free_port
    from worker.celery_app import make_celery
    from worker.settings import WorkerSettings

    if not shutil.which("redis-server"):
        if REQUIRE_REDIS:
            pytest.fail("redis-server is required in CI")
        pytest.skip("no redis-server")
    port = free_port()  # nothing listens there yet: the broker is down from the start
    monkeypatch.setattr(rec_mod, "BROKER_DOWN_NOTE_S", 1.0)
    settings = WorkerSettings(data_dir=tmp_path, broker_url=f"redis://127.0.0.1:{port}/0")
    engine = create_app(BackendSettings(data_dir=tmp_path), with_recorder=False).state.engine
    rec = rec_mod.Recorder(make_celery(settings), engine, worker_settings=settings)
    caplog.set_level(logging.INFO, logger=rec_mod.log.name)
    rec.start()
    redis = None
    try:
        wait_until(lambda: sum("still cannot reach" in r.getMessage() for r in caplog.records) >= 2, 30,
                   "lines while the broker is down")
        redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert rec.ready.wait(30)
        wait_until(lambda: any("reached the broker again" in r.getMessage() for r in caplog.records), 30, "said")
    finally:
        rec.stop()
        if redis is not None:
            redis.kill()
            redis.wait(5)
    full = [r for r in caplog.records if r.exc_info]
    assert len(full) == 1 and "lost the broker" in full[0].getMessage()
