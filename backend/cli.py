"""The `benchlab` command: up | api | worker | run | submit | import."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="benchlab: run and compare GPU benchmarks of attention kernels and data-parallel training.",
                  no_args_is_help=True, add_completion=False)
console = Console(stderr=True, soft_wrap=True)
out = Console(width=160) if not sys.stdout.isatty() else Console()

FAILED_STATES = ("failed", "oom", "timeout")


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
@app.command()
def api(host: Optional[str] = typer.Option(None, help="default: BENCHLAB_HOST or 127.0.0.1"),
        port: Optional[int] = typer.Option(None, help="default: BENCHLAB_PORT or 8000")) -> None:
    """Start the API, the pages and the recorder (no worker)."""
    import uvicorn

    from backend.main import create_app
    from backend.settings import get_settings

    settings = get_settings()
    uvicorn.run(create_app(settings), host=host or settings.host, port=port or settings.port, log_level="warning")


@app.command()
def worker(queues: str = typer.Option("default", help="comma-separated queues to consume, e.g. gpu.h200,default"),
           name: Optional[str] = typer.Option(None, help="worker name (default: benchlab@<host>)")) -> None:
    """Start a Celery worker that runs jobs (one at a time) in a warm runner process."""
    from worker.celery_app import make_celery
    from worker.settings import get_worker_settings
    from worker.tasks import register_tasks

    settings = get_worker_settings()
    celery_app = make_celery(settings)
    state = register_tasks(celery_app, settings)
    console.print(f"[bold]benchlab worker[/] broker={settings.effective_broker_url.split('@')[-1]} queues={queues}")
    try:
        celery_app.Worker(queues=queues.split(","), pool="solo", concurrency=1, loglevel="WARNING",
                          hostname=name or f"benchlab@{socket.gethostname()}", without_gossip=True,
                          without_mingle=True, without_heartbeat=True).start()
    finally:
        state["runner"].stop()


@app.command()
def up(host: Optional[str] = typer.Option(None), port: Optional[int] = typer.Option(None),
       queues: str = typer.Option("default", help="queues the embedded worker consumes")) -> None:
    """API + pages + recorder + one embedded worker, in one command. Ctrl-C stops both."""
    from backend.settings import get_settings

    settings = get_settings()
    proc = subprocess.Popen([sys.executable, "-m", "backend.cli", "worker", "--queues", queues],
                            start_new_session=True)
    console.print(f"[bold]benchlab[/] dashboard on http://{host or settings.host}:{port or settings.port}  "
                  f"(data in {settings.resolved_data_dir}, worker pid {proc.pid})")
    try:
        api(host=host, port=port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


# -- local runs -----------------------------------------------------------------------------------
def _summary_table(suite: str, rows: list[dict[str, Any]]) -> Table:
    varying = [k for k in rows[0]["params"] if len({json.dumps(r["params"][k]) for r in rows}) > 1] if rows else []
    metric_keys = [k for k in ("median_ms", "p20_ms", "p80_ms", "tflops", "busbw_gbps", "overhead", "mfu")
                   if any(isinstance(r["metrics"].get(k), (int, float)) for r in rows)]
    table = Table(title=f"{suite}: {len(rows)} cells")
    for k in ["cell", *varying, "state", *metric_keys, "note"]:
        table.add_column(k)
    for r in rows:
        note = (r.get("error") or "").splitlines()[0][:60] if r.get("error") else ""
        vals = [r["metrics"].get(k) for k in metric_keys]
        table.add_row(str(r["cell"]), *[str(r["params"][k]) for k in varying], r["state"],
                      *[f"{v:.4g}" if isinstance(v, (int, float)) else "" for v in vals], note)
    return table


@app.command()
def run(suite: str = typer.Argument(..., help="attention | model | ddp | allreduce | noop"),
        param: list[str] = typer.Option([], "--param", "-p", help="name=value[,value...]; repeat for each param"),
        out_path: Optional[Path] = typer.Option(None, "--out", help="write results as JSON lines (importable)"),
        repeats: int = typer.Option(1, min=1), timeout_s: float = typer.Option(1800.0, help="per cell"),
        name: Optional[str] = typer.Option(None)) -> None:
    """Run a grid locally, with no server: each cell in a warm runner process; prints a table."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from backend.grid import SweepInputError, expand_grid
    from worker.runner import Runner
    from worker.settings import get_worker_settings

    params = dict(parse_param(p) for p in param)
    try:
        cells = expand_grid(suite, params, max_cells=100_000)
    except SweepInputError as exc:
        console.print(f"[red]bad input:[/] {exc}")
        raise typer.Exit(2)
    settings = get_worker_settings()
    runner = Runner(max_jobs=settings.runner_max_jobs, commit=settings.commit,
                    startup_timeout_s=settings.runner_startup_timeout_s)
    run_dir = settings.artifact_root / f"run_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}"
    rows: list[dict[str, Any]] = []
    fh = out_path.open("w") if out_path else None
    if fh:
        fh.write(json.dumps({"kind": "sweep", "suite": suite, "params": params, "name": name, "repeats": repeats,
                             "created_at": time.time()}) + "\n")
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[status]}"), console=console) as progress:
            task = progress.add_task(suite, total=len(cells) * repeats, status="")
            for i, cell in enumerate(cells):
                for rep in range(repeats):
                    progress.update(task, status=f"cell {i}: starting")
                    started = time.time()
                    outcome = runner.run({"suite": suite, "params": cell, "artifact_dir": str(run_dir / f"cell_{i}_{rep}")},
                                         timeout_s=timeout_s,
                                         on_progress=lambda m, i=i: progress.update(task, status=f"cell {i}: {m}"))
                    row = {"kind": "cell", "cell": i, "repeat": rep, "params": cell, **outcome.as_dict(),
                           "started_at": started, "finished_at": time.time()}
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
    if any(r["state"] in FAILED_STATES for r in rows):
        raise typer.Exit(1)


