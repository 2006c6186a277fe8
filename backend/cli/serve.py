"""The long-running commands: `api`, `worker` and `up` (API and an embedded worker)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Optional

import typer

from backend.cli.common import (
    app,
    console,
)
from worker.contract import queue_problem

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _check_address(host: str, port: int) -> None:
    """Exit 2 with a line naming the address when it cannot be listened on (taken, or no such host),
    before anything starts: `up` would otherwise start its worker and print the dashboard's address."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        console.print(f"[red]cannot listen on {host}:{port}:[/] {exc}")
        raise typer.Exit(2) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            console.print(f"[red]cannot listen on {host}:{port}:[/] {exc.strerror} (BENCHLAB_HOST / BENCHLAB_PORT, "
                          "--host / --port)")
            raise typer.Exit(2) from None


def _serve_api(host: str | None, port: int | None) -> None:
    """Run the API until SIGTERM, SIGINT or SIGHUP; return (rather than die) so callers clean up."""
    import uvicorn

    from backend.main import create_app
    from backend.settings import get_settings

    settings = get_settings()
    _check_address(host or settings.host, port or settings.port)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=host or settings.host,
                                           port=port or settings.port, log_level="warning"))
    # uvicorn handles SIGINT and SIGTERM itself and re-raises them after its shutdown: turn that
    # second delivery into SystemExit, so `finally` blocks run; SIGHUP stops it the same way
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    signal.signal(signal.SIGHUP, lambda signum, frame: setattr(server, "should_exit", True))
    server.run()


@app.command()
def api(host: Optional[str] = typer.Option(None, help="default: BENCHLAB_HOST or 127.0.0.1"),
        port: Optional[int] = typer.Option(None, min=1, max=65535, help="default: BENCHLAB_PORT or 8000")) -> None:
    """Start the API, the pages and the recorder (no worker)."""
    _serve_api(host, port)


def _describe_reach(settings) -> list[str]:
    """What a starting worker can reach: the broker, and the API it uploads artifacts to."""
    from worker.cancel import CancelRegistry

    lines = []
    broker = settings.effective_broker_url.split("@")[-1]
    try:
        CancelRegistry(settings).ping()
        lines.append(f"broker {broker}: reachable")
    except Exception as exc:  # noqa: BLE001 (any failure means: not reachable)
        lines.append(f"broker {broker}: NOT reachable ({type(exc).__name__}: {exc})")
    if settings.api_url:
        import httpx

        try:
            code = httpx.get(f"{settings.api_url.rstrip('/')}/api/health", timeout=5).status_code
            lines.append(f"API {settings.api_url}: HTTP {code} (artifacts are uploaded there)")
        except httpx.HTTPError as exc:
            lines.append(f"API {settings.api_url}: NOT reachable ({exc}); artifact uploads will fail")
    else:
        lines.append("API: none set (BENCHLAB_API_URL); artifacts stay in the shared data dir")
    return lines


