"""The attention grid timed as an outside harness times it: do_bench of forward+backward, under sustained load.

The attention suite takes each sample after an L2 flush and a pause (worker.harness.measure_turns), so
it times a cool chip. `triton.testing.do_bench`, which the CS336 leaderboard test and issue 15's checks
use, runs the step back to back for `rep` ms (flushing the L2 before each call). A long enough run
reaches the card's power limit, and there the implementation that spends less energy per step keeps a
higher clock (docs/results/h200/flash_tuning.md, steps 10 and 34). On the leaderboard shape the two
methods rank benchlab's kernel and cuDNN's the other way round (docs/results/h100/in_turns/README.md);
docs/results/h100/sustained/README.md has this script's runs.

This script times flash_triton, SDPA flash and SDPA cuDNN that way on the forward+backward shapes of a
sweep spec (default: the 16k-token grid and the leaderboard shape), `o = attn(q, k, v, causal);
o.backward(dO)` with fresh gradients each call. Each round runs do_bench once per implementation, in
turns, the first one rotating from round to round; nvidia-smi samples the SM clock and board power
meanwhile (every 20 ms: clock, power, instant power, and which clock-event reasons, such as the
software power cap, were active). `drift` says how much each do_bench's calls slowed while it ran
(last quarter over first). A round is the unit of the statistics: its median per implementation, and
the speed-up of flash_triton over each SDPA backend within the round (above 1: flash_triton is
faster). The samples of one do_bench follow the chip's drift, so they are kept but not pooled into an
interval.

    python -m benchmarks.flash_sustained --out sustained.json [--spec SPEC] [--min-seq 2048]
        [--rep-ms 100] [--rounds 3] [--summary sustained.md]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

from benchmarks.flash_ab import require_gpu, write_report

DEFAULT_SPEC = Path(__file__).parent / "specs" / "attention_vs_sdpa_turns.yaml"
IMPLS = ("flash_triton", "sdpa_flash", "sdpa_cudnn")
REFERENCES = ("sdpa_flash", "sdpa_cudnn")
Shape = tuple[int, int, int, int, bool]  # batch, heads, seq, d, causal


def spec_shapes(path: Path, min_seq: int = 0, head_dim: int | None = None) -> list[Shape]:
    """The distinct (batch, heads, seq, d, causal) of a spec's bf16 forward+backward cells, in the spec's
    order, from seq `min_seq` up (and of head dim `head_dim` only, if given). A spec of another suite or
    with no such cell is an error naming it."""
    import yaml

    from backend.grid import expand_grid

    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not readable YAML: {exc}") from None
    if not isinstance(spec, dict) or spec.get("suite") != "attention":
        raise ValueError(f"{path} is not an attention sweep spec (suite: attention)")
    cells = expand_grid("attention", spec.get("params", {}), max_cells=100_000)
    shapes: list[Shape] = []
    for c in cells:
        shape = (c["batch"], c["heads"], c["seq_len"], c["d_head"], bool(c["causal"]))
        if (c["dtype"] == "bf16" and c["pass"] == "fwd_bwd" and c["seq_len"] >= min_seq
                and head_dim in (None, c["d_head"]) and shape not in shapes):
            shapes.append(shape)
    if not shapes:
        of_d = f" and d_head {head_dim}" if head_dim is not None else ""
        raise ValueError(f"{path} has no bf16 fwd_bwd cell with seq_len >= {min_seq}{of_d}")
    return shapes


def turns(steps: dict[str, Callable[[], None]], rounds: int, bench: Callable[[Callable[[], None]], list[float]],
          sampler: Callable[[], object] | None = None) -> dict:
    """Time each step with `bench` (a list of ms samples) once a round, in rotating turns.

    `sampler()`, if given, starts sampling the chip (an object whose stop() returns (clocks, power)
    lists, and whose `rows` chip_summary sums up) around each bench. Returns per implementation the
    samples of each round, each round's median and mean, the median SM clock and power of each round
    (None where nothing was sampled), and each round's chip_summary."""
    from benchmarks.flash_timeline import chip_summary
    from worker.harness import turn_order
    from worker.stats import drift

    names = list(steps)
    out = {"order": [], "samples": {n: [] for n in names}, "median_ms": {n: [] for n in names},
           "mean_ms": {n: [] for n in names}, "sm_clock_mhz": {n: [] for n in names},
           "power_w": {n: [] for n in names}, "chip": {n: [] for n in names},
           "drift": {n: [] for n in names}}
    for r in range(rounds):
        order = turn_order(names, r)
        out["order"].append(order)
        for name in order:
            probe = sampler() if sampler else None
            ms = [float(x) for x in bench(steps[name])]
            clocks, power = probe.stop() if probe else ([], [])
            out["samples"][name].append(ms)
            out["median_ms"][name].append(statistics.median(ms))
            out["mean_ms"][name].append(statistics.fmean(ms))
            out["sm_clock_mhz"][name].append(statistics.median(clocks) if clocks else None)
            out["power_w"][name].append(statistics.median(power) if power else None)
            out["chip"][name].append(chip_summary(getattr(probe, "rows", [])))
            out["drift"][name].append(drift(ms))
    return out


