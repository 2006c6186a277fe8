"""A cell's history over sweeps: intervals, the regression marked where it entered, the API and page."""
from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient

from backend.history import history
from backend.main import create_app
from backend.settings import BackendSettings


def rows(median, seed, impl="a", n=20):
    rng = random.Random(seed)
    return [{"params": {"impl": impl, "x": 1}, "state": "done", "env_id": None,
             "metrics": {"median_ms": median, "samples_ms": [median * rng.uniform(0.99, 1.01) for _ in range(n)]}}]


def sweep(i, commit):
    return {"id": i, "created_at": 1000.0 + i, "tags": {"commit": commit, "branch": "main"}}


def test_the_regression_is_marked_at_the_sweep_that_brought_it():
    runs = [(sweep(1, "c1"), rows(10, 1)), (sweep(2, "c2"), rows(10, 2)), (sweep(3, "c3"), rows(12, 3)),
            (sweep(4, "c4"), rows(12, 4))]
    [series] = history(runs, {"impl": "a"})
    pts = series["points"]
    assert [p["commit"] for p in pts] == ["c1", "c2", "c3", "c4"]
    assert [p["regression"] for p in pts] == [False, False, True, False]
    assert [p["verdict"] for p in pts] == [None, "same", "slower", "same"]
    assert all(p["ci_low"] <= p["median_ms"] <= p["ci_high"] for p in pts)
    assert pts[2]["ratio"] == pytest.approx(1.2, rel=0.02)


def test_cells_are_matched_on_the_given_params_one_series_each():
    runs = [(sweep(1, "c1"), rows(10, 1, "a") + rows(5, 1, "b")), (sweep(2, "c2"), rows(10, 2, "a"))]
    assert [len(s["points"]) for s in history(runs, {})] == [2, 1]
    assert [s["params"]["impl"] for s in history(runs, {"impl": "b"})] == ["b"]
    assert history(runs, {"impl": "zzz"}) == []


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(BackendSettings(data_dir=tmp_path), with_recorder=False)) as c:
        yield c


def test_history_api_and_page_refuse_bad_input_by_name(client):
    assert client.get("/api/history", params={"suite": "nope"}).status_code == 422
    r = client.get("/api/history", params={"suite": "noop", "params": "[1]"})
    assert r.status_code == 422 and "JSON object" in r.json()["detail"][0]["msg"]
    assert client.get("/api/history", params={"suite": "noop", "params": "{bad"}).status_code == 422
    empty = client.get("/api/history", params={"suite": "noop"}).json()
    assert empty == {"suite": "noop", "params": {}, "threshold": 0.05, "sweeps": 0, "ignore": [], "series": []}
    page = client.get("/history", params={"suite": "noop", "params": '{"x": 1}'})
    assert page.status_code == 200 and "History of noop cells" in page.text


@pytest.mark.parametrize("params, words", [('{"x": NaN}', "NaN is not JSON"), ('{"x": -Infinity}', "-Infinity"),
                                           ('{"x": 1e999}', "1e999 is not a finite number"),
                                           ('{"\\ud800": 1}', "lone UTF-16 surrogate")])
def test_a_params_filter_no_cell_can_hold_is_refused_by_name_not_echoed_as_null(client, params, words):
    for path in ("/api/history", "/history"):
        r = client.get(path, params={"suite": "noop", "params": params}, headers={"accept": "application/json"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "params"], (path, r.text)
        assert words in r.json()["detail"][0]["msg"]


def test_an_untagged_sweeps_commit_is_the_one_its_cells_ran_at(tmp_path):
    from backend.db import make_engine, migrate, session
    from backend.service import import_results

    settings = BackendSettings(data_dir=tmp_path)
    engine = make_engine(settings)
    migrate(engine)

    def run(tags, *commits):
        cells = [{"kind": "cell", "cell": i, "params": {"x": 1, "y": i}, "state": "done",
                  "env": {"gpu_name": "G", "torch": "x", "python": "3", "git_commit": c},
                  "metrics": {"median_ms": 1.0, "samples_ms": [1.0, 1.01, 0.99]}} for i, c in enumerate(commits)]
        return [{"kind": "sweep", "suite": "noop", "params": {}, "tags": tags}, *cells]
    with session(engine) as db:
        for tags, commits in (({"commit": "tagged"}, ("abc",)), ({}, ("abc",)), ({}, ("abc", "def"))):
            import_results(db, run(tags, *commits))
    with TestClient(create_app(settings, with_recorder=False)) as c:
        body = c.get("/api/history", params={"suite": "noop", "params": '{"y": 0}'}).json()
    [series] = body["series"]
    # the tag wins; untagged, the cells' commit; cells at two commits name none
    assert [p["commit"] for p in series["points"]] == ["tagged", "abc", None]


def test_times_in_the_page_tables_keep_four_digits_and_their_trailing_zeros():
    from backend.pages import four_digits

    assert [four_digits(x) for x in (5.0, 5.128, 12.3, 0.01234, 999.96, 7420.0, 12345.6)] == \
        ["5.000", "5.128", "12.30", "0.01234", "1000", "7420", "12346"]


def test_history_judges_each_point_as_compare_does_a_host_bound_one_only_over_runs():
    import numpy as np

    rng = np.random.default_rng(2)

    def sweep(sid, median, runs, bound):
        rows = [{"params": {"impl": "a"}, "state": "done", "env_id": None,
                 "metrics": {"samples_ms": list(rng.normal(median, 0.05, 20)), "host_bound": bound}}
                for _ in range(runs)]
        return {"id": sid, "created_at": float(sid), "tags": {}}, rows

    [s] = history([sweep(1, 10, 1, True), sweep(2, 13, 1, True)], {"impl": "a"})
    assert s["points"][1]["verdict"] == "inconclusive" and "host-bound" in s["points"][1]["reason"]
    assert s["points"][1]["regression"] is False  # no false alarm from the host's drift
    [s] = history([sweep(1, 10, 3, True), sweep(2, 13, 3, True)], {"impl": "a"})
    assert s["points"][1]["verdict"] == "slower" and s["points"][1]["regression"] is True
