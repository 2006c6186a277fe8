"""Tile search for the Triton FlashAttention-2 kernels on one shape, one kernel at a time (GPU).

For each kernel (fwd, dkdv, dq) every (BLOCK_M, BLOCK_N, num_warps, num_stages) of a wide space
that fits in shared memory is pinned in turn and timed on its own pass: the forward alone, or the
whole backward with the other backward kernel held at one fixed config (so the differences are
the swept kernel's). Compiles run first in parallel worker processes (they fill Triton's on-disk
cache); the timing runs after, in one process. The best of each kernel is then timed together
against the autotuned path, in both grid orders.

    python -m benchmarks.flash_tune --shape 16,16384,64 --causal --out flash_tune.jsonl
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.flash_ab import parse_pin, parse_shape
from kernels.names import FLASH_KERNELS, torch_dtype


def space(kernel: str) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, warps, stages) candidates; the diagonal needs the row tile to divide evenly."""
    out = []
    for bm, bn, w, st in itertools.product((16, 32, 64, 128, 256), (16, 32, 64, 128), (4, 8), (2, 3, 4, 5)):
        if kernel == "dkdv":
            ok = bn % bm == 0 and bn >= 64 and bm >= 16 and bn * bm >= 64 * 32
        else:
            ok = bm % bn == 0 and bm >= 64 and bn >= 32 and bm * bn <= 128 * 128
        if ok and not (w == 8 and bm * bn < 64 * 64) and not (bm == 256 and w == 4):
            out.append((bm, bn, w, st))
    return out


def parse_caps(text: str) -> list[int | None]:
    """"0,128,168" -> [None, 128, 168]: register caps per thread to sweep, 0 meaning no cap."""
    try:
        caps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        caps = []
    if not caps or any(c != 0 and not 24 <= c <= 255 for c in caps):
        raise argparse.ArgumentTypeError(f"--maxnreg {text!r}: want comma-separated caps in 24..255, or 0 for none")
    return [c or None for c in dict.fromkeys(caps)]


