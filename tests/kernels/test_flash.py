"""FlashAttention-2 (tiled PyTorch and Triton) against naive attention computed in float64."""
from __future__ import annotations

import pytest
import torch

from kernels.attention import naive_attention, naive_logsumexp
from kernels.flash_pytorch import FlashAttentionPyTorch
from kernels.flash_triton import FlashAttentionTriton, flash_attention_forward
from tests.conftest import HAS_CUDA

IMPLS = [FlashAttentionPyTorch, FlashAttentionTriton]
DEVICE = "cuda" if HAS_CUDA else "cpu"
# fp32 on a GPU runs the dot products in TF32 (10-bit mantissa) by default: ~1e-3 relative error
TOL = {torch.float32: 5e-3 if HAS_CUDA else 2e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
ROW_TOL = 4  # a single row's error may exceed the whole tensor's by this factor (rounding noise)
# The RMS per element that an all-zero reference (dQ with a single key) is judged against. On a GPU,
# fp32 dot products run in TF32: dS = P * (dO V^T - Delta) cancels to ~1e-4 instead of 0, because
# dO V^T is rounded to TF32 and Delta (a plain fp32 row sum) is not.
ZERO_REF_RMS = 5e-2 if HAS_CUDA else 1e-3


def _inputs(shape_q, shape_k, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g, dtype=torch.float64) * scale
    k = torch.randn(shape_k, generator=g, dtype=torch.float64) * scale
    v = torch.randn(shape_k, generator=g, dtype=torch.float64)
    do = torch.randn(shape_q, generator=g, dtype=torch.float64)
    return q, k, v, do


def _reference(q, k, v, do, causal):
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out = naive_attention(qr, kr, vr, causal)
    out.backward(do)
    return out.detach(), naive_logsumexp(q, k, causal), qr.grad, kr.grad, vr.grad


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    # the floor keeps an all-zero reference (dQ with a single key) from dividing by zero
    floor = ZERO_REF_RMS * ref.numel() ** 0.5
    return ((x.double().cpu() - ref).norm() / max(ref.norm().item(), floor)).item()


def _worst_row_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest relative error of one row (one query for O and dQ, one key for dK and dV).

    The whole-tensor error hides a wrong row: at length 4097 a zeroed last row moves the bf16
    error of O by under 1e-2. Per row, a zeroed or garbage row reads ~1. Rows whose reference is
    near zero (dQ of the first causal queries, whose softmax gradient nearly cancels, so TF32's
    rounding of dO V^T shows) are judged against half the RMS row norm, and an all-zero reference
    against the same absolute floor as _rel_err.
    """
    diff = (x.double().cpu() - ref).flatten(0, -2).norm(dim=-1)
    ref_rows = ref.flatten(0, -2).norm(dim=-1)
    floor = max(0.5 * ref_rows.pow(2).mean().sqrt().item(), ZERO_REF_RMS * ref.shape[-1] ** 0.5)
    return (diff / ref_rows.clamp_min(floor)).max().item()


def _run(impl, q, k, v, do, causal, dtype, prep=None):
    qi, ki, vi = (t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v))
    args = [qi, ki, vi]
    if prep is not None:
        args = [prep(t) for t in args]
    out = impl.apply(*args, causal)
    saved = [t for t in out.grad_fn.saved_tensors if t.shape == q.shape[:-1]]
    out.backward(do.to(DEVICE, dtype))
    return out.detach(), saved, qi.grad, ki.grad, vi.grad


class with_options:  # noqa: N801 (stands where an autograd Function class is passed)
    """FlashAttentionTriton with launch options or an fp32 precision: `.apply(q, k, v, causal)` like the
    Function itself."""

    def __init__(self, options=None, precision="tf32"):
        self.options, self.precision = options, precision
        self.__name__ = f"FlashAttentionTriton({options}, {precision})"

    def apply(self, q, k, v, is_causal=False):
        return FlashAttentionTriton.apply(q, k, v, is_causal, self.precision, self.options)


def _check(impl, shape_q, shape_k, causal, dtype, scale=1.0, prep=None):
    q, k, v, do = _inputs(shape_q, shape_k, scale)
    ref_o, ref_l, ref_dq, ref_dk, ref_dv = _reference(q, k, v, do, causal)
    out, saved, dq, dk, dv = _run(impl, q, k, v, do, causal, dtype, prep)
    assert out.shape == q.shape and out.dtype == dtype
    assert len(saved) == 1, "exactly one saved tensor must be shaped q.shape[:-1] (the logsumexp L)"
    tol = TOL[dtype]
    assert _rel_err(out, ref_o) < tol
    assert _worst_row_err(out, ref_o) < ROW_TOL * tol, "a query row of O is wrong"
    assert (saved[0].double().cpu() - ref_l).abs().max().item() < tol * max(1.0, scale**2)
    for name, g, ref in (("dq", dq, ref_dq), ("dk", dk, ref_dk), ("dv", dv, ref_dv)):
        assert g.shape == ref.shape, name
        assert torch.isfinite(g).all(), name
        assert _rel_err(g, ref) < tol * 2, name
        assert _worst_row_err(g, ref) < ROW_TOL * tol * 2, f"a row of {name} is wrong"


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(1, 1), (17, 17), (100, 100), (129, 129), (33, 100), (100, 33)])
def test_odd_lengths_fp32(impl, causal, n_q, n_k):
    _check(impl, (2, n_q, 32), (2, n_k, 32), causal, torch.float32)


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("d", [16, 24, 32, 64, 128])
def test_head_dims(impl, d):
    _check(impl, (1, 2, 40, d), (1, 2, 40, d), True, torch.float32)


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("causal", [False, True])
def test_fp16(impl, causal):
    _check(impl, (2, 2, 65, 32), (2, 2, 65, 32), causal, torch.float16)


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__name__)
def test_non_contiguous_4d(impl):
    # (b, s, h, d) storage read as (b, h, s, d): a transposed, non-contiguous view
    prep = lambda t: t.transpose(1, 2)  # noqa: E731 (a one-line layout helper)
    q, k, v, do = _inputs((2, 3, 37, 32), (2, 3, 37, 32))
    ref = _reference(q, k, v, do, True)
    qi, ki, vi = (t.transpose(1, 2).contiguous().to(DEVICE, torch.float32).requires_grad_() for t in (q, k, v))
    args = [prep(t) for t in (qi, ki, vi)]
    assert not args[0].is_contiguous()
    out = impl.apply(*args, True)
    out.backward(do.to(DEVICE, torch.float32))
    tol = TOL[torch.float32]
    assert _rel_err(out.detach(), ref[0]) < tol
    assert _rel_err(qi.grad.transpose(1, 2), ref[2]) < 2 * tol
    assert _rel_err(ki.grad.transpose(1, 2), ref[3]) < 2 * tol
    assert _rel_err(vi.grad.transpose(1, 2), ref[4]) < 2 * tol


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__name__)
def test_five_dims_and_2d(impl):
    _check(impl, (2, 2, 2, 19, 16), (2, 2, 2, 23, 16), False, torch.float32)
    _check(impl, (21, 16), (21, 16), True, torch.float32)


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__name__)
def test_large_magnitude_is_stable(impl):
    # scores of order 1e3: a softmax without the running max would overflow exp(). On a GPU the Triton
    # kernel runs its fp32 dots in full fp32 here: TF32's rounding of scores this large is a precision
    # question (test_gpu_fp32_* cover it), not the stability one this test asks.
    if impl is FlashAttentionTriton and HAS_CUDA:
        impl = with_options(precision="ieee")
    _check(impl, (1, 50, 32), (1, 50, 32), True, torch.float32, scale=8.0)


def test_causal_row_sees_only_its_prefix():
    # changing key j > i must not change output row i
    q, k, v, _ = _inputs((1, 20, 16), (1, 20, 16))
    a = FlashAttentionTriton.apply(q.float().to(DEVICE), k.float().to(DEVICE), v.float().to(DEVICE), True)
    k2, v2 = k.clone(), v.clone()
    k2[:, 10:] += 5.0
    v2[:, 10:] -= 3.0
    b = FlashAttentionTriton.apply(q.float().to(DEVICE), k2.float().to(DEVICE), v2.float().to(DEVICE), True)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("bad,msg", [
    (lambda q, k, v: (q, k[..., :8], v[..., :8]), "head dim"),
    (lambda q, k, v: (q, k, v[:, :5]), "same shape"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), "dtype"),
    (lambda q, k, v: (q, k.half(), v), "share a dtype"),
    (lambda q, k, v: (q[0], k, v), "leading dims"),
])
def test_bad_inputs_are_named(bad, msg):
    q, k, v = (torch.randn(2, 10, 16, device=DEVICE) for _ in range(3))
    with pytest.raises((ValueError, TypeError), match=msg):
        FlashAttentionTriton.apply(*bad(q, k, v), False)


@pytest.mark.parametrize("causal", [False, True])
def test_grid_order_does_not_change_results(causal):
    # head-major, grouped and tile-major grids visit the same tiles: every output and gradient is
    # bit-identical (2 x 3 pairs: groups of 1, 2, 3 and all 6, and the backward's order apart)
    import kernels.flash_triton as ft

    q, k, v, do = _inputs((2, 3, 45, 16), (2, 3, 45, 16))
    results = [_run(with_options(ft.LaunchOptions(head_group=g, bwd_head_group=b)), q, k, v, do, causal,
                    torch.float32) for g, b in ((1, None), (2, None), (3, None), (6, None), (6, 1))]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b], strict=True):
                assert torch.equal(x, y)


@pytest.mark.skipif(HAS_CUDA, reason="a compiled kernel refuses a changed global; the interpreter reads it per call")
@pytest.mark.parametrize("causal", [False, True])
def test_dkdv_matmul_order_does_not_change_gradients(causal, monkeypatch):
    # at d = DV_AFTER_DP_HEAD_DIM the dK/dV loop issues dV's matmul after dP^T's; both orders compute
    # the same sums, so moving that head dim elsewhere must leave every gradient bit-identical
    import kernels.flash_triton as ft

    q, k, v, do = _inputs((1, 2, 70, 128), (1, 2, 70, 128))
    late = _run(FlashAttentionTriton, q, k, v, do, causal, torch.float16)
    monkeypatch.setattr(ft, "DV_AFTER_DP_HEAD_DIM", ft.tl.constexpr(256))
    ft.clear_launch_plans()
    early = _run(FlashAttentionTriton, q, k, v, do, causal, torch.float16)
    for a, b in zip(late[2:], early[2:], strict=True):
        assert torch.equal(a, b)


def test_grid_order_policy():
    import kernels.flash_triton as ft

    assert ft.DEFAULT_OPTIONS.head_group is None
    assert ft._head_group(False, 16) == 1          # non-causal: head-major
    assert ft._head_group(True, 64) == ft.HEAD_GROUP  # causal: groups of HEAD_GROUP
    assert ft._head_group(True, 3) == max(d for d in (1, 3) if d <= ft.HEAD_GROUP)
    assert ft._head_group(True, 7, forced=4) == 1  # a divisor of 7 no larger than 4
    assert ft._head_group(True, 12, forced=5) == 4
    assert ft._head_group(True, 12, forced=100) == 12  # more than there are: all of them
    # more than 65535 groups do not fit grid axis 2: the group grows to the smallest divisor that fits
    assert ft._head_group(False, 2 * 65536) == 4
    assert ft._divisors(12) == [1, 2, 3, 4, 6, 12] and ft._divisors(1) == [1] and ft._divisors(49) == [1, 7, 49]


@pytest.mark.parametrize("name", ["head_group", "bwd_head_group"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "4"])
def test_a_bad_head_group_is_named(name, bad):
    import kernels.flash_triton as ft

    with pytest.raises(ValueError, match=f"^{name} must be a positive integer"):
        ft.LaunchOptions(**{name: bad})


@pytest.mark.parametrize("bwd, want", [(None, 2), (3, 3)])
def test_the_backward_takes_its_own_grid_order_when_given_one(monkeypatch, bwd, want):
    # (2, 3) pairs, causal: the forward's grid groups head_group=2 pairs; the dQ and dK/dV grids
    # bwd_head_group's where set, else the same 2
    import kernels.flash_triton as ft

    seen = []
    grid = ft._grid
    monkeypatch.setattr(ft, "_grid", lambda n, block, zh, group: seen.append(group) or grid(n, block, zh, group))
    ft.clear_launch_plans()
    q, k, v, do = _inputs((2, 3, 40, 16), (2, 3, 40, 16))
    _run(with_options(ft.LaunchOptions(head_group=2, bwd_head_group=bwd)), q, k, v, do, True, torch.float32)
    assert seen == [2, want, want]  # forward, dQ, dK/dV


def test_a_sequence_longer_than_the_grid_holds_is_refused():
    import kernels.flash_triton as ft

    q = torch.empty(1, ft.MAX_SEQ + 1, 16, device="meta")
    with pytest.raises(ValueError, match=f"sequence length {ft.MAX_SEQ + 1} is longer than the supported maximum"):
        ft._check_inputs(q, q, q)


def test_launch_options_reject_an_unknown_kernel_and_pick_the_pinned_config():
    import kernels.flash_triton as ft

    cfg = ft.make_config(64, 32, 4, 2)
    with pytest.raises(ValueError, match="bwd"):
        ft.LaunchOptions(pinned={"bwd": cfg})
    opts = ft.LaunchOptions(pinned={"dq": cfg})
    with pytest.raises(AttributeError):
        opts.autotune = False  # frozen: a value, never shared mutable state
    assert ft.DEFAULT_OPTIONS.pinned == {}


def test_worst_row_err_catches_one_wrong_row():
    # the check the per-row asserts rely on: one zeroed row of 4097 barely moves the whole-tensor error
    ref = torch.randn(2, 4097, 64, dtype=torch.float64)
    bad = ref.clone()
    bad[1, -1] = 0.0
    assert _rel_err(bad, ref) < 2e-2
    assert _worst_row_err(bad, ref) > 0.9
    assert _worst_row_err(ref + 1e-4 * torch.randn_like(ref), ref) < 1e-3


@pytest.mark.parametrize("precision", ["tf32", "tf32x3", "ieee"])
def test_fp32_precisions_are_accepted_and_others_named(precision):
    q, k, v, _ = _inputs((1, 2, 24, 16), (1, 2, 24, 16))
    out = FlashAttentionTriton.apply(q.float().to(DEVICE), k.float().to(DEVICE), v.float().to(DEVICE), True,
                                     precision)
    assert _rel_err(out, naive_attention(q, k, v, True)) < TOL[torch.float32]
    with pytest.raises(ValueError, match="tf32x3"):
        FlashAttentionTriton.apply(q.float(), k.float(), v.float(), True, "fp64")


def _compile_backend():
    return "inductor" if HAS_CUDA else "aot_eager"  # inductor on CPU would need a C++ toolchain


@pytest.mark.parametrize("causal", [False, True])
def test_compiled_apply_is_one_graph_and_equals_eager(causal):
    # the leaderboard's use: torch.compile(FlashAttentionTriton.apply); fullgraph raises on a graph break
    torch._dynamo.reset()
    q, k, v, do = _inputs((2, 2, 70, 32), (2, 2, 70, 32))
    dtype = torch.float32
    eager = _run(FlashAttentionTriton, q, k, v, do, causal, dtype)

    class Compiled:
        apply = staticmethod(torch.compile(FlashAttentionTriton.apply, fullgraph=True, backend=_compile_backend()))

    compiled = _run(Compiled, q, k, v, do, causal, dtype)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(compiled[2:], eager[2:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_custom_ops_have_fake_shapes_and_check_inputs():
    # the fake implementations are what torch.compile traces: shapes, dtypes, and the same input errors
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.empty(2, 3, 100, 32, dtype=torch.float16) for _ in range(3))
        out, lse = torch.ops.benchlab.flash_attention_fwd(q, k, v, True, "tf32")
        assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
        assert lse.shape == (2, 3, 100) and lse.dtype == torch.float32
        dq, dk, dv = torch.ops.benchlab.flash_attention_bwd(out, q, k, v, out, lse, True, "tf32")
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        with pytest.raises(ValueError, match="same shape"):
            torch.ops.benchlab.flash_attention_fwd(q, k, v[:, :, :5], True, "tf32")


def test_launch_plan_signature_tells_misaligned_views_apart():
    # a plan bakes in Triton's specialisation (16-byte-aligned pointers, strides): a view that
    # differs in either must get a plan of its own
    import kernels.flash_triton as ft

    x = torch.randn(2, 3, 64, 16)
    assert ft._signature(x[:, :, 1:]) != ft._signature(x[:, :, 2:])   # same shape and strides, offset 64 B vs 128 B
    assert ft._signature(x[:, :, 1:]) == ft._signature(x[:, :, 1:])
    assert ft._signature(x.transpose(1, 2)) != ft._signature(x.transpose(1, 2).contiguous())
    assert ft._signature(x) != ft._signature(x.double())  # a plan skips the input checks: dtype is in the key
    assert ft.LaunchOptions(pinned={"dq": ft.make_config(64, 32, 4, 2)}).key != ft.DEFAULT_OPTIONS.key
    capped = ft.LaunchOptions(pinned={"dq": ft.make_config(64, 32, 4, 2, maxnreg=128)})
    assert capped.key != ft.LaunchOptions(pinned={"dq": ft.make_config(64, 32, 4, 2)}).key


@pytest.mark.parametrize(("head_dim", "dtype", "capped_kept"), [(64, torch.bfloat16, True), (32, torch.float32, True),
                                                                 (128, torch.bfloat16, False),
                                                                 (64, torch.float32, False)])
def test_register_capped_configs_are_candidates_only_for_narrow_rows(head_dim, dtype, capped_kept):
    # the caps were measured faster at d=64 bf16 and 2x slower at d=128, where they spill
    import kernels.flash_triton as ft

    kept = ft._pruner("dkdv")(ft.DKDV_CONFIGS, {"Q": torch.empty(0, dtype=dtype)}, HEAD_DIM=head_dim)
    assert kept and any(c.maxnreg is None for c in kept)
    assert any(c.maxnreg is not None for c in kept) == capped_kept


@pytest.mark.parametrize(("kernel", "head_dim", "dtype", "dropped"), [("fwd", 128, torch.bfloat16, True),
                                                                       ("fwd", 128, torch.float16, True),
                                                                       ("fwd", 64, torch.bfloat16, False),
                                                                       ("fwd", 96, torch.bfloat16, False),
                                                                       ("dq", 128, torch.bfloat16, False)])
def test_configs_that_win_only_in_bursts_leave_the_space_where_they_were_measured(kernel, head_dim, dtype, dropped):
    # BURST_ONLY: the d=128 16-bit forward's autotuner never sees 128x64x8x3, and neither does autotune=False;
    # other kernels, head dims and dtypes keep their whole space
    import kernels.flash_triton as ft

    q = torch.empty(0, dtype=dtype)
    tiles = [ft._tile(c) for c in ft._pruner(kernel)(ft._SPACES[kernel], {"Q": q}, HEAD_DIM=head_dim)]
    assert tiles
    assert ((128, 64, 8, 3) not in tiles) == dropped
    if dropped:
        assert ft._tile(ft.first_fitting_config(kernel, q, head_dim)) != (128, 64, 8, 3)


@pytest.mark.parametrize(("shape", "causal"), [((2, 3, 45, 64), True), ((1, 2, 70, 64), False), ((3, 33, 128), True)])
def test_descriptor_loads_give_the_pointer_loads_results(shape, causal):
    # the forward and dQ kernels stream K and V, dK/dV streams Q and dO, through tensor descriptors
    # where the layout allows (zero fill past n and d instead of masks); with LaunchOptions(tma=False)
    # they keep pointer loads: the same numbers, up to the order in which the interpreter's matmul
    # sums a transposed tile (about one fp32 ulp)
    import kernels.flash_triton as ft

    q, k, v, do = (t.to(DEVICE, torch.float16) for t in _inputs(shape, shape))
    assert all(ft._tma_ready(ft._as_zhnd(t)) for t in (q, k, v, do))
    assert ft._tma_kv(ft._as_zhnd(k), ft._as_zhnd(v), ft.DEFAULT_OPTIONS)
    results = {}
    for tma in (True, False):
        opts = ft.LaunchOptions(tma=tma)
        out, lse = ft.flash_attention_forward(q, k, v, causal, options=opts)
        results[tma] = (out, lse, *ft.flash_attention_backward(q, k, v, out, lse, do, causal, options=opts))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), results[True], results[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3, msg=name)


def test_descriptor_loads_of_k_and_v_need_both_to_qualify():
    import kernels.flash_triton as ft

    k = torch.randn(2, 3, 64, 64, dtype=torch.bfloat16)
    v_rows_of_136_bytes = torch.randn(2, 3, 64, 68, dtype=torch.bfloat16)[..., :64]
    assert ft._tma_kv(k, k, ft.DEFAULT_OPTIONS)
    assert not ft._tma_kv(k, v_rows_of_136_bytes, ft.DEFAULT_OPTIONS)
    assert not ft._tma_kv(k, k, ft.LaunchOptions(tma=False))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_forward_takes_descriptor_loads_only_at_its_measured_head_dims(head_dim, monkeypatch):
    import kernels.flash_triton as ft

    flags = {}
    launch = ft._launch

    def spy(which, args, n_tensors, grid, constexprs, *rest):
        flags[which] = {k: v for k, v in constexprs.items() if k.startswith("TMA")}
        return launch(which, args, n_tensors, grid, constexprs, *rest)

    monkeypatch.setattr(ft, "_launch", spy)
    q, k, v, do = (t.to(DEVICE, torch.float16) for t in _inputs((1, 2, 40, head_dim), (1, 2, 40, head_dim)))
    out, lse = ft.flash_attention_forward(q, k, v, True)
    ft.flash_attention_backward(q, k, v, out, lse, do, True)
    assert flags["fwd"] == {"TMA_KV": head_dim in ft.TMA_FWD_HEAD_DIMS}
    assert flags["dq"] == {"TMA_KV": True}
    assert flags["dkdv"] == {"TMA_Q": True, "TMA_DO": True}


@pytest.mark.parametrize(("tuned", "kernel", "flags"), [("_fwd_tuned", "_fwd_kernel", {"TMA_KV"}),
                                                       ("_dq_tuned", "_bwd_dq_kernel", {"TMA_KV"}),
                                                       ("_dkdv_tuned", "_bwd_dkdv_kernel", {"TMA_Q", "TMA_DO"})])
def test_descriptor_and_pointer_loads_are_tuned_apart(tuned, kernel, flags):
    # one process may run both (LaunchOptions(tma=False), a stride-0 dO): each must pick its own tiles
    import kernels.flash_triton as ft

    assert flags <= set(getattr(ft, tuned).keys) <= set(getattr(ft, kernel).arg_names)


def test_a_stride0_gradient_is_copied_so_the_kernels_read_it_by_descriptor(monkeypatch):
    # o.sum().backward() hands in dO = ones expanded (all strides 0), which the copy engine cannot read
    import kernels.flash_triton as ft

    flags = []
    launch = ft._launch

    def spy(which, args, n_tensors, grid, constexprs, *rest):
        if which == "dkdv":
            flags.append((constexprs["TMA_DO"], args[3].is_contiguous()))
        return launch(which, args, n_tensors, grid, constexprs, *rest)

    monkeypatch.setattr(ft, "_launch", spy)
    q, k, v, _ = (t.to(DEVICE, torch.float16) for t in _inputs((1, 2, 40, 64), (1, 2, 40, 64)))
    work = 2 * 40 * 40 * 64 // 2  # Z*H*n_q*n_k*d, halved for causal
    grads = {}
    cases = (("descriptors", ft.LaunchOptions(copy_grad_min_work=work)),
             ("pointers", ft.LaunchOptions(tma=False, copy_grad_min_work=0)),
             ("small call", ft.LaunchOptions(copy_grad_min_work=work + 1)))
    for name, options in cases:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ft.FlashAttentionTriton.apply(*leaves, True, "tf32", options).sum().backward()
        grads[name] = [t.grad for t in leaves]
    # copied for the descriptors; left alone without them, and on a call below the size where it pays
    assert flags == [(True, True), (False, False), (False, False)]
    with pytest.raises(ValueError, match="copy_grad_min_work"):
        ft.LaunchOptions(copy_grad_min_work=-1)
    for other in ("pointers", "small call"):
        for a, b in zip(grads["descriptors"], grads[other], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


def test_the_fused_backward_is_picked_only_where_it_ships_and_nothing_pins_the_split_kernels(monkeypatch):
    # _gluon_config("fused"): SHIPPED_FUSED's config at d=64 and d=128, causal and not, with the option on and
    # neither backward kernel pinned; none at a head dim it does not ship at (the copy engine's own checks
    # stubbed, since this runs on the CPU)
    import kernels.flash_gluon_bwd as gb
    import kernels.flash_triton as ft

    monkeypatch.setattr(gb, "supported", lambda *tensors: None)
    monkeypatch.setattr(gb, "o_error", lambda o: None)
    x64, x128 = torch.zeros(1, 2, 8, 64), torch.zeros(1, 2, 8, 128)

    def pick(options, x=x64, causal=True):
        return ft._gluon_config("fused", causal, x, x, x, x, options, x)

    assert pick(ft.DEFAULT_OPTIONS) == gb.SHIPPED_FUSED[(64, True)]
    for x in (x64, x128):
        for causal in (True, False):
            assert pick(ft.DEFAULT_OPTIONS, x=x, causal=causal) == gb.SHIPPED_FUSED[(x.shape[-1], causal)]
    x32 = torch.zeros(1, 2, 8, 32)
    assert (32, True) not in gb.SHIPPED_FUSED and pick(ft.DEFAULT_OPTIONS, x=x32) is None
    assert (gb.shipped_dq_mode(64), gb.shipped_dq_mode(128)) == ("turns", "halves")
    for (head_dim, _), cfg in gb.SHIPPED_FUSED.items():
        assert gb.config_error("fused", head_dim, cfg, dq_mode=gb.shipped_dq_mode(head_dim)) is None
    dq_pin = {"dq": ft.make_config(64, 64, 4, 2)}
    for options in (ft.LaunchOptions(gluon_fused=False), ft.LaunchOptions(tma=False),
                    ft.LaunchOptions(pinned=dq_pin), ft.LaunchOptions(pinned={"dkdv": ft.make_config(64, 64, 4, 2)})):
        assert pick(options) is None, options
    assert pick(ft.LaunchOptions(pinned={"fwd": ft.make_config(64, 64, 4, 2)})) is not None
    with pytest.raises(ValueError, match="fused_min_seq"):
        ft.LaunchOptions(fused_min_seq=-1)
    assert ft.LaunchOptions(fused_min_seq=0).key != ft.DEFAULT_OPTIONS.key
    assert ft.LaunchOptions(gluon_fused=False).key != ft.DEFAULT_OPTIONS.key
    # fused_persistent (off by default) takes the same config in the persistent order, wherever it ships
    persistent = ft.LaunchOptions(fused_persistent=True)
    assert persistent.key != ft.DEFAULT_OPTIONS.key and not ft.DEFAULT_OPTIONS.fused_persistent
    for x in (x64, x128):
        for causal in (True, False):
            shipped = gb.SHIPPED_FUSED[(x.shape[-1], causal)]
            assert pick(persistent, x=x, causal=causal) == shipped._replace(order="ws-p")
    assert pick(ft.LaunchOptions(fused_persistent=True, gluon_fused=False)) is None


def test_the_backward_goes_fused_from_fused_min_seq_queries_and_keys_on(monkeypatch):
    import kernels.flash_triton as ft

    seen = []

    def fused(q, k, v, out, lse, grad_out, is_causal, cfg, group, copy_grad, key, want_plan):
        seen.append(cfg)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(ft, "_gluon_config", lambda which, *a, **kw: "cfg" if which == "fused" else None)
    monkeypatch.setattr(ft, "_fused_backward", fused)
    q, k, v, do = (t.to(DEVICE, torch.float16) for t in _inputs((1, 2, 40, 64), (1, 2, 40, 64)))
    o, lse = ft.flash_attention_forward(q, k, v, True)
    got = ft.flash_attention_backward(q, k, v, o, lse, do, True, options=ft.LaunchOptions(fused_min_seq=40))
    assert seen == ["cfg"] and all(not t.any() for t in got)
    ft.flash_attention_backward(q, k, v, o, lse, do, True, options=ft.LaunchOptions(fused_min_seq=41))
    assert seen == ["cfg"]  # 40 queries and keys fall short of it: the split kernels
    _, k2, v2, _ = (t.to(DEVICE, torch.float16) for t in _inputs((1, 2, 40, 64), (1, 2, 48, 64)))
    o2, lse2 = ft.flash_attention_forward(q, k2, v2, True)
    ft.flash_attention_backward(q, k2, v2, o2, lse2, do, True, options=ft.LaunchOptions(fused_min_seq=40))
    assert seen == ["cfg", "cfg"]  # 40 queries, 48 keys: both at least fused_min_seq
    ft.flash_attention_backward(q, k2, v2, o2, lse2, do, True, options=ft.LaunchOptions(fused_min_seq=41))
    assert seen == ["cfg", "cfg"]  # the queries fall short
    o3, lse3 = ft.flash_attention_forward(k2, q, v, True)
    ft.flash_attention_backward(k2, q, v, o3, lse3, torch.ones_like(k2), True,
                                options=ft.LaunchOptions(fused_min_seq=41))
    assert seen == ["cfg", "cfg"]  # 48 queries, but the keys fall short


def test_the_forward_asks_for_the_gluon_kernel_from_gluon_fwd_min_seq_queries_and_keys_on(monkeypatch):
    # the gate sits before _gluon_config: shorter calls never consult it and keep the Triton forward
    import kernels.flash_triton as ft

    asked = []
    monkeypatch.setattr(ft, "_gluon_config", lambda which, *a, **kw: asked.append(which))  # None: Triton runs
    q, k, v, _ = (t.to(DEVICE, torch.float16) for t in _inputs((1, 2, 40, 64), (1, 2, 48, 64)))
    with pytest.raises(ValueError, match="gluon_fwd_min_seq"):
        ft.LaunchOptions(gluon_fwd_min_seq=-1)
    assert ft.GLUON_FWD_MIN_SEQ > 48 and ft.DEFAULT_OPTIONS.gluon_fwd_min_seq == ft.GLUON_FWD_MIN_SEQ
    ft.flash_attention_forward(q, k, v, True)
    assert asked == []  # 40 queries, 48 keys: under the default gate
    ft.flash_attention_forward(q, k, v, True, options=ft.LaunchOptions(gluon_fwd_min_seq=41))
    assert asked == []  # the queries fall short
    want, _ = ft.flash_attention_forward(q, k, v, True, options=ft.LaunchOptions(gluon_fwd_min_seq=40))
    assert asked == ["fwd"]  # both at least the gate: asked, and (None here) the Triton forward ran
    torch.testing.assert_close(want, ft.flash_attention_forward(q, k, v, True)[0], rtol=0, atol=0)
    assert ft.LaunchOptions(gluon_fwd_min_seq=40).key != ft.DEFAULT_OPTIONS.key


def test_the_fused_backward_scales_the_summed_dq_and_plans_the_same_three_steps(monkeypatch):
    # _fused_backward's host side, with the Gluon kernel stood in for by one that adds 2q into the fp32
    # accumulator, its columns spread as the shipped config's staging stores leave them, and copies k, v
    # into dK, dV: dQ comes out as the zeroed-then-summed accumulator over sqrt(d), columns put back, cast to
    # q's dtype, and the remembered plan (prep, kernel, cast again) gives the same
    import kernels.flash_gluon_bwd as gb
    import kernels.flash_triton as ft

    cfg = gb.FUSED_CONFIG_WS
    assert gb.spreads_columns(64, cfg, "turns")

    def kernel(q, k, v, do, lse, delta, dk, dv, acc):
        acc += gb.spread_columns(2 * q.float().reshape(acc.shape))
        dk.copy_(k.reshape(dk.shape))
        dv.copy_(v.reshape(dv.shape))

    def launch(which, cfg, tensors, group, is_causal, q, want_plan, dq_mode="add"):
        assert which == "fused" and dq_mode == "turns"
        kernel(*tensors)
        return kernel if want_plan else None

    monkeypatch.setattr(ft, "_launch_gluon", launch)
    q, k, v, do = (t.to(DEVICE, torch.float16) for t in _inputs((1, 2, 40, 64), (1, 2, 40, 64), seed=4))
    o, lse = ft.flash_attention_forward(q, k, v, True)
    key = ("test-fused-plan",)
    want_dq = (2 * q.float() / 8).to(q.dtype)  # 1/sqrt(64)
    got = ft._fused_backward(q, k, v, o, lse, do, True, cfg, 1, False, key, True)
    for a, b in zip(got, (want_dq, k, v), strict=True):
        assert a.dtype == q.dtype and torch.equal(a, b)
    again = ft._PLANS.pop(key)(q, k, v, o, lse, do)
    for a, b in zip(again, got, strict=True):
        assert torch.equal(a, b)


def test_the_copy_decision_takes_only_a_large_stride0_gradient_beside_a_descriptor_q():
    import kernels.flash_triton as ft

    q = torch.randn(1, 2, 64, 64, dtype=torch.float16)
    ones = torch.ones((), dtype=torch.float16).expand(q.shape)  # what o.sum().backward() hands in
    work = 2 * 64 * 64 * 64  # Z*H*n_q*n_k*d
    at = ft.LaunchOptions(copy_grad_min_work=work)
    assert ft._copies_grad(q, q, ones, False, at)
    assert not ft._copies_grad(q, q, ones, True, at)  # causal halves the work
    assert not ft._copies_grad(q, q, ones.contiguous(), False, at)
    assert not ft._copies_grad(q, q, ones, False, ft.LaunchOptions(tma=False, copy_grad_min_work=0))
    assert not ft._copies_grad(q.float(), q.float(), ones.float(), False, ft.LaunchOptions(copy_grad_min_work=0))
    assert ft.DEFAULT_OPTIONS.copy_grad_min_work == ft.COPY_GRAD_MIN_WORK
    assert ft.LaunchOptions(copy_grad_min_work=0).key != ft.DEFAULT_OPTIONS.key  # plans keep the decision apart


def test_descriptor_loads_are_taken_only_where_the_layout_allows():
    import kernels.flash_triton as ft

    bf16 = torch.bfloat16
    x = torch.randn(2, 3, 64, 64, dtype=bf16)
    assert ft._tma_ready(x) and ft._tma_ready(x.transpose(1, 2).contiguous().transpose(1, 2))
    assert ft._tma_ready(torch.randn(2, 3, 40, 128, dtype=torch.float16))
    assert not ft._tma_ready(x.float())                                    # fp32 keeps pointer loads
    assert not ft._tma_ready(torch.randn(2, 3, 64, 32, dtype=bf16))        # d outside TMA_HEAD_DIMS
    assert not ft._tma_ready(x.transpose(-1, -2))                          # d is not the unit-stride axis
    assert not ft._tma_ready(torch.ones((), dtype=bf16).expand(2, 3, 64, 64))  # .sum().backward()'s dO
    assert not ft._tma_ready(torch.randn(2, 3, 64, 68, dtype=bf16)[..., :64])  # rows of 136 bytes
    assert not ft._tma_ready(torch.randn(2, 3, 4, 68, dtype=bf16)[..., :1, :64])  # so too over a single row
    assert not ft._tma_ready(torch.randn(2 * 3 * 64 * 64 + 1, dtype=bf16)[1:].view(2, 3, 64, 64))  # address
    assert ft.LaunchOptions(tma=False).key != ft.DEFAULT_OPTIONS.key


def test_a_register_cap_survives_the_autotuners_config_copies():
    import kernels.flash_triton as ft

    copied = ft._noting([ft.make_config(32, 64, 4, 3, maxnreg=128), ft.make_config(32, 64, 4, 3)], "dkdv")
    assert [c.maxnreg for c in copied] == [128, None]
    assert copied[0].kwargs == {"BLOCK_M": 32, "BLOCK_N": 64} and copied[0].pre_hook is not None


def test_the_autotuner_times_configs_through_the_heat_setting(monkeypatch):
    # with BENCHLAB_AUTOTUNE_HEAT_MS above 0 at import, every kernel's autotuner times a config with
    # _tuning_bench: Triton's own benchmarker after that many ms of back-to-back calls; at 0 (the
    # default) the autotuners keep Triton's own timing untouched
    import kernels.flash_triton as ft

    assert ft.AUTOTUNE_HEAT_MS == 0.0 and all(tuner._do_bench is None for tuner in ft._TUNED.values())
    monkeypatch.setattr(ft, "AUTOTUNE_HEAT_MS", 300.0)
    assert ft._autotune(ft._fwd, ft.FWD_CONFIGS, "fwd")._do_bench is ft._tuning_bench
    benched, heated = [], []
    active = type("Active", (), {"get_benchmarker": lambda self: lambda fn, quantiles: benched.append(quantiles)
                                  or [1.0, 0.9, 1.1]})()
    monkeypatch.setattr(ft, "_triton_driver", type("Driver", (), {"active": active})())  # a GPU's benchmarker
    monkeypatch.setattr(ft, "_run_for_ms", lambda fn, ms: heated.append(ms))
    call = object()
    monkeypatch.setattr(ft, "AUTOTUNE_HEAT_MS", 0.0)
    assert ft._tuning_bench(call, (0.5, 0.2, 0.8)) == [1.0, 0.9, 1.1] and heated == []
    monkeypatch.setattr(ft, "AUTOTUNE_HEAT_MS", 250.0)
    ft._tuning_bench(call, (0.5, 0.2, 0.8))
    assert heated == [250.0] and benched == [(0.5, 0.2, 0.8)] * 2


def test_the_heat_setting_from_the_environment_is_checked():
    import kernels.flash_triton as ft

    assert ft._heat_ms_from_env(None) == 0.0 and ft._heat_ms_from_env("") == 0.0
    assert ft._heat_ms_from_env("300") == 300.0
    for bad in ("warm", "-5", "nan"):
        with pytest.raises(ValueError, match="BENCHLAB_AUTOTUNE_HEAT_MS"):
            ft._heat_ms_from_env(bad)


def test_the_launchers_power_of_two_is_tritons():
    import triton

    import kernels.flash_triton as ft

    assert all(ft._pow2_at_least(n) == triton.next_power_of_2(n) for n in range(1, 70_000))


# ----------------------------------------------------------------------------------------------
# GPU: bf16, long sequences, unwritten elements
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def fixed_tiles():
    """One config per kernel instead of autotuning: the shape matrix compiles in seconds, not minutes."""
    import kernels.flash_triton as ft

    return with_options(ft.LaunchOptions(autotune=False))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 4, 4097, 64), (1, 2, 1000, 128), (3, 17, 16), (1, 1, 300, 256)])
def test_gpu_matrix(fixed_tiles, causal, dtype, shape):
    _check(fixed_tiles, shape, shape, causal, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_long_bf16(causal):
    _check(FlashAttentionTriton, (1, 2, 16384, 64), (1, 2, 16384, 64), causal, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("copied", [False, True])
@pytest.mark.parametrize(("shape", "causal"), [((2, 4, 1000, 64), True), ((3, 777, 128), False)])
def test_gpu_sum_backward_reads_a_stride0_gradient(shape, causal, copied):
    # o.sum().backward() (the CS336 tests' and leaderboard's call) hands backward a stride-0 dO. Calls this
    # small read it through pointers; from copy_grad_min_work up the backward copies it so its kernels read
    # it by descriptor (and at d=128 the Gluon dK/dV kernel runs). Both, on ragged tiles here, twice (the
    # second call replays the launch plan, which makes the copy itself)
    import kernels.flash_triton as ft

    options = ft.LaunchOptions(copy_grad_min_work=0) if copied else ft.DEFAULT_OPTIONS
    q, k, v, _ = _inputs(shape, shape)
    ref_dq, ref_dk, ref_dv = _reference(q, k, v, torch.ones_like(q), causal)[2:]
    for _ in range(2):
        qi, ki, vi = (t.to("cuda", torch.bfloat16).requires_grad_() for t in (q, k, v))
        FlashAttentionTriton.apply(qi, ki, vi, causal, "tf32", options).sum().backward()
        tol = 2 * TOL[torch.bfloat16]
        for name, g, ref in (("dq", qi.grad, ref_dq), ("dk", ki.grad, ref_dk), ("dv", vi.grad, ref_dv)):
            assert _rel_err(g, ref) < tol, name
            assert _worst_row_err(g, ref) < ROW_TOL * tol, f"a row of {name} is wrong"


@pytest.mark.gpu
def test_gpu_unequal_lengths_bf16(fixed_tiles):
    _check(fixed_tiles, (2, 2, 1000, 64), (2, 2, 4097, 64), True, torch.bfloat16)
    _check(fixed_tiles, (2, 2, 4097, 128), (2, 2, 1000, 128), True, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_fp32_ieee_is_tight(fixed_tiles):
    q, k, v, do = _inputs((2, 2, 300, 64), (2, 2, 300, 64))
    ref = naive_attention(q, k, v, True)
    out = FlashAttentionTriton.apply(q.float().cuda(), k.float().cuda(), v.float().cuda(), True, "ieee",
                                     fixed_tiles.options)
    assert _rel_err(out, ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["fwd", "dkdv", "dq"])
def test_gpu_every_shipped_config_is_within_tolerance_on_ragged_tiles(which):
    # autotuning may pick any config of a space on some shape: each must be right on ragged tiles
    import kernels.flash_triton as ft

    space = {"fwd": ft.FWD_CONFIGS, "dkdv": ft.DKDV_CONFIGS, "dq": ft.DQ_CONFIGS}[which]
    for cfg in space:
        pinned = with_options(ft.LaunchOptions(pinned={which: cfg}))
        _check(pinned, (2, 2, 1000, 64), (2, 2, 1000, 64), True, torch.bfloat16)
        _check(pinned, (1, 2, 333, 128), (1, 2, 333, 128), False, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 127, 4097])
def test_gpu_every_forward_config_writes_every_row_right(n):
    # poison the output (NaN), run every shipped forward config pinned, then check every row: an
    # unwritten row stays NaN, a wrongly masked partial tile shows as one row with a large error
    import kernels.flash_triton as ft

    q, k, v, _ = _inputs((2, 3, n, 64), (2, 3, n, 64))
    ref = naive_attention(q, k, v, True)
    qc, kc, vc = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
    for cfg in ft.FWD_CONFIGS:
        out = torch.full_like(qc, float("nan"))
        flash_attention_forward(qc, kc, vc, True, out=out, options=ft.LaunchOptions(pinned={"fwd": cfg}))
        assert torch.isfinite(out).all(), f"unwritten output elements with {cfg}"
        assert _worst_row_err(out, ref) < ROW_TOL * TOL[torch.bfloat16], f"a wrong row with {cfg}"


@pytest.mark.gpu
def test_gpu_fp32_tf32x3_is_near_fp32(fixed_tiles):
    q, k, v, _ = _inputs((2, 2, 300, 64), (2, 2, 300, 64))
    ref = naive_attention(q, k, v, True)
    qc, kc, vc = (t.float().cuda() for t in (q, k, v))
    errs = {p: _rel_err(FlashAttentionTriton.apply(qc, kc, vc, True, p, fixed_tiles.options), ref)
            for p in ("tf32", "tf32x3")}
    assert errs["tf32x3"] < 1e-4 < errs["tf32"], errs


@pytest.mark.gpu
@pytest.mark.parametrize("shape,causal", [((1, 16, 128, 64), True), ((2, 4, 1000, 128), False)])
def test_gpu_launch_plan_replays_the_first_call_bit_for_bit(shape, causal):
    # the first call of a signature goes through Triton and records a plan; later calls launch the
    # compiled kernels directly. Same inputs must give bit-identical outputs and gradients.
    import kernels.flash_triton as ft

    ft.clear_launch_plans()
    q, k, v, do = _inputs(shape, shape, seed=3)
    first = _run(FlashAttentionTriton, q, k, v, do, causal, torch.bfloat16)
    assert {key[0] for key in ft._PLANS} == {"fwd", "bwd"}  # both directions planned
    # with no Triton launch hooks installed, every kernel launches through the direct path
    assert all(isinstance(kernel, ft._KernelPlan) for plan in ft._PLANS.values() for kernel in plan.kernels)
    # the backward's kernels load through descriptors (16-bit, d 64 and 128): their scratch is this stream's
    assert any(kernel.scratch_bytes for kernel in ft._PLANS[next(k for k in ft._PLANS if k[0] == "bwd")].kernels)
    for _ in range(2):
        again = _run(FlashAttentionTriton, q, k, v, do, causal, torch.bfloat16)
        for a, b in zip(first[:1] + first[2:], again[:1] + again[2:], strict=True):
            assert torch.equal(a, b)
    assert torch.cuda.current_stream().cuda_stream in ft._SCRATCH  # the replays shared this stream's buffer
    # a plan skips the input checks, so inputs that differ only in what the checks look at must miss it
    qc, kc, vc = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
    with pytest.raises(TypeError, match="share a dtype"):
        FlashAttentionTriton.apply(qc, kc.half(), vc, causal)
    # a strided view of the same shape is a new signature, computed right
    _check(FlashAttentionTriton, shape, shape, causal, torch.bfloat16, prep=lambda t: t.transpose(1, 2)
           .contiguous().transpose(1, 2))


def _sm90_inputs(shape, seed, shape_k=None):
    """q, k, v, dO in bf16 on the GPU for a test of the Gluon kernels, which run on sm_90 only (else a skip);
    k and v of shape_k where given, else of q's shape."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernels run on sm_90")
    return [t.to("cuda", torch.bfloat16) for t in _inputs(shape, shape_k or shape, seed=seed)]


@pytest.mark.gpu
def test_gpu_heat_runs_the_call_back_to_back_for_about_the_time_asked():
    # _run_for_ms (BENCHLAB_AUTOTUNE_HEAT_MS): one timed call sets the count; 0 ms runs only the first two
    import kernels.flash_triton as ft

    x = torch.randn(1024, 1024, device="cuda")
    calls = []

    def call():
        calls.append(1)
        x @ x

    assert ft._run_for_ms(call, 0.0) == 0 and len(calls) == 2
    n = ft._run_for_ms(call, 50.0)
    assert n >= 1 and len(calls) == 2 + 2 + n


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "causal"), [((2, 4, 1000, 128), True), ((1, 3, 4097, 128), False),
                                               ((2, 16, 2048, 128), True), ((1, 3, 4097, 64), False),
                                               ((2, 16, 2048, 64), False)])
