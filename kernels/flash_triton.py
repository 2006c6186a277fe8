"""FlashAttention-2 in Triton: forward, and backward as two kernels (dQ with Delta, then dK/dV).

Layout. Every tensor is viewed as (Z, H, N, D) with its own four strides, so 3D and 4D inputs
and non-contiguous views (a transposed head axis, a slice) are read in place, without a copy.
One program owns one tile of rows of one (z, h) pair (the grid's axes are the tiles and groups of
Z*H, in an order chosen per call: see _program_ids and _head_group):

  forward   cdiv(n_q, BLOCK_M) tiles: a query tile loops over key tiles with an online
            softmax in base 2 (scores scaled by 1/sqrt(d) * log2(e), so exp becomes exp2).
  dQ        cdiv(n_q, BLOCK_M) tiles: a query tile first writes its rows' Delta = rowsum(O * dO),
            then loops over key tiles.
  dK, dV    cdiv(n_k, BLOCK_N) tiles, launched after dQ: a key tile loops over query tiles,
            reading the Delta the dQ programs wrote. At d=128 (and d=64 non-causal) on sm_90 this is
            the Gluon kernel of kernels/flash_gluon_bwd.py (same grid, same sums; _gluon_config says where).

On sm_90+ the streamed tiles (K and V in dQ, and in the forward at d=128; Q and dO in dK/dV) come
through tensor descriptors, the copy engine, where the layout allows (_tma_ready), else through
pointer loads.

No atomics: each program writes only its own rows (a fused backward that adds dQ by atomics does
five matmuls per tile pair instead of seven, and still ran 0.76-0.91x this one's speed on the H200:
docs/results/h200/flash_tuning.md, step 13). The one tensor saved for backward besides
the inputs and O is L = logsumexp of the scaled scores (natural log, fp32, shaped q.shape[:-1]).

Causal (query i sees key j <= i, aligned at the top-left): key tiles wholly right of the diagonal
are never visited, tiles wholly left of it run without any mask, and only the tiles that cross
the diagonal (or the ragged last tile) pay for the mask. Heavier tiles are launched first: per
head group, whose heads' K and V share the L2 (see _head_group).

Cost per (z, h): forward 4*n_q*n_k*d FLOPs (half when causal) over 2*(n_q + 2*n_k)*d*bytes of
HBM traffic per query tile pass, i.e. arithmetic intensity ~ BLOCK_M FLOP/byte: compute bound.

Layers of this file, top to bottom: the @triton.jit kernels; tile selection (config spaces, the
autotuner and its pruning, LaunchOptions); the launchers, which check inputs and keep a launch
plan per call signature so a repeated call costs no Triton Python; the custom ops
benchlab::flash_attention_fwd / _bwd that torch.compile sees; FlashAttentionTriton on top.
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from triton.runtime import _allocation

try:  # the benchmarker the autotuner itself calls (_tuning_bench)
    from triton.runtime.driver import driver as _triton_driver
except ImportError:  # a Triton laid out otherwise: the autotuner keeps its own timing
    _triton_driver = None

from kernels.names import FLASH_KERNELS

LOG2E = 1.4426950408889634
DV_AFTER_DP_HEAD_DIM = tl.constexpr(128)  # where _bwd_dkdv_inner issues dV's matmul after dP^T's
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
MAX_GRID_YZ = 65535  # CUDA's limit on grid axes 1 and 2 (tiles, groups); axis 0 takes up to 2**31 - 1
MAX_SEQ = MAX_GRID_YZ * 16  # the longest sequence whose tiles fit grid axis 1 at the smallest tile


@triton.jit
def _program_ids():
    """(tile index, z*h index, number of tiles) of this program.

    The grid is (G, tiles, ZH / G): a group of G (z, h) pairs on axis 0, which the GPU dispatches
    fastest, tiles on axis 1, groups on axis 2. So tile 0 of every pair in a group starts before tile
    1 of any, and the groups run one after another. With causal masking (tiles of unequal work, the
    heaviest launched first) that is longest-job-first over a group's heads, so no heavy tile of a
    late head is left as a tail, while only a group's K and V compete for the L2 at a time. G = 1 is
    head-major order, G = ZH tile-major. The launcher picks G (_head_group).
    """
    return tl.program_id(1), tl.program_id(2) * tl.num_programs(0) + tl.program_id(0), tl.num_programs(1)


@triton.jit
def _head_rows(X, z, h, stride_z, stride_h, stride_row, stride_d, offs_row, offs_d):
    """Pointers to rows offs_row, columns offs_d of head (z, h)'s (n, d) matrix in X."""
    return (X + z.to(tl.int64) * stride_z + h.to(tl.int64) * stride_h
            + offs_row[:, None] * stride_row + offs_d[None, :] * stride_d)


@triton.jit
def _load_rows(ptrs, offs_row, offs_d, n, HEAD_DIM: tl.constexpr, EVEN: tl.constexpr):
    """The tile at ptrs (_head_rows); unless EVEN (no ragged rows, no padded head dim), rows from n and
    columns from HEAD_DIM read as zeros."""
    if EVEN:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=(offs_row[:, None] < n) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    return x


