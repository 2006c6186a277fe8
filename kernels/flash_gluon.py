"""FlashAttention-2 forward in Gluon for Hopper (sm_90): kernels/flash_triton.py's forward at d=128.

Why a second forward. Triton 3.6 places the waits of a kernel's matmuls itself: right after a score
matmul whose result feeds elementwise work it waits for every outstanding matmul, so the softmax of
one tile never runs while the tensor cores work on the P V of the tile before (docs/results/h200/
flash_tuning.md, steps 17, 22 and 28). Gluon, Triton's lower-level language, leaves the layouts, the
shared-memory buffers, the copy engine's barriers and the matmul waits to the kernel. This forward
uses that for FlashAttention-3's overlap inside a warpgroup: per key tile t,

    issue  S(t) = Q K(t)^T                     (async wgmma)
    issue  O += P(t-1) V(t-1)                  (async wgmma, P from registers)
    wait until only the P V is in flight      -> S(t)
    softmax of S(t) on the CUDA cores          (while the tensor cores finish P V)
    wait for the P V, rescale O by exp2(m_old - m_new)

K and V come through tensor descriptors into a ring of STAGES shared-memory slots, each with an
mbarrier the copy engine signals. Two kernels run that loop:

  _fwd_kernel     every warp of the program computes; slot t % STAGES is refilled with tile
                  t - 1 + STAGES once the block is done with tile t - 1 (a block barrier first when
                  the program has two warpgroups, which both read every tile); OVERLAP=False runs the
                  plain order instead (S, softmax, P V, each matmul waited for at once)
  _fwd_ws_kernel  warp-specialised as FA-3 is: a producer warp issues every copy, one to three consumer
                  warpgroups of 64 rows (240 registers each for one or two, 160 for three) run the loop
                  on their own and release slots through mbarriers, PINGPONG makes two take turns to
                  issue their matmuls, and SPLIT_KV gives K and V slots barriers of their own, so K(t)'s
                  slot refills once S(t) is done
  _fwd_persistent_kernel  the same producer and consumers in one program an SM, each taking query tile
                  after query tile, the next tile's Q and K/V loaded under the last one's final P V

The warp-specialised kernel with 128-key tiles is what flash_triton's forward launches (SHIPPED_FWD, the
persistent one for non-causal calls): at d=128 two consumers and three slots, which under sustained load
on an H100 ran 1.10x-1.14x the Triton forward, 0.95x-1.08x cuDNN's (docs/results/h100/gluon_paths/
README.md); at d=64 three consumers (192 rows a program, FA-3's d=64 forward) and four slots, 1.03x-1.14x
the Triton forward and 1.01x-1.11x cuDNN's from seq 8192 (docs/results/h100/fwd_d64/README.md), where two
consumers had been slower than the Triton forward. Persistent, non-causal calls at seq 4096 ran 1.01x-1.05x
that (docs/results/h100/persistent/README.md). The other configs and modes are studies: within about 10 %
of the Triton forward at d=128 and slower at d=64 (docs/results/h200/flash_gluon/README.md). Their helpers
(layouts, program tiles, the K/V ring and its refill) serve kernels/flash_gluon_bwd.py too, whose kernels
the backward launches at d=128.

Same contract as kernels/flash_triton.py's forward: (Z, H, n, d) views with their own strides (unit
stride along d, 16-byte aligned rows), causal aligned top-left, O in the input dtype, L = natural-log
logsumexp (fp32). 16-bit inputs, d in HEAD_DIMS, on sm_90; there is no interpreter for Gluon, so only a
GPU runs it (CPU tests compile it for sm_90: tests/kernels/test_flash_gluon.py).
"""
from __future__ import annotations

