"""Activation memory of the Transformer LM: what a block saves for backward, measured with
saved-tensor hooks, and what a checkpointing policy should keep alive (the model suite reports both)."""
from __future__ import annotations

import torch

from kernels.model import parse_checkpointing


def saved_bytes_per_block(model, tokens) -> int:
    """Bytes one block saves for backward (saved-tensor hooks; a storage counted once), measured on
    block 0 alone so that counting never needs a whole un-checkpointed model's activations."""
    seen: set[int] = set()
    total = 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    x = model.token_embeddings(tokens).detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model.layers[0](x)
    del out
    return total


def predicted_activation_bytes(policy: str, num_layers: int, per_block: int, residual: int) -> int:
    """What checkpointing should keep alive at the start of backward, from the per-block numbers.

    none: every block's saved tensors, L * S. every_k: the input of each region (L/k residual
    tensors) plus one region's saved tensors during its recompute, k * S. nested with region g:
    L/g region inputs + g block inputs + one block's saved tensors.
    """
    k, nested = parse_checkpointing(policy, num_layers)
    if k == 0:
        return num_layers * per_block
    regions = -(-num_layers // k)
    if nested:
        return regions * residual + k * residual + per_block
    return regions * residual + k * per_block
