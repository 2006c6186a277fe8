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
    page.wait_for_function("document.getElementById('status').dataset.status === 'done'", timeout=120000)
    rows = page.locator("#table-wrap tr[data-state=done]")
    assert rows.count() == 6
    page.wait_for_selector("#charts .js-plotly-plot .main-svg", timeout=20000)
    assert page.locator("#charts .js-plotly-plot").count() >= 2
    # the latency chart has one line per implementation
    names = page.evaluate("document.getElementById('chart-0').data.map(t => t.name)")
    assert {"impl=naive", "impl=sdpa", "impl=flash_pytorch"} <= set(names)
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
    assert len(stack.client.get("/api/sweeps").json()) == before
    page.close()


def test_compare_page_shows_ratios(browser, stack):
    body = {"suite": "noop", "params": {"x": [1, 2]}}
    a, b = stack.submit(body)["id"], stack.submit(body)["id"]
    stack.wait(a)
    stack.wait(b)
    page = browser.new_page()
    page.goto(f"{stack.url}/compare?a={a}&b={b}")
    assert page.locator("#compare-table tbody tr").count() == 2
    page.close()
