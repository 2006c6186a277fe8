"""flash_tune's command line: a bad --shape is refused by name before anything is imported or compiled."""
from __future__ import annotations

import argparse

import pytest

from benchmarks import flash_tune


@pytest.mark.parametrize("shape", ["16,abc,64", "16,16384", "0,16384,64", "1,2,3,4,5"])
def test_bad_shape_is_refused_naming_it(tmp_path, capsys, shape):
    with pytest.raises(SystemExit) as exc:
        flash_tune.main(["--shape", shape, "--out", str(tmp_path / "t.jsonl")])
    assert exc.value.code == 2
    assert f"shape {shape!r}" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()


def test_register_caps_parse_with_zero_as_none():
    assert flash_tune.parse_caps("0,128,168,128") == [None, 128, 168]


@pytest.mark.parametrize("bad", ["", "x", "128,300", "16"])
def test_a_bad_register_cap_is_named(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="--maxnreg"):
        flash_tune.parse_caps(bad)
