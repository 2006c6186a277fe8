"""The Gluon forward's launcher refuses what the kernel cannot run, with the reason named.

The kernel itself has no interpreter: tests/benchmarks/test_flash_sass.py compiles it for sm_90 on this
CPU machine, and the GPU host runs it (benchmarks/flash_gluon_ab.py checks every output row there)."""
import pytest
import torch

from kernels import flash_gluon


@pytest.mark.parametrize(("head_dim", "cfg"), [(128, (64, 64, 3, 4)), (64, (128, 64, 3, 8)), (128, (256, 32, 3, 8))])
def test_configs_the_h200_ran_are_accepted(head_dim, cfg):
    assert flash_gluon.config_error(head_dim, *cfg) is None


@pytest.mark.parametrize(("cfg", "named"), [
    ((64, 64, 3, 2), "num_warps 2"),          # wgmma needs whole warpgroups
    ((96, 64, 3, 8), "block_m 96"),           # not a multiple of 16 rows a warp
    ((512, 64, 2, 8), "block_m 512"),         # past one wgmma's rows
    ((64, 128, 3, 4), "block_n 128"),         # must divide block_m (the causal diagonal lines up)
    ((64, 48, 3, 4), "block_n 48"),
    ((64, 64, 1, 4), "stages 1"),             # a slot is refilled only after its tile was used
    ((128, 128, 3, 8), "229376 bytes"),       # Q and three 128-key slots at d=128: over the budget
])
def test_bad_configs_are_named(cfg, named):
    why = flash_gluon.config_error(128, *cfg)
    assert why is not None and named in why


@pytest.mark.parametrize("cfg", [(128, 128, 2, 4), (128, 64, 4, 4), (64, 64, 3, 4), (128, 128, 3, 4),
                                 (192, 128, 2, 4), (192, 64, 4, 4), (64, 128, 2, 4)])
def test_warp_specialised_configs_are_one_to_three_warpgroups_of_64_rows(cfg):
    # (128, 128, 3, 4): 224 KiB, over the budget of the kernels that share an SM, within WS_SMEM_BUDGET;
    # 192 rows with 128-key tiles: the tiles need not divide the rows (each consumer masks its own)
    assert flash_gluon.config_error(128, *cfg, warp_specialized=True) is None


@pytest.mark.parametrize(("cfg", "named"), [
    ((128, 128, 2, 8), "8 warps"),       # each consumer is one warpgroup of 4 warps
    ((256, 64, 2, 4), "256 rows"),       # four consumers: no registers left for them (WS_MAXNREG)
    ((128, 32, 2, 4), "block_n 32"),     # 64 or 128 keys a step
    ((128, 128, 4, 4), "294912 bytes"),  # Q and four 128-key slots at d=128: over the 227 KiB a block has
])
def test_bad_warp_specialised_configs_are_named(cfg, named):
    why = flash_gluon.config_error(128, *cfg, warp_specialized=True)
    assert why is not None and named in why


def test_three_consumers_get_the_registers_of_a_sixteen_warp_block():
    kernel, config, options = flash_gluon.launch_spec(64, 192, 128, 2, 4, "ws")
    assert kernel is flash_gluon._fwd_ws_kernel and config["CONSUMERS"] == 3
    # 16 warps (the producer's warpgroup counted whole) x 32 threads x 128 = the 64K registers of an SM,
    # and the consumers' 160 with the producer's 24 fit in them
    assert options == {"num_warps": 4, "maxnreg": 128} and config["CONSUMER_REGS"] == 160
    assert 3 * 128 * config["CONSUMER_REGS"] + 128 * 24 <= 65536


def test_an_unknown_mode_is_named():
    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="mode 'fast'"):
        flash_gluon.flash_attention_forward(q, q, q, mode="fast")
    with pytest.raises(ValueError, match="mode 'plain-rs'"):  # miscompiled at d=64 (kernels/names.py)
        flash_gluon.launch_spec(64, 64, 64, 2, 4, "plain-rs")


