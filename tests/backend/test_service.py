"""What the recorder writes: each worker message applied once, stale ones dropped, nothing lost."""
from __future__ import annotations

import pytest
from sqlmodel import select

from backend.db import make_engine, migrate, session
from backend.models import Job, Result, SweepCreate
from backend.service import apply_event, create_sweep, job_detail, retry_sweep
from backend.settings import BackendSettings


@pytest.fixture
def db(tmp_path):
    settings = BackendSettings(data_dir=tmp_path)
    engine = make_engine(settings)
    migrate(engine)
    with session(engine) as s:
        s.settings = settings
        yield s


def _one_job(db) -> Job:
    sweep, jobs = create_sweep(db, None, SweepCreate(suite="noop", params={"x": 1}), db.settings)
    assert [j.state for j in jobs] == ["queued"]
    return db.exec(select(Job).where(Job.sweep_id == sweep.id)).one()


def result(job_id, state="done", attempt=1, **kw):
    return {"type": "result", "job_id": job_id, "state": state, "attempt": attempt, "metrics": {"value": 1.0},
            "env": {"torch": "x", "python": "3"}, "artifacts": [], "duration_s": 0.5, **kw}


def test_running_then_result(db):
    job = _one_job(db)
    assert apply_event(db, {"type": "state", "job_id": job.id, "state": "running", "worker": "w1", "attempt": 1})
    assert apply_event(db, {"type": "progress", "job_id": job.id, "message": "warm-up", "attempt": 1})
    assert apply_event(db, result(job.id))
    d = job_detail(db, db.get(Job, job.id))
    assert d["state"] == "done" and d["worker"] == "w1" and d["metrics"] == {"value": 1.0} and d["env"]["torch"] == "x"


def test_running_after_final_state_is_dropped(db):
    job = _one_job(db)
    apply_event(db, result(job.id))
    assert not apply_event(db, {"type": "state", "job_id": job.id, "state": "running", "attempt": 1})
    assert db.get(Job, job.id).state == "done"


def test_stale_attempt_is_dropped_after_retry(db):
    job = _one_job(db)
    apply_event(db, result(job.id, state="failed", error="boom"))
    from backend.models import Sweep

    assert retry_sweep(db, None, db.get(Sweep, job.sweep_id)) == 1
    assert not apply_event(db, result(job.id, state="failed", attempt=1))  # a late copy of attempt 1
    assert db.get(Job, job.id).state == "queued"
    assert apply_event(db, result(job.id, state="done", attempt=2))
    written = db.exec(select(Result).where(Result.job_id == job.id).order_by(Result.id))
    assert [r.attempt for r in written] == [1, 2]


def test_unknown_state_breaks_the_contract_and_unknown_job_is_ignored(db):
    from pydantic import ValidationError

    job = _one_job(db)
    with pytest.raises(ValidationError, match="state"):
        apply_event(db, result(job.id, state="exploded"))
    assert db.get(Job, job.id).state == "queued"
    assert not apply_event(db, result(987654))


def test_environment_is_stored_once(db):
    a, b = _one_job(db), _one_job(db)
    apply_event(db, result(a.id))
    apply_event(db, result(b.id))
    assert db.get(Job, a.id).env_id == db.get(Job, b.id).env_id is not None


def _cell(params, metrics):
    return {"kind": "cell", "cell": 0, "params": params, "state": "done", "metrics": metrics,
            "env": {"gpu_name": "G", "torch": "x", "python": "3"}}


def test_a_ddp_page_key_changes_when_a_newer_allreduce_sweep_lands(db):
    # the ddp charts draw the fit of the latest all-reduce sweep: a new one must not be hidden by the cache
    from backend.service import import_results, sweep_version

    ddp = import_results(db, [{"kind": "sweep", "suite": "ddp", "params": {}},
                              _cell({"wrapper": "bucketed", "device": "cpu"}, {"median_ms": 10.0})])
    noop = import_results(db, [{"kind": "sweep", "suite": "noop", "params": {}}, _cell({"x": 1}, {"value": 1.0})])
    before = sweep_version(db, ddp.id, suite="ddp")
    noop_before = sweep_version(db, noop.id, suite="noop")
    import_results(db, [{"kind": "sweep", "suite": "allreduce", "params": {}},
                        _cell({"size_mb": 1.0, "world_size": 2}, {"median_ms": 0.1, "backend": "gloo"})])
    assert sweep_version(db, ddp.id, suite="ddp") != before
    assert sweep_version(db, noop.id, suite="noop") == noop_before  # other suites draw no fit: unchanged


def test_a_run_imported_twice_is_one_sweep(db):
    from sqlmodel import select

    from backend.models import Sweep
    from backend.service import AlreadyImported, import_results

    lines = [{"kind": "sweep", "suite": "noop", "params": {}, "uid": "run-1"}, _cell({"x": 1}, {"value": 1.0})]
    first = import_results(db, lines)
    with pytest.raises(AlreadyImported) as exc:
        import_results(db, lines, name="renamed")
    assert exc.value.sweep_id == first.id
    assert len(db.exec(select(Sweep).where(Sweep.uid == "run-1")).all()) == 1


@pytest.mark.parametrize("header, cell, words", [
    ({}, {"cell": 2**70}, "cell: Input should be less than or equal to"),
    ({"repeats": 2**70}, {}, "repeats: Input should be less than or equal to 100"),
    ({"name": "n" * 300}, {}, "name: String should have at most 200 characters"),
    ({"tags": {str(i): "x" for i in range(60)}}, {}, "at most 50 tags"),
    ({"name": "bad \ud800"}, {}, "line 1.name holds a lone UTF-16 surrogate"),
    ({}, {"error": "bad \ud800"}, "line 2.error holds a lone UTF-16 surrogate"),
    ({}, {"metrics": {"\udc00": 1}}, "line 2.metrics holds a lone UTF-16 surrogate")])
def test_a_run_file_past_the_apis_limits_is_refused_by_name_and_adds_nothing(db, header, cell, words):
    # what POST /api/sweeps refuses, and what the database cannot hold, is refused from a run file too
    from backend.models import Sweep
    from backend.service import import_results

    lines = [{"kind": "sweep", "suite": "noop", "params": {}, **header}, {**_cell({"x": 1}, {"value": 1.0}), **cell}]
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        import_results(db, lines)
    db.rollback()
    assert db.exec(select(Sweep)).all() == []
