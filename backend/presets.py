"""Studies created in one click: a preset is a named list of sweeps submitted together; the page
opens the last one. Torch-free.

ddp-course (GPU) is the CS336 DDP study: the xl model on 2 GPUs, naive / flat / overlap, bucketed at
1, 10, 100 and 1000 MB, torch DDP as reference, and before it the all-reduce sweep the bucket-size
chart fits its model on (fp32 messages, as the gradients are). ddp-course-cpu is the same study on
2 CPU ranks (gloo) with a small model: it runs anywhere, CI included. ddp-buckets-1.3b is the bucket
sweep on a model large enough that the GPUs, not the host, set the pace.
"""
from __future__ import annotations

from typing import Any

from backend.models import SweepCreate

BUCKETS_MB = (1, 10, 100, 1000)
ALLREDUCE_MB = [2**k for k in range(11)]  # 1 .. 1024 MB


def _study(device: str, model: dict[str, Any], allreduce_mb: list[float], steps: int,
           buckets: tuple[float, ...] = BUCKETS_MB,
           references: tuple[str, ...] = ("naive", "flat", "overlap", "torch_ddp")) -> list[SweepCreate]:
    common = {"world_size": 2, "device": device, **model, "warmup": 2, "steps": steps}
    return [
        SweepCreate(suite="allreduce", name=f"DDP study: all-reduce fit ({device})",
                    params={"size_mb": allreduce_mb, "world_size": 2, "device": device, "dtype": "fp32",
                            "warmup": 5, "repeats": 20}),
        SweepCreate(suite="ddp", name=f"DDP study: step time vs bucket size ({device})",
                    params=[{**common, "wrapper": list(references)},
                            {**common, "wrapper": "bucketed", "bucket_size_mb": list(buckets)}]),
    ]


PRESETS: dict[str, tuple[str, list[SweepCreate]]] = {
    "ddp-course": ("CS336 DDP study on 2 GPUs: xl model (bf16 autocast), naive / flat / overlap / bucketed at "
                   "1-1000 MB / torch DDP, with the all-reduce sweep the bucket model is fitted on",
                   _study("cuda", {"size": "xl", "precision": "bf16"}, ALLREDUCE_MB, 20)),
    "ddp-buckets-1.3b": ("Bucket size on a 1.3B-parameter model (d_model 2048, 24 layers, d_ff 8192, context "
                         "512, batch 8 per rank, bf16) on 2 GPUs: bucketed at 1-1000 MB against none / naive / "
                         "overlap / torch DDP, with its all-reduce fit",
                         _study("cuda", {"size": "custom", "d_model": 2048, "num_layers": 24, "num_heads": 16,
                                         "d_ff": 8192, "context_length": 512, "batch": 8, "precision": "bf16"},
                                ALLREDUCE_MB, 20, buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000),
                                references=("none", "naive", "overlap", "torch_ddp"))),
    "ddp-course-cpu": ("The same study on 2 CPU ranks (gloo) with a small model: runs on any machine",
                       _study("cpu", {"d_model": 128, "num_layers": 2, "num_heads": 4, "d_ff": 512,
                                      "context_length": 64, "batch": 1}, [0.25, 1, 4, 16], 10)),
}