def test_inputs_it_cannot_take_are_named():
    q16 = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    assert "fp16 and bf16" in flash_gluon.supported(q16.float(), q16.float(), q16.float())
    q96 = torch.randn(1, 2, 64, 96, dtype=torch.float16)
    assert "head dim 96" in flash_gluon.supported(q96, q96, q96)
    assert "sm_90" in flash_gluon.supported(q16, q16, q16)  # this machine has no GPU


def test_the_launcher_checks_before_it_launches():
    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="sm_90"):
        flash_gluon.flash_attention_forward(q, q, q)
    with pytest.raises(ValueError, match="same shape"):  # flash_triton's own input checks come first
        flash_gluon.flash_attention_forward(q, q, q[..., :32, :])


@pytest.mark.parametrize(("cfg", "mode"), [((64, 64, 3, 4), "overlap"), ((128, 64, 3, 4), "ws"),
                                          ((128, 64, 3, 4), "pingpong")])
def test_each_mode_with_q_in_registers_is_the_same_kernel_with_q_regs_set(cfg, mode):
    kernel, config, options = flash_gluon.launch_spec(128, *cfg, mode)
    rs_kernel, rs_config, rs_options = flash_gluon.launch_spec(128, *cfg, mode + "-rs")
    assert rs_kernel is kernel and rs_options == options
    assert config.pop("Q_REGS") is False and rs_config.pop("Q_REGS") is True
    assert rs_config == config
    with pytest.raises(ValueError, match="pingpong takes two consumer warpgroups"):  # the checks apply to "-rs" too
        flash_gluon.launch_spec(128, 64, 64, 3, 4, "pingpong-rs")


@pytest.mark.parametrize("mode", ["ws", "pingpong"])
def test_the_kv_modes_are_the_warp_specialised_kernel_with_split_kv_set_and_only_those(mode):
    kernel, config, options = flash_gluon.launch_spec(128, 128, 128, 2, 4, mode)
    kv_kernel, kv_config, kv_options = flash_gluon.launch_spec(128, 128, 128, 2, 4, mode + "-kv")
    assert kv_kernel is kernel and kv_options == options
    assert config.pop("SPLIT_KV") is False and kv_config.pop("SPLIT_KV") is True
    assert kv_config == config
    rs_config = flash_gluon.launch_spec(128, 128, 64, 3, 4, mode + "-kv-rs")[1]
    assert rs_config["SPLIT_KV"] is True and rs_config["Q_REGS"] is True
    for other in ("overlap-kv", "plain-kv", "ws-rs-kv"):  # one K/V barrier a slot is all those kernels have
        with pytest.raises(ValueError, match=f"mode '{other}'"):
            flash_gluon.launch_spec(128, 64, 64, 3, 4, other)


def test_the_persistent_modes_are_their_own_kernel_with_the_warp_specialised_ones_tiles():
    kernel, config, options = flash_gluon.launch_spec(128, 128, 128, 3, 4, "ws-p")
    ws_kernel, ws_config, ws_options = flash_gluon.launch_spec(128, 128, 128, 3, 4, "ws")
    assert kernel is flash_gluon._fwd_persistent_kernel and ws_kernel is flash_gluon._fwd_ws_kernel
    assert options == ws_options  # the same warps and registers a block
    assert ws_config.pop("SPLIT_KV") is False
    assert config == ws_config and config["PINGPONG"] is False
    assert flash_gluon.launch_spec(64, 192, 128, 4, 4, "ws-p")[1]["CONSUMERS"] == 3
    with pytest.raises(ValueError, match="two or three consumer warpgroups"):  # one program of 64 rows
        flash_gluon.launch_spec(128, 64, 128, 3, 4, "ws-p")
    # "pingpong-p": the same kernel, its two consumers taking turns to issue their matmuls
    pp_kernel, pp_config, pp_options = flash_gluon.launch_spec(128, 128, 128, 3, 4, "pingpong-p")
    assert pp_kernel is kernel and pp_options == options and pp_config == {**config, "PINGPONG": True}
    with pytest.raises(ValueError, match="pingpong takes two consumer warpgroups"):
        flash_gluon.launch_spec(64, 192, 128, 4, 4, "pingpong-p")
    for other in ("ws-kv-p", "ws-rs-p", "overlap-p", "pingpong-kv-p"):
        with pytest.raises(ValueError, match=f"mode '{other}'"):
            flash_gluon.launch_spec(128, 128, 128, 3, 4, other)


