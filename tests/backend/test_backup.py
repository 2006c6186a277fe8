"""Backup and air-gapped runs: `benchlab db export/import`, artifacts that travel with `run --out`,
and artifact retention."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from backend.artifacts import enforce_retention, usage
from backend.main import create_app
from backend.settings import BackendSettings
from tests.stack import ROOT

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TINY_PROFILED_MODEL = ["-p", "size=custom", "-p", "d_model=32", "-p", "d_ff=64", "-p", "num_layers=1",
                       "-p", "num_heads=2", "-p", "context_length=16", "-p", "batch=1", "-p", "vocab_size=100",
                       "-p", "steps=1", "-p", "warmup=0", "-p", "profile=true"]


def benchlab(*args, data_dir: Path, timeout=300):
    return subprocess.run([sys.executable, "-m", "backend.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "BENCHLAB_DATA_DIR": str(data_dir)}, timeout=timeout)


def test_export_then_import_into_another_database_keeps_everything_and_is_idempotent(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    shutil.copy(FIXTURES / "db-ef84b57.sqlite", src / "benchlab.db")  # a database of the previous release
    out = tmp_path / "backup.jsonl"
    r = benchlab("db", "export", str(out), data_dir=src)
    assert r.returncode == 0 and "exported 4 sweep(s)" in r.stderr, r.stderr
    kinds = [json.loads(x)["kind"] for x in out.read_text().splitlines()]
    assert kinds[0] == "benchlab-export" and kinds.count("sweep") == 4 and kinds.count("job") == 12
    assert kinds.count("result") == 10 and kinds.count("environment") == 1
    r = benchlab("db", "import", str(out), data_dir=dst)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"sweeps": 4, "jobs": 12, "results": 10, "environments": 1, "sweeps_skipped": 0,
                                    "artifacts": 0}
    again = benchlab("db", "import", str(out), data_dir=dst)
    assert json.loads(again.stdout)["sweeps_skipped"] == 4 and json.loads(again.stdout)["jobs"] == 0
    app_a = create_app(BackendSettings(data_dir=src), with_recorder=False)
    app_b = create_app(BackendSettings(data_dir=dst), with_recorder=False)
    with TestClient(app_a) as a, TestClient(app_b) as b:
        sa, sb = a.get("/api/sweeps").json(), b.get("/api/sweeps").json()
        strip = lambda rows: [{k: v for k, v in r.items() if k not in ("id",)} for r in rows]  # noqa: E731 (a view)
        assert strip(sa) == strip(sb)
        for x, y in zip(sa, sb, strict=True):
            ra, rb = a.get(f"/api/sweeps/{x['id']}/results").json(), b.get(f"/api/sweeps/{y['id']}/results").json()
            drop = ("job_id", "env_id")
            assert [{k: v for k, v in r.items() if k not in drop} for r in ra] == \
                   [{k: v for k, v in r.items() if k not in drop} for r in rb]


def test_import_of_a_bad_export_changes_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"kind": "benchlab-export", "v": 1}) + "\n" + json.dumps({"kind": "sweep"}) + "\n")
    r = benchlab("db", "import", str(bad), data_dir=tmp_path / "d")
    assert r.returncode == 2 and "line 2" in r.stderr and "uid" in r.stderr, r.stderr
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({"kind": "benchlab-export", "v": 99}) + "\n")
    r = benchlab("db", "import", str(newer), data_dir=tmp_path / "d")
    assert r.returncode == 2 and "newer" in r.stderr
    with TestClient(create_app(BackendSettings(data_dir=tmp_path / "d"), with_recorder=False)) as c:
        assert c.get("/api/sweeps").json() == []


def _export(**change) -> list[dict]:
    """A one-sweep export; change = {kind: {field: value}} edits that kind's row."""
    key = {"sweep_uid": "s1", "cell_index": 0, "repeat_index": 0}
    rows = [{"kind": "benchlab-export", "v": 1},
            {"kind": "environment", "digest": "d1", "data": {"torch": "x"}, "created_at": 1.0},
            {"kind": "sweep", "uid": "s1", "suite": "noop", "name": "n", "params": {"x": [1]}, "tags": {},
             "repeats": 1, "queue": "default", "created_at": 1.0},
            {"kind": "job", **key, "params": {"x": 1}, "state": "done", "attempts": 1, "env_digest": "d1"},
            {"kind": "result", **key, "attempt": 1, "state": "done", "metrics": {"value": 1.0},
             "artifacts": [{"name": "trace.json", "size": 3}], "env_digest": "d1"}]
    for row in rows:
        row.update(change.get(row["kind"], {}))
    return rows


@pytest.fixture
def db(tmp_path):
    from backend.db import make_engine, migrate, session

    engine = make_engine(BackendSettings(data_dir=tmp_path))
    migrate(engine)
    with session(engine) as s:
        yield s