@app.command()
def worker(queues: str = typer.Option("default", help="comma-separated queues to consume, e.g. gpu.h200,default"),
           name: Optional[str] = typer.Option(None, help="worker name (default: benchlab@<host>)")) -> None:
    """Start a Celery worker that runs jobs (one at a time) in a warm runner process.

    SIGTERM, SIGINT or SIGHUP kill the running cell at once (it is recorded `failed`, retryable),
    then the worker exits; its runner and rank processes die with it even on SIGKILL.
    """
    from celery.signals import worker_ready

    from worker.celery_app import make_celery
    from worker.placement import worker_queues
    from worker.settings import get_worker_settings
    from worker.tasks import register_tasks, visible_gpus

    asked = [q.strip() for q in queues.split(",") if q.strip()]
    problems = [p for p in map(queue_problem, asked) if p] or ([] if asked else ["give at least one"])
    if problems:
        console.print(f"[red]bad input:[/] --queues: {'; '.join(problems)}")
        raise typer.Exit(2)
    settings = get_worker_settings()
    celery_app = make_celery(settings)
    celery_name = name or f"benchlab@{socket.gethostname()}"
    # each queue, and its GPU queues up to this worker's GPU count (a job asking N GPUs waits on <q>.gpusN)
    queue_list = worker_queues(asked, len(visible_gpus(settings.gpus)))
    # unique per process: a replacement started under the same name is another worker to the reaper
    state = register_tasks(celery_app, settings, worker_name=f"{socket.gethostname()}:{celery_name}:{os.getpid()}",
                           queues=queue_list)

    def leave() -> None:
        """Say goodbye and exit 0, from a thread of its own while the main thread carries on starting."""
        try:
            state["heartbeat"].stop()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def stop_handler(then=None):
        def handler(signum, frame):
            state["stopping"] = signal.Signals(signum).name
            state["runner"].kill()
            if callable(then):
                then(signum, frame)
            else:
                # no Celery handler yet (it is still starting). Raising here could stop the main thread inside
                # an import while it holds the import lock, which the heartbeat thread's first beat (it imports
                # the broker's transport) then waits on for ever, holding a module lock the goodbye needs: seen
                # as a worker that never exits. So the goodbye and the exit run on a thread of their own.
                threading.Thread(target=leave, name="benchlab-stop", daemon=True).start()
        return handler

    # from the banner on (so before the first heartbeat), a stop signal is a clean stop (goodbye, exit 0),
    # even while Celery is still starting and has not installed its own handlers
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop_handler())
    console.print(f"[bold]benchlab worker[/] {state['worker']} queues={','.join(queue_list)} "
                  f"gpus={state['heartbeat'].base['gpus'] or 'none'} pid={os.getpid()}")
    for line in _describe_reach(settings):
        console.print(f"  {line}")

    @worker_ready.connect(weak=False)
    def _stop_fast(**_kwargs) -> None:
        # Celery's own handlers wait for the running task: kill the cell first so a stop takes seconds
        term = signal.getsignal(signal.SIGTERM)
        for sig in STOP_SIGNALS:
            prev = term if sig == signal.SIGHUP else signal.getsignal(sig)  # Celery's SIGHUP restarts
            signal.signal(sig, stop_handler(then=prev))

    try:
        state["heartbeat"].start()
        celery_app.Worker(queues=queue_list, pool="solo", concurrency=1, loglevel="WARNING",
                          hostname=celery_name, without_gossip=True, without_mingle=True,
                          without_heartbeat=True).start()
    finally:
        state["runner"].stop()
        state["heartbeat"].stop()


class _EmbeddedWorker:
    """The worker `benchlab up` runs beside the API: started in its own process group, restarted if it
    dies, and stopped (with everything it started) when `up` stops."""

    def __init__(self, queues: str):
        self.cmd = [sys.executable, "-m", "backend.cli", "worker", "--queues", queues]
        self.proc: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.restarts = 0
        self._watch = threading.Thread(target=self._watchdog, name="benchlab-worker-watchdog", daemon=True)

    def start(self) -> "_EmbeddedWorker":
        self.proc = subprocess.Popen(self.cmd, start_new_session=True)
        if not self._watch.is_alive():
            self._watch.start()
        return self

    def _watchdog(self) -> None:
        delay = 1.0
        while not self.stopping.wait(1.0):
            code = self.proc.poll() if self.proc else None
            if code is None or self.stopping.is_set():
                continue
            console.print(f"[yellow]embedded worker (pid {self.proc.pid}) exited with {code}; restarting in "
                          f"{delay:g} s[/]")
            if self.stopping.wait(delay):
                return
            self.restarts += 1
            delay = min(delay * 2, 30.0)
            self.start()

    def stop(self, timeout: float = 8.0) -> None:
        self.stopping.set()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        except ProcessLookupError:
            pass


@app.command()
def up(host: Optional[str] = typer.Option(None), port: Optional[int] = typer.Option(None, min=1, max=65535),
       queues: str = typer.Option("default", help="queues the embedded worker consumes")) -> None:
    """API + pages + recorder + one embedded worker, in one command. SIGINT (Ctrl-C), SIGTERM or SIGHUP
    stop all of it within seconds; a worker that dies is restarted."""
    from backend.settings import get_settings

    settings = get_settings()
    _check_address(host or settings.host, port or settings.port)
    embedded = _EmbeddedWorker(queues).start()
    console.print(f"[bold]benchlab[/] dashboard on http://{host or settings.host}:{port or settings.port}  "
                  f"(data in {settings.resolved_data_dir}, worker pid {embedded.proc.pid})")
    try:
        _serve_api(host, port)
    finally:
        embedded.stop()