def test_gpu_gluon_dkdv_gives_the_triton_kernels_gradients(shape, causal):
    # on sm_90 the backward's dK/dV kernel is the Gluon one at d=128 and at d=64 non-causal. At d=128 both
    # kernels accumulate the same fp32 products in the same order (query tiles ascending, 16-wide matmul
    # steps), so the gradients are bit-identical to the Triton kernel's, on ragged tiles too, first call
    # and planned replay alike; at d=64 the autotuned Triton tile may step otherwise, so dK and dV agree
    # to rounding, every row written. The split backward throughout: from FUSED_MIN_SEQ the default is the
    # fused kernel, whose dQ adds land in any order
    import kernels.flash_triton as ft

    q, k, v, do = _sm90_inputs(shape, seed=4)
    split = ft.LaunchOptions(gluon_fused=False)
    assert ft._gluon_config("dkdv", causal, *(ft._as_zhnd(t) for t in (q, k, v, do)), split) is not None
    o, lse = flash_attention_forward(q, k, v, causal)
    ft.clear_launch_plans()
    want = ft.flash_attention_backward(q, k, v, o, lse, do, causal,
                                       options=ft.LaunchOptions(gluon_dkdv=False, gluon_fused=False))
    for _ in range(2):  # the first call (through Gluon's launcher), then the plan's direct launch
        got = ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=split)
        for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
            if shape[-1] == 128 or name == "dq":
                assert torch.equal(a, b), name
            else:
                assert torch.isfinite(a).all() and (a.float() - b.float()).abs().max().item() < 1e-2, name
    plan = ft._PLANS[next(key for key in ft._PLANS if key[0] == "bwd" and key[3] == split.key)]
    assert all(isinstance(kernel, ft._KernelPlan) for kernel in plan.kernels)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "causal"), [((2, 4, 1000, 128), True), ((1, 3, 4097, 128), False),
                                               ((2, 4, 1024, 128), True)])  # (whole key tiles: persistent)
