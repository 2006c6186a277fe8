"""FlashAttention-2 in plain PyTorch, tile by tile.

Slow by design: it spells out the FA-2 algorithm (Dao, 2023, Algorithms 1 and 2) in a form that
can be stepped through, and is the second opinion when the Triton kernel disagrees with naive
attention. Nothing of size n_q x n_k is ever stored; backward recomputes P from L.
"""
from __future__ import annotations

import math

import torch

TILE_Q = 32  # B_q: query rows per tile (>= 16, as the course asks)
TILE_K = 32  # B_k: key rows per tile


def _tile_mask(q0: int, q1: int, k0: int, k1: int, device: torch.device) -> torch.Tensor:
    """True where query i (q0 <= i < q1) may see key j (k0 <= j < k1): j <= i."""
    return torch.arange(k0, k1, device=device)[None, :] <= torch.arange(q0, q1, device=device)[:, None]


def flash_forward_pytorch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False):
    """Returns (O, L): O like q, L = logsumexp of scaled scores, shaped q.shape[:-1], fp32."""
    n_q, d = q.shape[-2], q.shape[-1]
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    for q0 in range(0, n_q, TILE_Q):
        q1 = min(q0 + TILE_Q, n_q)
        qi = q[..., q0:q1, :].float()
        m = torch.full(qi.shape[:-1], float("-inf"), device=q.device)  # running row max
        l = torch.zeros(qi.shape[:-1], device=q.device)  # running row sum of exp(s - m)
        acc = torch.zeros_like(qi)  # running sum of exp(s - m) @ V
        k_end = min(n_k, q1) if is_causal else n_k  # key tiles past the diagonal are skipped
        for k0 in range(0, k_end, TILE_K):
            k1 = min(k0 + TILE_K, n_k)
            s = (qi @ k[..., k0:k1, :].float().transpose(-2, -1)) * scale
            if is_causal and k1 - 1 > q0:  # only tiles crossing the diagonal need the mask
                s = s.masked_fill(~_tile_mask(q0, q1, k0, k1, q.device), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)  # rescales what was accumulated under the old max
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[..., k0:k1, :].float()
            m = m_new
        out[..., q0:q1, :] = (acc / l[..., None]).to(q.dtype)
        lse[..., q0:q1] = m + torch.log(l)
    return out, lse


def flash_backward_pytorch(q, k, v, out, lse, grad_out, is_causal: bool = False):
    """Gradients (dQ, dK, dV) recomputed tile by tile from L, with D = rowsum(O * dO)."""
    n_q, d = q.shape[-2], q.shape[-1]
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(d)
    qf, kf, vf, dof = q.float(), k.float(), v.float(), grad_out.float()
    delta = (out.float() * dof).sum(dim=-1)  # D_i = dO_i . O_i = rowsum(P * dP)
    dq = torch.zeros_like(qf)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    for k0 in range(0, n_k, TILE_K):
        k1 = min(k0 + TILE_K, n_k)
        kj, vj = kf[..., k0:k1, :], vf[..., k0:k1, :]
        q_start = (k0 // TILE_Q) * TILE_Q if is_causal else 0  # queries before key k0 see none of it
        for q0 in range(q_start, n_q, TILE_Q):
            q1 = min(q0 + TILE_Q, n_q)
            s = (qf[..., q0:q1, :] @ kj.transpose(-2, -1)) * scale
            p = torch.exp(s - lse[..., q0:q1, None])
            if is_causal and k1 - 1 > q0:
                p = p.masked_fill(~_tile_mask(q0, q1, k0, k1, q.device), 0.0)
            do_i = dof[..., q0:q1, :]
            dv[..., k0:k1, :] += p.transpose(-2, -1) @ do_i
            dp = do_i @ vj.transpose(-2, -1)
            ds = p * (dp - delta[..., q0:q1, None])
            dq[..., q0:q1, :] += (ds @ kj) * scale
            dk[..., k0:k1, :] += (ds.transpose(-2, -1) @ qf[..., q0:q1, :]) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashAttentionPyTorch(torch.autograd.Function):
    """FA-2 forward and backward in tiled PyTorch. `.apply(q, k, v, is_causal=False)`."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = flash_forward_pytorch(q, k, v, bool(is_causal))
        ctx.save_for_backward(lse, q, k, v, out)
        ctx.is_causal = bool(is_causal)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        lse, q, k, v, out = ctx.saved_tensors
        dq, dk, dv = flash_backward_pytorch(q, k, v, out, lse, grad_out, ctx.is_causal)
        return dq, dk, dv, None
