"""The A/B benchmark loads another flash_triton.py by path and names what is wrong with a bad one."""
from pathlib import Path

import pytest

from benchmarks.flash_ab import load_module


def test_loads_a_flash_module_from_a_path():
    path = Path(__file__).resolve().parents[2] / "kernels" / "flash_triton.py"
    mod = load_module(path, "flash_copy_for_test")
    assert mod.__name__ == "flash_copy_for_test" and hasattr(mod, "FlashAttentionTriton")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_module(tmp_path / "nope.py")


def test_a_file_without_the_kernels_is_refused(tmp_path):
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    with pytest.raises(AttributeError, match="flash_attention_forward"):
        load_module(other)
