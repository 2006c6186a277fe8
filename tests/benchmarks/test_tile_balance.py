import json

import pytest

from benchmarks import tile_balance


def test_the_report_gives_each_hand_out_and_the_schedule_picks_the_least_busy(tmp_path):
    out = tmp_path / "balance.json"
    assert tile_balance.main(["--shape", "4,16,4096,128,causal", "--shape", "1,2,256,64", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["kind"] == "tile_balance" and "torch" in report
    causal, plain = report["rows"]
    assert causal["tiles"] == 64 * 32 and causal["programs"] == 132 and causal["group"] == 4
    ratios = causal["busiest_over_mean"]
    assert set(ratios) == {"round_robin", "earliest_free", "earliest_free_heaviest_tail", "tile_schedule"}
    assert ratios["tile_schedule"] == min(ratios.values()) < ratios["round_robin"]
    # two heads of 256 queries at d=64: 4 tiles of 192 rows on 4 programs, one each
    assert plain["tiles"] == plain["programs"] == 4 and plain["busiest_over_mean"]["tile_schedule"] == 1.0


@pytest.mark.parametrize("bad", ["4,16,4096", "4,16,4096,128,causl", "4,x,4096,128", "0,16,4096,128"])
def test_a_bad_shape_is_named_and_writes_nothing(tmp_path, capsys, bad):
    out = tmp_path / "balance.json"
    with pytest.raises(SystemExit):
        tile_balance.main(["--shape", bad, "--out", str(out)])
    assert bad in capsys.readouterr().err and not out.exists()