@triton.jit
def _store_rows(ptrs, x, offs_row, offs_d, n, HEAD_DIM: tl.constexpr, EVEN: tl.constexpr):
    """Store tile x at ptrs (_head_rows) in the pointers' dtype; unless EVEN, only rows below n and
    columns below HEAD_DIM."""
    if EVEN:
        tl.store(ptrs, x.to(ptrs.dtype.element_ty))
    else:
        tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=(offs_row[:, None] < n) & (offs_d[None, :] < HEAD_DIM))


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _kv_sources(K, V, z, h, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
                n_k, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, TMA_KV: tl.constexpr):
    """Where the query-major kernels (forward, dQ) stream this head's keys and values from: tensor
    descriptors of (n_k, HEAD_DIM) when TMA_KV (the launcher checked unit stride along d and 16-byte
    alignment, _tma_ready; the copy engine fills rows past n_k and columns past HEAD_DIM with zeros),
    else base pointers."""
    k_src = K + z.to(tl.int64) * stride_kz + h.to(tl.int64) * stride_kh
    v_src = V + z.to(tl.int64) * stride_vz + h.to(tl.int64) * stride_vh
    if TMA_KV:
        k_src = tl.make_tensor_descriptor(k_src, shape=[n_k, HEAD_DIM], strides=[stride_kn, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_src, shape=[n_k, HEAD_DIM], strides=[stride_vn, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
    return k_src, v_src


@triton.jit
def _load_kt_v(k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d, n_k,
               MASKED: tl.constexpr, EVEN_D: tl.constexpr, HEAD_DIM: tl.constexpr, V_TRANSPOSED: tl.constexpr):
    """Pointer loads of a K^T tile (d, BLOCK_N) and a V tile, (BLOCK_N, d) or transposed (d, BLOCK_N).
    MASKED tiles check key bounds (zeros past n_k); unmasked ones only the padded head dim."""
    kt_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    if V_TRANSPOSED:
        v_ptrs = v_base + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd
        v_mask = (offs_n[None, :] < n_k) & (offs_d[:, None] < HEAD_DIM)
        v_dmask = offs_d[:, None] < HEAD_DIM
    else:
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        v_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < HEAD_DIM)
        v_dmask = offs_d[None, :] < HEAD_DIM
    if MASKED:
        kt = tl.load(kt_ptrs, mask=(offs_n[None, :] < n_k) & (offs_d[:, None] < HEAD_DIM), other=0.0)
        v = tl.load(v_ptrs, mask=v_mask, other=0.0)
    elif EVEN_D:
        kt = tl.load(kt_ptrs)
        v = tl.load(v_ptrs)
    else:
        kt = tl.load(kt_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
        v = tl.load(v_ptrs, mask=v_dmask, other=0.0)
    return kt, v


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
               offs_m, offs_d, n_k, lo, hi, qk_scale,
               MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr,
               TMA_KV: tl.constexpr):
    """Accumulate key tiles [lo, hi) into (acc, l_i, m_i). MASKED tiles check bounds and causality.
    k_src, v_src: this head's K and V, tensor descriptors when TMA_KV, else base pointers (_kv_sources)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        # K^T tile (d, BLOCK_N) and V tile (BLOCK_N, d)
        if TMA_KV:
            kt = k_src.load([start_n, 0]).T
            v = v_src.load([start_n, 0])
        else:
            kt, v = _load_kt_v(k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d, n_k,
                               MASKED, EVEN_D, HEAD_DIM, False)
        # raw scores (BLOCK_M, BLOCK_N); the scale is applied inside exp2's argument, s * scale - m,
        # one FMA per score instead of a multiply and a subtract (qk_scale > 0, so the row max of
        # the raw scores times the scale is the max of the scaled ones: log2 units, BLOCK_M mults)
        s = tl.dot(q, kt, input_precision=INPUT_PRECISION)
        if MASKED:
            keep = offs_n[None, :] < n_k
            if IS_CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescale of what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(Q, K, V, O, L,
                stride_qz, stride_qh, stride_qm, stride_qd,
                stride_kz, stride_kh, stride_kn, stride_kd,
                stride_vz, stride_vh, stride_vn, stride_vd,
                stride_oz, stride_oh, stride_om, stride_od,
                H, n_q, n_k, qk_scale, seq_bucket,
                IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                INPUT_PRECISION: tl.constexpr, TMA_KV: tl.constexpr):
    pid_m, pid_zh, n_tiles = _program_ids()
    if IS_CAUSAL:  # the last query tiles see the most keys: start them first
        pid_m = n_tiles - 1 - pid_m
    z = pid_zh // H
    h = pid_zh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load_rows(_head_rows(Q, z, h, stride_qz, stride_qh, stride_qm, stride_qd, offs_m, offs_d), offs_m, offs_d,
                   n_q, HEAD_DIM, EVEN_M & EVEN_D)
    k_src, v_src = _kv_sources(K, V, z, h, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
                               n_k, HEAD_DIM, BLOCK_N, BLOCK_D, TMA_KV)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # keys [0, n_full) are whole tiles; the ragged last tile is masked
    n_full = n_k if EVEN_N else (n_k // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        # tiles left of this query tile's first row are fully visible; [start_m, start_m+BLOCK_M) crosses
        hi_unmasked = tl.minimum(start_m, n_full)
        hi = tl.minimum(start_m + BLOCK_M, n_k)
    else:
        hi_unmasked = n_full
        hi = n_k
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                               offs_m, offs_d, n_k, 0, hi_unmasked, qk_scale,
                               False, IS_CAUSAL, EVEN_D, HEAD_DIM, BLOCK_N, INPUT_PRECISION, TMA_KV)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                               offs_m, offs_d, n_k, hi_unmasked, hi, qk_scale,
                               True, IS_CAUSAL, EVEN_D, HEAD_DIM, BLOCK_N, INPUT_PRECISION, TMA_KV)

    out = acc / l_i[:, None]
    # L in natural log: (m + log2 l) / log2(e)
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    _store_rows(_head_rows(O, z, h, stride_oz, stride_oh, stride_om, stride_od, offs_m, offs_d), out, offs_m, offs_d,
                n_q, HEAD_DIM, EVEN_M & EVEN_D)
    l_ptrs = L + pid_zh.to(tl.int64) * n_q + offs_m
    if EVEN_M:
        tl.store(l_ptrs, lse)
    else:
        tl.store(l_ptrs, lse, mask=offs_m < n_q)


# ----------------------------------------------------------------------------------------------
# backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, l_base, delta_base,
                    stride_qm, stride_qd, stride_dom, stride_dod,
                    offs_n, offs_d, n_q, lo, hi, qk_scale,
                    MASKED: tl.constexpr, EVEN_M: tl.constexpr, EVEN_D: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                    TMA_Q: tl.constexpr, TMA_DO: tl.constexpr):
    """Accumulate query tiles [lo, hi) into this key tile's dK, dV (both (BLOCK_N, d), fp32).

    Works on transposed scores so no tile is transposed in registers:
      S^T = K Q^T (BLOCK_N, BLOCK_M), P^T = exp2(S^T - L), dV += P^T dO,
      dP^T = V dO^T, dS^T = P^T * (dP^T - Delta), dK += dS^T Q.
    q_src (do_src) is a tensor descriptor of this head's Q (dO) when TMA_Q (TMA_DO): the copy engine
    loads the tile and fills rows past n_q and columns past HEAD_DIM with zeros; else a base pointer.
    """
    # Triton waits for every outstanding matmul right after a score matmul (S^T, dP^T) whose result
    # feeds elementwise work, so only the accumulating dots (dV, dK) can overlap a program's own
    # elementwise work. Issued after dP^T's wait, dV's matmul runs on the tensor cores while the
    # warps compute dS^T. Same sums either way; in turns on the H200 it ran 1.02-1.08x at d=128 and
    # 0.92-0.98x at d=64, 96 and 256 (docs/results/h200/flash_order/), so d=128 alone takes that order.
    DV_AFTER_DP: tl.constexpr = HEAD_DIM == DV_AFTER_DP_HEAD_DIM
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        if TMA_Q:
            qt = q_src.load([start_m, 0]).T
        else:
            qt_ptrs = q_src + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd
            if EVEN_M & EVEN_D:
                qt = tl.load(qt_ptrs)
            else:
                qt = tl.load(qt_ptrs, mask=(offs_m[None, :] < n_q) & (offs_d[:, None] < HEAD_DIM), other=0.0)
        if TMA_DO:
            do = do_src.load([start_m, 0])
        else:
            do_ptrs = do_src + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod
            if EVEN_M & EVEN_D:
                do = tl.load(do_ptrs)
            else:
                do = tl.load(do_ptrs, mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        if EVEN_M:
            lse = tl.load(l_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        else:
            # rows past n_q get L = +inf, so their P is exactly 0
            lse = tl.load(l_base + offs_m, mask=offs_m < n_q, other=float("inf"))
            delta = tl.load(delta_base + offs_m, mask=offs_m < n_q, other=0.0)
        st = tl.dot(k, qt, input_precision=INPUT_PRECISION) * qk_scale
        pt = tl.math.exp2(st - (lse * 1.4426950408889634)[None, :])
        if MASKED:  # causal diagonal: key j is seen by query i only when j <= i
            pt = tl.where(offs_n[:, None] <= offs_m[None, :], pt, 0.0)
        if not DV_AFTER_DP:
            dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
        # dP^T - Delta in the dot: its accumulator starts at -Delta instead of 0, one subtract per score less
        dpt = tl.dot(v, tl.trans(do), tl.broadcast_to(-delta[None, :], pt.shape), input_precision=INPUT_PRECISION)
        if DV_AFTER_DP:
            dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
        dst = pt * dpt
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV,
                     stride_qz, stride_qh, stride_qm, stride_qd,
                     stride_kz, stride_kh, stride_kn, stride_kd,
                     stride_vz, stride_vh, stride_vn, stride_vd,
                     stride_doz, stride_doh, stride_dom, stride_dod,
                     stride_dkz, stride_dkh, stride_dkn, stride_dkd,
                     stride_dvz, stride_dvh, stride_dvn, stride_dvd,
                     H, n_q, n_k, sm_scale, qk_scale, seq_bucket,
                     IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                     INPUT_PRECISION: tl.constexpr,
                     TMA_Q: tl.constexpr, TMA_DO: tl.constexpr):
    pid_n, pid_zh, n_tiles = _program_ids()  # causal: key tile 0 sees the most queries
    z = pid_zh // H
    h = pid_zh % H
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    k_ptrs = _head_rows(K, z, h, stride_kz, stride_kh, stride_kn, stride_kd, offs_n, offs_d)
    v_ptrs = _head_rows(V, z, h, stride_vz, stride_vh, stride_vn, stride_vd, offs_n, offs_d)
    k = _load_rows(k_ptrs, offs_n, offs_d, n_k, HEAD_DIM, EVEN_N & EVEN_D)
    v = _load_rows(v_ptrs, offs_n, offs_d, n_k, HEAD_DIM, EVEN_N & EVEN_D)

    q_src = Q + z.to(tl.int64) * stride_qz + h.to(tl.int64) * stride_qh
    do_src = DO + z.to(tl.int64) * stride_doz + h.to(tl.int64) * stride_doh
    # descriptors where the launcher found unit stride along d and the rest 16-byte aligned (_tma_ready)
    if TMA_Q:
        q_src = tl.make_tensor_descriptor(q_src, shape=[n_q, HEAD_DIM], strides=[stride_qm, 1],
                                          block_shape=[BLOCK_M, BLOCK_D])
    if TMA_DO:
        do_src = tl.make_tensor_descriptor(do_src, shape=[n_q, HEAD_DIM], strides=[stride_dom, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
    l_base = L + pid_zh.to(tl.int64) * n_q
    delta_base = Delta + pid_zh.to(tl.int64) * n_q

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if IS_CAUSAL:
        # queries < start_n see none of these keys; [start_n, start_n+BLOCK_N) cross the diagonal
        lo_masked = start_n
        hi_masked = tl.minimum(start_n + BLOCK_N, n_q)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, l_base, delta_base,
                                 stride_qm, stride_qd, stride_dom, stride_dod,
                                 offs_n, offs_d, n_q, lo_masked, hi_masked, qk_scale,
                                 True, EVEN_M, EVEN_D, HEAD_DIM, BLOCK_M, INPUT_PRECISION, TMA_Q, TMA_DO)
        lo = start_n + BLOCK_N
    else:
        lo = 0
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, l_base, delta_base,
                             stride_qm, stride_qd, stride_dom, stride_dod,
                             offs_n, offs_d, n_q, lo, n_q, qk_scale,
                             False, EVEN_M, EVEN_D, HEAD_DIM, BLOCK_M, INPUT_PRECISION, TMA_Q, TMA_DO)
    dk = dk * sm_scale

    dk_ptrs = _head_rows(DK, z, h, stride_dkz, stride_dkh, stride_dkn, stride_dkd, offs_n, offs_d)
    dv_ptrs = _head_rows(DV, z, h, stride_dvz, stride_dvh, stride_dvn, stride_dvd, offs_n, offs_d)
    _store_rows(dk_ptrs, dk, offs_n, offs_d, n_k, HEAD_DIM, EVEN_N & EVEN_D)
    _store_rows(dv_ptrs, dv, offs_n, offs_d, n_k, HEAD_DIM, EVEN_N & EVEN_D)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                  offs_m, offs_d, n_k, lo, hi, qk_scale,
                  MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                  TMA_KV: tl.constexpr):
    """Accumulate key tiles [lo, hi) into this query tile's dQ: dS = P * (dO V^T - Delta), dQ += dS K.
    k_src, v_src as in _fwd_inner."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        if TMA_KV:
            kt = k_src.load([start_n, 0]).T
            vt = v_src.load([start_n, 0]).T
        else:
            kt, vt = _load_kt_v(k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d, n_k,
                                MASKED, EVEN_D, HEAD_DIM, True)
        s = tl.dot(q, kt, input_precision=INPUT_PRECISION) * qk_scale
        p = tl.math.exp2(s - lse2[:, None])
        if MASKED:
            keep = offs_n[None, :] < n_k
            if IS_CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vt, tl.broadcast_to(-delta[:, None], p.shape), input_precision=INPUT_PRECISION)  # dP - Delta
        ds = p * dp
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit
def _bwd_dq_kernel(Q, K, V, O, DO, L, Delta, DQ,
                   stride_qz, stride_qh, stride_qm, stride_qd,
                   stride_kz, stride_kh, stride_kn, stride_kd,
                   stride_vz, stride_vh, stride_vn, stride_vd,
                   stride_oz, stride_oh, stride_om, stride_od,
                   stride_doz, stride_doh, stride_dom, stride_dod,
                   stride_dqz, stride_dqh, stride_dqm, stride_dqd,
                   H, n_q, n_k, sm_scale, qk_scale, seq_bucket,
                   IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                   INPUT_PRECISION: tl.constexpr, TMA_KV: tl.constexpr):
    pid_m, pid_zh, n_tiles = _program_ids()
    if IS_CAUSAL:  # as in forward: the last query tiles are the heaviest
        pid_m = n_tiles - 1 - pid_m
    z = pid_zh // H
    h = pid_zh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load_rows(_head_rows(Q, z, h, stride_qz, stride_qh, stride_qm, stride_qd, offs_m, offs_d), offs_m, offs_d,
                   n_q, HEAD_DIM, EVEN_M & EVEN_D)
    do = _load_rows(_head_rows(DO, z, h, stride_doz, stride_doh, stride_dom, stride_dod, offs_m, offs_d), offs_m,
                    offs_d, n_q, HEAD_DIM, EVEN_M & EVEN_D)
    o = _load_rows(_head_rows(O, z, h, stride_oz, stride_oh, stride_om, stride_od, offs_m, offs_d), offs_m, offs_d,
                   n_q, HEAD_DIM, EVEN_M & EVEN_D)
    # Delta_i = rowsum(O_i * dO_i) (equals rowsum(P_i * dP_i)): this program's rows are the only ones it
    # needs, and the dK/dV kernel, launched after this one, reads all of them from global memory.
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if EVEN_M:
        lse = tl.load(L + pid_zh.to(tl.int64) * n_q + offs_m)
        tl.store(Delta + pid_zh.to(tl.int64) * n_q + offs_m, delta)
    else:
        lse = tl.load(L + pid_zh.to(tl.int64) * n_q + offs_m, mask=offs_m < n_q, other=float("inf"))
        tl.store(Delta + pid_zh.to(tl.int64) * n_q + offs_m, delta, mask=offs_m < n_q)
    lse2 = lse * 1.4426950408889634
    k_src, v_src = _kv_sources(K, V, z, h, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
                               n_k, HEAD_DIM, BLOCK_N, BLOCK_D, TMA_KV)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    n_full = n_k if EVEN_N else (n_k // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi_unmasked = tl.minimum(start_m, n_full)
        hi = tl.minimum(start_m + BLOCK_M, n_k)
    else:
        hi_unmasked = n_full
        hi = n_k
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, offs_d, n_k, 0, hi_unmasked, qk_scale,
                       False, IS_CAUSAL, EVEN_D, HEAD_DIM, BLOCK_N, INPUT_PRECISION, TMA_KV)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, offs_d, n_k, hi_unmasked, hi, qk_scale,
                       True, IS_CAUSAL, EVEN_D, HEAD_DIM, BLOCK_N, INPUT_PRECISION, TMA_KV)
    dq = dq * sm_scale
    _store_rows(_head_rows(DQ, z, h, stride_dqz, stride_dqh, stride_dqm, stride_dqd, offs_m, offs_d), dq, offs_m,
                offs_d, n_q, HEAD_DIM, EVEN_M & EVEN_D)


