"""What every `benchlab` command shares: the app, the two consoles, option checks, spec and JSON-lines
reading, the database session, the results table."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from worker.contract import clean_metrics

app = typer.Typer(help="benchlab: run and compare GPU benchmarks of attention kernels and data-parallel training.",
                  no_args_is_help=True, add_completion=False)
console = Console(stderr=True, soft_wrap=True)
out = Console(width=160) if not sys.stdout.isatty() else Console()


def seconds(value: float) -> float:
    """A typer callback for a duration option: a positive finite number of seconds."""
    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a positive number of seconds, got {value}")
    return value


def fraction(value: float) -> float:
    """A typer callback for --threshold: strictly between 0 and 1 (0.05 is 5 %), as the API takes it."""
    if not (0 < value < 1):
        raise typer.BadParameter(f"must lie between 0 and 1 (0.05 is 5 %), got {value}")
    return value


def refusal(r) -> str:
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


def summary_table(suite: str, rows: list[dict[str, Any]]) -> Table:
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


def load_spec(path: Path) -> dict[str, Any]:
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
    _, nonfinite = clean_metrics(spec)
    if nonfinite:  # YAML's .nan / .inf and JSON's NaN / Infinity: no request body can carry them
        console.print(f"[red]bad input:[/] {path}: {nonfinite[0]} is not a finite number")
        raise typer.Exit(2)
    return spec


def database_session():
    """A session on the configured database, its schema prepared (migrated when settings allow)."""
    from backend.db import make_engine, prepare_schema, session
    from backend.settings import get_settings

    settings = get_settings()
    engine = make_engine(settings)
    prepare_schema(engine, settings.auto_migrate)
    return session(engine)


def read_json_lines(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file; a line that is not JSON ends the command with exit code 2."""
    try:
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        console.print(f"[red]{path} is not JSON lines:[/] {exc}")
        raise typer.Exit(2) from None
