"""Cancellation marks kept on the broker, so a GPU host that sees only the broker can honour them.

The API marks a sweep cancelled; a worker checks the mark before it starts each job and reports
the job `cancelled` instead of running it. Redis: a key per sweep. Embedded broker: a file per
sweep in the broker's folder. A running job is not interrupted: its measurement is kept.
"""
from __future__ import annotations

from worker.settings import WorkerSettings

_KEY = "benchlab:cancelled:sweep:{}"


class CancelRegistry:
    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self._redis = None
        if not settings.is_embedded_broker:
            import redis

            self._redis = redis.Redis.from_url(settings.effective_broker_url)
        else:
            self.folder = settings.broker_dir / "cancelled"
            self.folder.mkdir(parents=True, exist_ok=True)

    def cancel(self, sweep_id: int) -> None:
        if self._redis is not None:
            self._redis.set(_KEY.format(sweep_id), "1", ex=30 * 24 * 3600)
        else:
            (self.folder / str(sweep_id)).touch()

    def uncancel(self, sweep_id: int) -> None:
        if self._redis is not None:
            self._redis.delete(_KEY.format(sweep_id))
        else:
            (self.folder / str(sweep_id)).unlink(missing_ok=True)

    def is_cancelled(self, sweep_id: int) -> bool:
        if self._redis is not None:
            return bool(self._redis.exists(_KEY.format(sweep_id)))
        return (self.folder / str(sweep_id)).exists()
