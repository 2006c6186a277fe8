"""What the compiler makes of one flash kernel for the H100/H200 (sm_90), with no GPU: registers,
stack, shared memory, the order of matmuls and waits in each loop, and the SASS instruction mix.

Triton compiles for a named target without a device, and its package carries ptxas, cuobjdump and
nvdisasm, so this runs on a CPU machine (Triton 3.7.1 there; the GPU hosts run 3.6, whose TTGIR for
these kernels had the same waits; spills can differ a little: the leaderboard dQ kernel with pointer
loads, (128, 64, 4, 3), takes 255 registers and 112 B of stack here, 255 and 24 spilled registers
on the H200). It is the cheap look before device
time: does a change keep a matmul in flight, add a barrier, or cost registers?

    python -m benchmarks.flash_sass --pin dkdv=64,64,4,2 --head-dim 128 --tma --causal --out sass
    python -m benchmarks.flash_sass --gluon 64,64,3,4 --head-dim 128 --causal --out sass

`--gluon BM,BN,STAGES,WARPS[,MODE]` (MODE one of kernels.names.GLUON_MODES) compiles the Gluon forward
(kernels/flash_gluon.py) instead, in benchmarks/flash_gluon_ab.py's config order;
`--gluon-bwd dkdv=BM,BN,STAGES,WARPS[,ORDER][,rN]` (or dq=..., fused=...) one of the Gluon backward
kernels (kernels/flash_gluon_bwd.py), in benchmarks/flash_gluon_bwd_ab.py's; `--cast-dq` the fused
backward's cast of an accumulator with spread columns (flash_gluon_bwd._cast_dq_spread_kernel).

Each loop is listed as its matmuls (`dot:NAME`, by the value it computes), their waits (`wait:N`,
N matmuls left in flight) and the `exp2`s and `if`s between them, in program order. The report's
`sass_loops` gives the same loops as compiled: each one's instruction count and opcode mix per step.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from benchmarks.flash_ab import parse_pin, write_report
from benchmarks.flash_gluon_ab import parse_config
from benchmarks.flash_gluon_bwd_ab import config_name as bwd_config_name
from benchmarks.flash_gluon_bwd_ab import parse_config as parse_bwd_config
from kernels.names import DTYPES, torch_dtype

# runtime parameters that are not pointers; every other non-constexpr parameter is a tensor
INT_ARGS = {"H", "n_q", "n_k", "dq_rows", "seq_bucket", "n_rows", "n_zh", "group"}
ANY_INT = {"H", "n_zh", "group"}  # ints the listing does not assume multiples of 16
FLOAT_ARGS = {"qk_scale", "sm_scale"}
FP32_TENSORS = {"L", "Delta", "DQ_ACC"}
INT32_TENSORS = {"SCHEDULE"}
EVEN_LENGTH = 16384  # the sequence length the listing assumes: a multiple of every tile


def signature(jit_fn, constexprs: dict, dtype: str) -> tuple[dict, dict]:
    """Triton's signature and attributes for `jit_fn` as a launch of contiguous (Z, H, N, D) tensors would
    specialise it: unit strides along d as constants, pointers 16-byte aligned, other strides and the
    lengths multiples of 16."""
    sig, attrs = {}, {}
    for i, name in enumerate(jit_fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.startswith("stride") or name in INT_ARGS:
            sig[name] = "i32"
            if name not in ANY_INT:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in FLOAT_ARGS:
            sig[name] = "fp32"
        else:
            sig[name] = ("*fp32" if name in FP32_TENSORS else "*i32" if name in INT32_TENSORS
                         else "*" + dtype)  # our dtype names are Triton's
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def loop_orders(ttgir: str) -> list[list[str]]:
    """Per scf.for loop, in the order the loops start: its matmuls, waits, exp2s and ifs in program order.
    A loop's body ends at the `}` with the indent of its `scf.for` line."""
    loops, open_loops = [], []  # open_loops: (index into loops, indent of the scf.for line)
    for line in ttgir.splitlines():
        text, indent = line.strip(), len(line) - len(line.lstrip())
        if open_loops and text.startswith("}") and indent == open_loops[-1][1]:
            open_loops.pop()
            continue
        if " = scf.for " in line or text.startswith("scf.for "):
            loops.append([])
            open_loops.append((len(loops) - 1, indent))
            continue
        if not open_loops:
            continue
        body = loops[open_loops[-1][0]]
        if m := re.search(r"%([A-Za-z]\w*?)(?:_\d+)?(?::\d+)? = ttng\.warp_group_dot ", text):
            body.append(f"dot:{m.group(1)}")
        elif m := re.search(r"ttng\.warp_group_dot_wait .*\{pendings = (\d+)", text):
            body.append(f"wait:{m.group(1)}")
        elif " math.exp2 " in f" {text} ":
            body.append("exp2")
        elif " scf.if " in f" {text} ":
            body.append("if")
    return loops


