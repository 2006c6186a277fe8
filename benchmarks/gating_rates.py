"""How often the comparison engine (backend/compare.py) raises a false alarm, and how often it
catches a real slowdown, on real GPU timings.

    python -m benchmarks.gating_rates --out gating.json          (on a GPU host)
    python -m benchmarks.gating_rates --from gating.json --runs 3 --out by_runs.json   (anywhere)

For one attention cell (forward+backward, timed with CUDA events as the suite does), it collects
blocks of `--n` samples of:
  A:  the cell as it is;
  A': the same cell again (an A/A pair: any verdict but `same` or `inconclusive` is a false alarm);
  B:  the cell with a GPU spin of about `--slowdown` of its median added inside the timed region
      (torch.cuda._sleep, calibrated once), i.e. a build made that much slower on purpose.
The three are interleaved block by block in one process (the GPU clocks down under load). Then it
judges `--pairs` A/A' and A/B pairs at the 5 % threshold, and, for a 3 % slowdown (at a 1 %
threshold, since 3 % cannot clear 5 %), how often it is judged slower with 10 to `--n` samples.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def spin_cycles_for(ms: float) -> int:
    """Cycles of torch.cuda._sleep that take about `ms` on this GPU (calibrated with CUDA events)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 1_000_000
    torch.cuda._sleep(cycles)  # warm
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return max(1, int(cycles * ms / start.elapsed_time(end)))


def collect(n: int, blocks: int, slowdowns: list[float], shape: tuple[int, int, int, int]) -> dict:
    import torch

    from kernels.impls import get_attention
    from worker.harness import measure

    attn = get_attention("flash_triton")
    b, h, s, d = shape
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def step():
        attn(q, k, v, True).sum().backward()

    base = measure(step, warmup=10, repeats=50, device="cuda").median_ms
    cycles = {x: spin_cycles_for(base * x) for x in slowdowns}

    def slowed(x):
        def fn():
            step()
            torch.cuda._sleep(cycles[x])
        return fn

    out = {"base_median_ms": base, "A": [], "A2": [], **{f"B{x}": [] for x in slowdowns}}
    for _ in range(blocks):  # interleaved: every block takes each variant once
        out["A"].append(measure(step, warmup=2, repeats=n, device="cuda").samples_ms)
        out["A2"].append(measure(step, warmup=2, repeats=n, device="cuda").samples_ms)
        for x in slowdowns:
            out[f"B{x}"].append(measure(slowed(x), warmup=2, repeats=n, device="cuda").samples_ms)
    return out


def rates(blocks_a: list[list[float]], blocks_b: list[list[float]], n: int, threshold: float = 0.05) -> dict:
    from backend.compare import verdict
    from worker.stats import ratio_interval

    verdicts = []
    for i, (a, b) in enumerate(zip(blocks_a, blocks_b, strict=True)):
        _, lo, hi = ratio_interval(a[:n], b[:n], resamples=2000, seed=i)
        verdicts.append(verdict(lo, hi, threshold))
    return {v: verdicts.count(v) / len(verdicts) for v in ("slower", "faster", "same", "inconclusive")}


def rates_by_runs(blocks_a: list[list[float]], blocks_b: list[list[float]], runs: int, n: int,
                  threshold: float = 0.05) -> dict:
    """As `rates`, with each side `runs` blocks (runs, as repeats of a cell are) judged by the engine's
    run-resampling interval; the blocks are split into disjoint groups of `runs`."""
    from backend.compare import verdict
    from worker.stats import grouped_ratio_interval

    verdicts = []
    for i in range(len(blocks_a) // runs):
        a = [blk[:n] for blk in blocks_a[i * runs:(i + 1) * runs]]
        b = [blk[:n] for blk in blocks_b[i * runs:(i + 1) * runs]]
        _, lo, hi = grouped_ratio_interval(a, b, resamples=2000, seed=i)
        verdicts.append(verdict(lo, hi, threshold))
    return {"pairs": len(verdicts), **{v: verdicts.count(v) for v in ("slower", "faster", "same", "inconclusive")}}


def regroup(path: Path, runs: int, out: Path) -> int:
    """Judge a recorded file's blocks again, `runs` blocks a side, by runs (no GPU needed)."""
    data = json.loads(path.read_text())
    samples, slow = data["samples"], next(k for k in data if k.startswith("a_b_") and "threshold" not in k)
    x = slow.removeprefix("a_b_")
    result = {"source": str(path), "env": data["env"], "shape": data["shape"], "runs": runs,
              "a_a": {n: rates_by_runs(samples["A"], samples["A2"], runs, n) for n in (10, 30, 100)},
              f"a_b_{x}": {n: rates_by_runs(samples["A"], samples[f"B{x}"], runs, n) for n in (10, 30, 100)},
              "a_b_0.03_threshold_0.01": {n: rates_by_runs(samples["A"], samples["B0.03"], runs, n, 0.01)
                                          for n in (10, 30, 100)}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "env"}, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=100, help="samples per block (the judged prefixes are shorter)")
    ap.add_argument("--pairs", type=int, default=20, help="blocks of each variant")
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--shape", default="4,16,2048,64")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--from", dest="source", type=Path, default=None,
                    help="judge a recorded file again, by runs (see --runs), instead of measuring")
    ap.add_argument("--runs", type=int, default=3, help="with --from: blocks per side")
    args = ap.parse_args()
    if args.source is not None:
        return regroup(args.source, args.runs, args.out)

    from worker.harness import fingerprint

    shape = tuple(int(x) for x in args.shape.split(","))
    data = collect(args.n, args.pairs, [args.slowdown, 0.03], shape)
    result = {"env": fingerprint(args.commit), "shape": shape, "n": args.n, "pairs": args.pairs,
              "base_median_ms": data["base_median_ms"],
              "a_a": {n: rates(data["A"], data["A2"], n) for n in (10, 20, 30, 50, args.n)},
              f"a_b_{args.slowdown}": {n: rates(data["A"], data[f"B{args.slowdown}"], n)
                                       for n in (10, 20, 30, 50, args.n)},
              # a 3 % difference cannot clear a 5 % threshold: judged at 1 %
              "a_b_0.03_threshold_0.01": {n: rates(data["A"], data["B0.03"], n, threshold=0.01)
                                          for n in (10, 20, 30, 50, args.n)},
              "a_a_threshold_0.01": {n: rates(data["A"], data["A2"], n, threshold=0.01)
                                     for n in (10, 20, 30, 50, args.n)},
              "samples": data}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "env")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
