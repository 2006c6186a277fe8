"""The cells-or-turns study runs end to end on the CPU and keeps what it judged from."""
import json

import pytest


def test_a_short_study_records_both_methods_for_every_pair(tmp_path):
    from benchmarks.turns_vs_cells import main

    out = tmp_path / "turns.json"
    assert main(["--out", str(out), "--pairs", "2", "--repeats", "4", "--shape", "1,1,16,8"]) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "turns_vs_cells" and result["torch"] and len(result["aa"]) == len(result["ab"]) == 2
    for pair in result["aa"] + result["ab"]:
        for method in ("cells", "turns"):
            m = pair[method]
            assert len(m["a_samples_ms"]) == len(m["b_samples_ms"]) == 4
            assert m["low"] <= m["ratio"] <= m["high"] and m["verdict"] in ("slower", "faster", "same", "inconclusive")
    for kind in ("aa", "ab"):
        assert sum(result["summary"][kind]["turns"]["verdicts"].values()) == 2


def test_bad_arguments_are_named(tmp_path, capsys):
    from benchmarks.turns_vs_cells import main

    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x.json"), "--shape", "1,2,3"])
    assert exc.value.code == 2 and "--shape" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