# -- talking to a server --------------------------------------------------------------------------
def _load_spec(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


@app.command()
def submit(spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON or YAML sweep spec"),
           server: str = typer.Option("http://127.0.0.1:8000", envvar="BENCHLAB_SERVER"),
           token: Optional[str] = typer.Option(None, envvar="BENCHLAB_API_TOKEN"),
           wait: bool = typer.Option(False, "--wait", help="wait for the sweep; exit 1 if any cell failed"),
           poll_s: float = typer.Option(1.0), timeout_s: float = typer.Option(24 * 3600.0)) -> None:
    """Submit a sweep (the POST /api/sweeps body) to a server."""
    import httpx

    from backend.models import UNFINISHED_STATUSES

    body = _load_spec(spec)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=server, headers=headers, timeout=60) as client:
        r = client.post("/api/sweeps", json=body)
        if r.status_code != 201:
            console.print(f"[red]rejected ({r.status_code}):[/] {r.text}")
            raise typer.Exit(2)
        sweep = r.json()
        console.print(f"sweep {sweep['id']}: {sweep['jobs']} jobs queued  {server}/sweeps/{sweep['id']}")
        out.print(json.dumps(sweep))
        if not wait:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            # the server holds the answer until the sweep finishes (or wait_s passes)
            hold = max(0.0, min(30.0, deadline - time.monotonic()))
            asked = time.monotonic()
            s = client.get(f"/api/sweeps/{sweep['id']}", params={"wait_s": hold}).json()
            if s["status"] not in UNFINISHED_STATUSES:
                break
            if time.monotonic() > deadline:
                console.print("[red]timed out waiting[/]")
                raise typer.Exit(3)
            if time.monotonic() - asked < hold / 2:  # a server that answers at once: poll
                time.sleep(poll_s)
        rows = client.get(f"/api/sweeps/{sweep['id']}/results").json()
    out.print(_summary_table(body["suite"], rows))
    bad = sum(s["counts"][k] for k in FAILED_STATES)
    if bad:
        console.print(f"[red]{bad} cell(s) failed, ran out of memory or timed out[/]")
        raise typer.Exit(1)


@app.command("import")
def import_(path: Path = typer.Argument(..., exists=True, dir_okay=False),
            name: Optional[str] = typer.Option(None)) -> None:
    """Load a `benchlab run --out` file into the database, with its fingerprints."""
    from backend.db import make_engine, session
    from backend.service import import_results
    from backend.settings import get_settings

    try:
        lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except json.JSONDecodeError as exc:
        console.print(f"[red]{path} is not JSON lines:[/] {exc}")
        raise typer.Exit(2)
    settings = get_settings()
    with session(make_engine(settings)) as db:
        try:
            sweep = import_results(db, lines, name)
        except (ValueError, KeyError) as exc:
            console.print(f"[red]cannot import {path}:[/] {exc}")
            raise typer.Exit(2)
        out.print(json.dumps({"id": sweep.id, "jobs": sum(1 for ln in lines if ln.get("kind") == "cell")}))


if __name__ == "__main__":
    app()