def test_the_persistent_kernel_takes_rows_that_flatten_and_whole_key_tiles():
    # it reads Q, K and V as (Z * H * n, d) matrices: each (z, h) pair's rows n rows after the last pair's,
    # and no key tile running into the next pair's keys
    x = torch.empty(2, 3, 1024, 128)
    assert flash_gluon.persistent_error(x, x, x, 128) is None
    bshd = torch.empty(2, 1024, 3, 128).transpose(1, 2)  # (b, s, h, d) memory seen as (b, h, s, d)
    assert "flatten" in flash_gluon.persistent_error(x, bshd, x, 128)
    assert flash_gluon.persistent_error(bshd[:1], bshd[:1], bshd[:1], 128) is not None  # one batch row, h > 1
    one_head = torch.empty(4, 1024, 1, 128).transpose(1, 2)  # h = 1: each batch row's rows follow the last's
    assert flash_gluon.persistent_error(one_head, one_head, one_head, 128) is None
    padded = torch.empty(2, 3, 1100, 128)[:, :, :1024]  # each pair 1100 rows apart
    assert "flatten" in flash_gluon.persistent_error(padded, padded, padded, 128)
    ragged = torch.empty(2, 3, 1000, 128)
    assert "1000 keys" in flash_gluon.persistent_error(x, ragged, ragged, 128)
    assert flash_gluon.persistent_error(x, ragged[:, :, :960], ragged[:, :, :960], 64) is not None  # strides
    whole = torch.empty(2, 3, 960, 128)
    assert flash_gluon.persistent_error(x, whole, whole, 64) is None and "960 keys" in (
        flash_gluon.persistent_error(x, whole, whole, 128))