# ----------------------------------------------------------------------------------------------
# tile selection
# ----------------------------------------------------------------------------------------------
# Autotuning is keyed on (head dim, causal, sequence-length bucket) and the input dtypes (Triton
# adds those), so a sweep over sequence lengths tunes once per power-of-two bucket. Each space has
# at most six configs (fewer after pruning those that overflow shared memory) so a cold cell
# tunes in seconds. Constraints: BLOCK_M % BLOCK_N == 0 in the
# query-major kernels and BLOCK_N % BLOCK_M == 0 in dK/dV, so the diagonal tiles line up.
_EVEN_HEURISTICS = {
    "EVEN_M": lambda a: a["n_q"] % a["BLOCK_M"] == 0,
    "EVEN_N": lambda a: a["n_k"] % a["BLOCK_N"] == 0,
    "EVEN_D": lambda a: a["HEAD_DIM"] == a["BLOCK_D"],
}
_KEY = ["HEAD_DIM", "IS_CAUSAL", "seq_bucket", "INPUT_PRECISION"]


def make_config(bm: int, bn: int, warps: int, stages: int, maxnreg: int | None = None) -> triton.Config:
    """A tile config: BLOCK_M x BLOCK_N tiles, `warps` warps, `stages` pipeline stages, and optionally a
    cap on registers per thread (fewer registers, more programs resident per SM; ptxas spills past it)."""
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages, maxnreg=maxnreg)


# The first config of each space is the d=64 winner of the tile search on the H200
# (benchmarks/flash_tune.py, docs/results/h200/flash_tune_*.jsonl); the next ones are the
# d=128 winners and the configs autotuning picked on the main grid before that search, plus small
# tiles for short sequences and small head dims. At most 7 per kernel: a cold key tunes in seconds.
# dK/dV's d=64 winner caps registers at 128 per thread: two programs of 8 warps fit on an SM instead
# of one (docs/results/h200/flash_regcap/). Capped configs are pruned where a head row is wider than
# REG_CAP_MAX_ROW_BYTES: at d=128 the same caps spill and ran 2x slower.
FWD_CONFIGS = [make_config(*c) for c in ((128, 64, 8, 3), (64, 64, 4, 3), (256, 64, 8, 3), (128, 64, 4, 3),
                                            (128, 128, 8, 3), (64, 32, 4, 2))]
DKDV_CONFIGS = [make_config(*c) for c in ((32, 128, 8, 3, 128), (64, 64, 4, 2), (32, 64, 4, 3, 128),
                                             (64, 128, 8, 3), (32, 64, 4, 3), (32, 128, 4, 3), (16, 64, 4, 2))]
DQ_CONFIGS = [make_config(*c) for c in ((128, 64, 4, 3), (128, 32, 8, 3), (128, 32, 4, 3), (128, 64, 8, 3),
                                           (64, 32, 4, 3), (64, 64, 4, 2), (64, 16, 4, 2))]

SMEM_BUDGET = 200 * 1024  # bytes; the H100/H200 give a block up to 227 KiB of shared memory
REG_CAP_MAX_ROW_BYTES = 128  # a register-capped config is a candidate only up to d=64 at 16-bit (d=32 at fp32)


def smem_estimate(cfg: triton.Config, head_dim: int, elem: int, kernel: str) -> int:
    """Shared memory a config stages: the resident tile plus `num_stages` copies of the streamed pair.

    fwd / dq keep a (BLOCK_M, d) query tile (dq also dO) and stream K, V tiles (BLOCK_N, d);
    dK/dV keeps (BLOCK_N, d) K and V and streams Q and dO tiles (BLOCK_M, d).
    """
    bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
    d = _block_d(head_dim)
    if kernel == "dkdv":
        resident, streamed = 2 * bn * d, 2 * bm * d
    else:
        resident, streamed = (1 if kernel == "fwd" else 2) * bm * d, 2 * bn * d
    return (resident + cfg.num_stages * streamed) * elem


# Configs the autotuner's short timing bursts favour that lose under sustained load, by (kernel, head
# dim), 16-bit inputs: left out of the space there. On an H100 the d=128 forward's autotuner picked
# 128x64x8x3 in 6 of 21 processes on (4, 16, 4096, 128) and (1, 16, 16384, 128) non-causal, and there
# it ran 4 %-8 % slower than 256x64x8x3; without it the forward read 0.99x-1.03x
# the full space's on nine d=128 shapes (docs/results/h100/autotune_picks/README.md).
BURST_ONLY = {("fwd", 128): ((128, 64, 8, 3),)}


def _tile(cfg: triton.Config) -> tuple[int, int, int, int]:
    return cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages


def _pruner(kernel: str):
    def prune(configs, named_args, **kwargs):
        head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
        elem = named_args["Q"].element_size()
        if _block_d(head_dim) * elem > REG_CAP_MAX_ROW_BYTES:
            configs = [c for c in configs if c.maxnreg is None] or configs
        burst_only = BURST_ONLY.get((kernel, head_dim), ()) if elem == 2 else ()
        configs = [c for c in configs if _tile(c) not in burst_only] or configs
        fit = [c for c in configs if smem_estimate(c, head_dim, elem, kernel) <= SMEM_BUDGET]
        if fit:
            return fit
        return [min(configs, key=lambda c: smem_estimate(c, head_dim, elem, kernel))]
    return prune


# Under TRITON_INTERPRET=1 (CPU tensors) autotuning would run every config in the interpreter; one
# small fixed config keeps CPU tests quick and still exercises ragged tiles and the diagonal logic.
CPU_CONFIG = {"fwd": (32, 16), "dkdv": (16, 32), "dq": (32, 16)}

_fwd = triton.heuristics(_EVEN_HEURISTICS)(_fwd_kernel)
_dkdv = triton.heuristics(_EVEN_HEURISTICS)(_bwd_dkdv_kernel)
_dq = triton.heuristics(_EVEN_HEURISTICS)(_bwd_dq_kernel)
# The tile sizes the autotuner launched last, per kernel, noted by each config's pre_hook (it runs
# right before the launch that follows tuning): a launch plan needs them and Triton versions differ
# in what the autotuner exposes (3.7 has best_config, 3.6 not).
_LAST_TUNED: dict[str, tuple[int, int]] = {}