import functools
import heapq
import itertools
import math
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernels import flash_triton as ft
from kernels.names import GLUON_KV_SUFFIX, GLUON_MODES, GLUON_PERSISTENT_SUFFIX, GLUON_RS_SUFFIX

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
# a barrier across the block's warps: thread_barrier in Triton 3.6 (the GPU image), barrier in 3.7
_block_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@constexpr_function
def _mma_layout(num_warps, n):
    """The wgmma accumulator layout of an (M, n) tile: warps stacked along the rows, 16 a warp per
    instruction, N the whole tile."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _program_tile(H, IS_CAUSAL: gl.constexpr):
    """(query tile, z*h pair, z, h) of this program: the grid and order of the Triton kernels
    (kernels.flash_triton._program_ids, (G, tiles, ZH / G)), the heaviest causal tile first."""
    pid_m = gl.program_id(1)
    pid_zh = gl.program_id(2) * gl.num_programs(0) + gl.program_id(0)
    if IS_CAUSAL:
        pid_m = gl.num_programs(1) - 1 - pid_m
    return pid_m, pid_zh, pid_zh // H, pid_zh % H


@gluon.jit
def _descriptors(Q, K, V, z, h, stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                 stride_vz, stride_vh, stride_vn, n_q, n_k, HEAD_DIM: gl.constexpr, Q_ROWS: gl.constexpr,
                 BLOCK_N: gl.constexpr, q_layout: gl.constexpr, kv_layout: gl.constexpr):
    """Tensor descriptors of this (z, h)'s Q (Q_ROWS-row tiles), K and V (BLOCK_N-row tiles); the copy
    engine fills rows past n_q or n_k with zeros."""
    q_desc = tma.make_tensor_descriptor(Q + z.to(gl.int64) * stride_qz + h.to(gl.int64) * stride_qh,
                                        shape=[n_q, HEAD_DIM], strides=[stride_qm, 1],
                                        block_shape=[Q_ROWS, HEAD_DIM], layout=q_layout)
    k_desc = tma.make_tensor_descriptor(K + z.to(gl.int64) * stride_kz + h.to(gl.int64) * stride_kh,
                                        shape=[n_k, HEAD_DIM], strides=[stride_kn, 1],
                                        block_shape=[BLOCK_N, HEAD_DIM], layout=kv_layout)
    v_desc = tma.make_tensor_descriptor(V + z.to(gl.int64) * stride_vz + h.to(gl.int64) * stride_vh,
                                        shape=[n_k, HEAD_DIM], strides=[stride_vn, 1],
                                        block_shape=[BLOCK_N, HEAD_DIM], layout=kv_layout)
    return q_desc, k_desc, v_desc


@gluon.jit
def _key_tiles(start_m, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(n_iter, hi_unmasked): the program visits key tiles [0, n_iter), and those from hi_unmasked on
    cross the causal diagonal or the ragged end (masked). Causal, the first masked tile is the one holding
    key start_m: with 192 rows and 128-key tiles (three consumers), start_m = 192 falls inside tile 1."""
    n_full = (n_k // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi = gl.minimum(start_m + BLOCK_M, n_k)
        hi_unmasked = gl.minimum(start_m // BLOCK_N * BLOCK_N, n_full)
    else:
        hi = n_k
        hi_unmasked = n_full
    return gl.cdiv(hi, BLOCK_N), hi_unmasked


@gluon.jit
def _mask_scores(s, start_m, start_n, n_k, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """-inf where key start_n + j is past n_k or (causal) right of query start_m + i."""
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    keep = gl.expand_dims(offs_n < n_k, 0)
    if IS_CAUSAL:
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        keep = keep & (gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1))
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _online_softmax(s, m_i, l_i, start_n, start_m, n_k, hi_unmasked, qk_scale, IS_CAUSAL: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """One key tile's step of the online softmax on raw scores s (masked from hi_unmasked on):
    returns (P, the rescale exp2(m_old - m_new) of what was summed before, and the new m and l).
    m is in log2 units of the scaled scores, as in the Triton forward."""
    if start_n >= hi_unmasked:
        s = _mask_scores(s, start_m, start_n, n_k, IS_CAUSAL, BLOCK_M, BLOCK_N, s_layout)
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _q_operand(q_smem, IN_REGISTERS: gl.constexpr, s_layout: gl.constexpr):
    """Q as the A operand of S = Q K^T: loaded once into registers (the "-rs" modes), so each score
    matmul reads only K from shared memory, or left in shared memory. At 64 keys a step both operands
    in shared memory take 128 B a clock (2 KB + 2 KB in the 32 clocks of a 64 x 64 x 16 block), all an
    SM has; Q in registers costs HEAD_DIM / 4 registers a thread (32 at d=128)."""
    if IN_REGISTERS:
        return q_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    else:
        return q_smem


@gluon.jit
def _my_turn(turn_bars, rnd, WHICH: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait until the other consumer has issued its matmuls of round rnd - 1 (consumer 0)
    or rnd (consumer 1). turn_bars[c] completes a phase each time the other consumer hands over, and a
    fresh mbarrier counts its phase "-1" as complete, so consumer 0 goes first."""
    if PINGPONG:
        mbarrier.wait(turn_bars.index(WHICH), (rnd & 1) ^ (1 - WHICH))


@gluon.jit
def _their_turn(turn_bars, WHICH: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn_bars.index(1 - WHICH), count=1)


@gluon.jit
def _first_tile(q_tile, k_tile, first_row, n_k, hi_unmasked, qk_scale, turn_bars, IS_CAUSAL: gl.constexpr,
                ROWS: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr, WHICH: gl.constexpr,
                PINGPONG: gl.constexpr, rnd=0):
    """Key tile 0 of the overlapped loop: its scores, waited for at once, and the softmax state
    (P, m, l). Causal rows all see key 0, so every row's m is finite from here on. rnd: the ping-pong
    round of this matmul (_my_turn)."""
    _my_turn(turn_bars, rnd, WHICH, PINGPONG)
    s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
                      use_acc=False)
    _their_turn(turn_bars, WHICH, PINGPONG)
    if hi_unmasked <= 0:
        s = _mask_scores(s, first_row, 0, n_k, IS_CAUSAL, ROWS, BLOCK_N, s_layout)
    m_i = gl.max(s, axis=1) * qk_scale
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
    return p, m_i, gl.sum(p, axis=1)


@gluon.jit
def _overlapped_step(q_tile, k_tile, v_prev, p, acc, m_i, l_i, start_n, first_row, n_k, hi_unmasked, qk_scale,
                     turn_bars, rnd, IS_CAUSAL: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                     s_layout: gl.constexpr, o_layout: gl.constexpr, WHICH: gl.constexpr, PINGPONG: gl.constexpr,
                     k_free=None, RELEASE_K: gl.constexpr = False):
    """Key tile t of the overlapped loop (k_tile = K(t), v_prev = V(t-1), p = P(t-1)): issue S(t) and
    P(t-1) V(t-1), wait for S(t) alone, run its softmax while the P V finishes, then wait for the P V
    and rescale. RELEASE_K: arrive at k_free as soon as S(t) is done, so K(t)'s slot refills while the
    softmax runs. Returns (P(t), O, m, l)."""
    p_op = gl.convert_layout(p.to(q_tile.dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    _my_turn(turn_bars, rnd, WHICH, PINGPONG)
    s_tok = warpgroup_mma(q_tile, k_tile.permute((1, 0)), gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
                          use_acc=False, is_async=True)
    o_tok = warpgroup_mma(p_op, v_prev, acc, is_async=True)
    _their_turn(turn_bars, WHICH, PINGPONG)
    s = warpgroup_mma_wait(1, deps=[s_tok])  # S(t) is done; P(t-1) V(t-1) may still run
    if RELEASE_K:
        mbarrier.arrive(k_free, count=1)
    p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, start_n, first_row, n_k, hi_unmasked, qk_scale,
                                         IS_CAUSAL, ROWS, BLOCK_N, s_layout)
    acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return p, acc, m_i, l_i


@gluon.jit
def _pv(p, v_tile, acc, o_layout: gl.constexpr):
    """O += P V, waited for at once."""
    p_op = gl.convert_layout(p.to(v_tile.dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    return warpgroup_mma(p_op, v_tile, acc)


@gluon.jit
def _finish(acc, m_i, l_i, o_layout: gl.constexpr):
    """(O = acc / l, L = logsumexp in natural log: (m + log2 l) ln 2)."""
    out = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    return out, (m_i + gl.log2(l_i)) * 0.6931471805599453


@gluon.jit
def _kv_ring(dtype: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
             layout: gl.constexpr):
    """STAGES shared-memory slots for K tiles and as many for V, each slot with its own initialised
    mbarrier (count 1) that the copy engine completes: (k_smem, v_smem, k_bars, v_bars)."""
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], layout)
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    return k_smem, v_smem, k_bars, v_bars


@gluon.jit
def _refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, slot, tile, n_iter, kv_bytes: gl.constexpr,
            BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr):
    """Start the copy of key tile `tile` (if there is one) into `slot`, whose tile this warpgroup has used.

    With one warpgroup (4 warps) the matmul waits before this were the whole block's; with two, the
    other warpgroup may still read the slot, so a block barrier comes first."""
    if NUM_WARPS > 4:
        _block_barrier()
    mbarrier.expect(k_bars.index(slot), kv_bytes, pred=tile < n_iter)
    tma.async_copy_global_to_shared(k_desc, [tile * BLOCK_N, 0], k_bars.index(slot), k_smem.index(slot),
                                    pred=tile < n_iter)
    mbarrier.expect(v_bars.index(slot), kv_bytes, pred=tile < n_iter)
    tma.async_copy_global_to_shared(v_desc, [tile * BLOCK_N, 0], v_bars.index(slot), v_smem.index(slot),
                                    pred=tile < n_iter)


@gluon.jit
def _fwd_kernel(Q, K, V, O, L,
                stride_qz, stride_qh, stride_qm,
                stride_kz, stride_kh, stride_kn,
                stride_vz, stride_vh, stride_vn,
                stride_oz, stride_oh, stride_om,
                H, n_q, n_k, qk_scale,
                IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, OVERLAP: gl.constexpr, Q_REGS: gl.constexpr):
    pid_m, pid_zh, z, h = _program_tile(H, IS_CAUSAL)
    start_m = pid_m * BLOCK_M
    dtype: gl.constexpr = Q.dtype.element_ty
    s_layout: gl.constexpr = _mma_layout(NUM_WARPS, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(NUM_WARPS, HEAD_DIM)
    q_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_desc, k_desc, v_desc = _descriptors(Q, K, V, z, h, stride_qz, stride_qh, stride_qm, stride_kz, stride_kh,
                                          stride_kn, stride_vz, stride_vh, stride_vn, n_q, n_k, HEAD_DIM, BLOCK_M,
                                          BLOCK_N, q_smem_layout, kv_smem_layout)
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_smem_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    k_smem, v_smem, k_bars, v_bars = _kv_ring(dtype, STAGES, BLOCK_N, HEAD_DIM, kv_smem_layout)
    n_iter, hi_unmasked = _key_tiles(start_m, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)

    # the copy engine starts on Q and the first STAGES key tiles
    kv_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    mbarrier.expect(q_bar, BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8)
    tma.async_copy_global_to_shared(q_desc, [start_m, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        mbarrier.expect(k_bars.index(i), kv_bytes, pred=i < n_iter)
        tma.async_copy_global_to_shared(k_desc, [i * BLOCK_N, 0], k_bars.index(i), k_smem.index(i), pred=i < n_iter)
        mbarrier.expect(v_bars.index(i), kv_bytes, pred=i < n_iter)
        tma.async_copy_global_to_shared(v_desc, [i * BLOCK_N, 0], v_bars.index(i), v_smem.index(i), pred=i < n_iter)

    mbarrier.wait(q_bar, 0)
    q_a = _q_operand(q_smem, Q_REGS, s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    if OVERLAP:
        mbarrier.wait(k_bars.index(0), 0)
        # (no ping-pong here: k_bars stands in for the turn barriers, which PINGPONG=False never touches)
        p, m_i, l_i = _first_tile(q_a, k_smem.index(0), start_m, n_k, hi_unmasked, qk_scale, k_bars,
                                  IS_CAUSAL, BLOCK_M, BLOCK_N, s_layout, 0, False)
        for t in range(1, n_iter):
            prev = (t - 1) % STAGES
            mbarrier.wait(k_bars.index(t % STAGES), (t // STAGES) & 1)
            mbarrier.wait(v_bars.index(prev), ((t - 1) // STAGES) & 1)
            p, acc, m_i, l_i = _overlapped_step(q_a, k_smem.index(t % STAGES), v_smem.index(prev), p, acc, m_i,
                                                l_i, t * BLOCK_N, start_m, n_k, hi_unmasked, qk_scale, k_bars, t,
                                                IS_CAUSAL, BLOCK_M, BLOCK_N, s_layout, o_layout, 0, False)
            _refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, prev, t - 1 + STAGES, n_iter, kv_bytes,
                    BLOCK_N, NUM_WARPS)
        last = (n_iter - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((n_iter - 1) // STAGES) & 1)
        acc = _pv(p, v_smem.index(last), acc, o_layout)
    else:
        # the plain order, for comparison: each tile's S, softmax, then P V, every matmul waited at once
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
        for t in range(0, n_iter):
            slot = t % STAGES
            mbarrier.wait(k_bars.index(slot), (t // STAGES) & 1)
            s = warpgroup_mma(q_a, k_smem.index(slot).permute((1, 0)),
                              gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False)
            p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, t * BLOCK_N, start_m, n_k, hi_unmasked, qk_scale,
                                                 IS_CAUSAL, BLOCK_M, BLOCK_N, s_layout)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            mbarrier.wait(v_bars.index(slot), (t // STAGES) & 1)
            acc = _pv(p, v_smem.index(slot), acc, o_layout)
            _refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, slot, t + STAGES, n_iter, kv_bytes,
                    BLOCK_N, NUM_WARPS)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    out, lse = _finish(acc, m_i, l_i, o_layout)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(L + pid_zh.to(gl.int64) * n_q + offs_m, lse, mask=offs_m < n_q)
    # O through Q's slot (every matmul that read it has finished); the copy engine clips rows past n_q
    o_desc = tma.make_tensor_descriptor(O + z.to(gl.int64) * stride_oz + h.to(gl.int64) * stride_oh,
                                        shape=[n_q, HEAD_DIM], strides=[stride_om, 1],
                                        block_shape=[BLOCK_M, HEAD_DIM], layout=q_smem_layout)
    _block_barrier()
    q_smem.store(out.to(dtype))
    fence_async_shared()
    _block_barrier()
    tma.async_copy_shared_to_global(o_desc, [start_m, 0], q_smem)
    tma.store_wait(0)


# ----------------------------------------------------------------------------------------------
# warp-specialised: a producer warp and one or two consumer warpgroups
# ----------------------------------------------------------------------------------------------
# FA-3's layout of a program: a producer warp issues every copy, and each consumer warpgroup owns
# WG_ROWS query rows and runs the overlapped loop on its own, sharing the K and V slots. A slot has a
# "ready" mbarrier, which the copy engine completes, and an "empty" one, which each consumer arrives
# at once it is done with the slot's tile (count = CONSUMERS). An arrive is executed by one thread of
# its partition, so each consumer partition is exactly one warpgroup, whose matmul waits are that
# whole warpgroup's. The consumers never wait for each other (unless PINGPONG), so one's softmax can
# run while the other's matmuls do.
WG_ROWS = 64  # query rows a consumer warpgroup owns: one wgmma's M
# The warp-specialised kernel is one program an SM whatever its tiles, so it may take nearly all of the
# 227 KiB a block can have (Q and three 128-key K/V slots at d=128: 224 KiB); 1 KiB is left for the
# mbarriers. The other kernels keep flash_triton's SMEM_BUDGET.
WS_SMEM_BUDGET = 226 * 1024


@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, start_m, n_iter,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, SPLIT_KV: gl.constexpr):
    """The producer: each consumer's Q rows once, then K and V tile by tile, each into its slot once every
    consumer has released the slot's previous tile (a fresh mbarrier counts its phase "-1" as complete)."""
    rows: gl.constexpr = q_desc.block_type.shape[0]
    mbarrier.expect(q_bar, CONSUMERS * q_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(q_desc, [start_m + c * rows, 0], q_bar, q_smem.index(c))
    if SPLIT_KV:
        _ws_stream_kv(k_desc, v_desc, k_smem, v_smem, ready_bars, empty_bars, n_iter, BLOCK_N, STAGES)
    else:
        _ws_stream(k_desc, v_desc, k_smem, v_smem, ready_bars, empty_bars, 0, n_iter, BLOCK_N, STAGES)


@gluon.jit
def _kv_bar(bars, slot, IS_V: gl.constexpr, STAGES: gl.constexpr, SPLIT_KV: gl.constexpr):
    """The mbarrier of a slot's K tile (IS_V False) or V tile: one for both, or with SPLIT_KV the V
    tiles' barriers after the STAGES of the K tiles'."""
    if SPLIT_KV and IS_V:
        return bars.index(STAGES + slot)
    else:
        return bars.index(slot)


@gluon.jit
def _ws_put(desc, row, smem, ready, empty, t, STAGES: gl.constexpr):
    """Tile t of a stream (rows [row, + its block)) into its slot `smem` once the consumers have released
    the slot's previous tile (`empty`; a fresh mbarrier counts its phase "-1" as complete); the copy
    engine completes `ready`."""
    mbarrier.wait(empty, ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [row, 0], ready, smem)


@gluon.jit
def _ws_stream_kv(k_desc, v_desc, k_smem, v_smem, ready_bars, empty_bars, n_iter, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr):
    """The forward's producer with K and V slots of their own (SPLIT_KV, FA-3's two pipelines): K(t),
    then V(t-1), in the order the overlapped loop uses them. A K slot is free once its scores are done, a
    V slot once its P V is, so each refills about a step sooner than a slot holding both."""
    for t in range(n_iter + 1):  # (one more turn for the last V)
        if t < n_iter:
            slot = t % STAGES
            _ws_put(k_desc, t * BLOCK_N, k_smem.index(slot), _kv_bar(ready_bars, slot, False, STAGES, True),
                    _kv_bar(empty_bars, slot, False, STAGES, True), t, STAGES)
        if t > 0:
            prev = (t - 1) % STAGES
            _ws_put(v_desc, (t - 1) * BLOCK_N, v_smem.index(prev), _kv_bar(ready_bars, prev, True, STAGES, True),
                    _kv_bar(empty_bars, prev, True, STAGES, True), t - 1, STAGES)


@gluon.jit
def _tile_row(t, first_row, shift, n_iter, ROWS: gl.constexpr, ROTATE: gl.constexpr):
    """The first row of the t-th of a program's n_iter tiles (t up to n_iter): first_row + t * ROWS, or with
    ROTATE the tiles taken from tile `shift` on, wrapping round at n_iter."""
    if ROTATE:
        t = (t + shift) % n_iter
    return first_row + t * ROWS


@gluon.jit
def _ws_stream(a_desc, b_desc, a_smem, b_smem, ready_bars, empty_bars, first_row, n_iter, ROWS: gl.constexpr,
               STAGES: gl.constexpr, shift=0, ROTATE: gl.constexpr = False, base=0):
    """A producer's stream: tile t (rows _tile_row(t, ...) of both tensors: first_row + t * ROWS unless
    ROTATE) into slot (base + t) % STAGES once every consumer has released the slot's previous tile (a fresh
    mbarrier counts its phase "-1" as complete); the copy engine completes the slot's ready barrier. base:
    the ring's tiles before this stream's (a persistent program's earlier query tiles)."""
    for t in range(n_iter):
        slot = (base + t) % STAGES
        mbarrier.wait(empty_bars.index(slot), (((base + t) // STAGES) & 1) ^ 1)
        ready = ready_bars.index(slot)
        mbarrier.expect(ready, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        row = _tile_row(t, first_row, shift, n_iter, ROWS, ROTATE)
        tma.async_copy_global_to_shared(a_desc, [row, 0], ready, a_smem.index(slot))
        tma.async_copy_global_to_shared(b_desc, [row, 0], ready, b_smem.index(slot))


@gluon.jit
def _ws_consumer(q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, turn_bars, O, stride_om, L, start_m, n_q, n_k,
                 n_iter, qk_scale, IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, Q_REGS: gl.constexpr,
                 SPLIT_KV: gl.constexpr, WHICH: gl.constexpr):
    """Consumer warpgroup WHICH of a program that takes one query tile (_ws_tile: its first Q, its first
    n_iter ring slots)."""
    _ws_tile(q_smem, k_smem, v_smem, q_bar, 0, None, ready_bars, empty_bars, turn_bars, O, stride_om, L, start_m,
             n_q, n_k, n_iter, 0, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_N, STAGES, PINGPONG, Q_REGS, SPLIT_KV, WHICH)


@gluon.jit
def _ws_tile(q_smem, k_smem, v_smem, q_bar, j, q_free, ready_bars, empty_bars, turn_bars, O, stride_om, L,
             start_m, n_q, n_k, n_iter, base, qk_scale, IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, Q_REGS: gl.constexpr,
             SPLIT_KV: gl.constexpr, WHICH: gl.constexpr):
    """Consumer warpgroup WHICH on one query tile: rows [start_m + WHICH * WG_ROWS, + WG_ROWS) through the key
    tiles they see (n_mine below), in the overlapped order; O and L to global memory (O, L: this (z, h)'s
    bases). It is the program's tile j (from 0): its Q is q_bar's phase j & 1, and its key tiles the ring's
    tiles base, base + 1, ... (slot (base + t) % STAGES); q_free (the persistent kernel's; None otherwise) is
    arrived at once its Q is read for the last time. PINGPONG: the two consumers take turns to issue their
    matmuls (_my_turn), so one's softmax runs under the other's. A tile takes n_iter + 1 rounds of turns (key
    tile t's matmuls, then the last P V), so the rounds count on from tile to tile: rnd0 + t, rnd0 = base + j.
    SPLIT_KV: K and V tiles have barriers of their own (_kv_bar), and K(t)'s slot is released as soon as S(t)
    is done, V(t-1)'s once P(t-1) V(t-1) is; otherwise one barrier a slot, released after the P V."""
    rows: gl.constexpr = q_smem.type.shape[1]
    # three consumers have 160 registers each (WS_CONSUMER_REGS): P is carried to the next step's P V in
    # 16 bits (64 x 128 scores: 32 registers a thread, not 64), beside S (64) and O (32 at d=64)
    NARROW_P: gl.constexpr = q_smem.type.shape[0] > 2
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(4, HEAD_DIM)
    first_row = start_m + WHICH * rows
    # The program's tiles [0, n_iter) are every consumer's; this one computes [0, n_mine), masking its own
    # rows' diagonal from hi_unmasked on. Causal, its rows see no key past that diagonal (with 192 rows and
    # 128-key tiles the program's last tile can lie wholly past consumer 0's), and a consumer whose rows
    # all lie past n_q computes nothing. It releases the tiles it skips unread, after its own, as the
    # producer refills a slot only once every consumer has. Ping-pong keeps the two consumers on every
    # tile in turns.
    n_mine, hi_unmasked = _key_tiles(first_row, n_k, rows, BLOCK_N, IS_CAUSAL)
    if PINGPONG:
        n_mine = n_iter
    else:
        n_mine = gl.where(first_row < n_q, n_mine, 0)

    rnd0 = base + j
    mbarrier.wait(q_bar, j & 1)
    if n_mine > 0:
        q_mine = _q_operand(q_smem.index(WHICH), Q_REGS, s_layout)
        mbarrier.wait(ready_bars.index(base % STAGES), (base // STAGES) & 1)  # (K's barrier either way)
        p, m_i, l_i = _first_tile(q_mine, k_smem.index(base % STAGES), first_row, n_k, hi_unmasked, qk_scale, turn_bars,
                                  IS_CAUSAL, rows, BLOCK_N, s_layout, WHICH, PINGPONG, rnd0)
        if NARROW_P:
            p = p.to(q_smem.dtype)
        if SPLIT_KV:
            mbarrier.arrive(empty_bars.index(base % STAGES), count=1)
        acc = gl.zeros([rows, HEAD_DIM], gl.float32, o_layout)
        for t in range(1, n_mine):
            r = base + t  # the ring's count of this tile
            prev = (r - 1) % STAGES
            mbarrier.wait(ready_bars.index(r % STAGES), (r // STAGES) & 1)
            if SPLIT_KV:
                mbarrier.wait(_kv_bar(ready_bars, prev, True, STAGES, True), ((r - 1) // STAGES) & 1)
            p, acc, m_i, l_i = _overlapped_step(q_mine, k_smem.index(r % STAGES), v_smem.index(prev), p, acc, m_i, l_i,
                                                t * BLOCK_N, first_row, n_k, hi_unmasked, qk_scale, turn_bars, rnd0 + t,
                                                IS_CAUSAL, rows, BLOCK_N, s_layout, o_layout, WHICH, PINGPONG,
                                                empty_bars.index(r % STAGES), SPLIT_KV)
            if NARROW_P:
                p = p.to(q_smem.dtype)
            # this warpgroup is done with tile t-1's V (and its K, where one barrier serves both)
            mbarrier.arrive(_kv_bar(empty_bars, prev, True, STAGES, SPLIT_KV), count=1)
        if q_free is not None:  # every score matmul has read Q: the next tile's may come in
            mbarrier.arrive(q_free, count=1)
        last = (base + n_mine - 1) % STAGES
        if SPLIT_KV:
            mbarrier.wait(_kv_bar(ready_bars, last, True, STAGES, True), ((base + n_mine - 1) // STAGES) & 1)
        _my_turn(turn_bars, rnd0 + n_mine, WHICH, PINGPONG)
        acc = _pv(p, v_smem.index(last), acc, o_layout)
        _their_turn(turn_bars, WHICH, PINGPONG)
        mbarrier.arrive(_kv_bar(empty_bars, last, True, STAGES, SPLIT_KV), count=1)

        out, lse = _finish(acc, m_i, l_i, o_layout)
        offs_m = first_row + gl.arange(0, rows, layout=gl.SliceLayout(1, s_layout))
        gl.store(L + offs_m, lse, mask=offs_m < n_q)
        offs_om = first_row + gl.arange(0, rows, layout=gl.SliceLayout(1, o_layout))
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        o_ptrs = O + gl.expand_dims(offs_om.to(gl.int64) * stride_om, 1) + gl.expand_dims(offs_d, 0)
        gl.store(o_ptrs, out.to(q_smem.dtype), mask=gl.expand_dims(offs_om < n_q, 1))
    else:
        if q_free is not None:
            mbarrier.arrive(q_free, count=1)
    for t in range(base + n_mine, base + n_iter):  # past this consumer's rows: wait for each, release it unread
        mbarrier.wait(ready_bars.index(t % STAGES), (t // STAGES) & 1)
        mbarrier.arrive(empty_bars.index(t % STAGES), count=1)
        if SPLIT_KV:
            mbarrier.wait(_kv_bar(ready_bars, t % STAGES, True, STAGES, True), (t // STAGES) & 1)
            mbarrier.arrive(_kv_bar(empty_bars, t % STAGES, True, STAGES, True), count=1)


@gluon.jit
def _fwd_ws_kernel(Q, K, V, O, L,
                   stride_qz, stride_qh, stride_qm,
                   stride_kz, stride_kh, stride_kn,
                   stride_vz, stride_vh, stride_vn,
                   stride_oz, stride_oh, stride_om,
                   H, n_q, n_k, qk_scale,
                   IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   PINGPONG: gl.constexpr, Q_REGS: gl.constexpr, SPLIT_KV: gl.constexpr):
    pid_m, pid_zh, z, h = _program_tile(H, IS_CAUSAL)
    rows: gl.constexpr = 64  # WG_ROWS
    BLOCK_M: gl.constexpr = CONSUMERS * rows
    start_m = pid_m * BLOCK_M
    dtype: gl.constexpr = Q.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([rows, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_desc, k_desc, v_desc = _descriptors(Q, K, V, z, h, stride_qz, stride_qh, stride_qm, stride_kz, stride_kh,
                                          stride_kn, stride_vz, stride_vh, stride_vn, n_q, n_k, HEAD_DIM, rows,
                                          BLOCK_N, q_layout, kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, rows, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    n_bars: gl.constexpr = 2 * STAGES if SPLIT_KV else STAGES  # (_kv_bar)
    ready_bars = gl.allocate_shared_memory(gl.int64, [n_bars, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [n_bars, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(turn_bars.index(0), count=1)
    mbarrier.init(turn_bars.index(1), count=1)
    for i in gl.static_range(n_bars):
        mbarrier.init(ready_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=CONSUMERS)

    # the producer streams the block's key tiles; each consumer takes those its rows see (_ws_consumer)
    n_iter, _ = _key_tiles(start_m, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    o_base = O + z.to(gl.int64) * stride_oz + h.to(gl.int64) * stride_oh
    l_base = L + pid_zh.to(gl.int64) * n_q
    # (the argument tuples are written out in the call: a tuple kept in a variable loses its constexprs)
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_ws_consumer, (q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, turn_bars, o_base, stride_om,
                            l_base, start_m, n_q, n_k, n_iter, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_N,
                            STAGES, PINGPONG, Q_REGS, SPLIT_KV, 0)),
            (_ws_consumer, (q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, turn_bars, o_base, stride_om,
                            l_base, start_m, n_q, n_k, n_iter, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_N,
                            STAGES, PINGPONG, Q_REGS, SPLIT_KV, 1)),
            (_ws_consumer, (q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, turn_bars, o_base, stride_om,
                            l_base, start_m, n_q, n_k, n_iter, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_N,
                            STAGES, PINGPONG, Q_REGS, SPLIT_KV, 2)),
            (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, start_m,
                          n_iter, BLOCK_N, STAGES, CONSUMERS, SPLIT_KV))], [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, 24])
    elif CONSUMERS == 2:
        gl.warp_specialize([
            (_ws_consumer, (q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, turn_bars, o_base, stride_om,
                            l_base, start_m, n_q, n_k, n_iter, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_N,
                            STAGES, PINGPONG, Q_REGS, SPLIT_KV, 0)),
            (_ws_consumer, (q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, turn_bars, o_base, stride_om,
                            l_base, start_m, n_q, n_k, n_iter, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_N,
                            STAGES, PINGPONG, Q_REGS, SPLIT_KV, 1)),
            (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, start_m,
                          n_iter, BLOCK_N, STAGES, CONSUMERS, SPLIT_KV))], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (_ws_consumer, (q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, turn_bars, o_base, stride_om,
                            l_base, start_m, n_q, n_k, n_iter, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_N,
                            STAGES, PINGPONG, Q_REGS, SPLIT_KV, 0)),
            (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready_bars, empty_bars, start_m,
                          n_iter, BLOCK_N, STAGES, CONSUMERS, SPLIT_KV))], [1], [24])


# ----------------------------------------------------------------------------------------------
# persistent: one program an SM, which takes query tile after query tile
# ----------------------------------------------------------------------------------------------
# The warp-specialised kernel above is one program a query tile, and one program an SM fits (at d=128, Q
# and three 128-key slots: 224 KiB). Between two programs the SM's tensor cores idle: the last tile's
# P V, O's stores, the program's exit and the next one's start (barriers, descriptors, Q and the first K
# in flight, the first scores). Persistent, the producer loads the next tile's Q and K as soon as the
# consumers have read the last Q and freed ring slots, under their last P V and stores. Which tiles a
# program takes, and in what order, is a table made on the host (tile_schedule): by and large the
# non-persistent grid's tiles in its launch order (the heaviest causal tiles first), each to the program that
# would be free first, as the hardware hands a grid's programs to SMs.
@gluon.jit
def _schedule_tile(tile, G, T, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(z*h pair, first query row, key tiles) of the tile-th program of the grid (G, T, ZH / G) in launch
    order (x fastest), as _program_tile reads its program ids (launch_order_costs on the host); what the
    producer and each consumer work out alike for every tile they take."""
    pid_m = (tile // G) % T
    if IS_CAUSAL:
        pid_m = T - 1 - pid_m
    start_m = pid_m * BLOCK_M
    n_iter, _ = _key_tiles(start_m, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    return tile // (G * T) * G + tile % G, start_m, n_iter


@gluon.jit
def _matrix_descriptor(X, rows, stride_row, ROWS: gl.constexpr, COLS: gl.constexpr, layout: gl.constexpr):
    """A tensor descriptor of X's first `rows` rows of COLS elements as one matrix (a persistent kernel's view
    of every (z, h) pair's rows at once), in ROWS-row tiles."""
    return tma.make_tensor_descriptor(X, shape=[rows, COLS], strides=[stride_row, 1], block_shape=[ROWS, COLS],
                                      layout=layout)


@gluon.jit
def _scheduled_tiles(SCHEDULE):
    """(this program's tiles in tile_schedule's table, where they start and end there): a persistent program
    runs tile gl.load(tiles + i) for i in range(first, end), its producer and consumers alike."""
    tiles = SCHEDULE + gl.num_programs(0) + 1
    return tiles, gl.load(SCHEDULE + gl.program_id(0)), gl.load(SCHEDULE + gl.program_id(0) + 1)


@gluon.jit
def _ws_loader_persistent(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, ready_bars, empty_bars,
                          n_q, n_k, SCHEDULE, G, IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The producer of the persistent kernel: per query tile, its Q rows once every consumer has read the
    last tile's (q_free), then its K and V tiles through the ring, which runs on from tile to tile. The
    descriptors span every (z, h) pair's rows (rows zh * n + i)."""
    rows: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = CONSUMERS * rows
    T = gl.cdiv(n_q, BLOCK_M)
    base = 0
    j = 0
    tiles, first, end = _scheduled_tiles(SCHEDULE)
    for i in range(first, end):
        pid_zh, start_m, n_iter = _schedule_tile(gl.load(tiles + i), G, T, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        mbarrier.wait(q_free, (j & 1) ^ 1)
        mbarrier.expect(q_bar, CONSUMERS * q_desc.block_type.nbytes)
        for c in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(q_desc, [pid_zh * n_q + start_m + c * rows, 0], q_bar, q_smem.index(c))
        _ws_stream(k_desc, v_desc, k_smem, v_smem, ready_bars, empty_bars, pid_zh * n_k, n_iter, BLOCK_N, STAGES,
                   base=base)
        base += n_iter
        j += 1


@gluon.jit
def _ws_consumer_persistent(q_smem, k_smem, v_smem, q_bar, q_free, ready_bars, empty_bars, turn_bars, O, stride_oz,
                            stride_oh, stride_om, L, H, n_q, n_k, SCHEDULE, G, qk_scale, IS_CAUSAL: gl.constexpr,
                            HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                            PINGPONG: gl.constexpr, Q_REGS: gl.constexpr, WHICH: gl.constexpr):
    """Consumer warpgroup WHICH of the persistent kernel: _ws_tile on each of the program's query tiles, in
    the order the producer loads them (with PINGPONG, their turns counted on from tile to tile: _ws_tile)."""
    rows: gl.constexpr = q_smem.type.shape[1]
    BLOCK_M: gl.constexpr = q_smem.type.shape[0] * rows
    T = gl.cdiv(n_q, BLOCK_M)
    base = 0
    j = 0
    tiles, first, end = _scheduled_tiles(SCHEDULE)
    for i in range(first, end):
        pid_zh, start_m, n_iter = _schedule_tile(gl.load(tiles + i), G, T, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        z, h = pid_zh // H, pid_zh % H
        o_base = O + z.to(gl.int64) * stride_oz + h.to(gl.int64) * stride_oh
        _ws_tile(q_smem, k_smem, v_smem, q_bar, j, q_free, ready_bars, empty_bars, turn_bars, o_base, stride_om,
                 L + pid_zh.to(gl.int64) * n_q, start_m, n_q, n_k, n_iter, base, qk_scale, IS_CAUSAL, HEAD_DIM,
                 BLOCK_N, STAGES, PINGPONG, Q_REGS, False, WHICH)
        base += n_iter
        j += 1


@gluon.jit
def _fwd_persistent_kernel(Q, K, V, O, L,
                           stride_qz, stride_qh, stride_qm,
                           stride_kz, stride_kh, stride_kn,
                           stride_vz, stride_vh, stride_vn,
                           stride_oz, stride_oh, stride_om,
                           H, n_q, n_k, qk_scale, n_zh, group, SCHEDULE,
                           IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                           STAGES: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                           PINGPONG: gl.constexpr, Q_REGS: gl.constexpr):
    # _fwd_ws_kernel's arguments, then the (z, h) pairs, the grid order's group and the int32 tile schedule
    # (tile_schedule: where each program's tiles start in it, then the tiles); a grid of at most one program an
    # SM. Q, K and V rows are read as one (n_zh * n, HEAD_DIM) matrix each (persistent_error: their (z, h) pairs
    # lie n rows apart, and key tiles end at n_k, so no tile reads another pair's keys)
    rows: gl.constexpr = 64  # WG_ROWS
    dtype: gl.constexpr = Q.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([rows, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_desc = _matrix_descriptor(Q, n_zh * n_q, stride_qm, rows, HEAD_DIM, q_layout)
    k_desc = _matrix_descriptor(K, n_zh * n_k, stride_kn, BLOCK_N, HEAD_DIM, kv_layout)
    v_desc = _matrix_descriptor(V, n_zh * n_k, stride_vn, BLOCK_N, HEAD_DIM, kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, rows, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_free, count=CONSUMERS)
    if PINGPONG:
        turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(turn_bars.index(0), count=1)
        mbarrier.init(turn_bars.index(1), count=1)
    else:  # ready_bars stands in for the turn barriers, which PINGPONG=False never touches
        turn_bars = ready_bars
    for i in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=CONSUMERS)
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_ws_consumer_persistent, (q_smem, k_smem, v_smem, q_bar, q_free, ready_bars, empty_bars, turn_bars, O,
                                       stride_oz, stride_oh, stride_om, L, H, n_q, n_k, SCHEDULE, group, qk_scale,
                                       IS_CAUSAL, HEAD_DIM, BLOCK_N, STAGES, PINGPONG, Q_REGS, 0)),
            (_ws_consumer_persistent, (q_smem, k_smem, v_smem, q_bar, q_free, ready_bars, empty_bars, turn_bars, O,
                                       stride_oz, stride_oh, stride_om, L, H, n_q, n_k, SCHEDULE, group, qk_scale,
                                       IS_CAUSAL, HEAD_DIM, BLOCK_N, STAGES, PINGPONG, Q_REGS, 1)),
            (_ws_consumer_persistent, (q_smem, k_smem, v_smem, q_bar, q_free, ready_bars, empty_bars, turn_bars, O,
                                       stride_oz, stride_oh, stride_om, L, H, n_q, n_k, SCHEDULE, group, qk_scale,
                                       IS_CAUSAL, HEAD_DIM, BLOCK_N, STAGES, PINGPONG, Q_REGS, 2)),
            (_ws_loader_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, ready_bars,
                                     empty_bars, n_q, n_k, SCHEDULE, group, IS_CAUSAL, BLOCK_N, STAGES, CONSUMERS))],
            [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (_ws_consumer_persistent, (q_smem, k_smem, v_smem, q_bar, q_free, ready_bars, empty_bars, turn_bars, O,
                                       stride_oz, stride_oh, stride_om, L, H, n_q, n_k, SCHEDULE, group, qk_scale,
                                       IS_CAUSAL, HEAD_DIM, BLOCK_N, STAGES, PINGPONG, Q_REGS, 0)),
            (_ws_consumer_persistent, (q_smem, k_smem, v_smem, q_bar, q_free, ready_bars, empty_bars, turn_bars, O,
                                       stride_oz, stride_oh, stride_om, L, H, n_q, n_k, SCHEDULE, group, qk_scale,
                                       IS_CAUSAL, HEAD_DIM, BLOCK_N, STAGES, PINGPONG, Q_REGS, 1)),
            (_ws_loader_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, ready_bars,
                                     empty_bars, n_q, n_k, SCHEDULE, group, IS_CAUSAL, BLOCK_N, STAGES, CONSUMERS))],
            [4, 1], [CONSUMER_REGS, 24])


def config_error(head_dim: int, block_m: int, block_n: int, stages: int, num_warps: int, elem: int = 2,
                 warp_specialized: bool = False) -> str | None:
    """Why (block_m, block_n, stages, num_warps) cannot run at this head dim, or None if it can.
    Warp-specialised: block_m is WG_ROWS per consumer warpgroup (64, 128 or 192 rows), num_warps 4 (each's),
    and block_n 64 or 128 whatever the rows (each consumer masks its own rows; _key_tiles)."""
    if warp_specialized:
        rows = tuple(c * WG_ROWS for c in WS_MAXNREG)
        if num_warps != 4 or block_m not in rows:
            return (f"warp-specialised config {block_m} rows, {num_warps} warps: one to {len(rows)} consumer "
                    f"warpgroups of {WG_ROWS} rows and 4 warps each ({', '.join(map(str, rows))} rows, num_warps 4)")
        if block_n not in (64, 128):
            return f"block_n {block_n}: 64 or 128 keys a step for the warp-specialised kernel"
    elif num_warps not in (4, 8):
        return f"num_warps {num_warps}: the kernel takes 4 or 8 (one or two warpgroups)"
    if block_m % (16 * num_warps) or block_m > 256:
        return f"block_m {block_m}: a multiple of 16 x num_warps ({16 * num_warps}) up to 256"
    if block_n not in (32, 64, 128, 256) or (block_m % block_n and not warp_specialized):
        return f"block_n {block_n}: 32, 64, 128 or 256, dividing block_m {block_m}"
    if stages < 2:
        return f"stages {stages}: at least 2 (a slot is refilled only after its tile is used)"
    smem = (block_m + 2 * stages * block_n) * head_dim * elem
    budget = WS_SMEM_BUDGET if warp_specialized else ft.SMEM_BUDGET
    if smem > budget:
        return f"{smem} bytes of shared memory for Q and {stages} K/V slots, over {budget}"
    return None


def supported(*tensors: torch.Tensor, what: str = "the Gluon forward", names: str = "q, k and v") -> str | None:
    """Why `what` cannot take these tensors (q first; `names` names them), or None if it can (after
    flash_triton's own input checks): 16-bit, d in HEAD_DIMS, on sm_90, every tensor read by the copy engine."""
    q = tensors[0]
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype}: {what} takes fp16 and bf16"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]}: {what} takes {', '.join(map(str, HEAD_DIMS))}"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return f"{what} runs on sm_90 (Hopper) only"
    if not all(ft._tma_ready(ft._as_zhnd(t)) for t in tensors):
        return f"{names} need unit stride along d and 16-byte aligned rows (tensor descriptors)"
    return None


# registers a thread: with two consumers the block has 12 warps (the producer's warpgroup counted whole),
# so 168 each fills the register file (12 x 32 x 168 = 64,512 of 65,536); the producer gives back all
# but 24 and the consumers take the rest, 240 as in FA-3 (2 x 128 x 240 + 128 x 24 = 64,512). At 232
# the 128-key consumer at d=128 spilled 24 B a thread; at 240 it holds S, P and O with none
# (flash_sass --gluon 128,128,2,4,ws --head-dim 128). One consumer: 128, so two programs fit on an SM.
# Three (FA-3's forward at d=64: 192 rows a program): 16 warps, 128 each; the consumers take 160
# (3 x 128 x 160 + 128 x 24 = 64,512).
WS_MAXNREG = {1: 128, 2: 168, 3: 128}
WS_CONSUMER_REGS = {1: 240, 2: 240, 3: 160}  # (one consumer: the default partition, which keeps WS_MAXNREG)


def _check_mode(mode: str) -> None:
    if mode not in GLUON_MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(GLUON_MODES)}")


def launch_spec(head_dim: int, block_m: int, block_n: int, stages: int, num_warps: int, mode: str):
    """(kernel, its config's constexprs, launch options) for a config and mode (GLUON_MODES), or
    ValueError naming what is wrong with them. The launcher and benchmarks/flash_sass.py both use it.

    "overlap" is FA-3's order in each warpgroup of the program, "plain" each tile's S, softmax and P V
    in turn, "ws" the warp-specialised kernel (a producer warp and block_m / WG_ROWS consumer
    warpgroups), "pingpong" that with two consumers taking turns to issue their matmuls. Each with the
    "-rs" suffix holds Q in registers as the A operand of S = Q K^T (_q_operand); "ws-kv" and
    "pingpong-kv" give K and V tiles barriers of their own (SPLIT_KV, _ws_stream_kv); "ws-p" and "pingpong-p"
    are "ws" and "pingpong" persistent (_fwd_persistent_kernel), which launch runs where persistent_error allows
    and otherwise runs the mode without "-p"."""
    _check_mode(mode)
    persistent = mode.endswith(GLUON_PERSISTENT_SUFFIX)
    mode = mode.removesuffix(GLUON_PERSISTENT_SUFFIX)
    q_regs = mode.endswith(GLUON_RS_SUFFIX)
    mode = mode.removesuffix(GLUON_RS_SUFFIX)
    split_kv = mode.endswith(GLUON_KV_SUFFIX)
    mode = mode.removesuffix(GLUON_KV_SUFFIX)
    warp_specialized = mode in ("ws", "pingpong")
    why = config_error(head_dim, block_m, block_n, stages, num_warps, warp_specialized=warp_specialized)
    if not why and mode == "pingpong" and block_m != 2 * WG_ROWS:
        why = f"pingpong takes two consumer warpgroups: block_m {2 * WG_ROWS}, got {block_m}"
    if not why and persistent and block_m == WG_ROWS:
        why = (f"ws{GLUON_PERSISTENT_SUFFIX} takes two or three consumer warpgroups: block_m {2 * WG_ROWS} or "
               f"{3 * WG_ROWS}")
    if why:
        raise ValueError(why)
    if persistent:
        consumers = block_m // WG_ROWS
        return (_fwd_persistent_kernel,
                dict(BLOCK_N=block_n, STAGES=stages, CONSUMERS=consumers, CONSUMER_REGS=WS_CONSUMER_REGS[consumers],
                     PINGPONG=mode == "pingpong", Q_REGS=q_regs),
                {"num_warps": 4, "maxnreg": WS_MAXNREG[consumers]})
    if warp_specialized:
        consumers = block_m // WG_ROWS
        return (_fwd_ws_kernel,
                dict(BLOCK_N=block_n, STAGES=stages, CONSUMERS=consumers, CONSUMER_REGS=WS_CONSUMER_REGS[consumers],
                     PINGPONG=mode == "pingpong", Q_REGS=q_regs, SPLIT_KV=split_kv),
                {"num_warps": 4, "maxnreg": WS_MAXNREG[consumers]})
    return (_fwd_kernel,
            dict(BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, NUM_WARPS=num_warps, OVERLAP=mode == "overlap",
                 Q_REGS=q_regs),
            {"num_warps": num_warps})


class Config(NamedTuple):
    """A forward config: block_m query rows a program (WG_ROWS a consumer warpgroup in "ws" and
    "pingpong"), block_n key rows a step, stages K/V slots, num_warps, and the mode (GLUON_MODES)."""

    block_m: int = 64
    block_n: int = 64
    stages: int = 3
    num_warps: int = 4
    mode: str = "overlap"


# (head dim, causal) -> the config flash_triton's forward launches this kernel at (LaunchOptions.gluon_fwd):
# two warp-specialised consumers of 64 rows, 128-key tiles, three K/V slots (what WS_SMEM_BUDGET and 240
# registers a consumer allow). Under sustained load on an H100, in one rotation with the Triton forward and a
# second copy of it, 1.10x-1.14x the Triton forward and 0.95x-1.08x cuDNN's on four d=128 shapes of seq
# 4096-16384 (docs/results/h100/gluon_paths/README.md, "The d=128 forward with three slots, and the fused
# backward at d=128 in halves").
FWD_CONFIG_WS = Config(128, 128, 3, 4, "ws")
# d=64: three consumers of 64 rows (192 a program, FA-3's forward at d=64), 128-key tiles, four K/V slots at
# 160 registers a consumer. Under sustained load on an H100, in one rotation with the Triton forward, a second
# copy of it and cuDNN: 1.03x-1.14x the Triton forward from seq 4096, 1.01x-1.11x cuDNN's from seq 8192. Causal
# at 4096 it ran 0.956x until each consumer stopped at its own diagonal (_ws_consumer), then 1.036x
# (docs/results/h100/fwd_d64/README.md).
FWD_CONFIG_WS_D64 = Config(192, 128, 4, 4, "ws")
# Non-causal, both persistent ("ws-p"): under sustained load on an H100 (three rounds of 300 ms, in one rotation
# with "ws", two leases), 1.023x and 1.013x "ws" at (4, 16, 4096, 128), 1.043x and 1.046x at (4, 32, 4096, 64);
# at seq 8192 and 16384 within that method's spread. Causal at d=128 too, since its tiles come from
# tile_schedule: 1.031x "ws" at (4, 16, 4096, 128) and 1.013x at (2, 16, 8192, 128), every round faster (the
# round-robin it replaced ran 0.80x). Causal d=64 keeps "ws": not yet timed with the schedule
# (docs/results/h100/persistent/README.md).
SHIPPED_FWD = {(128, True): FWD_CONFIG_WS._replace(mode="ws-p"), (128, False): FWD_CONFIG_WS._replace(mode="ws-p"),
               (64, True): FWD_CONFIG_WS_D64, (64, False): FWD_CONFIG_WS_D64._replace(mode="ws-p")}


def shipped_config(head_dim: int, is_causal: bool) -> Config | None:
    """The config flash_triton's forward launches this kernel at (SHIPPED_FWD), or None where it keeps
    the Triton kernel."""
    return SHIPPED_FWD.get((head_dim, bool(is_causal)))


def _rows_flatten(t4: torch.Tensor) -> bool:
    """Whether a (Z, H, n, d) view's rows are those of one (Z * H * n, d) matrix: each (z, h) pair n rows
    after the one before."""
    Z, H, n, _ = t4.shape
    sz, sh, sn, _ = t4.stride()
    return (H == 1 or sh == n * sn) and (Z == 1 or sz == H * n * sn)


def persistent_error(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, block_n: int) -> str | None:
    """Why the persistent kernel cannot take these (Z, H, n, d) views, or None if it can: it reads Q, K and V
    as (Z * H * n, d) matrices, so their rows must flatten (_rows_flatten), and its key tiles must end at
    n_k (a last partial tile would read the next pair's keys where the per-pair descriptors read zeros)."""
    if not all(_rows_flatten(t) for t in (q4, k4, v4)):
        return "q, k and v rows do not flatten to one (Z * H * n, d) matrix each"
    if k4.shape[-2] % block_n:
        return f"{k4.shape[-2]} keys: not a multiple of the {block_n}-key tile"
    return None


# A tile's cost to the schedule, in key tiles: its key tiles, plus this for the part every tile pays once (Q's
# load, the pipeline's fill and drain, the final scaling, O's and L's stores). Over the 2048 causal tiles of
# (4, 16, 4096, 128) on 132 programs, the busiest program's modelled work is 1.002x the mean; round-robin gives
# 1.50x (benchmarks/tile_balance.py, docs/results/cpu/tile_balance_bcfa652.txt).
TILE_FIXED_COST = 1
# The last TAIL_WAVES x programs tiles may also be handed out heaviest first: at d=64 (192-row tiles) the
# launch order's tail left the busiest program 1.031x the mean on (4, 32, 4096, 64) causal and 1.017x on
# (16, 1, 16384, 64), 1.006x and 1.007x so (the same file). Four waves of tiles at those shapes are six groups
# of heads, whose K and V (24 MiB) fit in L2.
TAIL_WAVES = 4


def tile_costs(n_zh: int, n_q: int, n_k: int, block_m: int, block_n: int, group: int, is_causal: bool) -> list[int]:
    """Each query tile's key tiles (_key_tiles), the tiles in the non-persistent grid's launch order
    (_schedule_tile: groups of `group` (z, h) pairs, each group's tiles row by row, heaviest causal row first)."""
    rows = triton.cdiv(n_q, block_m)
    if not is_causal:
        return launch_order_costs([triton.cdiv(n_k, block_n)] * rows, group, n_zh)
    per_row = [triton.cdiv(min((rows - 1 - r) * block_m + block_m, n_k), block_n) for r in range(rows)]
    return launch_order_costs(per_row, group, n_zh)


def launch_order_costs(per_index: list[int], group: int, n_zh: int) -> list[int]:
    """The costs of a grid (group, len(per_index), n_zh / group)'s programs in launch order (x fastest, as
    _schedule_tile and the backward's _key_tile number them), from each index along axis 1's cost, the same
    for every (z, h) pair."""
    return [c for c in per_index for _ in range(group)] * (n_zh // group)


def tile_schedule(costs: list[int], programs: int) -> list[int]:
    """The persistent kernel's schedule for tiles of these costs (in launch order) on `programs` programs:
    programs + 1 offsets, then the tiles, program by program; program p runs tiles[offsets[p]:offsets[p + 1]]
    in that order. Of three ways to hand them out, the one whose busiest program has the least work (costs
    counted with TILE_FIXED_COST; the first on a tie): round-robin; each tile in launch order to the program
    that would be free first (ties to the lowest program), as the hardware hands a grid's programs to SMs;
    and that again with the last TAIL_WAVES waves of tiles heaviest first. Tiles of equal cost go
    round-robin; causal tiles, heaviest first within each group, leave the programs level."""
    programs = min(programs, len(costs))
    best = min(hand_outs(costs, programs).values(), key=lambda tiles: _busiest(costs, tiles))  # first on a tie
    return [0, *itertools.accumulate(map(len, best))] + [t for tiles in best for t in tiles]


def hand_outs(costs: list[int], programs: int) -> dict[str, list[list[int]]]:
    """The three ways tile_schedule weighs of handing tiles of these costs (in launch order) to `programs`
    programs, by name: each program's tiles, in the order it runs them."""
    n = len(costs)
    tail = min(n, TAIL_WAVES * programs)
    heaviest_tail = [*range(n - tail), *sorted(range(n - tail, n), key=lambda t: -costs[t])]
    return {"round_robin": [list(range(p, n, programs)) for p in range(programs)],
            "earliest_free": _earliest_free(costs, range(n), programs),
            "earliest_free_heaviest_tail": _earliest_free(costs, heaviest_tail, programs)}


def _earliest_free(costs: list[int], order, programs: int) -> list[list[int]]:
    """Each program's tiles when the tiles, in `order`, each go to the program that would be free first."""
    free_at = [(0, p) for p in range(programs)]
    tiles = [[] for _ in range(programs)]
    for t in order:
        at, p = heapq.heappop(free_at)
        tiles[p].append(t)
        heapq.heappush(free_at, (at + costs[t] + TILE_FIXED_COST, p))
    return tiles


def _busiest(costs: list[int], tiles: list[list[int]]) -> int:
    return max(sum(costs[t] + TILE_FIXED_COST for t in mine) for mine in tiles)


@functools.lru_cache(maxsize=64)
def schedule_tensor(device: int, costs_of, *shape) -> torch.Tensor:
    """tile_schedule for a call's tiles, costs_of(*shape) (tile_costs, or the backward's key_tile_costs), on its
    device (int32), made once a signature."""
    table = tile_schedule(costs_of(*shape), sm_count(device))
    return torch.tensor(table, dtype=torch.int32, device=f"cuda:{device}")


@functools.cache
def sm_count(device: int) -> int:
    """The streaming multiprocessors of a CUDA device: the persistent kernel's most programs."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch(tensors: tuple, is_causal: bool, cfg: Config, group: int):
    """Launch the forward on (q4, k4, v4, o4, lse) ((Z, H, n, d) views and the fp32 (Z, H, n_q) L) at `cfg`,
    in grid order `group` (flash_triton._head_group); a persistent mode ("-p") where persistent_error allows, the
    mode without "-p" otherwise.
    Returns (jit function, compiled kernel, runtime args, constexprs, grid): what flash_triton's launch plans
    are made from."""
    q4, k4, v4, o4, _ = tensors
    kernel, config, options = launch_spec(q4.shape[-1], *cfg)
    if kernel is _fwd_persistent_kernel and persistent_error(q4, k4, v4, cfg.block_n) is not None:
        kernel, config, options = launch_spec(q4.shape[-1],
                                              *cfg._replace(mode=cfg.mode.removesuffix(GLUON_PERSISTENT_SUFFIX)))
    Z, H, n_q, d = q4.shape
    args = (*tensors, *q4.stride()[:3], *k4.stride()[:3], *v4.stride()[:3], *o4.stride()[:3], H, n_q, k4.shape[-2],
            qk_scale(d))
    constexprs = {"IS_CAUSAL": bool(is_causal), "HEAD_DIM": d, **config}
    grid = (group, triton.cdiv(n_q, cfg.block_m), Z * H // group)
    if kernel is _fwd_persistent_kernel:
        schedule = schedule_tensor(q4.get_device(), tile_costs, Z * H, n_q, k4.shape[-2], cfg.block_m, cfg.block_n,
                                   group, bool(is_causal))
        args += (Z * H, group, schedule)
        grid = (min(math.prod(grid), sm_count(q4.get_device())),)
    ft._ensure_scratch_allocator()
    compiled = kernel[grid](*args, **constexprs, **options)
    return kernel, compiled, args, constexprs, grid


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                            block_m: int = 64, block_n: int = 64, stages: int = 3, num_warps: int = 4,
                            head_group: int | None = None, mode: str = "overlap") -> tuple[torch.Tensor, torch.Tensor]:
    """The Gluon forward: (O shaped like q, L shaped q.shape[:-1], fp32), as flash_triton's forward, at a
    config and mode (launch_spec)."""
    ft._check_inputs(q, k, v)
    _check_mode(mode)
    why = supported(q, k, v)
    if why:
        raise ValueError(why)
    cfg = Config(block_m, block_n, stages, num_warps, mode)
    launch_spec(q.shape[-1], *cfg)  # a bad config fails here, before anything is allocated
    q4, k4, v4 = ft._as_zhnd(q), ft._as_zhnd(k), ft._as_zhnd(v)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    group = ft._head_group(bool(is_causal), q4.shape[0] * q4.shape[1], head_group)
    launch((q4, k4, v4, out.view(q4.shape), lse), is_causal, cfg, group)
    return out, lse


def qk_scale(head_dim: int) -> float:
    """1/sqrt(d) * log2(e): the scale that turns raw scores into log2 units of the softmax's argument."""
    return ft.LOG2E / math.sqrt(head_dim)
