"""The Gluon backward kernels (kernels/flash_gluon_bwd.py) beside the Triton ones, in turns, on the same inputs.

Per shape: the Triton backward runs once to make its launch plan, whose two kernels (dQ, which also
writes Delta, and dK/dV) can then be launched alone. Timed in rounds, one after another in one process
(CUDA events, warm-up excluded): in turns, the best round counting, or with --sustain-ms each call alone
for that long a round, the median round counting (flash_ab's sustained mode):

  triton_dkdv, triton_dq    the Triton kernels alone (autotuned, the shipped options)
  triton_pinned_<k>_<cfg>   with --pin K=CFG (repeatable), Triton's kernel K alone at that config instead of
                            autotuned (with --pairs also twice in one sample); pinned_bwd_<k>_<cfg> the whole
                            Triton backward with it
  gluon_<cfg>               each Gluon dK/dV config (--config) alone, on the same L and Delta
  gluon_dq_<cfg>            each Gluon dQ config (--dq-config) alone (it writes Delta too)
  triton_bwd                the split backward (dQ + dK/dV) as flash_triton launches it with gluon_fused off
  pair_*, twice_*           with --pairs, the Triton kernels back to back in one sample: dQ then dK/dV (as the
                            backward runs them), dK/dV then dQ, each kernel twice, and each SDPA backward
                            twice (what running right behind another kernel, with no L2 flush or idle gap
                            between, costs)
  hybrid_<cfg>              the Triton dQ kernel, then that Gluon dK/dV config
  gluon_bwd_<dq cfg>        that Gluon dQ config, then the first Gluon dK/dV config: a whole Gluon backward
  fused_<cfg>[_<mode>]      the fused backward (--fused-config): Delta and the zeroed accumulator by one Triton
                            kernel, one Gluon kernel adding dQ by atomics (atom, or with _red red; order ws also
                            _tma, one bulk reduction a tile by the copy engine, and _turns, the same for the two
                            consumers' keys together, one consumer a tile in turns, _turns-t, that as
                            dQ^T for two or three consumers at any block_m, and _halves, each of two consumers
                            its half of the columns every tile), dQ cast; order ws-p is ws persistent (one
                            program an SM taking key tile after key tile; tma, turns and halves);
                            fused_kernel_<cfg>[_<mode>] its kernel alone, and fused_probe_<cfg> the red kernel
                            adding no row (what the adds' traffic costs; 64-query configs); --dq-mode picks
                            the modes; with --rotate each ws one also with a _rot suffix: the kernel's
                            non-causal programs each starting at their own query tile (flash_gluon_bwd's rotate)
  cast_dq, cast_dq_spread    with --fused-config, the fused backward's last pass alone on an fp32 accumulator: the
                            plain cast, and the one that also puts spread columns back (spreads_columns)
  base_fused_*              with --baseline FILE (another kernels/flash_gluon_bwd.py), that version's fused
                            backward and kernel at every fused config and mode, in the same rotation
                            (speedup_vs_baseline: > 1 where this tree's is faster)
  sdpa_<b>                  an SDPA backend's backward (--sdpa), for scale

Accuracy: every Gluon output is written into NaN-filled tensors, so a row a kernel never writes shows.
dQ, dK and dV on the first and last (z, h) pair against float64 autograd: the largest error of any
row (a wrong ragged row cannot hide in it); and the largest difference from Triton's over the whole
tensor (Delta's too). A config that fails to compile or run is recorded with its error and the run goes on.

    python -m benchmarks.flash_gluon_bwd_ab --config 64,64,2,4 --config 64,64,3,4,defer,r168 \\
        --dq-config 64,64,2,4 --shape 16,16384,64,causal --sdpa cudnn --out gluon_bwd_ab.json
    git show HEAD~1:kernels/flash_gluon_bwd.py > /tmp/bwd_base.py
    python -m benchmarks.flash_gluon_bwd_ab --baseline /tmp/bwd_base.py --no-hybrid --config 64,64,2,4 \\
        --fused-config 64,128,3,4,ws --dq-mode halves --shape 2,16,8192,128,causal --out bwd_vs_base.json
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from benchmarks.flash_ab import _sdpa_call, load_baseline, parse_pin, record_cell, require_gpu, write_report
from benchmarks.flash_gluon_ab import BASE_PREFIX, add_run_args, check_run_args, speedups_vs_baseline, time_cell

SHAPES = [((16, 16384, 64), True), ((4, 16, 4096, 64), False), ((4, 16, 4096, 128), True),
          ((4, 16, 4096, 128), False), ((2, 16, 8192, 128), True), ((1, 4, 1000, 128), True),
          ((1, 4, 4097, 64), False)]
# kernels.flash_gluon_bwd.DKDV_ORDERS and the fused kernel's persistent "ws-p" (not imported: it needs Gluon)
ORDERS = ("overlap", "defer", "plain", "ws", "overlap-rs", "defer-rs", "plain-rs", "ws-p")
CONFIGS = [(64, 64, 2, 4, "overlap", None), (32, 64, 2, 4, "overlap", None)]
DQ_CONFIGS = [(64, 64, 2, 4, "overlap", None)]
# kernels.flash_gluon_bwd.DQ_MODES less "probe", which is timed beside them (the kernels are imported only
# once a GPU is in use)
FUSED_DQ_MODES = ("add", "red", "tma", "turns", "turns-t", "halves")


def parse_config(text: str) -> tuple[int, int, int, int, str, int | None]:
    """"64,64,3,4,defer,r168" -> (block_m, block_n, stages, num_warps, order, maxnreg); the order (ORDERS,
    "overlap" when left out) and the register cap rN (none when left out) are optional, in that order."""
    parts = [x.strip() for x in text.split(",")]
    maxnreg = None
    if parts and parts[-1].startswith("r") and parts[-1][1:].isdigit():
        maxnreg = int(parts.pop()[1:])
    order = parts[-1] if parts and parts[-1] in ORDERS else ORDERS[0]
    sizes = parts[:-1] if parts and parts[-1] in ORDERS else parts
    if len(sizes) != 4 or not all(x.isdigit() and int(x) > 0 for x in sizes):
        raise argparse.ArgumentTypeError(
            f"config {text!r}: want BLOCK_M,BLOCK_N,STAGES,WARPS (positive integers), then optionally an order "
            f"({', '.join(ORDERS)}) and a register cap rN")
    return (*(int(x) for x in sizes), order, maxnreg)  # type: ignore[return-value]


def config_name(cfg: tuple) -> str:
    return ("x".join(map(str, cfg[:4])) + ("" if cfg[4] == ORDERS[0] else f"_{cfg[4]}")
            + ("" if cfg[5] is None else f"_r{cfg[5]}"))


def reference_grads(q, k, v, do, causal: bool):
    """float64 (dQ, dK, dV) of one (n, d) head by autograd."""
    import torch

    qs, ks, vs = (t.double().requires_grad_() for t in (q, k, v))
    s = qs @ ks.T / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, dim=-1) @ vs
    return torch.autograd.grad(o, (qs, ks, vs), do.double())


def row_errors(grads: dict, refs: dict) -> dict:
    """Per gradient (dq, dk, dv): the largest and the median error of any row (max over d), against the
    reference. A NaN (a row never written) makes the largest NaN."""
    out = {}
    for name, g in grads.items():
        err = (g.double() - refs[name]).abs().amax(dim=-1)
        out[f"{name}_row_max"] = err.max().item()
        out[f"{name}_row_median"] = err.median().item()
    return out


def back_to_back(*calls):
    """One call that runs `calls` in order, so a sample holds them back to back with no L2 flush between."""
    return lambda: [call() for call in calls]


def triton_plan(flash_triton):
    """The one backward plan made since the table was cleared; its `kernels` are (dQ, dK/dV)."""
    plans = [plan for key, plan in flash_triton._PLANS.items() if key[0] == "bwd"]
    if len(plans) != 1 or not hasattr(plans[0], "kernels"):
        raise RuntimeError(f"expected one planned Triton backward, found {len(plans)}")
    return plans[0]


def measure_shape(shape: tuple[int, ...], causal: bool, configs: list, dq_configs: list, args,
                  fused_configs: tuple = (), baseline=None) -> dict:
    """One shape's cell: every call's errors and CUDA-event times (module docstring); baseline: another
    flash_gluon_bwd module, whose fused backward runs at every fused config too."""
    import torch

    from kernels import flash_gluon_bwd as gb
    from kernels import flash_triton
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    cell: dict = {"shape": list(shape), "causal": causal, "errors": {}, "failed": {}}
    o, lse = flash_triton.flash_attention_forward(q, k, v, causal)
    flash_triton.clear_launch_plans()
    split = flash_triton.LaunchOptions(gluon_fused=False)  # the two kernels, where the fused one might ship
    flash_triton.flash_attention_backward(q, k, v, o, lse, do, causal, options=split)
    flash_triton.flash_attention_backward(q, k, v, o, lse, do, causal, options=split)  # planned, after autotuning
    bwd = triton_plan(flash_triton)
    dq_plan, dkdv_plan = bwd.kernels
    dq_t, dk_t, dv_t, delta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)
    calls = {"triton_dkdv": lambda: dkdv_plan(q, k, v, do, lse, delta, dk_t, dv_t),
             "triton_dq": lambda: dq_plan(q, k, v, o, do, lse, delta, dq_t),
             "triton_bwd": lambda: bwd(q, k, v, o, lse, do)}
    calls["triton_dq"]()  # Delta, as the Triton backward computes it, for every dK/dV kernel below
    for name, cfg in args.pin:  # each pinned config: a plan of its own, whose kernel is timed alone
        flash_triton.clear_launch_plans()
        pinned = flash_triton.LaunchOptions(pinned={name: flash_triton.make_config(*cfg)})
        flash_triton.flash_attention_backward(q, k, v, o, lse, do, causal, options=pinned)
        bwd_pin = triton_plan(flash_triton)
        dq_pin, dkdv_pin = bwd_pin.kernels
        dq_p, dk_p, dv_p, delta_p = (torch.empty_like(t) for t in (q, k, v, lse))
        tag = f"{name}_{'x'.join(map(str, cfg))}"
        calls[f"pinned_bwd_{tag}"] = lambda f=bwd_pin: f(q, k, v, o, lse, do)
        calls[f"triton_pinned_{tag}"] = (
            (lambda f=dkdv_pin, a=dk_p, b=dv_p: f(q, k, v, do, lse, delta, a, b)) if name == "dkdv"
            else (lambda f=dq_pin, a=delta_p, b=dq_p: f(q, k, v, o, do, lse, a, b)))
        if args.pairs:
            calls[f"twice_triton_pinned_{tag}"] = back_to_back(*[calls[f"triton_pinned_{tag}"]] * 2)
    if args.pairs:  # whole backward against its two kernels: back to back in one sample, either order, or twice
        dq_call, dkdv_call = calls["triton_dq"], calls["triton_dkdv"]
        calls.update(pair_dq_dkdv=back_to_back(dq_call, dkdv_call), pair_dkdv_dq=back_to_back(dkdv_call, dq_call),
                     twice_dq=back_to_back(dq_call, dq_call), twice_dkdv=back_to_back(dkdv_call, dkdv_call))
    calls["triton_dkdv"]()
    outs = {"triton": {"dq": dq_t, "dk": dk_t, "dv": dv_t, "delta": delta}}

    def nan(t):
        return torch.full_like(t, float("nan"))

    def try_first(name, first):
        """Run a config once into NaN-filled outputs; a failure is recorded. True if it ran."""
        try:
            outs[name] = first()
            torch.cuda.synchronize()
            return True
        except Exception as exc:  # noqa: BLE001 - a failed config is a result: record it, time the rest
            cell["failed"][name] = f"{type(exc).__name__}: {exc}"[:2000]
            return False

    dkdv_cfgs = [gb.Config(*c) for c in configs]
    for cfg in dkdv_cfgs:
        name = f"gluon_{config_name(cfg)}"
        dk, dv = nan(k), nan(v)
        if try_first(name, lambda cfg=cfg, dk=dk, dv=dv: dict(zip(
                ("dk", "dv"), gb.dkdv(q, k, v, do, lse, delta, causal, cfg, out=(dk, dv)), strict=True))):
            calls[name] = lambda cfg=cfg, dk=dk, dv=dv: gb.dkdv(q, k, v, do, lse, delta, causal, cfg, out=(dk, dv))
            if not args.no_hybrid:
                calls[f"hybrid_{config_name(cfg)}"] = lambda call=calls[name]: (calls["triton_dq"](), call())
    for cfg in (gb.Config(*c) for c in dq_configs):
        name = f"gluon_dq_{config_name(cfg)}"
        dq, dl = nan(q), nan(lse)
        if try_first(name, lambda cfg=cfg, dq=dq, dl=dl: dict(zip(
                ("dq", "delta"), gb.dq(q, k, v, o, do, lse, causal, cfg, out=(dq, dl)), strict=True))):
            calls[name] = lambda cfg=cfg, dq=dq, dl=dl: gb.dq(q, k, v, o, do, lse, causal, cfg, out=(dq, dl))
            if dkdv_cfgs and not args.no_hybrid:
                calls[f"gluon_bwd_{config_name(cfg)}"] = lambda cfg=cfg: gb.flash_attention_backward(
                    q, k, v, o, lse, do, causal, cfg, dkdv_cfgs[0])
    if fused_configs:  # the fused kernel alone writes here (acc's sums unchecked), its accumulator by mode
        q4, k4, v4, do4 = (flash_triton._as_zhnd(t) for t in (q, k, v, do))
        kernel_tensors = {}  # the kernel's arguments, one set per accumulator layout dq_accumulator gives

        def tensors_for(mode):
            acc = gb.dq_accumulator(q, mode)
            key = (tuple(acc.shape), acc.stride())
            if key not in kernel_tensors:
                kernel_tensors[key] = (q4, k4, v4, do4, lse, delta, nan(k).view(k4.shape), nan(v).view(v4.shape),
                                       acc.zero_())
            return kernel_tensors[key]
        group = flash_triton._head_group(causal, q4.shape[0] * q4.shape[1], None)
    for cfg in (gb.Config(*c) for c in fused_configs):
        # the modes this config takes (tma, turns, halves: the ws kernel's only; turns, halves: two consumers;
        # turns-t: two or three, any block_m); add and red are always tried, so a config that cannot run at all is
        # recorded as failed
        modes = [m for m in args.dq_mode or FUSED_DQ_MODES
                 if gb.config_error("fused", q.shape[-1], cfg, dq_mode=m) is None or m in ("add", "red")]
        rotations = (False, True) if args.rotate and cfg.order == "ws" else (False,)
        versions = {"": gb, **({BASE_PREFIX: baseline} if baseline is not None else {})}
        for mode, rot, (prefix, mod) in ((m, r, ver) for m in modes for r in rotations for ver in versions.items()):
            # the whole backward, checked, then its kernel
            name = prefix + f"fused_{config_name(cfg)}" + ("" if mode == "add" else f"_{mode}") + (
                "_rot" if rot else "")
            if try_first(name, lambda cfg=cfg, m=mode, r=rot, mod=mod: dict(zip(("dq", "dk", "dv"), mod.fused_backward(
                    q, k, v, o, lse, do, causal, cfg, dq_mode=m, rotate=r), strict=True))):
                calls[name] = lambda cfg=cfg, m=mode, r=rot, mod=mod: mod.fused_backward(
                    q, k, v, o, lse, do, causal, cfg, dq_mode=m, rotate=r)
                kernel_args = tensors_for(mode)
                calls[name.replace("fused_", "fused_kernel_", 1)] = (
                    lambda cfg=cfg, t=kernel_args, g=group, m=mode, r=rot, mod=mod: mod.launch(
                        "fused", t, causal, cfg, g, m, r))
        if gb.config_error("fused", q.shape[-1], cfg, dq_mode="probe") is None:  # (the red kernel: 64 queries)
            kernel_args = tensors_for("probe")
            for rot in rotations:
                calls[f"fused_probe_{config_name(cfg)}" + ("_rot" if rot else "")] = (
                    lambda cfg=cfg, t=kernel_args, g=group, r=rot: gb.launch("fused", t, causal, cfg, g, "probe", r))
    if fused_configs and q.shape[-1] % 32 == 0:  # the cast alone, plain and putting spread columns back
        acc = torch.randn(q.shape, device="cuda", dtype=torch.float32, generator=gen)
        calls["cast_dq"] = lambda: gb.cast_dq(acc, q)
        calls["cast_dq_spread"] = lambda: gb.cast_dq(acc, q, True)
    pairs = [(t.reshape(-1, t.shape[-2], t.shape[-1])) for t in (q, k, v, do)]
    for zh in (0, pairs[0].shape[0] - 1):
        ref = dict(zip(("dq", "dk", "dv"), reference_grads(*(t[zh] for t in pairs), causal), strict=True))
        for name, grads in outs.items():
            mine = {g: t.reshape(-1, t.shape[-2], t.shape[-1])[zh] for g, t in grads.items() if g != "delta"}
            cell["errors"].setdefault(name, {})[str(zh)] = row_errors(mine, ref)
        del ref
    for name, grads in outs.items():
        if name != "triton":
            for g, t in grads.items():
                diff = (t.float() - outs["triton"][g].float()).abs().max().item()
                cell["errors"][name][f"{g}_max_diff_vs_triton"] = diff
    for backend in args.sdpa:
        calls[f"sdpa_{backend}"] = _sdpa_call(backend, "bwd", q, k, v, do, causal)
        if args.pairs:
            calls[f"twice_sdpa_{backend}"] = back_to_back(*[calls[f"sdpa_{backend}"]] * 2)
    best = time_cell(cell, calls, args)
    cell["dkdv_speedup_vs_triton"] = {n: best["triton_dkdv"] / t for n, t in best.items()
                                      if n.startswith(("gluon_", "triton_pinned_dkdv"))
                                      and not n.startswith(("gluon_dq_", "gluon_bwd_"))}
    cell["dq_speedup_vs_triton"] = {n: best["triton_dq"] / t for n, t in best.items()
                                    if n.startswith(("gluon_dq_", "triton_pinned_dq"))}
    whole = ("hybrid_", "gluon_bwd_", "fused_", "pinned_bwd_")
    cell["bwd_speedup_vs_triton"] = {n: best["triton_bwd"] / t for n, t in best.items() if n.startswith(whole)}
    for backend in args.sdpa:
        cell[f"bwd_speedup_vs_sdpa_{backend}"] = {n: best[f"sdpa_{backend}"] / t for n, t in best.items()
                                                  if n.startswith((*whole, "triton_bwd", BASE_PREFIX))}
    if baseline is not None:
        cell["speedup_vs_baseline"] = speedups_vs_baseline(best)
    print(shape, causal, {n: round(t, 4) for n, t in best.items()}, flush=True)
    print("  errors:", {n: {kk: (round(vv, 5) if isinstance(vv, float) else vv) for kk, vv in e.items()
                            if "diff" in kk} for n, e in cell["errors"].items()}, flush=True)
    return cell


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", type=parse_config, default=None,
                    metavar="BM,BN,STAGES,WARPS[,ORDER][,rN]",
                    help=f"a Gluon config (repeatable; default {' '.join(map(config_name, CONFIGS))})")
    ap.add_argument("--dq-config", action="append", type=parse_config, default=None,
                    metavar="BM,BN,STAGES,WARPS[,ORDER][,rN]",
                    help=f"a Gluon dQ config (repeatable; default {' '.join(map(config_name, DQ_CONFIGS))})")
    ap.add_argument("--pin", action="append", type=parse_pin, default=[], metavar="KERNEL=BM,BN,WARPS,STAGES",
                    help="also time Triton's kernel (dkdv or dq) at this config, and the whole backward with it, "
                         "each in a plan of its own (repeatable)")
    ap.add_argument("--no-hybrid", action="store_true", help="time the kernels alone, not the hybrid backwards")
    ap.add_argument("--fused-config", action="append", type=parse_config, default=[],
                    metavar="BM,BN,STAGES,WARPS[,ORDER][,rN]",
                    help="also time the fused backward at this config (repeatable; ORDER overlap, defer, ws or ws-p, "
                         "ws persistent)")
    ap.add_argument("--dq-mode", action="append", choices=FUSED_DQ_MODES, default=None,
                    help=f"with --fused-config: only these ways of adding dQ (repeatable; default every one the "
                         f"config takes of {', '.join(FUSED_DQ_MODES)})")
    ap.add_argument("--rotate", action="store_true",
                    help="with --fused-config ...,ws: also time each mode with the non-causal programs each starting "
                         "at their own query tile (names with _rot)")
    ap.add_argument("--pairs", action="store_true",
                    help="also time the Triton kernels back to back in one sample (pair_dq_dkdv as the backward "
                         "runs them, pair_dkdv_dq, twice_dq, twice_dkdv) and each SDPA backward twice")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another kernels/flash_gluon_bwd.py: its fused backward at every --fused-config and mode "
                         "too (base_fused_...)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    check_run_args(ap, args)
    if args.baseline is not None and not args.fused_config:
        ap.error("--baseline compares the fused backward: give it a --fused-config")
    baseline = load_baseline(ap, args.baseline, "flash_gluon_bwd_baseline", ("fused_backward", "launch"),
                             "flash_gluon_bwd")
    require_gpu(ap)
    from kernels import flash_triton
    from worker.harness import fingerprint

    out = Path(args.out)
    configs = args.config or CONFIGS
    report = {"kind": "flash_gluon_bwd_ab", **fingerprint(args.commit), "configs": [list(c) for c in configs],
              "dq_configs": [list(c) for c in args.dq_config or DQ_CONFIGS],
              "fused_configs": [list(c) for c in args.fused_config], "rotate": args.rotate,
              "baseline": str(args.baseline) if args.baseline else None,
              "sdpa": args.sdpa, "rounds": args.rounds, "repeats": args.repeats, "head_start": args.head_start,
              "sustain_ms": args.sustain_ms,
              "speedup_of": "median of rounds" if args.sustain_ms is not None else "best round", "cells": []}
    for shape, causal in args.shape or SHAPES:
        record_cell(report, measure_shape(shape, causal, configs, args.dq_config or DQ_CONFIGS, args,
                                          tuple(args.fused_config), baseline), out)
    report["triton_autotuned"] = flash_triton.autotuned_configs()
    write_report(report, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
