"""docker-compose.yml must validate (Debian's docker-compose; no Docker engine is needed for `config`)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REQUIRE_BROWSER

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_validates():
    exe = shutil.which("docker-compose")
    if exe is None:
        if REQUIRE_BROWSER:  # CI installs docker-compose beside chromium
            pytest.fail("docker-compose is required in CI but not installed")
        pytest.skip("docker-compose not installed")
    p = subprocess.run([exe, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_compose_has_redis_api_and_a_gpu_worker():
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    assert {"redis", "api", "gpu-worker"} <= set(services)
    worker = services["gpu-worker"]
    assert worker["environment"]["BENCHLAB_BROKER_URL"].startswith("redis://")
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert any(v.split(":")[0] == "benchlab-data" for v in services["api"]["volumes"])
    assert any(v.split(":")[0] == "benchlab-data" for v in worker["volumes"])


def test_compose_keeps_the_api_on_localhost_by_default_and_redis_on_disk():
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api, redis = spec["services"]["api"], spec["services"]["redis"]
    published = api["ports"][0]
    assert published.startswith("${BENCHLAB_PUBLISH_ADDR:-127.0.0.1}:"), published
    assert "--appendonly" in redis["command"] and redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in redis["volumes"])
    worker = spec["services"]["gpu-worker"]
    assert api["restart"] == redis["restart"] == worker["restart"] == "unless-stopped"
    assert "benchlab-heartbeat" in " ".join(worker["healthcheck"]["test"]) and api["healthcheck"]["test"]
    assert api["build"]["args"]["BENCHLAB_COMMIT"] and worker["build"]["args"]["BENCHLAB_COMMIT"]
