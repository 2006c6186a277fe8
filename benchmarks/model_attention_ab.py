"""The model suite's training step with two attention implementations, interleaved in one process.

One model, one optimizer, one compiled wrapper: TransformerLM.set_attention switches the blocks between
rounds in the order A B B A A B ..., so both implementations run on the same weights, clocks and
allocator. Under --compile each implementation gets its own compiled graph (dynamo guards on the
attention function) and both stay cached. Each round times `--steps` steps with CUDA events after one
untimed step (worker.harness.measure); the report keeps every sample, the medians, and the ratio
B / A with a bootstrap interval over the samples.

    python -m benchmarks.model_attention_ab --size xl --precision bf16 --compile \
        --impls flash_triton,sdpa --out model_ab.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


class _Stderr:
    """The suite's progress context, printing to stderr."""

    def progress(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size", default="xl")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--impls", default="flash_triton,sdpa", help="two attention implementations, A,B")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default: the model suite's)")
    ap.add_argument("--context-length", type=int, default=None, help="tokens per sequence (default: the suite's)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a quick check of the script")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    impls = args.impls.split(",")
    if len(impls) != 2:
        ap.error(f"--impls takes two names, got {args.impls!r}")

    import torch

    from worker.harness import fingerprint, measure
    from worker.suites.model import Params, build

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA GPU")
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8)
    shape = {k: v for k, v in (("batch", args.batch), ("context_length", args.context_length)) if v is not None}
    p = Params(size=args.size, precision=args.precision, compile=args.compile, attention=impls[0], scope="step",
               device=args.device, **shape)
    ctx = _Stderr()
    cell = build(p, args.device, ctx)  # a cold xl model under --compile: minutes before the first round
    for name in impls:  # compile, autotune and plan each before anything is timed
        cell.model.set_attention(name)
        for i in range(3):
            ctx.progress(f"warming {name}: step {i + 1} of 3" + (" (compiles first)" if args.compile else ""))
            cell.step()
    samples: dict[str, list[float]] = {name: [] for name in impls}
    env = fingerprint(args.commit)
    for r in range(args.rounds):
        order = impls if r % 2 == 0 else impls[::-1]
        for name in order:
            cell.model.set_attention(name)
            samples[name] += measure(cell.step, warmup=1, repeats=args.steps, device=args.device).samples_ms
        print(json.dumps({"round": r, **{n: samples[n][-args.steps:] for n in impls}}), file=sys.stderr, flush=True)
        # written after every round, so a run stopped by a time limit keeps the rounds it finished
        report = make_report(env, p.model_dump(), impls, samples, rounds_done=r + 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(args.out)
    print(json.dumps({"median_ms": report["median_ms"], "ratio_b_over_a": report["ratio_b_over_a"]}),
          file=sys.stderr, flush=True)
    return 0


def make_report(env: dict, params: dict, impls: list[str], samples: dict[str, list[float]], rounds_done: int) -> dict:
    """The report as it stands after `rounds_done` rounds: every sample, the medians and B / A's interval."""
    from worker.stats import ratio_interval

    ratio, lo, hi = ratio_interval(samples[impls[0]], samples[impls[1]])
    return {"kind": "model_attention_ab", **env, "params": params, "impls": impls, "rounds_done": rounds_done,
            "samples_ms": samples, "median_ms": {n: statistics.median(xs) for n, xs in samples.items()},
            "ratio_b_over_a": {"median": ratio, "low": lo, "high": hi, "level": 0.95}}


if __name__ == "__main__":
    raise SystemExit(main())
