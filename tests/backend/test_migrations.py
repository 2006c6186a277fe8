"""The schema is versioned: a fresh database, and one made by the release before migrations
(commit ef84b57, fixtures in tests/fixtures/), both reach the newest revision with nothing lost,
on SQLite and on the PostgreSQL server of the test machine."""
from __future__ import annotations

import shutil
import sqlite3
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlmodel import select

from backend.db import (
    PRE_MIGRATION_REVISION,
    SchemaOutOfDate,
    head_revision,
    make_engine,
    migrate,
    normalize_url,
    prepare_schema,
    schema_status,
    session,
)
from backend.models import Environment, Job, Result, Sweep
from backend.settings import BackendSettings
from tests.conftest import postgres_admin_url

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# what the ef84b57 fixture holds (tests/fixtures/make-db-ef84b57.sh made it through that release's API and CLI)
FIXTURE_SWEEPS = {"fixture grid": 6, "fixture skip": 2, "fixture import": 2, "fixture cancelled": 2}
FIXTURE_STATES = {"done": 5, "failed": 3, "skipped": 2, "cancelled": 2}


def _check_fixture_content(engine) -> None:
    with session(engine) as db:
        sweeps = db.exec(select(Sweep)).all()
        jobs = db.exec(select(Job)).all()
        assert {s.name: sum(1 for j in jobs if j.sweep_id == s.id) for s in sweeps} == FIXTURE_SWEEPS
        states: dict[str, int] = {}
        for j in jobs:
            states[j.state] = states.get(j.state, 0) + 1
        assert states == FIXTURE_STATES
        results = db.exec(select(Result)).all()
        assert len(results) == 10 and all(r.nonfinite in (None, []) for r in results)
        assert {r.metrics.get("x") for r in results if r.state == "done"} == {1, 2, 3, 7, 8}
        assert len(db.exec(select(Environment)).all()) == 1
        assert sweeps[0].tags == {"commit": "ef84b57", "branch": "main"}