def test_gpu_gluon_fwd_option_launches_the_gluon_forward(shape, causal):
    # LaunchOptions.gluon_fwd (on by default; here at any length) launches the Gluon forward at d=128: O and L
    # equal that kernel's own launcher's bit for bit, on the first call and the plan's replay, and stay within
    # rounding of the Triton forward's in every row (a ragged last tile included)
    import kernels.flash_gluon as fg
    import kernels.flash_triton as ft

    q, k, v, _ = _sm90_inputs(shape, seed=6)
    on = ft.LaunchOptions(gluon_fwd_min_seq=0)  # (by default it runs from GLUON_FWD_MIN_SEQ)
    cfg = fg.shipped_config(128, causal)
    assert ft._gluon_config("fwd", causal, *(ft._as_zhnd(t) for t in (q, k, v)), None, on) == cfg
    want_o, want_l = fg.flash_attention_forward(q, k, v, causal, **cfg._asdict())
    tri_o, tri_l = ft.flash_attention_forward(q, k, v, causal, options=ft.LaunchOptions(gluon_fwd=False))
    ft.clear_launch_plans()
    for _ in range(2):  # the first call (through Gluon's launcher), then the plan's direct launch
        o, lse = ft.flash_attention_forward(q, k, v, causal, options=on)
        assert torch.equal(o, want_o) and torch.equal(lse, want_l)
        row_err = (o.float() - tri_o.float()).abs().amax(dim=-1)
        assert row_err.max().item() < 1e-2 and (lse - tri_l).abs().max().item() < 1e-4
    plan = ft._PLANS[next(key for key in ft._PLANS if key[0] == "fwd" and key[3] == on.key)]
    assert all(isinstance(kernel, ft._KernelPlan) for kernel in plan.kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [(64, 64, 3, 4, "overlap"), (64, 64, 2, 4, "overlap"), (128, 64, 3, 4, "ws")])
