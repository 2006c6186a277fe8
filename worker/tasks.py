"""The one Celery task: run a job (one grid cell) in the warm runner and report what happened.

The task never opens the database. It reports `running`, progress lines and the final outcome as
messages on the `results` queue; the recorder beside the API writes them.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

import httpx
from celery import Celery

from worker.cancel import CancelRegistry
from worker.celery_app import RUN_JOB_TASK
from worker.events import publish
from worker.runner import Runner
from worker.settings import WorkerSettings

PROGRESS_MIN_INTERVAL_S = 0.5
# A job that ends sooner than this goes from `queued` straight to its result: one message and one
# database write instead of two, which on a busy API host is most of a short job's overhead.
# Longer jobs (and any job that reports progress) show `running` as before.
RUNNING_REPORT_AFTER_S = 0.2


class RunningReport:
    """Sends the `running` message once: after `delay_s`, or at once when `now()` is called first.

    `finish()` cancels a report not yet sent and waits for one being sent, so `running` can never
    reach the queue after the job's result.
    """

    def __init__(self, send: Callable[[], None], delay_s: float = RUNNING_REPORT_AFTER_S):
        self._send = send
        self._lock = threading.Lock()
        self._done = False
        self._timer = threading.Timer(delay_s, self.now)
        self._timer.daemon = True

    def start(self) -> "RunningReport":
        self._timer.start()
        return self

    def now(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            self._send()

    def finish(self) -> None:
        self._timer.cancel()
        with self._lock:  # waits for a send in flight on the timer's thread
            self._done = True


def upload_artifacts(settings: WorkerSettings, job_id: int, folder, artifacts: list[dict]) -> list[str]:
    """PUT each artifact to the API (for a GPU host that shares no disk with it). Returns errors."""
    errors = []
    headers = {"Authorization": f"Bearer {settings.api_token}"} if settings.api_token else {}
    for art in artifacts:
        path = folder / art["name"]
        try:
            with path.open("rb") as f:
                r = httpx.put(f"{settings.api_url.rstrip('/')}/api/jobs/{job_id}/artifacts/{art['name']}",
                              content=f, headers=headers, timeout=300)
            if r.status_code >= 300:
                errors.append(f"upload of {art['name']} failed: HTTP {r.status_code} {r.text[:200]}")
        except (OSError, httpx.HTTPError) as exc:
            errors.append(f"upload of {art['name']} failed: {exc}")
    return errors


def register_tasks(app: Celery, settings: WorkerSettings) -> dict[str, Any]:
    """Register `benchlab.run_job` on `app`; returns the worker's state (its runner) for shutdown."""
    state: dict[str, Any] = {"runner": Runner(max_jobs=settings.runner_max_jobs, commit=settings.commit,
                                             startup_timeout_s=settings.runner_startup_timeout_s),
                             "cancel": CancelRegistry(settings)}
    hostname = socket.gethostname()

    @app.task(name=RUN_JOB_TASK, bind=True, acks_late=True)
    def run_job(self, job: dict[str, Any]) -> None:
        job_id, sweep_uid = job["job_id"], job["sweep_uid"]
        attempt = job.get("attempt", 1)
        worker = f"{hostname}:{self.request.hostname or ''}"
        if state["cancel"].is_cancelled(sweep_uid):
            publish(app, {"type": "result", "job_id": job_id, "state": "cancelled", "metrics": {},
                          "error": "sweep was cancelled before this job started", "env": None,
                          "artifacts": [], "duration_s": 0.0, "worker": worker, "attempt": attempt})
            return
        started_at = time.time()  # the report may go out later; it carries the real start
        running = RunningReport(lambda: publish(app, {"type": "state", "job_id": job_id, "state": "running",
                                                      "worker": worker, "attempt": attempt,
                                                      "at": started_at})).start()
        last = {"t": 0.0}

        def on_progress(message: str) -> None:
            running.now()  # progress of a job still shown as queued would read oddly
            now = time.monotonic()
            if now - last["t"] >= PROGRESS_MIN_INTERVAL_S:
                last["t"] = now
                publish(app, {"type": "progress", "job_id": job_id, "message": message[:500]})

        artifact_dir = settings.artifact_root / f"job_{job_id}"
        timeout_s = float(job.get("timeout_s") or settings.job_timeout_s)
        try:
            outcome = state["runner"].run(
                {"suite": job["suite"], "params": job["params"], "artifact_dir": str(artifact_dir)},
                timeout_s=timeout_s, fresh=bool(job.get("fresh")), on_progress=on_progress)
        finally:
            running.finish()
        if outcome.artifacts and settings.api_url:
            errors = upload_artifacts(settings, job_id, artifact_dir, outcome.artifacts)
            if errors:
                outcome.error = ((outcome.error or "") + "\n" + "\n".join(errors)).strip()
        publish(app, {"type": "result", "job_id": job_id, **outcome.as_dict(), "worker": worker, "attempt": attempt})

    return state
