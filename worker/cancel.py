"""Cancellation marks kept on the broker, so a GPU host that sees only the broker can honour them.

The API marks a sweep cancelled; a worker checks the mark before it starts each job and reports
the job `cancelled` instead of running it. While a job runs, the worker checks its sweep's mark
every second and kills the cell when it appears (the job is reported `cancelled`). Redis: a key
per sweep. Embedded broker: a file per sweep in the broker's folder. Sweeps are named by their uid
(a random hex string), not their database id, so two deployments (or a fresh database) sharing a
Redis never see each other's marks.
"""
from __future__ import annotations

import os

from worker.settings import WorkerSettings

_KEY = "benchlab:cancelled:sweep:{}"


class CancelRegistry:
    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self._redis = None
        if not settings.is_embedded_broker:
            import redis

            self._redis = redis.Redis.from_url(settings.effective_broker_url, socket_connect_timeout=2,
                                               socket_timeout=5)
        else:
            self.folder = settings.broker_dir / "cancelled"
            self.folder.mkdir(parents=True, exist_ok=True)

    def ping(self) -> None:
        """Raise if the broker is not reachable (Redis: PING; embedded: its folder is writable)."""
        if self._redis is not None:
            self._redis.ping()
        elif not os.access(self.folder, os.W_OK):
            raise OSError(f"the embedded broker's folder {self.folder} is not writable")

    def _name(self, sweep_uid: str) -> str:
        if not sweep_uid or not all(c.isalnum() for c in sweep_uid):
            raise ValueError(f"bad sweep uid {sweep_uid!r}")
        return sweep_uid

    def cancel(self, sweep_uid: str) -> None:
        if self._redis is not None:
            self._redis.set(_KEY.format(self._name(sweep_uid)), "1", ex=30 * 24 * 3600)
        else:
            (self.folder / self._name(sweep_uid)).touch()

    def uncancel(self, sweep_uid: str) -> None:
        if self._redis is not None:
            self._redis.delete(_KEY.format(self._name(sweep_uid)))
        else:
            (self.folder / self._name(sweep_uid)).unlink(missing_ok=True)

    def is_cancelled(self, sweep_uid: str) -> bool:
        if self._redis is not None:
            return bool(self._redis.exists(_KEY.format(self._name(sweep_uid))))
        return (self.folder / self._name(sweep_uid)).exists()
