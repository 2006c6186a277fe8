"""Every sweep spec the repository ships expands into cells its suite accepts: a typo in a GPU study's
spec fails here, on a CPU, not on the hardware the study was written for."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from backend.grid import expand_grid
from worker.suites import get_suite

SPECS = sorted((Path(__file__).resolve().parent.parent / "benchmarks" / "specs").glob("*.yaml"))


def test_there_are_specs():
    assert len(SPECS) >= 3


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_a_spec_expands_into_valid_cells(path):
    body = yaml.safe_load(path.read_text())
    cells = expand_grid(body["suite"], body["params"], max_cells=10_000)
    assert cells
    params_model = get_suite(body["suite"]).Params
    for cell in cells:
        params_model.model_validate(cell)
