"""FlashAttention-2 (Triton) against PyTorch SDPA's backends, side by side in one process.

Grids (issue 3): flash-attention's convention of 16k tokens at model dim 2048
(batch = 16384 / seq, heads = 2048 / d), seq 512..16384, d 64 and 128, causal and not, bf16;
the CS336 leaderboard shape (16, 16384, 64) causal bf16; a long-context memory check; fp32.

    python -m benchmarks.attention_vs_sdpa --out attention.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cell(impl: str, shape: tuple[int, ...], causal: bool, dtype_name: str, passes, warmup: int, repeats: int) -> dict:
    import torch

    from kernels.flops import attention_flops
    from kernels.impls import get_attention
    from kernels.names import torch_dtype
    from worker.harness import is_oom
    from worker.suites.attention import time_attention

    fn = get_attention(impl)
    dtype = torch_dtype(dtype_name)
    b = shape[0]
    h = shape[1] if len(shape) == 4 else 1
    s, d = shape[-2], shape[-1]
    row = {"impl": impl, "shape": list(shape), "B": b, "H": h, "S": s, "D": d, "causal": causal, "dtype": dtype_name}
    for pass_ in passes:
        try:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen).requires_grad_(pass_ != "fwd")
                       for _ in range(3))
            t, peak = time_attention(fn, q, k, v, causal, pass_, warmup=warmup, repeats=repeats, device="cuda")
            flops = attention_flops(b, h, s, s, d, causal, pass_)
            row[f"{pass_}_ms"] = t.median_ms
            row[f"{pass_}_p20_ms"] = t.p20_ms
            row[f"{pass_}_p80_ms"] = t.p80_ms
            row[f"{pass_}_tflops"] = flops / (t.median_ms * 1e-3) / 1e12
            row[f"{pass_}_peak_extra_gb"] = peak / 2**30 if peak is not None else None
            row["samples"] = t.samples
        except Exception as exc:  # noqa: BLE001 - a failed cell is a recorded result
            row[f"{pass_}_error"] = ("oom: " if is_oom(exc) else "") + str(exc).splitlines()[0][:300]
        finally:
            q = k = v = None
            torch.cuda.empty_cache()
    return row


def grids(which: str):
    """Yield (impls, shape, causal, dtype) for the named grid."""
    flash_sdpa = ["flash_triton", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient"]
    if which in ("main", "all"):
        for d in (64, 128):
            for causal in (True, False):
                for s in (512, 1024, 2048, 4096, 8192, 16384):
                    yield flash_sdpa, (16384 // s, 2048 // d, s, d), causal, "bf16"
    if which in ("leaderboard", "all"):
        yield ["flash_triton", "sdpa_flash", "sdpa_cudnn"], (16, 16384, 64), True, "bf16"
    if which in ("long", "all"):
        yield ["flash_triton", "sdpa_flash", "naive"], (1, 1, 131072, 128), True, "bf16"
    if which in ("fp32", "all"):
        for s in (2048, 8192, 16384):
            yield ["flash_triton", "sdpa_efficient"], (16384 // s, 2048 // 64, s, 64), True, "fp32"
            yield ["flash_triton", "sdpa_efficient"], (16384 // s, 2048 // 64, s, 64), False, "fp32"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="all", choices=["all", "main", "leaderboard", "long", "fp32"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--passes", default="fwd,bwd,fwd_bwd")
    ap.add_argument("--commit", default=None, help="git commit to record when .git is absent")
    ap.add_argument("--seqs", default=None, help="comma-separated sequence lengths to keep (main grid)")
    ap.add_argument("--impls", default=None, help="comma-separated implementations to keep")
    args = ap.parse_args(argv)

    from worker.harness import fingerprint

    args.out.parent.mkdir(parents=True, exist_ok=True)
    passes = args.passes.split(",")
    with args.out.open("w") as f:
        f.write(json.dumps({"kind": "env", **fingerprint(args.commit)}) + "\n")
        for impls, shape, causal, dtype in grids(args.grid):
            if args.seqs and shape[-2] not in {int(x) for x in args.seqs.split(",")}:
                continue
            for impl in impls:
                if args.impls and impl not in args.impls.split(","):
                    continue
                row = {"kind": "attn", **_cell(impl, shape, causal, dtype, passes, args.warmup, args.repeats)}
                f.write(json.dumps(row) + "\n")
                f.flush()
                tf = {p: round(row.get(f"{p}_tflops", 0) or 0) for p in passes}
                print(f"{impl:15s} {shape} causal={causal} {dtype} {tf}", file=sys.stderr, flush=True)
        f.write(json.dumps({"kind": "autotune", **tuned_configs()}) + "\n")
    return 0


def tuned_configs() -> dict:
    """The tile configs the autotuner picked, per kernel and key, for the tuning notes."""
    from kernels import flash_triton as ft

    return ft.autotuned_configs()

if __name__ == "__main__":
    raise SystemExit(main())
