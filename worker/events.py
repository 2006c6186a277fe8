"""Publishing worker messages to the recorder on the `results` queue (plain JSON, not Celery tasks).

The messages themselves are the pydantic models of worker/contract.py.
"""
from __future__ import annotations

from celery import Celery
from pydantic import BaseModel

from worker.celery_app import RESULTS_EXCHANGE, RESULTS_QUEUE


def publish(app: Celery, event: BaseModel) -> None:
    with app.producer_or_acquire() as producer:
        producer.publish(event.model_dump(mode="json"), exchange=RESULTS_EXCHANGE, routing_key="results",
                         serializer="json",
                         declare=[RESULTS_QUEUE], retry=True,
                         retry_policy={"max_retries": 10, "interval_start": 0.1, "interval_step": 0.5})
