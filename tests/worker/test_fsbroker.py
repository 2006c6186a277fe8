"""The embedded broker's transport: a consumer never sees a half-written message, and none is lost."""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from queue import Empty

import pytest
from kombu import Connection

import worker.fsbroker as fsbroker
from worker.celery_app import make_celery
from worker.settings import WorkerSettings


def _connection(folder) -> Connection:
    return Connection(transport=fsbroker.Transport, transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False})


def test_message_is_invisible_until_complete(tmp_path, monkeypatch):
    seen_before_publish = {}
    real_replace = os.replace

    def checking_replace(src, dst):
        # the moment before the message becomes visible: the payload is fully on disk, and a
        # consumer finds nothing to take
        seen_before_publish["listing"] = sorted(os.listdir(tmp_path))
        with _connection(tmp_path) as other:
            try:
                other.default_channel._get("q")
                seen_before_publish["got"] = True
            except Empty:
                seen_before_publish["got"] = False
        real_replace(src, dst)

    monkeypatch.setattr(fsbroker.os, "replace", checking_replace)
    with _connection(tmp_path) as conn:
        conn.default_channel._put("q", {"n": 1})
        assert seen_before_publish["got"] is False
        assert all(name.endswith(fsbroker.PART_SUFFIX) for name in seen_before_publish["listing"])
        assert conn.default_channel._get("q") == {"n": 1}
        with pytest.raises(Empty):
            conn.default_channel._get("q")
    assert os.listdir(tmp_path) == []  # nothing left behind: no part, no claimed file


def _produce(folder, n):
    with _connection(folder) as conn:
        for i in range(n):
            conn.default_channel._put("q", {"i": i, "pad": "x" * 20_000})


def test_concurrent_writer_and_readers_lose_nothing(tmp_path):
    n = 400
    ctx = mp.get_context("spawn")
    producers = [ctx.Process(target=_produce, args=(tmp_path, n // 2)) for _ in range(2)]
    for p in producers:
        p.start()
    got = []
    deadline = time.monotonic() + 120
    with _connection(tmp_path) as conn:
        ch = conn.default_channel
        while len(got) < n:
            assert time.monotonic() < deadline, f"only {len(got)} of {n} messages arrived"
            try:
                got.append(ch._get("q"))  # a torn read would raise here (JSON decode error)
            except Empty:
                if not any(p.is_alive() for p in producers) and not os.listdir(tmp_path):
                    break
    for p in producers:
        p.join(30)
    assert len(got) == n and sorted(m["i"] for m in got) == sorted(list(range(n // 2)) * 2)


def test_celery_app_uses_it_for_the_embedded_broker(tmp_path):
    app = make_celery(WorkerSettings(data_dir=tmp_path))
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, fsbroker.Transport)
    redis_app = make_celery(WorkerSettings(data_dir=tmp_path, broker_url="redis://127.0.0.1:6379/0"))
    assert redis_app.conf.broker_url.startswith("redis://")


def _publish(folder, body):
    with _connection(folder) as conn:
        conn.SimpleQueue("q").put(body)


def _take_and_die(folder):
    """A consumer that claims the message and is killed before it acknowledges it."""
    with _connection(folder) as conn:
        conn.SimpleQueue("q").get(timeout=10)
        os._exit(9)


def test_a_claimed_message_stays_until_acked(tmp_path):
    _publish(tmp_path, {"job": 1})
    with _connection(tmp_path) as conn:
        q = conn.SimpleQueue("q")
        msg = q.get(timeout=5)
        assert msg.payload == {"job": 1}
        assert [n for n in os.listdir(tmp_path) if n.endswith(fsbroker.CLAIMED_SUFFIX)]  # claimed, kept
        msg.ack()
        assert os.listdir(tmp_path) == []


def test_a_message_claimed_by_a_consumer_that_died_is_handed_out_again(tmp_path):
    _publish(tmp_path, {"job": 2})
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_take_and_die, args=(tmp_path,))
    p.start()
    p.join(30)
    assert p.exitcode == 9
    assert [n for n in os.listdir(tmp_path) if n.endswith(fsbroker.CLAIMED_SUFFIX)]  # the dead consumer's claim
    with _connection(tmp_path) as conn:
        msg = conn.SimpleQueue("q").get(timeout=10)  # the channel recovers it when it polls
        assert msg.payload == {"job": 2}
        msg.ack()
    assert os.listdir(tmp_path) == []


def test_a_requeued_message_leaves_no_claim_behind(tmp_path):
    _publish(tmp_path, {"job": 3})
    with _connection(tmp_path) as conn:
        q = conn.SimpleQueue("q")
        q.get(timeout=5).requeue()
        msg = q.get(timeout=5)
        assert msg.payload == {"job": 3}
        msg.ack()
    assert os.listdir(tmp_path) == []


def test_a_file_that_is_not_a_message_is_set_aside_and_the_queue_moves_on(tmp_path, caplog):
    (tmp_path / "0_a.q.msg").write_bytes(b"\xff\xfe not utf-8")
    (tmp_path / "0_b.q.msg").write_bytes(b"{not json")
    with _connection(tmp_path) as conn:
        conn.default_channel._put("q", {"n": 1, "properties": {}})
        got = conn.default_channel._get("q")
        assert got["n"] == 1
        with pytest.raises(Empty):
            conn.default_channel._get("q")
    assert sorted(p.name for p in tmp_path.glob("*.bad")) == ["0_a.q.msg.bad", "0_b.q.msg.bad"]
    assert sum("is not a message" in r.getMessage() for r in caplog.records) == 2
    with _connection(tmp_path) as again:  # a restarted consumer: nothing is handed out, nothing fails
        with pytest.raises(Empty):
            again.default_channel._get("q")
