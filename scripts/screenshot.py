"""Take docs/screenshot.png: a real attention sweep on this machine, rendered in headless Chromium."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.stack import Stack  # noqa: E402 (sys.path is set up first)


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as d:
        stack = Stack(Path(d)).start()
        try:
            sweep = stack.submit({"suite": "attention", "name": "attention on CPU: naive vs SDPA vs tiled FA-2",
                                  "params": {"impl": ["naive", "sdpa", "flash_pytorch"],
                                             "seq_len": [64, 128, 256, 512, 1024], "batch": 1, "heads": 4,
                                             "d_head": [32, 64], "dtype": "fp32", "pass": "fwd_bwd",
                                             "warmup": 1, "repeats": 5}})
            stack.wait(sweep["id"], timeout=900)
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path="/usr/bin/chromium",
                                      args=["--headless", "--no-sandbox", "--disable-gpu",
                                            "--disable-background-networking"])
                page = b.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{stack.url}/sweeps/{sweep['id']}")
                page.wait_for_selector("#charts .js-plotly-plot .main-svg")
                page.wait_for_timeout(1500)
                page.screenshot(path="docs/screenshot.png")
                b.close()
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