@pytest.mark.parametrize(("shape", "causal"), [((2, 4, 1000, 128), True), ((1, 3, 4097, 128), False),
                                               ((1, 3, 4097, 64), True)])
def test_gpu_gluon_forward_with_q_in_registers_gives_its_shared_memory_modes_output(cfg, shape, causal):
    # "-rs" changes only where the score matmul reads Q from: the same products in the same order, so
    # O and L are bit for bit those of the mode without it, ragged last tiles included
    import kernels.flash_gluon as fg

    q, k, v, _ = _sm90_inputs(shape, seed=7)
    *tile, mode = cfg
    want_o, want_l = fg.flash_attention_forward(q, k, v, causal, *tile, mode=mode)
    got_o, got_l = fg.flash_attention_forward(q, k, v, causal, *tile, mode=mode + "-rs")
    assert torch.isfinite(want_o).all() and torch.equal(got_o, want_o) and torch.equal(got_l, want_l)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [(128, 128, 2, 4, "ws"), (128, 128, 3, 4, "ws"), (128, 64, 3, 4, "pingpong"),
                                 (64, 64, 3, 4, "ws")])
@pytest.mark.parametrize(("shape", "causal"), [((2, 4, 1000, 128), True), ((1, 3, 4097, 128), False),
                                               ((1, 3, 4097, 64), True), ((1, 2, 200, 128), False)])
