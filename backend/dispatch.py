"""Sending jobs to the workers, and cancellation marks, through the broker. Torch-free."""
from __future__ import annotations

from typing import Any

from backend.settings import BackendSettings
from worker.cancel import CancelRegistry
from worker.celery_app import RUN_JOB_TASK, make_celery
from worker.settings import WorkerSettings


class SendError(RuntimeError):
    """The broker refused a message after `sent` of them went out."""

    def __init__(self, sent: int, cause: BaseException):
        self.sent = sent
        super().__init__(f"{type(cause).__name__}: {cause}")


class Dispatcher:
    def __init__(self, settings: BackendSettings):
        self.worker_settings = WorkerSettings(data_dir=settings.data_dir)
        self.app = make_celery(self.worker_settings)
        self.cancels = CancelRegistry(self.worker_settings)

    @property
    def max_job_timeout_s(self) -> float:
        return self.worker_settings.max_job_timeout_s

    def reachable(self) -> tuple[bool, str]:
        """Whether the broker takes messages now, and why not."""
        try:
            self.cancels.ping()
            return True, ""
        except Exception as exc:  # noqa: BLE001 - any failure means: not now
            return False, f"{type(exc).__name__}: {exc}"

    def check(self) -> None:
        """Raise BrokerUnavailable (answered 503) when the broker cannot take messages."""
        from backend.service import BrokerUnavailable

        ok, why = self.reachable()
        if not ok:
            raise BrokerUnavailable(f"the broker ({self.worker_settings.effective_broker_url.split('@')[-1]}) "
                                    f"is not reachable: {why}")

    def send(self, jobs: list[dict[str, Any]], queue: str) -> None:
        sent = 0
        try:
            with self.app.producer_or_acquire() as producer:
                for job in jobs:
                    self.app.send_task(RUN_JOB_TASK, args=[job], queue=queue, producer=producer,
                                       retry=True, retry_policy={"max_retries": 2, "interval_start": 0.2})
                    sent += 1
        except Exception as exc:  # noqa: BLE001 - the caller records which jobs did not go out
            raise SendError(sent, exc) from exc

    def close(self) -> None:
        self.app.close()
