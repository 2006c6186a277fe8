"""Attention implementations by name, so the suite, the model and the benchmarks share one table.

Each entry is a callable `(q, k, v, is_causal) -> out` for q (..., n_q, d), k/v (..., n_k, d).
`sdpa` lets PyTorch choose its backend; `sdpa_flash`, `sdpa_cudnn`, `sdpa_efficient`, `sdpa_math`
force one (PyTorch's FlashAttention-2, cuDNN, memory-efficient, and the plain math path).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from kernels.attention import naive_attention
from kernels.names import ATTENTION_IMPLS, SDPA_BACKENDS

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]

# torch's name of the backend each forced-SDPA implementation selects
_SDPA_BACKEND = dict(zip(SDPA_BACKENDS, ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
                         strict=True))
IMPL_NAMES = ATTENTION_IMPLS


def _sdpa(q, k, v, is_causal):
    if q.dim() == 3:  # SDPA's fused backends want (batch, heads, seq, d): give 3D inputs one head
        return _sdpa(q[:, None], k[:, None], v[:, None], is_causal)[:, 0]
    if is_causal and q.shape[-2] != k.shape[-2]:
        # SDPA aligns its causal mask top-left too, but say so explicitly with a mask
        from kernels.attention import causal_mask

        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(q.shape[-2], k.shape[-2], q.device))
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _forced_sdpa(backend_name: str) -> AttentionFn:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v, is_causal):
        with sdpa_kernel(backend):
            return _sdpa(q, k, v, is_causal)

    return run


def _flash_pytorch(q, k, v, is_causal):
    from kernels.flash_pytorch import FlashAttentionPyTorch

    return FlashAttentionPyTorch.apply(q, k, v, is_causal)


def _flash_triton(q, k, v, is_causal):
    from kernels.flash_triton import FlashAttentionTriton

    # under torch.compile this runs as the custom ops benchlab::flash_attention_fwd/bwd: no graph break
    return FlashAttentionTriton.apply(q, k, v, is_causal)


def get_attention(name: str) -> AttentionFn:
    """The attention callable called `name` (one of IMPL_NAMES)."""
    if name == "naive":
        return naive_attention
    if name == "sdpa":
        return _sdpa
    if name == "flash_pytorch":
        return _flash_pytorch
    if name == "flash_triton":
        return _flash_triton
    if name in _SDPA_BACKEND:
        return _forced_sdpa(_SDPA_BACKEND[name])
    raise ValueError(f"unknown attention implementation {name!r}; choose from {', '.join(IMPL_NAMES)}")
