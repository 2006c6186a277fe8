"""The CS336 Transformer LM, a drop-in twin of the course's `BasicsTransformerLM`.

Same parameter names, shapes and initialisation (modules are built in the reference's order, so
one seed gives the same weights), same RoPE quirk, same logits. What benchlab adds: the attention
implementation is selectable and activation checkpointing can be switched on.

Parameter count per block: 4*d^2 (attention) + 3*d*d_ff (SwiGLU) + 2*d (norms); plus
2*vocab*d (embedding and untied head) + d (final norm).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from kernels.impls import get_attention
from kernels.names import MODEL_SIZES


class Linear(nn.Module):
    """y = x W^T, W (out, in) from N(0, 2/(in+out)) truncated at +-3 std; no bias."""

    def __init__(self, in_features: int, out_features: int, device=None, dtype=None):
        super().__init__()
        std = math.sqrt(2 / (in_features + out_features))
        self.weight = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(out_features, in_features, device=device, dtype=dtype),
                                  std=std, a=-3 * std, b=3 * std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T

    def extra_repr(self) -> str:
        return f"d_out={self.weight.shape[0]}, d_in={self.weight.shape[1]}"


class Embedding(nn.Module):
    """Row lookup; weights from N(0, 1) truncated at +-3."""

    def __init__(self, vocab_size: int, d_model: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(vocab_size, d_model, device=device, dtype=dtype), std=1, a=-3, b=3))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, computed in fp32 and cast back to the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (self.weight * x).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """RoPE as the course's model does it: pairs read interleaved (x[0::2], x[1::2]), rotated,
    and written back as the concatenation [r1, r2], not re-interleaved. q and k get the same
    permutation, so q.k scores equal standard RoPE's, but the tensors (and so a state-dict twin's
    intermediate values) differ; reproduced exactly.
    """

    def __init__(self, context_length: int, dim: int, theta: float = 10000.0):
        super().__init__()
        if dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got {dim}")
        freqs = theta ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # f_k = theta^(-2k/d)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), freqs)  # (ctx, d/2)
        self.register_buffer("_cos", angles.cos(), persistent=False)
        self.register_buffer("_sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, pos_ids: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        cos, sin = self._cos[pos_ids].to(x.dtype), self._sin[pos_ids].to(x.dtype)
        return torch.cat([cos * x1 - sin * x2, sin * x1 + cos * x2], dim=-1)


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, positional_encoder: RotaryEmbedding | None,
                 attention: str = "naive"):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.output_proj = Linear(d_model, d_model)
        self.positional_encoder = positional_encoder  # one module shared by every block, as in the reference
        self.set_attention(attention)

    def set_attention(self, name: str) -> None:
        """Use attention implementation `name` (kernels.impls) from the next call on."""
        self.attention, self._attn_fn = name, get_attention(name)

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor | None = None) -> torch.Tensor:
        *lead, seq, d_model = x.shape
        # (..., seq, heads*d_head) -> (..., heads, seq, d_head); head h takes columns h*d_head..
        split = lambda t: t.view(*lead, seq, self.num_heads, self.d_head).transpose(-3, -2)  # noqa: E731 (a one-line reshape helper)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        if self.positional_encoder is not None:
            if token_positions is None:
                token_positions = torch.arange(seq, device=x.device)
            q = self.positional_encoder(q, token_positions)
            k = self.positional_encoder(k, token_positions)
        out = self._attn_fn(q, k, v, True)
        out = out.transpose(-3, -2).reshape(*lead, seq, d_model)
        return self.output_proj(out)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attn(ln1(x)); out = h + ffn(ln2(h))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, positional_encoder, attention: str = "naive"):
        super().__init__()
        self.attn = CausalMultiHeadSelfAttention(d_model, num_heads, positional_encoder, attention)
        self.ln1 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)
        self.ln2 = RMSNorm(d_model)

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attn(self.ln1(x), token_positions)
        return h + self.ffn(self.ln2(h))


def parse_checkpointing(policy: str, num_layers: int) -> tuple[int, bool]:
    """'none' -> (0, False); 'block' -> (1, False); 'every_k' -> (k, False); 'nested' -> (~sqrt(L), True).

    every_k: each run of k consecutive blocks is one checkpointed region (only its input is kept;
    memory ~ L/k block inputs + k blocks' activations during recompute). nested: regions of
    ~sqrt(L) blocks whose blocks are checkpointed again inside, so the recompute of a region keeps
    only block inputs: ~2*sqrt(L) block inputs + one block's activations, for ~2 extra forwards.
    """
    if policy == "none":
        return 0, False
    if policy == "block":
        return 1, False
    if policy == "nested":
        return max(1, round(math.sqrt(num_layers))), True
    if policy.startswith("every_") and policy[6:].isdigit() and int(policy[6:]) > 0:
        return int(policy[6:]), False
    raise ValueError(f"checkpointing must be 'none', 'block', 'every_K' (K >= 1) or 'nested', got {policy!r}")


class TransformerLM(nn.Module):
    """The CS336 reference Transformer LM. forward(token_ids (batch, seq)) -> logits (batch, seq, vocab)."""

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, rope_theta: float | None = 10000.0, attention: str = "naive",
                 checkpointing: str = "none"):
        super().__init__()
        get_attention(attention)  # an unknown name is refused before any weight is allocated
        for name, value in (("vocab_size", vocab_size), ("context_length", context_length), ("d_model", d_model),
                            ("num_layers", num_layers), ("num_heads", num_heads), ("d_ff", d_ff)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.d_model = d_model
        self.token_embeddings = Embedding(vocab_size, d_model)
        d_head = d_model // num_heads
        self.positional_encoder = (RotaryEmbedding(context_length, d_head, rope_theta)
                                   if rope_theta is not None else None)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, self.positional_encoder, attention) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)
        self.checkpoint_every, self.checkpoint_nested = parse_checkpointing(checkpointing, num_layers)

    def set_attention(self, name: str) -> None:
        """Switch every block to attention implementation `name` (same weights; under torch.compile each
        implementation gets its own graph, since dynamo guards on the attention function). An unknown
        name is refused by the first block, before any block changes."""
        for block in self.layers:
            block.attn.set_attention(name)

    def _run_blocks(self, blocks, x, token_positions, inner_checkpoint: bool):
        for block in blocks:
            if inner_checkpoint:
                x = checkpoint(block, x, token_positions, use_reentrant=False)
            else:
                x = block(x, token_positions)
        return x

    def forward(self, token_ids: torch.Tensor, token_positions: torch.Tensor | None = None,
                targets: torch.Tensor | None = None, loss_chunk: int = 0) -> torch.Tensor:
        """Logits (batch, seq, vocab); with `targets`, the mean cross-entropy instead.

        loss_chunk > 0 computes that loss `loss_chunk` positions at a time and recomputes each chunk's
        logits in backward, so the whole (tokens x vocab) logits never exist at once: at context
        32,768 and vocab 151,936 they are 32768 * 151936 * 2 bytes = 10 GB in bf16, twice that in fp32.
        """
        x = self.hidden_states(token_ids, token_positions)
        if targets is None:
            return self.lm_head(x)
        if loss_chunk <= 0:
            return cross_entropy(self.lm_head(x), targets)
        return chunked_cross_entropy(x, self.lm_head, targets, loss_chunk)

    def hidden_states(self, token_ids: torch.Tensor, token_positions: torch.Tensor | None = None) -> torch.Tensor:
        """The final-normed hidden states (batch, seq, d_model): everything but the lm_head."""
        if token_ids.shape[-1] > self.context_length:
            raise ValueError(f"sequence length {token_ids.shape[-1]} exceeds context_length {self.context_length}")
        x = self.token_embeddings(token_ids)
        k = self.checkpoint_every
        if k == 0 or not self.training and not torch.is_grad_enabled():
            x = self._run_blocks(self.layers, x, token_positions, False)
        else:
            for start in range(0, len(self.layers), k):
                group = self.layers[start:start + k]
                x = checkpoint(self._run_blocks, group, x, token_positions, self.checkpoint_nested,
                               use_reentrant=False)
        return self.ln_final(x)

    @classmethod
    def from_size(cls, size: str, vocab_size: int = 10_000, context_length: int = 512, **kwargs) -> "TransformerLM":
        if size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {size!r}; choose from {', '.join(MODEL_SIZES)}")
        s = MODEL_SIZES[size]
        return cls(vocab_size, context_length, s.d_model, s.num_layers, s.num_heads, s.d_ff, **kwargs)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits)[target] per position, computed in fp32."""
    logits = logits.float()
    logits = logits - logits.amax(dim=-1, keepdim=True)
    log_z = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return log_z - picked


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over all positions of -log softmax(logits)[target], computed in fp32."""
    return token_losses(logits, targets).mean()


def chunked_cross_entropy(hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """cross_entropy(head(hidden), targets), `chunk` positions at a time, each chunk checkpointed:
    one chunk's logits exist at a time, in forward and again in backward."""
    def chunk_loss_sum(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return token_losses(head(h), t).sum()

    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[-2], chunk):
        total = total + checkpoint(chunk_loss_sum, hidden[..., start:start + chunk, :],
                                   targets[..., start:start + chunk], use_reentrant=False)
    return total / targets.numel()