def make_inputs(shape, dtype_name: str, seed: int = 0):
    import torch

    dtype = torch_dtype(dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
    return q, k, v, do


def _pass_fn(kernel: str, cfg, base: dict, shape, causal: bool, dtype_name: str):
    """A zero-argument function running the pass that exercises `kernel` with `cfg` pinned."""
    from kernels import flash_triton as ft

    q, k, v, do = make_inputs(shape, dtype_name)
    pins = dict(base)
    if cfg is not None:
        pins[kernel] = ft.make_config(*cfg)
    options = ft.LaunchOptions(pinned=pins)
    if kernel == "fwd":
        def run():
            ft.flash_attention_forward(q, k, v, causal, options=options)
        return run
    o, lse = ft.flash_attention_forward(q, k, v, causal, options=options)

    def run():
        ft.flash_attention_backward(q, k, v, o, lse, do, causal, options=options)
    return run


def _base_pins(head_dim: int, dtype_name: str):
    """The fixed config held by the kernels not being swept: the first of each shipped space that
    the launcher's pruning keeps for this head dim and dtype (what autotune=False would launch)."""
    import torch

    from kernels import flash_triton as ft

    q = torch.empty(0, dtype=torch_dtype(dtype_name))
    return {name: ft.first_fitting_config(name, q, head_dim) for name in FLASH_KERNELS}


def _short_error(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _compile_one(job) -> tuple[str, tuple, str | None]:
    kernel, cfg, shape, causal, dtype_name = job
    import torch

    try:
        _pass_fn(kernel, cfg, _base_pins(shape[-1], dtype_name), shape, causal, dtype_name)()
        torch.cuda.synchronize()
        return kernel, cfg, None
    except Exception as exc:  # noqa: BLE001 - a config that fails to compile is a recorded result
        return kernel, cfg, _short_error(exc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="16,16384,64", type=parse_shape,
                    help="comma-separated q shape, e.g. 16,16384,64 or 1,16,8192,128; ',causal' at the end "
                         "or --causal")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--kernels", default=",".join(FLASH_KERNELS))
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="parallel compile processes")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--maxnreg", type=parse_caps, default=[None], metavar="CAP,...",
                    help="register caps to try with every config, 0 for none (default: none): e.g. 0,128,168")
    ap.add_argument("--pin", action="append", type=parse_pin, default=[],
                    metavar="KERNEL=BM,BN,WARPS,STAGES[,MAXNREG]",
                    help="take this config for KERNEL instead of sweeping it (repeatable)")
    args = ap.parse_args(argv)

    import torch

    from kernels import flash_triton as ft
    from kernels.flops import attention_flops
    from worker.harness import fingerprint, measure

    shape, shape_causal = args.shape
    args.causal = args.causal or shape_causal
    kernels = [k for k in args.kernels.split(",") if k]
    for k in kernels:
        if k not in FLASH_KERNELS:
            ap.error(f"unknown kernel {k!r}; choose from {', '.join(FLASH_KERNELS)}")
    best: dict[str, tuple[float, tuple]] = {}
    for name, cfg in args.pin:
        best[name] = (0.0, cfg)
    kernels = [k for k in kernels if k not in best]
    d = shape[-1]
    elem = {"bf16": 2, "fp16": 2, "fp32": 4}[args.dtype]
    jobs = []
    for k in kernels:
        for cfg in space(k):
            if ft.smem_estimate(ft.make_config(*cfg), d, elem, k) <= ft.SMEM_BUDGET:
                jobs.extend((k, cfg if cap is None else (*cfg, cap), shape, args.causal, args.dtype)
                            for cap in args.maxnreg)
    print(f"{len(jobs)} configs to compile with {args.jobs} processes", flush=True)

    failed: dict[tuple, str] = {}
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, (k, cfg, err) in enumerate(pool.map(_compile_one, jobs), 1):
            if err:
                failed[(k, cfg)] = err
            if i % 20 == 0:
                print(f"  compiled {i}/{len(jobs)}", flush=True)

    b = shape[0]
    h = shape[1] if len(shape) == 4 else 1
    s = shape[-2]
    flops = {"fwd": attention_flops(b, h, s, s, d, args.causal, "fwd"),
             "bwd": attention_flops(b, h, s, s, d, args.causal, "bwd"),
             "fwd_bwd": attention_flops(b, h, s, s, d, args.causal, "fwd_bwd")}
    base = _base_pins(d, args.dtype)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        head = {"kind": "env", **fingerprint(args.commit), "shape": list(shape), "causal": args.causal,
                "dtype": args.dtype, "base": {n: [c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages,
                                                  c.maxnreg] for n, c in base.items()}}
        f.write(json.dumps(head) + "\n")
        for k, cfg, *_ in jobs:
            row = {"kind": "config", "kernel": k, "BLOCK_M": cfg[0], "BLOCK_N": cfg[1], "warps": cfg[2],
                   "stages": cfg[3], "maxnreg": cfg[4] if len(cfg) > 4 else None}
            if (k, cfg) in failed:
                row["error"] = failed[(k, cfg)]
            else:
                try:
                    t = measure(_pass_fn(k, cfg, base, shape, args.causal, args.dtype), warmup=2,
                                repeats=args.repeats, device="cuda")
                    row["ms"] = t.median_ms
                    row["p20_ms"], row["p80_ms"] = t.p20_ms, t.p80_ms
                    scope = "fwd" if k == "fwd" else "bwd"
                    row["scope"] = scope
                    row["tflops"] = flops[scope] / (t.median_ms * 1e-3) / 1e12
                    if k not in best or t.median_ms < best[k][0]:
                        best[k] = (t.median_ms, cfg)
                except Exception as exc:  # noqa: BLE001 (a config that fails to compile is recorded, not fatal)
                    row["error"] = _short_error(exc)
                torch.cuda.empty_cache()
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row), flush=True)

        # the winners together, against the shipped autotuned path, head-major and tile-major
        pins = {k: ft.make_config(*c) for k, (_, c) in best.items()}
        q, k_, v, do = make_inputs(shape, args.dtype)
        for q_ in (q, k_, v):
            q_.requires_grad_(True)

        def fwd_bwd(options):
            q.grad = k_.grad = v.grad = None
            ft.FlashAttentionTriton.apply(q, k_, v, args.causal, "tf32", options).backward(do)

        for label, ctx_pins in (("best_pinned", pins), ("autotuned", {})):
            for head_group, order in ((math.prod(shape[:-2]), "tile_major"), (1, "head_major")):
                options = ft.LaunchOptions(head_group=head_group, pinned=ctx_pins)
                t = measure(lambda o=options: fwd_bwd(o), warmup=3, repeats=args.repeats * 2, device="cuda")
                row = {"kind": "total", "label": label, "order": order, "fwd_bwd_ms": t.median_ms,
                       "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                       "tflops": flops["fwd_bwd"] / (t.median_ms * 1e-3) / 1e12,
                       "pins": {n: list(c) for n, (_, c) in best.items()} if ctx_pins else None}
                f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)

        # where the forward+backward time goes with the winners pinned: each pass alone, and the
        # kernels' device time inside the timed loop (the rest of the wall time is launch gaps)
        best_opts = ft.LaunchOptions(pinned=pins)
        qd, kd, vd = q.detach(), k_.detach(), v.detach()
        t_fwd = measure(lambda: ft.flash_attention_forward(qd, kd, vd, args.causal, options=best_opts),
                        warmup=3, repeats=args.repeats, device="cuda")
        o, lse = ft.flash_attention_forward(qd, kd, vd, args.causal, options=best_opts)
        t_bwd = measure(lambda: ft.flash_attention_backward(qd, kd, vd, o, lse, do, args.causal, options=best_opts),
                        warmup=3, repeats=args.repeats, device="cuda")
        pinned_fwd_bwd = lambda: fwd_bwd(best_opts)  # noqa: E731 (a one-line closure over the winners)
        kernels_ms = _kernel_times(pinned_fwd_bwd, iters=10)
        t_noflush = measure(pinned_fwd_bwd, warmup=3, repeats=args.repeats, device="cuda", flush_l2=False)
        loop_ms, host_ms = _loop_and_host_ms(pinned_fwd_bwd, iters=args.repeats)
        row = {"kind": "parts", "fwd_ms": t_fwd.median_ms, "bwd_ms": t_bwd.median_ms, "kernels_ms_per_iter": kernels_ms,
               "kernels_sum_ms": sum(kernels_ms.values()), "fwd_bwd_no_l2_flush_ms": t_noflush.median_ms,
               "fwd_bwd_back_to_back_ms": loop_ms, "fwd_bwd_host_ms": host_ms}
        f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return 0


def _loop_and_host_ms(fn, iters: int) -> tuple[float, float]:
    """(device ms per call over `iters` back-to-back calls, median host ms to issue one call)."""
    import time

    import torch

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = []
    start.record()
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters, sorted(host)[len(host) // 2]


def _kernel_times(fn, iters: int) -> dict[str, float]:
    """Mean device time per call of each CUDA kernel that `fn` launches, from the PyTorch profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from worker.profiling import op_times_ms

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return {name[:80]: t["ms_per_step"] for name, t in op_times_ms(prof, steps=iters, on_gpu=True).items()}


if __name__ == "__main__":
    sys.exit(main())
