"""The names of attention implementations, dtypes and model sizes, defined once and torch-free: the
API validates sweeps with them, the suites and kernels dispatch on them."""
from __future__ import annotations

from dataclasses import dataclass

# PyTorch's SDPA with one backend forced: FlashAttention-2, cuDNN, memory-efficient, plain math
SDPA_BACKENDS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math")
# every attention implementation benchlab can time; `sdpa` lets PyTorch choose its backend
ATTENTION_IMPLS = ("naive", "sdpa", "flash_pytorch", "flash_triton", *SDPA_BACKENDS)
# what the Transformer LM can run its attention with
MODEL_ATTENTION_IMPLS = ("naive", "sdpa", "flash_triton", "flash_pytorch")

# the Triton FlashAttention-2 kernels, by the names launch options and the tuning tools use
FLASH_KERNELS = ("fwd", "dkdv", "dq")
# the Gluon kernels' suffix for "the score matmul's resident operand in registers" (Q in the forward,
# K and V in dK/dV, Q and dO in dQ): a wgmma then reads only B from shared memory
GLUON_RS_SUFFIX = "-rs"
# the warp-specialised modes' suffix for "K and V tiles each with barriers of their own" (FA-3's two
# pipelines), so a K slot refills once its scores are done; "-rs" may follow it ("ws-kv-rs")
GLUON_KV_SUFFIX = "-kv"
# the warp-specialised forward's suffix for "persistent: one program an SM taking query tile after query
# tile" ("ws-p", "pingpong-p"; kernels.flash_gluon._fwd_persistent_kernel)
GLUON_PERSISTENT_SUFFIX = "-p"
# the Gluon forward's modes (kernels.flash_gluon), the default first, then those with Q in registers,
# then the warp-specialised ones with K/V barriers of their own, then the persistent ones.
# "plain-rs" is left out: compiled (Triton 3.6 and 3.7.1, sm_90), its P V matmul at d=64 took P in the
# registers that still held Q for the next tile's scores, and the outputs were wrong
# (docs/results/h100/forward_rs/README.md)
GLUON_MODES = ("overlap", "plain", "ws", "pingpong",
               *(m + GLUON_RS_SUFFIX for m in ("overlap", "ws", "pingpong")),
               *(m + GLUON_KV_SUFFIX + s for m in ("ws", "pingpong") for s in ("", GLUON_RS_SUFFIX)),
               *(m + GLUON_PERSISTENT_SUFFIX for m in ("ws", "pingpong")))

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # our name -> torch's


def torch_dtype(name: str):
    """torch's dtype for one of DTYPES (`bf16` -> torch.bfloat16). Imports torch."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[name])


def autocast_dtype(precision: str):
    """The autocast dtype of a precision policy: None for fp32 (no autocast)."""
    return None if precision == "fp32" else torch_dtype(precision)


@dataclass(frozen=True)
class ModelSize:
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int


# The course's Transformer LM sizes (vocab 10,000, context 512 unless stated).
MODEL_SIZES: dict[str, ModelSize] = {
    "small": ModelSize(768, 3072, 12, 12),
    "medium": ModelSize(1024, 4096, 24, 16),
    "large": ModelSize(1280, 5120, 36, 20),
    "xl": ModelSize(2560, 10240, 32, 32),
    "10B": ModelSize(4608, 12288, 50, 36),
}
