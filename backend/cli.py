"""The `benchlab` command: up | api | worker | run | submit | import."""
from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from worker.contract import FAILED_STATES, MAX_REPEATS, UNFINISHED_STATUSES, RunCell, RunHeader, queue_problem
from worker.suites import suite_names

app = typer.Typer(help="benchlab: run and compare GPU benchmarks of attention kernels and data-parallel training.",
                  no_args_is_help=True, add_completion=False)
console = Console(stderr=True, soft_wrap=True)
out = Console(width=160) if not sys.stdout.isatty() else Console()



def _seconds(value: float) -> float:
    """A typer callback for a duration option: a positive finite number of seconds."""
    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a positive number of seconds, got {value}")
    return value


def _fraction(value: float) -> float:
    """A typer callback for --threshold: strictly between 0 and 1 (0.05 is 5 %), as the API takes it."""
    if not (0 < value < 1):
        raise typer.BadParameter(f"must lie between 0 and 1 (0.05 is 5 %), got {value}")
    return value


def _refusal(r) -> str:
    """A server's error answer for a person: its `detail` as lines (each field named, as
    backend.errors.error_messages words them), or the start of the body when it is not benchlab's."""
    try:
        detail = r.json()["detail"]
    except (ValueError, KeyError, TypeError):
        server, start = f"{r.url.scheme}://{r.url.netloc.decode()}", " ".join(r.text.split())[:200]
        return f"an answer that is not benchlab's (is {server} a benchlab server?): {start}"
    from backend.errors import error_messages

    return "; ".join(error_messages(detail))[:2000]