def _noting(configs: list[triton.Config], which: str) -> list[triton.Config]:
    def note(nargs, which=which):
        _LAST_TUNED[which] = (nargs["BLOCK_M"], nargs["BLOCK_N"])
    return [triton.Config(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.maxnreg, pre_hook=note)
            for c in configs]


def _heat_ms_from_env(value: str | None) -> float:
    """BENCHLAB_AUTOTUNE_HEAT_MS as a number of milliseconds >= 0 (unset: 0)."""
    if value is None or value.strip() == "":
        return 0.0
    try:
        ms = float(value)
    except ValueError:
        raise ValueError(f"BENCHLAB_AUTOTUNE_HEAT_MS={value!r}: want a number of milliseconds >= 0") from None
    if not ms >= 0:
        raise ValueError(f"BENCHLAB_AUTOTUNE_HEAT_MS={value!r}: want a number of milliseconds >= 0")
    return ms


# The autotuner times each config in a short burst right after compiling it, so every config meets a
# chip that cooled while the compiler ran. Under sustained load (do_bench for seconds, a training loop)
# the chip clocks down at its power limit, and a config that draws more power loses more there: on an
# H100 the d=128 forward's autotuner picked 128x64x8x3 in some processes and 256x64x8x3 in others, and
# the first ran 4-8 % slower under sustained load. AUTOTUNE_HEAT_MS > 0 runs each config's calls back to
# back for that long before it is timed, so it is timed at the clock it would keep. At 300 ms it still
# let that pick through (docs/results/h100/autotune_picks/README.md; BURST_ONLY is what removed it), so
# 0, Triton's own timing, is the default. It is read from the environment (BENCHLAB_AUTOTUNE_HEAT_MS)
# when this module is imported.
AUTOTUNE_HEAT_MS = _heat_ms_from_env(os.environ.get("BENCHLAB_AUTOTUNE_HEAT_MS"))


def _run_for_ms(fn, ms: float, max_calls: int = 100_000) -> int:
    """Call fn back to back for about `ms` of GPU time: one call timed by CUDA events sets how many.
    Returns the number of calls after the timed one."""
    fn()  # the first call may compile
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    calls = min(max_calls, int(ms / max(start.elapsed_time(end), 1e-3)))
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return calls


def _tuning_bench(kernel_call, quantiles):
    """How the autotuner times one config: Triton's own benchmarker, after AUTOTUNE_HEAT_MS of the
    config's calls back to back when that is above 0."""
    if AUTOTUNE_HEAT_MS > 0:
        _run_for_ms(kernel_call, AUTOTUNE_HEAT_MS)
    return _triton_driver.active.get_benchmarker()(kernel_call, quantiles=quantiles)


def _autotune(kernel, configs, which: str, key: list[str] = _KEY):
    # Triton's own timing, untouched, unless the environment asked for heat when this module was imported
    timing = {"do_bench": _tuning_bench} if AUTOTUNE_HEAT_MS > 0 and _triton_driver is not None else {}
    return triton.autotune(_noting(configs, which), key=key, **timing,
                           prune_configs_by={"early_config_prune": _pruner(which)})(kernel)


# descriptor loads and pointer loads tune apart
_fwd_tuned = _autotune(_fwd, FWD_CONFIGS, "fwd", _KEY + ["TMA_KV"])
_dkdv_tuned = _autotune(_dkdv, DKDV_CONFIGS, "dkdv", _KEY + ["TMA_Q", "TMA_DO"])
_dq_tuned = _autotune(_dq, DQ_CONFIGS, "dq", _KEY + ["TMA_KV"])


def _pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (n >= 1). Plain Python: triton.next_power_of_2 goes through
    Triton's function-call machinery, microseconds per call on every launch."""
    return 1 << (n - 1).bit_length()


