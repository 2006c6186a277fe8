"""The `leaderboard` suite: one full training step of the CS336 leaderboard's 8B-class model on N ranks.

The course's configuration: d_model 4096, d_ff 11008, 34 layers, 32 heads, vocab 151,936, context
32,768, bf16, causal, one sequence per GPU on two GPUs; the step is zero_grad, forward,
cross-entropy, backward, the optimizer step. It does not fit naively: fp32 weights, gradients and
two Adam moments are 16 bytes/param x 8.1e9 params = 130 GB per replica. Sharding (FSDP, ZeRO-1),
activation checkpointing, flash attention and bf16 optimizer state are the levers.

`scale` multiplies the layers and the context (and the width overrides shrink the rest), so the same
recipe runs at toy size on a CPU with gloo and at full size on the GPUs.

Per rank (worker/suites/leaderboard_rank.py), every timed step starts with the GPU idle and the ranks'
hosts aligned by a barrier; CUDA events split it into forward, backward (gradient synchronisation
included) and optimizer. The figures are the slowest rank's. The course times the step with
triton.testing.do_bench; do_bench picks its repeat count per process from its own estimate, and
ranks that disagree would deadlock in the collectives, so the ranks here run a fixed count.

  tokens/s       = world_size * batch * context / step
  MFU            = model FLOPs per step (kernels/flops.py, no recomputation) / step / world_size /
                   the GPU's reference bf16 dense peak (datasheet; the measured matmul peak beside it)
  exposed comm   = per step, the time only collectives were running on the GPU (no compute kernel
                   beside them), from a profiled step
  first step s   = from the rank's start (empty Triton and inductor caches when cold_start) to the
                   first timed step: building, sharding, compiling, autotuning, warm-up
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kernels.names import MODEL_ATTENTION_IMPLS
from worker.suites.common import Device, NonNegative, Positive, Samples, SuiteParams, Untimed, WorldSize

DESCRIPTION = "CS336 leaderboard: a full training step of the 8B-class model at context 32k on N ranks"

COURSE = {"d_model": 4096, "d_ff": 11008, "num_layers": 34, "num_heads": 32, "vocab_size": 151_936,
          "context_length": 32_768}
# bf16 dense tensor-core peak per GPU from the vendor's datasheet (without sparsity), TFLOP/s
REFERENCE_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "B200": 2250.0, "A100": 312.0}


class Params(SuiteParams):
    sharding: Literal["fsdp", "zero1", "none"] = "fsdp"
    world_size: WorldSize = 2
    scale: float = Field(1.0, gt=0, le=1, description="factor on layers and context: 1 is the course's model")
    d_model: Positive | None = Field(None, description="default: the course's 4096 (toy runs shrink it)")
    d_ff: Positive | None = Field(None, description="default: 11008")
    num_heads: Positive | None = Field(None, description="default: 32")
    vocab_size: Positive | None = Field(None, description="default: 151936")
    batch: Positive = Field(1, description="sequences per rank")
    precision: Literal["bf16", "fp32"] = Field("bf16", description="compute dtype; weights stay fp32")
    checkpointing: str = Field("block", pattern=r"^(none|block|nested|every_[1-9][0-9]*)$",
                               description="the model suite's activation checkpointing policy")
    attention: Literal[MODEL_ATTENTION_IMPLS] = "flash_triton"
    compile: bool = Field(False, description="torch.compile each Transformer block (GPU)")
    optimizer: Literal["course", "torch_fused"] = "course"
    state_dtype: Literal["fp32", "bf16"] = Field("fp32", description="AdamW moments' storage (course optimizer); "
                                                                     "updates compute in fp32 either way")
    param_dtype: Literal["fp32", "bf16"] = Field("fp32", description="the weights the model holds; bf16 keeps "
                                                                     "fp32 master weights in the optimizer")
    offload: bool = Field(False, description="master weights and optimizer state on the host; the optimizer "
                                             "step runs on the CPU")
    loss_chunk: NonNegative = Field(4096, description="positions per cross-entropy chunk, logits recomputed in "
                                                      "backward (0: the whole logits at once, 20 GB in fp32 at "
                                                      "full size)")
    cold_start: bool = Field(True, description="empty Triton and inductor caches in each rank")
    warmup: Untimed = Field(1, description="untimed steps first")
    steps: Samples = Field(5, description="timed steps: the samples of one run")
    device: Device = "auto"

    @model_validator(mode="after")
    def _consistent(self):
        if self.state_dtype == "bf16" and self.optimizer != "course":
            raise ValueError("state_dtype=bf16 needs optimizer=course (torch's AdamW keeps its state in the "
                             "parameters' dtype)")
        dims = self.dims()
        if dims["d_model"] % dims["num_heads"]:
            raise ValueError(f"d_model {dims['d_model']} must be divisible by num_heads {dims['num_heads']}")
        return self

    def dims(self) -> dict[str, int]:
        """The model this cell trains: the course's, with `scale` on layers and context and the overrides."""
        d = {k: getattr(self, k) or v for k, v in COURSE.items() if k not in ("num_layers", "context_length")}
        d["num_layers"] = max(1, round(COURSE["num_layers"] * self.scale))
        d["context_length"] = max(16, round(COURSE["context_length"] * self.scale))
        return d