@pytest.fixture(params=["sqlite", "postgres"])
def fixture_db(request, tmp_path):
    """A database made by the ef84b57 release, as BackendSettings."""
    if request.param == "sqlite":
        shutil.copy(FIXTURES / "db-ef84b57.sqlite", tmp_path / "benchlab.db")
        yield BackendSettings(data_dir=tmp_path)
        return
    admin = postgres_admin_url()
    name = f"benchlab_mig_{uuid.uuid4().hex[:10]}"
    subprocess.run(["psql", admin, "-q", "-c", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    try:
        url = admin.rsplit("/", 1)[0] + f"/{name}"
        subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1", "-f", str(FIXTURES / "db-ef84b57.postgres.sql")],
                       check=True, capture_output=True)
        yield BackendSettings(data_dir=tmp_path, database_url=url)
    finally:
        subprocess.run(["psql", admin, "-q", "-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
                       capture_output=True)


def test_a_database_of_the_previous_release_upgrades_with_everything_intact(fixture_db):
    engine = make_engine(fixture_db)
    assert schema_status(engine) == (PRE_MIGRATION_REVISION, head_revision())
    with engine.connect() as conn:
        before = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar()
                  for t in ("sweep", "job", "result", "environment")}
    assert before == {"sweep": 4, "job": 12, "result": 10, "environment": 1}
    with pytest.raises(SchemaOutOfDate, match="benchlab db upgrade"):
        prepare_schema(engine, auto_migrate=False)
    assert migrate(engine) == (PRE_MIGRATION_REVISION, head_revision())
    _check_fixture_content(engine)
    assert schema_status(engine) == (head_revision(), head_revision())
    assert migrate(engine) == (head_revision(), head_revision())  # a second upgrade does nothing
    with session(engine) as db:  # the new constraint holds
        job = db.exec(select(Job).where(Job.state == "done")).first()
        db.add(Result(job_id=job.id, attempt=1, state="done"))
        with pytest.raises(Exception, match="(?i)unique"):
            db.commit()


def test_fresh_database_is_created_at_head_and_matches_the_models(tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from backend.models import SQLModel

    engine = make_engine(BackendSettings(data_dir=tmp_path))
    prepare_schema(engine, auto_migrate=False)  # an empty database is always created
    assert schema_status(engine) == (head_revision(), head_revision())
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert diff == [], f"the models and the migrations disagree: {diff}"


def test_duplicate_results_and_non_finite_metrics_of_old_databases_are_cleaned(tmp_path):
    path = tmp_path / "benchlab.db"
    shutil.copy(FIXTURES / "db-ef84b57.sqlite", path)
    con = sqlite3.connect(path)  # what the old release could store: a result twice, and Infinity
    job_id, attempt = con.execute("SELECT job_id, attempt FROM result WHERE state = 'done' LIMIT 1").fetchone()
    con.execute("INSERT INTO result (job_id, attempt, state, metrics, artifacts, created_at) VALUES "
                "(?, ?, 'done', '{\"x\": Infinity, \"y\": 2}', '[]', 0)", (job_id, attempt))
    con.commit()
    con.close()
    engine = make_engine(BackendSettings(data_dir=tmp_path))
    migrate(engine)
    with session(engine) as db:
        rows = db.exec(select(Result).where(Result.job_id == job_id)).all()
    assert len(rows) == 1 and rows[0].metrics == {"x": None, "y": 2} and rows[0].nonfinite == ["x"]


def test_postgres_urls_are_taken_as_users_write_them():
    assert normalize_url("postgresql://u@h:5432/db") == "postgresql+psycopg://u@h:5432/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"


def test_db_cli_upgrades_and_reports(tmp_path):
    import os
    import sys

    shutil.copy(FIXTURES / "db-ef84b57.sqlite", tmp_path / "benchlab.db")
    env = {**os.environ, "BENCHLAB_DATA_DIR": str(tmp_path)}
    cur = subprocess.run([sys.executable, "-m", "backend.cli", "db", "current"], env=env, capture_output=True,
                         text=True)
    assert cur.returncode == 1 and f'"current": "{PRE_MIGRATION_REVISION}"' in cur.stdout
    up = subprocess.run([sys.executable, "-m", "backend.cli", "db", "upgrade"], env=env, capture_output=True,
                        text=True)
    assert up.returncode == 0 and f"{PRE_MIGRATION_REVISION} -> {head_revision()}" in up.stderr
    cur = subprocess.run([sys.executable, "-m", "backend.cli", "db", "current"], env=env, capture_output=True,
                         text=True)
    assert cur.returncode == 0
    with make_engine(BackendSettings(data_dir=tmp_path)).connect() as conn:
        assert inspect(conn).has_table("dead_letter")
        assert conn.execute(text("SELECT count(*) FROM job")).scalar() == 12


def test_a_database_a_newer_benchlab_wrote_is_named_and_left_alone(tmp_path):
    import os
    import sys

    engine = make_engine(BackendSettings(data_dir=tmp_path))
    migrate(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    env = {**os.environ, "BENCHLAB_DATA_DIR": str(tmp_path)}
    for args, extra in ((("db", "upgrade"), {}), (("api",), {}), (("api",), {"BENCHLAB_AUTO_MIGRATE": "false"})):
        p = subprocess.run([sys.executable, "-m", "backend.cli", *args], env={**env, **extra}, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2, p.stderr[-2000:]
        assert "schema revision 0099, which this benchlab does not know" in p.stderr and "Traceback" not in p.stderr
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0099"


def test_an_old_database_with_automatic_migration_off_says_what_to_run_in_one_line(fixture_db):
    import os
    import sys

    env = {**os.environ, "BENCHLAB_DATA_DIR": str(fixture_db.data_dir), "BENCHLAB_AUTO_MIGRATE": "false",
           **({"BENCHLAB_DATABASE_URL": fixture_db.database_url} if fixture_db.database_url else {})}
    p = subprocess.run([sys.executable, "-m", "backend.cli", "api"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "run `benchlab db upgrade`" in p.stderr and "Traceback" not in p.stderr, p.stderr