def parse_param(text: str) -> tuple[str, Any]:
    """'k=v' or 'k=v1,v2,...' -> (k, value or [values]); values parsed as JSON where they can be."""
    if "=" not in text:
        raise typer.BadParameter(f"--param needs name=value[,value...], got {text!r}")
    name, raw = text.split("=", 1)

    def one(v: str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v

    values = [one(v.strip()) for v in raw.split(",")] if raw else []
    return name.strip(), values[0] if len(values) == 1 else values


# -- servers --------------------------------------------------------------------------------------
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

    def stop_handler(then=None):
        def handler(signum, frame):
            state["stopping"] = signal.Signals(signum).name
            state["runner"].kill()
            if callable(then):
                then(signum, frame)
            else:  # no Celery handler (it is still starting): leave through the `finally`, which says goodbye
                raise SystemExit(0)
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


# -- local runs -----------------------------------------------------------------------------------
def _summary_table(suite: str, rows: list[dict[str, Any]]) -> Table:
    varying = [k for k in rows[0]["params"] if len({json.dumps(r["params"][k]) for r in rows}) > 1] if rows else []
    metric_keys = [k for k in ("median_ms", "p20_ms", "p80_ms", "tflops", "busbw_gbps", "overhead", "mfu")
                   if any(isinstance(r["metrics"].get(k), (int, float)) for r in rows)]
    repeats = any(r.get("repeat") for r in rows)  # rows come in rounds; the table lists a cell's runs together
    table = Table(title=f"{suite}: {len(rows)} {'runs' if repeats else 'cells'}")
    for k in ["cell", *(["repeat"] if repeats else []), *varying, "state", *metric_keys, "note"]:
        table.add_column(k)
    for r in sorted(rows, key=lambda r: (r["cell"], r.get("repeat") or 0)):
        note = (r.get("error") or "").splitlines()[0][:60] if r.get("error") else ""
        vals = [r["metrics"].get(k) for k in metric_keys]
        table.add_row(str(r["cell"]), *([str(r.get("repeat") or 0)] if repeats else []),
                      *[str(r["params"][k]) for k in varying], r["state"],
                      *[f"{v:.4g}" if isinstance(v, (int, float)) else "" for v in vals], note)
    return table


@app.command()
def run(suite: Optional[str] = typer.Argument(None, help=" | ".join(suite_names())),
        param: list[str] = typer.Option([], "--param", "-p", help="name=value[,value...]; repeat for each param"),
        spec: Optional[Path] = typer.Option(None, exists=True, dir_okay=False,
                                            help="a sweep spec (JSON or YAML, as `submit` takes) instead of "
                                                 "SUITE and -p"),
        preset: Optional[str] = typer.Option(None, help="a study's sweeps, one after another (GET /api/presets "
                                                        "lists them); --out is then a folder"),
        out_path: Optional[Path] = typer.Option(None, "--out", help="write results as JSON lines (importable)"),
        repeats: int = typer.Option(1, min=1, max=MAX_REPEATS),
        timeout_s: float = typer.Option(1800.0, help="per cell", callback=_seconds),
        name: Optional[str] = typer.Option(None)) -> None:
    """Run a grid locally, with no server: each cell in a warm runner process; prints a table."""
    from backend.grid import SweepInputError, expand_grid

    if sum(x is not None for x in (suite, spec, preset)) != 1 or (param and suite is None):
        console.print("[red]bad input:[/] give SUITE with -p params, or --spec FILE, or --preset NAME")
        raise typer.Exit(2)
    if preset is not None:
        from backend.presets import PRESETS

        if preset not in PRESETS:
            console.print(f"[red]bad input:[/] no preset {preset!r}; presets: {', '.join(PRESETS)}")
            raise typer.Exit(2)
        if out_path is not None and out_path.exists() and not out_path.is_dir():
            console.print(f"[red]bad input:[/] --preset writes a file per sweep into the folder --out names, and "
                          f"{out_path} is a file")
            raise typer.Exit(2)
        sweeps = [(b.suite, b.params, b.name, b.repeats or repeats) for b in PRESETS[preset][1]]
        outs = [out_path / f"{i}_{s[0]}.jsonl" if out_path else None for i, s in enumerate(sweeps)]
    elif spec is not None:
        body = _load_spec(spec)
        if not isinstance(body, dict) or "suite" not in body:
            console.print(f"[red]bad input:[/] {spec} is not a sweep spec (an object with `suite` and `params`)")
            raise typer.Exit(2)
        sweeps = [(body["suite"], body.get("params", {}), name or body.get("name"), body.get("repeats") or repeats)]
        outs = [out_path]
    else:
        pairs = [parse_param(p) for p in param]
        twice = sorted({k for k, _ in pairs if sum(k == j for j, _ in pairs) > 1})
        if twice:  # the later would silently win: one -p per param, its values comma-separated
            console.print(f"[red]bad input:[/] -p {', '.join(twice)} given more than once; give each param once, "
                          f"with its values comma-separated (-p {twice[0]}=1,2)")
            raise typer.Exit(2)
        sweeps, outs = [(suite, dict(pairs), name, repeats)], [out_path]
    for path in outs:  # before any cell runs: a file that cannot be written would lose the results
        try:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.open("a").close()
        except OSError as exc:
            console.print(f"[red]cannot write {path}:[/] {exc.strerror}")
            raise typer.Exit(2) from None
    grids = []
    for s_suite, s_params, _, _ in sweeps:
        try:
            grids.append(expand_grid(s_suite, s_params, max_cells=100_000))
        except SweepInputError as exc:
            console.print(f"[red]bad input:[/] {exc}")
            raise typer.Exit(2) from None
    failed = False
    for (s_suite, s_params, s_name, s_repeats), cells, path in zip(sweeps, grids, outs, strict=True):
        rows = _run_locally(s_suite, s_params, cells, s_name, s_repeats, timeout_s, path)
        failed |= any(r["state"] in FAILED_STATES for r in rows)
    if failed:
        raise typer.Exit(1)


def _run_locally(suite: str, params, cells: list[dict[str, Any]], name: str | None, repeats: int,
                 timeout_s: float, out_path: Path | None) -> list[dict[str, Any]]:
    """One sweep's cells in a warm runner, a progress bar, a table; the rows (and the --out file)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from worker.runner import Runner
    from worker.settings import get_worker_settings

    settings = get_worker_settings()
    runner = Runner(max_jobs=settings.runner_max_jobs, commit=settings.commit,
                    startup_timeout_s=settings.runner_startup_timeout_s,
                    memory_limit_gb=settings.runner_memory_gb)
    # with --out, each cell's artifacts (profiler traces, memory snapshots) go beside the file, so
    # `benchlab import` brings them along; without, under the data dir
    run_dir = (out_path.parent / f"{out_path.name}.artifacts" if out_path
               else settings.artifact_root / f"run_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}")
    rows: list[dict[str, Any]] = []
    fh = out_path.open("w") if out_path else None  # run() made sure it can be written
    if fh:
        fh.write(RunHeader(suite=suite, params=params, name=name, repeats=repeats, created_at=time.time(),
                           uid=uuid.uuid4().hex).model_dump_json() + "\n")
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[status]}"), console=console) as progress:
            task = progress.add_task(suite, total=len(cells) * repeats, status="")
            for rep in range(repeats):  # in rounds, as a server queues them (backend/service.py)
                for i, cell in enumerate(cells):
                    progress.update(task, status=f"cell {i}: starting")
                    started = time.time()
                    job = {"suite": suite, "params": cell, "artifact_dir": str(run_dir / f"cell_{i}_{rep}")}
                    outcome = runner.run(job,
                                         timeout_s=timeout_s,
                                         on_progress=lambda m, i=i: progress.update(task, status=f"cell {i}: {m}"))
                    rel = f"{out_path.name}.artifacts/cell_{i}_{rep}" if out_path and outcome.artifacts else None
                    row = RunCell(cell=i, repeat=rep, params=cell, **outcome.as_dict(), started_at=started,
                                  finished_at=time.time(), artifact_dir=rel).model_dump(mode="json")
                    rows.append(row)
                    if fh:
                        fh.write(json.dumps(row) + "\n")
                        fh.flush()
                    progress.advance(task)
    finally:
        runner.stop()
        if fh:
            fh.close()
    out.print(_summary_table(suite, rows))
    if out_path:
        console.print(f"results written to {out_path} (benchlab import {out_path})")
    return rows


# -- talking to a server --------------------------------------------------------------------------
def _load_spec(path: Path) -> dict[str, Any]:
    """A sweep spec file's content (YAML by its suffix, else JSON); one that cannot be read or parsed is
    bad input (exit 2) named with the parser's own words, not a traceback."""
    import yaml

    is_yaml = path.suffix in (".yaml", ".yml")
    try:
        text = path.read_text()
        spec = yaml.safe_load(text) if is_yaml else json.loads(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, json.JSONDecodeError) as exc:
        console.print(f"[red]bad input:[/] {path} is not a readable {'YAML' if is_yaml else 'JSON'} sweep spec: {exc}")
        raise typer.Exit(2) from None
    where = _nonfinite(spec)
    if where is not None:  # YAML's .nan / .inf and JSON's NaN / Infinity: no request body can carry them
        console.print(f"[red]bad input:[/] {path}: {where or 'the spec'} is not a finite number")
        raise typer.Exit(2)
    return spec


def _nonfinite(value: Any, where: str = "") -> str | None:
    """The dotted path of the first NaN or infinity in a parsed spec, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _nonfinite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


@app.command()
def submit(spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON or YAML sweep spec"),
           server: str = typer.Option("http://127.0.0.1:8000", envvar="BENCHLAB_SERVER"),
           token: Optional[str] = typer.Option(None, envvar="BENCHLAB_API_TOKEN"),
           wait: bool = typer.Option(False, "--wait", help="wait for the sweep; exit 1 if any cell failed"),
           poll_s: float = typer.Option(1.0, callback=_seconds),
           timeout_s: float = typer.Option(24 * 3600.0, callback=_seconds)) -> None:
    """Submit a sweep (the POST /api/sweeps body) to a server."""
    import httpx

    body = _load_spec(spec)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        _submit(body, server, headers, wait, poll_s, timeout_s)
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach the server {server}:[/] {exc}")
        raise typer.Exit(2) from None


def _wait_for(client, sweep_id: int, timeout_s: float, poll_s: float, exit_code: int = 3) -> dict:
    """Wait until the sweep has no queued or running cell (held waits; polling if the server answers
    at once), printing its counts as they change; the summary. Exit `exit_code` past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        # the server holds the answer until the sweep finishes (or wait_s passes)
        hold = max(0.0, min(30.0, deadline - time.monotonic()))
        asked = time.monotonic()
        s = client.get(f"/api/sweeps/{sweep_id}", params={"wait_s": hold}).json()
        counts = {k: v for k, v in s["counts"].items() if v}
        if counts != last:
            console.print(f"sweep {sweep_id}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
            last = counts
        if s["status"] not in UNFINISHED_STATUSES:
            return s
        if time.monotonic() > deadline:
            console.print("[red]timed out waiting[/]")
            raise typer.Exit(exit_code)
        if time.monotonic() - asked < hold / 2:  # a server that answers at once: poll
            time.sleep(poll_s)


def _submit(body: dict, server: str, headers: dict, wait: bool, poll_s: float, timeout_s: float) -> None:
    import httpx

    with httpx.Client(base_url=server, headers=headers, timeout=60) as client:
        r = client.post("/api/sweeps", json=body)
        if r.status_code != 201:
            console.print(f"[red]rejected ({r.status_code}):[/] {_refusal(r)}")
            raise typer.Exit(2)
        sweep = r.json()
        console.print(f"sweep {sweep['id']}: {sweep['jobs']} jobs queued  {server}/sweeps/{sweep['id']}")
        out.print(json.dumps(sweep))
        if not wait:
            return
        s = _wait_for(client, sweep["id"], timeout_s, poll_s)
        rows = client.get(f"/api/sweeps/{sweep['id']}/results").json()
    out.print(_summary_table(body["suite"], rows))
    bad = sum(s["counts"][k] for k in FAILED_STATES)
    if bad:
        console.print(f"[red]{bad} cell(s) failed, ran out of memory or timed out[/]")
        raise typer.Exit(1)


def _report_comparison(result: dict, heading: str, json_out: Path | None, markdown_out: Path | None,
                       no_match: str) -> None:
    """Print (and write) a comparison; exit 2 when no cell matched, 1 when a cell is slower."""
    from backend.compare import markdown

    table = heading + markdown(result)
    out.print(table, markup=False, highlight=False)
    if json_out:
        json_out.write_text(json.dumps(result, indent=1))
    if markdown_out:
        markdown_out.write_text(table + "\n")
    if not result["cells"]:
        console.print(f"[red]{no_match}[/]", markup=True)
        raise typer.Exit(2)
    if result["summary"]["slower"]:
        raise typer.Exit(1)


@app.command()
def ci(spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON or YAML sweep spec (as submit)"),
       server: str = typer.Option("http://127.0.0.1:8000", envvar="BENCHLAB_SERVER"),
       token: Optional[str] = typer.Option(None, envvar="BENCHLAB_API_TOKEN"),
       baseline: str = typer.Option("auto", help="auto (the newest finished sweep of the same suite and grid on "
                                                 "--baseline-branch) or a sweep id"),
       baseline_branch: str = typer.Option("main"),
       threshold: float = typer.Option(0.05, help="relative: 0.05 is 5 %", callback=_fraction),
       ignore: str = typer.Option("", help="comma-separated params not matched on"),
       confirm: bool = typer.Option(False, "--confirm", help="run the cells judged slower once more (beside the "
                                                             "baseline's configuration where it differs only in "
                                                             "ignored params); slower stands only if confirmed"),
       json_out: Optional[Path] = typer.Option(None, "--json"),
       markdown_out: Optional[Path] = typer.Option(None, "--markdown"),
       timeout_s: float = typer.Option(6 * 3600.0, callback=_seconds),
       poll_s: float = typer.Option(1.0, callback=_seconds)) -> None:
    """Run a sweep and judge it against its baseline. Exit 0: no cell slower; 1: a cell slower; 2: could
    not judge (a cell failed, OOMed or timed out, no baseline, server unreachable, bad token)."""
    import httpx

    from backend.ci import ci_tags, find_baseline

    body = _load_spec(spec)
    body["tags"] = {**ci_tags(os.environ), **(body.get("tags") or {})}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ignored = [p.strip() for p in ignore.split(",") if p.strip()]
    try:
        with httpx.Client(base_url=server, headers=headers, timeout=120) as client:
            if baseline == "auto":
                listed = client.get("/api/sweeps", params={"limit": 1000})
                if listed.status_code != 200:
                    console.print(f"[red]cannot list sweeps ({listed.status_code}):[/] {_refusal(listed)}")
                    raise typer.Exit(2)
                base = find_baseline(listed.json(), body["suite"], body.get("params") or {}, ignored,
                                     baseline_branch)
                base_id = base["id"] if base else None
            else:  # a sweep named by id: there, and of this suite, before anything is submitted
                base_id = int(baseline) if baseline.isdigit() and int(baseline) > 0 else None
                if base_id is None:
                    console.print(f"[red]bad input:[/] --baseline is auto or a sweep id, got {baseline!r}")
                    raise typer.Exit(2)
                found = client.get(f"/api/sweeps/{base_id}")
                if found.status_code != 200:
                    console.print(f"[red]cannot use baseline {base_id} ({found.status_code}):[/] {_refusal(found)}; "
                                  "nothing was submitted")
                    raise typer.Exit(2)
                theirs = found.json().get("suite")
                if theirs != body.get("suite"):
                    console.print(f"[red]bad input:[/] baseline {base_id} ran the {theirs} suite and {spec} runs the "
                                  f"{body.get('suite')} suite; nothing was submitted")
                    raise typer.Exit(2)
            r = client.post("/api/sweeps", json=body)
            if r.status_code != 201:
                console.print(f"[red]rejected ({r.status_code}):[/] {_refusal(r)}")
                raise typer.Exit(2)
            sid = r.json()["id"]
            console.print(f"sweep {sid} ({r.json()['jobs']} jobs) {server}/sweeps/{sid}; tags {body['tags']}")
            summary = _wait_for(client, sid, timeout_s, poll_s, exit_code=2)
            bad = {k: summary["counts"][k] for k in FAILED_STATES if summary["counts"][k]}
            if bad:
                console.print(f"[red]cannot judge: {bad} cell(s) of sweep {sid}[/]")
                raise typer.Exit(2)
            if base_id is None:
                console.print(f"[red]cannot judge: no finished {body['suite']} sweep of this grid on branch "
                              f"{baseline_branch!r} to compare with[/] (this one, {sid}, can be the next baseline)")
                raise typer.Exit(2)
            result = _compare_or_exit(client, base_id, sid, threshold, ignored)
            if confirm and result["summary"]["slower"]:
                result = _confirm(client, result, body, base_id, sid, threshold, ignored, timeout_s, poll_s)
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach the server {server}:[/] {exc}")
        raise typer.Exit(2) from None
    _report_comparison({**result, "baseline": base_id, "sweep": sid},
                       f"benchlab: sweep {sid} against baseline {base_id}\n\n", json_out, markdown_out,
                       "cannot judge: no cell matches the baseline's")


def _compare_or_exit(client, a: int, b: int, threshold: float, ignored: list[str]) -> dict:
    c = client.get("/api/compare", params={"a": a, "b": b, "threshold": threshold, "ignore": ",".join(ignored)})
    if c.status_code != 200:
        console.print(f"[red]comparison refused ({c.status_code}):[/] {_refusal(c)}")
        raise typer.Exit(2)
    return c.json()


def _confirm(client, result: dict, body: dict, base_id: int, sid: int, threshold: float, ignored: list[str],
             timeout_s: float, poll_s: float) -> dict:
    """Run the cells judged slower again (and the baseline's cells beside them, when they differ only in
    ignored params, so both run on this server now); keep `slower` only where the rerun is slower too."""
    def key(params: dict) -> str:
        return json.dumps({k: v for k, v in params.items() if k not in ignored}, sort_keys=True)

    slower = {key(c["params"]) for c in result["cells"] if c["verdict"] == "slower"}

    def cells_of(sweep_id: int) -> list[dict]:
        rows = client.get(f"/api/sweeps/{sweep_id}/results").json()
        unique = {json.dumps(r["params"], sort_keys=True): r["params"] for r in rows if key(r["params"]) in slower}
        return list(unique.values())

    def rerun(cells: list[dict], of: int) -> int:
        again = {k: v for k, v in body.items() if k in ("suite", "repeats", "queue", "timeout_s", "name")}
        again.update(params=cells, tags={**(body.get("tags") or {}), "confirms": str(of)})
        r = client.post("/api/sweeps", json=again)
        if r.status_code != 201:
            console.print(f"[red]confirmation rejected ({r.status_code}):[/] {_refusal(r)}")
            raise typer.Exit(2)
        return r.json()["id"]

    new_cells, base_cells = cells_of(sid), cells_of(base_id)
    both = sorted(json.dumps(c, sort_keys=True) for c in new_cells) != sorted(json.dumps(c, sort_keys=True)
                                                                            for c in base_cells)
    again_base = rerun(base_cells, base_id) if both else base_id
    again_new = rerun(new_cells, sid)
    console.print(f"confirming {len(slower)} slower cell(s): sweep {again_new}"
                  + (f" beside the baseline's configuration, sweep {again_base}" if both else
                     f" against baseline {base_id}"))
    for s_id in {again_base, again_new} - {base_id}:
        summary = _wait_for(client, s_id, timeout_s, poll_s, exit_code=2)
        bad = {k: summary["counts"][k] for k in FAILED_STATES if summary["counts"][k]}
        if bad:
            console.print(f"[red]cannot judge: {bad} cell(s) of confirmation sweep {s_id}[/]")
            raise typer.Exit(2)
    second = _compare_or_exit(client, again_base, again_new, threshold, ignored)
    confirmed = {key(c["params"]) for c in second["cells"] if c["verdict"] == "slower"}
    for c in result["cells"]:
        if c["verdict"] == "slower":
            c["confirmed"] = key(c["params"]) in confirmed
            if not c["confirmed"]:
                c["verdict"] = "inconclusive"
                c["reason"] = f"slower at first, not when run again (sweep {again_new})"
    result["summary"] = {v: sum(1 for c in result["cells"] if c["verdict"] == v) for v in result["summary"]}
    result["confirmation"] = {"sweep": again_new, "baseline": again_base, "result": second}
    return result


def _database_session():
    """A session on the configured database, its schema prepared (migrated when settings allow)."""
    from backend.db import make_engine, prepare_schema, session
    from backend.settings import get_settings

    settings = get_settings()
    engine = make_engine(settings)
    prepare_schema(engine, settings.auto_migrate)
    return session(engine)


def _read_json_lines(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file; a line that is not JSON ends the command with exit code 2."""
    try:
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        console.print(f"[red]{path} is not JSON lines:[/] {exc}")
        raise typer.Exit(2) from None


@app.command("import")
def import_(path: Path = typer.Argument(..., exists=True, dir_okay=False),
            name: Optional[str] = typer.Option(None)) -> None:
    """Load a `benchlab run --out` file into the database, with its fingerprints and artifacts."""
    from backend.service import AlreadyImported, import_results
    from backend.settings import get_settings

    lines = _read_json_lines(path)
    settings = get_settings()
    with _database_session() as db:
        try:
            sweep = import_results(db, lines, name, source_dir=path.parent, artifact_root=settings.artifact_root)
        except AlreadyImported as exc:  # the same run again: nothing to add
            console.print(f"{path}: {exc}; nothing changed")
            out.print(json.dumps({"id": exc.sweep_id, "jobs": 0, "already_imported": True}))
            return
        except (ValueError, KeyError) as exc:
            console.print(f"[red]cannot import {path}:[/] {exc}")
            raise typer.Exit(2) from None
        out.print(json.dumps({"id": sweep.id, "jobs": sum(1 for ln in lines if ln.get("kind") == "cell")}))


@app.command()
def plan(size: str = typer.Option("xl", help="a named size (small .. 10B) or custom, with the dims below"),
         d_model: Optional[int] = None, d_ff: Optional[int] = None, num_layers: Optional[int] = None,
         num_heads: Optional[int] = None, vocab_size: int = 10_000, seq_len: int = 512,
         batch: int = typer.Option(8, help="sequences per step, over all devices"), devices: int = 8,
         memory_gb: Optional[float] = typer.Option(None, help="per device; default: an H200's 141"),
         tflops: Optional[float] = typer.Option(None, help="per device; default: the newest measured matmul "
                                                           "peak, else the datasheet"),
         bandwidth_gbps: Optional[float] = typer.Option(None, help="per device; default: the newest all-reduce "
                                                                   "fit, else NVLink's"),
         overlap: bool = typer.Option(True), checkpointing: bool = typer.Option(False),
         out_path: Optional[Path] = typer.Option(None, "--out", help="write the plan here as JSON")) -> None:
    """The parallelism plan of GET /api/plan from this database: DP, FSDP, TP and FSDP+TP per device,
    and every measured ddp and leaderboard cell beside its prediction. The inputs are checked as the API
    checks them (backend.routes.plan.PlanQuery)."""
    from fastapi import HTTPException
    from pydantic import ValidationError

    from backend.routes.plan import PlanQuery, make_plan

    try:
        query = PlanQuery(size=size, d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                          vocab_size=vocab_size, seq_len=seq_len, batch=batch, devices=devices, memory_gb=memory_gb,
                          tflops=tflops, bandwidth_gbps=bandwidth_gbps, overlap=overlap, checkpointing=checkpointing)
    except ValidationError as exc:  # the API's 422s, named by flag
        for e in exc.errors(include_url=False):
            console.print(f"[red]bad input:[/] --{str(e['loc'][0]).replace('_', '-')}: {e['msg']} (got {e['input']!r})")
        raise typer.Exit(2) from None
    with _database_session() as db:
        try:
            result = make_plan(db, query)
        except HTTPException as exc:  # the route's own 422s: the same words here
            console.print(f"[red]bad input:[/] {'; '.join(d['msg'] for d in exc.detail)}")
            raise typer.Exit(2) from None
    text = json.dumps(result, indent=1)
    if out_path:
        out_path.write_text(text + "\n")
        console.print(f"plan written to {out_path}")
    else:
        out.print(text)


@app.command("compare")
def compare_cmd(a: int = typer.Argument(..., help="sweep A (the baseline)"),
                b: int = typer.Argument(..., help="sweep B"),
                server: str = typer.Option("http://127.0.0.1:8000", envvar="BENCHLAB_SERVER"),
                token: Optional[str] = typer.Option(None, envvar="BENCHLAB_API_TOKEN"),
                threshold: float = typer.Option(0.05, help="relative: 0.05 is 5 %", callback=_fraction),
                ignore: str = typer.Option("", help="comma-separated params not matched on, e.g. impl"),
                allow_env_mismatch: bool = typer.Option(False, help="judge cells whose environments differ"),
                json_out: Optional[Path] = typer.Option(None, "--json", help="write the comparison as JSON"),
                markdown_out: Optional[Path] = typer.Option(None, "--markdown", help="write the table as markdown")
                ) -> None:
    """Compare two sweeps cell by cell; print a markdown table. Exit 0: no cell slower; 1: a cell slower;
    2: could not compare (server unreachable, bad token, no such sweep, no matching cells)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{server.rstrip('/')}/api/compare", headers=headers, timeout=120,
                      params={"a": a, "b": b, "threshold": threshold, "ignore": ignore,
                              "allow_env_mismatch": allow_env_mismatch})
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach the server {server}:[/] {exc}")
        raise typer.Exit(2) from None
    if r.status_code != 200:
        console.print(f"[red]comparison refused ({r.status_code}):[/] {_refusal(r)}")
        raise typer.Exit(2)
    _report_comparison(r.json(), "", json_out, markdown_out,
                       "no cell of A matches a cell of B (name the params that differ with --ignore)")


# -- named tokens ----------------------------------------------------------------------------------
token_app = typer.Typer(help="Named API tokens (read / write / admin), in the API's database: run where the "
                             "API's settings are.", no_args_is_help=True)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(name: str = typer.Option(..., help="what the token is for, e.g. ci"),
                 scope: str = typer.Option("write", help="read | write | admin")) -> None:
    """Create a token and print its secret (shown this once; only its hash is kept)."""
    from backend import tokens

    with _database_session() as db:
        try:
            row, secret = tokens.create(db, name, scope)
        except tokens.TokenError as exc:
            console.print(f"[red]not created:[/] {exc}")
            raise typer.Exit(2) from None
        console.print(f"token {row.name!r} ({row.scope}) created; it is shown this once:")
    out.print(secret)


@token_app.command("list")
def token_list() -> None:
    """Tokens with scope, created, last used and revoked times (never their secrets)."""
    from backend import tokens

    with _database_session() as db:
        rows = [{k: v for k, v in r.model_dump().items() if k != "token_hash"} for r in tokens.list_tokens(db)]
    out.print(json.dumps(rows, indent=1))


@token_app.command("revoke")
def token_revoke(name: str = typer.Argument(...)) -> None:
    """Revoke a token: it stops working at once."""
    from backend import tokens

    with _database_session() as db:
        try:
            tokens.revoke(db, name)
        except tokens.TokenError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None
    console.print(f"token {name!r} revoked")


# -- the database ---------------------------------------------------------------------------------
db_app = typer.Typer(help="The database: its schema (upgrade, current) and its content (export, import).",
                     no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="target revision (default: the newest)")) -> None:
    """Apply the schema migrations (a database from before migrations is recognised and upgraded)."""
    from backend.db import make_engine, migrate
    from backend.settings import get_settings

    before, after = migrate(make_engine(get_settings()), revision)
    console.print(f"database schema: {before or 'empty'} -> {after}")


@db_app.command("current")
def db_current() -> None:
    """Print the database's schema revision and the newest this benchlab knows; exit 1 if behind."""
    from backend.db import make_engine, schema_status
    from backend.settings import get_settings

    current, head = schema_status(make_engine(get_settings()))
    out.print(json.dumps({"current": current, "head": head}))
    if current != head:
        raise typer.Exit(1)


@db_app.command("export")
def db_export(out_path: Path = typer.Argument(..., help="JSON-lines file to write ('-': standard output)"),
              sweep: list[int] = typer.Option([], "--sweep", help="only these sweep ids (repeatable)"),
              artifacts: bool = typer.Option(True, help="carry the results' artifacts in a folder beside the file, "
                                                        "FILE.artifacts (not with '-')")) -> None:
    """Write sweeps with their jobs, results and fingerprints as JSON lines (backup, or another server)."""
    from sqlmodel import select

    from backend.backup import ArtifactCopy, dumps_line, export_lines
    from backend.db import head_revision
    from backend.models import Sweep
    from backend.settings import get_settings

    n = 0
    to_stdout = str(out_path) == "-"
    carry = ArtifactCopy.for_file(get_settings().artifact_root, out_path) if artifacts and not to_stdout else None
    with _database_session() as db:  # the database first: a file is written only once it can be read
        missing = sorted(set(sweep) - set(db.exec(select(Sweep.id).where(Sweep.id.in_(sweep))).all()))
        if missing:
            console.print(f"[red]bad input:[/] no sweep {', '.join(map(str, missing))} in this database; nothing "
                          "was written")
            raise typer.Exit(2)
        try:
            fh = sys.stdout if to_stdout else out_path.open("w")
        except OSError as exc:
            console.print(f"[red]cannot write {out_path}:[/] {exc.strerror}")
            raise typer.Exit(2) from None
        carried = 0
        try:
            for row in export_lines(db, head_revision(), sweep or None, carry):
                fh.write(dumps_line(row) + "\n")
                n += row["kind"] == "sweep"
                carried += "artifact_dir" in row
        except OSError as exc:  # the file or the artifacts' folder beside it: no half backup is left
            if fh is not sys.stdout:
                fh.close()
                out_path.unlink(missing_ok=True)
            console.print(f"[red]cannot write {out_path} and its artifacts:[/] {exc}; nothing was exported")
            raise typer.Exit(2) from None
        finally:
            if fh is not sys.stdout:
                fh.close()
    where = f"; artifacts of {carried} result(s) in {carry.beside / carry.folder}" if carried else ""
    console.print(f"exported {n} sweep(s) to {out_path}{where}")


@db_app.command("import")
def db_import(in_path: Path = typer.Argument(..., exists=True, dir_okay=False)) -> None:
    """Load a `benchlab db export` file, with the artifacts carried beside it; sweeps already present (same
    uid) are skipped."""
    from backend.backup import ArtifactCopy, import_lines
    from backend.settings import get_settings

    lines = _read_json_lines(in_path)
    with _database_session() as db:
        try:
            counts = import_lines(db, lines, ArtifactCopy.for_file(get_settings().artifact_root, in_path))
        except ValueError as exc:
            console.print(f"[red]cannot import {in_path}:[/] {exc}")
            raise typer.Exit(2) from None
    out.print(json.dumps(counts))


def main() -> None:
    """The `benchlab` command: the app, with a bad BENCHLAB_* setting named in one line per setting, and a
    database it cannot load, reach or use as it is in one line (exit 2), instead of a traceback."""
    from pydantic import ValidationError
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    from backend.db import SchemaError

    try:
        app()
    except SchemaError as exc:  # older with automatic migration off, or written by a newer benchlab
        console.print(f"[red]database schema:[/] {exc}")
        raise SystemExit(2) from None
    except (ArgumentError, NoSuchModuleError, OperationalError) as exc:  # a URL it cannot use, a server down
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        console.print(f"[red]database error[/] (BENCHLAB_DATABASE_URL): {first}")
        raise SystemExit(2) from None
    except ValidationError as exc:
        if not exc.title.endswith("Settings"):  # only the settings classes: anything else is a bug to show
            raise
        for e in exc.errors(include_url=False):
            name = "BENCHLAB_" + "_".join(map(str, e["loc"])).upper()
            console.print(f"[red]bad setting:[/] {name}: {e['msg']} (got {e['input']!r})")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
