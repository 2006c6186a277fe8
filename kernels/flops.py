"""FLOP counts for what benchlab times (docs/architecture.md, "Measuring").

Attention: S = QK^T is 2*s_q*s_k*d FLOPs per head, O = PV another 2*s_q*s_k*d, so the
forward is 4*b*h*s_q*s_k*d (softmax ignored), halved when causal. Backward redoes QK^T
and computes dV, dP, dQ, dK (5 matmuls): 2.5x forward. Forward+backward is 3.5x.
"""
from __future__ import annotations

PASS_MULTIPLIER = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


def attention_flops(batch: int, heads: int, s_q: int, s_k: int, d: int, causal: bool, pass_: str = "fwd") -> float:
    """FLOPs of one attention call for the given pass (`fwd`, `bwd` or `fwd_bwd`)."""
    if pass_ not in PASS_MULTIPLIER:
        raise ValueError(f"pass must be one of {sorted(PASS_MULTIPLIER)}, got {pass_!r}")
    fwd = 4.0 * batch * heads * s_q * s_k * d
    if causal:
        fwd /= 2
    return fwd * PASS_MULTIPLIER[pass_]


def transformer_flops(
    batch: int, seq: int, d_model: int, d_ff: int, num_layers: int, vocab_size: int, causal: bool = True
) -> dict[str, float]:
    """Forward/backward matmul FLOPs of the CS336 Transformer LM (no biases; norms ignored).

    Per layer and token: q,k,v,o projections 4 * 2*d_model^2, SwiGLU 3 * 2*d_model*d_ff;
    attention 4*seq*d_model per token (QK^T and PV over all heads), halved when causal.
    lm_head 2*d_model*vocab per token. Backward is 2x forward for matmuls.
    """
    tokens = batch * seq
    per_token_layer = 8 * d_model * d_model + 6 * d_model * d_ff
    attn = attention_flops(batch, 1, seq, seq, d_model, causal) * num_layers
    fwd = tokens * (num_layers * per_token_layer + 2 * d_model * vocab_size) + attn
    return {"fwd": fwd, "bwd": 2 * fwd, "fwd_bwd": 3 * fwd}