def tool(name: str) -> Path:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not in this Triton package ({path})")
    return path


def resources(cubin: Path) -> dict:
    """Registers, stack and shared memory per thread / block, as cuobjdump reports them."""
    out = subprocess.run([str(tool("cuobjdump")), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    found = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", out))
    return {"registers": int(found.get("REG", 0)), "stack_bytes": int(found.get("STACK", 0)),
            "static_shared_bytes": int(found.get("SHARED", 0))}


_INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)")  # opcode, predicate dropped
_LABEL = re.compile(r"\s*(\.L_x_\d+):")
_BRANCH_TO = re.compile(r"BRA\s+`\((\.L_x_\d+)\)")


def sass_ops(sass: str) -> dict[str, int]:
    """How often each SASS opcode appears in the kernel (predicates dropped)."""
    ops = Counter(m.group(1) for line in sass.splitlines() if (m := _INSTRUCTION.match(line)))
    return dict(ops.most_common())


def sass_loops(sass: str) -> list[dict]:
    """Each loop of the SASS, in program order: a branch back to a label above it closes one. Per loop its
    label, instruction count and opcode mix, so a loop step's instructions can be counted (the spin on an
    mbarrier is a loop of two)."""
    lines = [ln for ln in sass.splitlines() if _LABEL.match(ln) or _INSTRUCTION.match(ln)]
    labels: dict[str, int] = {}
    loops = []
    for i, line in enumerate(lines):
        if (m := _LABEL.match(line)):
            labels[m.group(1)] = i
        elif (b := _BRANCH_TO.search(line)) and b.group(1) in labels:
            body = [m.group(1) for ln in lines[labels[b.group(1)]:i + 1] if (m := _INSTRUCTION.match(ln))]
            loops.append({"label": b.group(1), "instructions": len(body), "ops": dict(Counter(body).most_common())})
    return loops


def write_listing(compiled, stem: Path, about: dict) -> dict:
    """Write `compiled`'s TTGIR, PTX, cubin, SASS and a report (resources, loop orders, SASS mix) next to
    `stem`; return the report."""
    import triton

    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".ttgir").write_text(compiled.asm["ttgir"])
    stem.with_suffix(".ptx").write_text(compiled.asm["ptx"])
    stem.with_suffix(".cubin").write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([str(tool("nvdisasm")), "-c", str(stem.with_suffix(".cubin"))],
                          capture_output=True, text=True, check=True).stdout
    stem.with_suffix(".sass").write_text(sass)
    report = {"kind": "flash_sass", **about, "triton": triton.__version__, "target": "sm_90",
              "shared_bytes": compiled.metadata.shared, **resources(stem.with_suffix(".cubin")),
              "loops": loop_orders(compiled.asm["ttgir"]), "sass_ops": sass_ops(sass),
              "sass_loops": sass_loops(sass)}
    write_report(report, stem.with_suffix(".json"))
    return report