@pytest.mark.parametrize("change, words", [
    ({"job": {"state": "weird"}}, "line 4 (job): state: Value error, unknown job state 'weird'"),
    ({"result": {"state": "running"}}, "line 5 (result): state: Input should be 'done'"),
    ({"job": {"cell_index": 2**70}}, "line 4 (job): cell_index: Input should be less than or equal to"),
    ({"job": {"attempts": 2**70}}, "line 4 (job): attempts: Input should be less than or equal to"),
    ({"sweep": {"repeats": 2**70}}, "line 3 (sweep): repeats: Input should be less than or equal to 100"),
    ({"sweep": {"name": "n" * 300}}, "line 3 (sweep): name: String should have at most 200 characters"),
    ({"sweep": {"queue": "results"}}, "queue 'results' is reserved"),
    ({"sweep": {"created_at": None}}, "line 3 (sweep): created_at: Input should be a valid number"),
    ({"job": {"started_at": float("inf")}}, "line 4 (job): started_at: Input should be a finite number"),
    ({"sweep": {"name": "x\ud800"}}, "line 3.name holds a lone UTF-16 surrogate"),
    ({"result": {"artifacts": [{"name": "../../x", "size": 1}]}}, "'../../x' is not an artifact name"),
    ({"job": {"sweep_uid": "zzz"}}, "line 4: it names 'zzz' before the line that defines it")])
def test_an_export_row_the_api_or_recorder_would_not_have_stored_is_named_and_nothing_is_written(db, change, words):
    from backend.backup import import_lines
    from backend.models import Environment, Sweep

    with pytest.raises(ValueError) as exc:
        import_lines(db, _export(**change))
    assert words in str(exc.value)
    db.rollback()
    assert db.exec(select(Sweep)).all() == [] and db.exec(select(Environment)).all() == []


def test_imported_nan_metrics_are_stored_as_the_recorder_stores_them(db):
    from backend.backup import import_lines
    from backend.service import result_rows_json

    assert import_lines(db, _export(result={"metrics": {"ok": 1.0, "bad": float("nan"), "deep": [float("inf")]}}))[
        "results"] == 1
    row = json.loads(result_rows_json(db, 1))[0]  # strict JSON: the API splices the stored text
    assert row["metrics"] == {"ok": 1.0, "bad": None, "deep": [None]} and row["nonfinite"] == ["bad", "deep[0]"]


def test_an_offline_runs_profiler_artifacts_reach_the_dashboard(tmp_path):
    offline, server = tmp_path / "gpu-host", tmp_path / "server"
    out = offline / "runs" / "profiled.jsonl"
    r = benchlab("run", "model", *TINY_PROFILED_MODEL, "--out", str(out), data_dir=offline / "data")
    assert r.returncode == 0, r.stderr
    cell = json.loads(out.read_text().splitlines()[1])
    assert {a["name"] for a in cell["artifacts"]} >= {"trace.json"} and cell["artifact_dir"]
    moved = tmp_path / "carried"  # the file and its artifacts travel together, to another machine
    shutil.copytree(out.parent, moved)
    r = benchlab("import", str(moved / "profiled.jsonl"), data_dir=server)
    assert r.returncode == 0, r.stderr
    sid = json.loads(r.stdout)["id"]
    with TestClient(create_app(BackendSettings(data_dir=server), with_recorder=False)) as c:
        row = c.get(f"/api/sweeps/{sid}/results").json()[0]
        assert "trace.json" in {a["name"] for a in row["artifacts"]}
        trace = c.get(f"/api/jobs/{row['job_id']}/artifacts/trace.json")
        assert trace.status_code == 200 and trace.content == (moved / cell["artifact_dir"] / "trace.json").read_bytes()
        assert c.get("/api/health").json()["artifacts_bytes"] > 0


