"""The data-parallel wrappers by name, torch-free (the API validates `ddp` sweeps with them)."""
from __future__ import annotations

# none: no communication at all (the baseline); torch_ddp: torch.nn.parallel.DistributedDataParallel
WRAPPER_NAMES = ("none", "naive", "flat", "overlap", "bucketed", "torch_ddp", "zero1", "fsdp")