def _block_d(head_dim: int) -> int:
    """The padded head dim the kernels tile with: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, _pow2_at_least(head_dim))


def _seq_bucket(n: int) -> int:
    """Power-of-two bucket of a sequence length, clamped to [64, 65536]: the autotune key."""
    return min(max(_pow2_at_least(n), 64), 65536)


# ----------------------------------------------------------------------------------------------
# launchers
# ----------------------------------------------------------------------------------------------
def _as_zhnd(x: torch.Tensor) -> torch.Tensor:
    """View (..., n, d) as (Z, H, n, d) without copying where the strides allow it."""
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[:, None]
    if x.dim() == 4:
        return x
    return x.reshape(-1, 1, x.shape[-2], x.shape[-1])  # copies only if the leading dims can't merge


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., seq, d), got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; FlashAttentionTriton supports fp32, fp16 and bf16")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on leading dims and head dim")
    d = q.shape[-1]
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head dim {d} is larger than the supported maximum {MAX_HEAD_DIM}")
    if k.shape[-2] == 0 and q.shape[-2] > 0:
        raise ValueError("attention over zero keys is undefined (n_keys == 0)")
    longest = max(q.shape[-2], k.shape[-2])
    if longest > MAX_SEQ:  # tiles go on grid axis 1, at most MAX_GRID_YZ of the smallest (16 rows)
        raise ValueError(f"sequence length {longest} is longer than the supported maximum {MAX_SEQ}")


def _strides(x: torch.Tensor) -> tuple[int, int, int, int]:
    return tuple(x.stride())  # type: ignore[return-value]


# How fp32 inputs are multiplied: "tf32" one TF32 pass (10-bit mantissa, ~1e-3 relative error),
# "tf32x3" three TF32 passes that recover ~fp32 accuracy (what cuBLAS and SDPA's fp32 paths do),
# "ieee" full fp32 FMAs without tensor cores. fp16 and bf16 inputs always multiply exactly.
FP32_PRECISIONS = ("tf32", "tf32x3", "ieee")


def _precision(dtype: torch.dtype, fp32_precision: str) -> str:
    if fp32_precision not in FP32_PRECISIONS:
        raise ValueError(f"fp32_precision must be one of {', '.join(FP32_PRECISIONS)}, got {fp32_precision!r}")
    return fp32_precision if dtype == torch.float32 else "ieee"


# Grid order (see _program_ids). Causal tiles do unequal work and the heaviest start first within a
# group of G (z, h) pairs, so a larger G leaves a shorter tail of late heavy tiles, while all of a
# group's K and V compete for the L2 at once. In turns on the H200 (docs/results/h200/flash_groups/,
# twelve causal shapes, seq 512-16384, d 64 and 128, K+V of 0.1-8 MiB a head, the same tiles for every
# G), G = 4 was within 2.5 % of the fastest group size on every shape and pass, 0.97-1.02x head-major
# forward+backward, and faster than one group of all heads (the order shipped before for causal calls
# with at most 96 MiB of K+V) on all twelve, by 3-20 %. Non-causal tiles are all equal work, so a group
# larger than one head can only cost locality there.
HEAD_GROUP = 4


# A stride-0 dO (from `o.sum().backward()`) copied contiguous costs the host the copy, 20 us a call on
# the H200 host (docs/results/h200/flash_launch/, "The stride-0 dO's copy on the host"; the layout checks
# that decide it, ~29 us more there, now run only when a launch plan is made), so the copy is made only
# where the backward's GPU work is large enough to gain more than that. The work is Z*H*n_q*n_k*d,
# halved when causal; 2^34 is (1, 16, 4096, 64) not causal. Measured on the stride-0 dO: above it,
# (8, 16, 2048, 64) not causal (2^35) ran 1.14x and (4, 16, 2048, 128) not causal (2^35) 1.30x with the
# copy; below it the cells were host-bound with or without one ((1, 16, 4096, 64) causal, 2^33: 0.430
# against 0.425 ms on the GPU) (docs/results/h200/flash_leaderboard/).
COPY_GRAD_MIN_WORK = 2 ** 34

# The fused Gluon backward (kernels/flash_gluon_bwd.py: one warp-specialised kernel for dK, dV and dQ, five
# matmuls a tile pair where the split backward's two kernels do seven, dQ added in fp32 by the copy engine)
# runs where it ships (SHIPPED_FUSED there: d=64 and d=128, causal and not) on calls of at least this many
# queries and at least this many keys.
# Under sustained load on an H200, against the split backward in one rotation
# (docs/results/h200/fused_gate/README.md): at seq 4096 1.02x (d=64 not causal), 1.03x (d=64 causal), 1.06x
# (d=128 causal) and 0.99x-1.0x (d=128 not causal, within 1.5 % of a second copy of the split one); at seq
# 2048 0.94x-0.99x (its 128-key programs see too few query tiles there). Its dQ comes from atomic fp32 adds,
# so unlike the split backward's it can differ in the last bits from run to run; gluon_fused=False keeps the
# split backward.
FUSED_MIN_SEQ = 4096

# The Gluon forward (kernels/flash_gluon.py, SHIPPED_FWD: d=64 and 128) runs on calls of at least this many
# queries and keys: it was timed from seq 4096 to 16384 (d=128: 1.10x-1.14x the Triton forward under
# sustained load on an H100, docs/results/h100/gluon_paths/README.md; d=64: 1.03x-1.14x,
# docs/results/h100/fwd_d64/README.md); shorter calls keep the autotuned Triton forward, whose tiles are
# picked per length.
GLUON_FWD_MIN_SEQ = 4096


@dataclass(frozen=True)
class LaunchOptions:
    """How the launchers choose tiles and grid order (GPU; the interpreter always takes CPU_CONFIG).

    autotune    False: each kernel takes the first config of its space that fits in shared memory
                (much faster cold starts, e.g. for a test matrix of many shapes)
    head_group  grid order: how many (z, h) pairs interleave their tiles (see _program_ids; 1 is
                head-major, batch x heads or more tile-major); None picks per call (_head_group)
    bwd_head_group
                the backward kernels' grid order where it should differ from the forward's; None
                takes head_group's
    tma         the kernels stream tiles through tensor descriptors (the copy engine, sm_90+) where a
                tensor qualifies (_tma_ready): K and V in the dQ kernel and, at d in TMA_FWD_HEAD_DIMS,
                in the forward; Q and dO in dK/dV. False keeps pointer loads
    pinned      a fixed config per kernel name (fwd, dkdv, dq) instead of autotuning; a config that
                does not fit in shared memory fails at launch
    gluon_dkdv  the backward's dK/dV kernel is the Gluon one (kernels/flash_gluon_bwd.py) where it ran
                faster (_gluon_config: sm_90, 16-bit, d and mask in its SHIPPED_DKDV, tensors the copy
                engine takes, tma on and no pinned dkdv config). False keeps the Triton kernel everywhere
    gluon_dq    the backward's dQ kernel is the Gluon one (kernels/flash_gluon_bwd.py) where _gluon_config
                allows it (as gluon_dkdv, at d and mask in its SHIPPED_DQ). Off by default: the whole backward
                with it read 0.975-1.014x the shipped one under sustained load on an H100
                (docs/results/h100/flash_rs/README.md)
    gluon_fwd   the forward kernel is the Gluon one (kernels/flash_gluon.py) at d and mask in its SHIPPED_FWD
                (d=64, 128), on calls of at least gluon_fwd_min_seq queries and keys, where _gluon_config allows
                it (sm_90, 16-bit, tensors the copy engine takes, tma on, no pinned fwd config). False keeps
                the Triton forward everywhere
    gluon_fwd_min_seq
                the queries, and the keys, a call needs for gluon_fwd to apply (GLUON_FWD_MIN_SEQ)
    copy_grad_min_work
                the backward copies a dO the copy engine cannot read (stride 0) contiguous from this much
                work (Z*H*n_q*n_k*d, halved when causal) where q qualifies for descriptors (_copies_grad)
    gluon_fused the backward is the fused Gluon kernel (kernels/flash_gluon_bwd.py, SHIPPED_FUSED) on
                calls of at least fused_min_seq queries and at least that many keys, where _gluon_config
                allows it (as gluon_dkdv; neither dq nor dkdv pinned). Its dQ is summed by atomic adds, so
                not bitwise reproducible; False keeps the split backward everywhere
    fused_min_seq
                the queries, and the keys, a call needs for gluon_fused to apply (FUSED_MIN_SEQ)
    fused_persistent
                the fused kernel runs persistent (its order "ws-p": one program an SM taking key tile after
                key tile) where flash_gluon_bwd.persistent_error allows. Off by default: on an H100 it ran
                0.974x-0.998x the shipped backward (docs/results/h100/persistent/README.md)
    """

    autotune: bool = True
    head_group: int | None = None
    bwd_head_group: int | None = None
    tma: bool = True
    pinned: Mapping[str, triton.Config] = field(default_factory=dict)
    gluon_dkdv: bool = True
    gluon_dq: bool = False
    gluon_fwd: bool = True
    gluon_fwd_min_seq: int = GLUON_FWD_MIN_SEQ
    copy_grad_min_work: int = COPY_GRAD_MIN_WORK
    gluon_fused: bool = True
    fused_min_seq: int = FUSED_MIN_SEQ
    fused_persistent: bool = False
    key: tuple = field(init=False, repr=False, compare=False)  # hashable summary, for launch plans

    def __post_init__(self):
        for name in ("head_group", "bwd_head_group"):
            g = getattr(self, name)
            if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {g!r}")
        for name in ("copy_grad_min_work", "fused_min_seq", "gluon_fwd_min_seq"):
            work = getattr(self, name)
            if isinstance(work, bool) or not isinstance(work, int) or work < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {work!r}")
        unknown = set(self.pinned) - set(FLASH_KERNELS)
        if unknown:
            raise ValueError(f"unknown kernel(s) {sorted(unknown)} in pinned; expected {', '.join(FLASH_KERNELS)}")
        pinned = tuple(sorted((name, str(cfg)) for name, cfg in self.pinned.items()))
        object.__setattr__(self, "key", (self.autotune, self.head_group, self.bwd_head_group, self.tma, pinned,
                                         self.gluon_dkdv, self.gluon_dq, self.gluon_fwd, self.copy_grad_min_work,
                                         self.gluon_fused, self.fused_min_seq, self.gluon_fwd_min_seq,
                                         self.fused_persistent))


DEFAULT_OPTIONS = LaunchOptions()
_SPACES = {"fwd": FWD_CONFIGS, "dkdv": DKDV_CONFIGS, "dq": DQ_CONFIGS}
_TUNED = {"fwd": _fwd_tuned, "dkdv": _dkdv_tuned, "dq": _dq_tuned}
_HEURISTIC = {"fwd": _fwd, "dkdv": _dkdv, "dq": _dq}
_JIT = {"fwd": _fwd_kernel, "dkdv": _bwd_dkdv_kernel, "dq": _bwd_dq_kernel}


def autotuned_configs() -> dict[str, dict[str, str]]:
    """The configs the autotuner picked in this process, per kernel and key (for tuning notes)."""
    return {name: {str(k): str(v) for k, v in getattr(tuner, "cache", {}).items()} for name, tuner in _TUNED.items()}


def first_fitting_config(which: str, q: torch.Tensor, head_dim: int) -> triton.Config:
    """The first config of kernel `which`'s space that the pruning keeps for q's dtype and this head dim
    (what autotune=False launches)."""
    return _pruner(which)(_SPACES[which], {"Q": q}, HEAD_DIM=head_dim)[0]


def _launch_config(kernel_fixed, which: str, q: torch.Tensor, head_dim: int, options: LaunchOptions):
    """On GPU, the pinned config, else the autotuned kernel (or the first fitting config);
    on CPU (the interpreter), a small fixed tile."""
    if q.device.type == "cuda":
        cfg = options.pinned.get(which)
        if cfg is None and options.autotune:
            return _TUNED[which], {}
        if cfg is None:
            cfg = first_fitting_config(which, q, head_dim)
        launch = {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        if cfg.maxnreg is not None:
            launch["maxnreg"] = cfg.maxnreg
        return kernel_fixed, launch
    bm, bn = CPU_CONFIG[which]
    return kernel_fixed, {"BLOCK_M": bm, "BLOCK_N": bn}


def _head_group(is_causal: bool, zh: int, forced: int | None = None) -> int:
    """How many of a call's zh (z, h) pairs interleave their tiles in its grid (G of _program_ids):
    `forced` if given, else HEAD_GROUP for causal calls and 1 (head-major) for the rest. G must divide
    zh and the groups must fit grid axis 2 (MAX_GRID_YZ), so the wanted size is rounded down to a
    divisor that keeps them in (up, where none below does)."""
    want = forced if forced is not None else (HEAD_GROUP if is_causal else 1)
    fits = [g for g in _divisors(zh) if zh // g <= MAX_GRID_YZ]
    return max((g for g in fits if g <= want), default=fits[0])


def _divisors(n: int) -> list[int]:
    """The divisors of n >= 1, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


# Where the descriptor loads were measured and run through the GPU tests (16-bit inputs, d 64 and 128:
# docs/results/h200/flash_tma/); other head dims and fp32 keep the pointer loads.
TMA_HEAD_DIMS = (64, 128)
# The forward streams K and V through descriptors only at d=128: in turns against its pointer loads
# (docs/results/h200/flash_tma/) it ran 0.92x-1.0x on five d=64 shapes, and 0.94x-1.11x on four d=128
# shapes (gaining on three of five d=128 measurements). The dQ and dK/dV kernels take them at both.
TMA_FWD_HEAD_DIMS = (128,)