def test_gpu_gluon_forward_with_kv_barriers_of_their_own_gives_the_shared_barriers_output(cfg, shape, causal):
    # "-kv" changes only when the producer may refill a slot: the same products in the same order, so O and
    # L are bit for bit those of the mode without it; both within rounding of the Triton forward in every
    # row (ragged last tiles, and a call of fewer key tiles than slots, included)
    import kernels.flash_gluon as fg
    import kernels.flash_triton as ft

    q, k, v, _ = _sm90_inputs(shape, seed=8)
    *tile, mode = cfg
    want_o, want_l = fg.flash_attention_forward(q, k, v, causal, *tile, mode=mode)
    got_o, got_l = fg.flash_attention_forward(q, k, v, causal, *tile, mode=mode + "-kv")
    assert torch.equal(got_o, want_o) and torch.equal(got_l, want_l)
    tri_o, tri_l = ft.flash_attention_forward(q, k, v, causal)
    row_err = (want_o.float() - tri_o.float()).abs().amax(dim=-1)
    assert row_err.max().item() < 1e-2 and (want_l - tri_l).abs().max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [(192, 128, 2, 4, "ws"), (192, 128, 4, 4, "ws-kv"), (192, 64, 4, 4, "ws")])
@pytest.mark.parametrize(("shape", "causal"), [((2, 4, 1000, 64), True), ((1, 3, 4097, 64), False),
                                               ((1, 3, 4097, 64), True), ((1, 2, 200, 64), True),
                                               ((1, 2, 130, 64), False)])
