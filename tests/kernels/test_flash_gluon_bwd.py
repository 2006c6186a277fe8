"""The Gluon backward kernels' configs are checked with the reason named, and the Triton backward takes
the Gluon dK/dV kernel only where it was measured faster.

The kernels have no interpreter: tests/benchmarks/test_flash_sass.py compiles them for sm_90 on this CPU
machine, and tests/kernels/test_flash.py's GPU tests run them (bit for bit against the Triton kernel)."""
import math

import pytest
import torch

from kernels import flash_gluon
from kernels import flash_gluon_bwd as gb
from kernels import flash_triton as ft


@pytest.mark.parametrize(("kernel", "head_dim", "cfg"), [
    ("dkdv", 128, gb.Config(64, 64, 2, 4)), ("dkdv", 64, gb.Config(64, 64, 3, 4, "defer", 168)),
    ("dkdv", 64, gb.Config(32, 128, 2, 8)), ("dq", 64, gb.Config(128, 64, 2, 8)), ("dq", 128, gb.Config(64, 32, 3, 4)),
    ("fused", 64, gb.Config(64, 64, 2, 4, maxnreg=168)), ("fused", 64, gb.Config(64, 128, 2, 8)),
    ("dkdv", 64, gb.Config(32, 192, 2, 4, "ws")), ("dkdv", 64, gb.Config(64, 64, 3, 4, "ws")),
    ("dkdv", 128, gb.Config(32, 128, 4, 4, "ws")), ("dkdv", 128, gb.Config(32, 64, 3, 4, "overlap-rs")),
    ("dkdv", 64, gb.Config(64, 64, 3, 4, "defer-rs")), ("dq", 64, gb.Config(64, 32, 3, 4, "overlap-rs")),
    ("dq", 128, gb.Config(64, 64, 2, 4, "plain-rs")),
])
def test_configs_the_h200_ran_are_accepted(kernel, head_dim, cfg):
    assert gb.config_error(kernel, head_dim, cfg) is None


@pytest.mark.parametrize(("kernel", "cfg", "named"), [
    ("dkdv", gb.Config(64, 64, 2, 2), "num_warps 2"),           # wgmma needs whole warpgroups
    ("dkdv", gb.Config(64, 96, 2, 4), "block_n 96"),            # key rows: 16 a warp, 64 a warpgroup
    ("dkdv", gb.Config(128, 64, 2, 4), "block_m 128"),          # must divide the key tile (the diagonal)
    ("dq", gb.Config(64, 128, 2, 4), "block_n 128"),            # dQ: the key step must divide the query tile
    ("dkdv", gb.Config(64, 64, 1, 4), "stages 1"),              # a slot is refilled only after its tile was used
    ("dkdv", gb.Config(64, 64, 2, 4, "defer"), "stages 2"),     # the deferred order keeps one more tile
    ("dq", gb.Config(64, 64, 3, 4, "defer"), "order 'defer'"),  # dK/dV's order only
    ("dkdv", gb.Config(64, 64, 2, 4, "fast"), "order 'fast'"),
    ("dkdv", gb.Config(64, 64, 2, 4, maxnreg=300), "maxnreg 300"),
    ("dkdv", gb.Config(64, 256, 3, 8), "229376 bytes"),         # K, V and three slots at d=128: over the budget
    ("fused", gb.Config(32, 64, 2, 4), "block_m 32"),           # the dQ tile is one warpgroup's 64 query rows
    ("fused", gb.Config(64, 64, 2, 4, "plain"), "order 'plain'"),  # the overlap order only
    ("fused", gb.Config(64, 256, 2, 8), "229376 bytes"),        # dS^T counts too (dK/dV takes this: 196608)
    ("dkdv", gb.Config(64, 128, 2, 8, "ws"), "num_warps 8"),    # warp-specialised: each consumer is 4 warps
    ("dkdv", gb.Config(64, 96, 2, 4, "ws"), "block_n 96"),      # consumers own 64 keys each
    ("dkdv", gb.Config(64, 256, 2, 4, "ws"), "block_n 256"),    # four consumers leave no registers to split
    ("dkdv", gb.Config(128, 128, 2, 4, "ws"), "block_m 128"),   # must divide a consumer's 64 keys
    ("dkdv", gb.Config(64, 128, 1, 4, "ws"), "stages 1"),
    ("dkdv", gb.Config(64, 128, 2, 4, "ws", 168), "maxnreg 168"),  # the kernel splits the registers itself
    ("dkdv", gb.Config(64, 192, 5, 4, "ws"), "262144 bytes"),   # K, V of 192 keys and five slots at d=128
    ("dkdv", gb.Config(64, 64, 2, 4, "defer-rs"), "stages 2"),  # K and V in registers change no slot count
    ("dkdv", gb.Config(64, 64, 2, 4, "ws-rs"), "order 'ws-rs'"),
    ("fused", gb.Config(64, 64, 2, 4, "overlap-rs"), "order 'overlap-rs'"),  # the dK/dV kernel's orders only
    ("dq", gb.Config(64, 64, 3, 4, "defer-rs"), "order 'defer-rs'"),
])
def test_bad_configs_are_named(kernel, cfg, named):
    why = gb.config_error(kernel, 128, cfg)
    assert why is not None and named in why
    with pytest.raises(ValueError, match=named.split()[0]):
        gb.launch_spec(kernel, 128, cfg)


