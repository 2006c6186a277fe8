"""schemathesis against /openapi.json: generated requests (seeded, bounded) never get a 5xx, and
every answer's status code and body conform to what the schema declares."""
from __future__ import annotations

import atexit
import shutil
import tempfile

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from backend.main import create_app
from backend.settings import BackendSettings

_DATA = tempfile.mkdtemp(prefix="benchlab-schemathesis-")
atexit.register(shutil.rmtree, _DATA, True)
APP = create_app(BackendSettings(data_dir=_DATA, max_grid_cells=20), with_recorder=False)
with TestClient(APP) as _c:  # one finished sweep, so {id} routes find something and ?wait_s answers at once
    _c.post("/api/sweeps", json={"suite": "noop", "params": {"x": [1, 2]}})
    _c.post("/api/sweeps/1/cancel")

schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=40, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_api_conforms_to_its_schema(case):
    # excluded: "a schema-valid request is accepted". A sweep's params are validated against the
    # suite's own model, which the body schema cannot express (their JSON Schemas are at
    # /api/suites), so a schema-valid body may still get a 422 that names the field.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
