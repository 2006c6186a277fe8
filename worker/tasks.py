"""The one Celery task: run a job (one grid cell) in the warm runner and report what happened.

The task never opens the database. It reports `running`, progress lines and the final outcome as
messages on the `results` queue (worker/contract.py); the recorder beside the API writes them. A
heartbeat thread says every few seconds which job the worker runs, so a worker that dies leaves
a job the reaper can close. While a cell runs, the task checks its sweep's cancellation mark.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from typing import Any, Callable

import httpx
from celery import Celery
from pydantic import ValidationError

from worker.cancel import CancelRegistry
from worker.celery_app import RUN_JOB_TASK
from worker.contract import HeartbeatEvent, JobPayload, ProgressEvent, ResultEvent, RunningJob, StateEvent
from worker.events import publish
from worker.placement import GpuLease, gpu_ids, gpus_used
from worker.runner import Outcome, Runner
from worker.settings import WorkerSettings

log = logging.getLogger("benchlab.worker")
PROGRESS_MIN_INTERVAL_S = 0.5
CANCEL_CHECK_S = 1.0
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


def upload_artifacts(settings: WorkerSettings, job_id: int, folder, artifacts: list[dict],
                     attempt: int = 1) -> list[str]:
    """PUT each artifact of one attempt to the API (for a GPU host that shares no disk with it).
    Returns errors."""
    errors = []
    headers = {"Authorization": f"Bearer {settings.api_token}"} if settings.api_token else {}
    for art in artifacts:
        path = folder / art["name"]
        try:
            with path.open("rb") as f:
                r = httpx.put(f"{settings.api_url.rstrip('/')}/api/jobs/{job_id}/artifacts/{art['name']}",
                              params={"attempt": attempt}, content=f, headers=headers, timeout=300)
            if r.status_code >= 300:
                errors.append(f"upload of {art['name']} failed: HTTP {r.status_code} {r.text[:200]}")
        except (OSError, httpx.HTTPError) as exc:
            errors.append(f"upload of {art['name']} failed: {exc}")
    return errors


def visible_gpus(configured: str | None = None) -> list[str]:
    """GPU names this worker can use, without importing torch: `configured` (WorkerSettings.gpus) when
    given, else nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES."""
    if configured is not None:
        return [g.strip() for g in configured.split(",") if g.strip()]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    names = [ln.strip() for ln in out.splitlines() if ln.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        idx = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        names = [names[i] for i in idx if i < len(names)]
    return names


class Heartbeat(threading.Thread):
    """Publishes a HeartbeatEvent every `interval_s` (and at once when asked): the worker's name, queues,
    GPUs and the job it runs. The reaper beside the API uses it to find jobs whose worker is gone."""

    def __init__(self, app: Celery, worker: str, queues: list[str], interval_s: float, commit: str | None = None,
                 file=None, gpus: list[str] | None = None):
        super().__init__(name="benchlab-heartbeat", daemon=True)
        self.app, self.interval_s = app, interval_s
        self.base = {"worker": worker, "hostname": socket.gethostname(), "pid": os.getpid(), "queues": queues,
                     "gpus": visible_gpus() if gpus is None else gpus, "commit": commit}
        self.current: RunningJob | None = None
        self.file = file
        self._wake = threading.Event()
        self._stopped = threading.Event()  # not `_stop`: Thread.join calls its own _stop()

    def beat(self, stopping: bool = False) -> None:
        try:
            publish(self.app, HeartbeatEvent(**self.base, current=self.current, stopping=stopping))
        except Exception:  # noqa: BLE001 - the broker is away: the next beat tries again
            log.warning("heartbeat not sent", exc_info=True)
            return
        if self.file is not None and not stopping:
            self.file.write_text(f"{time.time()}\n")  # sent: a healthcheck reads the file's age

    def set_job(self, job: RunningJob | None) -> None:
        self.current = job

    def run(self) -> None:
        while not self._stopped.is_set():
            self.beat()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self.is_alive():
            self.join(5)
        self.current = None
        self.beat(stopping=True)


def register_tasks(app: Celery, settings: WorkerSettings, worker_name: str | None = None,
                   queues: list[str] | None = None) -> dict[str, Any]:
    """Register `benchlab.run_job` on `app`; returns the worker's state (runner, heartbeat) for shutdown."""
    hostname = socket.gethostname()
    worker = worker_name or f"{hostname}:benchlab@{hostname}"
    gpus = visible_gpus(settings.gpus)
    heartbeat = Heartbeat(app, worker, queues or [], settings.heartbeat_s, settings.commit,
                          file=settings.heartbeat_file, gpus=gpus)
    state: dict[str, Any] = {"runner": Runner(max_jobs=settings.runner_max_jobs, commit=settings.commit,
                                             startup_timeout_s=settings.runner_startup_timeout_s,
                                             memory_limit_gb=settings.runner_memory_gb),
                             "cancel": CancelRegistry(settings), "heartbeat": heartbeat, "worker": worker}

    @app.task(name=RUN_JOB_TASK, bind=True, acks_late=True)
    def run_job(self, body: dict[str, Any]) -> None:
        try:
            job = JobPayload.model_validate(body)
        except ValidationError as exc:
            log.error("refused a job message that does not match the contract: %s", exc)
            job_id = body.get("job_id") if isinstance(body, dict) else None
            attempt = body.get("attempt") if isinstance(body, dict) else None
            if isinstance(job_id, int) and not isinstance(job_id, bool):  # a result the recorder can place
                attempt = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 0 else 1
                publish(app, ResultEvent(job_id=job_id, attempt=attempt, state="failed",
                                         error=f"the job message does not match the contract: {exc}",
                                         worker=worker))
            return
        attempt = job.attempt
        cancels = state["cancel"]
        if cancels.is_cancelled(job.sweep_uid):
            publish(app, ResultEvent(job_id=job.job_id, attempt=attempt, state="cancelled", duration_s=0.0,
                                     error="sweep was cancelled before this job started", worker=worker))
            return
        heartbeat.set_job(RunningJob(job_id=job.job_id, attempt=attempt))
        started_at = time.time()  # the report may go out later; it carries the real start
        running = RunningReport(lambda: publish(app, StateEvent(job_id=job.job_id, attempt=attempt, worker=worker,
                                                                at=started_at))).start()
        last = {"t": 0.0}

        def on_progress(message: str) -> None:
            running.now()  # progress of a job still shown as queued would read oddly
            now = time.monotonic()
            if now - last["t"] >= PROGRESS_MIN_INTERVAL_S:
                last["t"] = now
                publish(app, ProgressEvent(job_id=job.job_id, attempt=attempt, message=message[:500]))

        checked = {"t": 0.0}

        def cancelled() -> bool:  # asked every half second while the cell runs; the broker is asked each second
            now = time.monotonic()
            if now - checked["t"] < CANCEL_CHECK_S:
                return False
            checked["t"] = now
            try:
                return cancels.is_cancelled(job.sweep_uid)
            except Exception:  # noqa: BLE001 - the broker is away: keep running
                return False

        artifact_dir = settings.artifact_dir(job.job_id, attempt)
        timeout_s = float(job.timeout_s or settings.job_timeout_s)
        lease = None
        try:
            need = gpus_used(job.suite, job.params, len(gpus))
            devices = None
            if need:
                def waiting(message: str) -> None:  # the job stays `queued` while it waits
                    publish(app, ProgressEvent(job_id=job.job_id, attempt=attempt, message=message[:500]))

                lease = GpuLease(need, gpu_ids(len(gpus)), settings.gpu_lock_dir, on_wait=waiting, cancelled=cancelled)
                devices = ",".join(lease.acquire())
                on_progress(f"on GPU {devices}")
            outcome = state["runner"].run(
                {"suite": job.suite, "params": job.params, "artifact_dir": str(artifact_dir)},
                timeout_s=timeout_s, fresh=job.fresh, on_progress=on_progress, cancelled=cancelled, devices=devices)
        except ValueError as exc:  # more GPUs than this worker has: it should not have been routed here
            outcome = Outcome("skipped", error=str(exc))
        except InterruptedError:
            outcome = Outcome("cancelled", error="cancelled while waiting for GPUs")
        finally:
            if lease is not None:
                lease.release()
            running.finish()
        if state.get("stopping") and outcome.state == "failed":
            outcome.error = f"the worker was stopped ({state['stopping']}) during the job; retry it"
        if outcome.artifacts and settings.api_url:
            errors = upload_artifacts(settings, job.job_id, artifact_dir, outcome.artifacts, attempt)
            if errors:
                outcome.error = ((outcome.error or "") + "\n" + "\n".join(errors)).strip()
        publish(app, ResultEvent(job_id=job.job_id, attempt=attempt, worker=worker, **outcome.as_dict()))
        heartbeat.set_job(None)

    return state