@functools.cache
def _sm_major(device: int) -> int:
    """The compute capability's major number of GPU `device` (torch's own query costs ~10 us a call)."""
    return torch.cuda.get_device_capability(device)[0]


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether a kernel may read a (Z, H, n, d) tensor through a tensor descriptor per (z, h):
    16-bit with d in TMA_HEAD_DIMS, unit stride along d, every other stride and the address 16-byte
    aligned, on a GPU with a copy engine (sm_90+) or in the interpreter. A stride-0 gradient (from
    `o.sum().backward()`) does not qualify: the backward copies it first (_copies_grad)."""
    elem = t.element_size()
    if elem != 2 or t.shape[-1] not in TMA_HEAD_DIMS:
        return False
    if t.device.type == "cuda" and _sm_major(t.get_device()) < 9:
        return False
    row = t.stride(-2)  # a descriptor's row stride, even over a single row (n = 1)
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and row > 0 and row * elem % 16 == 0
            and all(s > 0 and s * elem % 16 == 0 for s, n in zip(t.stride()[:-2], t.shape[:-2], strict=True) if n > 1))


def _tma_kv(k4: torch.Tensor, v4: torch.Tensor, options: LaunchOptions) -> bool:
    """Whether K and V qualify for descriptor loads (one flag for both): the dQ kernel takes them, the
    forward only at d in TMA_FWD_HEAD_DIMS."""
    return options.tma and _tma_ready(k4) and _tma_ready(v4)


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory where kernels build their tensor descriptors (128 bytes a program); the caching
    allocator's blocks are 512-byte aligned."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_scratch_allocator() -> None:
    """Give Triton an allocator for in-kernel descriptors unless this thread has one. Triton keeps it
    per thread (a ContextVar), and autograd runs backward on threads of its own."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _grid(n_rows: int, block: str, zh: int, group: int):
    """Launch grid (group, tiles, zh // group) over cdiv(n_rows, meta[block]) tiles and zh (batch x heads)."""
    return lambda meta: (group, triton.cdiv(n_rows, meta[block]), zh // group)


# ----------------------------------------------------------------------------------------------
# launch plans: the per-call Python work, done once per call signature
# ----------------------------------------------------------------------------------------------
# Launching through Triton costs tens of microseconds of Python per kernel: binding ~35 arguments,
# specialising each (is it 1? a multiple of 16? is the pointer 16-byte aligned?), hashing that,
# and the autotuner's and heuristics' own wrappers. Four launches per forward+backward made the
# kernel host-bound below ~1 ms of GPU work. None of it depends on the data, only on the call's
# signature: each tensor's shape, strides, dtype, device and pointer alignment, causal, precision
# and options. Every kernel argument but the tensors' addresses (strides, sizes, scales, constexprs,
# grid) follows from the signature. So the first call of a signature checks its inputs and goes
# through Triton (compiling or autotuning as needed), and keeps a plan of the whole call: what to
# allocate, and per kernel the compiled launcher with its fixed arguments. Later calls allocate the
# outputs and hand the launchers the new addresses: no checks, views or Triton Python. Nothing
# synchronises, so calls capture into a CUDA graph.
_PLANS: dict[tuple, object] = {}  # call signature -> plan(*tensors) of a whole forward or backward
MAX_PLANS = 4096  # distinct signatures kept; past this the table starts over (a sweep over shapes)
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _signature(*tensors: torch.Tensor) -> tuple:
    """The part of a call signature that comes from tensors: shape, strides, dtype, device and 16-byte alignment."""
    return tuple((t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16 == 0) for t in tensors)


def _remember(key: tuple, plan) -> None:
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan


class _KernelPlan:
    """One compiled kernel bound to a call signature: `plan(*tensors)` launches it on the current stream
    with the tensors' new addresses and the fixed rest (scalars, then constexprs, which the compiled
    launcher takes in signature order and skips).

    It calls the C function under Triton's launcher object (`compiled.run.launch`) itself, with what
    that object's `__call__` and `compiled[grid]` would add worked out once: the grid, the kernel's
    launch flags, no launch metadata or hooks. Tensors go in as integer addresses, which the C side
    takes as they are; a tensor object would cost it a `data_ptr()` call and a driver query
    (`cuPointerGetAttribute`) each. So do the fixed arguments' tensors (the persistent forward's tile
    schedule), which the plan keeps alive. A kernel that builds tensor descriptors gets its global scratch
    (`scratch_bytes`, 128 bytes a descriptor a program) from `_stream_scratch`.
    """

    __slots__ = ("launch", "grid", "head", "tail", "fixed", "keep", "device", "scratch_bytes")

    def __init__(self, launcher, function, packed_metadata, grid: tuple, fixed: tuple, device: int):
        self.launch, self.grid, self.device = launcher.launch, grid, device
        self.keep = tuple(a for a in fixed if isinstance(a, torch.Tensor))
        self.fixed = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in fixed)
        self.head = (function, launcher.launch_cooperative_grid, launcher.launch_pdl)
        self.tail = (packed_metadata, None, None, None)  # launch metadata, enter hook, exit hook
        n_programs = grid[0] * grid[1] * grid[2] * launcher.num_ctas
        self.scratch_bytes = n_programs * launcher.global_scratch_size

    def __call__(self, *tensors):
        stream = _current_stream(self.device)
        scratch = _stream_scratch(self.device, stream, self.scratch_bytes) if self.scratch_bytes else None
        self.launch(*self.grid, stream, *self.head, scratch, None, *self.tail, *map(_DATA_PTR, tensors), *self.fixed)


_DATA_PTR = torch.Tensor.data_ptr
_SCRATCH: dict[int, torch.Tensor] = {}  # stream handle -> the descriptor scratch of kernels launched on it
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def _stream_scratch(device: int, stream: int, nbytes: int):
    """Global memory for a launch's in-kernel tensor descriptors, on `stream`.

    Each program writes its descriptors to its own slot before it loads through them, and kernels on
    one stream run one after another, so every launch on a stream can share one buffer: it is kept per
    stream handle and grown when a launch needs more (the old block goes back to the caching allocator
    in stream order, after the kernels queued on it). Under CUDA-graph capture a launch gets a fresh
    block from the graph's pool instead, as Triton's own allocator gives it: a captured graph can be
    replayed on another stream while this stream runs, and the two must not share slots.
    """
    if _capturing():
        return torch.empty(nbytes, dtype=torch.int8, device=f"cuda:{device}")
    buf = _SCRATCH.get(stream)
    if buf is None or buf.numel() < nbytes:
        buf = _SCRATCH[stream] = torch.empty(nbytes, dtype=torch.int8, device=f"cuda:{device}")
    return buf.data_ptr()


def _direct_launcher(compiled):
    """Triton's launcher object for `compiled` when its C launch function can be called as _KernelPlan does
    (this Triton's CudaLauncher: the launch flags and scratch sizes as attributes, no profiler scratch,
    scratch alignment the caching allocator's 512-byte blocks meet), else None."""
    launcher = compiled.run
    needed = ("launch", "launch_cooperative_grid", "launch_pdl", "num_ctas", "global_scratch_size",
              "global_scratch_align", "profile_scratch_size")
    if not all(hasattr(launcher, a) for a in needed):
        return None
    if launcher.profile_scratch_size or (launcher.global_scratch_size and 512 % launcher.global_scratch_align):
        return None
    return launcher


def _kernel_plan(jit_fn, compiled, args: tuple, n_tensors: int, constexprs: dict, tiles: tuple[int, int],
                 grid, device: int, scratch: bool = False):
    """A plan for `compiled` (launched first with runtime `args`, the leading `n_tensors` of them tensors,
    on (BLOCK_M, BLOCK_N) `tiles`), or None when this Triton's compiled kernel cannot be launched by a plan.
    `scratch`: the kernel builds tensor descriptors, so a launch through Triton's wrapper needs Triton's
    scratch allocator on this thread."""
    from triton import knobs

    if compiled is None or not hasattr(compiled, "_init_handles"):
        return None
    compiled._init_handles()  # loads the binary; sets function and the launcher (run)
    if not all(hasattr(compiled, a) for a in ("__getitem__", "run", "function", "packed_metadata")):
        return None
    named = dict(zip(jit_fn.arg_names, args, strict=False))  # args: the leading runtime parameters
    named.update(constexprs)
    # the tiles an autotuner picked, where the kernel takes them (the warp-specialised Gluon forward has no
    # BLOCK_M: its consumers set it)
    named.update({name: tile for name, tile in zip(("BLOCK_M", "BLOCK_N"), tiles, strict=True)
                  if name in jit_fn.arg_names})
    named.update({name: rule(named) for name, rule in _EVEN_HEURISTICS.items() if name in jit_fn.arg_names})
    if set(named) != set(jit_fn.arg_names):  # a parameter this code does not know how to fill
        return None
    fixed = args[n_tensors:] + tuple(named[name] for name in jit_fn.arg_names[len(args):])
    grid = tuple(grid(named) if callable(grid) else grid)
    grid = grid + (1,) * (3 - len(grid))  # the compiled launcher reads all three axes
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    hooked = any(h is not None and getattr(h, "calls", True) for h in hooks)  # a HookChain with calls, or a callable
    launcher = None if hooked else _direct_launcher(compiled)
    if launcher is None:  # e.g. a profiler's launch hooks are installed: keep Triton's wrapper, which calls them
        runner = compiled[grid]

        def run(*tensors):
            if scratch:
                _ensure_scratch_allocator()
            runner(*tensors, *fixed)
        return run
    return _KernelPlan(launcher, compiled.function, compiled.packed_metadata, grid, fixed, device)


def _constexprs(is_causal: bool, head_dim: int, precision: str) -> dict:
    """The compile-time parameters the forward, dK/dV and dQ kernels share."""
    return dict(IS_CAUSAL=is_causal, HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), INPUT_PRECISION=precision)


def _launch(which: str, args: tuple, n_tensors: int, grid, constexprs: dict, q: torch.Tensor,
            head_dim: int, options: LaunchOptions, want_plan: bool):
    """Launch kernel `which` (fwd, dkdv or dq) through Triton with runtime `args` in signature order,
    picking the config (pinned, autotuned or first fitting). Returns a plan for later calls of the same
    signature when `want_plan` (None if none can be made)."""
    kernel, fixed = _launch_config(_HEURISTIC[which], which, q, head_dim, options)
    scratch = q.is_cuda and any(value is True for name, value in constexprs.items() if name.startswith("TMA_"))
    if scratch:
        _ensure_scratch_allocator()
    compiled = kernel[grid](*args, **constexprs, **fixed)
    tiles = _LAST_TUNED.pop(which, None) if kernel is _TUNED[which] else (fixed["BLOCK_M"], fixed["BLOCK_N"])
    if tiles is None or not want_plan:  # None: the autotuner did not say which tiles it launched
        return None
    return _kernel_plan(_JIT[which], compiled, args, n_tensors, constexprs, tiles, grid, q.get_device(), scratch)


