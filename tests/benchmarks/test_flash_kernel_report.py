"""The kernel report refuses to run without a GPU (it reads compiled kernels) and writes nothing."""
import pytest

from benchmarks.flash_kernel_report import main


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only refusal")
    assert main(["--out", str(tmp_path / "r")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_sdpa_without_profile_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "r"), "--sdpa", "cudnn"])
    err = capsys.readouterr().err
    assert "--sdpa" in err and "needs --profile" in err
    assert not (tmp_path / "r").exists()


def test_an_unknown_sdpa_backend_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "r"), "--profile", "--sdpa", "cudnn,nope"])
    assert "nope" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
