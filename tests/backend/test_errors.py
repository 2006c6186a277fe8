"""Error answers: JSON for the API and for clients that do not ask for HTML, an HTML page for a
browser's navigation to a page address, each naming what was wrong."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.errors import error_messages
from backend.main import create_app
from backend.settings import BackendSettings

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(BackendSettings(data_dir=tmp_path), with_recorder=False)) as c:
        yield c


@pytest.mark.parametrize(("path", "status", "line"), [
    ("/sweeps/999", 404, "sweep 999 not found"),
    ("/sweeps/abc", 422, "path parameter &#39;sweep_id&#39;: Input should be a valid integer"),
    ("/compare?a=x&b=1", 422, "query parameter &#39;a&#39;: Input should be a valid integer"),
    ("/history", 422, "query parameter &#39;suite&#39;: Field required"),
    ("/history?suite=noop&limit=1", 422, "greater than or equal to 2 (got &#39;1&#39;)"),
    ("/planner?devices=0", 422, "query parameter &#39;devices&#39;: Input should be greater than 0"),
    ("/no-such-page", 404, "nothing is at /no-such-page"),
])
def test_a_browser_gets_a_page_that_names_the_error(client, path, status, line):
    r = client.get(path, headers=BROWSER)
    assert r.status_code == status
    assert r.headers["content-type"].startswith("text/html")
    assert line in r.text and 'href="/"' in r.text  # what was wrong, and a way back
    nonce = r.headers["content-security-policy"].split("'nonce-")[1].split("'")[0]
    assert f'nonce="{nonce}"' in r.text  # the page's own scripts still run under the CSP


@pytest.mark.parametrize("path", ["/sweeps/999", "/sweeps/abc", "/history", "/no-such-page"])
def test_clients_that_do_not_ask_for_html_keep_the_json_error(client, path):
    r = client.get(path)  # httpx sends Accept: */*, as page scripts' fetch() does
    assert r.status_code in (404, 422) and r.headers["content-type"] == "application/json"
    assert "detail" in r.json()


@pytest.mark.parametrize("path", ["/api/sweeps/999", "/api/sweeps/abc", "/api/history"])
def test_the_api_answers_json_even_to_a_browser(client, path):
    r = client.get(path, headers=BROWSER)
    assert r.headers["content-type"] == "application/json" and "detail" in r.json()


def test_input_echoed_on_the_error_page_is_escaped(client):
    r = client.get("/history", params={"suite": "noop", "limit": "<script>alert(1)</script>"}, headers=BROWSER)
    assert r.status_code == 422
    assert "<script>alert(1)" not in r.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("delete", "/api/sweeps", "GET, POST"), ("put", "/api/sweeps/1", "GET"),
    ("get", "/api/sweeps/1/cancel", "POST"), ("delete", "/api/jobs/1/artifacts/a.json", "GET, PUT"),
])
def test_a_wrong_method_is_answered_with_the_methods_the_path_takes(client, method, path, allow):
    r = getattr(client, method)(path)
    assert r.status_code == 405 and r.headers["allow"] == allow, r.headers


def test_a_wrong_method_on_a_page_keeps_its_allow_header(client):
    r = client.delete("/planner", headers=BROWSER)
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    assert r.headers["content-type"].startswith("text/html")


def test_a_sign_in_redirect_is_not_made_an_error_page(tmp_path):
    app = create_app(BackendSettings(data_dir=tmp_path, api_token="s3cret", protect_reads=True), with_recorder=False)
    with TestClient(app, base_url="http://bench.local") as c:
        r = c.get("/sweeps/999", headers=BROWSER, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fsweeps%2F999"
        assert 'id="page-error"' not in r.text


def test_error_messages_reads_validation_entries_and_plain_details():
    assert error_messages("sweep 3 not found") == ["sweep 3 not found"]
    lines = error_messages([
        {"loc": ["query", "limit"], "msg": "Input should be greater than or equal to 2", "input": "1"},
        {"loc": ["body", "params", "impl"], "msg": "Input should be 'naive'", "input": "nope"},
        {"loc": ["query", "suite"], "msg": "Field required", "input": None},
    ])
    assert lines == ["query parameter 'limit': Input should be greater than or equal to 2 (got '1')",
                     "body parameter 'params.impl': Input should be 'naive' (got 'nope')",
                     "query parameter 'suite': Field required"]


def test_the_compare_page_warns_of_another_environment_but_only_notes_another_commit(tmp_path):
    """Two commits compared is the page's purpose: a commit, host or Python apart is noted, not warned of;
    a GPU or library apart is warned of, with what it does to the verdicts."""
    from backend.db import make_engine, migrate, session
    from backend.service import import_results

    settings = BackendSettings(data_dir=tmp_path)
    engine = make_engine(settings)
    migrate(engine)

    def run(commit, gpu="G"):
        env = {"gpu_name": gpu, "torch": "x", "python": "3", "git_commit": commit}
        return [{"kind": "sweep", "suite": "noop", "params": {}},
                {"kind": "cell", "cell": 0, "params": {"x": 1}, "state": "done", "env": env,
                 "metrics": {"median_ms": 1.0, "samples_ms": [1.0, 1.01, 0.99, 1.0, 1.02]}}]
    with session(engine) as db:
        a, b, c = (import_results(db, run(commit, gpu)).id for commit, gpu in (("aaa", "G"), ("bbb", "G"),
                                                                                 ("bbb", "H")))
    with TestClient(create_app(settings, with_recorder=False)) as client:
        page = client.get(f"/compare?a={a}&b={b}", headers=BROWSER).text
        assert 'id="env-diff"' not in page and "git_commit: A aaa, B bbb" in page
        page = client.get(f"/compare?a={a}&b={c}", headers=BROWSER).text
        assert 'id="env-diff"' in page and "<b>gpu_name</b> G vs H" in page and "inconclusive" in page
        assert "git_commit" not in page.split('id="env-diff"')[1].split("</div>")[0]
