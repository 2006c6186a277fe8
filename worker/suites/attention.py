"""The `attention` suite: latency, TFLOP/s, peak memory and accuracy of one attention implementation.

Inputs are q, k, v shaped (batch, heads, seq_len, d_head), contiguous. FLOPs (kernels/flops.py):
forward 4*b*h*s^2*d (halved when causal), backward 2.5x, forward+backward 3.5x.

Every cell also records the forward's error against float64 attention on the first batch element's
first heads (`out_rel_err`, `out_max_abs_err`), so a faster cell that computes less exactly says so:
fp32 in particular can mean one TF32 pass, three (tf32x3, about fp32's accuracy) or full fp32 FMAs,
which `precision` chooses where the implementation lets it.

On a GPU the time (`median_ms` and the rest) is CUDA-event time of calls issued back to back, as a
training loop and triton's do_bench issue them; `gpu_ms` is the same scope measured again with a
head start (worker.harness.measure), the GPU's work alone; `host_median_ms` is the host's time to
issue one call. `gpu_busy` = gpu_ms / median_ms; below HOST_BOUND (0.8) the cell is `host_bound`: the
host's launching, not the kernel, sets its time, and the kernel's own speed is `gpu_ms`. The head
start's sleep also lets a chip at its power limit recover a little before each sample, so on long
cells `gpu_ms` reads a few % under `median_ms` (gpu_busy 0.93 on the leaderboard shape): judge speed
by `median_ms` and use `gpu_ms` to tell the host's share.

Two implementations compare best in one cell: with `against` set, the cell times impl and that
implementation on the same inputs in turns, sample by sample (worker.harness.measure_turns), and
records impl's speed-up over it with an interval. Cells run one after another see the host's drift
between them as a difference, which on host-bound shapes outweighs the implementations' own.

Taken sample by sample, the two share the chip's clock. With `sustain_ms` set, the cell times as
triton's do_bench (and a training loop) does instead: each implementation alone, its calls back to back
for `sustain_ms`, in `rounds` rounds with the first one rotating (worker.harness.measure_sustained).
At 1000 ms a GPU reaches its power limit, where the implementation that spends more energy per call
runs at a lower clock, which turns hide (docs/results/h100/sustained/README.md). The samples of all
rounds are the cell's (`samples_ms`, `round_samples` says how many each round took), each round's
median and drift (last quarter over first) are kept, and the speed-up's interval resamples rounds,
then calls within them (worker.stats.grouped_ratio_interval), beside each round's own ratio.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kernels.names import ATTENTION_IMPLS
from worker.suites.common import MAX_SAMPLES, Device, Dtype, Positive, Samples, SuiteParams, Untimed

DESCRIPTION = "Attention kernels (naive, SDPA, FlashAttention-2 in PyTorch and Triton): latency, TFLOP/s, memory"

Impl = Literal[ATTENTION_IMPLS]
Pass = Literal["fwd", "bwd", "fwd_bwd"]
Precision = Literal["tf32", "tf32x3", "ieee"]
# implementations whose fp32 products follow torch's matmul setting (tf32 or ieee, no tf32x3)
TORCH_MATMUL_IMPLS = ("naive", "flash_pytorch", "sdpa_math")
ERROR_HEADS = 2  # heads of batch element 0 compared with float64 attention
MAX_SUSTAIN_MS = 10_000  # the CS336 leaderboard's do_bench rep
MAX_ROUNDS = 20
DEFAULT_ROUNDS = 3


class Params(SuiteParams):
    impl: Impl = "flash_triton"
    batch: Positive = 4
    heads: Positive = 8
    seq_len: Positive = 1024
    d_head: int = Field(64, gt=0, le=256)
    dtype: Dtype = "bf16"
    causal: bool = True
    pass_: Pass = Field("fwd_bwd", alias="pass")
    device: Device = "auto"
    precision: Precision | None = Field(None, description="fp32 only: tf32 (one TF32 pass), tf32x3 (~fp32) or "
                                                          "ieee; unset: the implementation's default")
    against: Impl | None = Field(None, description="another implementation timed on the same inputs in turns "
                                                   "with impl (sample by sample), with impl's speed-up over it "
                                                   "and a 95 % interval; it runs at its default precision")
    sustain_ms: float | None = Field(None, gt=0, le=MAX_SUSTAIN_MS,
                                     description="time as do_bench does: each implementation alone, its calls back "
                                                 "to back for this many ms a round (1000 reaches a GPU's power "
                                                 "limit); unset: `repeats` calls, sample by sample")
    rounds: int | None = Field(None, gt=0, le=MAX_ROUNDS,
                               description=f"with sustain_ms: rounds, the first implementation rotating "
                                           f"(default {DEFAULT_ROUNDS})")
    warmup: Untimed = Field(3, description="untimed calls first (with sustain_ms: before each implementation's "
                                           "turn in every round)")
    repeats: Samples = Field(10, description="timed calls: the samples of one run (with sustain_ms, of the "
                                              "GPU-alone measurement only; the sweep's own repeats are runs of "
                                              "each cell)")

    @model_validator(mode="after")
    def _precision_is_for_fp32(self):
        if self.precision is not None and self.dtype != "fp32":
            raise ValueError(f"precision applies to dtype=fp32 only (dtype is {self.dtype!r})")
        return self

    @model_validator(mode="after")
    def _rounds_are_for_sustained(self):
        if self.rounds is not None and self.sustain_ms is None:
            raise ValueError("rounds applies with sustain_ms only (sample by sample, repeats sets the samples)")
        return self


def attention_fn(impl: str, precision: str | None):
    """The callable the suite times: `impl` with fp32 products done at `precision` (None: its default).

    Returns (fn, precision actually used or None). Raises SkipCell where the impl has no such mode.
    """
    import torch

    from kernels.impls import get_attention
    from worker.harness import SkipCell

    if precision is None:
        return get_attention(impl), None
    if impl == "flash_triton":
        from kernels.flash_triton import FlashAttentionTriton

        return (lambda q, k, v, causal: FlashAttentionTriton.apply(q, k, v, causal, precision)), precision
    if impl in TORCH_MATMUL_IMPLS:
        if precision == "tf32x3":
            raise SkipCell(f"{impl} multiplies through torch's matmul, which has no tf32x3 mode (tf32 or ieee)")
        base = get_attention(impl)

        def run(q, k, v, causal):
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            try:
                return base(q, k, v, causal)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before
        return run, precision
    raise SkipCell(f"{impl} uses its own fp32 arithmetic and takes no precision; leave precision unset "
                   "(its error against float64 is recorded in every cell)")


def output_error(fn, q, k, v, causal: bool, heads: int = ERROR_HEADS, rows: int = 1024) -> dict:
    """Forward error against float64 attention on batch element 0, the first `heads` heads.

    The reference is computed `rows` query rows at a time (a (heads, rows, seq) float64 block), so
    it fits beside the inputs at seq 16k and more.
    """
    import math

    import torch

    from kernels.attention import causal_mask

    with torch.no_grad():
        out = fn(q, k, v, causal)[0, :heads].double()
        q0, k0, v0 = (t[0, :heads].double() for t in (q, k, v))
        sq_err = sq_ref = max_abs = 0.0
        for start in range(0, q0.shape[-2], rows):
            scores = q0[:, start:start + rows] @ k0.transpose(-2, -1) / math.sqrt(q0.shape[-1])
            if causal:
                mask = causal_mask(q0.shape[-2], k0.shape[-2], q0.device)[start:start + rows]
                scores = scores.masked_fill(~mask, float("-inf"))
            ref = torch.softmax(scores, dim=-1) @ v0
            diff = out[:, start:start + rows] - ref
            sq_err += diff.square().sum().item()
            sq_ref += ref.square().sum().item()
            max_abs = max(max_abs, diff.abs().max().item())
    return {"out_rel_err": math.sqrt(sq_err / max(sq_ref, 1e-300)), "out_max_abs_err": max_abs}


def attention_step(fn, q, k, v, causal: bool, pass_: str):
    """(step, setup) timing one scope of `fn(q, k, v, causal)`; setup (None for fwd) clears the inputs'
    gradients before each call.

    fwd: a forward with no autograd graph. bwd: backward alone, graph built once and retained.
    fwd_bwd: forward then backward.
    """
    import torch

    def clear_grads():
        q.grad = k.grad = v.grad = None

    if pass_ == "fwd":
        def step():
            with torch.no_grad():
                fn(q, k, v, causal)
        return step, None
    if pass_ == "bwd":
        out = fn(q, k, v, causal)
        grad = torch.randn_like(out)

        def step():
            out.backward(grad, retain_graph=True)
        return step, clear_grads
    grad = torch.randn(q.shape, dtype=q.dtype, device=q.device)

    def step():
        fn(q, k, v, causal).backward(grad)
    return step, clear_grads


def time_attention(fn, q, k, v, causal: bool, pass_: str, *, warmup: int, repeats: int, device: str,
                   against=None, sustain_ms: float | None = None, rounds: int = DEFAULT_ROUNDS):
    """Time one scope of `fn(q, k, v, causal)` (attention_step). Returns (runs, Timing of the GPU alone
    or None off CUDA, peak_extra_bytes or None): `runs` holds per implementation (fn, then `against`
    if given) a list of Timings, one per round with `sustain_ms` (harness.measure_sustained), else one.

    `against`, another attention callable, is timed on the same inputs in turns with `fn`: sample by
    sample (harness.measure_turns), or with `sustain_ms` each alone for that long a round. Memory is
    measured on one extra, untimed run of `fn`'s scope.
    """
    import torch

    from worker.harness import measure, measure_sustained, measure_turns, peak_memory_bytes, reset_peak_memory

    step, setup = attention_step(fn, q, k, v, causal, pass_)
    steps = [step] + ([attention_step(against, q, k, v, causal, pass_)[0]] if against is not None else [])
    if sustain_ms is not None:
        # a cell keeps every sample: at most MAX_SAMPLES an implementation, so a short call's round may
        # end before sustain_ms (round_samples says how many it took)
        runs = measure_sustained(steps, sustain_ms=sustain_ms, rounds=rounds, warmup=warmup, device=device,
                                 setup=setup, max_calls=MAX_SAMPLES // rounds)
    else:
        runs = [[t] for t in measure_turns(steps, warmup=warmup, repeats=repeats, device=device, setup=setup)]
    alone = None
    if device.startswith("cuda"):
        alone = measure(step, warmup=1, repeats=repeats, device=device, setup=setup, head_start=True)

    peak_extra = None
    if device.startswith("cuda"):
        if setup is not None:
            setup()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        reset_peak_memory(device)
        step()
        peak_extra = peak_memory_bytes(device) - before
        if setup is not None:
            setup()
    return runs, alone, peak_extra


def run(p: Params, ctx) -> dict:
    import torch

    from kernels.flops import attention_flops
    from kernels.names import torch_dtype
    from worker.harness import HOST_BOUND, SkipCell, Timing, gpu_busy, require_runnable_attention, resolve_device

    device = resolve_device(p.device)
    dtype = torch_dtype(p.dtype)
    require_runnable_attention(p.impl, device)
    fn, precision = attention_fn(p.impl, p.precision)
    against = None
    if p.against is not None:
        require_runnable_attention(p.against, device)
        against, _ = attention_fn(p.against, None)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (p.batch, p.heads, p.seq_len, p.d_head)
    needs_grad = p.pass_ != "fwd"
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=gen).requires_grad_(needs_grad)
               for _ in range(3))
    sustained, rounds = p.sustain_ms is not None, p.rounds or DEFAULT_ROUNDS
    try:
        if sustained:
            ctx.progress(f"{rounds} rounds of {p.sustain_ms:g} ms per implementation")
        runs, alone, peak_extra = time_attention(fn, q, k, v, p.causal, p.pass_, warmup=p.warmup,
                                                 repeats=p.repeats, device=device, against=against,
                                                 sustain_ms=p.sustain_ms, rounds=rounds)
        error = output_error(fn, q, k, v, p.causal)
    except RuntimeError as exc:
        if "No available kernel" in str(exc) or "not supported" in str(exc).lower():
            which = f"{p.impl} or {p.against}" if p.against else p.impl  # in turns, either may have refused
            raise SkipCell(f"{which} cannot run this configuration: {str(exc).splitlines()[0]}") from exc
        raise
    timing = Timing.pooled(runs[0])
    flops = attention_flops(p.batch, p.heads, p.seq_len, p.seq_len, p.d_head, p.causal, p.pass_)
    busy = gpu_busy(timing, alone) if alone else None
    return {
        **timing.as_dict(),
        "tflops": flops / (timing.median_ms * 1e-3) / 1e12,
        "flops": flops,
        "gpu_ms": alone.median_ms if alone else None,
        "gpu_samples_ms": alone.samples_ms if alone else None,
        "gpu_busy": busy,
        "host_bound": busy is not None and busy < HOST_BOUND,
        "peak_mem_bytes": peak_extra,
        **error,
        "precision": precision if p.dtype == "fp32" else None,
        "device": device,
        **(round_metrics(runs[0]) if sustained else {}),
        **(against_metrics(runs[0], runs[1], sustained=sustained) if against is not None else {}),
    }


def round_metrics(rounds: list, prefix: str = "") -> dict:
    """Per round of a sustained cell: its median (`round_median_ms`), its number of samples
    (`round_samples`, so the pooled `samples_ms` split back into rounds) and its drift, the median of
    its last quarter of samples over its first (`round_drift`; above 1: the calls slowed as it ran)."""
    from worker.stats import drift

    return {f"{prefix}round_median_ms": [t.median_ms for t in rounds],
            f"{prefix}round_samples": [t.samples for t in rounds],
            f"{prefix}round_drift": [drift(t.samples_ms) for t in rounds]}


def against_metrics(runs: list, other_runs: list, sustained: bool = False) -> dict:
    """The `against` implementation's figures (`against_median_ms`, its samples, ...) and impl's speed-up
    over it, `speedup_vs_against` = median(against) / median(impl), above 1 when impl is faster, with a
    95 % bootstrap interval (`_low`, `_high`). From samples taken in turns (one run each) the interval is
    worker.stats.ratio_interval's. From `sustained` rounds (one Timing each) it resamples rounds, then
    samples within them (grouped_ratio_interval), and each round's own ratio is kept
    (`speedup_vs_against_rounds`)."""
    from worker.harness import Timing
    from worker.stats import grouped_ratio_interval, ratio_interval

    timing, other = Timing.pooled(runs), Timing.pooled(other_runs)
    out = other.as_dict("against_")
    if not sustained:
        speedup, low, high = ratio_interval(timing.samples_ms, other.samples_ms)
    else:
        speedup, low, high = grouped_ratio_interval([t.samples_ms for t in runs], [t.samples_ms for t in other_runs])
        out |= round_metrics(other_runs, "against_")
        out["speedup_vs_against_rounds"] = [o.median_ms / t.median_ms for t, o in zip(runs, other_runs, strict=True)]
    return {**out, "speedup_vs_against": speedup, "speedup_vs_against_low": low, "speedup_vs_against_high": high}
