"""The kernel report's arguments: pins parse into (kernel, config) and a bad one is named."""
import argparse

import pytest

from benchmarks.flash_kernel_report import main
from benchmarks.flash_tune import parse_pin


def test_a_pin_parses_into_a_kernel_and_its_config():
    assert parse_pin("dkdv=32,64,4,3") == ("dkdv", (32, 64, 4, 3))


@pytest.mark.parametrize("bad", ["dkdv=32,64,4", "bwd=32,64,4,3", "dq=a,b,c,d", "fwd", "fwd=0,64,4,3"])
def test_a_bad_pin_is_named(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="expected KERNEL=BM,BN,WARPS,STAGES"):
        parse_pin(bad)


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only refusal")
    assert main(["--out", str(tmp_path / "r")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