def test_gpu_gluon_forward_with_three_consumers_gives_the_triton_forwards_output_in_every_row(cfg, shape, causal):
    # 192 rows a program with 128-key tiles: the causal diagonal falls inside a key tile (_key_tiles), a
    # consumer's rows may see none of a tile's keys, a program may hold fewer rows than its consumers do;
    # every row within rounding of the Triton forward, L too
    import kernels.flash_gluon as fg
    import kernels.flash_triton as ft

    q, k, v, _ = _sm90_inputs(shape, seed=9)
    *tile, mode = cfg
    got_o, got_l = fg.flash_attention_forward(q, k, v, causal, *tile, mode=mode)
    tri_o, tri_l = ft.flash_attention_forward(q, k, v, causal)
    row_err = (got_o.float() - tri_o.float()).abs().amax(dim=-1)
    assert torch.isfinite(got_o).all() and row_err.max().item() < 1e-2
    assert (got_l - tri_l).abs().max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize(("cfg", "shape", "mode"), [
    ((128, 128, 3, 4), (4, 16, 1024, 128), "ws-p"),  # 512 query tiles: about four a program
    ((128, 128, 3, 4), (1, 2, 256, 128), "ws-p"),    # 4 tiles: most SMs get none
    ((128, 128, 3, 4), (8, 1, 640, 128), "ws-p"),    # one head a batch row
    ((192, 128, 4, 4), (3, 5, 1024, 64), "ws-p"),    # 1024 = 5 x 192 + 64: a last Q tile into the next head's rows
    ((192, 128, 4, 4), (2, 4, 4096, 64), "ws-p"),
    ((128, 128, 3, 4), (4, 16, 1024, 128), "pingpong-p"),  # the turns' rounds counted on from tile to tile
    ((128, 128, 3, 4), (3, 5, 640, 128), "pingpong-p"),
])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_persistent_forward_gives_the_one_tile_a_program_kernels_output_bit_for_bit(cfg, shape, mode, causal):
    # "ws-p" runs _ws_tile on each query tile as "ws" does, with the ring and Q's barrier running on from
    # tile to tile: the same products in the same order, so O and L are bit for bit "ws"'s; "pingpong-p" only
    # orders the two consumers' matmuls, so its O and L are "ws"'s too
    import kernels.flash_gluon as fg
    import kernels.flash_triton as ft

    q, k, v, _ = _sm90_inputs(shape, seed=10)
    views = [ft._as_zhnd(t) for t in (q, k, v)]
    assert fg.persistent_error(*views, cfg[1]) is None  # (so the persistent kernel is what runs)
    o4, lse = torch.empty_like(views[0]), torch.empty(views[0].shape[:-1], dtype=torch.float32, device="cuda")
    group = ft._head_group(causal, shape[0] * shape[1], None)
    kernel, *_, grid = fg.launch((*views, o4, lse), causal, fg.Config(*cfg, mode), group)
    assert kernel is fg._fwd_persistent_kernel and grid[0] <= torch.cuda.get_device_properties(0).multi_processor_count
    want_o, want_l = fg.flash_attention_forward(q, k, v, causal, *cfg, mode="ws")
    assert torch.isfinite(want_o).all()
    assert torch.equal(o4.view(q.shape), want_o) and torch.equal(lse.view(want_l.shape), want_l)


@pytest.mark.gpu
def test_gpu_persistent_forward_falls_back_to_one_tile_a_program_where_it_cannot_run():
    # a ragged last key tile, and q, k, v of a (b, s, h, d) layout (rows that do not flatten): "ws-p" runs "ws"
    import kernels.flash_gluon as fg
    import kernels.flash_triton as ft

    q, k, v, _ = _sm90_inputs((2, 3, 1000, 128), seed=11)
    ragged = [ft._as_zhnd(t) for t in (q, k, v)]
    assert "1000 keys" in fg.persistent_error(*ragged, 128)
    o4, lse = torch.empty_like(ragged[0]), torch.empty(ragged[0].shape[:-1], dtype=torch.float32, device="cuda")
    assert fg.launch((*ragged, o4, lse), True, fg.Config(128, 128, 3, 4, "ws-p"), 1)[0] is fg._fwd_ws_kernel
    bshd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in _sm90_inputs((2, 3, 1024, 128), seed=12)[:3]]
    assert "flatten" in fg.persistent_error(*bshd, 128)
    for args in ((q, k, v), bshd):
        want = fg.flash_attention_forward(*args, True, 128, 128, 3, 4, mode="ws")
        got = fg.flash_attention_forward(*args, True, 128, 128, 3, 4, mode="ws-p")
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "causal"), [((2, 4, 1000, 128), True), ((1, 3, 4097, 128), False)])
def test_gpu_gluon_dq_option_launches_the_gluon_dq_kernel_in_the_backward(shape, causal):
    # LaunchOptions(gluon_dq=True) launches the Gluon dQ kernel (which writes Delta too): the backward's dQ
    # equals that kernel's own launcher's bit for bit, on the first call and the plan's replay; dK and dV,
    # from its Delta, stay within rounding of the Triton-only backward's, every row written (the split
    # backward: from FUSED_MIN_SEQ the default is the fused kernel, which has no dQ kernel)
    import kernels.flash_gluon_bwd as gb
    import kernels.flash_triton as ft

    q, k, v, do = _sm90_inputs(shape, seed=5)
    on = ft.LaunchOptions(gluon_dq=True, gluon_fused=False)
    o, lse = flash_attention_forward(q, k, v, causal)
    assert ft._gluon_config("dq", causal, *(ft._as_zhnd(t) for t in (q, k, v, do)), on, ft._as_zhnd(o)) is not None
    want_dq, _ = gb.dq(q, k, v, o, do, lse, causal, gb.shipped_config("dq", 128, causal),
                       out=(torch.full_like(q, float("nan")), torch.full_like(lse, float("nan"))))
    triton_only = ft.flash_attention_backward(q, k, v, o, lse, do, causal,
                                              options=ft.LaunchOptions(gluon_dkdv=False, gluon_fused=False))
    ft.clear_launch_plans()
    for _ in range(2):  # the first call (through Gluon's launcher), then the plan's direct launch
        got = ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=on)
        assert torch.equal(got[0], want_dq)
        for name, a, b in zip(("dk", "dv"), got[1:], triton_only[1:], strict=True):
            assert torch.isfinite(a).all() and (a.float() - b.float()).abs().max().item() < 1e-2, name
    plan = ft._PLANS[next(key for key in ft._PLANS if key[0] == "bwd" and key[3] == on.key)]
    assert all(isinstance(kernel, ft._KernelPlan) for kernel in plan.kernels)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "causal", "cfg"), [((2, 4, 1000, 64), True, (32, 192, 2, 4, "ws")),
                                                      ((1, 3, 4097, 64), False, (64, 128, 2, 4, "ws")),
                                                      ((2, 3, 777, 128), True, (32, 128, 3, 4, "ws"))])
def test_gpu_warp_specialised_dkdv_gives_the_one_warpgroup_kernels_gradients_bit_for_bit(shape, causal, cfg):
    # the warp-specialised study kernel (not shipped) runs the same step on each consumer's 64 keys, so
    # on the same Delta its dK, dV equal the one-warpgroup Gluon kernel's, ragged tiles and the causal
    # consumers' skipped tiles included; written into NaN-filled tensors, an unwritten row shows
    import kernels.flash_gluon_bwd as gb

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernels run on sm_90")
    q, k, v, do = (t.to("cuda", torch.bfloat16) for t in _inputs(shape, shape, seed=8))
    o, lse = flash_attention_forward(q, k, v, causal)
    _, delta = gb.dq(q, k, v, o, do, lse, causal)
    want = gb.dkdv(q, k, v, do, lse, delta, causal, gb.Config(64, 64, 2, 4))
    got = gb.dkdv(q, k, v, do, lse, delta, causal, gb.Config(*cfg),
                  out=(torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))))
    for name, a, b in zip(("dk", "dv"), got, want, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "causal"), [((1, 3, 777, 64), True), ((2, 2, 1000, 64), False)])
@pytest.mark.parametrize("dq_mode", ["add", "red", "tma", "turns"])
def test_gpu_warp_specialised_fused_kernel_gives_the_split_backwards_gradients(shape, causal, dq_mode):
    # the warp-specialised fused study kernel (not shipped): dV bit for bit the one-warpgroup Gluon
    # kernel's (the same step on each consumer's keys); dK (from torch's Delta, not the dQ kernel's) and
    # dQ (summed over the key tiles' programs in fp32) within rounding of the split backward's, every row
    import kernels.flash_gluon_bwd as gb

    q, k, v, do = _sm90_inputs(shape, seed=9)
    o, lse = flash_attention_forward(q, k, v, causal)
    want_dq, delta = gb.dq(q, k, v, o, do, lse, causal)
    want_dk, want_dv = gb.dkdv(q, k, v, do, lse, delta, causal, gb.Config(64, 64, 2, 4))
    dq, dk, dv = gb.fused_backward(q, k, v, o, lse, do, causal, gb.Config(64, 128, 2, 4, "ws"), dq_mode=dq_mode)
    assert torch.equal(dv, want_dv)
    for got, want in ((dq, want_dq), (dk, want_dk)):
        assert torch.isfinite(got).all()
        assert (got.float() - want.float()).abs().amax(dim=-1).max().item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "dq_mode"), [
    ((4, 16, 1024, 128), "halves"),  # 512 key tiles: about four a program
    ((1, 2, 256, 128), "halves"),    # 4 key tiles: most SMs get none
    ((8, 1, 640, 128), "halves"),    # one head a batch row, 5 key tiles a head
    ((2, 4, 4096, 64), "turns"),
    ((3, 5, 1024, 64), "tma")])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_persistent_fused_backward_gives_the_one_tile_kernels_dk_dv_bit_for_bit(shape, dq_mode, causal):
    # "ws-p" runs _dkdv_ws_tile on each key tile as "ws" does, with the Q/dO ring, the dS^T parities and K/V's
    # barrier running on from tile to tile: dK and dV are the same products in the same order, so bit for bit
    # "ws"'s; dQ is summed over the key tiles' programs in another order, so within rounding, every row
    import kernels.flash_gluon_bwd as gb
    import kernels.flash_triton as ft

    q, k, v, do = _sm90_inputs(shape, seed=13)
    o, lse = flash_attention_forward(q, k, v, causal)
    cfg = gb.FUSED_CONFIG_WS._replace(order="ws-p")
    views = [ft._as_zhnd(t) for t in (q, k, v, do)]
    assert gb.persistent_error(*views, cfg) is None  # (so the persistent kernel is what runs)
    delta, acc = gb.fused_prep(o, do, gb.dq_accumulator(q, dq_mode))
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    group = ft._head_group(causal, shape[0] * shape[1], None)
    kernel, *_, grid = gb.launch("fused", (*views, lse, delta, dk.view(views[1].shape), dv.view(views[2].shape), acc),
                                 causal, cfg, group, dq_mode)
    assert kernel is gb._fused_ws_persistent_kernel
    assert grid[0] <= torch.cuda.get_device_properties(0).multi_processor_count
    want_dq, want_dk, want_dv = gb.fused_backward(q, k, v, o, lse, do, causal, gb.FUSED_CONFIG_WS, dq_mode=dq_mode)
    assert torch.isfinite(want_dk).all() and torch.isfinite(want_dv).all()
    assert torch.equal(dk, want_dk) and torch.equal(dv, want_dv)
    dq = gb.cast_dq(acc, q, gb.spreads_columns(shape[-1], cfg, dq_mode))
    assert torch.isfinite(dq).all()
    assert (dq.float() - want_dq.float()).abs().amax(dim=-1).max().item() < 1e-2
    again = gb.fused_backward(q, k, v, o, lse, do, causal, cfg, dq_mode=dq_mode)  # the launcher's own path
    assert torch.equal(again[1], want_dk) and torch.equal(again[2], want_dv)


