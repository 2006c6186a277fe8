"""A/B of the flash kernels: this tree's kernels.flash_triton against another version of the file,
or against itself with other launch options.

Both load in one process and are timed alternately on the same inputs (rounds of A then B), so
clock drift and machine noise fall on both; outputs are compared too (`--pass bwd`: dQ, dK, dV,
each version on its own forward's O and L; `--grad sum` gives it the stride-0 dO of `o.sum().backward()`).
`--sdpa cudnn,flash` puts SDPA's backends in the same
rotation (`--pass bwd` times their backward alone: autograd.grad on a kept graph).

    git show aab62a8:kernels/flash_triton.py > /tmp/flash_base.py
    python -m benchmarks.flash_ab --baseline /tmp/flash_base.py --out flash_ab.json
    python -m benchmarks.flash_ab --options head_group=8 --baseline-options head_group=1 \
        --variant all:head_group=65536 --sdpa cudnn --out grid_order.json

`--fuse D[,causal]` also runs the fused Gluon backward at a head dim and mask where SHIPPED_FUSED (in
kernels/flash_gluon_bwd.py) leaves it out, for every version with gluon_fused on, at the shipped config;
this is how non-causal d=64 was timed before it shipped (docs/results/h200/fused_gate/README.md):

    python -m benchmarks.flash_ab --pass bwd --fuse 64 --options gluon_fused=true \
        --baseline-options gluon_fused=false --label split --shape 2,32,8192,64 --out fused_nc64.json

`--variant NAME:OPTIONS` adds more versions of this tree to the same rotation: the current version's
options and pins with OPTIONS on top (their times as NAME_ms, and speedup_vs_NAME: > 1 when the
current version is faster).

A round gives each version `--repeats` calls back to back, one version after another (the first
rotating from round to round, worker.harness.measure_rounds): short bursts,
which on a chip at its power limit compare the versions at about one clock. `--sustain-ms MS` times
them as do_bench and a training loop run them instead: each version alone for MS a round, the first
rotating (worker.harness.measure_sustained), where a version that spends more energy per call gets a
lower clock (docs/results/h100/sustained/README.md). A speed-up is then the ratio of the medians of
the rounds; in bursts, of the best rounds.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

from kernels.names import FLASH_KERNELS

SHAPES = [((16, 16384, 64), True), ((8, 16, 2048, 64), True), ((8, 16, 2048, 128), False), ((1, 16, 16384, 128), True)]


def load_module(path: Path, name: str = "flash_baseline", needs: tuple[str, ...] = ("flash_attention_forward",
                "FlashAttentionTriton"), what: str = "flash_triton"):
    """Import a flash_triton.py (or, with `needs` and `what`, another kernel module) from a file path under
    its own module name."""
    if not path.is_file():
        raise FileNotFoundError(f"baseline file {path} does not exist")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses (LaunchOptions) look their module up while being defined
    spec.loader.exec_module(module)
    for attr in needs:
        if not hasattr(module, attr):
            raise AttributeError(f"{path} has no {attr}: not a {what} module")
    return module


def load_baseline(ap: argparse.ArgumentParser, path: Path | None, name: str, needs: tuple[str, ...], what: str):
    """A script's --baseline module (load_module), None without a path, or ap.error naming what is wrong."""
    if path is None:
        return None
    try:
        return load_module(path, name, needs, what)
    except (FileNotFoundError, AttributeError) as exc:
        ap.error(str(exc))