@pytest.mark.parametrize("order", gb.ORDERS)
def test_an_rs_order_is_its_order_with_k_and_v_in_registers(order):
    kernel, config, options = gb.launch_spec("dkdv", 64, gb.Config(64, 64, 3, 4, order))
    kernel_rs, config_rs, options_rs = gb.launch_spec("dkdv", 64, gb.Config(64, 64, 3, 4, order + gb.RS_SUFFIX))
    assert kernel is kernel_rs and options == options_rs
    assert config["KV_REGS"] is False and config_rs == {**config, "KV_REGS": True}
    assert config["ORDER"] == gb.ORDERS.index(order)


@pytest.mark.parametrize("order", ["overlap", "plain"])
def test_the_dq_kernels_rs_orders_hold_q_and_do_in_registers(order):
    kernel, config, _ = gb.launch_spec("dq", 64, gb.Config(64, 64, 2, 4, order))
    kernel_rs, config_rs, _ = gb.launch_spec("dq", 64, gb.Config(64, 64, 2, 4, order + gb.RS_SUFFIX))
    assert kernel is kernel_rs and config["OVERLAP"] == (order == "overlap")
    assert config["QDO_REGS"] is False and config_rs == {**config, "QDO_REGS": True}


def test_an_unknown_kernel_is_named():
    with pytest.raises(ValueError, match="kernel 'dv'"):
        gb.launch_spec("dv", 128, gb.DKDV_CONFIG)
    with pytest.raises(ValueError, match="dq_mode 'fast'"):
        gb.launch_spec("fused", 64, gb.FUSED_CONFIG, "fast")


def test_the_launchers_check_before_they_launch():
    q = torch.randn(1, 2, 64, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 64)
    with pytest.raises(ValueError, match="sm_90"):  # this machine has no GPU
        gb.dkdv(q, q, q, q, lse, lse)
    with pytest.raises(ValueError, match="delta"):
        gb.dkdv(q, q, q, q, lse, lse[..., :32])
    with pytest.raises(ValueError, match="dO"):
        gb.dq(q, q, q, q, q.half(), lse)
    with pytest.raises(ValueError, match="stride 64 along d"):  # O with its d axis strided
        gb.dq(q, q, q, q.transpose(-1, -2).contiguous().transpose(-1, -2), q, lse)
    assert "fp16 and bf16" in gb.supported(q.float(), q.float(), q.float(), q.float())
    assert "head dim 96" in gb.supported(q[..., :96], q[..., :96], q[..., :96], q[..., :96])


def _views(d: int, n: int = 64):
    return [ft._as_zhnd(torch.randn(1, 2, n, d, dtype=torch.bfloat16)) for _ in range(4)]


def test_the_backward_takes_the_gluon_kernel_only_where_it_was_measured_faster(monkeypatch):
    assert ft._gluon_config("dkdv", True, *_views(128), ft.DEFAULT_OPTIONS) is None  # a CPU tensor: not sm_90
    monkeypatch.setattr(gb, "supported", lambda *tensors: None)  # as if on an H200 with qualifying tensors
    for causal in (False, True):
        assert ft._gluon_config("dkdv", causal, *_views(128), ft.DEFAULT_OPTIONS) == gb.DKDV_CONFIG
    # d=64: non-causal only (the capped tile), causal stays on Triton (slower on the leaderboard shape)
    assert ft._gluon_config("dkdv", False, *_views(64), ft.DEFAULT_OPTIONS) == gb.DKDV_D64_CONFIG
    assert ft._gluon_config("dkdv", True, *_views(64), ft.DEFAULT_OPTIONS) is None
    for off in (ft.LaunchOptions(gluon_dkdv=False), ft.LaunchOptions(tma=False),
                ft.LaunchOptions(pinned={"dkdv": ft.make_config(64, 64, 4, 2)})):
        assert ft._gluon_config("dkdv", True, *_views(128), off) is None, off
        assert ft._gluon_config("dkdv", False, *_views(64), off) is None, off
    # a pinned dQ config leaves dK/dV to the Gluon kernel; the choice is part of a plan's key
    pinned_dq = ft.LaunchOptions(pinned={"dq": ft.make_config(64, 32, 4, 2)})
    assert ft._gluon_config("dkdv", True, *_views(128), pinned_dq) is not None
    assert ft.LaunchOptions(gluon_dkdv=False).key != ft.DEFAULT_OPTIONS.key


