"""The recorder: consumes worker messages from the `results` queue and writes them to the database.

It runs as a thread inside `benchlab api` / `benchlab up`, next to the database, so SQLite keeps a
single writer for results and a GPU host needs only the broker. A message is acknowledged only
after its write committed: if the API stops mid-way, the message is delivered again.
"""
from __future__ import annotations

import logging
import threading

from kombu import Consumer
from sqlalchemy.engine import Engine

from backend.changes import ChangeFeed
from backend.db import session
from backend.service import apply_event
from worker.celery_app import RESULTS_QUEUE

log = logging.getLogger("benchlab.recorder")


class Recorder(threading.Thread):
    def __init__(self, celery_app, engine: Engine, changes: ChangeFeed | None = None):
        super().__init__(name="benchlab-recorder", daemon=True)
        self.app = celery_app
        self.engine = engine
        self.changes = changes
        self._stop_event = threading.Event()
        self.applied = 0
        self.ready = threading.Event()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout)

    def _handle(self, body, message) -> None:
        try:
            with session(self.engine) as db:
                if apply_event(db, body):
                    self.applied += 1
            if self.changes is not None:
                self.changes.bump()  # committed: wake held requests before the broker round trip of the ack
            message.ack()
        except Exception:  # noqa: BLE001 - keep consuming; the message is retried later
            log.exception("could not record event %r", body)
            message.requeue()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                with self.app.connection_for_read() as conn:
                    with Consumer(conn, queues=[RESULTS_QUEUE], callbacks=[self._handle], accept=["json"],
                                  prefetch_count=50):
                        self.ready.set()
                        while not self._stop_event.is_set():
                            try:
                                conn.drain_events(timeout=0.5)
                            except TimeoutError:
                                pass
            except Exception:  # noqa: BLE001 - broker went away: reconnect
                log.exception("recorder lost the broker; reconnecting")
                self._stop_event.wait(1.0)
