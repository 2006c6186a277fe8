"""Sending jobs to the workers, and cancellation marks, through the broker. Torch-free."""
from __future__ import annotations

from typing import Any

from backend.settings import BackendSettings
from worker.cancel import CancelRegistry
from worker.celery_app import RUN_JOB_TASK, make_celery
from worker.settings import WorkerSettings


class Dispatcher:
    def __init__(self, settings: BackendSettings):
        self.worker_settings = WorkerSettings(data_dir=settings.data_dir)
        self.app = make_celery(self.worker_settings)
        self.cancels = CancelRegistry(self.worker_settings)

    def send(self, jobs: list[dict[str, Any]], queue: str) -> None:
        with self.app.producer_or_acquire() as producer:
            for job in jobs:
                self.app.send_task(RUN_JOB_TASK, args=[job], queue=queue, producer=producer)

    def close(self) -> None:
        self.app.close()
