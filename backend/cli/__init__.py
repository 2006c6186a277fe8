"""The `benchlab` command: up | api | worker | run | submit | ci | compare | import | plan | token | db.

One module per kind of command (serve, local, remote, admin); each registers its commands on the one
Typer app of backend.cli.common when imported. `main` is the console script."""
from __future__ import annotations

from backend.cli.common import app, console

# each module registers its commands when imported, in this order (the order of `benchlab --help`)
# isort: off
from backend.cli import serve, local, remote, admin  # noqa: F401
# isort: on

__all__ = ["app", "main"]


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
