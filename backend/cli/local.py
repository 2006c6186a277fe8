"""Commands that work without a server: `run` (cells in a local runner), `import` (a run file into the
database) and `plan` (the parallelism planner over this database)."""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import typer

from backend.cli.common import (
    app,
    console,
    database_session,
    load_spec,
    out,
    parse_param,
    read_json_lines,
    seconds,
    summary_table,
)
from worker.contract import FAILED_STATES, MAX_REPEATS, RunCell, RunHeader
from worker.suites import suite_names


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
        timeout_s: float = typer.Option(1800.0, help="per cell", callback=seconds),
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
        body = load_spec(spec)
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
    out.print(summary_table(suite, rows))
    if out_path:
        console.print(f"results written to {out_path} (benchlab import {out_path})")
    return rows




@app.command("import")
def import_(path: Path = typer.Argument(..., exists=True, dir_okay=False),
            name: Optional[str] = typer.Option(None)) -> None:
    """Load a `benchlab run --out` file into the database, with its fingerprints and artifacts."""
    from backend.service import AlreadyImported, import_results
    from backend.settings import get_settings

    lines = read_json_lines(path)
    settings = get_settings()
    with database_session() as db:
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
    with database_session() as db:
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
