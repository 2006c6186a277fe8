"""scripts/flash_gpu_checks.sh runs the flash kernels' owed GPU checks in order, each cut to what is left of
the run's seconds. A stand-in for Python records the commands it is given (the real ones need a GPU); the
benchmarks' own argument parsing is checked against the same command lines."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "flash_gpu_checks.sh"


def _run(tmp_path: Path, seconds: int, *sections: str) -> tuple[subprocess.CompletedProcess, Path]:
    fake = tmp_path / "py"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    r = subprocess.run([str(SCRIPT), str(out), str(seconds), *sections], cwd=ROOT, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "PY": str(fake), "COMMIT": "abc1234"}, timeout=60)
    return r, out


def test_each_section_runs_its_command_and_logs_it(tmp_path):
    r, out = _run(tmp_path, 600)
    assert r.returncode == 0, r.stderr
    steps = (out / "steps.log").read_text().splitlines()
    assert [s.split(":")[0] for s in steps] == ["gpu_tests_kernels", "bwd_persistent_d128", "bwd_persistent_d64",
                                                "bwd_persistent_ab", "fwd64_causal", "grid_d128", "grid_d64"]
    assert all(": rc 0 after" in s for s in steps)
    assert (out / "gpu_tests_kernels.log").read_text().split()[:4] == ["-m", "pytest", "-m", "gpu"]
    d128 = (out / "bwd_persistent_d128.log").read_text().split()
    assert d128.count("--fused-config") == 2 and "64,128,3,4,ws-p" in d128 and "halves" in d128
    assert d128.count("--shape") == 3 and str(out / "bwd_persistent_d128_abc1234.json") in d128
    assert "turns" in (out / "bwd_persistent_d64.log").read_text().split()
    fwd64 = (out / "fwd64_causal.log").read_text().split()  # length against head count: 32 heads at 16384 too
    shapes = [fwd64[i + 1] for i, a in enumerate(fwd64) if a == "--shape"]
    assert "1,32,16384,64,causal" in shapes and "16,1,16384,64,causal" in shapes and len(shapes) == 4
    grid = (out / "grid_d64.log").read_text().split()
    assert grid[grid.index("--head-dim") + 1] == "64" and grid[grid.index("--commit") + 1] == "abc1234"


def test_a_section_with_under_30_seconds_left_is_skipped_and_said(tmp_path):
    r, out = _run(tmp_path, 20, "tests", "grid")
    assert r.returncode == 0, r.stderr
    assert "gpu_tests_kernels: skipped, " in r.stdout and not (out / "gpu_tests_kernels.log").exists()
    assert "grid_d64: skipped" in (out / "steps.log").read_text()


def test_an_unknown_section_is_named(tmp_path):
    r, _ = _run(tmp_path, 600, "tests", "fwd128")
    assert r.returncode == 2 and "unknown section fwd128" in r.stderr


@pytest.mark.parametrize("section", ["bwd_p", "bwd_p_ab", "fwd64", "grid"])
def test_the_benchmark_command_lines_parse(tmp_path, section, capsys):
    # the benchmarks' own parsers take the script's arguments: on this machine each stops at its GPU check
    import torch

    from benchmarks import flash_ab, flash_gluon_ab, flash_gluon_bwd_ab, flash_sustained

    if torch.cuda.is_available():
        pytest.skip("on a GPU host the benchmarks would run")

    _, out = _run(tmp_path, 600, section)
    mains = {"benchmarks.flash_gluon_bwd_ab": flash_gluon_bwd_ab.main, "benchmarks.flash_gluon_ab": flash_gluon_ab.main,
             "benchmarks.flash_sustained": flash_sustained.main, "benchmarks.flash_ab": flash_ab.main}
    for log in sorted(out.glob("*.log")):
        if log.name == "steps.log":
            continue
        argv = shlex.split(log.read_text())
        assert argv[0] == "-m" and argv[1] in mains, argv
        with pytest.raises(SystemExit) as stop:
            mains[argv[1]](argv[2:])
        assert stop.value.code == 2 and "no GPU is visible" in capsys.readouterr().err, argv
