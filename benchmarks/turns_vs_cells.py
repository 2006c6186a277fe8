"""Cell after cell or in turns: how often two attention measurements of the same thing disagree, and
how well each method tells two different implementations apart.

    python -m benchmarks.turns_vs_cells --out turns.json                         (CPU: naive against sdpa)
    python -m benchmarks.turns_vs_cells --device cuda --impl flash_triton --other sdpa_flash \\
        --shape 1,16,1024,64 --out turns.json                                     (a host-bound GPU cell)

Each pair is measured two ways, with the attention suite's own code (worker/suites/attention.py):
  cells:  the cell for A, then the cell for B, as a sweep runs two cells one after the other; the
          ratio of their medians with a bootstrap interval (worker.stats.ratio_interval);
  turns:  one cell for A with `against` = B, whose samples alternate (worker.harness.measure_turns);
          its `speedup_vs_against` and interval.
A/A pairs (B = A) can only differ by drift: a verdict other than `same` or `inconclusive` at the
threshold (backend.compare.verdict, as `benchlab compare` judges) is a false alarm. A/B pairs (B =
`--other`) show each method's estimate and interval width. Every sample is kept in the output.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _cell(impl: str, against: str | None, device: str, shape: tuple[int, int, int, int], dtype: str,
          repeats: int) -> dict:
    from worker.suites.attention import Params, run

    b, h, s, d = shape
    return run(Params(impl=impl, against=against, batch=b, heads=h, seq_len=s, d_head=d, dtype=dtype, causal=True,
                      device=device, warmup=3, repeats=repeats), None)


def measure_pair(a: str, b: str, device: str, shape, dtype: str, repeats: int, threshold: float) -> dict:
    """One pair both ways: (cells) A's cell then B's, (turns) one cell of A against B. Ratios are
    B's time over A's, so above 1 means A is faster."""
    from backend.compare import verdict
    from worker.stats import ratio_interval

    first, second = _cell(a, None, device, shape, dtype, repeats), _cell(b, None, device, shape, dtype, repeats)
    ratio, lo, hi = ratio_interval(first["samples_ms"], second["samples_ms"])
    turns = _cell(a, b, device, shape, dtype, repeats)
    t_ratio, t_lo, t_hi = turns["speedup_vs_against"], turns["speedup_vs_against_low"], turns["speedup_vs_against_high"]
    return {
        "cells": {"ratio": ratio, "low": lo, "high": hi, "verdict": verdict(lo, hi, threshold),
                  "a_samples_ms": first["samples_ms"], "b_samples_ms": second["samples_ms"]},
        "turns": {"ratio": t_ratio, "low": t_lo, "high": t_hi, "verdict": verdict(t_lo, t_hi, threshold),
                  "a_samples_ms": turns["samples_ms"], "b_samples_ms": turns["against_samples_ms"]},
    }


def summarize(pairs: list[dict]) -> dict:
    """Per method: verdict counts, the median interval width (high - low), and the ratios' spread."""
    out = {}
    for method in ("cells", "turns"):
        rows = [p[method] for p in pairs]
        counts = {v: sum(r["verdict"] == v for r in rows) for v in ("slower", "faster", "same", "inconclusive")}
        out[method] = {"verdicts": counts,
                       "median_interval_width": statistics.median(r["high"] - r["low"] for r in rows),
                       "ratio_min": min(r["ratio"] for r in rows), "ratio_max": max(r["ratio"] for r in rows),
                       "ratio_median": statistics.median(r["ratio"] for r in rows)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--impl", default="naive", help="A")
    ap.add_argument("--other", default="sdpa", help="B of the A/B pairs")
    ap.add_argument("--shape", default="1,4,128,32", help="batch,heads,seq,d (causal)")
    ap.add_argument("--dtype", default=None, help="default: fp32 on CPU, bf16 on CUDA")
    ap.add_argument("--pairs", type=int, default=10, help="A/A pairs and as many A/B pairs")
    ap.add_argument("--repeats", type=int, default=30, help="samples per cell")
    ap.add_argument("--threshold", type=float, default=0.05, help="as benchlab compare's --threshold")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split(","))
    if len(shape) != 4 or min(shape) < 1 or args.pairs < 1 or args.repeats < 2:
        ap.error("--shape takes four positive integers; --pairs >= 1; --repeats >= 2")
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")

    from worker.harness import fingerprint

    result = {"kind": "turns_vs_cells", **fingerprint(args.commit), "device": args.device, "impl": args.impl,
              "other": args.other, "shape": list(shape), "dtype": dtype, "repeats": args.repeats,
              "threshold": args.threshold, "aa": [], "ab": []}
    for i in range(args.pairs):  # A/A and A/B alternate, so both meet the same stretch of the run
        result["aa"].append(measure_pair(args.impl, args.impl, args.device, shape, dtype, args.repeats, args.threshold))
        result["ab"].append(measure_pair(args.impl, args.other, args.device, shape, dtype, args.repeats,
                                         args.threshold))
        print(f"pair {i + 1}/{args.pairs}: A/A cells {result['aa'][-1]['cells']['verdict']}, "
              f"turns {result['aa'][-1]['turns']['verdict']}", flush=True)
    result["summary"] = {"aa": summarize(result["aa"]), "ab": summarize(result["ab"])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