def test_the_gluon_dq_kernel_runs_only_when_asked_for(monkeypatch):
    monkeypatch.setattr(gb, "supported", lambda *tensors: None)
    o4 = _views(128)[0]
    assert ft._gluon_config("dq", True, *_views(128), ft.DEFAULT_OPTIONS, o4) is None  # off by default
    on = ft.LaunchOptions(gluon_dq=True)
    for causal in (False, True):
        assert ft._gluon_config("dq", causal, *_views(128), on, o4) == gb.DQ_CONFIG
        assert ft._gluon_config("dq", causal, *_views(64), on, _views(64)[0]) is None  # lost to Triton's at d=64
    # the kernel reads O by pointers with unit stride along d: another O keeps the Triton kernel
    assert ft._gluon_config("dq", True, *_views(128), on, o4.transpose(-1, -2).contiguous().transpose(-1, -2)) is None
    for off in (ft.LaunchOptions(gluon_dq=True, tma=False),
                ft.LaunchOptions(gluon_dq=True, pinned={"dq": ft.make_config(64, 32, 4, 2)})):
        assert ft._gluon_config("dq", True, *_views(128), off, o4) is None, off
    assert ft._gluon_config("dkdv", True, *_views(128), on) == gb.DKDV_CONFIG  # the two choices are apart
    assert on.key != ft.DEFAULT_OPTIONS.key


def test_every_shipped_config_is_one_the_kernel_takes():
    for kernel, shipped in (("dkdv", gb.SHIPPED_DKDV), ("dq", gb.SHIPPED_DQ)):
        for (head_dim, causal), cfg in shipped.items():
            assert gb.config_error(kernel, head_dim, cfg) is None
            assert gb.shipped_config(kernel, head_dim, causal) == cfg
    assert gb.shipped_config("dkdv", 96, False) is None


def test_the_fused_kernel_has_a_warp_specialised_form():
    # _fused_ws_kernel: the warp-specialised dK/dV program, each consumer also adding its keys' share of dQ;
    # _dkdv_ws_kernel is it with no dQ
    cfg = gb.Config(64, 128, 2, 4, "ws")
    assert gb.config_error("fused", 64, cfg) is None
    for dq_mode, mode in (("add", 1), ("red", 2), ("probe", 2), ("tma", 3), ("turns", 4), ("turns-t", 5)):
        kernel, config, options = gb.launch_spec("fused", 64, cfg, dq_mode)
        assert kernel is gb._fused_ws_kernel and config["DQ_MODE"] == mode and config["CONSUMERS"] == 2
        assert options == {"num_warps": 4, "maxnreg": gb.WS_REGS[2][0]}
    assert gb.launch_spec("dkdv", 64, cfg)[0] is gb._dkdv_ws_kernel
    assert "64 query rows" in gb.config_error("fused", 64, gb.Config(32, 128, 2, 4, "ws"))
    # each consumer's dS^T tile counts in shared memory: 3 consumers at d=128 with 4 slots do not fit
    assert "shared memory" in gb.config_error("fused", 128, gb.Config(64, 192, 4, 4, "ws"))
    with pytest.raises(ValueError, match="dq_mode"):
        gb.launch_spec("fused", 64, cfg, "atomics")
    # the copy engine's adds: the warp-specialised kernel's only, and each consumer's fp32 staging tile
    # counts in shared memory (two consumers at d=128 with three slots: 240 KiB)
    with pytest.raises(ValueError, match="order ws"):
        gb.launch_spec("fused", 64, gb.Config(64, 64, 2, 4), "tma")
    with pytest.raises(ValueError, match="staging tiles"):
        gb.launch_spec("fused", 128, gb.Config(64, 128, 3, 4, "ws"), "tma")
    assert gb.launch_spec("fused", 128, cfg, "red")[1]["DQ_MODE"] == 2
    # turns: two consumers take the tiles' adds in turns, so it needs exactly two; each keeps its dS^T for
    # both tile parities, which counts too
    for bad, why in ((gb.Config(64, 64, 2, 4, "ws"), "two consumers"), (gb.Config(64, 192, 2, 4, "ws"),
                                                                         "two consumers"),
                     (gb.Config(64, 128, 2, 4), "order ws")):
        with pytest.raises(ValueError, match=why):
            gb.launch_spec("fused", 64, bad, "turns")
    nine = gb.Config(64, 128, 9, 4, "ws")  # nine Q/dO slots: 224 KiB with tma's tiles, 240 with turns'
    assert gb.config_error("fused", 64, nine, dq_mode="tma") is None
    assert "shared memory" in gb.config_error("fused", 64, nine, dq_mode="turns")