def speedups(timed: dict, subject: str, references: tuple[str, ...]) -> dict:
    """`subject`'s speed-up over each reference, round by round (the reference's median ms over the
    subject's in the same round), with the median over rounds and the rounds' range."""
    out = {}
    for ref in references:
        if ref not in timed["median_ms"]:
            continue
        per_round = [r / s for s, r in zip(timed["median_ms"][subject], timed["median_ms"][ref], strict=True)]
        out[ref] = {"rounds": per_round, "median": statistics.median(per_round),
                    "low": min(per_round), "high": max(per_round)}
    return out


def shape_steps(shape: Shape, impls: tuple[str, ...] = IMPLS) -> tuple[dict[str, Callable[[], None]], list]:
    """({implementation: step()}, the tensors whose gradients do_bench clears) for one shape on the GPU:
    bf16 q, k, v leaves and a fixed dO, the step `o = attn(q, k, v, causal); o.backward(dO)`."""
    import torch

    from kernels.impls import get_attention

    b, h, n, d, causal = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn((b, h, n, d), device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]

    def step_of(fn):
        def step():
            fn(q, k, v, causal).backward(do)
        return step
    return {name: step_of(get_attention(name)) for name in impls}, leaves


def do_bench_turns(steps: dict[str, Callable[[], None]], rounds: int, rep_ms: int, warmup_ms: int,
                   grad_to_none: list | None = None, period_ms: int = 50) -> dict:
    """turns() with triton's do_bench as the bench (every sample kept) and nvidia-smi sampling the chip,
    its extra fields included, every `period_ms`."""
    import torch
    import triton

    from benchmarks.flash_timeline import SmiSampler

    def bench(step):
        return triton.testing.do_bench(step, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none,
                                       return_mode="all")

    device = torch.cuda.current_device()
    return turns(steps, rounds, bench, sampler=lambda: SmiSampler(device, period_ms, extra=True))


def measure_shape(shape: Shape, rounds: int, rep_ms: int, warmup_ms: int) -> dict:
    """One shape's rounds of do_bench in turns, with the speed-ups; compile, autotune and plan first."""
    import torch

    steps, leaves = shape_steps(shape)
    for step in steps.values():
        step()
    torch.cuda.synchronize()
    timed = do_bench_turns(steps, rounds, rep_ms, warmup_ms, grad_to_none=leaves, period_ms=20)
    b, h, n, d, causal = shape
    return {"batch": b, "heads": h, "seq_len": n, "d_head": d, "causal": causal, **timed,
            "speedup": speedups(timed, "flash_triton", REFERENCES)}


def _median_text(xs: list, fmt: str, scale: float = 1.0, missing: str = "?") -> str:
    """The median of the values that are not None, scaled and formatted, or `missing` when there are none."""
    xs = [x for x in xs if x is not None]
    return format(scale * statistics.median(xs), fmt) if xs else missing


