"""A/B of the flash kernels: this tree's kernels.flash_triton against another version of the file.

Both load in one process and are timed alternately on the same inputs (rounds of A then B), so
clock drift and machine noise fall on both; outputs are compared too (`--pass bwd`: dQ, dK, dV,
each version on its own forward's O and L).

    git show aab62a8:kernels/flash_triton.py > /tmp/flash_base.py
    python -m benchmarks.flash_ab --baseline /tmp/flash_base.py --out flash_ab.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

SHAPES = [((16, 16384, 64), True), ((8, 16, 2048, 64), True), ((8, 16, 2048, 128), False), ((1, 16, 16384, 128), True)]


def load_module(path: Path, name: str = "flash_baseline"):
    """Import a flash_triton.py from a file path under its own module name."""
    if not path.is_file():
        raise FileNotFoundError(f"baseline file {path} does not exist")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses (LaunchOptions) look their module up while being defined
    spec.loader.exec_module(module)
    for attr in ("flash_attention_forward", "FlashAttentionTriton"):
        if not hasattr(module, attr):
            raise AttributeError(f"{path} has no {attr}: not a flash_triton module")
    return module


def parse_shape(text: str) -> tuple[tuple[int, ...], bool]:
    """"16,16384,64,causal" -> ((16, 16384, 64), True): 3 or 4 sizes, then optionally "causal"."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    causal = bool(parts) and parts[-1] == "causal"
    sizes = parts[:-1] if causal else parts
    if len(sizes) not in (3, 4) or not all(x.isdigit() and int(x) > 0 for x in sizes):
        raise argparse.ArgumentTypeError(f"shape {text!r}: want 3 or 4 positive sizes, then optionally 'causal'")
    return tuple(int(x) for x in sizes), causal


def _call(mod, which: str, q, k, v, do, causal: bool, out, lse):
    """The timed call of one version: its forward launcher, or its backward launcher on (out, lse)."""
    if which == "fwd":
        return lambda: mod.flash_attention_forward(q, k, v, causal)
    return lambda: mod.flash_attention_backward(q, k, v, out, lse, do, causal)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="path of the other flash_triton.py")
    ap.add_argument("--label", default=None, help="name of the baseline in the output (default: file name)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--shape", action="append", type=parse_shape, default=None, metavar="B,H,S,D[,causal]",
                    help="a shape to time (repeatable; default: the four of SHAPES); a 3-number shape has no head axis")
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="fwd",
                    help="time the forward launcher, or the backward launcher on each version's own forward outputs")
    args = ap.parse_args(argv)

    import torch

    from kernels import flash_triton as current
    from worker.harness import fingerprint, measure

    base = load_module(args.baseline)
    report = {"kind": "flash_ab", **fingerprint(args.commit), "baseline": args.label or args.baseline.name,
              "pass": args.which, "rounds": args.rounds, "cells": []}
    versions = {"current": current, "baseline": base}
    for shape, causal in args.shape or SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        saved = {label: mod.flash_attention_forward(q, k, v, causal) for label, mod in versions.items()}
        calls = {label: _call(mod, args.which, q, k, v, do, causal, *saved[label]) for label, mod in versions.items()}
        ms: dict[str, list[float]] = {label: [] for label in versions}
        for _ in range(args.rounds):
            for label in versions:
                ms[label].append(measure(calls[label], warmup=3, repeats=args.repeats, device="cuda").median_ms)
        out_cur, out_base = calls["current"](), calls["baseline"]()
        out_cur, out_base = (out_cur, out_base) if args.which == "bwd" else (out_cur[:1], out_base[:1])
        cell = {"shape": list(shape), "causal": causal, "current_ms": ms["current"], "baseline_ms": ms["baseline"],
                "speedup": min(ms["baseline"]) / min(ms["current"]),
                "max_abs_diff": max((a.float() - b.float()).abs().max().item()
                                    for a, b in zip(out_cur, out_base, strict=True))}
        report["cells"].append(cell)
        print(json.dumps(cell), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
