"""The CI recipes in docs/ci/ run their documented command against a live server: the command line
is taken from the recipe files, the sweep spec swapped for a noop one a CPU can run."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import yaml

from tests.stack import ROOT, Stack

RECIPES = ROOT / "docs" / "ci"


def ci_command(recipe: str) -> list[str]:
    spec = yaml.safe_load((RECIPES / recipe).read_text())
    lines = ([s["run"] for s in spec["jobs"]["bench"]["steps"] if "run" in s] if "jobs" in spec
             else spec["benchmarks"]["script"])
    (line,) = [ln for ln in lines if ln.startswith("benchlab ci ")]
    return shlex.split(line)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("recipes")).start()
    yield s
    s.stop()


@pytest.mark.parametrize("recipe, env", [
    ("github-actions.yml", {"GITHUB_SHA": "1111111", "GITHUB_REF_NAME": "main"}),
    ("gitlab-ci.yml", {"CI_COMMIT_SHA": "2222222", "CI_COMMIT_REF_NAME": "main"}),
])
def test_the_recipes_command_runs_and_judges(stack, tmp_path, recipe, env):
    cmd = ci_command(recipe)
    assert cmd[2] == "docs/ci/attention.yaml" and (ROOT / cmd[2]).is_file()
    noop = tmp_path / "noop.yaml"
    noop.write_text(f"suite: noop\nname: {recipe}\nparams:\n  work_ms: 5\n  repeats: 10\n  x: [1, 2]\n")
    args = [sys.executable, "-m", "backend.cli", *cmd[1:2], str(noop), *cmd[3:]]
    run_env = {**os.environ, "BENCHLAB_SERVER": stack.url, **env}
    first = subprocess.run(args, cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=300)
    # the first run of a grid has no baseline yet; the second is judged against the first
    assert first.returncode in (0, 2) and ("can be the next baseline" in first.stderr or first.returncode == 0)
    second = subprocess.run(args, cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=300)
    assert second.returncode in (0, 1), second.stdout + second.stderr
    assert "| verdict |" in (tmp_path / "bench.md").read_text() and (tmp_path / "bench.json").is_file()