def _gluon_listing(args, jit_fn, config: dict, options: dict, name: str, about: dict) -> int:
    """Compile a Gluon kernel (its config's constexprs and launch options) for sm_90 and write it out as
    for --pin, under `name`; print its resources and loop orders."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    constexprs = {"IS_CAUSAL": args.causal, "HEAD_DIM": args.head_dim, **config}
    sig, attrs = signature(jit_fn, constexprs, args.dtype)
    compiled = triton.compile(GluonASTSource(jit_fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options=options)
    report = write_listing(compiled, args.out / name, {**about, "head_dim": args.head_dim, "dtype": args.dtype,
                                                        "causal": args.causal})
    print(f"{about['kernel']} {about['config']} d={args.head_dim} {args.dtype}: {report['registers']} registers, "
          f"{report['stack_bytes']} B stack, {report['shared_bytes']} B shared")
    for i, loop in enumerate(report["loops"]):
        print(f"  loop {i}: {' '.join(loop)}")
    return 0


def _gluon_head_dim(args, ap, flag: str) -> None:
    from kernels import flash_gluon

    if args.dtype == "fp32" or args.head_dim not in flash_gluon.HEAD_DIMS:
        ap.error(f"{flag} takes 16-bit inputs at head dim {' or '.join(map(str, flash_gluon.HEAD_DIMS))}")


def compile_gluon(args, ap) -> int:
    """--gluon: the Gluon forward at one config."""
    from kernels import flash_gluon

    block_m, block_n, stages, warps, mode = args.gluon
    _gluon_head_dim(args, ap, "--gluon")
    try:  # the launcher's kernel and choices for this config
        jit_fn, config, options = flash_gluon.launch_spec(args.head_dim, block_m, block_n, stages, warps, mode)
    except ValueError as exc:
        ap.error(f"--gluon {','.join(map(str, args.gluon[:4]))}: {exc}")
    name = f"gluon_fwd_{block_m}_{block_n}_{stages}_{warps}{'' if mode == 'overlap' else '_' + mode}_d{args.head_dim}"
    return _gluon_listing(args, jit_fn, config, options, name, {"kernel": "gluon_fwd", "config": list(args.gluon)})


def parse_gluon_bwd(text: str) -> tuple[str, tuple]:
    """"dkdv=64,64,2,4" -> ("dkdv", (64, 64, 2, 4, "overlap", None)): a Gluon backward kernel and its config."""
    kernel, _, cfg = text.partition("=")
    if kernel not in ("dkdv", "dq", "fused"):  # kernels.flash_gluon_bwd.KERNELS (not imported: it needs Gluon)
        raise argparse.ArgumentTypeError(f"gluon-bwd {text!r}: want dkdv=CONFIG, dq=CONFIG or fused=CONFIG")
    return kernel, parse_bwd_config(cfg)


def compile_gluon_bwd(args, ap) -> int:
    """--gluon-bwd: a Gluon backward kernel at one config."""
    from kernels import flash_gluon_bwd

    kernel, cfg = args.gluon_bwd
    _gluon_head_dim(args, ap, "--gluon-bwd")
    try:
        jit_fn, config, options = flash_gluon_bwd.launch_spec(kernel, args.head_dim, flash_gluon_bwd.Config(*cfg),
                                                              args.dq_mode, args.rotate)
    except ValueError as exc:
        ap.error(f"--gluon-bwd {kernel}={bwd_config_name(cfg)}: {exc}")
    mode = "" if kernel != "fused" or args.dq_mode == "add" else f"_{args.dq_mode}"
    name = f"gluon_{kernel}_{bwd_config_name(cfg)}{mode}{'_rot' if args.rotate else ''}_d{args.head_dim}"
    return _gluon_listing(args, jit_fn, config, options, name, {"kernel": f"gluon_{kernel}", "config": list(cfg)})


def compile_cast_dq(args) -> int:
    """--cast-dq: the fused backward's dQ cast from an accumulator with spread columns, as cast_dq launches it
    (PREP_ROWS rows a program, 4 warps) for --head-dim and --dtype."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels import flash_gluon_bwd

    jit_fn = flash_gluon_bwd._cast_dq_spread_kernel
    constexprs = {"HEAD_DIM": args.head_dim, "ROWS": flash_gluon_bwd.PREP_ROWS}
    sig, attrs = signature(jit_fn, constexprs, args.dtype)
    compiled = triton.compile(ASTSource(jit_fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4})
    report = write_listing(compiled, args.out / f"cast_dq_spread_d{args.head_dim}_{args.dtype}",
                           {"kernel": "cast_dq_spread", "head_dim": args.head_dim, "dtype": args.dtype})
    print(f"cast_dq_spread d={args.head_dim} {args.dtype}: {report['registers']} registers, "
          f"{report['stack_bytes']} B stack, {report['shared_bytes']} B shared")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which_kernel = ap.add_mutually_exclusive_group(required=True)
    which_kernel.add_argument("--pin", type=parse_pin, metavar="KERNEL=BM,BN,WARPS,STAGES[,MAXNREG]",
                              help="the kernel (fwd, dkdv or dq) and its config")
    which_kernel.add_argument("--gluon", type=parse_config, metavar="BM,BN,STAGES,WARPS[,MODE]",
                              help="the Gluon forward and its config")
    which_kernel.add_argument("--gluon-bwd", type=parse_gluon_bwd, metavar="KERNEL=BM,BN,STAGES,WARPS[,ORDER][,rN]",
                              help="a Gluon backward kernel (dkdv or dq) and its config")
    which_kernel.add_argument("--cast-dq", action="store_true",
                              help="the fused backward's dQ cast from an accumulator with spread columns")
    ap.add_argument("--dq-mode", default="add",
                    help="with --gluon-bwd fused=...: how dQ is added (kernels.flash_gluon_bwd.DQ_MODES)")
    ap.add_argument("--rotate", action="store_true",
                    help="with --gluon-bwd fused=...,ws: non-causal programs each start at their own query tile")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--tma", action="store_true", help="the kernel's streamed tiles through tensor descriptors")
    ap.add_argument("--out", type=Path, required=True, help="folder for the report, TTGIR, PTX and SASS")
    args = ap.parse_args(argv)
    if not 1 <= args.head_dim <= 256:
        ap.error(f"--head-dim {args.head_dim}: the kernels take 1 to 256")
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("flash_sass compiles for sm_90: unset TRITON_INTERPRET (the interpreter compiles nothing)",
              file=sys.stderr)
        return 2

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels import flash_triton as ft

    if args.gluon:
        return compile_gluon(args, ap)
    if args.gluon_bwd:
        return compile_gluon_bwd(args, ap)
    if args.cast_dq:
        if args.head_dim % 32:
            ap.error(f"--cast-dq --head-dim {args.head_dim}: spread columns come in groups of 32")
        return compile_cast_dq(args)
    which, cfg = args.pin

    jit_fn = ft._JIT[which]
    precision = ft._precision(torch_dtype(args.dtype), "tf32")
    constexprs = {**ft._constexprs(args.causal, args.head_dim, precision), "BLOCK_M": cfg[0], "BLOCK_N": cfg[1]}
    # the launcher's EVEN_* rules on lengths that divide the tiles; every descriptor flag as --tma says
    even = {"n_q": EVEN_LENGTH, "n_k": EVEN_LENGTH, **constexprs}
    constexprs.update({name: rule(even) for name, rule in ft._EVEN_HEURISTICS.items()})
    constexprs.update({name: args.tma for name in jit_fn.arg_names if name.startswith("TMA_")})
    constexprs.update({name: 1 for name in jit_fn.arg_names if name.startswith("stride") and name.endswith("d")})
    sig, attrs = signature(jit_fn, constexprs, args.dtype)
    options = {"num_warps": cfg[2], "num_stages": cfg[3], **({"maxnreg": cfg[4]} if len(cfg) > 4 else {})}
    compiled = triton.compile(ASTSource(jit_fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options=options)

    stem = args.out / f"{which}_{'_'.join(map(str, cfg))}_d{args.head_dim}{'_tma' if args.tma else ''}"
    report = write_listing(compiled, stem, {"kernel": which, "config": list(cfg), "head_dim": args.head_dim,
                                            "dtype": args.dtype, "causal": args.causal, "tma": args.tma})
    print(f"{which} {cfg} d={args.head_dim} {args.dtype}: {report['registers']} registers, "
          f"{report['stack_bytes']} B stack, {report['shared_bytes']} B shared")
    for i, loop in enumerate(report["loops"]):
        print(f"  loop {i}: {' '.join(loop)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