def reference_peak_tflops(gpu_name: str | None) -> float | None:
    """The datasheet bf16 dense peak of a GPU named like 'NVIDIA H200', or None if unknown."""
    for key, tflops in REFERENCE_PEAK_TFLOPS.items():
        if gpu_name and key in gpu_name:
            return tflops
    return None


def run(p: Params, ctx) -> dict:
    import statistics

    from kernels.flops import transformer_flops
    from parallel.launch import launch
    from worker.harness import SkipCell, Timing, require_runnable_attention, resolve_rank_device
    from worker.stats import slowest_rank
    from worker.suites.leaderboard_rank import leaderboard_rank

    device = resolve_rank_device(p.device, p.world_size)
    require_runnable_attention(p.attention, device)
    if p.compile and device == "cpu":
        raise SkipCell("torch.compile cells are GPU-only here (CPU inductor needs a C++ toolchain per cell)")
    dims = p.dims()
    cfg = {**p.model_dump(), **dims, "device": device}
    ctx.progress(f"launching {p.world_size} ranks ({device}): {dims['num_layers']} layers, d_model "
                 f"{dims['d_model']}, context {dims['context_length']}, {p.sharding}")
    ranks = launch(leaderboard_rank, p.world_size, args=(cfg,), device=device, timeout_s=3600)

    step = Timing.from_samples(slowest_rank([r["samples_ms"] for r in ranks]))
    parts = {name: statistics.median(slowest_rank([r["parts_ms"][name] for r in ranks]))
             for name in ("forward", "backward", "optimizer")}
    tokens = p.world_size * p.batch * dims["context_length"]
    flops = transformer_flops(p.batch * p.world_size, dims["context_length"], dims["d_model"], dims["d_ff"],
                              dims["num_layers"], dims["vocab_size"])["fwd_bwd"]
    achieved_per_gpu = flops / (step.median_ms * 1e-3) / p.world_size / 1e12
    r0 = ranks[0]
    ref = reference_peak_tflops(r0["gpu_name"])
    measured = [r["peak_tflops_measured"] for r in ranks if r["peak_tflops_measured"]]
    exposed = [r["exposed_comm_ms"] for r in ranks if r["exposed_comm_ms"] is not None]
    return {
        **step.as_dict(),
        "rank_samples_ms": [r["samples_ms"] for r in ranks],
        "forward_ms": parts["forward"], "backward_ms": parts["backward"], "optimizer_ms": parts["optimizer"],
        "comm_ms": max(r["comm_ms"] for r in ranks),
        "comm_by_kind_ms": max(ranks, key=lambda r: r["comm_ms"])["comm_by_kind_ms"],
        "exposed_comm_ms": max(exposed) if exposed else None,
        "tokens_per_s": tokens / (step.median_ms * 1e-3),
        "model_flops": flops,
        "tflops_per_gpu": achieved_per_gpu,
        "reference_peak_tflops": ref,
        "mfu": achieved_per_gpu / ref if ref else None,
        "peak_tflops_measured": min(measured) if measured else None,
        "mfu_vs_measured_peak": achieved_per_gpu / min(measured) if measured else None,
        "peak_mem_bytes": max((r["peak_mem_bytes"] for r in ranks if r["peak_mem_bytes"] is not None), default=None),
        "peak_mem_by_rank": [r["peak_mem_bytes"] for r in ranks],
        "memory_by_rank": [r["memory"] for r in ranks],
        "first_step_s": max(r["first_step_s"] for r in ranks),
        "params": r0["params"],
        "model": dims,
        "backend": r0["backend"],
        "gpu_name": r0["gpu_name"],
        "world_size": p.world_size,
    }
