"""Hostile and malformed input: every answer is a declared 4xx naming what is wrong, and nothing changes."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from backend.db import session
from backend.main import create_app
from backend.models import Job, Sweep
from backend.service import apply_event
from backend.settings import BackendSettings

BIG = 2**63  # one past the largest 64-bit id


@pytest.fixture
def client(tmp_path, database_url):
    app = create_app(BackendSettings(data_dir=tmp_path, max_grid_cells=50, max_body_kb=4, max_artifact_mb=0.01,
                                     database_url=database_url), with_recorder=False)
    with TestClient(app) as c:
        c.app_ref = app
        yield c


def counts(client) -> tuple[int, int, int]:
    folder = client.app_ref.state.dispatcher.worker_settings.broker_dir / "queue"
    with session(client.app_ref.state.engine) as db:
        return len(db.exec(select(Sweep)).all()), len(db.exec(select(Job)).all()), len(list(folder.glob("*.msg")))


@pytest.mark.parametrize("queue", ["results", "celery", "celeryev", "benchlab.results", "a b", "../x", "", "x" * 101])
def test_reserved_and_malformed_queue_names_are_refused(client, queue):
    before = counts(client)
    r = client.post("/api/sweeps", json={"suite": "noop", "queue": queue})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "queue"], r.text
    assert counts(client) == before


@pytest.mark.parametrize("body, field", [
    ({"suite": "noop", "name": "n" * 201}, "name"),
    ({"suite": "noop", "tags": {f"t{i}": "v" for i in range(51)}}, "tags"),
    ({"suite": "noop", "tags": {"k": "v" * 201}}, "tags"),
    ({"suite": "noop", "tags": {"": "v"}}, "tags"),
    ({"suite": "noop", "timeout_s": 25 * 3600}, "timeout_s"),
    ({"suite": "noop", "timeout_s": -1}, "timeout_s"),
])
def test_limits_name_the_field_and_change_nothing(client, body, field):
    before = counts(client)
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", field], r.text
    assert counts(client) == before


@pytest.mark.parametrize("where", ["tag", "name", "param"])
def test_lone_surrogates_are_refused(client, where):
    bodies = {"tag": '{"suite": "noop", "tags": {"k": "\\ud800"}}',
              "name": '{"suite": "noop", "name": "a\\udfffb"}',
              "param": '{"suite": "attention", "params": {"impl": "\\ud83d"}}'}
    before = counts(client)
    r = client.post("/api/sweeps", content=bodies[where], headers={"content-type": "application/json"})
    assert r.status_code == 422 and ("surrogate" in r.text or "unicode" in r.text), r.text
    assert counts(client) == before
    assert client.get("/api/sweeps").status_code == 200  # reads still work


def test_body_over_the_cap_is_413_whether_declared_or_streamed(client):
    before = counts(client)
    big = json.dumps({"suite": "noop", "name": "x", "params": {"x": list(range(2000))}})
    r = client.post("/api/sweeps", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "BENCHLAB_MAX_BODY_KB" in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000].encode()

    r = client.post("/api/sweeps", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert counts(client) == before


@pytest.mark.parametrize("method, path", [
    ("get", f"/api/sweeps/{BIG}"), ("get", f"/api/sweeps/{BIG}/results"), ("post", f"/api/sweeps/{BIG}/retry"),
    ("post", f"/api/sweeps/{BIG}/cancel"), ("get", f"/api/jobs/{BIG}"), ("get", f"/api/jobs/{BIG}/artifacts/a"),
    ("put", f"/api/jobs/{BIG}/artifacts/a"), ("get", f"/sweeps/{BIG}"), ("get", f"/sweeps/{BIG}/data"),
    ("get", f"/compare?a={BIG}&b=1"), ("get", "/api/sweeps?offset=1e22"), ("get", "/api/sweeps?offset=-1"),
    ("get", "/api/sweeps/0"), ("get", "/api/sweeps?limit=100000"),
])
def test_out_of_range_ids_and_offsets_are_422_not_500(client, method, path):
    r = getattr(client, method)(path)
    assert r.status_code == 422, (path, r.status_code, r.text)


def test_every_route_declares_the_errors_it_gives(client):
    spec = client.get("/openapi.json").json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert {"400", "401", "403", "413"} <= codes, (method, path, codes)
            if "{" in path:
                assert {"404", "422"} <= codes, (method, path, codes)
            for code, resp in op["responses"].items():
                assert "application/json" in resp.get("content", {}) or code in ("201", "200", "204"), \
                    (method, path, code)
    assert "503" in spec["paths"]["/api/sweeps"]["post"]["responses"]
    assert "429" in spec["paths"]["/api/sweeps/{sweep_id}"]["get"]["responses"]
    assert spec["paths"]["/api/sweeps"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]


@pytest.mark.parametrize("path, body, field", [
    ("/api/sweeps", '{"suite": "noop", "params": {}, "timeout_s": NaN}', ["body", "timeout_s"]),
    ("/api/sweeps", '{"suite": "noop", "params": {}, "tags": {"a": Infinity}}', ["body", "tags", "a"]),
    ("/api/sweeps", '{"suite": "noop", "name": -Infinity, "params": {}}', ["body", "name"]),
    ("/api/sweeps", '{"suite": "noop", "params": {}, "repeats": NaN}', ["body", "repeats"]),
    ("/api/sweeps", '{"suite": "noop", "params": {"x": [1, NaN]}}', ["body", "params", "x"]),
    ("/api/tokens", '{"name": NaN, "scope": "write"}', ["body", "name"])])
def test_nan_and_infinity_in_a_body_are_named_in_strict_json_and_change_nothing(client, path, body, field):
    # Python's JSON parser takes NaN and Infinity, which strict JSON cannot carry back in the 422's echo
    before = counts(client)
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "NaN" not in r.text and "Infinity" not in r.text
    assert json.loads(r.text)["detail"][0]["loc"] == field
    assert counts(client) == before


def test_non_finite_metrics_are_stored_as_null_with_a_flag(client):
    sid = client.post("/api/sweeps", json={"suite": "noop", "params": {"x": 1}}).json()["id"]
    job_id = client.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
    with session(client.app_ref.state.engine) as db:
        assert apply_event(db, {"type": "result", "job_id": job_id, "attempt": 1, "state": "done",
                                "metrics": {"x": float("inf"), "y": float("nan"), "ok": 2.0,
                                            "nested": {"z": float("-inf")}}})
    r = client.get(f"/api/sweeps/{sid}/results")
    rows = json.loads(r.text)  # strict JSON: no Infinity or NaN tokens
    assert "Infinity" not in r.text and "NaN" not in r.text
    assert rows[0]["metrics"] == {"x": None, "y": None, "ok": 2.0, "nested": {"z": None}}
    assert rows[0]["nonfinite"] == ["nested.z", "x", "y"]
    assert client.get(f"/api/jobs/{job_id}").json()["nonfinite"] == ["nested.z", "x", "y"]
    assert client.get(f"/sweeps/{sid}/data").status_code == 200


def test_artifact_rules(client, tmp_path):
    sid = client.post("/api/sweeps", json={"suite": "noop"}).json()["id"]
    job = client.get(f"/api/sweeps/{sid}/results").json()[0]["job_id"]
    root = client.app_ref.state.settings.artifact_root / f"job_{job}"
    assert client.put(f"/api/jobs/{job}/artifacts/trace.json", content=b"{}").status_code == 201
    again = client.put(f"/api/jobs/{job}/artifacts/trace.json", content=b"{\"evil\": 1}")
    assert again.status_code == 409 and "already has" in again.json()["detail"]
    got = client.get(f"/api/jobs/{job}/artifacts/trace.json")
    assert got.content == b"{}" and got.headers["content-disposition"].startswith("attachment")
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-type"] == "application/octet-stream"
    too_big = client.put(f"/api/jobs/{job}/artifacts/big.bin", content=b"x" * 20_000)
    assert too_big.status_code == 413 and "BENCHLAB_MAX_ARTIFACT_MB" in too_big.json()["detail"]

    def stream():  # over the cap without a Content-Length
        for _ in range(20):
            yield b"x" * 1000

    assert client.put(f"/api/jobs/{job}/artifacts/big2.bin", content=stream()).status_code == 413
    for bad, status in (("a.txt%0A", 422), (".hidden", 422), ("x.part", 422), ("a%2Fb", 404)):
        assert client.put(f"/api/jobs/{job}/artifacts/{bad}", content=b"1").status_code == status, bad
    assert sorted(p.name for p in root.iterdir()) == ["trace.json"]  # no temporary file left behind


def test_json_in_pages_cannot_break_out_of_script(client):
    evil = "</script><script>window.pwned=1</script><!--"
    sid = client.post("/api/sweeps", json={"suite": "noop", "name": evil, "tags": {"t": evil}}).json()["id"]
    for page in ("/", f"/sweeps/{sid}", f"/compare?a={sid}&b={sid}"):
        html = client.get(page).text
        assert "<script>window.pwned" not in html, page
    data = client.get(f"/sweeps/{sid}/data").json()
    assert data["summary"]["tags"] == {"t": evil}  # stored and served as data, unchanged


def test_pages_send_security_headers(client):
    r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self' 'nonce-" in csp and "unsafe-eval" not in csp
    nonce = csp.split("'nonce-")[1].split("'")[0]
    assert f'nonce="{nonce}"' in r.text
    assert client.get("/").headers["content-security-policy"] != csp  # a fresh nonce per answer
    for path in ("/", "/api/sweeps", "/api/health"):
        h = client.get(path).headers
        assert h["x-content-type-options"] == "nosniff" and h["referrer-policy"] == "same-origin"
        assert h["x-frame-options"] == "DENY"


def test_foreign_origin_writes_are_refused_token_or_not(tmp_path):
    app = create_app(BackendSettings(data_dir=tmp_path, api_token="s3cret"), with_recorder=False)
    auth = {"Authorization": "Bearer s3cret"}
    with TestClient(app, base_url="http://bench.local:8000") as c:
        for origin in ("http://evil.example", "null", "http://bench.local:9999", "https://bench.local.evil.example"):
            r = c.post("/api/sweeps", json={"suite": "noop"}, headers={**auth, "Origin": origin})
            assert r.status_code == 403 and "another site" in r.json()["detail"], origin
        r = c.post("/api/sweeps", json={"suite": "noop"}, headers={**auth, "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        assert c.post("/api/sweeps", json={"suite": "noop"},
                      headers={**auth, "Origin": "http://bench.local:8000"}).status_code == 201
        assert c.post("/api/sweeps", json={"suite": "noop"}, headers=auth).status_code == 201  # CLI: no Origin
        with session(app.state.engine) as db:
            assert len(db.exec(select(Sweep)).all()) == 2


def test_host_header_allow_list(tmp_path):
    app = create_app(BackendSettings(data_dir=tmp_path, allowed_hosts="bench.local,127.0.0.1"), with_recorder=False)
    with TestClient(app, base_url="http://bench.local") as c:
        assert c.get("/api/health").status_code == 200
        assert c.get("/api/health", headers={"Host": "127.0.0.1:8000"}).status_code == 200
        r = c.get("/api/sweeps", headers={"Host": "attacker.example"})
        assert r.status_code == 400 and "BENCHLAB_ALLOWED_HOSTS" in r.json()["detail"]


def test_protected_reads_cover_pages_and_downloads_with_a_cookie_session(tmp_path):
    app = create_app(BackendSettings(data_dir=tmp_path, api_token="s3cret", protect_reads=True),
                     with_recorder=False)
    auth = {"Authorization": "Bearer s3cret"}
    with TestClient(app, base_url="http://bench.local") as c:
        sid = c.post("/api/sweeps", json={"suite": "noop", "name": "secret name"}, headers=auth).json()["id"]
        job = c.get(f"/api/sweeps/{sid}/results", headers=auth).json()[0]["job_id"]
        assert c.put(f"/api/jobs/{job}/artifacts/t.json", content=b"{}", headers=auth).status_code == 201
        for page in ("/", f"/sweeps/{sid}", f"/compare?a={sid}&b={sid}"):
            r = c.get(page, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"].startswith("/login?next="), page
            assert "secret name" not in r.text
        for path in (f"/sweeps/{sid}/data", f"/api/jobs/{job}/artifacts/t.json", f"/api/sweeps/{sid}",
                     "/api/sweeps", f"/api/jobs/{job}", "/api/workers", "/api/dead-letters"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers=auth).status_code == 200, path
        # a browser signs in: HttpOnly session cookie, readable CSRF cookie
        assert c.post("/login", data={"token": "wrong", "next": "/"}).status_code == 401
        r = c.post("/login", data={"token": "s3cret", "next": "//evil.example/"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
        cookies = r.headers.get_list("set-cookie")
        session_cookie = next(h for h in cookies if h.startswith("benchlab_session="))
        assert "HttpOnly" in session_cookie and "SameSite=strict" in session_cookie
        assert "s3cret" not in session_cookie
        csrf_cookie = next(h for h in cookies if h.startswith("benchlab_csrf="))
        assert "HttpOnly" not in csrf_cookie
        assert "secret name" in c.get("/").text
        assert c.get(f"/api/jobs/{job}/artifacts/t.json").status_code == 200
        r = c.post("/api/sweeps", json={"suite": "noop"})
        assert r.status_code == 403 and "CSRF" in r.json()["detail"]
        r = c.post("/api/sweeps", json={"suite": "noop"}, headers={"X-CSRF-Token": c.cookies["benchlab_csrf"]})
        assert r.status_code == 201
        c.post("/logout")
        assert c.get("/", follow_redirects=False).status_code == 303
