"""Administration: named API tokens and the database (schema migrations, export, import)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from backend.cli.common import (
    app,
    console,
    database_session,
    out,
    read_json_lines,
)

# -- named tokens ----------------------------------------------------------------------------------
token_app = typer.Typer(help="Named API tokens (read / write / admin), in the API's database: run where the "
                             "API's settings are.", no_args_is_help=True)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(name: str = typer.Option(..., help="what the token is for, e.g. ci"),
                 scope: str = typer.Option("write", help="read | write | admin")) -> None:
    """Create a token and print its secret (shown this once; only its hash is kept)."""
    from backend import tokens

    with database_session() as db:
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

    with database_session() as db:
        rows = [{k: v for k, v in r.model_dump().items() if k != "token_hash"} for r in tokens.list_tokens(db)]
    out.print(json.dumps(rows, indent=1))


@token_app.command("revoke")
def token_revoke(name: str = typer.Argument(...)) -> None:
    """Revoke a token: it stops working at once."""
    from backend import tokens

    with database_session() as db:
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
    with database_session() as db:  # the database first: a file is written only once it can be read
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

    lines = read_json_lines(in_path)
    with database_session() as db:
        try:
            counts = import_lines(db, lines, ArtifactCopy.for_file(get_settings().artifact_root, in_path))
        except ValueError as exc:
            console.print(f"[red]cannot import {in_path}:[/] {exc}")
            raise typer.Exit(2) from None
    out.print(json.dumps(counts))
