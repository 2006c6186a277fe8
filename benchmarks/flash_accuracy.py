"""Error of the flash kernels against float64: this tree's kernels.flash_triton beside another version.

For each shape, both versions run forward and backward on the same inputs, and O, dQ, dK and dV
are compared with naive attention computed in float64 (which materialises the scores: keep the
shapes small, e.g. 2048 x 2048 per head). Per tensor: the largest absolute error and the relative
Frobenius error ||got - ref|| / ||ref||. The companion of `flash_ab`, for changes that trade
precision for speed.

    git show HEAD~1:kernels/flash_triton.py > /tmp/flash_base.py
    python -m benchmarks.flash_accuracy --baseline /tmp/flash_base.py --out accuracy.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.flash_ab import load_module, parse_shape, record_cell
from kernels.names import DTYPES, torch_dtype

SHAPES = [((1, 4, 2048, 64), True), ((2, 4, 1000, 128), False), ((1, 4, 4097, 64), True)]


def errors(got, ref) -> dict[str, float]:
    """Largest absolute error and relative Frobenius error of `got` against the float64 `ref`."""
    diff = got.double() - ref
    return {"max_abs": diff.abs().max().item(), "rel_fro": (diff.norm() / ref.norm()).item()}


def measure_cell(versions: dict, shape, causal: bool, dtype, device: str, seed: int = 0) -> dict:
    """Each version's errors on one shape: O and the three gradients against float64 naive attention."""
    import torch

    from kernels.attention import naive_attention

    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(shape, device=device, dtype=dtype, generator=gen) for _ in range(4))
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    ref_o = naive_attention(qd, kd, vd, causal)
    ref_o.backward(do.double())
    refs = {"o": ref_o.detach(), "dq": qd.grad, "dk": kd.grad, "dv": vd.grad}
    cell = {"shape": list(shape), "causal": causal}
    for name, mod in versions.items():
        out, lse = mod.flash_attention_forward(q, k, v, causal)
        dq, dk, dv = mod.flash_attention_backward(q, k, v, out, lse, do, causal)
        got = {"o": out, "dq": dq, "dk": dk, "dv": dv}
        cell[name] = {t: errors(got[t], refs[t]) for t in refs}
    return cell


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="path of the other flash_triton.py")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", action="append", type=parse_shape, default=None, metavar="B,H,S,D[,causal]",
                    help="a shape to check (repeatable; default: the three of SHAPES)")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)

    from kernels import flash_triton as current
    from worker.harness import fingerprint

    versions = {"current": current, "baseline": load_module(args.baseline)}
    report = {"kind": "flash_accuracy", **fingerprint(args.commit), "baseline": args.baseline.name,
              "dtype": args.dtype, "cells": []}
    for shape, causal in args.shape or SHAPES:
        record_cell(report, measure_cell(versions, shape, causal, torch_dtype(args.dtype), args.device),
                    args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
