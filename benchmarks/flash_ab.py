"""A/B of the flash kernels: this tree's kernels.flash_triton against another version of the file.

Both load in one process and are timed alternately on the same inputs (rounds of A then B), so
clock drift and machine noise fall on both; outputs are compared too.

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="path of the other flash_triton.py")
    ap.add_argument("--label", default=None, help="name of the baseline in the output (default: file name)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)

    import torch

    from kernels import flash_triton as current
    from worker.harness import fingerprint, measure

    base = load_module(args.baseline)
    report = {"kind": "flash_ab", **fingerprint(args.commit), "baseline": args.label or args.baseline.name,
              "pass": "fwd", "rounds": args.rounds, "cells": []}
    for shape, causal in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        ms = {"current": [], "baseline": []}
        for _ in range(args.rounds):
            for label, mod in (("current", current), ("baseline", base)):
                def fwd(mod=mod, q=q, k=k, v=v, causal=causal):
                    return mod.flash_attention_forward(q, k, v, causal)

                t = measure(fwd, warmup=3, repeats=args.repeats,
                            device="cuda")
                ms[label].append(t.median_ms)
        o_cur, _ = current.flash_attention_forward(q, k, v, causal)
        o_base, _ = base.flash_attention_forward(q, k, v, causal)
        cell = {"shape": list(shape), "causal": causal, "current_ms": ms["current"], "baseline_ms": ms["baseline"],
                "speedup": min(ms["baseline"]) / min(ms["current"]),
                "max_abs_diff": (o_cur.float() - o_base.float()).abs().max().item()}
        report["cells"].append(cell)
        print(json.dumps(cell), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
