"""Naive attention: the reference every other implementation is checked against."""
from __future__ import annotations

import math

import torch


def causal_mask(n_queries: int, n_keys: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True where query i may see key j (j <= i, top-left aligned)."""
    q_idx = torch.arange(n_queries, device=device)[:, None]
    k_idx = torch.arange(n_keys, device=device)[None, :]
    return k_idx <= q_idx


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) [masked]) v for q (..., n_q, d), k and v (..., n_k, d).

    Materialises the (n_q, n_k) score matrix per head: memory O(s^2), the thing FlashAttention avoids.
    """
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def naive_logsumexp(q: torch.Tensor, k: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """The natural-log logsumexp L of the scaled (and masked) scores, shaped q.shape[:-1]."""
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.logsumexp(scores, dim=-1)
