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


def test_the_backward_report_counts_key_tiles_and_their_query_steps(tmp_path):
    # (4, 16, 4096, 128) causal: 32 key tiles of 128 a head, key tile n 64 - 2n steps of 64 queries; the
    # hardware's earliest-free order is already level there, and equal non-causal tiles cannot beat whole waves
    out = tmp_path / "balance_bwd.json"
    assert tile_balance.main(["--backward", "--shape", "4,16,4096,128,causal", "--shape", "4,16,4096,128",
                              "--out", str(out)]) == 0
    causal, plain = json.loads(out.read_text())["rows"]
    assert causal["pass"] == "bwd" and (causal["block_m"], causal["block_n"]) == (64, 128)
    assert causal["tiles"] == plain["tiles"] == 64 * 32 and causal["group"] == 4 and plain["group"] == 1
    assert causal["busiest_over_mean"]["round_robin"] > 1.2 and causal["busiest_over_mean"]["tile_schedule"] < 1.01
    # 2048 equal tiles on 132 programs: 16 on some, 15 on the rest, so the busiest does 16 / (2048 / 132)
    assert plain["busiest_over_mean"]["tile_schedule"] == round(16 / (2048 / 132), 4)


@pytest.mark.parametrize("bad", ["4,16,4096", "4,16,4096,128,causl", "4,x,4096,128", "0,16,4096,128"])
def test_a_bad_shape_is_named_and_writes_nothing(tmp_path, capsys, bad):
    out = tmp_path / "balance.json"
    with pytest.raises(SystemExit):
        tile_balance.main(["--shape", bad, "--out", str(out)])
    assert bad in capsys.readouterr().err and not out.exists()