def test_rotated_query_tiles_are_the_warp_specialised_fused_kernels_knob():
    # rotate: a constexpr of _fused_ws_kernel (off unless asked; the kernel ignores it where causal), refused
    # by name for every other kernel and order
    cfg = gb.Config(64, 128, 3, 4, "ws")
    assert gb.launch_spec("fused", 64, cfg, "turns")[1]["ROTATE"] is False
    for dq_mode in ("add", "tma", "turns", "turns-t"):
        assert gb.launch_spec("fused", 64, cfg, dq_mode, rotate=True)[1]["ROTATE"] is True
    for kernel, bad in (("fused", gb.Config(64, 64, 2, 4)), ("dkdv", cfg), ("dq", gb.DQ_CONFIG)):
        with pytest.raises(ValueError, match="rotate: the warp-specialised fused kernel's only"):
            gb.launch_spec(kernel, 64, bad, "add", rotate=True)


def test_transposed_turns_take_two_or_three_consumers_at_any_query_tile():
    # "turns-t": dQ^T = K^T dS^T, the query tile as the matmul's N, so 16 and 32 query rows take it (the
    # other fused modes need 64), with two or three consumers in turn; it counts both parities' dS^T tiles
    # and each consumer's fp32 staging tile in shared memory like "turns"
    for cfg, consumers in ((gb.Config(32, 192, 3, 4, "ws"), 3), (gb.Config(16, 128, 4, 4, "ws"), 2),
                           (gb.Config(64, 128, 3, 4, "ws"), 2)):
        kernel, config, _ = gb.launch_spec("fused", 64, cfg, "turns-t")
        assert kernel is gb._fused_ws_kernel and config["DQ_MODE"] == 5 and config["CONSUMERS"] == consumers
    assert gb.config_error("fused", 128, gb.Config(32, 128, 3, 4, "ws"), dq_mode="turns-t") is None
    assert "64 query rows" in gb.config_error("fused", 64, gb.Config(32, 192, 3, 4, "ws"), dq_mode="turns")
    for bad, why in ((gb.Config(32, 64, 3, 4, "ws"), "two or three consumers"),
                     (gb.Config(32, 128, 3, 4), "order ws"),
                     (gb.Config(64, 192, 6, 4, "ws"), "shared memory")):
        with pytest.raises(ValueError, match=why):
            gb.launch_spec("fused", 64, bad, "turns-t")
    # (16, 128) at d=128 with 3 slots: 64 KiB of K, V + 24 of Q, dO + 8 of dS^T + 16 of staging = 112 KiB;
    # the same staging with turns' 64-query shape would not take 16 rows at all
    cfg = gb.Config(16, 128, 3, 4, "ws")
    assert gb.config_error("fused", 128, cfg, dq_mode="turns-t") is None
    assert "64 query rows" in gb.config_error("fused", 128, cfg, dq_mode="turns")


def test_halves_give_each_of_two_consumers_half_of_dqs_columns_every_tile():
    # "halves": DQ_MODE 6, two consumers (128 keys) and 64 query rows like "turns"; its staging tiles are
    # each consumer's half of the columns, so at d=128 three Q/dO slots fit where turns' do not:
    # K, V 64 KiB + Q, dO 96 + dS^T of both parities 32 + staging 32 = 224 KiB, against turns' 256
    cfg = gb.Config(64, 128, 3, 4, "ws")
    kernel, config, _ = gb.launch_spec("fused", 128, cfg, "halves")
    assert kernel is gb._fused_ws_kernel and config["DQ_MODE"] == 6 and config["CONSUMERS"] == 2
    assert gb.config_error("fused", 128, cfg, dq_mode="halves") is None
    assert "staging tiles" in gb.config_error("fused", 128, cfg, dq_mode="turns")
    for bad, why in ((gb.Config(64, 64, 2, 4, "ws"), "two consumers"), (gb.Config(64, 192, 2, 4, "ws"),
                                                                        "two consumers"),
                     (gb.Config(32, 128, 3, 4, "ws"), "64 query rows"), (gb.Config(64, 128, 2, 4), "order ws"),
                     (gb.Config(64, 128, 4, 4, "ws"), "shared memory")):
        with pytest.raises(ValueError, match=why):
            gb.launch_spec("fused", 128, bad, "halves")
    assert gb.dq_accumulator(torch.empty(1, 2, 3, 64), "halves").shape == (1, 2, 3, 64)  # turns' layout


