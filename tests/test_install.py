"""`make install` on a host whose Python already has torch (a GPU host's layout: torch in its own
virtual environment) keeps that torch and installs only what is missing. CPU torch stands in for
the CUDA build; the logic does not depend on which."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH = "2.13.0"  # the build on this machine's local disk (constraints-cpu.txt)


@pytest.fixture(scope="module")
def host_env(tmp_path_factory):
    """A virtual environment with torch installed before benchlab, as on the GPU host."""
    env = tmp_path_factory.mktemp("host") / "torch-env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    py = env / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", f"torch=={TORCH}"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"could not prepare a torch environment: {r.stderr[-2000:]}")
    return py


def torch_file(py: Path) -> tuple[str, float]:
    out = subprocess.run([str(py), "-c", "import torch, os; print(torch.__file__); print(torch.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0], os.stat(out[0]).st_mtime_ns, out[1]


def test_the_images_install_step_keeps_the_base_images_torch(host_env, tmp_path):
    before = torch_file(host_env)
    r = subprocess.run(["scripts/install-image.sh", str(host_env), "postgres"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"keeping torch=={TORCH}" in r.stdout and f"benchlab with torch {TORCH}" in r.stdout
    assert torch_file(host_env) == before
    check = subprocess.run([str(host_env), "-c", "import psycopg, backend.db; print('ok')"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert check.stdout.strip() == "ok", check.stderr


def test_dockerfile_uses_that_step_runs_as_a_user_and_records_the_commit():
    text = (ROOT / "Dockerfile").read_text()
    assert "RUN scripts/install-image.sh python postgres" in text
    assert "-devel" in text.split("ARG BASE=", 1)[1].split()[0]  # a compiler for Triton and inductor
    assert "\nUSER benchlab" in text and "useradd" in text
    assert "ARG BENCHLAB_COMMIT" in text and "BENCHLAB_COMMIT=${BENCHLAB_COMMIT}" in text
    assert "HEALTHCHECK" in text
    assert "pip install -e" not in text and "pip install torch" not in text


def test_make_install_keeps_the_hosts_torch_and_installs_into_its_environment(host_env, tmp_path):
    before = torch_file(host_env)
    env = {k: v for k, v in os.environ.items() if k not in ("VENV", "VIRTUAL_ENV")}
    r = subprocess.run(["make", "install", f"PYTHON={host_env}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"keeping torch {TORCH}" in r.stdout and "installing benchlab into it" in r.stdout, r.stdout
    assert "constraints-cpu" not in r.stdout
    assert torch_file(host_env) == before  # the same torch, untouched
    check = subprocess.run([str(host_env), "-c", "import backend.cli, alembic, celery; print('ok')"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert check.stdout.strip() == "ok", check.stderr
    reqs = (host_env.parent.parent / ".benchlab-requirements.txt").read_text().splitlines()
    assert "alembic>=1.13" in reqs and not [r for r in reqs if r.startswith(("torch", "triton"))]


def test_requirements_leave_out_torch_and_triton_and_name_unknown_extras():
    run = lambda *a: subprocess.run([sys.executable, "scripts/requirements.py", *a], cwd=ROOT,  # noqa: E731 (a call)
                                    capture_output=True, text=True)
    base, dev = run("").stdout.splitlines(), run("dev,postgres").stdout.splitlines()
    assert "fastapi>=0.110" in base and "alembic>=1.13" in base
    assert not [r for r in base + dev if r.lower().startswith(("torch", "triton"))]
    assert set(base) < set(dev) and "psycopg[binary]>=3.1" in dev
    bad = run("gpu")
    assert bad.returncode != 0 and "unknown extra(s) gpu" in bad.stderr