@pytest.mark.gpu
def test_gpu_persistent_fused_backward_falls_back_to_one_tile_a_program_where_it_cannot_run():
    # ragged query and key tiles, and q, k, v, dO of a (b, s, h, d) layout: "ws-p" runs "ws"
    import kernels.flash_gluon_bwd as gb
    import kernels.flash_triton as ft

    cfg = gb.FUSED_CONFIG_WS._replace(order="ws-p")
    ragged = _sm90_inputs((2, 3, 1000, 128), seed=14)
    bshd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in _sm90_inputs((2, 3, 1024, 128), seed=15)]
    for inputs, why in ((ragged, "1000 keys"), (bshd, "flatten")):
        q, k, v, do = inputs
        assert why in gb.persistent_error(*(ft._as_zhnd(t) for t in inputs), cfg)
        o, lse = flash_attention_forward(q, k, v, True)
        want = gb.fused_backward(q, k, v, o, lse, do, True, gb.FUSED_CONFIG_WS, dq_mode="halves")
        got = gb.fused_backward(q, k, v, o, lse, do, True, cfg, dq_mode="halves")
        assert all(torch.equal(a, b) for a, b in zip(got[1:], want[1:], strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "shape_k", "causal"), [
    ((1, 3, 777, 64), None, True), ((2, 2, 1000, 64), None, False), ((1, 2, 777, 64), (1, 2, 1000, 64), True),
    ((1, 2, 777, 128), None, True), ((2, 2, 1000, 128), None, False)])
@pytest.mark.parametrize("cfg", [(32, 192, 3, 4, "ws"), (16, 192, 4, 4, "ws"), (64, 128, 3, 4, "ws"),
                                 (32, 128, 3, 4, "ws"), (16, 128, 4, 4, "ws")],
                         ids=lambda cfg: "x".join(map(str, cfg[:4])))  # -k 32x192x3x4 picks a config
def test_gpu_transposed_turns_give_the_split_backwards_gradients(shape, shape_k, causal, cfg):
    # the warp-specialised fused study kernel with dq_mode "turns-t" (dQ^T added into a transposed
    # accumulator, the consumers in turn, 16-64 query rows a step): every row of dQ, dK, dV within
    # rounding of the split backward's, ragged tiles, unequal lengths and causal skips included
    _check_fused_study_against_split(shape, shape_k, causal, cfg, "turns-t", seed=12)


def _check_fused_study_against_split(shape, shape_k, causal, cfg, dq_mode, seed, rotate=False):
    """The warp-specialised fused study kernel (flash_gluon_bwd.fused_backward) at cfg, adding dQ as dq_mode
    says: every row of dQ, dK, dV within rounding of the split backward's (skipped where the config does
    not fit this head dim)."""
    import kernels.flash_gluon_bwd as gb
    import kernels.flash_triton as ft

    q, k, v, do = _sm90_inputs(shape, seed=seed, shape_k=shape_k)
    cfg = gb.Config(*cfg)
    why = gb.config_error("fused", shape[-1], cfg, dq_mode=dq_mode)
    if why:
        pytest.skip(why)
    o, lse = flash_attention_forward(q, k, v, causal)
    want = ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=ft.LaunchOptions(gluon_fused=False))
    got = gb.fused_backward(q, k, v, o, lse, do, causal, cfg, dq_mode=dq_mode, rotate=rotate)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert torch.isfinite(a).all(), name
        assert (a.float() - b.float()).abs().amax(dim=-1).max().item() < 1e-2, name


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "shape_k", "causal"), [
    ((1, 3, 777, 64), None, True), ((2, 2, 1000, 64), None, False), ((1, 2, 777, 64), (1, 2, 1000, 64), True),
    ((2, 2, 1000, 64), (2, 2, 333, 64), True), ((1, 2, 777, 128), None, True), ((2, 2, 1000, 128), None, False),
    ((1, 2, 777, 128), (1, 2, 1000, 128), False)])
@pytest.mark.parametrize("stages", [2, 3])
def test_gpu_halves_give_the_split_backwards_gradients(shape, shape_k, causal, stages):
    # the warp-specialised fused kernel with dq_mode "halves" (each consumer adds its half of dQ's columns
    # over both consumers' keys, every tile): every row of dQ, dK, dV within rounding of the split
    # backward's, ragged tiles, unequal lengths and the causal consumers' skipped tiles included
    _check_fused_study_against_split(shape, shape_k, causal, (64, 128, stages, 4, "ws"), "halves", seed=14)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "shape_k", "causal"), [
    ((2, 2, 1000, 64), None, False), ((1, 3, 777, 64), (1, 3, 1000, 64), False),
    ((2, 2, 1000, 64), (2, 2, 333, 64), False), ((1, 3, 777, 64), None, True)])
@pytest.mark.parametrize(("dq_mode", "cfg"), [("add", (64, 128, 2, 4, "ws")), ("tma", (64, 128, 2, 4, "ws")),
                                              ("turns", (64, 128, 3, 4, "ws")), ("turns-t", (32, 192, 3, 4, "ws"))],
                         ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x[:4])))
def test_gpu_rotated_query_tiles_give_the_split_backwards_gradients(shape, shape_k, causal, dq_mode, cfg):
    # the warp-specialised fused kernel with rotate: each non-causal program takes the query tiles from its
    # own on, wrapping round (a ragged last tile then comes mid-loop); every row of dQ, dK, dV within
    # rounding of the split backward's, with more keys than queries and fewer; causal, rotate changes nothing
    _check_fused_study_against_split(shape, shape_k, causal, cfg, dq_mode, seed=13, rotate=True)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "shape_k", "causal"), [
    ((1, 3, 777, 64), None, True), ((2, 2, 1000, 64), None, True),
    ((1, 3, 777, 64), (1, 3, 1000, 64), True),  # keys past the last query
    ((2, 2, 1000, 64), (2, 2, 333, 64), True),  # queries past the last key
    ((2, 2, 1000, 64), None, False), ((1, 3, 777, 64), (1, 3, 1000, 64), False),
    ((1, 3, 777, 128), None, True), ((2, 2, 1000, 128), (2, 2, 333, 128), True),
    ((1, 3, 777, 128), (1, 3, 1000, 128), False)])
def test_gpu_shipped_fused_backward_gives_the_split_backwards_gradients_and_plans(shape, shape_k, causal,
                                                                                  monkeypatch):
    # flash_triton's backward with the fused Gluon kernel (fused_min_seq=0 takes it at any length; it ships at
    # d=64 and d=128, causal and not, and the monkeypatch keeps each case on FUSED_CONFIG_WS): every row of dQ, dK, dV
    # within rounding of the split backward's, plans made for its kernels, and the planned call the same again (dQ up to
    # the order of its fp32 adds). With more keys than queries, the causal key tiles no query sees must
    # come out zero, as the split's do
    import kernels.flash_gluon_bwd as gb
    import kernels.flash_triton as ft

    monkeypatch.setitem(gb.SHIPPED_FUSED, (shape[-1], causal), gb.FUSED_CONFIG_WS)
    q, k, v, do = _sm90_inputs(shape, seed=11, shape_k=shape_k)
    o, lse = flash_attention_forward(q, k, v, causal)
    want = ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=ft.LaunchOptions(gluon_fused=False))
    fused = ft.LaunchOptions(fused_min_seq=0)
    ft.clear_launch_plans()
    first = ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=fused)
    plan = next(p for key, p in ft._PLANS.items() if key[0] == "bwd")
    # the prep kernel, the fused kernel and, where the accumulator's columns are spread, the cast kernel (else
    # torch casts): each launched by its plan
    spread = gb.spreads_columns(shape[-1], gb.FUSED_CONFIG_WS, gb.shipped_dq_mode(shape[-1]))
    assert len(plan.kernels) == 2 + spread and all(isinstance(kernel, ft._KernelPlan) for kernel in plan.kernels)
    again = ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=fused)
    for name, a, b, c in zip(("dq", "dk", "dv"), first, again, want, strict=True):
        assert torch.isfinite(a).all(), name
        assert (a.float() - c.float()).abs().amax(dim=-1).max().item() < 1e-2, name
        assert (a.float() - b.float()).abs().max().item() <= (1e-2 if name == "dq" else 0), name


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "causal"), [
    ((1, 3, 1024, 64), True), ((2, 2, 1024, 128), False), ((2, 4, 2048, 128), True),
    ((1, 2, 1000, 128), True)])  # ragged tiles: the one-tile kernel runs
def test_gpu_fused_persistent_option_gives_the_shipped_backwards_dk_dv_bit_for_bit_and_plans(shape, causal):
    # LaunchOptions(fused_persistent=True): the fused kernel in its order ws-p through flash_triton's backward,
    # on the first call and the plan's replay: dK and dV bit for bit the shipped (ws) backward's, dQ within
    # rounding, every row; the plan launches the prep, the persistent kernel and (spread columns) the cast
    import kernels.flash_gluon_bwd as gb
    import kernels.flash_triton as ft

    q, k, v, do = _sm90_inputs(shape, seed=16)
    o, lse = flash_attention_forward(q, k, v, causal)
    shipped = ft.LaunchOptions(fused_min_seq=0)
    want = ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=shipped)
    on = ft.LaunchOptions(fused_min_seq=0, fused_persistent=True)
    ft.clear_launch_plans()
    for _ in range(2):
        got = ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=on)
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        assert torch.isfinite(got[0]).all()
        assert (got[0].float() - want[0].float()).abs().amax(dim=-1).max().item() < 1e-2
    plan = ft._PLANS[next(key for key in ft._PLANS if key[0] == "bwd" and key[3] == on.key)]
    spread = gb.spreads_columns(shape[-1], gb.FUSED_CONFIG_WS, gb.shipped_dq_mode(shape[-1]))
    assert len(plan.kernels) == 2 + spread and all(isinstance(kernel, ft._KernelPlan) for kernel in plan.kernels)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "causal"), [
    ((2, 8, 512, 64), True), ((2, 4, 512, 128), True),  # d=128: the Gluon dK/dV kernel
    ((1, 2, 4096, 128), True),  # the persistent forward (its tile schedule) and the fused backward, as shipped
    ((1, 2, 4096, 128), False), ((1, 2, 4096, 64), False)])  # the persistent forward, as shipped
