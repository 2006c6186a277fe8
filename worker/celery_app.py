"""The Celery app shared by the API (to send jobs) and the workers (to run them). Torch-free.

Queues: jobs go to a queue named for what they need (`cpu`, `gpu`, `gpu.h200.x2`, ...; default
`default`); job results and state changes go back as plain JSON messages on `results`, which the
recorder beside the API consumes. Long jobs: acks_late, prefetch 1, and a Redis visibility timeout
derived from the largest timeout a sweep may ask (BENCHLAB_MAX_JOB_TIMEOUT_S) so a job is not
handed out twice while it runs.
"""
from __future__ import annotations

from celery import Celery
from kombu import Exchange, Queue
from kombu.transport import TRANSPORT_ALIASES

from worker.settings import WorkerSettings, get_worker_settings

RESULTS_EXCHANGE = Exchange("benchlab.results", type="direct", durable=True)
RESULTS_QUEUE = Queue("results", RESULTS_EXCHANGE, routing_key="results", durable=True)
DEFAULT_QUEUE = "default"
RUN_JOB_TASK = "benchlab.run_job"
# the embedded broker: kombu's filesystem transport with atomic writes and claims (worker/fsbroker.py)
EMBEDDED_TRANSPORT = "benchlabfs"
TRANSPORT_ALIASES.setdefault(EMBEDDED_TRANSPORT, "worker.fsbroker:Transport")


def make_celery(settings: WorkerSettings | None = None) -> Celery:
    settings = settings or get_worker_settings()
    broker = f"{EMBEDDED_TRANSPORT}://" if settings.is_embedded_broker else settings.effective_broker_url
    app = Celery("benchlab", broker=broker)
    transport_options: dict = {}
    if settings.is_embedded_broker:
        folder = settings.broker_dir
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        transport_options = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": settings.broker_poll_interval_s,
        }
    else:
        transport_options = {"visibility_timeout": settings.visibility_timeout_s}
    app.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=DEFAULT_QUEUE,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        worker_disable_rate_limits=True,
        broker_pool_limit=4,
    )
    return app

