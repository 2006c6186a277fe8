"""The embedded broker's transport: a consumer never sees a half-written message, and none is lost."""
from __future__ import annotations

import multiprocessing as mp
import os
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
    with _connection(tmp_path) as conn:
        ch = conn.default_channel
        while len(got) < n:
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