def _flash_and_cudnn(per_impl: dict[str, list], fmt: str, scale: float = 1.0, unit: str = "") -> str:
    """"flash_triton's / cuDNN's": the median of each one's values in `per_impl` ("?" where it has none)."""
    texts = (_median_text(per_impl.get(n, []), fmt, scale) for n in ("flash_triton", "sdpa_cudnn"))
    return " / ".join(t if t == "?" else t + unit for t in texts)


def summary_md(report: dict) -> str:
    """A markdown table of a report: per shape each implementation's median ms (the median of its rounds'
    medians) and flash_triton's speed-up over each reference (median over rounds, the rounds' range)."""
    lines = [f"do_bench (rep {report['rep_ms']} ms, warmup {report['warmup_ms']} ms), {report['rounds']} rounds "
             f"in turns; {report.get('gpu_name')}, torch {report.get('torch')}, Triton {report.get('triton')}, "
             f"commit {report.get('git_commit')}.", "",
             "| shape (b, h, s, d) | causal | flash_triton ms | SDPA flash ms | cuDNN ms | vs SDPA flash | vs cuDNN "
             "| SM MHz (flash / cuDNN) | drift (flash / cuDNN) | power-capped (flash / cuDNN) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in report["shapes"]:
        ratio = {ref: f"{r['median']:.3f}x ({r['low']:.3f}-{r['high']:.3f})" for ref, r in c["speedup"].items()}
        ms = {n: _median_text(c["median_ms"].get(n, []), ".3f", missing="") for n in IMPLS}
        cap_shares = {n: [r.get("sw_power_cap_share") for r in rs] for n, rs in c.get("chip", {}).items()}
        clock = _flash_and_cudnn(c["sm_clock_mhz"], ".0f")
        slowed = _flash_and_cudnn(c.get("drift", {}), ".3f")
        capped = _flash_and_cudnn(cap_shares, ".0f", scale=100.0, unit=" %")
        shape = f"({c['batch']}, {c['heads']}, {c['seq_len']}, {c['d_head']})"
        lines.append(f"| {shape} | {'yes' if c['causal'] else 'no'} | {ms['flash_triton']} | {ms['sdpa_flash']} "
                     f"| {ms['sdpa_cudnn']} | {ratio.get('sdpa_flash', '')} | {ratio.get('sdpa_cudnn', '')} "
                     f"| {clock} | {slowed} | {capped} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="an attention sweep spec: its bf16 fwd_bwd shapes")
    ap.add_argument("--min-seq", type=int, default=2048, help="only shapes of at least this sequence length")
    ap.add_argument("--head-dim", type=int, default=None, help="only shapes of this head dim")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=int, default=100, help="do_bench's rep (its default: 100)")
    ap.add_argument("--warmup-ms", type=int, default=25, help="do_bench's warmup (its default: 25)")
    ap.add_argument("--summary", type=Path, default=None, help="also write a markdown table here")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.rep_ms < 1 or args.warmup_ms < 0:
        ap.error("--rounds and --rep-ms must be at least 1, --warmup-ms at least 0")
    try:
        shapes = spec_shapes(args.spec, args.min_seq, args.head_dim)
    except (OSError, ValueError) as exc:
        ap.error(str(exc))

    require_gpu(ap)
    from worker.harness import fingerprint

    report = {"kind": "flash_sustained", **fingerprint(args.commit), "spec": str(args.spec), "rounds": args.rounds,
              "rep_ms": args.rep_ms, "warmup_ms": args.warmup_ms, "shapes": []}
    for shape in shapes:
        cell = measure_shape(shape, args.rounds, args.rep_ms, args.warmup_ms)
        report["shapes"].append(cell)
        brief = {ref: round(r["median"], 3) for ref, r in cell["speedup"].items()}
        print(json.dumps({"shape": shape, "median_ms": {n: round(statistics.median(x), 3)
                                                        for n, x in cell["median_ms"].items()},
                          "speedup": brief}), file=sys.stderr, flush=True)
        write_report(report, args.out)  # after every shape: a run stopped by its time limit keeps what it finished
        if args.summary:
            args.summary.write_text(summary_md(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