def _gluon_config(which: str, is_causal: bool, q4, k4, v4, do4, options: LaunchOptions, o4=None):
    """The Gluon kernel's config for kernel `which` (fwd, dkdv, dq or fused) in this call (the shipped_config
    of kernels/flash_gluon.py or flash_gluon_bwd.py), or None where the Triton kernel runs (or for fused, the
    split backward): options.gluon_<which> off, a pinned config for `which` (for fused, for dq or dkdv),
    descriptors off, a tensor the copy engine cannot read (a stride-0 dO, say), not sm_90, or a head dim
    and mask where the Gluon kernel did not run faster. The forward takes no dO (do4 None); the dQ and
    fused kernels also read O (o4: flash_gluon_bwd.o_error)."""
    enabled = {"fwd": options.gluon_fwd, "dkdv": options.gluon_dkdv, "dq": options.gluon_dq,
               "fused": options.gluon_fused}[which]
    pinned = ("dq", "dkdv") if which == "fused" else (which,)
    if not (enabled and options.tma) or any(name in options.pinned for name in pinned):
        return None
    try:
        from kernels import flash_gluon, flash_gluon_bwd
    except ImportError:  # a Triton without Gluon
        return None
    if which == "fwd":
        cfg = flash_gluon.shipped_config(q4.shape[-1], is_causal)
        return cfg if cfg is not None and flash_gluon.supported(q4, k4, v4) is None else None
    cfg = flash_gluon_bwd.shipped_config(which, q4.shape[-1], is_causal)
    if cfg is None or flash_gluon_bwd.supported(q4, k4, v4, do4) is not None:
        return None
    if which in ("dq", "fused") and flash_gluon_bwd.o_error(o4) is not None:
        return None
    if which == "fused" and options.fused_persistent:
        return cfg._replace(order="ws-p")  # (flash_gluon_bwd.launch runs "ws" where it cannot be persistent)
    return cfg


def _launch_gluon(which: str, cfg, tensors: tuple, group: int, is_causal: bool, q: torch.Tensor, want_plan: bool,
                  dq_mode: str = "add"):
    """Launch the Gluon kernel `which` (fwd, dkdv, dq or fused, adding dQ as dq_mode says) at `cfg` on its
    tensors (the Triton kernel's, in the same order; the fused kernel's as flash_gluon_bwd.launch takes
    them); a plan for later calls as _launch returns."""
    from kernels import flash_gluon, flash_gluon_bwd

    if which == "fwd":
        jit_fn, compiled, args, constexprs, grid = flash_gluon.launch(tensors, is_causal, cfg, group)
    else:
        jit_fn, compiled, args, constexprs, grid = flash_gluon_bwd.launch(which, tensors, is_causal, cfg, group,
                                                                          dq_mode)
    if not want_plan:
        return None
    return _kernel_plan(jit_fn, compiled, args, len(tensors), constexprs, (cfg.block_m, cfg.block_n), grid,
                        q.get_device(), scratch=True)


def clear_launch_plans() -> None:
    """Forget every launch plan (the next call of each signature goes through Triton again)."""
    _PLANS.clear()


def _plannable(*tensors: torch.Tensor) -> bool:
    """A call can be planned when it runs on CUDA and each (Z, H, n, d) view shares its tensor's
    address (up to 4 dims: _as_zhnd adds size-1 axes), so a plan can launch on the tensors as given."""
    return _current_stream is not None and all(t.is_cuda and t.dim() <= 4 for t in tensors)


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                            fp32_precision: str = "tf32", out: torch.Tensor | None = None,
                            options: LaunchOptions = DEFAULT_OPTIONS) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel. Returns (O shaped like q, L shaped q.shape[:-1], fp32).

    `out`, if given, is written in place (it must be contiguous, shaped and typed like q).
    """
    key = None
    if out is None and q.is_cuda:
        key = ("fwd", bool(is_causal), fp32_precision, options.key, _signature(q, k, v))
        plan = _PLANS.get(key)
        if plan is not None:
            return plan(q, k, v)
    _check_inputs(q, k, v)
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    q4, k4, v4 = _as_zhnd(q), _as_zhnd(k), _as_zhnd(v)
    # outputs are allocated contiguous in the (Z, H, n, d) view; reshaping back is then a view
    if out is not None:
        if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
            raise ValueError("out must be contiguous and shaped and typed like q")
    else:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    o4 = out.view(q4.shape)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    precision = _precision(q.dtype, fp32_precision)
    is_causal = bool(is_causal)
    Z, H = q4.shape[0], q4.shape[1]
    sm_scale = 1.0 / math.sqrt(d)
    group = _head_group(is_causal, Z * H, options.head_group)
    tma_kv = d in TMA_FWD_HEAD_DIMS and _tma_kv(k4, v4, options)
    args = (q4, k4, v4, o4, lse, *_strides(q4), *_strides(k4), *_strides(v4), *_strides(o4),
            H, n_q, n_k, sm_scale * LOG2E, _seq_bucket(max(n_q, n_k)))
    want_plan = key is not None and _plannable(q, k, v)
    gluon = None
    if min(n_q, n_k) >= options.gluon_fwd_min_seq:
        gluon = _gluon_config("fwd", is_causal, q4, k4, v4, None, options)
    if gluon is not None:
        kernel = _launch_gluon("fwd", gluon, (q4, k4, v4, o4, lse), group, is_causal, q, want_plan)
    else:
        kernel = _launch("fwd", args, 5, _grid(n_q, "BLOCK_M", Z * H, group),
                         {**_constexprs(is_causal, d, precision), "TMA_KV": tma_kv}, q, d, options, want_plan)
    if kernel is not None:
        shape, dtype, device = q.shape, q.dtype, q.device

        def plan(q, k, v):
            o = torch.empty(shape, dtype=dtype, device=device)
            lse = torch.empty(shape[:-1], dtype=torch.float32, device=device)
            kernel(q, k, v, o, lse)
            return o, lse
        plan.kernels = (kernel,)
        _remember(key, plan)
    return out, lse


def _copies_grad(q: torch.Tensor, k: torch.Tensor, grad_out: torch.Tensor, is_causal: bool,
                 options: LaunchOptions) -> bool:
    """Whether the backward reads dO best copied contiguous: where the copy engine could read q but not
    dO, as with the stride-0 dO of `o.sum().backward()` (every element one address), and the call is
    large enough for the copy to pay (options.copy_grad_min_work). A launch plan remembers the answer.

    Left as it was, such a dO sends the dQ and dK/dV kernels to pointer loads, and at d=128 the backward
    from the Gluon dK/dV kernel to the Triton one. On the H200 the leaderboard step (16, 16384, 64) with
    `.sum().backward()` ran 5.09 ms eager against 4.63 ms under torch.compile, whose AOTAutograd hands
    in a contiguous dO (docs/results/h200/flash_leaderboard/). The copy writes dO once (32 MiB there)."""
    if grad_out.is_contiguous():
        return False
    work = q.numel() * k.shape[-2] // (2 if is_causal else 1)
    return (work >= options.copy_grad_min_work and options.tma and _tma_ready(_as_zhnd(q))
            and not _tma_ready(_as_zhnd(grad_out)))


def _fused_backward(q, k, v, out, lse, grad_out, is_causal: bool, cfg, group: int, copy_grad: bool, key,
                    want_plan: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) from the fused Gluon backward at `cfg` (_gluon_config): Delta and a zeroed fp32 dQ
    accumulator from one Triton kernel (flash_gluon_bwd.fused_prep), the fused kernel adding dQ as
    shipped_dq_mode says, then dQ scaled by 1/sqrt(d) and cast in one pass (flash_gluon_bwd.cast_dq).
    Remembers a plan under `key` when want_plan: all three kernels by their plans, where each can be made."""
    from kernels import flash_gluon_bwd

    q4, k4, v4, do4 = (_as_zhnd(t) for t in (q, k, v, grad_out))
    delta, acc, prep = flash_gluon_bwd.fused_prep_launch(out, grad_out)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    tensors = (q4, k4, v4, do4, lse, delta, dk.view(k4.shape), dv.view(v4.shape), acc.view(q4.shape))
    dq_mode = flash_gluon_bwd.shipped_dq_mode(q.shape[-1])
    spread = flash_gluon_bwd.spreads_columns(q.shape[-1], cfg, dq_mode)
    fused = _launch_gluon("fused", cfg, tensors, group, is_causal, q, want_plan, dq_mode)
    dq, cast = flash_gluon_bwd.cast_dq_launch(acc, q, spread)
    if fused is not None:
        prep = _side_plan(prep, 4, q)
        cast = None if cast is None else _side_plan(cast, 2, q)
        shapes, dtype, device = (k.shape, v.shape, lse.shape), q.dtype, q.device

        def plan(q, k, v, o, lse, do):
            if copy_grad:
                do = do.contiguous()
            if prep is None:
                delta, acc = flash_gluon_bwd.fused_prep(o, do)
            else:
                delta = torch.empty(shapes[2], dtype=torch.float32, device=device)
                acc = torch.empty(q.shape, dtype=torch.float32, device=device)
                prep(o, do, delta, acc)
            dk = torch.empty(shapes[0], dtype=dtype, device=device)
            dv = torch.empty(shapes[1], dtype=dtype, device=device)
            fused(q, k, v, do, lse, delta, dk, dv, acc)
            if cast is None:
                return flash_gluon_bwd.cast_dq(acc, q, spread), dk, dv
            dq = torch.empty(q.shape, dtype=dtype, device=device)
            cast(acc, dq)
            return dq, dk, dv
        plan.kernels = tuple(p for p in (prep, fused, cast) if p is not None)
        _remember(key, plan)
    return dq, dk, dv


def _side_plan(launched: tuple | None, n_tensors: int, q: torch.Tensor):
    """A plan for one of the fused backward's small Triton kernels (fused_prep's, the dQ cast's), from how it
    ran (jit function, compiled kernel, args, constexprs, grid; None where torch ran it), or None."""
    if launched is None:
        return None
    jit_fn, compiled, args, constexprs, grid = launched
    return _kernel_plan(jit_fn, compiled, args, n_tensors, constexprs, (None, None), grid, q.get_device())