def test_gpu_forward_and_backward_capture_into_a_cuda_graph(shape, causal):
    # a captured step replays on new inputs to what an eager step gives them: bit for bit, but the fused
    # backward's dQ, whose fp32 adds land in any order (within rounding then)
    import kernels.flash_triton as ft

    fused = shape[2] >= ft.FUSED_MIN_SEQ  # (as many keys as queries)
    q, k, v, do = (t.to("cuda", torch.bfloat16) for t in _inputs(shape, shape, seed=5))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def step():
        q.grad = k.grad = v.grad = None
        out = FlashAttentionTriton.apply(q, k, v, causal)
        out.backward(do)
        return out

    side = torch.cuda.Stream()  # warm up (compile, autotune, plans) off the capture, as graphs require
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    static_grads = (q.grad, k.grad, v.grad)
    for seed in (6, 7):  # new inputs copied into the captured tensors, then replayed
        nq, nk, nv, ndo = (t.to("cuda", torch.bfloat16) for t in _inputs(shape, shape, seed=seed))
        with torch.no_grad():
            q.copy_(nq), k.copy_(nk), v.copy_(nv), do.copy_(ndo)
        graph.replay()
        torch.cuda.synchronize()
        want = _run(FlashAttentionTriton, nq.double().cpu(), nk.double().cpu(), nv.double().cpu(),
                    ndo.double().cpu(), causal, torch.bfloat16)
        assert torch.equal(static_out, want[0])
        for name, got, ref in zip(("dq", "dk", "dv"), static_grads, want[2:], strict=True):
            if fused and name == "dq":
                torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)
            else:
                assert torch.equal(got, ref), name


@pytest.mark.gpu
def test_gpu_model_with_flash_compiles_as_one_graph_under_inductor():
    from kernels.model import TransformerLM, cross_entropy

    torch.manual_seed(0)
    m = TransformerLM(256, 64, 128, 2, 4, 256, attention="flash_triton").cuda()
    ids = torch.randint(0, 256, (2, 64), device="cuda")
    want = m(ids)
    compiled = torch.compile(m, fullgraph=True)
    got = compiled(ids)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    cross_entropy(got, ids).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def _recording_compiled(calls: list, scratch_size: int = 0, **launcher_attrs):
    """A stand-in for a Triton 3.6 compiled kernel whose launcher records what it is called with."""
    from types import SimpleNamespace

    def launch(*args):
        calls.append(("direct", args))

    attrs = dict(launch=launch, launch_cooperative_grid=0, launch_pdl=0, num_ctas=1,
                 global_scratch_size=scratch_size, global_scratch_align=128, profile_scratch_size=0)
    attrs.update(launcher_attrs)

    class Compiled:
        function, packed_metadata = "fn", "meta"
        run = SimpleNamespace(**attrs)

        def _init_handles(self):
            pass

        def __getitem__(self, grid):
            return lambda *args: calls.append(("wrapper", grid, args))

    return Compiled()


def _plan_for(compiled):
    """A kernel plan over a two-tensor kernel with a (cdiv(100, BLOCK_M), 3) grid, tiles (64, 32), on device 5."""
    from types import SimpleNamespace

    import triton

    import kernels.flash_triton as ft

    jit_fn = SimpleNamespace(arg_names=["Q", "O", "n_q", "n_k", "HEAD_DIM", "BLOCK_D", "BLOCK_M", "BLOCK_N",
                                        "EVEN_M", "EVEN_N", "EVEN_D"])
    q, o = torch.zeros(1), torch.zeros(1)
    return ft._kernel_plan(jit_fn, compiled, (q, o, 100, 96), 2, {"HEAD_DIM": 64, "BLOCK_D": 64},
                           (64, 32), lambda meta: (triton.cdiv(100, meta["BLOCK_M"]), 3), 5)


_PLAN_FIXED = (100, 96, 64, 64, 64, 32, False, True, True)  # scalars, then constexprs with the EVEN_* rules applied


def test_a_kernel_plan_hands_the_c_launcher_addresses_and_the_fixed_rest(monkeypatch):
    # the direct path's argument order (Triton 3.6's C launch function: grid, stream, function, the two
    # launch flags, global and profile scratch, metadata, launch metadata, two hooks, then every
    # parameter in signature order) only runs on a GPU host; here a recording stand-in checks it
    from triton import knobs

    import kernels.flash_triton as ft

    calls = []
    monkeypatch.setattr(ft, "_current_stream", lambda device: f"stream{device}")
    plan = _plan_for(_recording_compiled(calls))
    assert isinstance(plan, ft._KernelPlan)
    q2, o2 = torch.ones(1), torch.ones(1)
    plan(q2, o2)
    # tensors go in as integer addresses; no descriptors, so no scratch
    assert calls[-1] == ("direct", (2, 3, 1, "stream5", "fn", 0, 0, None, None, "meta", None, None, None,
                                    q2.data_ptr(), o2.data_ptr(), *_PLAN_FIXED))

    hook = lambda *a: None  # noqa: E731 (a profiler's launch hook)
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        plan = _plan_for(_recording_compiled(calls))  # with a hook the plan keeps Triton's wrapper, which calls it
        plan(q2, o2)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert calls[-1] == ("wrapper", (2, 3, 1), (q2, o2, *_PLAN_FIXED))


def test_a_kernel_plan_fills_only_the_tile_parameters_a_kernel_has(monkeypatch):
    # the warp-specialised Gluon forward takes BLOCK_N but no BLOCK_M (two consumers of 64 rows set it), so
    # the plan's tiles must not add a parameter the kernel lacks (that made it give up on a plan)
    from types import SimpleNamespace

    import kernels.flash_triton as ft

    calls = []
    monkeypatch.setattr(ft, "_current_stream", lambda device: 9)
    jit_fn = SimpleNamespace(arg_names=["Q", "O", "n_q", "HEAD_DIM", "BLOCK_N", "CONSUMERS"])
    q, o = torch.zeros(1), torch.zeros(1)
    plan = ft._kernel_plan(jit_fn, _recording_compiled(calls), (q, o, 100), 2, {"HEAD_DIM": 128, "BLOCK_N": 128,
                                                                               "CONSUMERS": 2}, (128, 128), (1, 4), 0)
    assert isinstance(plan, ft._KernelPlan)
    plan(q, o)
    assert calls[-1][1][-4:] == (100, 128, 128, 2)  # n_q, then the constexprs in signature order


def test_a_kernel_plan_hands_a_fixed_tensor_over_as_its_address_and_keeps_it(monkeypatch):
    # the persistent forward's tile schedule is a tensor among the fixed arguments: the C side gets its address,
    # as it gets the call's tensors', and the plan holds the tensor so the address stays valid
    from types import SimpleNamespace

    import kernels.flash_triton as ft

    calls = []
    monkeypatch.setattr(ft, "_current_stream", lambda device: 3)
    jit_fn = SimpleNamespace(arg_names=["Q", "O", "n_q", "SCHEDULE", "HEAD_DIM"])
    q, o, table = torch.zeros(1), torch.zeros(1), torch.arange(5, dtype=torch.int32)
    plan = ft._kernel_plan(jit_fn, _recording_compiled(calls), (q, o, 100, table), 2, {"HEAD_DIM": 128}, (128, 128),
                           (1, 1), 0)
    address = table.data_ptr()
    del table
    plan(q, o)
    assert calls[-1][1][-3:] == (100, address, 128)
    assert [t.data_ptr() for t in plan.keep] == [address]


def test_a_kernel_plan_gives_a_descriptor_kernel_scratch_for_every_program(monkeypatch):
    import kernels.flash_triton as ft

    calls, asked = [], []
    monkeypatch.setattr(ft, "_current_stream", lambda device: 77)
    monkeypatch.setattr(ft, "_stream_scratch", lambda device, stream, nbytes: asked.append((device, stream, nbytes))
                        or 4096)
    plan = _plan_for(_recording_compiled(calls, scratch_size=256, num_ctas=1))
    plan(torch.ones(1), torch.ones(1))
    assert asked == [(5, 77, 2 * 3 * 256)]  # grid (2, 3, 1), 256 bytes a program
    assert calls[-1][1][7] == 4096  # the scratch address, in the global-scratch slot


@pytest.mark.parametrize("attrs,missing", [(dict(profile_scratch_size=64), None),
                                           (dict(scratch_size=256, global_scratch_align=1024), None),
                                           ({}, "launch_pdl")])
def test_a_kernel_plan_keeps_tritons_wrapper_where_the_launcher_is_not_the_one_it_knows(attrs, missing):
    # profiler scratch, a scratch alignment the caching allocator does not promise, or a launcher of
    # another shape (another Triton)
    import kernels.flash_triton as ft

    calls = []
    compiled = _recording_compiled(calls, **attrs)
    if missing:
        delattr(compiled.run, missing)
    plan = _plan_for(compiled)
    assert not isinstance(plan, ft._KernelPlan)
    q2, o2 = torch.ones(1), torch.ones(1)
    plan(q2, o2)
    assert calls[-1] == ("wrapper", (2, 3, 1), (q2, o2, *_PLAN_FIXED))


def test_stream_scratch_is_shared_per_stream_grown_on_demand_and_fresh_under_capture(monkeypatch):
    import kernels.flash_triton as ft

    made = []

    def fake_empty(n, dtype, device):
        made.append((n, device))
        return torch.zeros(n, dtype=dtype)

    monkeypatch.setattr(ft, "_SCRATCH", {})
    monkeypatch.setattr(ft.torch, "empty", fake_empty)
    monkeypatch.setattr(ft, "_capturing", lambda: False)
    a = ft._stream_scratch(0, 11, 512)
    assert ft._stream_scratch(0, 11, 256) == a  # a smaller launch on the same stream reuses the buffer
    b = ft._stream_scratch(0, 22, 256)  # another stream gets its own
    c = ft._stream_scratch(0, 11, 1024)  # a larger launch grows the stream's buffer
    assert ft._stream_scratch(0, 11, 1024) == c
    assert made == [(512, "cuda:0"), (256, "cuda:0"), (1024, "cuda:0")] and len({a, b, c}) == 3
    monkeypatch.setattr(ft, "_capturing", lambda: True)
    fresh = ft._stream_scratch(0, 11, 256)
    assert isinstance(fresh, torch.Tensor) and made[-1] == (256, "cuda:0")  # its own block, kept by the graph's pool
    assert ft._SCRATCH[11].numel() == 1024  # and the stream's buffer untouched
