"""Engine, sessions and the schema's version.

SQLite runs in WAL mode so pages read while the recorder writes. PostgreSQL URLs work as people
write them (`postgresql://user@host:5432/db`): benchlab picks the installed driver (psycopg 3, else
psycopg2). The schema is owned by Alembic (backend/migrations): `migrate()` brings a database to the
newest revision, and `schema_status()` says where one stands. A database made before migrations
existed (it has the tables but no `alembic_version`) is stamped at revision 0001, the schema it has,
then upgraded.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event, inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session, create_engine

from backend import models  # noqa: F401  (registers the tables)
from backend.settings import BackendSettings

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
PRE_MIGRATION_REVISION = "0001"  # the schema of databases created with create_all before Alembic
_PG_MIGRATION_LOCK = 0x62656E63  # advisory lock: two API processes starting at once migrate one at a time


class SchemaError(RuntimeError):
    """The database's schema is not one this code can use as it is."""


class SchemaOutOfDate(SchemaError):
    """The database's schema is older than this code and automatic migration is off."""


class SchemaUnknown(SchemaError):
    """The database is at a revision this code does not know: a newer benchlab wrote it."""


def _known(current: str | None) -> None:
    """SchemaUnknown unless `current` (a database's revision) is empty or one of this code's migrations."""
    known = {rev.revision for rev in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}
    if current is not None and current not in known:
        raise SchemaUnknown(f"the database is at schema revision {current}, which this benchlab does not know "
                            f"(its newest is {head_revision()}): a newer benchlab wrote it. Run that version, or "
                            f"point BENCHLAB_DATABASE_URL / BENCHLAB_DATA_DIR at another database; nothing was changed")


def normalize_url(url: str) -> str:
    """`postgresql://` / `postgres://` -> the SQLAlchemy URL of the PostgreSQL driver that is installed."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            if importlib.util.find_spec("psycopg") is not None:
                driver = "postgresql+psycopg://"
            elif importlib.util.find_spec("psycopg2") is not None:
                driver = "postgresql+psycopg2://"
            else:
                raise RuntimeError("BENCHLAB_DATABASE_URL is PostgreSQL but no driver is installed: "
                                   "pip install 'benchlab[postgres]'")
            return driver + url[len(prefix):]
    return url


def make_engine(settings: BackendSettings) -> Engine:
    url = normalize_url(settings.effective_database_url)
    if url.startswith("sqlite"):
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    else:
        engine = create_engine(url, pool_pre_ping=True, pool_size=settings.db_pool_size, max_overflow=4)
    return engine


def _config(conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def head_revision() -> str:
    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The database's revision; PRE_MIGRATION_REVISION for a pre-Alembic database; None when empty."""
    with engine.connect() as conn:
        rev = MigrationContext.configure(conn).get_current_revision()
        if rev is None and inspect(conn).has_table("sweep"):
            return PRE_MIGRATION_REVISION
        return rev


def schema_status(engine: Engine) -> tuple[str | None, str]:
    return current_revision(engine), head_revision()


def migrate(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Upgrade the database to `revision`; returns (revision before, revision after)."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        cfg = _config(conn)
        before = MigrationContext.configure(conn).get_current_revision()
        _known(before)
        if before is None and inspect(conn).has_table("sweep"):
            command.stamp(cfg, PRE_MIGRATION_REVISION)
            before = PRE_MIGRATION_REVISION
        command.upgrade(cfg, revision)
        after = MigrationContext.configure(conn).get_current_revision()
    return before, after


def prepare_schema(engine: Engine, auto_migrate: bool) -> None:
    """At API start: migrate, or refuse with what to run when automatic migration is off."""
    current, head = schema_status(engine)
    if current == head:
        return
    _known(current)
    if auto_migrate or current is None:  # an empty database is always created
        migrate(engine)
        return
    raise SchemaOutOfDate(f"the database is at schema revision {current}, this benchlab needs {head}: "
                          f"run `benchlab db upgrade` (or set BENCHLAB_AUTO_MIGRATE=true)")


def session(engine: Engine) -> Session:
    return Session(engine, expire_on_commit=False)