def flash_attention_backward(q, k, v, out, lse, grad_out, is_causal: bool = False, fp32_precision: str = "tf32",
                             options: LaunchOptions = DEFAULT_OPTIONS,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the two backward kernels (dQ, which also writes Delta, then dK/dV; either is the Gluon one
    where options.gluon_dkdv or options.gluon_dq picks it, _gluon_config), or on calls of at least
    options.fused_min_seq queries and at least that many keys, where options.gluon_fused picks it, the fused Gluon
    backward instead (_fused_backward).

    Returns (dQ, dK, dV) shaped and typed like q, k, v.

    `lse` is the forward's L (contiguous, fp32, q.shape[:-1]).
    """
    if grad_out.dtype != q.dtype:
        grad_out = grad_out.to(q.dtype)
    key = None
    if q.is_cuda:  # keyed on dO as given: a plan makes the copy below itself, with no checks
        key = ("bwd", bool(is_causal), fp32_precision, options.key, _signature(q, k, v, out, lse, grad_out))
        plan = _PLANS.get(key)
        if plan is not None:
            return plan(q, k, v, out, lse, grad_out)
    copy_grad = _copies_grad(q, k, grad_out, is_causal, options)
    if copy_grad:
        grad_out = grad_out.contiguous()
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    q4, k4, v4, o4, do4 = (_as_zhnd(t) for t in (q, k, v, out, grad_out))
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dq4, dk4, dv4 = dq.view(q4.shape), dk.view(k4.shape), dv.view(v4.shape)
    if n_q == 0 or n_k == 0 or q.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    precision = _precision(q.dtype, fp32_precision)
    is_causal = bool(is_causal)
    Z, H = q4.shape[0], q4.shape[1]
    sm_scale = 1.0 / math.sqrt(d)
    group = _head_group(is_causal, Z * H,
                        options.head_group if options.bwd_head_group is None else options.bwd_head_group)
    want_plan = key is not None and _plannable(q, k, v, out, lse, grad_out)
    if min(n_q, n_k) >= options.fused_min_seq:
        fused = _gluon_config("fused", is_causal, q4, k4, v4, do4, options, o4)
        if fused is not None:
            return _fused_backward(q, k, v, out, lse, grad_out, is_causal, fused, group, copy_grad, key, want_plan)

    # the dQ kernel runs first: besides dQ it writes Delta, which the dK/dV kernel reads
    delta = torch.empty(lse.shape, dtype=torch.float32, device=lse.device)
    common = (H, n_q, n_k, sm_scale, sm_scale * LOG2E, _seq_bucket(max(n_q, n_k)))
    constexprs = _constexprs(is_causal, d, precision)
    tma_kv = _tma_kv(k4, v4, options)
    tma_q, tma_do = options.tma and _tma_ready(q4), options.tma and _tma_ready(do4)
    gluon = _gluon_config("dq", is_causal, q4, k4, v4, do4, options, o4)
    if gluon is not None:
        dq_ = _launch_gluon("dq", gluon, (q4, k4, v4, o4, do4, lse, delta, dq4), group, is_causal, q, want_plan)
    else:
        dq_ = _launch("dq",
                      (q4, k4, v4, o4, do4, lse, delta, dq4, *_strides(q4), *_strides(k4), *_strides(v4),
                       *_strides(o4), *_strides(do4), *_strides(dq4), *common), 8,
                      _grid(n_q, "BLOCK_M", Z * H, group), {**constexprs, "TMA_KV": tma_kv}, q, d, options,
                      want_plan)
    gluon = _gluon_config("dkdv", is_causal, q4, k4, v4, do4, options)
    if gluon is not None:
        dkdv = _launch_gluon("dkdv", gluon, (q4, k4, v4, do4, lse, delta, dk4, dv4), group, is_causal, q, want_plan)
    else:
        dkdv = _launch("dkdv",
                       (q4, k4, v4, do4, lse, delta, dk4, dv4, *_strides(q4), *_strides(k4), *_strides(v4),
                        *_strides(do4), *_strides(dk4), *_strides(dv4), *common), 8,
                       _grid(n_k, "BLOCK_N", Z * H, group), {**constexprs, "TMA_Q": tma_q, "TMA_DO": tma_do},
                       q, d, options, want_plan)
    if dkdv is not None and dq_ is not None:
        shapes, dtype, device = (q.shape, k.shape, v.shape, lse.shape), q.dtype, q.device

        def plan(q, k, v, o, lse, do):
            if copy_grad:
                do = do.contiguous()
            dq = torch.empty(shapes[0], dtype=dtype, device=device)
            dk = torch.empty(shapes[1], dtype=dtype, device=device)
            dv = torch.empty(shapes[2], dtype=dtype, device=device)
            delta = torch.empty(shapes[3], dtype=torch.float32, device=device)
            dq_(q, k, v, o, do, lse, delta, dq)
            dkdv(q, k, v, do, lse, delta, dk, dv)
            return dq, dk, dv
        plan.kernels = (dq_, dkdv)
        _remember(key, plan)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------
# custom ops: what torch.compile sees
# ----------------------------------------------------------------------------------------------
# Dynamo cannot trace the launchers (Python caches, Triton's own wrappers), so under torch.compile
# the kernels run as two opaque ops with fake (shape-only) implementations: the graph keeps
# attention as one node each way instead of breaking around it. Eager calls skip the dispatcher
# and call the launchers directly, which keeps their host cost at the launch plans' level.
_FWD_SCHEMA = "(Tensor q, Tensor k, Tensor v, bool is_causal, str fp32_precision) -> (Tensor, Tensor)"
_BWD_SCHEMA = ("(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool is_causal, "
               "str fp32_precision) -> (Tensor, Tensor, Tensor)")


def _register_ops():
    """Define benchlab::flash_attention_fwd and benchlab::flash_attention_bwd (once per process)."""
    try:  # a second copy of this file in one process (benchmarks/flash_ab.py) reuses the first's ops
        return torch.ops.benchlab.flash_attention_fwd, torch.ops.benchlab.flash_attention_bwd
    except (AttributeError, RuntimeError):
        pass

    def fwd_impl(q, k, v, is_causal, fp32_precision):
        return flash_attention_forward(q, k, v, is_causal, fp32_precision)

    def bwd_impl(grad_out, q, k, v, out, lse, is_causal, fp32_precision):
        return flash_attention_backward(q, k, v, out, lse, grad_out, is_causal, fp32_precision)

    fwd_op = torch.library.custom_op("benchlab::flash_attention_fwd", fwd_impl, mutates_args=(),
                                     schema=_FWD_SCHEMA)
    bwd_op = torch.library.custom_op("benchlab::flash_attention_bwd", bwd_impl, mutates_args=(),
                                     schema=_BWD_SCHEMA)

    @fwd_op.register_fake
    def _(q, k, v, is_causal, fp32_precision):
        _check_inputs(q, k, v)
        _precision(q.dtype, fp32_precision)
        return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)

    @bwd_op.register_fake
    def _(grad_out, q, k, v, out, lse, is_causal, fp32_precision):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        q, k, v, is_causal, fp32_precision = inputs
        ctx.save_for_backward(q, k, v, output[0], output[1])
        ctx.is_causal, ctx.fp32_precision = is_causal, fp32_precision

    def backward(ctx, grad_out, _grad_lse):  # L is an internal output: its gradient is not propagated
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.benchlab.flash_attention_bwd(grad_out, q, k, v, out, lse, ctx.is_causal,
                                                             ctx.fp32_precision)
        return dq, dk, dv, None, None

    fwd_op.register_autograd(backward, setup_context=setup_context)
    return torch.ops.benchlab.flash_attention_fwd, torch.ops.benchlab.flash_attention_bwd


_fwd_op, _bwd_op = _register_ops()


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 forward and backward in Triton. `.apply(q, k, v, is_causal=False)`.

    fp32 inputs use TF32 tensor-core dot products by default; pass fp32_precision ("tf32x3" or
    "ieee", see FP32_PRECISIONS) as a fifth argument. A sixth, LaunchOptions, sets tiles and grid
    order (eager only). Under torch.compile (including `torch.compile(FlashAttentionTriton.apply)`)
    both directions run as the custom ops above, so the graph does not break.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, fp32_precision="tf32", options=None):
        if torch.compiler.is_compiling():
            out, lse = _fwd_op(q, k, v, bool(is_causal), fp32_precision)
        else:
            out, lse = flash_attention_forward(q, k, v, is_causal, fp32_precision,
                                               options=options or DEFAULT_OPTIONS)
        ctx.save_for_backward(lse, q, k, v, out)
        ctx.is_causal = bool(is_causal)
        ctx.fp32_precision = fp32_precision
        ctx.options = options
        return out

    @staticmethod
    def backward(ctx, grad_out):
        lse, q, k, v, out = ctx.saved_tensors
        if torch.compiler.is_compiling():
            dq, dk, dv = _bwd_op(grad_out, q, k, v, out, lse, ctx.is_causal, ctx.fp32_precision)
        else:
            dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.is_causal, ctx.fp32_precision,
                                                  ctx.options or DEFAULT_OPTIONS)
        return dq, dk, dv, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                    fp32_precision: str = "tf32", options: LaunchOptions | None = None) -> torch.Tensor:
    """Functional form of FlashAttentionTriton."""
    return FlashAttentionTriton.apply(q, k, v, is_causal, fp32_precision, options)


def triton_interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import time)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - layout of very old/new Triton
        return False
    return isinstance(_fwd_kernel, InterpretedFunction)
