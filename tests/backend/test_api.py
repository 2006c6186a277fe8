"""The REST contract with good and bad input. Bad input: 4xx naming the field, nothing stored or queued."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from backend.db import session
from backend.main import create_app
from backend.models import Job, Sweep
from backend.settings import BackendSettings


@pytest.fixture
def client(tmp_path, database_url):
    settings = BackendSettings(data_dir=tmp_path, max_grid_cells=50, database_url=database_url)
    app = create_app(settings, with_recorder=False)
    with TestClient(app) as c:
        c.app_ref = app
        yield c


def queued_messages(client) -> int:
    folder = client.app_ref.state.dispatcher.worker_settings.broker_dir / "queue"
    return len(list(folder.glob("*.msg")))


def stored_sweeps(client) -> int:
    with session(client.app_ref.state.engine) as db:
        return len(db.exec(select(Sweep)).all()) + len(db.exec(select(Job)).all())


def test_health_and_openapi(client):
    assert client.get("/api/health").json()["status"] == "ok"
    spec = client.get("/openapi.json").json()
    assert "/api/sweeps" in spec["paths"] and "/api/sweeps/{sweep_id}/results" in spec["paths"]


def test_broker_down_answers_503_and_stores_nothing(client, monkeypatch):
    sweep = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1]}}).json()["id"]
    before = stored_sweeps(client), queued_messages(client)

    def unreachable():
        raise ConnectionError("broker at redis://nowhere refused the connection")

    monkeypatch.setattr(client.app_ref.state.dispatcher.cancels, "ping", unreachable)
    for method, path, body in [("post", "/api/sweeps", {"suite": "noop", "params": {"x": [1, 2]}}),
                               ("post", f"/api/sweeps/{sweep}/retry", None),
                               ("post", f"/api/sweeps/{sweep}/cancel", None)]:
        r = getattr(client, method)(path, json=body)
        assert r.status_code == 503, (path, r.text)
        assert "refused the connection" in r.json()["detail"] and "nothing was changed" in r.json()["detail"]
    assert (stored_sweeps(client), queued_messages(client)) == before
    assert client.get(f"/api/sweeps/{sweep}").json()["counts"]["queued"] == 1
    assert client.get("/api/health").json()["broker_ok"] is False


def test_a_send_that_fails_part_way_records_the_unsent_jobs_as_failed(client, monkeypatch):
    from backend.dispatch import SendError

    def refuse_after_one(jobs, queue):
        raise SendError(1, ConnectionError("broker went away"))

    monkeypatch.setattr(client.app_ref.state.dispatcher, "send", refuse_after_one)
    r = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1, 2, 3]}})
    assert r.status_code == 201
    rows = client.get(f"/api/sweeps/{r.json()['id']}/results").json()
    assert [row["state"] for row in rows] == ["queued", "failed", "failed"]
    assert all("could not queue the job" in row["error"] and "went away" in row["error"] for row in rows[1:])


def test_suites_carry_json_schema(client):
    suites = {s["name"]: s for s in client.get("/api/suites").json()}
    assert {"attention", "model", "ddp", "allreduce", "noop"} <= set(suites)
    props = suites["attention"]["schema"]["properties"]
    assert "pass" in props and "seq_len" in props
    assert set(props["impl"]["enum"]) >= {"naive", "sdpa", "flash_pytorch", "flash_triton"}


def test_create_expands_grid_and_queues_one_task_per_job(client):
    r = client.post("/api/sweeps", json={"suite": "attention", "params": {"seq_len": [128, 256],
                                                                          "impl": ["naive", "sdpa"],
                                                                            "d_head": 32}, "repeats": 2, "name": "g"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["jobs"] == 8 and body["status"] == "queued"
    assert queued_messages(client) == 8
    s = client.get(f"/api/sweeps/{body['id']}").json()
    assert s["counts"]["queued"] == 8 and s["name"] == "g"
    rows = client.get(f"/api/sweeps/{body['id']}/results").json()
    assert len(rows) == 8 and rows[0]["params"]["d_head"] == 32 and rows[0]["params"]["pass"] == "fwd_bwd"
    # first axis varies slowest
    assert [r["params"]["seq_len"] for r in rows[::2]] == [128, 128, 256, 256]
    # repeats are queued in rounds: every cell's first run before any cell's second
    by_run = {(r["cell"], r["repeat"]): r["job_id"] for r in rows}
    assert max(by_run[c, 0] for c in range(4)) < min(by_run[c, 1] for c in range(4))
    csv = client.get(f"/api/sweeps/{body['id']}/results?format=csv")
    assert csv.headers["content-type"].startswith("text/csv")
    assert csv.text.splitlines()[0].startswith("job_id,cell,repeat,state") and len(csv.text.splitlines()) == 9


def test_list_is_newest_first(client):
    ids = [client.post("/api/sweeps", json={"suite": "noop", "params": {}}).json()["id"] for _ in range(3)]
    assert [s["id"] for s in client.get("/api/sweeps").json()] == ids[::-1]


@pytest.mark.parametrize("body,field", [
    ({"suite": "nope", "params": {}}, "suite"),
    ({"suite": "attention", "params": {"seq_lenn": 5}}, "seq_lenn"),
    ({"suite": "attention", "params": {"seq_len": "long"}}, "seq_len"),
    ({"suite": "attention", "params": {"batch": -1}}, "batch"),
    ({"suite": "attention", "params": {"heads": 0}}, "heads"),
    ({"suite": "attention", "params": {"seq_len": []}}, "seq_len"),
    ({"suite": "attention", "params": {"impl": "cuda_magic"}}, "impl"),
    ({"suite": "attention", "params": {"seq_len": list(range(1, 52))}}, "params"),
    ({"suite": "attention", "params": {"batch": [1, 2], "seq_len": [16, -3]}}, "seq_len"),
    ({"suite": "model", "params": {"size": "custom", "d_model": 64}}, "size=custom"),
    ({"suite": "noop", "params": {}, "repeats": 0}, "repeats"),
    ({"params": {}}, "suite"),
    ({"suite": "noop", "params": {"x": [1, 2, 1]}}, "grid axis 'x' lists a value more than once"),
    ({"suite": "ddp", "params": {"bucket_size_mb": [1, 1.0]}}, "written two ways"),
])
def test_bad_input_is_named_and_changes_nothing(client, body, field):
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 422, r.text
    assert field in r.text
    assert stored_sweeps(client) == 0 and queued_messages(client) == 0


def test_grid_over_the_cap_says_how_big(client):
    r = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": list(range(51))}})
    assert r.status_code == 422 and "51 cells" in r.text and "50" in r.text


def test_malformed_json(client):
    r = client.post("/api/sweeps", content=b'{"suite": "noop", "params": ',
                    headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.text
    assert stored_sweeps(client) == 0


@pytest.mark.parametrize("path", ["/api/sweeps/999", "/api/sweeps/999/results", "/api/jobs/999"])
def test_missing_ids_are_404(client, path):
    r = client.get(path)
    assert r.status_code == 404 and "999" in r.json()["detail"]


def test_missing_sweep_writes_are_404(client):
    assert client.post("/api/sweeps/42/retry").status_code == 404
    assert client.post("/api/sweeps/42/cancel").status_code == 404


def test_cancel_marks_queued_jobs(client):
    sid = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1, 2, 3]}}).json()["id"]
    r = client.post(f"/api/sweeps/{sid}/cancel")
    assert r.json()["cancelled"] == 3
    s = client.get(f"/api/sweeps/{sid}").json()
    assert s["status"] == "cancelled" and s["counts"]["cancelled"] == 3
    with session(client.app_ref.state.engine) as db:
        uid = db.get(Sweep, sid).uid
    assert client.app_ref.state.dispatcher.cancels.is_cancelled(uid)
    # a fresh database starts its ids at 1 again: its sweep 1 must not inherit this mark
    other = create_app(BackendSettings(data_dir=client.app_ref.state.settings.data_dir / "other"), with_recorder=False)
    with TestClient(other) as c2:
        sid2 = c2.post("/api/sweeps", json={"suite": "noop", "params": {}}).json()["id"]
        with session(other.state.engine) as db:
            assert not client.app_ref.state.dispatcher.cancels.is_cancelled(db.get(Sweep, sid2).uid)


def test_token_guards_writes_but_not_reads(tmp_path):
    app = create_app(BackendSettings(data_dir=tmp_path, api_token="s3cret"), with_recorder=False)
    with TestClient(app) as c:
        body = {"suite": "noop", "params": {}}
        assert c.post("/api/sweeps", json=body).status_code == 401
        assert c.post("/api/sweeps", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/api/sweeps", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 201
        assert c.get("/api/sweeps").status_code == 200
        assert c.put("/api/jobs/1/artifacts/x.txt", content=b"hi").status_code == 401


def test_artifact_upload_and_download(client):
    sid = client.post("/api/sweeps", json={"suite": "noop", "params": {}}).json()["id"]
    job_id = client.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
    data = b"x" * 300_000
    r = client.put(f"/api/jobs/{job_id}/artifacts/trace.json", content=data)
    assert r.status_code == 201 and r.json()["size"] == len(data)
    assert client.get(f"/api/jobs/{job_id}/artifacts/trace.json").content == data
    # the decoded path has one segment more, so no route takes it
    assert client.put(f"/api/jobs/{job_id}/artifacts/..%2Fescape", content=b"x").status_code == 404
    assert client.put(f"/api/jobs/{job_id}/artifacts/.hidden", content=b"x").status_code == 422


def test_every_body_a_route_serves_is_a_content_type_its_schema_declares(client):
    sid = client.post("/api/sweeps", json={"suite": "noop", "params": {}}).json()["id"]
    job_id = client.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
    client.put(f"/api/jobs/{job_id}/artifacts/trace.json", content=b"{}")
    paths = client.get("/openapi.json").json()["paths"]
    for route, url in (("/api/sweeps/{sweep_id}/results", f"/api/sweeps/{sid}/results"),
                       ("/api/sweeps/{sweep_id}/results", f"/api/sweeps/{sid}/results?format=csv"),
                       ("/api/jobs/{job_id}/artifacts/{name}", f"/api/jobs/{job_id}/artifacts/trace.json")):
        r = client.get(url)
        assert r.status_code == 200, url
        served = r.headers["content-type"].split(";")[0]
        assert served in paths[route]["get"]["responses"]["200"]["content"], (url, served)


def test_a_retried_jobs_artifacts_are_kept_per_attempt_and_the_newest_is_served(client):
    sid = client.post("/api/sweeps", json={"suite": "noop", "params": {}}).json()["id"]
    job_id = client.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
    with session(client.app_ref.state.engine) as db:
        db.get(Job, job_id).attempts = 2  # as a retry leaves it
        db.commit()
    url = f"/api/jobs/{job_id}/artifacts/trace.json"
    assert client.put(url, content=b"first").json() == {"job_id": job_id, "name": "trace.json", "size": 5,
                                                        "attempt": 1}
    assert client.put(url, params={"attempt": 2}, content=b"second!").status_code == 201  # was 409
    again = client.put(url, params={"attempt": 2}, content=b"x")
    assert again.status_code == 409 and "from attempt 2" in again.text
    assert client.get(url).content == b"second!"  # the newest attempt that has it
    assert client.get(url, params={"attempt": 1}).content == b"first"
    missing = client.get(f"/api/jobs/{job_id}/artifacts/other.json", params={"attempt": 2})
    assert missing.status_code == 404 and "from attempt 2" in missing.text
    assert client.get(url, params={"attempt": 0}).status_code == 422


def test_ddp_heads_must_divide_d_model(client):
    r = client.post("/api/sweeps", json={"suite": "ddp", "params": {"d_model": 100, "num_heads": 3}})
    assert r.status_code == 422 and "divisible" in r.text
    assert stored_sweeps(client) == 0


def test_results_json_fast_path_equals_parsed_rows(client):
    from backend import service

    sid = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1, 2]}}).json()["id"]
    with session(client.app_ref.state.engine) as db:
        job = db.exec(select(Job).where(Job.sweep_id == sid)).first()
        service.apply_event(db, {"type": "result", "job_id": job.id, "state": "failed", "attempt": 1,
                                 "metrics": {"a": 1.5, "nested": {"b": [1, 2]}}, "error": 'quote " and \\n newline',
                                 "env": {"torch": "t"}, "artifacts": [{"name": "x.json", "size": 3}],
                                 "duration_s": 0.1})
        parsed = service.result_rows(db, sid)
    fast = client.get(f"/api/sweeps/{sid}/results").json()
    assert fast == parsed
    assert fast[0]["metrics"]["nested"] == {"b": [1, 2]} and fast[1]["metrics"] == {} and fast[1]["artifacts"] == []


def test_wait_holds_the_answer_until_the_sweep_finishes(client):
    # the recorder's part, played by a thread: write the result, then bump the change feed
    import threading

    from backend.service import apply_event

    app = client.app_ref
    sid = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": 1}}).json()["id"]
    with session(app.state.engine) as db:
        job_id = db.exec(select(Job).where(Job.sweep_id == sid)).one().id
    assert client.get(f"/api/sweeps/{sid}").json()["status"] == "queued"  # no wait: answers at once

    def finish():
        with session(app.state.engine) as db:
            apply_event(db, {"type": "result", "job_id": job_id, "state": "done", "metrics": {"ok": 1},
                             "error": None, "env": None, "artifacts": [], "duration_s": 0.01, "attempt": 1})
        app.state.changes.bump()

    timer = threading.Timer(0.3, finish)
    timer.start()
    try:
        s = client.get(f"/api/sweeps/{sid}", params={"wait_s": 30}).json()
    finally:
        timer.join()
    assert s["status"] == "done" and s["counts"]["done"] == 1


def test_wait_is_bounded_and_named(client):
    sid = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": 1}}).json()["id"]
    r = client.get(f"/api/sweeps/{sid}", params={"wait_s": 3600})
    assert r.status_code == 422 and "wait_s" in r.text
    # a short wait on a sweep nobody runs comes back, still queued
    assert client.get(f"/api/sweeps/{sid}", params={"wait_s": 0.3}).json()["status"] == "queued"


def test_baseline_is_the_newest_earlier_finished_sweep_of_the_grid_on_main(client):
    def sweep(params, branch):
        body = {"suite": "noop", "params": params, "tags": {"branch": branch}}
        sid = client.post("/api/sweeps", json=body).json()["id"]
        client.post(f"/api/sweeps/{sid}/cancel")  # finished (all cells final) without a worker
        return sid

    old, dev, other, newest = sweep({"x": 1}, "main"), sweep({"x": 1}, "dev"), sweep({"x": 2}, "main"), \
        sweep({"x": 1}, "main")
    later = sweep({"x": 1}, "feature")
    # cancelled sweeps are not "done": a baseline must have finished its cells normally
    assert client.get(f"/api/sweeps/{later}/baseline").status_code == 404
    with session(client.app_ref.state.engine) as db:
        for j in db.exec(select(Job)).all():
            j.state = "done"
            db.add(j)
        for s in db.exec(select(Sweep)).all():
            s.cancelled_at = None
            db.add(s)
        db.commit()
    assert client.get(f"/api/sweeps/{later}/baseline").json()["id"] == newest
    assert client.get(f"/api/sweeps/{newest}/baseline").json()["id"] == old  # only earlier sweeps
    assert client.get(f"/api/sweeps/{later}/baseline", params={"branch": "dev"}).json()["id"] == dev
    assert client.get(f"/api/sweeps/{other}/baseline", params={"ignore": "x"}).json()["id"] == old
    r = client.get(f"/api/sweeps/{old}/baseline")
    assert r.status_code == 404 and "no finished noop sweep" in r.json()["detail"]


def test_presets_validate_and_create_their_sweeps_in_order(client):
    listed = {p["name"]: p for p in client.get("/api/presets").json()}
    assert {"ddp-course", "ddp-course-cpu"} <= set(listed)
    r = client.post("/api/presets/ddp-course-cpu")
    assert r.status_code == 201, r.text
    fit_id, ddp_id = r.json()["sweeps"]
    assert r.json()["open"] == f"/sweeps/{ddp_id}"
    assert client.get(f"/api/sweeps/{fit_id}").json()["suite"] == "allreduce"
    cells = [j["params"] for j in client.get(f"/api/sweeps/{ddp_id}/results").json()]
    assert [(c["wrapper"], c["bucket_size_mb"]) for c in cells] == [
        ("naive", 25.0), ("flat", 25.0), ("overlap", 25.0), ("torch_ddp", 25.0),
        ("bucketed", 1.0), ("bucketed", 10.0), ("bucketed", 100.0), ("bucketed", 1000.0)]
    assert client.post("/api/presets/nope").status_code == 404


def test_the_gpu_preset_expands_to_the_course_study():
    from backend.grid import expand_grid
    from backend.presets import PRESETS

    fit, study = PRESETS["ddp-course"][1]
    assert len(expand_grid(fit.suite, fit.params, 1000)) == 11
    cells = expand_grid(study.suite, study.params, 1000)
    assert {c["size"] for c in cells} == {"xl"} and {c["device"] for c in cells} == {"cuda"}
    assert sorted(c["bucket_size_mb"] for c in cells if c["wrapper"] == "bucketed") == [1, 10, 100, 1000]


def test_a_list_of_grids_is_one_sweep_with_each_cell_once(client):
    r = client.post("/api/sweeps", json={"suite": "noop", "params": [{"x": [1, 2]}, {"x": [2, 3]}]})
    assert r.status_code == 201 and r.json()["jobs"] == 3
    bad = client.post("/api/sweeps", json={"suite": "noop", "params": [{"x": 1}, {"nope": 1}]})
    assert bad.status_code == 422
    assert [e["loc"] for e in bad.json()["detail"]] == [["body", "params", 1, "nope"]]


def test_sweeps_of_two_suites_do_not_compare(client):
    from backend.service import import_results

    with session(client.app_ref.state.engine) as db:
        for suite in ("noop", "attention"):  # cells whose params coincide, measuring different things
            import_results(db, [{"kind": "sweep", "suite": suite, "params": {}},
                                {"kind": "cell", "cell": 0, "params": {"x": 1}, "state": "done",
                                 "metrics": {"samples_ms": [1.0, 2.0]}}])
    r = client.get("/api/compare", params={"a": 1, "b": 2})
    assert r.status_code == 422 and "ran the noop suite and sweep 2 the attention suite" in r.text
    page = client.get("/compare", params={"a": 1, "b": 2}, headers={"accept": "text/html"})
    assert page.status_code == 422 and "only sweeps of one suite compare" in page.text
    assert client.get("/api/compare", params={"a": 1, "b": 1}).status_code == 200



@pytest.mark.parametrize("suite, field", [("attention", "repeats"), ("attention", "warmup"), ("model", "steps"),
                                          ("ddp", "steps"), ("allreduce", "repeats"), ("leaderboard", "warmup")])
def test_a_run_of_more_samples_than_any_interval_needs_is_refused_by_name(client, suite, field):
    # 10,000 is the most: a billion timed calls would run until the job's timeout and keep a result row
    # of gigabytes that every comparison resamples
    r = client.post("/api/sweeps", json={"suite": suite, "params": {field: 10_001}})
    detail = r.json()["detail"][0] if r.status_code == 422 else {}
    assert detail.get("loc") == ["body", "params", field] and "less than or equal to 10000" in detail["msg"], r.text
    assert stored_sweeps(client) == 0



@pytest.mark.parametrize("suite", ["ddp", "allreduce", "leaderboard"])
def test_more_ranks_than_any_host_holds_are_refused_by_name(client, suite):
    # every rank is a process on the worker's host: 100,000 of them would take the host down
    r = client.post("/api/sweeps", json={"suite": suite, "params": {"world_size": 100_000, "device": "cpu"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "params", "world_size"], r.text
    assert stored_sweeps(client) == 0
