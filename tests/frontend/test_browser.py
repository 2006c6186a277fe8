"""The pages in a real headless Chromium (Debian's package, driven by Playwright)."""
from __future__ import annotations

import shutil

import pytest

from tests.conftest import REQUIRE_BROWSER
from tests.stack import Stack

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    if not shutil.which("chromium"):
        if REQUIRE_BROWSER:
            pytest.fail("Debian's chromium is required in CI but not installed")
        pytest.skip("chromium not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("browser")).start()
    yield s
    s.stop()


def test_submit_form_watch_cells_fill_and_read_chart(browser, stack):
    page = browser.new_page()
    page.goto(stack.url + "/")
    page.select_option("#suite", "attention")
    page.fill("#sweep-name", "from the browser")
    # impl: tick sdpa and flash_pytorch beside naive (boxes come from the JSON Schema enum)
    for impl in ("naive", "sdpa", "flash_pytorch"):
        page.check(f"input[name=impl][value={impl}]")
    page.uncheck("input[name=impl][value=flash_triton]")
    page.fill("#f-seq_len", "16, 32")
    page.fill("#f-batch", "1")
    page.fill("#f-heads", "1")
    page.fill("#f-d_head", "16")
    page.check("input[name=dtype][value=fp32]")
    page.uncheck("input[name=dtype][value=bf16]")
    page.fill("#f-repeats", "2")
    page.fill("#f-warmup", "0")
    page.click("#submit")
    page.wait_for_url("**/sweeps/*", timeout=15000)
    page.wait_for_selector("#status[data-status=done]", timeout=120000)  # no eval: the page's CSP forbids it
    rows = page.locator("#table-wrap tr[data-state=done]")
    assert rows.count() == 6
    page.wait_for_selector("#charts .js-plotly-plot .main-svg", timeout=20000)
    assert page.locator("#charts .js-plotly-plot").count() >= 2
    # the latency chart has one line per implementation
    names = page.evaluate("document.getElementById('chart-0').data.map(t => t.name)")
    assert {"impl=naive", "impl=sdpa", "impl=flash_pytorch"} <= set(names)
    # every cell finished: nothing to retry or cancel, so both actions are greyed out
    assert page.is_disabled("#retry") and page.is_disabled("#cancel")
    sweep_id = int(page.url.rstrip("/").split("/")[-1])
    page.goto(stack.url + "/")
    assert page.locator(f"a[href='/sweeps/{sweep_id}']").first.is_visible()
    page.close()


def test_bad_form_input_shows_the_field_and_submits_nothing(browser, stack):
    before = len(stack.client.get("/api/sweeps").json())
    page = browser.new_page()
    page.goto(stack.url + "/")
    page.select_option("#suite", "attention")
    page.fill("#f-seq_len", "-5")
    page.click("#submit")
    page.wait_for_selector("#form-error:not(:empty)")
    assert "seq_len" in page.inner_text("#form-error")
    # text that Number() would read as 16 or Infinity (sent as null) goes as typed, and is named
    for typed, shown in (("0x10", "'0x10'"), ("128,Infinity", "'Infinity'"), ("1e999", "'1e999'")):
        page.evaluate("document.getElementById('form-error').textContent = ''")
        page.fill("#f-seq_len", typed)
        page.click("#submit")
        page.wait_for_selector("#form-error:not(:empty)")
        assert "seq_len" in page.inner_text("#form-error") and shown in page.inner_text("#form-error"), typed
    page.fill("#f-seq_len", "128")
    page.fill("#repeats", "two")  # was sent as null, which the server read as 1
    page.evaluate("document.getElementById('form-error').textContent = ''")
    page.click("#submit")
    page.wait_for_selector("#form-error:not(:empty)")
    assert "repeats" in page.inner_text("#form-error")
    assert len(stack.client.get("/api/sweeps").json()) == before
    page.close()


def test_compare_page_shows_ratios(browser, stack):
    body = {"suite": "attention", "params": {"impl": "naive", "seq_len": [16, 32], "batch": 1, "heads": 1,
                                             "d_head": 16, "dtype": "fp32", "repeats": 2, "warmup": 0}}
    a, b = stack.submit(body)["id"], stack.submit(body)["id"]
    stack.wait(a)
    stack.wait(b)
    rows_a = {r["params"]["seq_len"]: r["metrics"]["median_ms"] for r in stack.results(a)}
    rows_b = {r["params"]["seq_len"]: r["metrics"]["median_ms"] for r in stack.results(b)}
    page = browser.new_page()
    page.goto(f"{stack.url}/compare?a={a}&b={b}")
    assert page.locator("#compare-table tbody tr").count() == 2
    ratios = [float(t) for t in page.locator("#compare-table td.ratio").all_inner_texts()]
    expected = [rows_b[s] / rows_a[s] for s in sorted(rows_a)]
    assert ratios == [float(f"{x:.3f}") for x in expected]  # B / A of the medians, cell by cell
    verdicts = page.locator("#compare-table tr[data-verdict] .verdict").all_inner_texts()
    assert len(verdicts) == 2 and set(verdicts) <= {"slower", "faster", "same", "inconclusive"}
    page.wait_for_selector("#chart .main-svg")
    # a typo in the ignore field is named above the form, and the cells are still compared
    answer = page.goto(f"{stack.url}/compare?a={a}&b={b}&ignore=seq_lne")
    assert answer.status == 422
    assert "'seq_lne'" in page.locator("#compare-error").inner_text()
    assert page.locator("#compare-table tbody tr").count() == 2
    page.close()


def test_the_cpu_ddp_study_in_one_click_draws_the_bucket_chart_with_references_and_the_model(browser, stack):
    """The course study's CPU preset (gloo, 2 ranks): the all-reduce fit, then the ddp sweep's chart."""
    page = browser.new_page()
    page.goto(stack.url + "/")
    page.click("button.preset[data-preset=ddp-course-cpu]")
    page.wait_for_url("**/sweeps/*", timeout=15000)
    sid = int(page.url.rstrip("/").split("/")[-1])
    assert stack.wait(sid, timeout=600)["status"] == "done"
    fit_id = sid - 1
    assert stack.client.get(f"/api/sweeps/{fit_id}").json()["suite"] == "allreduce"
    page.reload()
    page.wait_for_selector("#status[data-status=done]", timeout=30000)
    page.wait_for_selector("#chart-1 .main-svg", timeout=30000)
    step = page.evaluate("document.getElementById('chart-0').data.map(t => [t.name, t.line.dash || 'solid'])")
    names = {n.split(" host-bound")[0]: dash for n, dash in step}
    assert names["bucketed"] == "solid"  # the line over bucket sizes
    assert all(names[w] == "dash" for w in ("naive", "flat", "overlap", "torch_ddp"))  # references
    exposed = page.evaluate("document.getElementById('chart-1').data.map(t => t.name)")
    assert any(n.startswith("model: s/(n_b w)") for n in exposed)
    title = page.evaluate("document.getElementById('chart-1').layout.title.text")
    assert f"all-reduce sweep #{fit_id}" in title
    assert page.locator("#charts .js-plotly-plot").count() >= 4  # step, exposed, collectives, memory
    page.close()


def test_leaderboard_sweep_page_draws_the_step_split_and_memory_per_gpu(browser, stack):
    """Two toy recipes on 2 gloo ranks; the page splits each step and draws memory per rank."""
    sweep = stack.submit({"suite": "leaderboard", "params": {
        "sharding": ["zero1", "fsdp"], "world_size": 2, "scale": 1 / 34, "d_model": 64, "d_ff": 128,
        "num_heads": 4, "vocab_size": 256, "device": "cpu", "attention": "sdpa", "steps": 2, "warmup": 1}})
    assert stack.wait(sweep["id"], timeout=300)["status"] == "done"
    page = browser.new_page()
    page.goto(f"{stack.url}/sweeps/{sweep['id']}")
    page.wait_for_selector("#chart-1 .main-svg", timeout=30000)
    bars = page.evaluate("document.getElementById('chart-0').data.filter(t => t.type === 'bar').map(t => t.name)")
    assert bars == ["forward", "backward", "optimizer"]
    ranks = page.evaluate("document.getElementById('chart-1').data[0].x")
    assert ranks == ["sharding=zero1 | rank 0", "sharding=zero1 | rank 1", "sharding=fsdp | rank 0",
                     "sharding=fsdp | rank 1"]
    page.close()


def test_history_page_marks_the_sweep_that_got_slower(browser, stack):
    ids = []
    for commit, work in (("c1", 20), ("c2", 20), ("c3", 30)):
        ids.append(stack.submit({"suite": "noop", "tags": {"commit": commit, "branch": "hist"},
                                 "params": {"work_ms": work, "repeats": 15, "x": 7}})["id"])
        stack.wait(ids[-1])
    page = browser.new_page()
    page.goto(f"{stack.url}/sweeps/{ids[-1]}")
    page.wait_for_selector("#table-wrap tr[data-state=done] a.history")
    page.click("#table-wrap tr[data-state=done] a.history")
    page.wait_for_url("**/history?*")
    page.goto(page.url + "&branch=hist&ignore=work_ms")  # a slowdown made by asking for longer work
    page.wait_for_selector("#chart .main-svg", timeout=20000)
    marks = page.locator("#history-table tr").evaluate_all("rs => rs.map(r => r.dataset.regression)")
    assert marks[1:] == ["false", "false", "true"]  # header, then c1, c2, c3: the slowdown entered at c3
    names = page.evaluate("document.getElementById('chart').data.map(t => t.name)")
    assert any(n and n.endswith("slower") for n in names)
    page.close()


def test_a_sweep_with_repeats_lists_each_run_and_draws_one_point_per_cell(browser, stack):
    sid = stack.submit({"suite": "noop", "repeats": 3, "params": {"work_ms": 2, "repeats": 5, "x": [1, 2]}})["id"]
    stack.wait(sid)
    page = browser.new_page()
    page.goto(f"{stack.url}/sweeps/{sid}")
    page.wait_for_selector("#table-wrap tr[data-state=done] td.run")
    runs = page.locator("#table-wrap td.run").all_inner_texts()
    assert sorted(runs) == ["1", "1", "2", "2", "3", "3"]
    page.wait_for_selector("#chart-0 .main-svg, .chart .main-svg", timeout=20000)
    xs = page.evaluate("[...document.querySelectorAll('.chart')].filter(d => d.data)"
                       ".flatMap(d => d.data.filter(t => t.mode === 'lines+markers').map(t => t.x.length))")
    assert xs and all(n == 2 for n in xs)  # two cells, each one point however many runs
    page.close()


def test_a_mistyped_page_address_shows_an_error_page_with_a_way_back(browser, stack):
    page = browser.new_page()
    answer = page.goto(stack.url + "/sweeps/987654")
    assert answer.status == 404
    assert page.locator("#page-error").inner_text() == "sweep 987654 not found"
    answer = page.goto(stack.url + "/history?suite=noop&limit=1")
    assert answer.status == 422 and "query parameter 'limit'" in page.locator("#page-error").inner_text()
    page.click("main a[href='/']")
    page.wait_for_selector("#suite")  # the sweeps page, with its form
    page.close()


def test_planner_page_draws_its_chart_and_every_strategy(browser, stack):
    page = browser.new_page()
    page.goto(stack.url + "/")
    page.click("a[href='/planner']")
    page.wait_for_selector("#chart .main-svg", timeout=20000)
    strategies = page.locator("#plan-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.strategy)")
    assert strategies[:3] == ["dp", "fsdp", "tp"] and set(strategies[3:]) == {"fsdp_tp"}
    page.fill("#p-devices", "16")
    page.click("#plan-form button")
    page.wait_for_selector("#chart .main-svg", timeout=20000)
    assert "16 devices" in page.evaluate("document.getElementById('chart').layout.title.text")
    page.close()


EVIL = "</script><script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"


def test_hostile_names_tags_and_imported_params_run_no_script_on_any_page(browser, stack, tmp_path):
    import json
    import subprocess
    import sys

    from tests.stack import ROOT

    sid = stack.submit({"suite": "noop", "name": EVIL, "tags": {"note": EVIL}, "params": {"x": [1, 2]}})["id"]
    stack.wait(sid)
    run = tmp_path / "evil.jsonl"  # an imported run file whose params and metrics carry markup
    run.write_text("\n".join(json.dumps(x) for x in [
        {"kind": "sweep", "suite": "noop", "params": {"x": 1}, "name": EVIL, "tags": {"t": EVIL}},
        {"kind": "cell", "cell": 0, "params": {"x": 1, "sleep_ms": 0, "mode": "ok"}, "state": "done",
         "metrics": {"value": 2.0, "note": EVIL}, "error": EVIL}]) + "\n")
    imported = subprocess.run([sys.executable, "-m", "backend.cli", "import", str(run)], cwd=ROOT, env=stack.env,
                              capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    iid = json.loads(imported.stdout)["id"]
    page = browser.new_page()
    violations = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    for path in ("/", f"/sweeps/{sid}", f"/sweeps/{iid}", f"/compare?a={sid}&b={iid}"):
        page.goto(stack.url + path)
        page.wait_for_load_state("networkidle")
        assert page.evaluate("window.__pwned === undefined"), path
    page.goto(f"{stack.url}/sweeps/{sid}")
    page.wait_for_selector("#table-wrap tr[data-state=done]")
    assert EVIL in page.inner_text("body")  # shown as text, not run
    # the only CSP reports are the blocked injection attempts, never the page's own scripts or charts
    assert all("onerror" in v or "inline" in v.lower() for v in violations), violations
    page.close()


def test_charts_draw_under_the_content_security_policy(browser, stack):
    sid = stack.submit({"suite": "attention", "params": {
        "impl": "naive", "seq_len": [16, 32], "batch": 1, "heads": 1, "d_head": 16, "dtype": "fp32",
        "repeats": 2, "warmup": 0}})["id"]
    stack.wait(sid)
    page = browser.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{stack.url}/sweeps/{sid}")
    page.wait_for_selector("#table-wrap tr[data-state=done]")
    page.goto(f"{stack.url}/compare?a={sid}&b={sid}")
    page.wait_for_selector("#chart .main-svg", timeout=20000)
    assert not [e for e in errors if "Content Security Policy" in e], errors
    page.close()


def test_sign_in_with_protected_reads(browser, tmp_path):
    s = Stack(tmp_path, extra_env={"BENCHLAB_API_TOKEN": "s3cret", "BENCHLAB_PROTECT_READS": "true"})
    s.start_api()
    try:
        page = browser.new_page()
        page.goto(s.url + "/")
        assert "/login" in page.url  # sent to sign in, nothing of the data shown
        page.fill("#token", "wrong")
        page.click("#login")
        assert page.locator("#login-error").inner_text() == "wrong token"
        page.fill("#token", "s3cret")
        page.click("#login")
        page.wait_for_url(s.url + "/")
        assert page.evaluate("document.cookie").count("benchlab_session") == 0  # HttpOnly: not readable
        assert page.evaluate("localStorage.length") == 0
        # the form submits with the session cookie and the CSRF echo
        page.select_option("#suite", "noop")
        page.click("#submit")
        page.wait_for_url("**/sweeps/*", timeout=15000)
        assert len(s.client.get("/api/sweeps", headers={"Authorization": "Bearer s3cret"}).json()) == 1
        page.close()
    finally:
        s.stop()


def test_retry_is_offered_only_where_a_cell_failed(browser, stack):
    sid = stack.client.post("/api/sweeps", json={"suite": "noop", "params": {"mode": ["raise", "ok"]}}).json()["id"]
    page = browser.new_page()
    page.goto(f"{stack.url}/sweeps/{sid}")
    page.wait_for_selector("#status[data-status=done]", timeout=60000)
    assert page.is_enabled("#retry") and page.is_disabled("#cancel")
    page.click("#retry")
    page.wait_for_selector("#action-msg:not(:empty)")
    assert '"requeued":1' in page.inner_text("#action-msg").replace(" ", "")
    page.close()
