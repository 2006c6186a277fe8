"""flash_accuracy: each version's error against float64, on the CPU interpreter with a tiny shape."""
import json
from pathlib import Path

import pytest

from benchmarks.flash_accuracy import main

FLASH = Path(__file__).resolve().parents[2] / "kernels" / "flash_triton.py"


def test_both_versions_are_checked_against_float64(tmp_path):
    # the tree against a copy of itself: equal errors, and small ones (a right reference and kernels)
    out = tmp_path / "acc.json"
    assert main(["--baseline", str(FLASH), "--out", str(out), "--device", "cpu", "--dtype", "fp32",
                 "--shape", "1,2,45,16,causal"]) == 0
    report = json.loads(out.read_text())
    (cell,) = report["cells"]
    assert cell["shape"] == [1, 2, 45, 16] and cell["causal"] is True
    assert set(cell["current"]) == {"o", "dq", "dk", "dv"}
    assert cell["current"] == cell["baseline"]
    assert all(0 < e["rel_fro"] < 1e-5 and e["max_abs"] < 1e-5 for e in cell["current"].values())


def test_a_wrong_baseline_changes_the_errors(tmp_path):
    # a baseline whose forward drops the causal mask must show a large error on a causal shape
    broken = tmp_path / "broken.py"
    broken.write_text(FLASH.read_text().replace(
        "def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,",
        "def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal_: bool = False,",
    ).replace("    key = None\n    if out is None and q.is_cuda:\n        key = (\"fwd\"",
              "    is_causal = False\n    key = None\n    if out is None and q.is_cuda:\n        key = (\"fwd\"", 1))
    out = tmp_path / "acc.json"
    main(["--baseline", str(broken), "--out", str(out), "--device", "cpu", "--dtype", "fp32",
          "--shape", "1,1,40,16,causal"])
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["baseline"]["o"]["rel_fro"] > 1e-2 > cell["current"]["o"]["rel_fro"]


def test_a_bad_dtype_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--baseline", str(FLASH), "--out", str(tmp_path / "x.json"), "--dtype", "fp64"])
    assert "fp64" in capsys.readouterr().err