def test_a_backup_carries_each_attempts_artifacts_to_the_other_database(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    run = tmp_path / "run" / "r.jsonl"  # two cells that write an artifact, loaded into src as any run is
    r = benchlab("run", "noop", "-p", "x=1,2", "-p", "artifact=true", "--out", str(run), data_dir=src)
    assert r.returncode == 0, r.stderr
    assert benchlab("import", str(run), data_dir=src).returncode == 0
    from backend.db import make_engine, session
    from backend.models import Job, Result
    from worker.settings import artifact_dir

    with session(make_engine(BackendSettings(data_dir=src))) as db:  # a retry of the first job, with its own file
        first = db.exec(select(Result).order_by(Result.id)).first()
        db.add(Result(job_id=first.job_id, attempt=2, state="done", metrics={"value": 2.0},
                      artifacts=[{"name": "retry.txt", "size": 5}]))
        db.get(Job, first.job_id).attempts = 2
        db.commit()
        job_id = first.job_id
    retry_dir = artifact_dir(src / "artifacts", job_id, 2)
    retry_dir.mkdir(parents=True)
    (retry_dir / "retry.txt").write_text("again")

    out = tmp_path / "backup" / "b.jsonl"
    out.parent.mkdir()
    r = benchlab("db", "export", str(out), data_dir=src)
    assert r.returncode == 0 and "artifacts of 3 result(s)" in r.stderr, r.stderr
    carried = [json.loads(x) for x in out.read_text().splitlines() if '"artifact_dir"' in x]
    assert [(x["cell_index"], x["attempt"]) for x in carried] == [(0, 1), (0, 2), (1, 1)]
    assert all(x["artifact_dir"].startswith("b.jsonl.artifacts/") for x in carried)

    moved = tmp_path / "moved"  # the file and its folder travel together
    shutil.copytree(out.parent, moved)
    r = benchlab("db", "import", str(moved / "b.jsonl"), data_dir=dst)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["artifacts"] == 3
    seen = []
    with TestClient(create_app(BackendSettings(data_dir=src), with_recorder=False)) as a, \
            TestClient(create_app(BackendSettings(data_dir=dst), with_recorder=False)) as b:
        ja, jb = ([row["job_id"] for row in c.get(f"/api/sweeps/{c.get('/api/sweeps').json()[0]['id']}/results").json()]
                  for c in (a, b))
        for x, y in zip(ja, jb, strict=True):
            for attempt, name in ((1, "noop.json"), (2, "retry.txt")):
                got = [c.get(f"/api/jobs/{j}/artifacts/{name}", params={"attempt": attempt})
                       for c, j in ((a, x), (b, y))]
                assert got[0].status_code == got[1].status_code
                if got[0].status_code == 200:
                    assert got[0].content == got[1].content
                    seen.append(name)
    assert sorted(seen) == ["noop.json", "noop.json", "retry.txt"]

    (tmp_path / "blocked.jsonl.artifacts").write_text("a file where the folder would go")
    r = benchlab("db", "export", str(tmp_path / "blocked.jsonl"), data_dir=src)
    assert r.returncode == 2 and "and its artifacts" in r.stderr and "nothing was exported" in r.stderr, r.stderr
    assert not (tmp_path / "blocked.jsonl").exists()
    r = benchlab("db", "export", str(tmp_path / "plain.jsonl"), "--no-artifacts", data_dir=src)
    assert r.returncode == 0 and not (tmp_path / "plain.jsonl.artifacts").exists()
    assert '"artifact_dir"' not in (tmp_path / "plain.jsonl").read_text()


@pytest.mark.parametrize("folder, words", [("../elsewhere", "is outside the file's folder"),
                                           ("b.jsonl.artifacts/none", "is missing beside the file")])
def test_an_export_naming_an_artifact_folder_it_does_not_carry_is_refused_and_nothing_is_written(
        db, tmp_path, folder, words):
    from backend.backup import ArtifactCopy, import_lines
    from backend.models import Sweep

    (tmp_path / "elsewhere").mkdir()
    beside = tmp_path / "backup"
    beside.mkdir()
    with pytest.raises(ValueError, match=f"line 5 \\(result\\): artifact folder '{folder}' {words}"):
        import_lines(db, _export(result={"artifact_dir": folder}),
                     ArtifactCopy.for_file(tmp_path / "artifacts", beside / "b.jsonl"))
    db.rollback()
    assert db.exec(select(Sweep)).all() == [] and not (tmp_path / "artifacts").exists()


def test_a_run_file_whose_artifact_folder_is_missing_is_refused_before_any_file_or_row_is_written(tmp_path):
    run, server = tmp_path / "run" / "r.jsonl", tmp_path / "server"
    r = benchlab("run", "noop", "-p", "x=1,2", "-p", "artifact=true", "--out", str(run), data_dir=tmp_path / "gpu")
    assert r.returncode == 0, r.stderr
    shutil.rmtree(run.parent / "r.jsonl.artifacts" / "cell_1_0")  # the second cell's folder did not travel
    r = benchlab("import", str(run), data_dir=server)
    assert r.returncode == 2 and "artifact folder 'r.jsonl.artifacts/cell_1_0' is missing beside the file" in r.stderr
    assert not (server / "artifacts").exists()  # not even the first cell's files, under a job id handed out again
    with TestClient(create_app(BackendSettings(data_dir=server), with_recorder=False)) as c:
        assert c.get("/api/sweeps").json() == []


def test_retention_removes_the_oldest_job_folders_first(tmp_path):
    root = tmp_path / "artifacts"
    now = time.time()
    for i, age_days in enumerate([10, 5, 1, 0]):
        d = root / f"job_{i}"
        d.mkdir(parents=True)
        f = d / "trace.json"
        f.write_bytes(b"x" * 1024 * 1024)  # 1 MiB each
        os.utime(f, (now - age_days * 86400, now - age_days * 86400))
        os.utime(d, (now - age_days * 86400, now - age_days * 86400))
    assert usage(root) == {"bytes": 4 * 1024 * 1024, "jobs": 4}
    assert enforce_retention(root, None, None, now) == []
    assert enforce_retention(root, 7, None, now) == ["job_0"]  # older than a week
    assert enforce_retention(root, None, 1.5, now) == ["job_1", "job_2"]  # then the oldest until <= 1.5 MB
    assert sorted(p.name for p in root.iterdir()) == ["job_3"]
