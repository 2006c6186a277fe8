"""What the compiler made of each flash kernel at one shape: tiles, warps, stages, registers, spills,
shared memory, and (with --ir) the TTGIR and PTX, for reading beside a profiler's counters.

It runs one forward and backward through the launchers (tuning as usual, or `--pin`ned), then reads
the compiled kernel that each launch plan holds. `--profile` wraps one more forward and backward in
cudaProfilerStart/Stop, so a profiler started with `--profile-from-start off` sees only those launches;
`--sdpa cudnn` puts an SDPA backend's forward and backward in the same window, for its counters beside ours:

    python -m benchmarks.flash_kernel_report --shape 16,16384,64,causal --ir --out report
    ncu --clock-control none --profile-from-start off --set full -o report/ncu \
        python -m benchmarks.flash_kernel_report --shape 16,16384,64,causal --profile --sdpa cudnn --out report
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.flash_ab import _sdpa_call, launch_options, parse_pin, parse_sdpa, parse_shape, write_report
from benchmarks.flash_tune import make_inputs
from kernels.names import DTYPES


def compiled_kernels(flash) -> dict:
    """The compiled kernel behind each planned launch: {kernel name: CompiledKernel}, matched by the
    plan's function handle against every kernel the JIT functions compiled on any device."""
    by_handle = {}
    for jit in (flash._fwd_kernel, flash._bwd_dkdv_kernel, flash._bwd_dq_kernel):
        for cache in jit.device_caches.values():
            for compiled in cache[0].values():
                if getattr(compiled, "function", None) is not None:
                    by_handle[compiled.function] = (jit.__name__, compiled, jit)
    found = {}
    for plan in flash._PLANS.values():
        for kernel in getattr(plan, "kernels", ()):
            if getattr(kernel, "function", None) in by_handle:
                name, compiled, jit = by_handle[kernel.function]
                found[name] = (compiled, dict(zip(jit.arg_names[len(jit.arg_names) - len(kernel.fixed):],
                                                  kernel.fixed, strict=True)))
    return found


def describe(compiled, named: dict) -> dict:
    """One kernel's figures: tiles and what ptxas reported."""
    meta = compiled.metadata
    return {"BLOCK_M": named.get("BLOCK_M"), "BLOCK_N": named.get("BLOCK_N"), "num_warps": meta.num_warps,
            "num_stages": meta.num_stages, "shared_bytes": meta.shared, "registers": compiled.n_regs,
            "spills": compiled.n_spills, "maxnreg": getattr(meta, "maxnreg", None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=parse_shape, default=((16, 16384, 64), True), metavar="B,H,S,D[,causal]")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--pin", action="append", type=parse_pin, default=[],
                    metavar="KERNEL=BM,BN,WARPS,STAGES[,MAXNREG]",
                    help="a fixed config for fwd, dkdv or dq instead of autotuning (repeatable)")
    ap.add_argument("--ir", action="store_true", help="write each kernel's TTGIR and PTX under --out")
    ap.add_argument("--profile", action="store_true",
                    help="one more forward and backward between cudaProfilerStart and cudaProfilerStop")
    ap.add_argument("--sdpa", type=parse_sdpa, default=[], metavar="BACKENDS",
                    help="with --profile: each SDPA backend's forward and backward in the window too (cudnn,flash)")
    ap.add_argument("--out", type=Path, required=True, help="folder for kernels.json (and the IR)")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    if args.sdpa and not args.profile:
        ap.error("--sdpa puts SDPA's kernels in the profiler window: it needs --profile")

    import torch

    if not torch.cuda.is_available():
        print("flash_kernel_report needs a CUDA GPU (it reads compiled kernels)", file=sys.stderr)
        return 2
    from kernels import flash_triton as flash
    from worker.harness import fingerprint

    shape, causal = args.shape
    options = launch_options(flash, {"pinned": dict(args.pin)})
    q, k, v, do = make_inputs(shape, args.dtype)
    for _ in range(2):  # the first call tunes and plans; the second runs through the plans
        out, lse = flash.flash_attention_forward(q, k, v, causal, options=options)
        flash.flash_attention_backward(q, k, v, out, lse, do, causal, options=options)
    sdpa = [(_sdpa_call(b, "fwd", q, k, v, do, causal), _sdpa_call(b, "bwd", q, k, v, do, causal))
            for b in args.sdpa]
    for fwd, bwd in sdpa:  # their first calls (cuDNN builds its plans) stay out of the window
        fwd(), bwd()
    torch.cuda.synchronize()
    if args.profile:
        torch.cuda.cudart().cudaProfilerStart()
        out, lse = flash.flash_attention_forward(q, k, v, causal, options=options)
        flash.flash_attention_backward(q, k, v, out, lse, do, causal, options=options)
        for fwd, bwd in sdpa:
            fwd(), bwd()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()

    args.out.mkdir(parents=True, exist_ok=True)
    report = {"kind": "flash_kernel_report", **fingerprint(args.commit), "shape": list(shape), "causal": causal,
              "dtype": args.dtype, "profiled_sdpa": args.sdpa if args.profile else [], "kernels": {}}
    for name, (compiled, named) in sorted(compiled_kernels(flash).items()):
        report["kernels"][name] = describe(compiled, named)
        if args.ir:
            for ext in ("ttgir", "ptx"):
                if ext in compiled.asm:
                    (args.out / f"{name}.{ext}").write_text(compiled.asm[ext])
    write_report(report, args.out / "kernels.json")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
