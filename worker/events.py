"""Messages from workers to the recorder, on the `results` queue (plain JSON, not Celery tasks).

Kinds: {"type": "state", "job_id", "state": "running", "worker", "at", "attempt"};
{"type": "progress", "job_id", "message", "at"};
{"type": "result", "job_id", "state", "metrics", "error", "env", "artifacts", "duration_s", "worker", "at", "attempt"}.
"""
from __future__ import annotations

import time
from typing import Any

from celery import Celery

from worker.celery_app import RESULTS_EXCHANGE, RESULTS_QUEUE


def publish(app: Celery, event: dict[str, Any]) -> None:
    event.setdefault("at", time.time())
    with app.producer_or_acquire() as producer:
        producer.publish(event, exchange=RESULTS_EXCHANGE, routing_key="results", serializer="json",
                         declare=[RESULTS_QUEUE], retry=True,
                         retry_policy={"max_retries": 10, "interval_start": 0.1, "interval_step": 0.5})
