"""Test-wide setup: Triton's CPU interpreter when no GPU is present, and the `gpu` marker."""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # must be set before triton.jit decorates the kernels, i.e. before kernels.flash_triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    for item in items:  # the declared markers, applied: `-m redis`, `-m browser` select those tests
        if "redis_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.redis)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
        if "postgres_url" in getattr(item, "fixturenames", ()) or "[postgres" in item.nodeid:
            item.add_marker(pytest.mark.postgres)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


REQUIRE_REDIS = os.environ.get("BENCHLAB_REQUIRE_REDIS") == "1"
REQUIRE_BROWSER = os.environ.get("BENCHLAB_REQUIRE_BROWSER") == "1"


def redis_available(url: str = "redis://127.0.0.1:6379/0") -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001 (any failure means: no Redis)
        return False


@pytest.fixture(scope="module")
def redis_url():
    url = "redis://127.0.0.1:6379/7"
    if not redis_available(url):
        if REQUIRE_REDIS:
            pytest.fail("Redis on 127.0.0.1:6379 is required in CI but not reachable")
        pytest.skip("no Redis on 127.0.0.1:6379")
    return url


POSTGRES_ADMIN_URL = os.environ.get("BENCHLAB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("BENCHLAB_REQUIRE_POSTGRES") == "1"


def postgres_admin_url() -> str:
    """The test machine's PostgreSQL (trust auth); skips, or fails in CI, when it is not there."""
    import shutil
    import subprocess

    ok = shutil.which("psql") is not None and subprocess.run(
        ["psql", POSTGRES_ADMIN_URL, "-q", "-c", "SELECT 1"], capture_output=True, timeout=10).returncode == 0
    if not ok:
        if REQUIRE_POSTGRES:
            pytest.fail(f"PostgreSQL at {POSTGRES_ADMIN_URL} is required in CI but not reachable")
        pytest.skip(f"no PostgreSQL at {POSTGRES_ADMIN_URL}")
    return POSTGRES_ADMIN_URL


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request):
    """None (SQLite under the data dir) or a fresh PostgreSQL database, dropped afterwards."""
    if request.param == "sqlite":
        yield None
        return
    yield from _fresh_postgres()


@pytest.fixture
def postgres_url():
    """A fresh PostgreSQL database, dropped afterwards."""
    yield from _fresh_postgres()


def _fresh_postgres():
    import subprocess
    import uuid

    admin = postgres_admin_url()
    name = f"benchlab_t_{uuid.uuid4().hex[:12]}"
    subprocess.run(["psql", admin, "-q", "-c", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    try:
        yield admin.rsplit("/", 1)[0] + f"/{name}"
    finally:
        subprocess.run(["psql", admin, "-q", "-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
                       capture_output=True)
