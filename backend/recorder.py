"""The recorder: consumes worker messages from the `results` queue and writes them to the database.

It runs as a thread inside `benchlab api` / `benchlab up`, next to the database, so SQLite keeps a
single writer for results and a GPU host needs only the broker. A message is acknowledged only
after its write committed: if the API stops mid-way, the message is delivered again, and writes
are idempotent (one result per job and attempt), so a second delivery changes nothing.

Every message is validated against the contract (worker/contract.py) first. One that does not
validate, or that fails to apply `MAX_TRIES` times, goes to the dead-letter table (listed at
GET /api/dead-letters, counted on /api/health) and is acknowledged: it never blocks the queue.

Between messages the recorder also runs the reaper (service.reap_lost_jobs) every
`reap_interval_s`: jobs whose worker stopped sending heartbeats, or that run past their timeout
plus a grace period, are recorded `failed: worker lost`. Heartbeats travel on the same queue, so
a worker is judged only by a silence the recorder heard whole: `lost_after_s` between its last
connect and the last time it found the queue empty. Several recorders (API processes on one
PostgreSQL database) are safe together: each write is conditional on the row's current state.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time

from kombu import Consumer
from pydantic import ValidationError
from sqlalchemy.engine import Engine

from backend.artifacts import enforce_retention
from backend.changes import ChangeFeed
from backend.db import session
from backend.service import apply_event, reap_lost_jobs, store_dead_letter
from worker.celery_app import RESULTS_QUEUE
from worker.contract import parse_event
from worker.settings import WorkerSettings

log = logging.getLogger("benchlab.recorder")
MAX_TRIES = 3
RETENTION_INTERVAL_S = 600.0
BROKER_DOWN_NOTE_S = 60.0  # while the broker is down, one line this often (the first failure in full)


class Recorder(threading.Thread):
    def __init__(self, celery_app, engine: Engine, changes: ChangeFeed | None = None, *,
                 worker_settings: WorkerSettings | None = None, lost_after_s: float = 30.0,
                 reap_interval_s: float = 5.0, retention: tuple | None = None):
        super().__init__(name="benchlab-recorder", daemon=True)
        self.app = celery_app
        self.engine = engine
        self.changes = changes
        self.worker_settings = worker_settings or WorkerSettings()
        self.lost_after_s = lost_after_s
        self.reap_interval_s = reap_interval_s
        self.retention = retention  # (artifact root, max age in days, max total MB), or None
        self._stop_event = threading.Event()
        self._tries: dict[str, int] = {}
        self.applied = 0
        self.dead_letters = 0
        self.reaped = 0
        self.ready = threading.Event()
        # wall times of the last connect and of the last empty drain since: the span over which
        # every heartbeat sent has been applied (see reap())
        self.listening_since: float | None = None
        self.caught_up_at: float | None = None

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout)

    def _dead_letter(self, body, error: str, tries: int = 1) -> None:
        with session(self.engine) as db:
            store_dead_letter(db, body, error, tries)
        self.dead_letters += 1
        log.warning("dead letter: %s", error)

    def _handle(self, body, message) -> None:
        try:
            event = parse_event(body)
        except ValidationError as exc:
            try:
                self._dead_letter(body, f"does not match the contract: {exc}")
                message.ack()
            except Exception:  # noqa: BLE001 - the database is down: try again later
                log.exception("could not store a dead letter")
                message.requeue()
            return
        key = hashlib.sha1(json.dumps(body, sort_keys=True, default=repr).encode()).hexdigest()
        try:
            with session(self.engine) as db:
                if apply_event(db, event):
                    self.applied += 1
            self._tries.pop(key, None)
            if self.changes is not None:
                self.changes.bump()  # committed: wake held requests before the broker round trip of the ack
            message.ack()
        except Exception as exc:  # noqa: BLE001 - keep consuming; retry the message a few times
            tries = self._tries[key] = self._tries.get(key, 0) + 1
            log.exception("could not record event %r (try %d of %d)", body, tries, MAX_TRIES)
            if tries < MAX_TRIES:
                message.requeue()
                return
            try:
                self._dead_letter(body, f"could not be applied after {tries} tries: {type(exc).__name__}: {exc}",
                                  tries)
                self._tries.pop(key, None)
                message.ack()
            except Exception:  # noqa: BLE001 (the database is down: try again later)
                log.exception("could not store a dead letter")
                message.requeue()

    def _undecodable(self, message, exc) -> None:
        """A message that is not JSON (or not an accepted content type)."""
        try:
            self._dead_letter(message.body, f"cannot be decoded: {type(exc).__name__}: {exc}")
            message.ack()
        except Exception:  # noqa: BLE001 (the database is down: the message stays unacknowledged)
            log.exception("could not store a dead letter")

    def reap(self, now: float | None = None) -> list[int]:
        """Close lost jobs. Heartbeats share the queue with results, so a worker is judged by them
        only over the span this recorder has heard all of: from its last connect to the last time
        it found the queue empty. A restart, a broker outage or a backlog is its own silence."""
        ws = self.worker_settings
        now = now or time.time()
        if self.listening_since is None or self.caught_up_at is None:
            heard = (now, now)  # nothing heard whole yet: a span of no length judges timeouts only
        else:
            heard = (self.listening_since, self.caught_up_at)
        with session(self.engine) as db:
            reaped = reap_lost_jobs(db, now, self.lost_after_s, ws.job_timeout_s, ws.timeout_grace_s, heard=heard)
        if reaped:
            self.reaped += len(reaped)
            log.warning("jobs %s: worker lost", reaped)
            if self.changes is not None:
                self.changes.bump()
        return reaped

    def _enforce_retention(self) -> None:
        root, max_age_days, max_total_mb = self.retention
        try:
            removed = enforce_retention(root, max_age_days, max_total_mb)
        except OSError:
            log.exception("artifact retention failed")
            return
        if removed:
            log.warning("artifact retention removed %d job folder(s): %s", len(removed), ", ".join(removed[:10]))

    def run(self) -> None:
        next_reap = time.monotonic() + self.reap_interval_s
        next_retention = 0.0
        failures, said_at = 0, 0.0  # broker outage: the first failure in full, then a line now and then
        while not self._stop_event.is_set():
            try:
                with self.app.connection_for_read() as conn:
                    with Consumer(conn, queues=[RESULTS_QUEUE], callbacks=[self._handle], accept=["json"],
                                  prefetch_count=50, on_decode_error=self._undecodable):
                        if failures:
                            log.warning("recorder reached the broker again after %d failed tries", failures)
                            failures = 0
                        self.listening_since, self.caught_up_at = time.time(), None
                        self.ready.set()
                        while not self._stop_event.is_set():
                            try:
                                conn.drain_events(timeout=0.5)
                            except TimeoutError:  # the queue is empty: all sent until now is applied
                                self.caught_up_at = time.time()
                            if time.monotonic() >= next_reap:
                                next_reap = time.monotonic() + self.reap_interval_s
                                try:
                                    self.reap()
                                except Exception:  # noqa: BLE001 - the database is busy: next round
                                    log.exception("reaper failed")
                            if self.retention is not None and time.monotonic() >= next_retention:
                                next_retention = time.monotonic() + RETENTION_INTERVAL_S
                                self._enforce_retention()
            except Exception as exc:  # noqa: BLE001 - broker went away: reconnect
                failures += 1
                if failures == 1:
                    log.exception("recorder lost the broker; reconnecting every second")
                    said_at = time.monotonic()
                elif time.monotonic() - said_at >= BROKER_DOWN_NOTE_S:
                    log.warning("recorder still cannot reach the broker (%d tries): %s", failures,
                                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                    said_at = time.monotonic()
                self._stop_event.wait(1.0)
