"""FlashAttention-2's backward kernels in Gluon for Hopper (sm_90) beside kernels/flash_triton.py's, with the
same inputs and outputs: dK/dV (which flash_triton's backward launches at d=128), dQ, a fused one and a
warp-specialised dK/dV.

Why. In Triton 3.6 a dK/dV program waits for each score matmul before it can do anything else: S^T
and dP^T are issued one after the other, each waited for at once, so the exp2 of P^T and the product
dS^T = P^T (dP^T - Delta) never run while the tensor cores work (docs/results/h200/flash_tuning.md,
steps 17 and 22). Gluon leaves the matmul waits to the kernel. Per query tile t of a key tile:

    issue  S^T  = K Q(t)^T                     (async wgmma, both operands in shared memory)
    issue  dP^T = V dO(t)^T - Delta(t)         (async; the accumulator starts at -Delta)
    wait until only dP^T is in flight          -> S^T (and dK's matmul of tile t-1 has finished)
    P^T = exp2(S^T * scale - L(t))             (CUDA cores, while dP^T runs)
    issue  dV += P^T dO(t)                     (async, P^T from registers)
    wait until only dV is in flight            -> dP^T
    dS^T = P^T * dP^T                          (CUDA cores, while dV runs)
    issue  dK += dS^T Q(t)                     (async)
    wait for dV and dK; refill tile t's slot

K and V are loaded once; Q and dO stream through a ring of STAGES shared-memory slots filled by the
copy engine (tensor descriptors). An async matmul's result cannot be carried from one iteration to
the next in Gluon (its type differs from a tensor's), so each step ends with every matmul done. The
"defer" order (ORDERS) gets around that: tile t's dK matmul is issued at step t+1, behind S^T and
dP^T, so it runs while the warps compute P^T; the slot it reads is refilled one step later, so it
needs three slots. "plain" issues and waits for each matmul in turn, for comparison.

_fused_kernel is a study (docs/results/h200/flash_gluon_bwd/README.md, not used by flash_triton): the
same program also computes dQ(t) = dS K beside dK's matmul (dS^T through shared memory) and adds it
into an fp32 accumulator, by Triton's atomic_add or by a red.add through inline PTX (DQ_MODES):
five matmuls a tile pair where the split backward does seven. On the H200 it ran slower.
_dkdv_ws_kernel (order "ws") is another: the dK/dV program warp-specialised, a producer warp streaming Q
and dO into slots that one to three consumer warpgroups of WG_KEYS keys share; also slower there.
_fused_ws_kernel (the fused kernel's order "ws") puts the two together: each consumer also adds its keys'
share of dQ, by atom, red, or (DQ_MODE 3, "tma") one bulk reduction of a staged tile by the copy engine,
the cheapest of the three on an H100 but the kernel still slower than the split backward there; "turns"
(DQ_MODE 4) halves that traffic: the two consumers share their dS^T and take the tiles in turns, each
adding the dQ of the program's 128 keys on its tiles. That form is what flash_triton's backward runs at
d=64 from seq 4096 (SHIPPED_FUSED, flash_triton.FUSED_MIN_SEQ; docs/results/h200/fused_gate/README.md).
"halves" (DQ_MODE 6) has both consumers add on every tile, each its half of dQ's columns over both
consumers' keys (FA-3's split of that matmul): half the registers for dQ, so the fused kernel fits at
d=128, where flash_triton runs it from seq 4096 too. "turns-t" (DQ_MODE 5)
adds dQ^T instead, into a transposed accumulator (dq_accumulator, cast_dq), so two or three consumers can
take 16 to 64 query rows a step; it was no faster (docs/results/h200/flash_gluon_bwd/README.md). With `rotate`
(launch_spec) each non-causal program takes the query tiles from its own on, so the programs side by side add
into different dQ rows; no faster either (docs/results/h100/gluon_paths/README.md). The "-rs"
orders (RS_ORDERS) hold the score matmuls' resident operands in registers
(docs/results/h200/flash_rs/README.md). Order "ws-p" is _fused_ws_kernel persistent
(_fused_ws_persistent_kernel, two consumers, dQ by the copy engine): one program an SM takes key tile after
key tile from a schedule (flash_gluon.tile_schedule of key_tile_costs), the Q/dO ring and the dS^T parities
running on from tile to tile, so the next key tile's first loads and its K and V go under the last tile's
steps and its dK and dV stores. Its dK and dV are the one-tile kernel's bit for bit, but on an H100 it ran
no faster (docs/results/h100/persistent/README.md), so it is not shipped (LaunchOptions.fused_persistent).

Same contract as the Triton dK/dV kernel: (Z, H, n, d) views with their own strides (unit stride
along d, 16-byte aligned rows), causal aligned top-left, L the forward's natural-log logsumexp and
Delta = rowsum(O * dO), both fp32 (Z*H, n_q); dK, dV in the input dtype. 16-bit inputs, d 64 or 128,
on sm_90 only; Gluon has no interpreter, so CPU tests compile it for sm_90
(tests/kernels/test_flash_gluon_bwd.py) and only a GPU runs it.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton._C.libtriton import ir as _ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin as _builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernels import flash_gluon
from kernels import flash_triton as ft
from kernels.flash_gluon import (
    _block_barrier,
    _key_tiles,
    _kv_ring,
    _matrix_descriptor,
    _mma_layout,
    _program_tile,
    _refill,
    _scheduled_tiles,
    _tile_row,
    _ws_stream,
)
from kernels.names import GLUON_RS_SUFFIX

# loop orders (the kernel's ORDER is the index): "overlap" as drawn above, "defer" that with dK's
# matmul of tile t issued behind tile t+1's S^T and dP^T, "plain" each matmul waited for at once
ORDERS = ("overlap", "defer", "plain")
# the same orders with K and V held in registers as the A operands of S^T and dP^T (KV_REGS; in the dQ
# kernel, Q and dO as those of S and dP: QDO_REGS). A wgmma
# with both operands in shared memory reads A (64 x 16) and B (16 x N) for each 64 x N x 16 block: at
# N = 64, 4 KB in the 32 clocks the tensor cores take, 128 B a clock, which is all the SM's shared
# memory gives; with A in registers, 2 KB. The price is K and V's registers: 32 a thread at 64 keys a
# warpgroup and d=64. (Triton keeps such an operand in shared memory and reloads it every step.)
RS_SUFFIX = GLUON_RS_SUFFIX
RS_ORDERS = tuple(o + RS_SUFFIX for o in ORDERS)


@gluon.jit
def _descriptor(X, z, h, stride_z, stride_h, stride_row, n, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr,
                layout: gl.constexpr):
    """A tensor descriptor of (z, h)'s (n, HEAD_DIM) rows of X in ROWS-row tiles; the copy engine fills
    rows past n with zeros on loads and clips them on stores."""
    return tma.make_tensor_descriptor(X + z.to(gl.int64) * stride_z + h.to(gl.int64) * stride_h, shape=[n, HEAD_DIM],
                                      strides=[stride_row, 1], block_shape=[ROWS, HEAD_DIM], layout=layout)


@gluon.jit
def _row_stats(l_base, delta_base, start_m, n_q, BLOCK_M: gl.constexpr, st_layout: gl.constexpr):
    """L * log2(e) and Delta of query rows [start_m, start_m + BLOCK_M), laid out along S^T's columns.
    Rows past n_q get L = +inf (their P is exactly 0) and Delta = 0."""
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    lse = gl.load(l_base + offs_m, mask=offs_m < n_q, other=float("inf"))
    delta = gl.load(delta_base + offs_m, mask=offs_m < n_q, other=0.0)
    return lse * 1.4426950408889634, delta


@gluon.jit
def _probabilities(st, lse2, start_m, start_n, qk_scale, MASKED: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, st_layout: gl.constexpr):
    """P^T = exp2(S^T * scale - L log2 e); on a causal diagonal tile (MASKED), 0 where key start_n + j
    is right of query start_m + i."""
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
    if MASKED:
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
        pt = gl.where(gl.expand_dims(offs_n, 1) <= gl.expand_dims(offs_m, 0), pt, 0.0)
    return pt


@gluon.jit
def _refill_q(q_desc, do_desc, q_smem, do_smem, bars, slot, tile, lo, n_iter, BLOCK_M: gl.constexpr,
              NUM_WARPS: gl.constexpr):
    """Start the copy of query tile `tile` (if there is one) into `slot`, whose tile the block has used
    (a block barrier first when two warpgroups share the slot)."""
    if NUM_WARPS > 4:
        _block_barrier()
    bar = bars.index(slot)
    mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred=tile < n_iter)
    tma.async_copy_global_to_shared(q_desc, [lo + tile * BLOCK_M, 0], bar, q_smem.index(slot), pred=tile < n_iter)
    tma.async_copy_global_to_shared(do_desc, [lo + tile * BLOCK_M, 0], bar, do_smem.index(slot), pred=tile < n_iter)


@gluon.jit
def _add_dq(dq_base, dq_t, start_m, dq_rows, RED: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
            dq_layout: gl.constexpr):
    """Add one key tile's share of query rows [start_m, start_m + BLOCK_M)'s dQ into the fp32 (n_q, HEAD_DIM)
    accumulator at dq_base, rows below dq_rows only (0 adds nothing: the probe). Relaxed atomics, since
    only the sum is wanted: Triton's atomic_add (an atom.add that returns the old values), or with RED a
    red.add, which returns nothing."""
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    ptrs = dq_base + gl.expand_dims(offs_m.to(gl.int64) * HEAD_DIM, 1) + gl.expand_dims(offs_d, 0)
    row_ok = gl.expand_dims(offs_m < dq_rows, 1) & gl.expand_dims(offs_d < HEAD_DIM, 0)  # (BLOCK_M, HEAD_DIM)
    if RED:
        # pack=2: each asm takes two neighbouring elements of a thread, which in the wgmma accumulator
        # layout are columns c and c+1 of one row, 8 bytes apart: one v2 add. $0 $1 out, $2 $3 the
        # addresses, $4 $5 the row masks, $6 $7 the values.
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $4, 0; @p red.relaxed.gpu.global.add.v2.f32 [$2], {$6, $7}; "
            "mov.b32 $0, 0; mov.b32 $1, 0; }",
            "=r,=r,l,l,r,r,f,f", [ptrs.to(gl.int64), row_ok.to(gl.int32), dq_t], dtype=gl.int32,
            is_pure=False, pack=2)
    else:
        gl.atomic_add(ptrs, dq_t, mask=row_ok, sem="relaxed")


@_builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """The copy engine adds the shared-memory tile src into the global tile at coord
    (cp.reduce.async.bulk.tensor ... .add). Triton's own op (ttng.async_tma_reduce, what tl's descriptor
    atomic_add lowers to), which Gluon 3.6 and 3.7.1 can build but do not wrap; it completes as a TMA
    store does (tma.store_wait)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _spread_columns(x):
    """x's columns relabelled within each group of 32 (one 128-byte row of a 128-byte swizzled fp32 tile):
    column 8a + 4b + c (a < 4, b < 2, c < 4) becomes 16b + 4a + c. No data moves; the stores change. In a
    wgmma accumulator lane l holds columns 8n + 2 (l % 4) + {0, 1}, so one STS.64 writes rows r..r+7 at 32
    contiguous bytes each, and its first half-warp (rows r..r+3) hit 16-byte chunks {2j, 2j+1} XOR r: rows r
    and r^1 the same two chunks, two wavefronts a half-warp where one would do. Relabelled, a row's 32 bytes
    are chunks j and j+4, and rows r..r+3 take eight different chunks. cast_dq undoes it (spreads_columns)."""
    ROWS: gl.constexpr = x.shape[0]
    COLS: gl.constexpr = x.shape[1]
    if COLS % 32 == 0:  # (narrower tiles take a narrower swizzle, and stay as they are: spreads_columns)
        y = x.reshape([ROWS, COLS // 32, 4, 2, 4]).permute((0, 1, 3, 2, 4)).reshape([ROWS, COLS])
    else:
        y = x
    return y


@gluon.jit
def _add_dq_tma(dq_desc, dq_stage, dq_t, start_m, TRANSPOSED: gl.constexpr = False, COL: gl.constexpr = 0):
    """DQ_MODE 3: the tile's dQ share into this warpgroup's staging tile in shared memory, then one bulk
    reduction of it into the accumulator's rows [start_m, + BLOCK_M) (rows past the descriptor's are
    clipped), issued by an elected thread per 128-byte column box, where the other modes have every
    thread add its elements. TRANSPOSED (DQ_MODE 5): the tile is dQ^T, (HEAD_DIM, BLOCK_M), added into
    columns [start_m, + BLOCK_M) of the (HEAD_DIM, n_q) accumulator. COL (DQ_MODE 6): the tile is columns
    [COL, + its width) of those rows. The
    previous tile's reduction has to have read the staging tile first (store_wait, then the barrier)."""
    tma.store_wait(0)
    _block_barrier()
    if TRANSPOSED:
        dq_stage.store(dq_t)
    else:
        dq_stage.store(_spread_columns(dq_t))
    fence_async_shared()
    _block_barrier()
    if TRANSPOSED:
        _tma_reduce_add(dq_desc, [0, start_m], dq_stage)
    else:
        _tma_reduce_add(dq_desc, [start_m, COL], dq_stage)


@gluon.jit
def _share_ds(ds_smem, ds_full, ds_free, ds, t, WHICH: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """DQ_MODE 4 to 6: consumer WHICH's dS^T of query tile t (the ring's count of it: a persistent program
    counts on from key tile to key tile) into its slot of the tile's parity p (slot
    p * CONSUMERS + WHICH of ds_smem), where the consumers that add tile t's dQ read it; ds_full[p]
    counts every consumer's write. The slot was last read by tile t-2's dQ matmuls, so those have to be
    done first (ds_free[p], which completes once per tile of parity p when every reader has arrived (one in
    modes 4 and 5, each consumer in 6): tile t-2 was its (t//2 - 1)-th completion)."""
    p = t % 2
    mbarrier.wait(ds_free.index(p), (t // 2 + 1) & 1, pred=t >= 2)
    ds_smem.index(p * CONSUMERS + WHICH).store(ds)
    fence_async_shared()
    _block_barrier()  # the whole warpgroup's dS^T is written before its one thread arrives
    mbarrier.arrive(ds_full.index(p), count=1)


@gluon.jit
def _turn_dq(t, ds_smem, ds_full, k_all, dq_layout: gl.constexpr, CONSUMERS: gl.constexpr, TRANSPOSED: gl.constexpr,
             COL: gl.constexpr = 0, COLS: gl.constexpr = 0):
    """DQ_MODE 4 and 5, on the tiles that are this consumer's turn: once every consumer's dS^T of tile t
    is shared (ds_full), issue the program's whole share of its dQ over all CONSUMERS x WG_KEYS keys
    (async; the caller waits, then arrives on ds_free). DQ_MODE 4: dQ = sum_c dS_c K_c, (BLOCK_M,
    HEAD_DIM). DQ_MODE 5 (TRANSPOSED): dQ^T = sum_c K_c^T dS_c^T, (HEAD_DIM, BLOCK_M), so the query tile
    is the matmul's N and can be 16 or 32 rows where wgmma's M is 64. DQ_MODE 6 (COLS > 0), on every tile:
    columns [COL, + COLS) of mode 4's dQ, from those columns of K."""
    p = t % 2
    mbarrier.wait(ds_full.index(p), (t // 2) & 1)
    a, b = _dq_operands(ds_smem.index(p * CONSUMERS), k_all.index(0), TRANSPOSED, COL, COLS)
    zero = gl.zeros([gl.constexpr(a.shape[0]), gl.constexpr(b.shape[1])], gl.float32, dq_layout)
    dq_tok = warpgroup_mma(a, b, zero, use_acc=False, is_async=True)
    for c in gl.static_range(1, CONSUMERS):
        a, b = _dq_operands(ds_smem.index(p * CONSUMERS + c), k_all.index(c), TRANSPOSED, COL, COLS)
        dq_tok = warpgroup_mma(a, b, dq_tok, is_async=True)
    return dq_tok


@gluon.jit
def _dq_operands(ds_t, k_t, TRANSPOSED: gl.constexpr, COL: gl.constexpr = 0, COLS: gl.constexpr = 0):
    """One consumer's (A, B) in _turn_dq's matmul, both in shared memory: dS K with dS^T read transposed,
    (BLOCK_M, WG_KEYS) x (WG_KEYS, HEAD_DIM), or with COLS only K's columns [COL, + COLS); or TRANSPOSED,
    dQ^T = K^T dS^T, (HEAD_DIM, WG_KEYS) x (WG_KEYS, BLOCK_M)."""
    if TRANSPOSED:
        a = k_t.permute((1, 0))
        b = ds_t
    else:
        a = ds_t.permute((1, 0))
        if COLS > 0:
            b = k_t.slice(COL, COLS, dim=1)
        else:
            b = k_t
    return a, b


@gluon.jit
def _stage_ds(ds_smem, ds, NUM_WARPS: gl.constexpr):
    """Write this tile's dS^T where the dQ matmul reads it, once every matmul that read the one before has
    finished (with two warpgroups, the other one's too)."""
    if NUM_WARPS > 4:
        _block_barrier()
    ds_smem.store(ds)
    fence_async_shared()
    _block_barrier()


@gluon.jit
def _dq_matmul(ds_smem, k_smem, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, dq_layout: gl.constexpr,
               IS_ASYNC: gl.constexpr):
    """dQ of one query tile from this key tile: dS K, dS^T read transposed from shared memory, K resident."""
    zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    return warpgroup_mma(ds_smem.permute((1, 0)), k_smem, zero, use_acc=False, is_async=IS_ASYNC)


@gluon.jit
def _resident_operands(x_smem, y_smem, IN_REGISTERS: gl.constexpr, acc_layout: gl.constexpr):
    """Two tiles a program keeps for its whole loop, as the A operands of matmuls whose accumulator has
    acc_layout: loaded into registers once (the "-rs" orders, RS_ORDERS), or left in shared memory."""
    if IN_REGISTERS:
        layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        return x_smem.load(layout), y_smem.load(layout)
    else:
        return x_smem, y_smem


@gluon.jit
def _step(t, k_smem, v_smem, q_smem, do_smem, bars, q_desc, do_desc, dk, dv, ds_op, prev, lse2, delta, l_base,
          delta_base, lo, n_q, n_iter, start_n, qk_scale, ds_smem, dq_base, dq_rows, MASKED: gl.constexpr,
          ORDER: gl.constexpr, DQ_MODE: gl.constexpr, DQ_DEFER: gl.constexpr, HEAD_DIM: gl.constexpr,
          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_WARPS: gl.constexpr,
          st_layout: gl.constexpr, op_layout: gl.constexpr, dq_layout: gl.constexpr, empty_bars=None,
          WS: gl.constexpr = False, dq_stage=None, k_all=None, ds_full=None, ds_free=None,
          WHICH: gl.constexpr = 0, CONSUMERS: gl.constexpr = 2, shift=0, ROTATE: gl.constexpr = False,
          DQ_COLS: gl.constexpr = 0, base=0):
    """Query tile t of this key tile, in loop order ORDER (module docstring). Returns the new (dK, dV),
    ORDER 1's (dS^T, its slot) of this tile, and the next tile's (L log2 e, Delta). DQ_MODE 1 or 2 (the
    fused backward, ORDER 0 only) also adds this key tile's share of the tile's dQ, dS K, into the fp32
    accumulator at dq_base (_add_dq: 1 by atom, 2 by red); with DQ_DEFER it issues the tile before's dQ
    matmul behind this tile's scores and leaves this tile's dS^T in shared memory for the next step.
    WS (a consumer of the warp-specialised kernel, ORDER 0 with no dQ): the slot is released through
    empty_bars for the producer to refill, instead of refilled here. DQ_MODE 3 (a consumer of the
    warp-specialised kernel) adds dQ by the copy engine instead (_add_dq_tma): dq_base is then the
    accumulator's tensor descriptor and dq_stage the warpgroup's fp32 staging tile. DQ_MODE 4 (consumer
    WHICH of CONSUMERS) shares its dS^T instead (_share_ds: ds_smem is then every slot of both parities),
    and on the tiles that are its turn adds the whole program's share, dS K over every consumer's keys
    (k_all), the same way (_turn_dq); DQ_MODE 5 the same as dQ^T into a (HEAD_DIM, n_q) accumulator; DQ_MODE 6
    on every tile, columns [WHICH * DQ_COLS, + DQ_COLS) of that share.
    ROTATE (the warp-specialised kernel, non-causal): step t takes query tile (t + shift) % n_iter (_tile_row).
    base (the persistent kernel's): the ring's steps before this key tile's, so step t is the ring's step
    base + t, which picks the Q/dO slot and the dS^T parity (whose turn a tile is goes by t)."""
    dtype: gl.constexpr = k_smem.dtype
    r = base + t  # the ring's count of this step (t where a program takes one key tile)
    slot = r % STAGES
    start_m = _tile_row(t, lo, shift, n_iter, BLOCK_M, ROTATE)
    if ROTATE:  # the next tile's first row, whose row stats this step prefetches
        next_m = _tile_row(t + 1, lo, shift, n_iter, BLOCK_M, ROTATE)
    else:  # the same row; written so, the shipped kernels compile to the SASS they had before ROTATE
        next_m = start_m + BLOCK_M
    q_t = q_smem.index(slot)
    do_t = do_smem.index(slot)
    mbarrier.wait(bars.index(slot), (r // STAGES) & 1)
    zeros = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    minus_delta = zeros - gl.expand_dims(delta, 0)
    if ORDER == 0:
        st_tok = warpgroup_mma(k_smem, q_t.permute((1, 0)), zeros, use_acc=False, is_async=True)
        dpt_tok = warpgroup_mma(v_smem, do_t.permute((1, 0)), minus_delta, is_async=True)
        if DQ_DEFER:  # the tile before's dQ, from its dS^T left in shared memory, behind this tile's scores
            dq_tok = _dq_matmul(ds_smem, k_smem, BLOCK_M, HEAD_DIM, dq_layout, True)
        if DQ_MODE != 6:
            lse2_next, delta_next = _row_stats(l_base, delta_base, next_m, n_q, BLOCK_M, st_layout)
        st = warpgroup_mma_wait(1 + DQ_DEFER, deps=[st_tok])  # S^T done; dP^T (and dQ) may still run
        pt = _probabilities(st, lse2, start_m, start_n, qk_scale, MASKED, BLOCK_M,
                            BLOCK_N, st_layout)
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv_tok = warpgroup_mma(pt_op, do_t, dv, is_async=True)
        dpt = warpgroup_mma_wait(1 + DQ_DEFER, deps=[dpt_tok])  # dP^T done; dV (and dQ) may still run
        ds = (pt * dpt).to(dtype)
        ds_op = gl.convert_layout(ds, op_layout)
        dk_tok = warpgroup_mma(ds_op, q_t, dk, is_async=True)
        if DQ_DEFER:
            dk, dv, dq_t, pt_op, ds_op = warpgroup_mma_wait(0, deps=[dk_tok, dv_tok, dq_tok, pt_op, ds_op])
            if t > 0:
                _add_dq(dq_base, dq_t, start_m - BLOCK_M, dq_rows, DQ_MODE == 2, BLOCK_M, HEAD_DIM, dq_layout)
            _stage_ds(ds_smem, ds, NUM_WARPS)  # for the next step's dQ matmul (or the one after the loop)
        elif DQ_MODE == 0:
            dk, dv, pt_op, ds_op = warpgroup_mma_wait(0, deps=[dk_tok, dv_tok, pt_op, ds_op])
        elif DQ_MODE >= 4:
            # the consumers take the tiles' dQ in turns: one (64, d) add a tile for the program's keys, where
            # DQ_MODE 3 makes one a consumer (DQ_MODE 5: dQ^T, the query tile as the matmul's N)
            # DQ_MODE 6: every consumer every tile, each its DQ_COLS columns of the program's dQ share
            if DQ_MODE == 6:
                # dV (issued before dK) done before dQ's accumulator is taken, so P^T's 16 registers are free
                # by then: at d=128 dK and dV hold 128 of a consumer's 240, and with P^T, dS^T and dQ's 32 on
                # top ptxas serialised every wgmma of the kernel (its C7512) and spilled in the loop
                dv, pt_op = warpgroup_mma_wait(1, deps=[dv_tok, pt_op])
            _share_ds(ds_smem, ds_full, ds_free, ds, r, WHICH, CONSUMERS)
            # (turns go by the key tile's own steps: a causal consumer skips its first ones, never its turn)
            if DQ_MODE == 6 or t % CONSUMERS == WHICH:
                dq_tok = _turn_dq(r, ds_smem, ds_full, k_all, dq_layout, CONSUMERS, DQ_MODE == 5, WHICH * DQ_COLS,
                                  DQ_COLS)
                if DQ_MODE == 6:  # the next tile's row stats under dQ's matmul, not S^T's and dP^T's: 32
                    # registers fewer while those are in flight (d=128 non-causal: 8 spill loads a tile, not 15)
                    lse2_next, delta_next = _row_stats(l_base, delta_base, next_m, n_q, BLOCK_M, st_layout)
                dk, dv, dq_t, pt_op, ds_op = warpgroup_mma_wait(0, deps=[dk_tok, dv_tok, dq_tok, pt_op, ds_op])
                mbarrier.arrive(ds_free.index(r % 2), count=1)  # every slot of parity r % 2 read (by this one)
                _add_dq_tma(dq_base, dq_stage, dq_t, start_m, DQ_MODE == 5, WHICH * DQ_COLS)
            else:
                dk, dv, pt_op, ds_op = warpgroup_mma_wait(0, deps=[dk_tok, dv_tok, pt_op, ds_op])
        else:
            # dQ(t) = dS K (the tile before's dQ matmul finished in its step; with two warpgroups the
            # block barrier of that step's refill saw both finish)
            _stage_ds(ds_smem, ds, 4)
            dq_tok = _dq_matmul(ds_smem, k_smem, BLOCK_M, HEAD_DIM, dq_layout, True)
            dk, dv, dq_t, pt_op, ds_op = warpgroup_mma_wait(0, deps=[dk_tok, dv_tok, dq_tok, pt_op, ds_op])
            if DQ_MODE == 3:
                _add_dq_tma(dq_base, dq_stage, dq_t, start_m)
            else:
                _add_dq(dq_base, dq_t, start_m, dq_rows, DQ_MODE == 2, BLOCK_M, HEAD_DIM, dq_layout)
        if WS:
            mbarrier.arrive(empty_bars.index(slot), count=1)  # this warpgroup is done with tile t's Q and dO
        else:
            _refill_q(q_desc, do_desc, q_smem, do_smem, bars, slot, t + STAGES, lo, n_iter, BLOCK_M, NUM_WARPS)
    elif ORDER == 1:
        # dK's matmul of the tile before is issued behind this tile's S^T and dP^T, so it runs
        # while the warps compute P^T; its Q slot is refilled once it is done (hence 3+ slots)
        st_tok = warpgroup_mma(k_smem, q_t.permute((1, 0)), zeros, use_acc=False, is_async=True)
        dpt_tok = warpgroup_mma(v_smem, do_t.permute((1, 0)), minus_delta, is_async=True)
        dk_tok = warpgroup_mma(ds_op, q_smem.index(prev), dk, is_async=True)
        lse2_next, delta_next = _row_stats(l_base, delta_base, next_m, n_q, BLOCK_M, st_layout)
        st = warpgroup_mma_wait(2, deps=[st_tok])  # S^T done; dP^T and dK may still run
        pt = _probabilities(st, lse2, start_m, start_n, qk_scale, MASKED, BLOCK_M,
                            BLOCK_N, st_layout)
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv_tok = warpgroup_mma(pt_op, do_t, dv, is_async=True)
        dpt = warpgroup_mma_wait(2, deps=[dpt_tok])  # dP^T done; dK and dV may still run
        ds_next = gl.convert_layout((pt * dpt).to(dtype), op_layout)
        dk, dv, pt_op, ds_op = warpgroup_mma_wait(0, deps=[dk_tok, dv_tok, pt_op, ds_op])
        if t > 0:
            _refill_q(q_desc, do_desc, q_smem, do_smem, bars, prev, t - 1 + STAGES, lo, n_iter, BLOCK_M,
                      NUM_WARPS)
        ds_op = ds_next
        prev = slot
    else:
        # the plain order, for comparison: each matmul waited for at once
        lse2_next, delta_next = _row_stats(l_base, delta_base, next_m, n_q, BLOCK_M, st_layout)
        st = warpgroup_mma(k_smem, q_t.permute((1, 0)), zeros, use_acc=False)
        pt = _probabilities(st, lse2, start_m, start_n, qk_scale, MASKED, BLOCK_M,
                            BLOCK_N, st_layout)
        dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do_t, dv)
        dpt = warpgroup_mma(v_smem, do_t.permute((1, 0)), minus_delta)
        dk = warpgroup_mma(gl.convert_layout((pt * dpt).to(dtype), op_layout), q_t, dk)
        _refill_q(q_desc, do_desc, q_smem, do_smem, bars, slot, t + STAGES, lo, n_iter, BLOCK_M, NUM_WARPS)
    return dk, dv, ds_op, prev, lse2_next, delta_next


@gluon.jit
def _fused_kernel(Q, K, V, DO, L, Delta, DK, DV, DQ_ACC,
                  stride_qz, stride_qh, stride_qm,
                  stride_kz, stride_kh, stride_kn,
                  stride_vz, stride_vh, stride_vn,
                  stride_doz, stride_doh, stride_dom,
                  stride_dkz, stride_dkh, stride_dkn,
                  stride_dvz, stride_dvh, stride_dvn,
                  H, n_q, n_k, dq_rows, sm_scale, qk_scale,
                  IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, ORDER: gl.constexpr, DQ_MODE: gl.constexpr,
                  DQ_DEFER: gl.constexpr, KV_REGS: gl.constexpr):
    """One key tile's dK and dV; with DQ_MODE (1 atom, 2 red) also its share of every query tile's dQ,
    dS K, added into DQ_ACC (fp32 (Z*H, n_q, HEAD_DIM), contiguous, zeroed before): five matmuls a tile
    pair where the split backward's two kernels do seven. Rows from dq_rows on add nothing (0: the
    probe, which keeps the matmul and the atomics' addresses). DQ_DEFER (order "defer") issues tile t's
    dQ matmul at step t+1, behind the scores. KV_REGS (DQ_MODE 0, the "-rs" orders) holds K and V in
    registers as the A operands of S^T and dP^T (RS_ORDERS says why). _dkdv_kernel is this with DQ_MODE 0."""
    pid_n, pid_zh, z, h = _program_tile(H, False)  # key tiles in launch order: causal key tile 0 sees the most
    start_n = pid_n * BLOCK_N
    dtype: gl.constexpr = Q.dtype.element_ty
    st_layout: gl.constexpr = _mma_layout(NUM_WARPS, BLOCK_M)    # S^T, dP^T: (BLOCK_N, BLOCK_M)
    acc_layout: gl.constexpr = _mma_layout(NUM_WARPS, HEAD_DIM)  # dK, dV: (BLOCK_N, HEAD_DIM)
    # the fused dQ tile (BLOCK_M, HEAD_DIM): one warpgroup's rows; with two, each takes half the columns
    if NUM_WARPS == 4:
        dq_layout: gl.constexpr = acc_layout
    else:
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NUM_WARPS // 4],
                                                            instr_shape=[16, HEAD_DIM * 4 // NUM_WARPS, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    q_desc = _descriptor(Q, z, h, stride_qz, stride_qh, stride_qm, n_q, HEAD_DIM, BLOCK_M, q_layout)
    do_desc = _descriptor(DO, z, h, stride_doz, stride_doh, stride_dom, n_q, HEAD_DIM, BLOCK_M, q_layout)
    k_desc = _descriptor(K, z, h, stride_kz, stride_kh, stride_kn, n_k, HEAD_DIM, BLOCK_N, kv_layout)
    v_desc = _descriptor(V, z, h, stride_vz, stride_vh, stride_vn, n_k, HEAD_DIM, BLOCK_N, kv_layout)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    if DQ_MODE > 0:  # dS^T for the fused kernel's dQ matmul (a token tile otherwise)
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
    else:
        ds_smem = gl.allocate_shared_memory(dtype, [16, 64], gl.NVMMASharedLayout.get_default_for([16, 64], dtype))
    dq_base = DQ_ACC + pid_zh.to(gl.int64) * n_q * HEAD_DIM
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    # query tiles [lo, n_q): causal queries before start_n see none of these keys, and the first
    # BLOCK_N / BLOCK_M tiles from there cross the diagonal (BLOCK_M divides BLOCK_N)
    if IS_CAUSAL:
        lo = start_n
    else:
        lo = 0
    n_iter = gl.cdiv(gl.maximum(n_q - lo, 0), BLOCK_M)

    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [start_n, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [start_n, 0], kv_bar, v_smem)
    for i in gl.static_range(STAGES):  # (4: nothing has read a slot yet, so no block barrier)
        _refill_q(q_desc, do_desc, q_smem, do_smem, bars, i, i, lo, n_iter, BLOCK_M, 4)

    l_base = L + pid_zh.to(gl.int64) * n_q
    delta_base = Delta + pid_zh.to(gl.int64) * n_q
    lse2, delta = _row_stats(l_base, delta_base, lo, n_q, BLOCK_M, st_layout)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    ds_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, op_layout)  # ORDER 1: dS^T of the tile before
    prev = 0  # ORDER 1: the slot of the tile before (tile 0's at first, where dS^T = 0 adds nothing)
    mbarrier.wait(kv_bar, 0)
    k_a, v_a = _resident_operands(k_smem, v_smem, KV_REGS, st_layout)
    # the diagonal tiles apart, so the unmasked loop carries no mask
    if IS_CAUSAL:
        n_diag = gl.minimum(n_iter, BLOCK_N // BLOCK_M)
    else:
        n_diag = 0
    for t in range(0, n_diag):
        dk, dv, ds_op, prev, lse2, delta = _step(
            t, k_a, v_a, q_smem, do_smem, bars, q_desc, do_desc, dk, dv, ds_op, prev, lse2, delta, l_base,
            delta_base, lo, n_q, n_iter, start_n, qk_scale, ds_smem, dq_base, dq_rows, True, ORDER, DQ_MODE,
            DQ_DEFER, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, NUM_WARPS, st_layout, op_layout, dq_layout)
    for t in range(n_diag, n_iter):
        dk, dv, ds_op, prev, lse2, delta = _step(
            t, k_a, v_a, q_smem, do_smem, bars, q_desc, do_desc, dk, dv, ds_op, prev, lse2, delta, l_base,
            delta_base, lo, n_q, n_iter, start_n, qk_scale, ds_smem, dq_base, dq_rows, False, ORDER, DQ_MODE,
            DQ_DEFER, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, NUM_WARPS, st_layout, op_layout, dq_layout)
    if ORDER == 1:
        if n_iter > 0:  # the last tile's dK
            dk = warpgroup_mma(ds_op, q_smem.index(prev), dk)
    if DQ_DEFER:
        if n_iter > 0:  # the last tile's dQ
            dq_t = _dq_matmul(ds_smem, k_smem, BLOCK_M, HEAD_DIM, dq_layout, False)
            _add_dq(dq_base, dq_t, lo + (n_iter - 1) * BLOCK_M, dq_rows, DQ_MODE == 2, BLOCK_M, HEAD_DIM, dq_layout)
    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    # dK, dV through K's and V's slots (every matmul that read them has finished); the copy engine
    # clips rows past n_k
    dk_desc = _descriptor(DK, z, h, stride_dkz, stride_dkh, stride_dkn, n_k, HEAD_DIM, BLOCK_N, kv_layout)
    dv_desc = _descriptor(DV, z, h, stride_dvz, stride_dvh, stride_dvn, n_k, HEAD_DIM, BLOCK_N, kv_layout)
    _block_barrier()
    k_smem.store((dk * sm_scale).to(dtype))
    v_smem.store(dv.to(dtype))
    fence_async_shared()
    _block_barrier()
    tma.async_copy_shared_to_global(dk_desc, [start_n, 0], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [start_n, 0], v_smem)
    tma.store_wait(0)


@gluon.jit
def _dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV,
                 stride_qz, stride_qh, stride_qm,
                 stride_kz, stride_kh, stride_kn,
                 stride_vz, stride_vh, stride_vn,
                 stride_doz, stride_doh, stride_dom,
                 stride_dkz, stride_dkh, stride_dkn,
                 stride_dvz, stride_dvh, stride_dvn,
                 H, n_q, n_k, sm_scale, qk_scale,
                 IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, ORDER: gl.constexpr, KV_REGS: gl.constexpr):
    # the Triton dK/dV kernel's signature; the grid (G, tiles, ZH / G), causal key tile 0 the heaviest
    _fused_kernel(Q, K, V, DO, L, Delta, DK, DV, DK,
                  stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
                  stride_doz, stride_doh, stride_dom, stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh,
                  stride_dvn, H, n_q, n_k, n_q, sm_scale, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                  NUM_WARPS, ORDER, 0, False, KV_REGS)



# ----------------------------------------------------------------------------------------------
# dK/dV warp-specialised (FA-3's layout of a program): a producer warp streams Q and dO tiles into
# a ring of slots, and CONSUMERS warpgroups, each owning WG_KEYS keys of the program's key tile,
# run the overlapped step on every slot and release it. The slot's tile is read from L2 once for
# CONSUMERS x WG_KEYS keys (the one-warpgroup kernel reads it once per 64 keys: twice the traffic
# per matmul), and no block barrier keeps the warpgroups in step. A slot has a "ready" mbarrier
# that the copy engine completes and an "empty" one that each consumer arrives at (count CONSUMERS).
# ----------------------------------------------------------------------------------------------
WG_KEYS = 64  # keys a consumer warpgroup owns: one wgmma's M
_WG_KEYS = gl.constexpr(WG_KEYS)  # (what a kernel can read)


@gluon.jit
def _dkdv_ws_loader(q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars,
                    empty_bars, start_n, lo, n_iter, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                    CONSUMERS: gl.constexpr, shift, ROTATE: gl.constexpr):
    """The producer: every consumer's K and V rows once, then the Q and dO of the t-th query tile
    (_tile_row) into slot t % STAGES (_ws_stream). Key rows past n_k come in as zeros."""
    mbarrier.expect(kv_bar, 2 * CONSUMERS * k_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(k_desc, [start_n + c * _WG_KEYS, 0], kv_bar, k_smem.index(c))
        tma.async_copy_global_to_shared(v_desc, [start_n + c * _WG_KEYS, 0], kv_bar, v_smem.index(c))
    _ws_stream(q_desc, do_desc, q_smem, do_smem, ready_bars, empty_bars, lo, n_iter, BLOCK_M, STAGES, shift, ROTATE)


@gluon.jit
def _dkdv_ws_tile(k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars, empty_bars, dk_base, dv_base,
                  stride_dkn, stride_dvn, l_base, delta_base, start_n, lo, n_q, n_k, n_iter, sm_scale, qk_scale,
                  ds_smem, dq_stage, dq_base, dq_rows, ds_full, ds_free, IS_CAUSAL: gl.constexpr,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, WHICH: gl.constexpr,
                  DQ_MODE: gl.constexpr, shift, ROTATE: gl.constexpr, kv_phase=0, kv_free=None, base=0,
                  DRAIN: gl.constexpr = True):
    """Consumer warpgroup WHICH on one key tile: keys [start_n + WHICH * WG_KEYS, + WG_KEYS) against every
    query tile of the ring, in the overlapped order (_step); dK and dV straight from registers to global memory
    (dk_base, dv_base: this (z, h)'s). Causal: the tiles above its keys' diagonal are waited for and
    released unread, the next WG_KEYS / BLOCK_M cross the diagonal. With DQ_MODE (the fused kernel,
    _fused_ws_kernel) it also adds its keys' share of each tile's dQ, dS K, into dq_base (_step: dS^T
    through its own slot of ds_smem, the adds by atom, red, or with DQ_MODE 3 by the copy engine from its
    own slot of dq_stage into the descriptor dq_base; with DQ_MODE 4 the two consumers share their dS^T
    through ds_full and ds_free, and each adds every other tile's whole dQ that way).
    The persistent kernel's (_fused_ws_persistent_kernel) tiles: K and V are kv_bar's phase kv_phase, the
    query tiles the ring's steps base, base + 1, ... (_step's base), and kv_free is arrived at
    once every matmul of this consumer has read its K and V, before dK and dV are stored; DRAIN off leaves
    the last dQ reduction running (the program waits once, at its end)."""
    dtype: gl.constexpr = q_smem.dtype
    CONSUMERS: gl.constexpr = k_smem.shape[0]
    st_layout: gl.constexpr = _mma_layout(4, BLOCK_M)        # S^T, dP^T: (WG_KEYS, BLOCK_M)
    acc_layout: gl.constexpr = _mma_layout(4, HEAD_DIM)      # dK, dV: (WG_KEYS, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    # DQ_MODE 6: its columns of dQ, as wide as the staging tile the kernel gave it (0: the whole row)
    dq_cols: gl.constexpr = dq_stage.shape[2] if DQ_MODE == 6 else 0
    if DQ_MODE == 5:  # dQ^T, (HEAD_DIM, BLOCK_M): the queries are its columns, as in S^T
        dq_layout: gl.constexpr = st_layout
    elif DQ_MODE == 6:  # (BLOCK_M, dq_cols)
        dq_layout: gl.constexpr = _mma_layout(4, dq_cols)
    else:
        dq_layout: gl.constexpr = acc_layout
    my_n = start_n + WHICH * _WG_KEYS
    k_mine = k_smem.index(WHICH)
    v_mine = v_smem.index(WHICH)
    if DQ_MODE >= 4:
        ds_mine = ds_smem  # both parities' slots of every consumer (_share_ds)
    else:
        ds_mine = ds_smem.index(WHICH if DQ_MODE > 0 else 0)  # (a token tile without DQ_MODE)
    dq_mine = dq_stage.index(WHICH if DQ_MODE >= 3 else 0)  # (a token tile but in DQ_MODE 3 to 5)
    if IS_CAUSAL:
        n_skip = gl.minimum(n_iter, WHICH * _WG_KEYS // BLOCK_M)
        n_diag = gl.minimum(n_iter, n_skip + _WG_KEYS // BLOCK_M)
    else:
        n_skip = 0
        n_diag = 0
    for t in range(0, n_skip):
        r = base + t  # the ring's count of this step
        mbarrier.wait(ready_bars.index(r % STAGES), (r // STAGES) & 1)
        mbarrier.arrive(empty_bars.index(r % STAGES), count=1)
        if DQ_MODE >= 4:  # these queries see none of its keys: its share of dS^T is zero, for whichever
            # consumer's turn the tile is; with fewer than WG_KEYS queries a tile (t = WHICH) can be its own
            _share_ds(ds_mine, ds_full, ds_free, gl.zeros([_WG_KEYS, BLOCK_M], dtype, st_layout), r, WHICH,
                      CONSUMERS)
            # (DQ_MODE 6: its columns of every tile's dQ, whatever its own keys add)
            if DQ_MODE == 6 or (BLOCK_M < _WG_KEYS and t % CONSUMERS == WHICH):
                mbarrier.wait(kv_bar, kv_phase)  # every consumer's K
                dq_tok = _turn_dq(r, ds_mine, ds_full, k_smem, dq_layout, CONSUMERS, DQ_MODE == 5, WHICH * dq_cols,
                                  dq_cols)
                dq_t = warpgroup_mma_wait(0, deps=[dq_tok])
                mbarrier.arrive(ds_free.index(r % 2), count=1)
                _add_dq_tma(dq_base, dq_mine, dq_t, lo + t * BLOCK_M, DQ_MODE == 5, WHICH * dq_cols)
    lse2, delta = _row_stats(l_base, delta_base, _tile_row(n_skip, lo, shift, n_iter, BLOCK_M, ROTATE), n_q, BLOCK_M,
                             st_layout)
    dk = gl.zeros([_WG_KEYS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([_WG_KEYS, HEAD_DIM], gl.float32, acc_layout)
    ds_op = gl.zeros([_WG_KEYS, BLOCK_M], dtype, op_layout)  # (_step's ORDER 1 state, unused here)
    prev = 0
    mbarrier.wait(kv_bar, kv_phase)
    for t in range(n_skip, n_diag):
        dk, dv, ds_op, prev, lse2, delta = _step(
            t, k_mine, v_mine, q_smem, do_smem, ready_bars, None, None, dk, dv, ds_op, prev, lse2, delta, l_base,
            delta_base, lo, n_q, n_iter, my_n, qk_scale, ds_mine, dq_base, dq_rows, True, 0, DQ_MODE, False,
            HEAD_DIM, BLOCK_M, _WG_KEYS, STAGES, 4, st_layout, op_layout, dq_layout, empty_bars, True, dq_mine,
            k_smem, ds_full, ds_free, WHICH, CONSUMERS, shift, ROTATE, dq_cols, base)
    for t in range(n_diag, n_iter):
        dk, dv, ds_op, prev, lse2, delta = _step(
            t, k_mine, v_mine, q_smem, do_smem, ready_bars, None, None, dk, dv, ds_op, prev, lse2, delta, l_base,
            delta_base, lo, n_q, n_iter, my_n, qk_scale, ds_mine, dq_base, dq_rows, False, 0, DQ_MODE, False,
            HEAD_DIM, BLOCK_M, _WG_KEYS, STAGES, 4, st_layout, op_layout, dq_layout, empty_bars, True, dq_mine,
            k_smem, ds_full, ds_free, WHICH, CONSUMERS, shift, ROTATE, dq_cols, base)
    if kv_free is not None:  # each step waited for its matmuls: this consumer is done with every K and V tile
        mbarrier.arrive(kv_free, count=1)
    if DQ_MODE >= 3 and DRAIN:
        tma.store_wait(0)  # the last reduction has read the staging tile before the program ends
    offs_n = my_n + gl.arange(0, _WG_KEYS, layout=gl.SliceLayout(1, acc_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    rows = gl.expand_dims(offs_n.to(gl.int64), 1)
    keep = gl.expand_dims(offs_n < n_k, 1) & gl.expand_dims(offs_d < HEAD_DIM, 0)
    gl.store(dk_base + rows * stride_dkn + gl.expand_dims(offs_d, 0), (dk * sm_scale).to(dtype), mask=keep)
    gl.store(dv_base + rows * stride_dvn + gl.expand_dims(offs_d, 0), dv.to(dtype), mask=keep)


@gluon.jit
def _fused_ws_kernel(Q, K, V, DO, L, Delta, DK, DV, DQ_ACC,
                     stride_qz, stride_qh, stride_qm,
                     stride_kz, stride_kh, stride_kn,
                     stride_vz, stride_vh, stride_vn,
                     stride_doz, stride_doh, stride_dom,
                     stride_dkz, stride_dkh, stride_dkn,
                     stride_dvz, stride_dvh, stride_dvn,
                     H, n_q, n_k, dq_rows, sm_scale, qk_scale,
                     IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     STAGES: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                     DQ_MODE: gl.constexpr, ROTATE: gl.constexpr = False):
    # _fused_kernel's signature and grid, BLOCK_N = CONSUMERS * WG_KEYS keys a program; DQ_MODE 0 is the
    # warp-specialised dK/dV (_dkdv_ws_kernel), 1 or 2 also adds each consumer's share of dQ (atom, red),
    # 3 by the copy engine, 4 the program's whole share by one consumer a tile in turns, 5 that as dQ^T,
    # 6 that share by every consumer every tile, each its HEAD_DIM / CONSUMERS columns.
    # ROTATE (non-causal only): each program takes the query tiles from its diagonal's on, wrapping round
    pid_n, pid_zh, z, h = _program_tile(H, False)  # key tiles in launch order: causal key tile 0 sees the most
    start_n = pid_n * BLOCK_N
    dtype: gl.constexpr = Q.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_WG_KEYS, HEAD_DIM], dtype)
    q_desc = _descriptor(Q, z, h, stride_qz, stride_qh, stride_qm, n_q, HEAD_DIM, BLOCK_M, q_layout)
    do_desc = _descriptor(DO, z, h, stride_doz, stride_doh, stride_dom, n_q, HEAD_DIM, BLOCK_M, q_layout)
    k_desc = _descriptor(K, z, h, stride_kz, stride_kh, stride_kn, n_k, HEAD_DIM, _WG_KEYS, kv_layout)
    v_desc = _descriptor(V, z, h, stride_vz, stride_vh, stride_vn, n_k, HEAD_DIM, _WG_KEYS, kv_layout)
    k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, _WG_KEYS, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, _WG_KEYS, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    if DQ_MODE > 0:  # each consumer's dS^T for its dQ matmul, from DQ_MODE 4 one a tile parity (a token otherwise)
        ds_smem = gl.allocate_shared_memory(dtype, [CONSUMERS * (1 + (DQ_MODE >= 4)), _WG_KEYS, BLOCK_M],
                                            gl.NVMMASharedLayout.get_default_for([_WG_KEYS, BLOCK_M], dtype))
    else:
        ds_smem = gl.allocate_shared_memory(dtype, [1, 16, 64], gl.NVMMASharedLayout.get_default_for([16, 64], dtype))
    if DQ_MODE == 5:  # dQ^T: (HEAD_DIM, n_q) a (z, h), rows padded to 4 columns (16 bytes, for the copy engine)
        q_cols = (n_q + 3) // 4 * 4
        dq_base = DQ_ACC + pid_zh.to(gl.int64) * HEAD_DIM * q_cols
        dq_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEAD_DIM, BLOCK_M], gl.float32)
        dq_stage = gl.allocate_shared_memory(gl.float32, [CONSUMERS, HEAD_DIM, BLOCK_M], dq_smem_layout)
        dq_target = tma.make_tensor_descriptor(dq_base, shape=[HEAD_DIM, dq_rows], strides=[q_cols, 1],
                                               block_shape=[HEAD_DIM, BLOCK_M], layout=dq_smem_layout)
    elif DQ_MODE >= 3:  # the copy engine adds each consumer's dQ tile from its fp32 staging tile
        dq_base = DQ_ACC + pid_zh.to(gl.int64) * n_q * HEAD_DIM
        DQ_COLS: gl.constexpr = HEAD_DIM // CONSUMERS if DQ_MODE == 6 else HEAD_DIM  # 6: a consumer's columns
        dq_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DQ_COLS], gl.float32)
        dq_stage = gl.allocate_shared_memory(gl.float32, [CONSUMERS, BLOCK_M, DQ_COLS], dq_smem_layout)
        dq_target = tma.make_tensor_descriptor(dq_base, shape=[dq_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                               block_shape=[BLOCK_M, DQ_COLS], layout=dq_smem_layout)
    else:
        dq_base = DQ_ACC + pid_zh.to(gl.int64) * n_q * HEAD_DIM
        dq_stage = gl.allocate_shared_memory(gl.float32, [1, 16, 64],
                                             gl.NVMMASharedLayout.get_default_for([16, 64], gl.float32))
        dq_target = dq_base
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # DQ_MODE 4 to 6, per tile parity: every consumer's dS^T written, and the dQ matmuls that read them done
    # (one matmul a tile in modes 4 and 5, one a consumer in 6)
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=CONSUMERS)
    for i in gl.static_range(2):
        mbarrier.init(ds_full.index(i), count=CONSUMERS)
        mbarrier.init(ds_free.index(i), count=CONSUMERS if DQ_MODE == 6 else 1)

    if IS_CAUSAL:  # queries before start_n see none of these keys
        lo = start_n
    else:
        lo = 0
    n_iter = gl.cdiv(gl.maximum(n_q - lo, 0), BLOCK_M)
    # Non-causal, every program of a head would otherwise add into query tile 0's dQ rows at about the same
    # time, then tile 1's, and so on. With ROTATE, program pid_n starts at tile start_n / BLOCK_M (where a
    # causal one starts) and wraps round: the programs side by side add into rows spread over the head.
    ROTATE_Q: gl.constexpr = ROTATE and not IS_CAUSAL
    if ROTATE_Q:
        shift = (start_n // BLOCK_M) % gl.maximum(n_iter, 1)
    else:
        shift = 0
    l_base = L + pid_zh.to(gl.int64) * n_q
    delta_base = Delta + pid_zh.to(gl.int64) * n_q
    dk_base = DK + z.to(gl.int64) * stride_dkz + h.to(gl.int64) * stride_dkh
    dv_base = DV + z.to(gl.int64) * stride_dvz + h.to(gl.int64) * stride_dvh
    # (the argument tuples are written out in the call: a tuple kept in a variable loses its constexprs)
    if CONSUMERS == 1:
        gl.warp_specialize([
            (_dkdv_ws_tile, (k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars, empty_bars, dk_base, dv_base,
                                 stride_dkn, stride_dvn, l_base, delta_base, start_n, lo, n_q, n_k, n_iter, sm_scale,
                                 qk_scale, ds_smem, dq_stage, dq_target, dq_rows, ds_full, ds_free, IS_CAUSAL, HEAD_DIM,
                                 BLOCK_M, STAGES, 0, DQ_MODE, shift, ROTATE_Q)),
            (_dkdv_ws_loader, (q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars,
                               empty_bars, start_n, lo, n_iter, BLOCK_M, STAGES, CONSUMERS, shift, ROTATE_Q))],
            [1], [24])
    elif CONSUMERS == 2:
        gl.warp_specialize([
            (_dkdv_ws_tile, (k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars, empty_bars, dk_base, dv_base,
                                 stride_dkn, stride_dvn, l_base, delta_base, start_n, lo, n_q, n_k, n_iter, sm_scale,
                                 qk_scale, ds_smem, dq_stage, dq_target, dq_rows, ds_full, ds_free, IS_CAUSAL, HEAD_DIM,
                                 BLOCK_M, STAGES, 0, DQ_MODE, shift, ROTATE_Q)),
            (_dkdv_ws_tile, (k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars, empty_bars, dk_base, dv_base,
                                 stride_dkn, stride_dvn, l_base, delta_base, start_n, lo, n_q, n_k, n_iter, sm_scale,
                                 qk_scale, ds_smem, dq_stage, dq_target, dq_rows, ds_full, ds_free, IS_CAUSAL, HEAD_DIM,
                                 BLOCK_M, STAGES, 1, DQ_MODE, shift, ROTATE_Q)),
            (_dkdv_ws_loader, (q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars,
                               empty_bars, start_n, lo, n_iter, BLOCK_M, STAGES, CONSUMERS, shift, ROTATE_Q))],
            [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (_dkdv_ws_tile, (k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars, empty_bars, dk_base, dv_base,
                                 stride_dkn, stride_dvn, l_base, delta_base, start_n, lo, n_q, n_k, n_iter, sm_scale,
                                 qk_scale, ds_smem, dq_stage, dq_target, dq_rows, ds_full, ds_free, IS_CAUSAL, HEAD_DIM,
                                 BLOCK_M, STAGES, 0, DQ_MODE, shift, ROTATE_Q)),
            (_dkdv_ws_tile, (k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars, empty_bars, dk_base, dv_base,
                                 stride_dkn, stride_dvn, l_base, delta_base, start_n, lo, n_q, n_k, n_iter, sm_scale,
                                 qk_scale, ds_smem, dq_stage, dq_target, dq_rows, ds_full, ds_free, IS_CAUSAL, HEAD_DIM,
                                 BLOCK_M, STAGES, 1, DQ_MODE, shift, ROTATE_Q)),
            (_dkdv_ws_tile, (k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars, empty_bars, dk_base, dv_base,
                                 stride_dkn, stride_dvn, l_base, delta_base, start_n, lo, n_q, n_k, n_iter, sm_scale,
                                 qk_scale, ds_smem, dq_stage, dq_target, dq_rows, ds_full, ds_free, IS_CAUSAL, HEAD_DIM,
                                 BLOCK_M, STAGES, 2, DQ_MODE, shift, ROTATE_Q)),
            (_dkdv_ws_loader, (q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars,
                               empty_bars, start_n, lo, n_iter, BLOCK_M, STAGES, CONSUMERS, shift, ROTATE_Q))],
            [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


@gluon.jit
def _key_tile(tile, G, T, n_q, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(z*h pair, first key, first query row, query tiles) of the tile-th program of _fused_ws_kernel's grid
    (G, T, ZH / G) in launch order (x fastest), as _program_tile reads its program ids (causal key tile 0, the
    heaviest, first); what the producer and each consumer of the persistent kernel work out alike a tile."""
    start_n = (tile // G) % T * BLOCK_N
    if IS_CAUSAL:  # queries before start_n see none of these keys
        lo = start_n
    else:
        lo = 0
    return tile // (G * T) * G + tile % G, start_n, lo, gl.cdiv(gl.maximum(n_q - lo, 0), BLOCK_M)


@gluon.jit
def _dkdv_ws_loader_persistent(q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, kv_free,
                               ready_bars, empty_bars, n_q, n_k, SCHEDULE, G, IS_CAUSAL: gl.constexpr,
                               BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The producer of the persistent kernel: per key tile, its first STAGES query tiles into the ring as the
    last key tile's last steps free their slots, then its K and V once every consumer is done with the last
    ones (kv_free), then the rest of its query tiles. The ring runs on from key tile to key tile; the
    descriptors span every (z, h) pair's rows (rows zh * n + i)."""
    BLOCK_N: gl.constexpr = CONSUMERS * _WG_KEYS
    T = gl.cdiv(n_k, BLOCK_N)
    base = 0
    j = 0
    tiles, first_tile, end = _scheduled_tiles(SCHEDULE)
    for i in range(first_tile, end):
        pid_zh, start_n, lo, n_iter = _key_tile(gl.load(tiles + i), G, T, n_q, BLOCK_M, BLOCK_N, IS_CAUSAL)
        first = pid_zh * n_q + lo
        n_early = gl.minimum(n_iter, STAGES)
        _ws_stream(q_desc, do_desc, q_smem, do_smem, ready_bars, empty_bars, first, n_early, BLOCK_M, STAGES,
                   base=base)
        mbarrier.wait(kv_free, (j & 1) ^ 1)  # (a fresh barrier: its phase "-1" counts as complete)
        mbarrier.expect(kv_bar, 2 * CONSUMERS * k_desc.block_type.nbytes)
        for c in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(k_desc, [pid_zh * n_k + start_n + c * _WG_KEYS, 0], kv_bar,
                                            k_smem.index(c))
            tma.async_copy_global_to_shared(v_desc, [pid_zh * n_k + start_n + c * _WG_KEYS, 0], kv_bar,
                                            v_smem.index(c))
        _ws_stream(q_desc, do_desc, q_smem, do_smem, ready_bars, empty_bars, first + n_early * BLOCK_M,
                   n_iter - n_early, BLOCK_M, STAGES, base=base + n_early)
        base += n_iter
        j += 1


@gluon.jit
def _dkdv_ws_consumer_persistent(k_smem, v_smem, q_smem, do_smem, kv_bar, kv_free, ready_bars, empty_bars, DK, DV,
                                 stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn, L, Delta, H,
                                 n_q, n_k, n_zh, sm_scale, qk_scale, ds_smem, dq_stage, dq_target, ds_full, ds_free,
                                 SCHEDULE, G, IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                 STAGES: gl.constexpr, WHICH: gl.constexpr, DQ_MODE: gl.constexpr):
    """Consumer warpgroup WHICH of the persistent kernel: _dkdv_ws_tile on each of the program's key tiles, in
    the order the producer loads them; the last dQ reduction is waited for once, at the end.
    Its rows are those of the (n_zh * n_q, d) matrices every (z, h) pair's queries make: a tile's queries,
    L, Delta and dQ rows from the pair's first row c = pid_zh * n_q on, so no per-tile base is held through
    the steps. Its keys count from c too (the causal mask compares key and query rows, both shifted by c),
    and dK's and dV's bases are moved back by c rows to match; key tiles are whole (persistent_error), so the
    stores' mask at n_k + c is the pair's own."""
    BLOCK_N: gl.constexpr = k_smem.shape[0] * _WG_KEYS
    T = gl.cdiv(n_k, BLOCK_N)
    base = 0
    j = 0
    tiles, first_tile, end = _scheduled_tiles(SCHEDULE)
    for i in range(first_tile, end):
        pid_zh, start_n, lo, n_iter = _key_tile(gl.load(tiles + i), G, T, n_q, BLOCK_M, BLOCK_N, IS_CAUSAL)
        z, h = pid_zh // H, pid_zh % H
        c = pid_zh * n_q  # the pair's first row
        dk_base = DK + z.to(gl.int64) * stride_dkz + h.to(gl.int64) * stride_dkh - c.to(gl.int64) * stride_dkn
        dv_base = DV + z.to(gl.int64) * stride_dvz + h.to(gl.int64) * stride_dvh - c.to(gl.int64) * stride_dvn
        _dkdv_ws_tile(k_smem, v_smem, q_smem, do_smem, kv_bar, ready_bars, empty_bars, dk_base, dv_base, stride_dkn,
                      stride_dvn, L, Delta, c + start_n, c + lo, n_zh * n_q, c + n_k, n_iter, sm_scale, qk_scale,
                      ds_smem, dq_stage, dq_target, n_q, ds_full, ds_free, IS_CAUSAL, HEAD_DIM, BLOCK_M, STAGES,
                      WHICH, DQ_MODE, 0, False, j & 1, kv_free, base, False)
        base += n_iter
        j += 1
    tma.store_wait(0)  # the last reduction has read the staging tile before the program ends


@gluon.jit
def _fused_ws_persistent_kernel(Q, K, V, DO, L, Delta, DK, DV, DQ_ACC,
                                stride_qz, stride_qh, stride_qm,
                                stride_kz, stride_kh, stride_kn,
                                stride_vz, stride_vh, stride_vn,
                                stride_doz, stride_doh, stride_dom,
                                stride_dkz, stride_dkh, stride_dkn,
                                stride_dvz, stride_dvh, stride_dvn,
                                H, n_q, n_k, dq_rows, sm_scale, qk_scale, n_zh, group, SCHEDULE,
                                IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, DQ_MODE: gl.constexpr):
    # _fused_ws_kernel persistent: its arguments, then the (z, h) pairs, the grid order's group and the int32
    # tile schedule (flash_gluon.tile_schedule of key_tile_costs); a grid of at most one program an SM, each
    # taking key tile after key tile. Two consumers, dQ added by the copy engine (DQ_MODE 3, 4 or 6). Q, dO, K,
    # V and the dQ accumulator are read as (n_zh * n, HEAD_DIM) matrices (persistent_error: their (z, h) pairs
    # lie n rows apart, and query and key tiles end at n_q and n_k, so no tile reads another pair's rows)
    dtype: gl.constexpr = Q.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_WG_KEYS, HEAD_DIM], dtype)
    q_desc = _matrix_descriptor(Q, n_zh * n_q, stride_qm, BLOCK_M, HEAD_DIM, q_layout)
    do_desc = _matrix_descriptor(DO, n_zh * n_q, stride_dom, BLOCK_M, HEAD_DIM, q_layout)
    k_desc = _matrix_descriptor(K, n_zh * n_k, stride_kn, _WG_KEYS, HEAD_DIM, kv_layout)
    v_desc = _matrix_descriptor(V, n_zh * n_k, stride_vn, _WG_KEYS, HEAD_DIM, kv_layout)
    k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, _WG_KEYS, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, _WG_KEYS, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    # each consumer's dS^T, from DQ_MODE 4 one a tile parity; its fp32 dQ staging tile (DQ_MODE 6: its columns)
    ds_smem = gl.allocate_shared_memory(dtype, [CONSUMERS * (1 + (DQ_MODE >= 4)), _WG_KEYS, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([_WG_KEYS, BLOCK_M], dtype))
    DQ_COLS: gl.constexpr = HEAD_DIM // CONSUMERS if DQ_MODE == 6 else HEAD_DIM
    dq_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DQ_COLS], gl.float32)
    dq_stage = gl.allocate_shared_memory(gl.float32, [CONSUMERS, BLOCK_M, DQ_COLS], dq_smem_layout)
    dq_target = tma.make_tensor_descriptor(DQ_ACC, shape=[n_zh * n_q, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_M, DQ_COLS], layout=dq_smem_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(kv_free, count=CONSUMERS)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=CONSUMERS)
    for i in gl.static_range(2):
        mbarrier.init(ds_full.index(i), count=CONSUMERS)
        mbarrier.init(ds_free.index(i), count=CONSUMERS if DQ_MODE == 6 else 1)
    gl.warp_specialize([
        (_dkdv_ws_consumer_persistent, (k_smem, v_smem, q_smem, do_smem, kv_bar, kv_free, ready_bars, empty_bars, DK,
                                        DV, stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn, L,
                                        Delta, H, n_q, n_k, n_zh, sm_scale, qk_scale, ds_smem, dq_stage, dq_target,
                                        ds_full, ds_free, SCHEDULE, group, IS_CAUSAL, HEAD_DIM, BLOCK_M, STAGES, 0,
                                        DQ_MODE)),
        (_dkdv_ws_consumer_persistent, (k_smem, v_smem, q_smem, do_smem, kv_bar, kv_free, ready_bars, empty_bars, DK,
                                        DV, stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn, L,
                                        Delta, H, n_q, n_k, n_zh, sm_scale, qk_scale, ds_smem, dq_stage, dq_target,
                                        ds_full, ds_free, SCHEDULE, group, IS_CAUSAL, HEAD_DIM, BLOCK_M, STAGES, 1,
                                        DQ_MODE)),
        (_dkdv_ws_loader_persistent, (q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_bar,
                                      kv_free, ready_bars, empty_bars, n_q, n_k, SCHEDULE, group, IS_CAUSAL, BLOCK_M,
                                      STAGES, CONSUMERS))],
        [4, 1], [CONSUMER_REGS, 24])


@gluon.jit
def _dkdv_ws_kernel(Q, K, V, DO, L, Delta, DK, DV,
                    stride_qz, stride_qh, stride_qm,
                    stride_kz, stride_kh, stride_kn,
                    stride_vz, stride_vh, stride_vn,
                    stride_doz, stride_doh, stride_dom,
                    stride_dkz, stride_dkh, stride_dkn,
                    stride_dvz, stride_dvh, stride_dvn,
                    H, n_q, n_k, sm_scale, qk_scale,
                    IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    # _dkdv_kernel's signature and grid: _fused_ws_kernel adding no dQ
    _fused_ws_kernel(Q, K, V, DO, L, Delta, DK, DV, DK,
                     stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh,
                     stride_vn, stride_doz, stride_doh, stride_dom, stride_dkz, stride_dkh, stride_dkn, stride_dvz,
                     stride_dvh, stride_dvn, H, n_q, n_k, n_q, sm_scale, qk_scale, IS_CAUSAL, HEAD_DIM, BLOCK_M,
                     BLOCK_N, STAGES, CONSUMERS, CONSUMER_REGS, 0)


# ----------------------------------------------------------------------------------------------
# dQ (and Delta): a query tile against every key tile it sees
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _dq_step(t, q_a, do_a, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, dq, lse2, delta, start_m, n_k, n_iter,
             qk_scale, MASKED: gl.constexpr, OVERLAP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, s_layout: gl.constexpr, op_layout: gl.constexpr):
    """Key tile t of this query tile: S = Q K^T, dP = dO V^T - Delta (both issued at once when OVERLAP,
    P computed while dP runs), dS = P dP, dQ += dS K; then the slot is refilled with tile t + STAGES.
    q_a, do_a: Q and dO in shared memory, or in registers (the "-rs" orders). Keys past n_k need no
    mask: their K rows are zeros, so they add nothing to dQ."""
    dtype: gl.constexpr = q_a.dtype
    slot = t % STAGES
    k_t = k_smem.index(slot)
    v_t = v_smem.index(slot)
    mbarrier.wait(k_bars.index(slot), (t // STAGES) & 1)
    mbarrier.wait(v_bars.index(slot), (t // STAGES) & 1)
    zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    minus_delta = zeros - gl.expand_dims(delta, 1)
    if OVERLAP:
        s_tok = warpgroup_mma(q_a, k_t.permute((1, 0)), zeros, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do_a, v_t.permute((1, 0)), minus_delta, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])  # S done; dP may still run
    else:
        s = warpgroup_mma(q_a, k_t.permute((1, 0)), zeros, use_acc=False)
    p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
    if MASKED:  # causal: key start_n + j is seen by query start_m + i only when j <= i
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        offs_n = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        p = gl.where(gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1), p, 0.0)
    if OVERLAP:
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
    else:
        dp = warpgroup_mma(do_a, v_t.permute((1, 0)), minus_delta)
    dq = warpgroup_mma(gl.convert_layout((p * dp).to(dtype), op_layout), k_t, dq)
    _refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, slot, t + STAGES, n_iter, k_desc.block_type.nbytes,
            BLOCK_N, NUM_WARPS)
    return dq


@gluon.jit
def _dq_kernel(Q, K, V, O, DO, L, Delta, DQ,
               stride_qz, stride_qh, stride_qm,
               stride_kz, stride_kh, stride_kn,
               stride_vz, stride_vh, stride_vn,
               stride_oz, stride_oh, stride_om,
               stride_doz, stride_doh, stride_dom,
               stride_dqz, stride_dqh, stride_dqm,
               H, n_q, n_k, sm_scale, qk_scale,
               IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, OVERLAP: gl.constexpr, QDO_REGS: gl.constexpr):
    # QDO_REGS (the "-rs" orders): Q and dO in registers as the A operands of S and dP (RS_ORDERS)
    pid_m, pid_zh, z, h = _program_tile(H, IS_CAUSAL)  # causal: the heaviest query tiles first
    start_m = pid_m * BLOCK_M
    dtype: gl.constexpr = Q.dtype.element_ty
    s_layout: gl.constexpr = _mma_layout(NUM_WARPS, BLOCK_N)   # S, dP: (BLOCK_M, BLOCK_N)
    acc_layout: gl.constexpr = _mma_layout(NUM_WARPS, HEAD_DIM)  # dQ: (BLOCK_M, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_desc = _descriptor(Q, z, h, stride_qz, stride_qh, stride_qm, n_q, HEAD_DIM, BLOCK_M, q_layout)
    do_desc = _descriptor(DO, z, h, stride_doz, stride_doh, stride_dom, n_q, HEAD_DIM, BLOCK_M, q_layout)
    k_desc = _descriptor(K, z, h, stride_kz, stride_kh, stride_kn, n_k, HEAD_DIM, BLOCK_N, kv_layout)
    v_desc = _descriptor(V, z, h, stride_vz, stride_vh, stride_vn, n_k, HEAD_DIM, BLOCK_N, kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    k_smem, v_smem, k_bars, v_bars = _kv_ring(dtype, STAGES, BLOCK_N, HEAD_DIM, kv_layout)
    n_iter, hi_unmasked = _key_tiles(start_m, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)

    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [start_m, 0], q_bar, q_smem)
    tma.async_copy_global_to_shared(do_desc, [start_m, 0], q_bar, do_smem)
    for i in gl.static_range(STAGES):  # (4: nothing has read a slot yet, so no block barrier)
        _refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i, i, n_iter, k_desc.block_type.nbytes, BLOCK_N, 4)

    # Delta = rowsum(O * dO) of this tile's rows, for this kernel and the dK/dV kernel after it
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    row_ok = offs_m < n_q
    o_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
    offs_om = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    z64 = z.to(gl.int64)
    h64 = h.to(gl.int64)
    o_ptrs = O + z64 * stride_oz + h64 * stride_oh + gl.expand_dims(offs_om.to(gl.int64) * stride_om, 1) \
        + gl.expand_dims(offs_d, 0)
    do_ptrs = DO + z64 * stride_doz + h64 * stride_doh + gl.expand_dims(offs_om.to(gl.int64) * stride_dom, 1) \
        + gl.expand_dims(offs_d, 0)
    o_mask = gl.expand_dims(offs_om < n_q, 1)
    o = gl.load(o_ptrs, mask=o_mask, other=0.0).to(gl.float32)
    do = gl.load(do_ptrs, mask=o_mask, other=0.0).to(gl.float32)
    delta = gl.convert_layout(gl.sum(o * do, axis=1), gl.SliceLayout(1, s_layout))
    gl.store(Delta + pid_zh.to(gl.int64) * n_q + offs_m, delta, mask=row_ok)
    lse2 = gl.load(L + pid_zh.to(gl.int64) * n_q + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634

    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(q_bar, 0)
    q_a, do_a = _resident_operands(q_smem, do_smem, QDO_REGS, s_layout)
    n_unmasked = hi_unmasked // BLOCK_N
    for t in range(0, n_unmasked):
        dq = _dq_step(t, q_a, do_a, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, dq, lse2, delta, start_m,
                      n_k, n_iter, qk_scale, False, OVERLAP, BLOCK_M, BLOCK_N, STAGES, NUM_WARPS, s_layout, op_layout)
    for t in range(n_unmasked, n_iter):
        dq = _dq_step(t, q_a, do_a, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, dq, lse2, delta, start_m,
                      n_k, n_iter, qk_scale, IS_CAUSAL, OVERLAP, BLOCK_M, BLOCK_N, STAGES, NUM_WARPS, s_layout,
                      op_layout)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    # dQ through Q's slot (every matmul that read it has finished); the copy engine clips rows past n_q
    dq_desc = _descriptor(DQ, z, h, stride_dqz, stride_dqh, stride_dqm, n_q, HEAD_DIM, BLOCK_M, q_layout)
    _block_barrier()
    q_smem.store((dq * sm_scale).to(dtype))
    fence_async_shared()
    _block_barrier()
    tma.async_copy_shared_to_global(dq_desc, [start_m, 0], q_smem)
    tma.store_wait(0)


class Config(NamedTuple):
    """A tile config of either kernel. dK/dV: block_n key rows a program (16 a warp), block_m query rows
    a step, stages Q/dO slots. dQ: block_m query rows a program, block_n key rows a step, stages K/V
    slots. order: one of ORDERS ("defer" is dK/dV's only), or for dK/dV "ws" (_dkdv_ws_kernel: block_n is
    consumers x WG_KEYS keys, num_warps each consumer's 4); maxnreg caps the registers a thread."""

    block_m: int
    block_n: int
    stages: int
    num_warps: int
    order: str = "overlap"
    maxnreg: int | None = None


# the dK/dV kernel's orders: _step's (ORDERS), "ws", the warp-specialised kernel (_dkdv_ws_kernel), or
# _step's with K and V in registers (RS_ORDERS)
DKDV_ORDERS = ORDERS + ("ws",) + RS_ORDERS
# the fused kernel's: _step's first two, "ws" (_fused_ws_kernel) and "ws-p", that persistent (one program an SM
# taking key tile after key tile from a schedule, _fused_ws_persistent_kernel)
FUSED_ORDERS = ("overlap", "defer", "ws", "ws-p")
_WS_ORDERS = ("ws", "ws-p")
# the dQ kernel's: each matmul waited for at once, or dP issued with S; "-rs": Q and dO in registers
DQ_ORDERS = ("overlap", "plain", "overlap" + RS_SUFFIX, "plain" + RS_SUFFIX)
# consumers -> (registers a thread for the block, registers each consumer warpgroup after the first takes):
# the block counts the producer's warpgroup whole, so 1 consumer is 8 warps (128 each: two programs an SM),
# 2 are 12 (168 x 12 x 32 = 64,512 of 65,536; the consumers 240 and the producer 24: (2 x 240 + 24) x 4 x 32 =
# 64,512; at 232, 8 fewer, ptxas serialised the d=128 fused kernel's wgmmas), 3 are 16 (128; the consumers 160:
# (3 x 160 + 24) x 4 x 32 = 64,512)
WS_REGS = {1: (128, 128), 2: (168, 240), 3: (128, 160)}
KERNELS = ("dkdv", "dq", "fused")  # fused: dK/dV that also adds dS K into an fp32 dQ (_fused_kernel)
# the fused kernel's dQ: added by atom (Triton's atomic_add), by red (inline PTX, nothing returned), the red
# kernel with no row added (to price the adds' traffic), or (order "ws" only) by the copy engine from a staging
# tile in shared memory, one bulk reduction a tile (_add_dq_tma); or "turns" (order "ws", two consumers): the
# same with the consumers taking the tiles in turns, each adding the program's whole share of its tiles (one
# (64, d) reduction a tile for 128 keys, half tma's traffic), both consumers' dS^T shared (_share_ds); "turns-t"
# the same with every consumer in turn, as dQ^T = K^T dS^T (the query tile is the matmul's N, so it can be 16
# or 32 rows, and three consumers fit their registers: one (d, block_m) reduction a tile for 192 keys, a third
# of tma's traffic) into a transposed accumulator (dq_accumulator); "halves" (two consumers) the program's share
# as "turns" adds it, but every tile by both consumers, each its half of the columns (dS K[:, half] over both
# consumers' keys, FA-3's split of that matmul): the same bytes added, and a (64, d/2) tile a thread's registers
# hold where "turns" holds (64, d), what lets the fused kernel fit at d=128
DQ_MODES = ("add", "red", "probe", "tma", "turns", "turns-t", "halves")
# the kernels' DQ_MODE (probe: red, no row)
_DQ_MODE_IDS = {"add": 1, "red": 2, "probe": 2, "tma": 3, "turns": 4, "turns-t": 5, "halves": 6}
_STAGED = ("tma", "turns", "turns-t", "halves")  # the modes that add dQ by the copy engine, from fp32 staging tiles
_SHARED = ("turns", "turns-t", "halves")  # the modes whose consumers share their dS^T and add the program's share
_SPREAD = tuple(m for m in _STAGED if m != "turns-t")  # row-major staging tiles: columns spread (spreads_columns)
PERSISTENT_DQ_MODES = ("tma", "turns", "halves")  # order "ws-p"'s: row-major staging tiles, two consumers


def config_error(kernel: str, head_dim: int, cfg: Config, elem: int = 2, dq_mode: str = "add") -> str | None:
    """Why `cfg` cannot run in `kernel` (KERNELS) at this head dim (the fused kernel: with its dQ added
    as dq_mode says, DQ_MODES), or None if it can."""
    keyed = kernel in ("dkdv", "fused")  # a program owns a key tile
    rows, step = (cfg.block_n, cfg.block_m) if keyed else (cfg.block_m, cfg.block_n)
    rows_name, step_name = ("block_n", "block_m") if keyed else ("block_m", "block_n")
    orders = {"dkdv": DKDV_ORDERS, "dq": DQ_ORDERS, "fused": FUSED_ORDERS}[kernel]
    if cfg.order not in orders:
        return f"order {cfg.order!r}: one of {', '.join(orders)}"
    if kernel == "fused" and dq_mode in _STAGED and cfg.order not in _WS_ORDERS:
        return f"dq_mode {dq_mode!r}: the warp-specialised fused kernel's only (order ws or ws-p)"
    if cfg.order == "ws-p" and (dq_mode not in PERSISTENT_DQ_MODES or cfg.block_n != 2 * WG_KEYS):
        return (f"order 'ws-p' with dq_mode {dq_mode!r} and block_n {cfg.block_n}: the persistent kernel has two "
                f"consumers (block_n {2 * WG_KEYS}) adding dQ by the copy engine ({', '.join(PERSISTENT_DQ_MODES)})")
    if cfg.order in _WS_ORDERS:
        if kernel == "fused" and cfg.block_m != 64 and dq_mode != "turns-t":
            return (f"block_m {cfg.block_m}: the fused kernel's dQ tile is one warpgroup's 64 query rows (but with "
                    "dq_mode 'turns-t')")
        if kernel == "fused" and dq_mode in ("turns", "halves") and cfg.block_n != 2 * WG_KEYS:
            return f"block_n {cfg.block_n}: dq_mode {dq_mode!r} takes two consumers ({2 * WG_KEYS} keys)"
        if kernel == "fused" and dq_mode == "turns-t" and cfg.block_n == WG_KEYS:
            return f"block_n {cfg.block_n}: dq_mode 'turns-t' takes two or three consumers' turns"
        return _ws_config_error(head_dim, cfg, elem, fused=kernel == "fused",
                                staged=kernel == "fused" and dq_mode in _STAGED,
                                shared=kernel == "fused" and dq_mode in _SHARED,
                                split=kernel == "fused" and dq_mode == "halves")
    if kernel == "fused" and cfg.block_m != 64:
        return f"block_m {cfg.block_m}: the fused kernel's dQ tile is one warpgroup's 64 query rows"
    if cfg.num_warps not in (4, 8):
        return f"num_warps {cfg.num_warps}: the kernel takes 4 or 8 (one or two warpgroups)"
    if rows % (16 * cfg.num_warps) or rows > 256:
        return f"{rows_name} {rows}: a multiple of 16 x num_warps ({16 * cfg.num_warps}) up to 256"
    if step not in (16, 32, 64, 128) or rows % step:
        return f"{step_name} {step}: 16, 32, 64 or 128, dividing {rows_name} {rows}"
    if cfg.stages < 2 + (cfg.order.removesuffix(RS_SUFFIX) == "defer" and kernel == "dkdv"):
        return (f"stages {cfg.stages}: at least 2 (a slot is refilled only after its tile is used), 3 in the "
                "deferred order (which keeps the tile before in its slot)")
    if cfg.maxnreg is not None and not 24 <= cfg.maxnreg <= 255:
        return f"maxnreg {cfg.maxnreg}: 24 to 255 registers a thread"
    smem = (2 * rows + 2 * cfg.stages * step) * head_dim * elem + (rows * step * elem if kernel == "fused" else 0)
    if smem > ft.SMEM_BUDGET:
        return f"{smem} bytes of shared memory for the program's tiles and {cfg.stages} slots, over {ft.SMEM_BUDGET}"
    return None


def _ws_config_error(head_dim: int, cfg: Config, elem: int, fused: bool = False, staged: bool = False,
                     shared: bool = False, split: bool = False) -> str | None:
    """config_error for the warp-specialised dK/dV kernel (fused: _fused_ws_kernel, which also keeps each
    consumer's dS^T in shared memory; staged: and its fp32 dQ staging tile, _STAGED; shared: dS^T a tile
    parity, _SHARED; split: each staging tile a consumer's share of the columns, "halves"): block_n =
    consumers x WG_KEYS keys, 4 warps each; the register split is the kernel's own (WS_REGS). With two or
    three consumers the registers hold a program an SM, so its shared memory may use what the SM has
    (flash_gluon.WS_SMEM_BUDGET); one consumer keeps SMEM_BUDGET, where two programs share an SM."""
    if cfg.num_warps != 4:
        return f"num_warps {cfg.num_warps}: each warp-specialised consumer is one warpgroup, num_warps 4"
    if cfg.block_n % WG_KEYS or cfg.block_n // WG_KEYS not in WS_REGS:
        return (f"block_n {cfg.block_n}: {', '.join(str(c * WG_KEYS) for c in WS_REGS)} (consumer warpgroups "
                f"of {WG_KEYS} keys)")
    if cfg.block_m not in (16, 32, 64):
        return f"block_m {cfg.block_m}: 16, 32 or 64, dividing a consumer's {WG_KEYS} keys"
    if cfg.stages < 2:
        return f"stages {cfg.stages}: at least 2 (a slot is refilled only after every consumer is done with it)"
    if cfg.maxnreg is not None:
        return f"maxnreg {cfg.maxnreg}: the warp-specialised kernel sets its own registers (WS_REGS)"
    consumers = cfg.block_n // WG_KEYS
    smem = (2 * cfg.block_n + 2 * cfg.stages * cfg.block_m) * head_dim * elem + (
        cfg.block_n * cfg.block_m * elem * (1 + shared) if fused else 0) + (
        (1 if split else consumers) * cfg.block_m * head_dim * 4 if staged else 0)
    budget = flash_gluon.WS_SMEM_BUDGET if consumers > 1 else ft.SMEM_BUDGET
    if smem > budget:
        staging = " and the tma adds' staging tiles" if staged else ""
        return (f"{smem} bytes of shared memory for the program's tiles and {cfg.stages} slots{staging}, over "
                f"{budget}")
    return None


def launch_spec(kernel: str, head_dim: int, cfg: Config, dq_mode: str = "add", rotate: bool = False):
    """(kernel, its config's constexprs, launch options) for `kernel` (KERNELS) at `cfg`, or ValueError
    naming what is wrong with them. rotate: the warp-specialised fused kernel's non-causal programs each
    start at their own query tile (_fused_ws_kernel's ROTATE); elsewhere it must be off."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r}: one of {', '.join(KERNELS)}")
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode {dq_mode!r}: one of {', '.join(DQ_MODES)}")
    why = config_error(kernel, head_dim, cfg, dq_mode=dq_mode)
    if why:
        raise ValueError(why)
    if rotate and (kernel, cfg.order) != ("fused", "ws"):
        raise ValueError(f"rotate: the warp-specialised fused kernel's only (kernel fused, order ws), not "
                         f"{kernel} {cfg.order}")
    options = {"num_warps": cfg.num_warps}
    if cfg.maxnreg is not None:
        options["maxnreg"] = cfg.maxnreg
    constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, NUM_WARPS=cfg.num_warps)
    if kernel in ("dkdv", "fused") and cfg.order in _WS_ORDERS:
        consumers = cfg.block_n // WG_KEYS
        maxnreg, consumer_regs = WS_REGS[consumers]
        ws = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CONSUMERS=consumers,
                  CONSUMER_REGS=consumer_regs)
        options = {"num_warps": 4, "maxnreg": maxnreg}
        if cfg.order == "ws-p":
            return _fused_ws_persistent_kernel, {**ws, "DQ_MODE": _DQ_MODE_IDS[dq_mode]}, options
        if kernel == "fused":
            return _fused_ws_kernel, {**ws, "DQ_MODE": _DQ_MODE_IDS[dq_mode], "ROTATE": rotate}, options
        return _dkdv_ws_kernel, ws, options
    order = cfg.order.removesuffix(RS_SUFFIX)  # and the operands in registers where that took a suffix off
    if kernel == "dkdv":
        return _dkdv_kernel, {**constexprs, "ORDER": ORDERS.index(order), "KV_REGS": order != cfg.order}, options
    if kernel == "fused":
        return _fused_kernel, {**constexprs, "ORDER": 0, "DQ_MODE": _DQ_MODE_IDS[dq_mode],
                               "DQ_DEFER": cfg.order == "defer", "KV_REGS": False}, options
    return _dq_kernel, {**constexprs, "OVERLAP": order == "overlap", "QDO_REGS": order != cfg.order}, options


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor) -> str | None:
    """Why these kernels cannot take (q, k, v, dO), or None if they can (after flash_triton's own input checks)."""
    return flash_gluon.supported(q, k, v, do, what="the Gluon backward", names="q, k, v and dO")


def o_error(o: torch.Tensor) -> str | None:
    """Why the dQ kernel cannot read the forward's O, or None if it can: it reads O by pointers that
    assume unit stride along d."""
    if o.stride(-1) != 1:
        return f"out has stride {o.stride(-1)} along d: the dQ kernel reads O with unit stride there"
    return None


def _check(q, k, v, do, row_stats: dict) -> None:
    ft._check_inputs(q, k, v)
    if do.shape != q.shape or do.dtype != q.dtype:
        raise ValueError(f"dO {tuple(do.shape)} {do.dtype}: want q's shape {tuple(q.shape)} and dtype {q.dtype}")
    for name, t in row_stats.items():
        if t.shape != q.shape[:-1] or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} {tuple(t.shape)} {t.dtype}: want contiguous fp32 of shape {tuple(q.shape[:-1])}")
    why = supported(q, k, v, do)
    if why:
        raise ValueError(why)


def _scales(head_dim: int) -> tuple[float, float]:
    """(1/sqrt(d), 1/sqrt(d) * log2(e)): dK's and dQ's final scale, and the scale of raw scores in log2 units."""
    sm_scale = 1.0 / math.sqrt(head_dim)
    return sm_scale, sm_scale * ft.LOG2E


DKDV_CONFIG = Config(64, 64, 2, 4)
# d=64: the same tile capped at 168 registers (186 uncapped), so three programs fit an SM
DKDV_D64_CONFIG = Config(64, 64, 2, 4, maxnreg=168)
DQ_CONFIG = Config(64, 64, 2, 4)
# (head dim, causal) -> the config flash_triton's backward launches this dK/dV kernel at
# (LaunchOptions.gluon_dkdv). On the H200, in turns with the autotuned Triton kernel
# (docs/results/h200/flash_gluon_bwd/): at d=128 1.08-1.17x on causal shapes and 1.01-1.02x non-causal
# over three runs. At d=64 the capped tile ran 1.03-1.13x non-causal but lost on the leaderboard shape,
# so causal d=64 stays on the Triton kernel. Under sustained load on an H100 the whole backward read
# 1.02-1.03x at d=64 non-causal and -3 % to +1 % causal (docs/results/h100/gluon_paths/README.md).
SHIPPED_DKDV = {(128, False): DKDV_CONFIG, (128, True): DKDV_CONFIG, (64, False): DKDV_D64_CONFIG}
# (head dim, causal) -> the config flash_triton's backward launches this dQ kernel at when
# LaunchOptions.gluon_dq is on (off by default). Alone, in turns with Triton's autotuned dQ on an H100, it
# ran 0.99x and 1.06x at d=128 (at d=64 it lost on every shape), but the whole backward with it read
# 0.975-1.014x the shipped one under sustained load (docs/results/h100/flash_rs/README.md).
SHIPPED_DQ = {(128, False): DQ_CONFIG, (128, True): DQ_CONFIG}


# (head dim, causal) -> the config flash_triton's backward launches the fused warp-specialised kernel at,
# adding dQ as SHIPPED_FUSED_DQ_MODES says, from LaunchOptions.fused_min_seq on (LaunchOptions.gluon_fused).
# On an H100, in turns with the split backward (docs/results/h200/flash_gluon_bwd/README.md, "The adds in
# turns"): 1.04x on (16, 16384, 64) causal, level with cuDNN's; 0.90x on (4, 16, 4096, 64) not causal. Three
# Q/dO slots, not two: in turns on (16, 16384, 64) and (2, 32, 8192, 64) causal the best rounds read 1.07x
# and 1.05x with three, the median rounds 0.995x and 1.03x; under sustained load, each against the split
# backward in its own process, three slots ran 1.06x on both and two 1.03x and 1.015x
# (docs/results/h100/gluon_paths/README.md, "The fused backward shipped")
# At d=128 the kernel fits with dQ added in halves (DQ_MODES): under sustained load on an H100, in one rotation
# with the split backward, 1.05x on (2, 16, 8192, 128) causal and 1.08x not causal (1.02x at seq 4096)
# (docs/results/h100/gluon_paths/README.md, "The d=128 forward with three slots, and the fused backward at d=128
# in halves").
# Non-causal d=64 was level with the split backward at best on an H100, but on an H200, in one rotation with the
# split backward and a second copy of it, 1.036x on (2, 32, 8192, 64) and 1.060x on (1, 32, 16384, 64), the
# copy within 0.8 % (docs/results/h200/fused_gate/README.md, which also sets the gate at seq 4096).
FUSED_CONFIG_WS = Config(64, 128, 3, 4, "ws")
SHIPPED_FUSED = {(64, True): FUSED_CONFIG_WS, (64, False): FUSED_CONFIG_WS,
                 (128, True): FUSED_CONFIG_WS, (128, False): FUSED_CONFIG_WS}
# head dim -> how the shipped fused kernel adds dQ: in turns at d=64 (halves ran 0.88x-0.96x its speed there), in
# halves at d=128 (turns' (64, 128) dQ tile spills)
SHIPPED_FUSED_DQ_MODES = {64: "turns", 128: "halves"}


def shipped_dq_mode(head_dim: int) -> str:
    """How flash_triton's backward has the shipped fused kernel add dQ at this head dim (SHIPPED_FUSED_DQ_MODES)."""
    return SHIPPED_FUSED_DQ_MODES[head_dim]


def shipped_config(kernel: str, head_dim: int, is_causal: bool) -> Config | None:
    """The config flash_triton's backward launches `kernel` ("dkdv", "dq" or "fused") at for this head
    dim and mask (SHIPPED_DKDV, SHIPPED_DQ, SHIPPED_FUSED), or None where it keeps the Triton kernels."""
    shipped = {"dkdv": SHIPPED_DKDV, "dq": SHIPPED_DQ, "fused": SHIPPED_FUSED}[kernel]
    return shipped.get((head_dim, bool(is_causal)))


# where each kernel's tensors without strides sit among its tensors: the fp32 (Z*H, n_q) row stats, and the
# fused kernel's contiguous fp32 dQ accumulator
_UNSTRIDED = {"dkdv": (4, 5), "dq": (5, 6), "fused": (4, 5, 8)}


def launch(kernel: str, tensors: tuple, is_causal: bool, cfg: Config, group: int, dq_mode: str = "add",
           rotate: bool = False):
    """Launch `kernel` (KERNELS) on its tensors in signature order ((Z, H, n, d) views and the fp32 row
    stats) at `cfg`, in grid order `group` (flash_triton._head_group), rotate as launch_spec takes it.
    Returns (jit function, compiled kernel, runtime args, constexprs, grid): what flash_triton's launch
    plans are made from."""
    q4, k4 = tensors[0], tensors[1]
    jit_fn, config, options = launch_spec(kernel, q4.shape[-1], cfg, dq_mode, rotate)
    if jit_fn is _fused_ws_persistent_kernel and persistent_error(q4, k4, tensors[2], tensors[3], cfg) is not None:
        jit_fn, config, options = launch_spec(kernel, q4.shape[-1], cfg._replace(order="ws"), dq_mode, rotate)
    Z, H, n_q, d = q4.shape
    n_k = k4.shape[-2]
    strides = (x for i, t in enumerate(tensors) if i not in _UNSTRIDED[kernel] for x in t.stride()[:3])
    dq_rows = (0 if dq_mode == "probe" else n_q,) if kernel == "fused" else ()
    args = (*tensors, *strides, H, n_q, n_k, *dq_rows, *_scales(d))
    constexprs = {"IS_CAUSAL": bool(is_causal), "HEAD_DIM": d, **config}
    tiles = triton.cdiv(n_q, cfg.block_m) if kernel == "dq" else triton.cdiv(n_k, cfg.block_n)
    grid = (group, tiles, Z * H // group)
    if jit_fn is _fused_ws_persistent_kernel:
        schedule = flash_gluon.schedule_tensor(q4.get_device(), key_tile_costs, Z * H, n_q, n_k, cfg.block_m,
                                               cfg.block_n, group, bool(is_causal))
        args += (Z * H, group, schedule)
        grid = (min(math.prod(grid), flash_gluon.sm_count(q4.get_device())),)
    ft._ensure_scratch_allocator()
    compiled = jit_fn[grid](*args, **constexprs, **options)
    return jit_fn, compiled, args, constexprs, grid


def persistent_error(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor,
                     cfg: Config) -> str | None:
    """Why the persistent fused kernel (order "ws-p") cannot take these (Z, H, n, d) views, or None if it can:
    it reads Q, dO, K and V as (Z * H * n, d) matrices, so their rows must flatten, and its query and key tiles
    must end at n_q and n_k (a partial tile would read the next pair's rows, where the one-tile kernel's
    per-pair descriptors read zeros). Where it cannot, launch runs order "ws"."""
    why = flash_gluon.persistent_error(q4, k4, v4, cfg.block_n)
    if why is None and not flash_gluon._rows_flatten(do4):
        why = "dO rows do not flatten to one (Z * H * n, d) matrix"
    if why is None and q4.shape[-2] % cfg.block_m:
        why = f"{q4.shape[-2]} queries: not a multiple of the {cfg.block_m}-query tile"
    return why


def key_tile_costs(n_zh: int, n_q: int, n_k: int, block_m: int, block_n: int, group: int,
                   is_causal: bool) -> list[int]:
    """Each key tile's query tiles, the tiles in the one-tile fused kernel's launch order (_key_tile: groups of
    `group` (z, h) pairs, each group's key tiles one after another, causal key tile 0, the heaviest, first):
    what flash_gluon.tile_schedule hands the persistent kernel's programs."""
    tiles = triton.cdiv(n_k, block_n)
    per_tile = [triton.cdiv(max(n_q - (n * block_n if is_causal else 0), 0), block_m) for n in range(tiles)]
    return flash_gluon.launch_order_costs(per_tile, group, n_zh)


def dkdv(q, k, v, do, lse, delta, is_causal: bool = False, cfg: Config = DKDV_CONFIG, head_group: int | None = None,
         out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dK, dV) shaped and typed like k and v (written into `out` if given), from q, k, v, dO, the
    forward's L and Delta = rowsum(O * dO) (both fp32, q.shape[:-1]), at a config (launch_spec)."""
    _check(q, k, v, do, {"lse": lse, "delta": delta})
    q4, k4, v4, do4 = (ft._as_zhnd(t) for t in (q, k, v, do))
    dk, dv = out if out is not None else (torch.empty_like(k), torch.empty_like(v))
    group = ft._head_group(bool(is_causal), q4.shape[0] * q4.shape[1], head_group)
    launch("dkdv", (q4, k4, v4, do4, lse, delta, dk.view(k4.shape), dv.view(v4.shape)), is_causal, cfg, group)
    return dk, dv


def dq(q, k, v, o, do, lse, is_causal: bool = False, cfg: Config = DQ_CONFIG, head_group: int | None = None,
       out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dQ shaped and typed like q, Delta = rowsum(O * dO) fp32 of q.shape[:-1]) (written into `out` if
    given), from q, k, v, the forward's O and L, and dO, at a config (launch_spec)."""
    if o.shape != q.shape or o.dtype != q.dtype:
        raise ValueError(f"out {tuple(o.shape)} {o.dtype}: want q's shape {tuple(q.shape)} and dtype {q.dtype}")
    why = o_error(o)
    if why:
        raise ValueError(why)
    _check(q, k, v, do, {"lse": lse})
    q4, k4, v4, o4, do4 = (ft._as_zhnd(t) for t in (q, k, v, o, do))
    dq_, delta = out if out is not None else (torch.empty_like(q), torch.empty_like(lse))
    group = ft._head_group(bool(is_causal), q4.shape[0] * q4.shape[1], head_group)
    launch("dq", (q4, k4, v4, o4, do4, lse, delta, dq_.view(q4.shape)), is_causal, cfg, group)
    return dq_, delta


def flash_attention_backward(q, k, v, o, lse, do, is_causal: bool = False, dq_cfg: Config = DQ_CONFIG,
                             dkdv_cfg: Config = DKDV_CONFIG, head_group: int | None = None):
    """(dQ, dK, dV) as flash_triton.flash_attention_backward returns them: the dQ kernel (which writes
    Delta), then the dK/dV kernel."""
    dq_, delta = dq(q, k, v, o, do, lse, is_causal, dq_cfg, head_group)
    dk, dv = dkdv(q, k, v, do, lse, delta, is_causal, dkdv_cfg, head_group)
    return dq_, dk, dv


FUSED_CONFIG = Config(64, 64, 2, 4)
PREP_ROWS = 64  # query rows a program of _fused_prep_kernel


@triton.jit
def _fused_prep_kernel(O, DO, Delta, DQ_ACC, stride_oz, stride_oh, stride_om, stride_doz, stride_doh, stride_dom,
                       H, n_q, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, ZERO_ACC: tl.constexpr = True):
    """What the fused kernel needs first, for ROWS query rows of one (z, h) a program: Delta = rowsum(O * dO)
    in fp32, and (ZERO_ACC) those rows of the fp32 dQ accumulator ((Z*H, n_q, HEAD_DIM), contiguous) zeroed.
    One read of O and dO, where torch's (o.float() * do.float()).sum(-1) and zeros make four passes."""
    pid_m, pid_zh = tl.program_id(0), tl.program_id(1)
    z, h = pid_zh // H, pid_zh % H
    offs_m = pid_m * ROWS + tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    rows = offs_m.to(tl.int64)[:, None]
    o = tl.load(O + z.to(tl.int64) * stride_oz + h.to(tl.int64) * stride_oh + rows * stride_om + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + z.to(tl.int64) * stride_doz + h.to(tl.int64) * stride_doh + rows * stride_dom + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(Delta + pid_zh.to(tl.int64) * n_q + offs_m, tl.sum(o * do, axis=1), mask=row_ok)
    if ZERO_ACC:
        acc_rows = (pid_zh.to(tl.int64) * n_q + rows) * HEAD_DIM
        tl.store(DQ_ACC + acc_rows + offs_d[None, :], tl.zeros([ROWS, HEAD_DIM], tl.float32), mask=row_ok[:, None])


def _dq_t_shape(x: torch.Tensor) -> tuple[int, int, int]:
    """The transposed ("turns-t") dQ accumulator's shape for queries shaped like x: (Z*H, d, n_q rounded up
    to 4), each row 16-byte aligned for the copy engine (the kernel's q_cols)."""
    Z, H, n_q, d = ft._as_zhnd(x).shape
    return Z * H, d, triton.cdiv(n_q, 4) * 4


def dq_accumulator(q: torch.Tensor, dq_mode: str) -> torch.Tensor:
    """The fp32 dQ accumulator for the fused kernel adding dQ as dq_mode says: q's shape, contiguous, left
    for fused_prep to zero; or with "turns-t" dQ^T (_dq_t_shape), zeroed here by torch."""
    if dq_mode != "turns-t":
        return torch.empty(q.shape, dtype=torch.float32, device=q.device)
    return torch.zeros(_dq_t_shape(q), dtype=torch.float32, device=q.device)


@triton.jit
def _cast_dq_t_kernel(ACC, DQ, n_q, q_cols, sm_scale, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """dQ rows [pid_m * ROWS, + ROWS) of one (z, h) from the transposed accumulator ((Z*H, HEAD_DIM, q_cols)
    fp32): read along the queries, scaled, transposed on chip, written along d into DQ ((Z*H, n_q,
    HEAD_DIM), contiguous, its dtype)."""
    pid_m, pid_zh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * ROWS + tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    acc_t = tl.load(ACC + pid_zh.to(tl.int64) * HEAD_DIM * q_cols + offs_d[:, None] * q_cols + offs_m[None, :],
                    mask=row_ok[None, :], other=0.0)
    dq = tl.trans(acc_t * sm_scale).to(DQ.dtype.element_ty)
    tl.store(DQ + (pid_zh.to(tl.int64) * n_q + offs_m[:, None]) * HEAD_DIM + offs_d[None, :], dq, mask=row_ok[:, None])


@triton.jit
def _cast_dq_spread_kernel(DQ_ACC, DQ, n_rows, sm_scale, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """dQ rows [pid * ROWS, + ROWS) of the flattened (rows, HEAD_DIM) tensors from an accumulator whose
    columns are spread (spreads_columns): read and written whole rows at a time, the columns put back on
    chip (acc's 32g + 16b + 4a + c is dQ's 32g + 8a + 4b + c), scaled, cast to DQ's dtype."""
    offs_m = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs = offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    row_ok = offs_m[:, None] < n_rows
    acc = tl.load(DQ_ACC + offs, mask=row_ok, other=0.0)
    acc = tl.permute(tl.reshape(acc, (ROWS, HEAD_DIM // 32, 2, 4, 4)), (0, 1, 3, 2, 4))
    tl.store(DQ + offs, (tl.reshape(acc, (ROWS, HEAD_DIM)) * sm_scale).to(DQ.dtype.element_ty), mask=row_ok)


def spreads_columns(head_dim: int, cfg: Config, dq_mode: str) -> bool:
    """Whether the fused kernel at cfg adding dQ as dq_mode leaves the accumulator's columns relabelled in
    groups of 32 (_spread_columns): the modes that stage row-major fp32 tiles for the copy engine, where the
    staging tile is a multiple of 32 columns wide (halves: each of the consumers' share of them)."""
    if dq_mode not in _SPREAD:
        return False
    consumers = cfg.block_n // WG_KEYS if cfg.order in _WS_ORDERS else 1
    return (head_dim // consumers if dq_mode == "halves" else head_dim) % 32 == 0


def spread_columns(x: torch.Tensor) -> torch.Tensor:
    """x's last dim relabelled as the fused kernel's staging stores leave the accumulator (_spread_columns):
    column 32g + 8a + 4b + c goes to 32g + 16b + 4a + c. For tests; cast_dq undoes it."""
    return x.unflatten(-1, (x.shape[-1] // 32, 4, 2, 4)).transpose(-3, -2).flatten(-4)


def cast_dq(acc: torch.Tensor, q: torch.Tensor, spread: bool = False) -> torch.Tensor:
    """dQ shaped and typed like q from the fused kernel's fp32 accumulator (dq_accumulator's either layout),
    scaled by 1/sqrt(d) and cast in one pass (the transposed one by _cast_dq_t_kernel). spread: the columns
    are relabelled as spreads_columns says, and are put back in the same pass."""
    return cast_dq_launch(acc, q, spread)[0]


def cast_dq_launch(acc: torch.Tensor, q: torch.Tensor, spread: bool = False) -> tuple[torch.Tensor, tuple | None]:
    """cast_dq, and how it ran: (jit function, compiled kernel, runtime args, constexprs, grid) where a Triton
    kernel did, for flash_triton's launch plans (its first two args the tensors: acc, then dQ), or None where
    torch did (an accumulator of q's shape, columns in place: one torch.mul)."""
    dq_ = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    sm_scale = _scales(q.shape[-1])[0]
    if acc.shape == q.shape and spread:
        # (torch.mul of acc's permuted view did this at 1.8x the plain cast's time on an H100: 138 against 78 us
        # for a (4, 32, 4096, 64) dQ, docs/results/h100/nc_gap/cast_dq_70dbaa0.txt)
        n_rows = acc.numel() // acc.shape[-1]
        jit_fn, args, grid = _cast_dq_spread_kernel, (acc, dq_, n_rows, sm_scale), (triton.cdiv(n_rows, PREP_ROWS),)
    elif acc.shape == q.shape:
        torch.mul(acc, sm_scale, out=dq_)  # fp32 product, cast into dQ's dtype as it is written
        return dq_, None
    else:
        Z, H, n_q, d = ft._as_zhnd(q).shape
        jit_fn, args, grid = (_cast_dq_t_kernel, (acc, dq_, n_q, acc.shape[-1], sm_scale),
                              (triton.cdiv(n_q, PREP_ROWS), Z * H))
    constexprs = {"HEAD_DIM": q.shape[-1], "ROWS": PREP_ROWS}
    compiled = jit_fn[grid](*args, **constexprs)
    return dq_, (jit_fn, compiled, args, constexprs, grid)


def fused_prep(o: torch.Tensor, do: torch.Tensor, acc: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(Delta, a zeroed fp32 dQ accumulator) for the fused backward: Delta = rowsum(O * dO) in fp32, shaped
    o.shape[:-1]; the accumulator contiguous, shaped like o (`acc` if given, or dq_accumulator's transposed
    one for "turns-t", which comes zeroed). One kernel (_fused_prep_kernel)."""
    return fused_prep_launch(o, do, acc)[:2]


def fused_prep_launch(o: torch.Tensor, do: torch.Tensor, acc: torch.Tensor | None = None) -> tuple:
    """fused_prep, and how it ran: (Delta, the accumulator, (jit function, compiled kernel, runtime args,
    constexprs, grid)), for flash_triton's launch plans (the args' first four the tensors: O, dO, Delta, the
    accumulator)."""
    o4, do4 = ft._as_zhnd(o), ft._as_zhnd(do)
    Z, H, n_q, d = o4.shape
    if o.stride(-1) != 1 or do.stride(-1) != 1 or d & (d - 1):
        raise ValueError(f"out and dO need unit stride along d and a power-of-two d, got strides "
                         f"{o.stride(-1)}, {do.stride(-1)} and d={d}")
    delta = torch.empty(o.shape[:-1], dtype=torch.float32, device=o.device)
    if acc is None:
        acc = torch.empty(o.shape, dtype=torch.float32, device=o.device)
    # dq_accumulator's "turns-t" one, zeroed already (where it has out's shape, zeroing it again is harmless)
    transposed = acc.shape != o.shape and acc.shape == _dq_t_shape(o)
    if not transposed and (acc.shape != o.shape or acc.dtype != torch.float32 or not acc.is_contiguous()):
        raise ValueError(f"acc {tuple(acc.shape)} {acc.dtype}: want a contiguous fp32 tensor of out's shape "
                         f"{tuple(o.shape)}, or a zeroed transposed one (dq_accumulator)")
    args = (o4, do4, delta, acc, *o4.stride()[:3], *do4.stride()[:3], H, n_q)
    constexprs = {"HEAD_DIM": d, "ROWS": PREP_ROWS, "ZERO_ACC": not transposed}
    grid = (triton.cdiv(n_q, PREP_ROWS), Z * H)
    compiled = _fused_prep_kernel[grid](*args, **constexprs)
    return delta, acc, (_fused_prep_kernel, compiled, args, constexprs, grid)


def fused_backward(q, k, v, o, lse, do, is_causal: bool = False, cfg: Config = FUSED_CONFIG,
                   head_group: int | None = None, dq_mode: str = "add", rotate: bool = False):
    """(dQ, dK, dV) from one fused kernel (_fused_kernel): Delta = rowsum(O * dO) and the zeroed fp32
    accumulator first (fused_prep), dQ added in fp32 by every key tile's program, then scaled and cast in
    one pass. An experiment beside the split backward (docs/results/h200/flash_gluon_bwd/); dq_mode "probe"
    leaves dQ zero (DQ_MODES); rotate as launch_spec takes it."""
    _check(q, k, v, do, {"lse": lse})
    if o.shape != q.shape or o.dtype != q.dtype:
        raise ValueError(f"out {tuple(o.shape)} {o.dtype}: want q's shape {tuple(q.shape)} and dtype {q.dtype}")
    q4, k4, v4, do4 = (ft._as_zhnd(t) for t in (q, k, v, do))
    delta, dq_acc = fused_prep(o, do, dq_accumulator(q, dq_mode))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    group = ft._head_group(bool(is_causal), q4.shape[0] * q4.shape[1], head_group)
    launch("fused", (q4, k4, v4, do4, lse, delta, dk.view(k4.shape), dv.view(v4.shape), dq_acc), is_causal, cfg,
           group, dq_mode, rotate)
    return cast_dq(dq_acc, q, spreads_columns(q.shape[-1], cfg, dq_mode)), dk, dv