def write_report(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")


def record_cell(report: dict, cell: dict, out: Path) -> None:
    """Add a cell to the report, print it, and write the whole report: a run cut by its time limit
    keeps every cell it finished."""
    report["cells"].append(cell)
    print(json.dumps(cell), file=sys.stderr, flush=True)
    write_report(report, out)


def parse_shape(text: str) -> tuple[tuple[int, ...], bool]:
    """"16,16384,64,causal" -> ((16, 16384, 64), True): 3 or 4 sizes, then optionally "causal"."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    causal = bool(parts) and parts[-1] == "causal"
    sizes = parts[:-1] if causal else parts
    if len(sizes) not in (3, 4) or not all(x.isdigit() and int(x) > 0 for x in sizes):
        raise argparse.ArgumentTypeError(f"shape {text!r}: want 3 or 4 positive sizes, then optionally 'causal'")
    return tuple(int(x) for x in sizes), causal


BOOL_OPTIONS = ("autotune", "tma", "gluon_dkdv", "gluon_dq", "gluon_fwd", "gluon_fused", "fused_persistent")
INT_OPTIONS = ("head_group", "bwd_head_group", "fused_min_seq", "gluon_fwd_min_seq")
SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}


def parse_options(text: str) -> dict:
    """"head_group=8,autotune=true" -> {"head_group": 8, "autotune": True} (LaunchOptions fields)."""
    out: dict = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, eq, value = item.partition("=")
        if not eq or name not in BOOL_OPTIONS + INT_OPTIONS:
            raise argparse.ArgumentTypeError(
                f"option {item!r}: want NAME=VALUE with NAME one of {', '.join(BOOL_OPTIONS + INT_OPTIONS)}")
        if name in INT_OPTIONS:
            if not value.isdigit() or int(value) < 1:
                raise argparse.ArgumentTypeError(f"option {item!r}: {name} is a positive integer")
            out[name] = int(value)
        elif value.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"option {item!r}: {name} is true or false")
        else:
            out[name] = value.lower() == "true"
    return out


def parse_variant(text: str) -> tuple[str, dict]:
    """"g4:head_group=4" -> ("g4", {"head_group": 4}): a name for the output and that version's options."""
    name, colon, options = text.partition(":")
    if not colon or not name.isidentifier() or name in ("current", "baseline") or name.startswith("sdpa"):
        raise argparse.ArgumentTypeError(
            f"variant {text!r}: want NAME:OPTIONS, NAME a word other than current, baseline and sdpa_*")
    return name, parse_options(options)


def parse_pin(text: str) -> tuple[str, tuple[int, ...]]:
    """"dkdv=32,64,4,3" -> ("dkdv", (32, 64, 4, 3)): a kernel name and its (BLOCK_M, BLOCK_N, warps, stages),
    optionally a fifth number, the register cap (make_config's maxnreg)."""
    name, _, cfg_text = text.partition("=")
    try:
        cfg = tuple(int(x) for x in cfg_text.split(","))
    except ValueError:
        cfg = ()
    if name not in FLASH_KERNELS or len(cfg) not in (4, 5) or min(cfg) <= 0:
        raise argparse.ArgumentTypeError(
            f"pin {text!r}: expected KERNEL=BM,BN,WARPS,STAGES[,MAXNREG] with KERNEL one of {', '.join(FLASH_KERNELS)}")
    return name, cfg


def parse_fuse(text: str) -> tuple[int, bool]:
    """"64" -> (64, False), "64,causal" -> (64, True): a (head dim, mask) of the fused Gluon backward."""
    from kernels.flash_gluon_bwd import SHIPPED_FUSED_DQ_MODES

    head_dim, _, mask = text.partition(",")
    if not head_dim.isdigit() or int(head_dim) not in SHIPPED_FUSED_DQ_MODES or mask not in ("", "causal"):
        raise argparse.ArgumentTypeError(
            f"--fuse {text!r}: want D or D,causal with D one of {', '.join(map(str, SHIPPED_FUSED_DQ_MODES))}")
    return int(head_dim), mask == "causal"


def require_gpu(ap: argparse.ArgumentParser) -> None:
    """Refuse by name (ap.error) where no CUDA GPU is visible, once the arguments have been checked."""
    import torch

    if not torch.cuda.is_available():
        ap.error("this benchmark times CUDA kernels; no GPU is visible")


def ship_fused(keys: list[tuple[int, bool]]) -> dict:
    """Have this process's flash_triton run the fused backward also at these (head dim, mask) keys, at the
    shipped config (flash_gluon_bwd.FUSED_CONFIG_WS), wherever gluon_fused is on: a version with
    gluon_fused=false stays split. Returns what SHIPPED_FUSED then holds, for the report."""
    from kernels import flash_gluon_bwd as gb

    for key in keys:
        gb.SHIPPED_FUSED[key] = gb.FUSED_CONFIG_WS
    return {f"{d},{'causal' if causal else 'nc'}": list(cfg) for (d, causal), cfg in sorted(gb.SHIPPED_FUSED.items())}


def parse_sdpa(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in SDPA_BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--sdpa {text!r}: choose from {', '.join(SDPA_BACKENDS)}")
    return names


def variant_options(current: dict, variant: dict) -> dict:
    """A variant's options: the current version's (its pins too), with the variant's own on top."""
    return {**current, **variant}


def launch_options(mod, options: dict):
    """A version's LaunchOptions from parsed options, pins ({kernel: numbers}) made into its own configs."""
    pinned = {name: mod.make_config(*cfg) for name, cfg in options.get("pinned", {}).items()}
    return mod.LaunchOptions(**{**options, "pinned": pinned})


def _call(mod, which: str, q, k, v, do, causal: bool, out, lse, options=None):
    """The timed call of one version: its forward launcher, or its backward launcher on (out, lse)."""
    opts = {} if options is None else {"options": options}
    if which == "fwd":
        return lambda: mod.flash_attention_forward(q, k, v, causal, **opts)
    return lambda: mod.flash_attention_backward(q, k, v, out, lse, do, causal, **opts)


def _sdpa_call(backend: str, which: str, q, k, v, do, causal: bool):
    """The timed call of one SDPA backend: its forward, or its backward alone (a graph kept from one forward)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    as4d = (lambda t: t[:, None]) if q.dim() == 3 else (lambda t: t)  # the fused backends want (b, h, s, d)
    q, k, v, do = (as4d(t) for t in (q, k, v, do))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    pick = getattr(SDPBackend, SDPA_BACKENDS[backend])
    if which == "fwd":
        def run():
            with sdpa_kernel(pick):
                return sdpa(q, k, v, is_causal=causal)
        return run
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(pick):  # the backend is chosen in forward; its backward node is what runs below
        out = sdpa(qg, kg, vg, is_causal=causal)
    return lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)


def time_calls(calls: dict, *, rounds: int, repeats: int, sustain_ms: float | None = None,
               device: str = "cuda") -> dict[str, list[float]]:
    """Each callable's median per round, ms: `repeats` calls of each in turn a round (harness.measure_rounds),
    or with `sustain_ms` each alone for that long a round (harness.measure_sustained); the first rotates
    from round to round either way."""
    from worker.harness import measure_rounds, measure_sustained

    names = list(calls)
    if sustain_ms is not None:
        runs = measure_sustained([calls[n] for n in names], sustain_ms=sustain_ms, rounds=rounds, warmup=3,
                                 device=device)
        return {n: [t.median_ms for t in per_round] for n, per_round in zip(names, runs, strict=True)}
    return measure_rounds(calls, rounds=rounds, repeats=repeats, device=device)


def round_stat(ms: list[float], sustained: bool) -> float:
    """One figure from a version's round medians: their median when sustained, else the best round."""
    return statistics.median(ms) if sustained else min(ms)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, default=None,
                    help="path of the other flash_triton.py (default: this tree's, with --baseline-options)")
    ap.add_argument("--options", type=parse_options, default={}, metavar="NAME=VALUE,...",
                    help=f"LaunchOptions of the current version ({', '.join(BOOL_OPTIONS)})")
    ap.add_argument("--baseline-options", type=parse_options, default={}, metavar="NAME=VALUE,...",
                    help="LaunchOptions of the baseline")
    ap.add_argument("--pin", action="append", type=parse_pin, default=[],
                    metavar="KERNEL=BM,BN,WARPS,STAGES[,MAXNREG]",
                    help="a fixed config for one kernel of the current version (repeatable)")
    ap.add_argument("--baseline-pin", action="append", type=parse_pin, default=[],
                    metavar="KERNEL=BM,BN,WARPS,STAGES[,MAXNREG]", help="the same for the baseline")
    ap.add_argument("--variant", action="append", type=parse_variant, default=[], metavar="NAME:NAME=VALUE,...",
                    help="another version of this tree, in the same rotation: the current version's options and "
                         "pins with these on top (repeatable)")
    ap.add_argument("--sdpa", type=parse_sdpa, default=[], metavar="cudnn,flash",
                    help="SDPA backends to time in the same rotation")
    ap.add_argument("--fuse", action="append", type=parse_fuse, default=[], metavar="D[,causal]",
                    help="also run the fused backward at this head dim and mask, if SHIPPED_FUSED leaves it out, "
                         "wherever gluon_fused is on, at the shipped config (repeatable)")
    ap.add_argument("--label", default=None, help="name of the baseline in the output (default: file name)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=30, help="calls a version a round (without --sustain-ms)")
    ap.add_argument("--sustain-ms", type=float, default=None, metavar="MS",
                    help="time each version alone for MS a round, as do_bench does (the rounds rotate the first)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--shape", action="append", type=parse_shape, default=None, metavar="B,H,S,D[,causal]",
                    help="a shape to time (repeatable; default: the four of SHAPES); a 3-number shape has no head axis")
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="fwd",
                    help="time the forward launcher, or the backward launcher on each version's own forward outputs")
    ap.add_argument("--grad", choices=("random", "sum"), default="random",
                    help="--pass bwd's dO: random, or what o.sum().backward() hands in (ones, every stride 0)")
    args = ap.parse_args(argv)
    if args.pin:
        args.options["pinned"] = dict(args.pin)
    if args.baseline_pin:
        args.baseline_options["pinned"] = dict(args.baseline_pin)
    if len({name for name, _ in args.variant}) < len(args.variant):
        ap.error("two --variant options share a name")
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats are at least 1")
    if args.sustain_ms is not None and not args.sustain_ms > 0:
        ap.error("--sustain-ms must be > 0")
    if args.baseline is None and args.options == args.baseline_options:
        ap.error("nothing to compare: give --baseline FILE, or --options (or --pin) that differ from the baseline's")

    import torch

    from kernels import flash_triton as current
    from worker.harness import fingerprint

    sustained = args.sustain_ms is not None
    fused_at = ship_fused(args.fuse)
    base = load_module(args.baseline) if args.baseline else current
    require_gpu(ap)
    label = args.label or (args.baseline.name if args.baseline else "this tree")
    variants = {name: variant_options(args.options, opts) for name, opts in args.variant}
    report = {"kind": "flash_ab", **fingerprint(args.commit), "baseline": label, "options": args.options,
              "baseline_options": args.baseline_options, "variants": variants, "sdpa": args.sdpa,
              "fused_at": fused_at, "pass": args.which, "grad": args.grad, "rounds": args.rounds,
              "sustain_ms": args.sustain_ms,
              "speedup_of": "median of rounds" if sustained else "best round", "cells": []}
    # a baseline given no options is called without any: an older file may not take them
    versions = {"current": (current, launch_options(current, args.options)),
                "baseline": (base, launch_options(base, args.baseline_options) if args.baseline_options else None),
                **{name: (current, launch_options(current, opts)) for name, opts in variants.items()}}
    for shape, causal in args.shape or SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        if args.grad == "sum":
            do = torch.ones((), device="cuda", dtype=torch.bfloat16).expand(shape)
        calls = {}
        for name, (mod, opts) in versions.items():
            saved = _call(mod, "fwd", q, k, v, do, causal, None, None, options=opts)()
            calls[name] = _call(mod, args.which, q, k, v, do, causal, *saved, options=opts)
        for backend in args.sdpa:
            calls[f"sdpa_{backend}"] = _sdpa_call(backend, args.which, q, k, v, do, causal)
        ms = time_calls(calls, rounds=args.rounds, repeats=args.repeats, sustain_ms=args.sustain_ms)
        stat = {name: round_stat(times, sustained) for name, times in ms.items()}
        out_cur, out_base = calls["current"](), calls["baseline"]()
        out_cur, out_base = (out_cur, out_base) if args.which == "bwd" else (out_cur[:1], out_base[:1])
        cell = {"shape": list(shape), "causal": causal, "current_ms": ms["current"], "baseline_ms": ms["baseline"],
                "speedup": stat["baseline"] / stat["current"],
                "max_abs_diff": max((a.float() - b.float()).abs().max().item()
                                    for a, b in zip(out_cur, out_base, strict=True))}
        for name in variants:
            cell[f"{name}_ms"] = ms[name]
            cell[f"speedup_vs_{name}"] = stat[name] / stat["current"]
        for backend in args.sdpa:  # > 1: the current version is faster than that backend
            cell[f"sdpa_{backend}_ms"] = ms[f"sdpa_{backend}"]
            cell[f"speedup_vs_sdpa_{backend}"] = stat[f"sdpa_{backend}"] / stat["current"]
        record_cell(report, cell, args.out)
    # the tiles each version's autotuner picked, per kernel and key (an older file may not say)
    report["autotuned"] = {name: getattr(mod, "autotuned_configs", dict)() for name, (mod, _) in versions.items()
                           if name in ("current", "baseline")}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