def test_the_warp_specialised_budget_is_the_sms_where_registers_hold_one_program():
    # two or three consumers take an SM's registers, so the kernel may use its shared memory
    # (flash_gluon.WS_SMEM_BUDGET); one consumer (two programs an SM) keeps SMEM_BUDGET
    # the same 224 KiB at d=128: two consumers with turns (128 KiB of tiles, 32 of dS^T, 64 of staging), and
    # one consumer with six Q/dO slots (32 KiB of K, V and 192 of slots)
    two = gb.Config(64, 128, 2, 4, "ws")
    assert gb.config_error("fused", 128, two, dq_mode="turns") is None
    one = gb.Config(64, 64, 6, 4, "ws")
    assert f"over {ft.SMEM_BUDGET}" in gb.config_error("dkdv", 128, one)
    assert gb.config_error("dkdv", 128, gb.Config(64, 64, 5, 4, "ws")) is None


def test_the_warp_specialised_kernel_splits_the_registers_by_its_consumers():
    for cfg, consumers in ((gb.Config(64, 64, 2, 4, "ws"), 1), (gb.Config(32, 192, 2, 4, "ws"), 3)):
        kernel, config, options = gb.launch_spec("dkdv", 64, cfg)
        assert kernel is gb._dkdv_ws_kernel and config["CONSUMERS"] == consumers
        maxnreg, consumer_regs = gb.WS_REGS[consumers]
        assert options == {"num_warps": 4, "maxnreg": maxnreg} and config["CONSUMER_REGS"] == consumer_regs
        # the block counts the producer's warpgroup whole; what the consumers and the producer (24) take
        # after the first consumer fits the register file
        assert 4 * 32 * (consumers + 1) * maxnreg <= 65536
        assert 4 * 32 * (maxnreg + (consumers - 1) * consumer_regs + 24) <= 65536 or consumers == 1


_WS = gb.Config(32, 128, 2, 4, "ws")


@pytest.mark.parametrize(("kernel", "dq_mode", "cfg"), [("dkdv", "add", gb.DKDV_CONFIG), ("dq", "add", gb.DKDV_CONFIG),
                                                       ("fused", "red", gb.DKDV_CONFIG),
                                                       ("fused", "probe", gb.DKDV_CONFIG), ("dkdv", "add", _WS),
                                                       ("fused", "red", gb.Config(64, 128, 2, 4, "ws"))])