def _launch_order_key_tiles(n_zh, n_q, n_k, block_m, block_n, group, causal):
    """Each tile's key tiles as the kernel works them out (_schedule_tile, _key_tiles), tile by tile."""
    rows = -(-n_q // block_m)
    out = []
    for tile in range(n_zh * rows):
        pid_m = (tile // group) % rows
        start_m = (rows - 1 - pid_m if causal else pid_m) * block_m
        hi = min(start_m + block_m, n_k) if causal else n_k
        out.append(-(-hi // block_n))
    return out


@pytest.mark.parametrize(("shape", "block_m", "group", "causal"), [
    ((64, 4096, 4096), 128, 4, True), ((6, 1000, 1024), 192, 2, True), ((6, 1000, 1024), 192, 1, False),
    ((3, 640, 768), 128, 3, True)])
def test_tile_costs_are_the_key_tiles_each_tile_visits_in_launch_order(shape, block_m, group, causal):
    n_zh, n_q, n_k = shape
    assert flash_gluon.tile_costs(n_zh, n_q, n_k, block_m, 128, group, causal) == _launch_order_key_tiles(
        n_zh, n_q, n_k, block_m, 128, group, causal)


def _split(table, programs):
    offsets, tiles = table[:programs + 1], table[programs + 1:]
    return [tiles[offsets[p]:offsets[p + 1]] for p in range(programs)]


def _busiest_share(costs, per_program):
    work = [sum(costs[t] + flash_gluon.TILE_FIXED_COST for t in tiles) for tiles in per_program]
    return max(work) / (sum(work) / len(work))


@pytest.mark.parametrize(("n_tiles", "programs"), [(2048, 132), (100, 132), (7, 3)])
def test_tiles_of_equal_work_go_round_robin(n_tiles, programs):
    table = flash_gluon.tile_schedule([32] * n_tiles, programs)
    used = min(programs, n_tiles)
    assert len(table) == used + 1 + n_tiles
    assert _split(table, used) == [list(range(p, n_tiles, used)) for p in range(used)]


@pytest.mark.parametrize(("shape", "block_m", "group"), [
    ((64, 4096), 128, 4),     # (4, 16, 4096, 128)
    ((128, 4096), 192, 4),    # (4, 32, 4096, 64): three consumers
    ((16, 16384), 192, 4)])   # (16, 1, 16384, 64), the leaderboard's
def test_causal_tiles_are_handed_out_so_no_program_has_much_more_work_than_the_mean(shape, block_m, group):
    # causal tiles in groups of 4 heads on 132 programs: round-robin gives the busiest program a fifth to half
    # as much again as the mean
    n_zh, n = shape
    costs = flash_gluon.tile_costs(n_zh, n, n, block_m, 128, group, True)
    table = flash_gluon.tile_schedule(costs, 132)
    per_program = _split(table, 132)
    assert len(table) == 133 + len(costs)
    assert sorted(t for tiles in per_program for t in tiles) == list(range(len(costs)))  # each tile once
    round_robin = [list(range(p, len(costs), 132)) for p in range(132)]
    assert _busiest_share(costs, round_robin) > 1.1
    assert _busiest_share(costs, per_program) < 1.01


def test_the_schedule_keeps_round_robin_where_it_leaves_the_busiest_program_less():
    # four short causal rows a head (8, 32, 512, 128): the earliest-free rule leaves a heavier tail than
    # round-robin here, so the schedule is round-robin
    costs = flash_gluon.tile_costs(256, 512, 512, 128, 128, 4, True)
    per_program = _split(flash_gluon.tile_schedule(costs, 132), 132)
    round_robin = [list(range(p, len(costs), 132)) for p in range(132)]
    assert _busiest_share(costs, per_program) <= _busiest_share(costs, round_robin)


def test_the_scale_is_log2e_over_sqrt_d():
    assert flash_gluon.qk_scale(64) == pytest.approx(1.4426950408889634 / 8)


def test_every_shipped_config_is_one_the_kernel_takes():
    for (head_dim, causal), cfg in flash_gluon.SHIPPED_FWD.items():
        flash_gluon.launch_spec(head_dim, *cfg)  # raises on a config the kernel cannot run
        assert flash_gluon.shipped_config(head_dim, causal) == cfg
    assert flash_gluon.shipped_config(96, True) is None


def test_the_forward_takes_the_gluon_kernel_where_it_ships_unless_told_not_to(monkeypatch):
    import kernels.flash_triton as ft

    views = [ft._as_zhnd(torch.randn(1, 2, 64, 128, dtype=torch.bfloat16)) for _ in range(3)]
    on = ft.DEFAULT_OPTIONS
    assert on.gluon_fwd
    assert ft._gluon_config("fwd", True, *views, None, on) is None  # a CPU tensor: not sm_90
    monkeypatch.setattr(flash_gluon, "supported", lambda *tensors: None)  # as if on an H200
    for causal in (False, True):
        assert ft._gluon_config("fwd", causal, *views, None, on) == flash_gluon.shipped_config(128, causal)
        assert flash_gluon.shipped_config(128, causal).mode == "ws-p"  # persistent, tiles from tile_schedule
    d64 = [ft._as_zhnd(torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)) for _ in range(3)]
    for causal in (False, True):  # three consumers; causal ones one program a tile (not timed persistent)
        assert ft._gluon_config("fwd", causal, *d64, None, on)[:4] == flash_gluon.FWD_CONFIG_WS_D64[:4]
        assert flash_gluon.shipped_config(64, causal).mode == ("ws" if causal else "ws-p")
    assert flash_gluon.FWD_CONFIG_WS_D64.block_m == 3 * flash_gluon.WG_ROWS
    d32 = [ft._as_zhnd(torch.randn(1, 2, 64, 32, dtype=torch.bfloat16)) for _ in range(3)]
    assert ft._gluon_config("fwd", True, *d32, None, on) is None  # not in SHIPPED_FWD
    for off in (ft.LaunchOptions(gluon_fwd=False), ft.LaunchOptions(tma=False),
                ft.LaunchOptions(pinned={"fwd": ft.make_config(64, 64, 4, 2)})):
        assert ft._gluon_config("fwd", True, *views, None, off) is None, off
    assert ft.LaunchOptions(gluon_fwd=False).key != on.key  # the choice is part of a plan's key
