"""The Gluon forward (kernels/flash_gluon.py) beside the Triton forward and SDPA's backends, in turns.

Per shape: every Gluon config, the Triton forward (autotuned, its default options) and the SDPA
backends are timed in rounds, one after another in one process (CUDA events, warm-up excluded), so
clock drift falls on all of them. Accuracy: each forward's O and L on the first and the last
(z, h) pair against a float64 reference (the largest error of any row, which a wrong ragged row
cannot hide in), and the largest difference from the Triton forward over the whole tensor. A config
that fails to compile or run is recorded with its error and the run goes on. `--sustain-ms MS` times
each alone for MS a round instead (flash_ab's sustained mode: the clock each keeps under load); the
speed-ups are then of the rounds' medians, not of the best round.

    python -m benchmarks.flash_gluon_ab --config 128,128,2,8 --config 128,64,3,8 \
        --shape 4,16,4096,128,causal --sdpa cudnn --out gluon_ab.json
    python -m benchmarks.flash_gluon_ab --config 64,64,3,4 --config 64,64,3,4,overlap-rs --sustain-ms 500 \
        --rounds 5 --shape 4,16,4096,128 --sdpa cudnn --out gluon_rs.json

`--baseline FILE` (another version of kernels/flash_gluon.py) times that version's forward at every
config too, in the same rotation (base_<config>), and gives each config's speed-up over it:

    git show cc8ed00:kernels/flash_gluon.py > /tmp/gluon_base.py
    python -m benchmarks.flash_gluon_ab --baseline /tmp/gluon_base.py --config 192,128,4,4,ws \
        --shape 4,32,4096,64,causal --sustain-ms 300 --out own_diagonal.json
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from benchmarks.flash_ab import (
    _sdpa_call,
    load_baseline,
    parse_sdpa,
    parse_shape,
    record_cell,
    require_gpu,
    round_stat,
    time_calls,
    write_report,
)
from kernels.names import GLUON_MODES

SHAPES = [((4, 16, 4096, 128), True), ((4, 16, 4096, 128), False), ((2, 16, 8192, 128), True),
          ((16, 16384, 64), True), ((4, 16, 4096, 64), False)]
CONFIGS = [(64, 64, 3, 4, "overlap"), (128, 128, 2, 4, "ws")]


def parse_config(text: str) -> tuple[int, int, int, int, str]:
    """"128,128,2,8" -> (block_m, block_n, stages, num_warps, mode); a trailing ",plain", ",ws", ",pingpong",
    or any of those or ",overlap-rs" with Q in registers, picks the mode (GLUON_MODES; by default "overlap")."""
    parts = [x.strip() for x in text.split(",")]
    named = parts[-1] in GLUON_MODES
    mode = parts[-1] if named else GLUON_MODES[0]
    sizes = parts[:-1] if named else parts
    if len(sizes) != 4 or not all(x.isdigit() and int(x) > 0 for x in sizes):
        raise argparse.ArgumentTypeError(
            f"config {text!r}: want BLOCK_M,BLOCK_N,STAGES,WARPS (positive integers), then optionally a mode: "
            f"one of {', '.join(GLUON_MODES[1:])}")
    return (*(int(x) for x in sizes), mode)  # type: ignore[return-value]


def config_name(cfg: tuple[int, int, int, int, str]) -> str:
    return "gluon_" + "x".join(map(str, cfg[:4])) + ("" if cfg[4] == "overlap" else f"_{cfg[4]}")


BASE_PREFIX = "base_"  # a config's name with the --baseline version's forward


def speedups_vs_baseline(best: dict[str, float]) -> dict[str, float]:
    """Each config's speed-up over the same config of the --baseline version (> 1: this tree's is faster),
    for the configs both versions ran."""
    return {name: best[BASE_PREFIX + name] / t for name, t in best.items()
            if not name.startswith(BASE_PREFIX) and BASE_PREFIX + name in best}


def forward_call(forward, q, k, v, causal: bool, **knobs):
    """The timed call: one forward on (q, k, v)."""
    return lambda: forward(q, k, v, causal, **knobs)


def reference(q, k, v, causal: bool, zh: int):
    """float64 O and natural-log L of (z, h) pair `zh` of (Z*H, n, d) views."""
    import torch

    qs, ks, vs = (t[zh].double() for t in (q, k, v))
    s = qs @ ks.T / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ vs, lse


def as_pairs(t):
    """(..., n, d) as (Z*H, n, d)."""
    return t.reshape(-1, t.shape[-2], t.shape[-1])


def row_errors(o, lse, ref_o, ref_lse) -> dict:
    """The largest error of any row of O (max over d) and of L, against the reference."""
    err_o = (o.double() - ref_o).abs().amax(dim=-1)
    return {"o_row_max": err_o.max().item(), "o_row_median": err_o.median().item(),
            "lse_max": (lse.double() - ref_lse).abs().max().item()}


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """The arguments the Gluon A/B scripts share: shapes, SDPA backends, rounds, samples, output, commit."""
    ap.add_argument("--shape", action="append", type=parse_shape, default=None, metavar="B,H,S,D[,causal]",
                    help="a shape (repeatable; 3 numbers: no head axis)")
    ap.add_argument("--sdpa", type=parse_sdpa, default=[], metavar="cudnn,flash")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--sustain-ms", type=float, default=None, metavar="MS",
                    help="time each call alone for MS a round (flash_ab's sustained mode) instead of in turns")
    ap.add_argument("--head-start", action="store_true",
                    help="queue a sleep kernel before each sample, so a call's launch cost on the host stays off "
                         "its GPU time (worker.harness.measure's head_start)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=None)


def time_cell(cell: dict, calls: dict, args: argparse.Namespace) -> dict[str, float]:
    """Time `calls` as add_run_args' arguments say, into cell["ms"] (each call's round medians; and its
    host time in turns, cell["host_ms"]). Returns each call's figure: the median round when sustained
    (--sustain-ms, each call alone), else the best round (in turns)."""
    from worker.harness import measure_rounds

    sustained = args.sustain_ms is not None
    if sustained:
        cell["ms"] = ms = time_calls(calls, rounds=args.rounds, repeats=args.repeats, sustain_ms=args.sustain_ms)
    else:
        cell["host_ms"] = {}
        cell["ms"] = ms = measure_rounds(calls, rounds=args.rounds, repeats=args.repeats, device="cuda",
                                         head_start=args.head_start, host=cell["host_ms"])
    return {name: round_stat(xs, sustained) for name, xs in ms.items()}


def check_run_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse timing arguments that cannot go together (ap.error), before anything runs."""
    if args.sustain_ms is not None and not args.sustain_ms > 0:
        ap.error("--sustain-ms must be > 0")
    if args.sustain_ms is not None and args.head_start:
        ap.error("--head-start times calls in turns; it does not apply with --sustain-ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", type=parse_config, default=None,
                    metavar="BM,BN,STAGES,WARPS[,MODE]",
                    help=f"a Gluon config (repeatable; default {' '.join(map(config_name, CONFIGS))})")
    ap.add_argument("--head-group", type=int, default=None, help="Gluon grid order (default: as Triton's)")
    ap.add_argument("--null", action="store_true",
                    help="time a second copy of the Triton forward too (triton_copy): the spread of a version "
                         "against itself, beside every speed-up")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another kernels/flash_gluon.py: its forward at every config too (base_<config>)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    check_run_args(ap, args)
    import torch

    from kernels import flash_gluon, flash_triton
    from worker.harness import fingerprint

    versions = {"": flash_gluon}
    baseline = load_baseline(ap, args.baseline, "flash_gluon_baseline", ("flash_attention_forward", "launch_spec"),
                             "flash_gluon")
    if baseline is not None:
        versions[BASE_PREFIX] = baseline
    require_gpu(ap)

    out = Path(args.out)
    sustained = args.sustain_ms is not None
    configs = args.config or CONFIGS
    report = {"kind": "flash_gluon_ab", **fingerprint(args.commit), "configs": [list(c) for c in configs],
              "baseline": str(args.baseline) if args.baseline else None, "sdpa": args.sdpa, "rounds": args.rounds,
              "repeats": args.repeats, "head_start": args.head_start,
              "sustain_ms": args.sustain_ms, "speedup_of": "median of rounds" if sustained else "best round",
              "cells": []}
    for shape, causal in args.shape or SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        cell: dict = {"shape": list(shape), "causal": causal, "errors": {}, "failed": {}}
        calls = {"triton": forward_call(flash_triton.flash_attention_forward, q, k, v, causal)}
        if args.null:
            calls["triton_copy"] = forward_call(flash_triton.flash_attention_forward, q, k, v, causal)
        for cfg in configs:
            bm, bn, stages, warps, mode = cfg
            for prefix, module in versions.items():
                name = prefix + config_name(cfg)
                call = forward_call(module.flash_attention_forward, q, k, v, causal, block_m=bm, block_n=bn,
                                    stages=stages, num_warps=warps, head_group=args.head_group, mode=mode)
                try:
                    call()
                    torch.cuda.synchronize()
                    calls[name] = call
                except Exception as exc:  # noqa: BLE001 - a failed config is a result: record it, time the rest
                    cell["failed"][name] = f"{type(exc).__name__}: {exc}"[:2000]
        q3, k3, v3 = (as_pairs(t) for t in (q, k, v))
        refs = {zh: reference(q3, k3, v3, causal, zh) for zh in (0, q3.shape[0] - 1)}
        outs = {name: call() for name, call in calls.items()}
        o_tri, l_tri = outs["triton"]
        for name, (o, lse) in outs.items():
            o3, l3 = as_pairs(o), lse.reshape(-1, lse.shape[-1])
            cell["errors"][name] = {str(zh): row_errors(o3[zh], l3[zh], *ref) for zh, ref in refs.items()}
            if name != "triton":
                cell["errors"][name]["o_max_diff_vs_triton"] = (o.float() - o_tri.float()).abs().max().item()
                cell["errors"][name]["lse_max_diff_vs_triton"] = (lse - l_tri).abs().max().item()
        for backend in args.sdpa:
            calls[f"sdpa_{backend}"] = _sdpa_call(backend, "fwd", q, k, v, q, causal)  # q: the unused gradient slot
        best = time_cell(cell, calls, args)
        cell["speedup_vs_triton"] = {name: best["triton"] / t for name, t in best.items() if name != "triton"}
        if args.baseline is not None:
            cell["speedup_vs_baseline"] = speedups_vs_baseline(best)
        for backend in args.sdpa:
            cell[f"speedup_vs_sdpa_{backend}"] = {name: best[f"sdpa_{backend}"] / t for name, t in best.items()}
        record_cell(report, cell, out)
    report["triton_autotuned"] = flash_triton.autotuned_configs()
    write_report(report, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