def test_launch_hands_each_kernel_parameter_its_value(kernel, dq_mode, cfg, monkeypatch):
    # the launcher builds the runtime arguments flash_triton's launch plans replay: one per parameter
    # of the kernel, in its order (each (Z, H, n, d) view's three leading strides, the scalars, then
    # the constexprs by name); a fake kernel records them, since no GPU is here to run the real one
    real, config, options = gb.launch_spec(kernel, 128, cfg)
    seen = {}

    class Recorder:
        arg_names = real.arg_names

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                seen.update(grid=grid, args=args, kwargs=kwargs)
            return run

    monkeypatch.setattr(gb, "launch_spec", lambda *a: (Recorder(), config, options))
    # (Z, H, n, d) views with strides of their own: a transposed head axis, and contiguous ones
    q4, k4, t4 = (torch.randn(2, n, 3, 128).transpose(1, 2) for n in (96, 160, 96))
    v4, u4, w4 = (torch.randn(2, 3, n, 128) for n in (160, 96, 96))
    lse, delta = torch.zeros(2, 3, 96), torch.zeros(2, 3, 96)
    if kernel != "dq":  # (Q, K, V, DO, L, Delta, DK, DV); DK, DV shaped like K, V; fused: + the fp32 DQ_ACC
        tensors = (q4, k4, v4, t4, lse, delta, torch.empty_like(k4), torch.empty_like(v4))
        tensors += (torch.zeros(2, 3, 96, 128),) if kernel == "fused" else ()
    else:  # (Q, K, V, O, DO, L, Delta, DQ)
        tensors = (q4, k4, v4, t4, u4, lse, delta, w4)
    gb.launch(kernel, tensors, True, cfg, 3, dq_mode)
    named = dict(zip(real.arg_names, seen["args"], strict=False))
    assert len(seen["args"]) + len(seen["kwargs"]) - len(options) == len(real.arg_names)
    for name, t in zip(real.arg_names[:len(tensors)], tensors, strict=True):
        assert named[name] is t
    strides = [named[name] for name in real.arg_names if name.startswith("stride_")]
    assert strides == [x for name, t in zip(real.arg_names[:len(tensors)], tensors, strict=True)
                       if name not in ("L", "Delta", "DQ_ACC") for x in t.stride()[:3]]
    assert (named["H"], named["n_q"], named["n_k"]) == (3, 96, 160)
    if kernel == "fused":  # the rows whose dQ is added: all, or none for the probe
        assert named["dq_rows"] == (0 if dq_mode == "probe" else 96)
    assert named["sm_scale"] == pytest.approx(128 ** -0.5) and named["qk_scale"] == pytest.approx(ft.LOG2E / 128 ** 0.5)
    assert seen["kwargs"]["IS_CAUSAL"] is True and seen["kwargs"]["HEAD_DIM"] == 128
    rows = 96 if kernel == "dq" else 160
    block = cfg.block_m if kernel == "dq" else cfg.block_n
    assert seen["grid"] == (3, -(-rows // block), 2)


@pytest.mark.parametrize(("shape", "dtype"), [((2, 3, 77, 64), torch.bfloat16), ((3, 130, 128), torch.float16),
                                              ((1, 2, 64, 64), torch.float32)])
def test_the_fused_backwards_prep_gives_torchs_delta_and_zeroes_every_row(shape, dtype):
    # one Triton kernel (run here by the interpreter): Delta = rowsum(O * dO) in fp32, and every row of the
    # fp32 dQ accumulator zeroed (it starts NaN-filled), O given as a strided view
    gen = torch.Generator().manual_seed(3)
    o, do = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    o_strided = o.transpose(-2, -3).contiguous().transpose(-2, -3) if o.dim() == 4 else o
    acc = torch.full(shape, float("nan"))
    delta, got = gb.fused_prep(o_strided, do, acc)
    assert got is acc and torch.equal(acc, torch.zeros(shape))
    assert delta.shape == shape[:-1] and delta.dtype == torch.float32
    assert torch.allclose(delta, (o.float() * do.float()).sum(-1), atol=1e-5)


def _sts64_wavefronts(column_of, width: int) -> list[int]:
    """Wavefronts of each half-warp of one STS.64 that stores a wgmma accumulator's register pair n = 0 (lane
    l: row l // 4, logical columns 2 (l % 4) + {0, 1}) into a 128-byte swizzled fp32 tile `width` columns
    wide (column blocks of 32, 16-byte chunk index XOR row % 8), the logical column m stored at column_of(m)."""
    waves = []
    for half in (range(16), range(16, 32)):
        banks: dict[int, set[int]] = {}
        for lane in half:
            row = lane // 4
            for e in (0, 1):
                col = column_of(2 * (lane % 4) + e)
                chunk = (col % 32) // 4 ^ row % 8
                addr = (col // 32) * 64 * 128 + row * 128 + chunk * 16 + (col % 4) * 4
                banks.setdefault(addr // 4 % 32, set()).add(addr)
        waves.append(max(len(words) for words in banks.values()))
    return waves


@pytest.mark.parametrize("width", [32, 64, 128])
def test_spread_columns_make_the_staging_stores_of_dq_conflict_free(width):
    # the fused kernel's dQ staging tile (fp32, 128-byte swizzle) written from wgmma accumulators: as they
    # are, rows r and r^1 of a half-warp share their two 16-byte chunks (two wavefronts, the 2-way bank
    # conflict Nsight Compute counts); with the columns spread, each half-warp's 128 bytes take one
    want = torch.arange(width)
    where = torch.argsort(gb.spread_columns(want))  # where[m]: the column that logical column m is stored at
    assert sorted(where.tolist()) == list(range(width)) and not torch.equal(where, want)
    assert _sts64_wavefronts(lambda m: m, width) == [2, 2]
    assert _sts64_wavefronts(lambda m: int(where[m]), width) == [1, 1]


@pytest.mark.parametrize(("shape", "dtype"), [((2, 3, 77, 64), torch.float16), ((3, 130, 128), torch.float32),
                                              ((1, 1, 5, 32), torch.float16)])
def test_cast_dq_puts_spread_columns_back(shape, dtype):
    # the staged modes leave the accumulator's columns spread in groups of 32 (spread_columns); cast_dq with
    # spread (a Triton kernel, here the interpreter) gives the dQ that the plain accumulator gives, bit for
    # bit, on row counts that leave its last block part empty (fp16, fp32: the interpreter's bf16 conversion
    # truncates where the GPU's and torch's round)
    gen = torch.Generator().manual_seed(11)
    want = torch.randn(shape, generator=gen)
    q = torch.empty(shape, dtype=dtype)
    assert torch.equal(gb.cast_dq(gb.spread_columns(want).contiguous(), q, spread=True), gb.cast_dq(want, q))
    assert not torch.equal(gb.cast_dq(gb.spread_columns(want).contiguous(), q), gb.cast_dq(want, q))


def test_which_fused_kernels_spread_dq_columns():
    # the copy engine's row-major staging tiles (tma, turns, halves) at 32 columns or more a consumer; not the
    # atomics, not dQ^T (turns-t), not halves' 16 columns a consumer at d=32
    ws = gb.FUSED_CONFIG_WS
    assert gb.spreads_columns(128, ws, "halves") and gb.spreads_columns(64, ws, "halves")
    assert gb.spreads_columns(64, ws, "turns") and gb.spreads_columns(64, gb.FUSED_CONFIG, "tma")
    assert not gb.spreads_columns(32, ws, "halves") and gb.spreads_columns(32, ws, "turns")
    assert not any(gb.spreads_columns(64, ws, m) for m in ("add", "red", "probe", "turns-t"))
    assert not gb.spreads_columns(16, ws, "turns")


def test_the_persistent_fused_kernel_is_order_ws_p_with_the_warp_specialised_ones_tiles():
    # "ws-p": _fused_ws_persistent_kernel, the same tiles, consumers and registers as "ws" (less ROTATE); two
    # consumers adding dQ by the copy engine only, and no rotation
    ws_p = gb.FUSED_CONFIG_WS._replace(order="ws-p")
    for head_dim, dq_mode, mode_id in ((128, "halves", 6), (64, "turns", 4), (64, "tma", 3)):
        kernel, config, options = gb.launch_spec("fused", head_dim, ws_p, dq_mode)
        ws_kernel, ws_config, ws_options = gb.launch_spec("fused", head_dim, gb.FUSED_CONFIG_WS, dq_mode)
        assert kernel is gb._fused_ws_persistent_kernel and ws_kernel is gb._fused_ws_kernel
        assert options == ws_options and ws_config.pop("ROTATE") is False and config == ws_config
        assert config["DQ_MODE"] == mode_id and config["CONSUMERS"] == 2
        assert gb.spreads_columns(head_dim, ws_p, dq_mode) == gb.spreads_columns(head_dim, gb.FUSED_CONFIG_WS, dq_mode)
    for dq_mode in ("add", "red", "probe", "turns-t"):
        with pytest.raises(ValueError, match="order 'ws-p' with dq_mode"):
            gb.launch_spec("fused", 64, ws_p, dq_mode)
    with pytest.raises(ValueError, match="block_n 192"):  # three consumers
        gb.launch_spec("fused", 64, gb.Config(64, 192, 3, 4, "ws-p"), "tma")
    with pytest.raises(ValueError, match="rotate"):
        gb.launch_spec("fused", 64, ws_p, "turns", rotate=True)
    with pytest.raises(ValueError, match="order 'ws-p'"):  # the dK/dV kernel has no persistent form
        gb.launch_spec("dkdv", 64, ws_p)
    assert "shared memory" in gb.config_error("fused", 128, ws_p._replace(stages=4), dq_mode="halves")


def test_the_persistent_fused_kernel_takes_rows_that_flatten_and_whole_query_and_key_tiles():
    # it reads Q, dO, K and V as (Z * H * n, d) matrices: no tile may run into the next pair's rows
    cfg = gb.FUSED_CONFIG_WS._replace(order="ws-p")
    x = torch.empty(2, 3, 1024, 128)
    assert gb.persistent_error(x, x, x, x, cfg) is None
    bshd = torch.empty(2, 1024, 3, 128).transpose(1, 2)
    assert "dO rows" in gb.persistent_error(x, x, x, bshd, cfg)
    assert "flatten" in gb.persistent_error(x, bshd, x, x, cfg)
    assert "1000 keys" in gb.persistent_error(x, *[torch.empty(2, 3, 1000, 128)] * 2, x, cfg)
    ragged_q = torch.empty(2, 3, 1000, 128)
    assert "1000 queries" in gb.persistent_error(ragged_q, x, x, ragged_q, cfg)
    assert gb.persistent_error(ragged_q[:, :, :960], x, x, ragged_q[:, :, :960], cfg) is not None  # strides
    whole_q = torch.empty(2, 3, 960, 128)
    assert gb.persistent_error(whole_q, x, x, whole_q, cfg) is None  # 15 query tiles, key tiles of its own length


def _launch_order_query_tiles(n_zh, n_q, n_k, block_m, block_n, group, causal):
    """Each key tile's query tiles as the kernel works them out (_key_tile), tile by tile in launch order."""
    key_tiles = -(-n_k // block_n)
    out = []
    for tile in range(n_zh * key_tiles):
        start_n = (tile // group) % key_tiles * block_n
        lo = start_n if causal else 0
        out.append(-(-max(n_q - lo, 0) // block_m))
    return out


@pytest.mark.parametrize(("shape", "group", "causal"), [
    ((64, 4096, 4096), 4, True), ((64, 4096, 4096), 4, False), ((6, 1024, 1024), 2, True),
    ((3, 512, 1024), 3, True), ((4, 960, 640), 1, False)])
def test_key_tile_costs_are_the_query_tiles_each_key_tile_visits_in_launch_order(shape, group, causal):
    n_zh, n_q, n_k = shape
    assert gb.key_tile_costs(n_zh, n_q, n_k, 64, 128, group, causal) == _launch_order_query_tiles(
        n_zh, n_q, n_k, 64, 128, group, causal)


@pytest.mark.parametrize(("shape", "group"), [((64, 4096), 4), ((32, 8192), 4), ((16, 16384), 4)])
def test_causal_key_tiles_are_handed_out_so_no_program_has_much_more_work_than_the_mean(shape, group):
    # the schedule is the forward's (flash_gluon.tile_schedule); causal key tile n visits n_q - 128 n queries,
    # so in launch order (heaviest first in each group) round-robin leaves some programs much more to do:
    # (4, 16, 4096, 128), (2, 16, 8192, 128) and the leaderboard's (16, 1, 16384, 64) on 132 programs
    n_zh, n = shape
    costs = gb.key_tile_costs(n_zh, n, n, 64, 128, group, True)
    table = flash_gluon.tile_schedule(costs, 132)
    offsets, tiles = table[:133], table[133:]
    per_program = [tiles[offsets[p]:offsets[p + 1]] for p in range(132)]
    assert sorted(t for mine in per_program for t in mine) == list(range(len(costs)))  # each key tile once

    def busiest_share(hand_out):
        work = [sum(costs[t] + flash_gluon.TILE_FIXED_COST for t in mine) for mine in hand_out]
        return max(work) / (sum(work) / len(work))
    assert busiest_share([list(range(p, len(costs), 132)) for p in range(132)]) > 1.1
    assert busiest_share(per_program) < 1.01


@pytest.mark.parametrize("shape", [(2, 3, 77, 64), (3, 130, 128), (1, 1, 64, 64)])
def test_transposed_turns_accumulate_dq_transposed_and_the_cast_gives_dq_back(shape):
    # "turns-t" adds dQ^T into (Z*H, d, n_q rounded up to 4 columns), zeroed by torch (the prep only
    # writes Delta there); cast_dq reads it back as dQ of q's shape and dtype, scaled by 1/sqrt(d) (fp16:
    # the interpreter's bf16 conversion truncates where the GPU's rounds)
    q = torch.randn(shape).to(torch.float16)
    acc = gb.dq_accumulator(q, "turns-t")
    zh, n, d = math.prod(shape[:-2]), shape[-2], shape[-1]
    assert acc.shape == (zh, d, -(-n // 4) * 4) and acc.dtype == torch.float32 and not acc.any()
    assert gb.dq_accumulator(q, "turns").shape == q.shape
    gen = torch.Generator().manual_seed(5)
    o, do = (torch.randn(shape, generator=gen).to(torch.float16) for _ in range(2))
    delta, got = gb.fused_prep(o, do, acc)
    assert got is acc and not acc.any()  # left as torch zeroed it, padding included
    assert torch.allclose(delta, (o.float() * do.float()).sum(-1), atol=1e-5)
    want = torch.randn(shape, generator=gen)  # an fp32 dQ before its scale
    acc[..., :n] = want.reshape(zh, n, d).transpose(-1, -2)
    acc[..., n:] = float("nan")  # padding columns are never read
    dq = gb.cast_dq(acc, q)
    assert dq.shape == q.shape and dq.dtype == q.dtype
    assert torch.equal(dq, (want * (1 / math.sqrt(d))).to(q.dtype))
    plain = want.clone()
    assert torch.equal(gb.cast_dq(plain, q), dq)  # the other layout gives the same dQ


def test_the_fused_backwards_prep_names_what_it_cannot_take():
    o = torch.randn(1, 2, 16, 64)
    with pytest.raises(ValueError, match="unit stride along d"):
        gb.fused_prep(o.transpose(-1, -2), o.transpose(-1, -2))
    with pytest.raises(ValueError, match="contiguous fp32"):
        gb.fused_prep(o, o, torch.zeros(1, 2, 16, 64, dtype=torch.float16))
