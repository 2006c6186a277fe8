"""Host cost of the flash kernel's launch path, and the CS336 leaderboard shape timed as the course does.

Host time: the wall clock of N calls issued back to back with no synchronisation, divided by N, while
a sleep kernel holds the GPU, so it is what Python and the launches cost the CPU per call and never
the GPU's pace (see host_us). A shared host's noise comes in bursts that move a sample by tens of
percent, so the samples are short and taken in turns across implementations (interleaved_samples),
and each cell reports the median, the 10th percentile and the ratio to SDPA flash with a bootstrap
interval (host_summary).
GPU time: CUDA events around the same call (worker.harness.measure). When host time exceeds GPU
time the call is host-bound: the GPU idles between kernels. SDPA's backends are measured beside
the kernel, alternating implementation per round in one process; with --baseline another
kernels/flash_triton.py (e.g. the previous launcher, `git show REV:kernels/flash_triton.py`) joins
the rotation.

    python -m benchmarks.flash_host_time --out host.json [--baseline /tmp/flash_old.py] [--leaderboard]

--parts times each piece of the path (launchers, autograd, SDPA beside) on one shape (--parts-shape) and
writes cProfiles of the backward on a stride-0 dO next to --out, as shipped and with the dO copied: where
the host time goes. Its last pieces take apart the launcher's extra cost inside `.backward()`: on a
plain thread, handed to a thread once per call (the engine's pattern), and with both threads on one CPU.
On a machine with no GPU it runs under the interpreter in fp32, which checks the script, not the numbers.

--leaderboard adds the course's leaderboard test: q, k, v (16, 16384, 64) bf16 causal, unpacked from
one (3, ...) leaf as the test makes them (--leaderboard-inputs leaves: three leaves),
triton.testing.do_bench of `o = attn(q, k, v, True); o.sum().backward()` with the flash apply wrapped
in torch.compile (and eager), beside SDPA's cuDNN and flash backends, rounds alternated. --leaderboard-profile N
lists every GPU kernel of that step per implementation (device time per step over N profiled steps).
--leaderboard-variant NAME:ITEM[+ITEM...] joins the rotation with the eager apply and those kernels pinned
(KERNEL=BM,BN,WARPS,STAGES) or LaunchOptions set (head_group=1, bwd_head_group=8): which tiles and grid
orders win under the course's sustained load, where the chip runs at its power limit, rather than in
the autotuner's short bursts.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks.flash_ab import parse_shape, write_report

# (batch, heads, seq, d), causal: the shapes of the host-overhead table, then mid-size ones
SHAPES = [((1, 16, 128, 64), True), ((1, 16, 1024, 64), True), ((4, 16, 1024, 64), True),
          ((1, 16, 4096, 64), True), ((8, 32, 512, 128), True), ((4, 16, 2048, 128), False)]
LEADERBOARD_SHAPE = (16, 16384, 64)


def synchronize() -> None:
    """Wait for the GPU, where there is one."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def hold_gpu(calls: int):
    """Queue a sleep kernel that outlasts `calls` calls issued from now (~2 ms a call at the H200's ~2 GHz)
    once the GPU is idle; returns an event recorded after it (done once the sleep has ended). With no GPU
    (the interpreter, for checking a script) there is nothing to hold: None."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda._sleep(calls * 4_000_000)
    held = torch.cuda.Event()
    held.record()
    return held


def host_us(fn, calls: int) -> float:
    """Microseconds of CPU time per call: `calls` calls with no synchronisation between them.

    A sleep kernel sized to outlast the calls is queued first, so no call waits for the GPU: without
    it, work queued faster than the GPU drains fills the launch queue and the host then waits at the
    GPU's pace (the figure would read GPU time). Returns nan when the sleep ended before the calls did
    (the host may have waited); keep `calls` x launches per call well under the queue's ~1000.
    """
    held = hold_gpu(calls)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    waited = held is not None and held.query()
    synchronize()
    return float("nan") if waited else (t1 - t0) / calls * 1e6


def kept(xs: list[float]) -> list[float]:
    """The samples that are not nan (host_us's mark of a sample that waited for the GPU)."""
    return [x for x in xs if x == x]


def median_kept(xs: list[float]) -> float:
    """Median of the kept samples (nan when none is)."""
    xs = kept(xs)
    return statistics.median(xs) if xs else float("nan")


def implementations(baseline):
    """name -> attention callable (q, k, v, causal) -> out."""
    from kernels.impls import get_attention

    impls = {"flash_triton": get_attention("flash_triton"), "sdpa_flash": get_attention("sdpa_flash"),
             "sdpa_cudnn": get_attention("sdpa_cudnn")}
    if baseline is not None:
        impls["flash_baseline"] = lambda q, k, v, c: baseline.FlashAttentionTriton.apply(q, k, v, c)
    return impls


def interleaved_samples(fns: dict, samples: int, calls: int, timer=None) -> dict[str, list[float]]:
    """`samples` host-time samples of each callable, taken in turns (A B C, B C A, C A B, ...): the host's
    bursts of noise (other tenants, frequency changes) then fall on every implementation alike instead
    of on whichever one a round happened to time during a burst. `timer(fn, calls)` defaults to host_us."""
    from worker.harness import turn_order

    timer = timer or host_us
    names = list(fns)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(samples):
        for name in turn_order(names, i):
            out[name].append(timer(fns[name], calls))
    return out


def host_summary(samples: dict[str, list[float]], reference: str) -> dict[str, dict]:
    """Per implementation: median, 10th percentile (the floor a call reaches when the host is quiet) and
    the number of samples kept; beside `reference`, the ratio of medians with a 95 % bootstrap interval."""
    import numpy as np

    from worker.stats import ratio_interval

    good = {name: kept(xs) for name, xs in samples.items()}
    out = {}
    for name, xs in good.items():
        row = {"median": median_kept(xs), "p10": float(np.percentile(xs, 10)) if xs else float("nan"),
               "kept": len(xs)}
        if name != reference and xs and good.get(reference):
            ratio, lo, hi = ratio_interval(good[reference], xs)
            row[f"vs_{reference}"] = {"ratio": ratio, "low": lo, "high": hi}
        out[name] = row
    return out


def measure_cell(impls, shape, causal, rounds: int, calls: int, repeats: int, samples: int) -> dict:
    """Host time (interleaved samples) and GPU time (CUDA events, rounds alternated) of each implementation
    on one shape; an implementation that cannot run the shape is recorded with its error."""
    import torch

    from worker.harness import measure

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))

    def clear():
        q.grad = k.grad = v.grad = None

    cell = {"shape": list(shape), "causal": causal, "calls": calls, "impls": {}}
    passes: dict[str, dict] = {"fwd": {}, "fwd_bwd": {}}
    for name, fn in impls.items():
        def fwd(fn=fn):
            with torch.no_grad():
                fn(q, k, v, causal)

        def fwd_bwd(fn=fn):
            fn(q, k, v, causal).sum().backward()

        try:
            fwd(), fwd_bwd(), clear()  # compile / autotune / plan before anything is timed
        except RuntimeError as exc:  # a backend that cannot run this shape
            cell["impls"][name] = {"error": str(exc).splitlines()[0]}
            continue
        passes["fwd"][name], passes["fwd_bwd"][name] = fwd, fwd_bwd
        cell["impls"][name] = {"fwd_gpu_ms": [], "fwd_bwd_gpu_ms": []}  # host samples join below
    for pass_, fns in passes.items():
        for name, xs in interleaved_samples(fns, samples, calls).items():
            cell["impls"][name][f"{pass_}_host_us"] = xs
        clear()
    for _ in range(rounds):
        for name in passes["fwd"]:
            row = cell["impls"][name]
            row["fwd_gpu_ms"].append(measure(passes["fwd"][name], warmup=3, repeats=repeats, device="cuda").median_ms)
            row["fwd_bwd_gpu_ms"].append(measure(passes["fwd_bwd"][name], warmup=3, repeats=repeats, device="cuda",
                                                 setup=clear).median_ms)
    reference = "sdpa_flash" if "sdpa_flash" in passes["fwd"] else None
    for pass_ in passes:
        samples_of = {name: cell["impls"][name][f"{pass_}_host_us"] for name in passes[pass_]}
        cell[f"{pass_}_host"] = host_summary(samples_of, reference) if reference else {}
    for name in passes["fwd"]:
        row = cell["impls"][name]
        for metric in list(row):
            row[f"{metric}_median"] = median_kept(row[metric])
        row["host_bound_fwd_bwd"] = row["fwd_bwd_host_us_median"] / 1e3 > row["fwd_bwd_gpu_ms_median"]
    return cell


LEADERBOARD_INPUTS = ("course", "leaves")


def leaderboard_inputs(form: str):
    """q, k, v of the leaderboard shape, bf16, requiring grad.

    "course": as the CS336 test makes them, `torch.randn(3, 16, 16384, 64, requires_grad=True)` unpacked,
    so the three are views of one leaf: every backward stacks dq, dk, dv into that leaf's (3, ...)
    gradient and adds it to the one before (the test never clears it). "leaves": three leaves of
    their own, whose gradients also accumulate but without the stack.
    """
    import torch

    if form not in LEADERBOARD_INPUTS:
        raise ValueError(f"leaderboard inputs must be one of {LEADERBOARD_INPUTS}, not {form!r}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    if form == "course":
        q, k, v = torch.randn((3, *LEADERBOARD_SHAPE), device="cuda", dtype=torch.bfloat16, generator=gen,
                              requires_grad=True)
        return q, k, v
    return tuple(torch.randn(LEADERBOARD_SHAPE, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
                 for _ in range(3))


def parse_leaderboard_variant(text: str) -> tuple[str, dict]:
    """"big:fwd=256,64,8,3+dq=256,64,8,3+bwd_head_group=1" -> ("big", {"pinned": {"fwd": (256, 64, 8, 3),
    "dq": (256, 64, 8, 3)}, "bwd_head_group": 1}): a name and that version's LaunchOptions, joined by '+':
    kernels pinned as flash_ab's KERNEL=BM,BN,WARPS,STAGES[,MAXNREG], and flash_ab's options (head_group=4)."""
    from benchmarks.flash_ab import parse_options, parse_pin
    from kernels.names import FLASH_KERNELS

    name, colon, items = text.partition(":")
    if not colon or not name.isidentifier() or name.startswith(("flash_triton", "sdpa")) or not items:
        raise argparse.ArgumentTypeError(
            f"variant {text!r}: want NAME:ITEM[+ITEM...], each ITEM KERNEL=BM,BN,WARPS,STAGES or OPTION=VALUE, "
            "NAME a word not starting flash_triton or sdpa")
    options: dict = {"pinned": {}}
    for item in items.split("+"):
        if item.partition("=")[0] in FLASH_KERNELS:
            options["pinned"].update([parse_pin(item)])
        else:
            options.update(parse_options(item))
    return name, options


def leaderboard_steps(form: str, variants: dict[str, dict] | None = None) -> dict:
    """{implementation: step()}: the course's timed function, `o = attn(q, k, v, True); o.sum().backward()`,
    with benchlab's apply under torch.compile (as the test wraps it) and eager, beside SDPA's cuDNN and
    flash backends. `variants` ({name: {kernel: config numbers}}) adds the eager apply with those kernels
    pinned: compare a variant with "flash_triton_eager"."""
    import torch

    from benchmarks.flash_ab import launch_options
    from kernels import flash_triton
    from kernels.flash_triton import FlashAttentionTriton
    from kernels.impls import get_attention

    q, k, v = leaderboard_inputs(form)
    impls = {"flash_triton_compiled": torch.compile(FlashAttentionTriton.apply),
             "flash_triton_eager": FlashAttentionTriton.apply,
             "sdpa_cudnn": get_attention("sdpa_cudnn"), "sdpa_flash": get_attention("sdpa_flash")}
    for name, variant in (variants or {}).items():
        options = launch_options(flash_triton, variant)
        impls[name] = lambda q, k, v, causal, options=options: FlashAttentionTriton.apply(q, k, v, causal, "tf32",
                                                                                           options)

    def step_of(fn):
        def step():
            o = fn(q, k, v, True)
            o.sum().backward()
        return step
    return {name: step_of(fn) for name, fn in impls.items()}


def leaderboard(rounds: int, rep_ms: int, form: str = "course", variants: dict[str, dict] | None = None) -> dict:
    """The course's leaderboard timing: do_bench of each step, implementations in turns per round (the first
    rotating, benchmarks.flash_sustained.do_bench_turns), with every sample and the median SM clock and power draw
    nvidia-smi saw during each do_bench (variants: leaderboard_steps). `ms` is do_bench's default return, the
    mean, as the course reads it."""
    import torch

    from benchmarks.flash_sustained import do_bench_turns
    from kernels.flash_triton import autotuned_configs

    steps = leaderboard_steps(form, variants)
    for step in steps.values():  # compile, autotune and plan before the first round, whose clock and power
        step()                   # medians would otherwise take in the compile's idle seconds
    torch.cuda.synchronize()
    timed = do_bench_turns(steps, rounds, rep_ms, warmup_ms=max(rep_ms // 10, 25))
    return {"autotuned": autotuned_configs(),  # the tiles the unpinned steps ran
            "shape": list(LEADERBOARD_SHAPE), "dtype": "bf16", "causal": True, "inputs": form, "rep_ms": rep_ms,
            "variants": variants or {}, "order": timed["order"], "ms": timed["mean_ms"],
            "sample_median_ms": timed["median_ms"], "samples": timed["samples"],
            "sm_clock_mhz_median": timed["sm_clock_mhz"], "power_w_median": timed["power_w"], "chip": timed["chip"],
            "median_ms": {name: statistics.median(xs) for name, xs in timed["mean_ms"].items()}}


def leaderboard_profile(iters: int, form: str = "course", rounds: int = 1) -> dict:
    """Every GPU kernel of one leaderboard step, per implementation, in turns over `rounds`: the
    profiler's device time per step of each kernel over `iters` steps a round, each after an L2 flush
    as do_bench does (the flush itself is left out); per step the span from the flush's end to the last
    kernel's end and the GPU's idle time inside it (a host that falls behind shows there); and the host's
    time to issue one step. Answers where one implementation's step spends time another's does not."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.flash_timeline import timeline
    from worker.harness import L2Flusher
    from worker.profiling import chrome_trace

    steps = leaderboard_steps(form)
    flush = L2Flusher("cuda")
    for step in steps.values():
        for _ in range(5):  # compile, autotune and plan before anything is recorded
            step()
    torch.cuda.synchronize()
    rows: dict[str, list[dict]] = {name: [] for name in steps}
    host: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(iters):
                    flush()
                    step()
                torch.cuda.synchronize()
            trace = timeline(chrome_trace(prof), iters, is_flush=lambda e: L2Flusher.is_flush_kernel(e["name"]))
            rows[name] += trace["iterations"]
            host[name].append(host_us(step, 10))
    out = {"shape": list(LEADERBOARD_SHAPE), "inputs": form, "iters": iters, "rounds": rounds, "impls": {}}
    for name, its in rows.items():
        kernels: dict[str, dict] = {}
        for it in its:
            for k in it["kernels"]:
                row = kernels.setdefault(k["name"], {"us_per_step": 0.0, "calls_per_step": 0.0})
                row["us_per_step"] += k["dur_us"] / len(its)
                row["calls_per_step"] += 1 / len(its)
        out["impls"][name] = {
            "span_us_median": statistics.median(it["span_us"] for it in its),
            "kernel_us_median": statistics.median(it["kernel_us"] for it in its),
            "idle_us_median": statistics.median(it["idle_us"] for it in its),
            "first_kernel_start_us_median": statistics.median(it["kernels"][0]["start_us"]
                                                              for it in its if it["kernels"]),
            "host_us_per_step": host[name],
            "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us_per_step"]))}
    return out


@contextlib.contextmanager
def on_cpu(cpu: int | None):
    """Run the calling thread on CPU `cpu` alone inside the block (None: leave it where it is)."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)  # pid 0: this thread
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pinning(fn, cpu: int | None):
    """`fn`, which first moves the thread that calls it onto CPU `cpu` (None: onto every CPU this process
    may use), so a thread we do not start (the autograd engine's) can be placed from inside a call."""
    where = set(os.sched_getaffinity(0)) if cpu is None else {cpu}

    def call(*args, **kwargs):
        if os.sched_getaffinity(0) != where:
            os.sched_setaffinity(0, where)
        return fn(*args, **kwargs)
    return call


def handed_off_us(call, between, n: int, cpu: int | None = None) -> list[float]:
    """Microseconds of each of `n` calls of `call` on a worker thread that the calling thread wakes once per
    call, after running `between` itself, and then waits for: the pattern of the autograd engine, which
    runs a CUDA backward on a device thread of its own while the caller waits. `cpu`: both threads on
    that one CPU (the handoff then never crosses cores)."""
    import queue

    todo: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()
    times: list[float] = []

    def worker():
        with on_cpu(cpu):
            while todo.get():
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e6)
                done.put(None)
    thread = threading.Thread(target=worker)
    with on_cpu(cpu):
        thread.start()
        for _ in range(n):
            between()
            todo.put(True)
            done.get()
        todo.put(False)
        thread.join()
    return times


def parts_inputs(shape, causal: bool, device: str) -> SimpleNamespace:
    """q, k, v (leaves, bf16 on a GPU, fp32 for the CPU's interpreter), the forward's o and lse, a dO, and
    the stride-0 dO that `o.sum().backward()` passes."""
    import torch

    from kernels import flash_triton as ft

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    with torch.no_grad():
        o, lse = ft.flash_attention_forward(q, k, v, causal)
    return SimpleNamespace(q=q, k=k, v=v, o=o, lse=lse, causal=causal, do=torch.randn_like(o),
                           do_expanded=torch.ones((), device=device, dtype=o.dtype).expand(o.shape))


def parts_pieces(x: SimpleNamespace) -> dict:
    """name -> a call of one piece of the launch path on the inputs x (parts_inputs), SDPA's beside."""
    import torch

    from kernels import flash_triton as ft

    q, k, v, o, lse, do, causal = x.q, x.k, x.v, x.o, x.lse, x.do, x.causal
    sdpa = torch.nn.functional.scaled_dot_product_attention

    class Identity(torch.autograd.Function):  # a Python autograd node that does no work: the engine's share
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad

    def nograd(fn):
        def call():
            with torch.no_grad():
                fn()
        return call

    pointer = ft.LaunchOptions(tma=False)  # the same kernels with pointer loads: no in-kernel descriptors
    copy_all = ft.LaunchOptions(copy_grad_min_work=0)  # a stride-0 dO copied contiguous whatever its size
    return {
        "forward_launcher": nograd(lambda: ft.flash_attention_forward(q, k, v, causal)),
        "apply_no_grad": nograd(lambda: ft.FlashAttentionTriton.apply(q, k, v, causal)),
        "apply_with_graph": lambda: ft.FlashAttentionTriton.apply(q, k, v, causal),
        "backward_launcher": lambda: ft.flash_attention_backward(q, k, v, o, lse, do, causal),
        "backward_launcher_expanded_grad": lambda: ft.flash_attention_backward(q, k, v, o, lse, x.do_expanded, causal),
        "backward_launcher_expanded_grad_copied": lambda: ft.flash_attention_backward(
            q, k, v, o, lse, x.do_expanded, causal, options=copy_all),
        "expanded_grad_contiguous": lambda: x.do_expanded.contiguous(),
        "copy_decision": lambda: ft._copies_grad(q, k, x.do_expanded, causal, copy_all),
        "tma_ready_q": lambda: ft._tma_ready(ft._as_zhnd(q)),
        "backward_launcher_no_grad": nograd(lambda: ft.flash_attention_backward(q, k, v, o, lse, do, causal)),
        "fwd_bwd": lambda: ft.FlashAttentionTriton.apply(q, k, v, causal).sum().backward(),
        "fwd_bwd_copied": lambda: ft.FlashAttentionTriton.apply(q, k, v, causal, "tf32", copy_all).sum().backward(),
        "fwd_bwd_given_grad": lambda: ft.FlashAttentionTriton.apply(q, k, v, causal).backward(do),
        "backward_launcher_pointer_loads": lambda: ft.flash_attention_backward(q, k, v, o, lse, do, causal,
                                                                               options=pointer),
        "fwd_bwd_given_grad_pointer_loads": lambda: ft.FlashAttentionTriton.apply(q, k, v, causal, "tf32",
                                                                                  pointer).backward(do),
        "clone_sum_backward": lambda: q.clone().sum().backward(),
        "identity_function_sum_backward": lambda: Identity.apply(q).sum().backward(),
        "sdpa_forward": nograd(lambda: sdpa(q, k, v, is_causal=causal)),
        "sdpa_fwd_bwd": lambda: sdpa(q, k, v, is_causal=causal).sum().backward(),
        "sdpa_fwd_bwd_given_grad": lambda: sdpa(q, k, v, is_causal=causal).backward(do),
        "empty_like_x4": lambda: [torch.empty_like(q) for _ in range(4)],
    }


def pieces_us(pieces: dict, names, rounds: int, calls: int) -> dict[str, list[float]]:
    """Host µs per call of each named piece, one sample a round, the pieces in turn within a round."""
    out: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            out[name].append(host_us(pieces[name], calls))
    return out


@contextlib.contextmanager
def backward_launcher_wrapped(wrap):
    """Inside the block the kernel's backward launcher is wrap(launcher), wherever it is called from (the
    autograd engine's thread included); afterwards it is the module's own again."""
    from kernels import flash_triton as ft

    launcher = ft.flash_attention_backward
    ft.flash_attention_backward = wrap(launcher)
    try:
        yield
    finally:
        ft.flash_attention_backward = launcher


def timing_into(times: list[float]):
    """A wrap for backward_launcher_wrapped: each call's µs is appended to `times`."""
    def wrap(fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times.append((time.perf_counter() - t0) * 1e6)
        return timed
    return wrap


def launcher_on_a_thread_us(launch, n: int) -> list[float]:
    """µs of each of n calls of `launch` on a plain thread of its own, the GPU held busy meanwhile: does
    the engine's thread alone make the launcher slower? The thread's first, cold call is left out."""
    times: list[float] = []

    def on_thread():
        for _ in range(n):
            t0 = time.perf_counter()
            launch()
            times.append((time.perf_counter() - t0) * 1e6)
    worker = threading.Thread(target=on_thread)
    hold_gpu(n)
    worker.start()
    worker.join()
    synchronize()
    return times[1:]


def engine_on_one_cpu_us(pieces: dict, names, rounds: int, calls: int, cpu: int) -> tuple[dict, list[float]]:
    """Whole calls (the named pieces, in turns) with the caller and the autograd engine's device thread both
    on `cpu`, and the backward launcher's own µs inside the engine so; afterwards the engine's thread is
    back on every CPU. The first whole call, which moves the engine's thread, is not timed."""
    inside: list[float] = []
    try:
        with backward_launcher_wrapped(lambda fn: pinning(timing_into(inside)(fn), cpu)), on_cpu(cpu):
            pieces["fwd_bwd"]()  # the engine's thread is on `cpu` from here on
            whole = pieces_us(pieces, names, rounds, calls)
    finally:
        with backward_launcher_wrapped(lambda fn: pinning(fn, None)):
            pieces["fwd_bwd"]()  # the engine's thread back on every CPU
    synchronize()
    return {f"{name}_same_cpu": xs for name, xs in whole.items()}, inside[1:]


def profile_backward(pieces: dict, calls: int, profile_path: Path) -> None:
    """cProfiles of the backward on the stride-0 dO, as shipped at this shape and copied contiguous, beside
    profile_path (`.prof.txt`, `.copied.prof.txt`): where its host time goes."""
    import cProfile
    import pstats

    for suffix, names in (("", ("backward_launcher_expanded_grad", "fwd_bwd")),
                          (".copied", ("backward_launcher_expanded_grad_copied", "fwd_bwd_copied"))):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            for name in names:
                pieces[name]()
        prof.disable()
        synchronize()
        with open(profile_path.with_name(profile_path.name.replace(".prof", f"{suffix}.prof")), "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(40)


def parts(shape, causal: bool, calls: int, rounds: int, profile_path: Path | None) -> dict:
    """Host microseconds per call of each piece of the flash kernel's forward and backward, beside SDPA,
    and (profile_path) cProfiles of the backward: where a forward+backward's host time goes. On a machine
    with no GPU the interpreter runs it (fp32), which checks the script, not the numbers.

    After the pieces, the backward launcher's extra cost inside `.backward()`, taken apart: the launcher
    as the engine calls it; on a plain thread; handed to a woken thread once per call while the caller runs
    a forward in between (the engine's pattern without the engine), free and with both threads on one CPU;
    and the engine itself, with whole calls (this kernel's and SDPA's), with its device thread on the
    caller's CPU."""
    import torch

    from kernels import flash_triton as ft

    x = parts_inputs(shape, causal, "cuda" if torch.cuda.is_available() else "cpu")
    pieces = parts_pieces(x)
    for fn in pieces.values():  # compile, autotune and plan first
        fn()
    us = pieces_us(pieces, list(pieces), rounds, calls)
    inside: list[float] = []
    with backward_launcher_wrapped(timing_into(inside)):
        pieces_us(pieces, ["fwd_bwd"], rounds, calls)
    us["backward_launcher_inside_engine"] = inside

    def forward():
        with torch.no_grad():
            ft.flash_attention_forward(x.q, x.k, x.v, causal)

    def backward():
        ft.flash_attention_backward(x.q, x.k, x.v, x.o, x.lse, x.do, causal)
    n = rounds * calls
    us["backward_launcher_on_a_thread"] = launcher_on_a_thread_us(backward, n)
    hold_gpu(2 * n)
    us["backward_launcher_handed_off"] = handed_off_us(backward, forward, n)[1:]
    cpu = min(os.sched_getaffinity(0))
    hold_gpu(2 * n)
    us["backward_launcher_handed_off_same_cpu"] = handed_off_us(backward, forward, n, cpu=cpu)[1:]
    synchronize()
    same_cpu = ("fwd_bwd", "sdpa_fwd_bwd", "fwd_bwd_given_grad", "sdpa_fwd_bwd_given_grad")
    whole, launched = engine_on_one_cpu_us(pieces, same_cpu, rounds, calls, cpu)
    us.update(whole)
    us["backward_launcher_inside_engine_same_cpu"] = launched
    if profile_path is not None:
        profile_backward(pieces, calls, profile_path)
    return {"shape": list(shape), "causal": causal, "calls": calls, "us": us,
            "median_us": {name: median_kept(xs) for name, xs in us.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--baseline", type=Path, default=None, help="another flash_triton.py to alternate with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=20, help="calls per host-time sample")
    ap.add_argument("--samples", type=int, default=15,
                    help="host-time samples per implementation and pass, taken in turns across implementations")
    ap.add_argument("--repeats", type=int, default=30, help="CUDA-event samples per GPU-time measurement")
    ap.add_argument("--leaderboard", action="store_true")
    ap.add_argument("--leaderboard-rep-ms", type=int, default=2000)
    ap.add_argument("--leaderboard-only", action="store_true", help="time the leaderboard shape and nothing else")
    ap.add_argument("--leaderboard-inputs", choices=LEADERBOARD_INPUTS, default="course",
                    help="q, k, v as the course's test makes them (views of one leaf) or as three leaves")
    ap.add_argument("--leaderboard-variant", action="append", type=parse_leaderboard_variant, default=[],
                    metavar="NAME:KERNEL=BM,BN,WARPS,STAGES[,MAXNREG]|OPTION=VALUE[+...]",
                    help="also time the eager apply with these kernels pinned and options set")
    ap.add_argument("--leaderboard-profile", type=int, default=0, metavar="N",
                    help="also list every GPU kernel of the leaderboard step, per implementation, over N steps")
    ap.add_argument("--parts", action="store_true",
                    help="time each piece of the launch path on one shape (and cProfile the backward) instead")
    ap.add_argument("--parts-shape", type=parse_shape, default=(SHAPES[1][0], SHAPES[1][1]), metavar="B,H,S,D[,causal]",
                    help="the shape --parts times (default 1,16,1024,64,causal)")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)

    from benchmarks.flash_ab import load_module
    from worker.harness import fingerprint

    if args.parts:
        shape, causal = args.parts_shape
        args.out.parent.mkdir(parents=True, exist_ok=True)  # the cProfiles are written beside it first
        report = {"kind": "flash_host_parts", **fingerprint(args.commit),
                  **parts(shape, causal, args.calls, args.rounds, args.out.with_suffix(".prof.txt"))}
        print(json.dumps(report["median_us"]), file=sys.stderr, flush=True)
        write_report(report, args.out)
        return 0
    names = [name for name, _ in args.leaderboard_variant]
    if len(set(names)) != len(names):
        ap.error(f"--leaderboard-variant names must differ, got {names}")
    baseline = load_module(args.baseline) if args.baseline else None
    impls = implementations(baseline)
    report = {"kind": "flash_host_time", **fingerprint(args.commit), "rounds": args.rounds,
              "samples": args.samples, "calls": args.calls, "cells": []}
    for shape, causal in [] if args.leaderboard_only else SHAPES:
        cell = measure_cell(impls, shape, causal, args.rounds, args.calls, args.repeats, args.samples)
        report["cells"].append(cell)
        brief = {n: (r.get("fwd_host_us_median"), r.get("fwd_bwd_host_us_median"), r.get("fwd_bwd_gpu_ms_median"))
                 for n, r in cell["impls"].items()}
        ratios = {n: r.get("vs_sdpa_flash", {}).get("ratio") for n, r in cell.get("fwd_bwd_host", {}).items()}
        print(json.dumps({"shape": shape, "causal": causal, "fwd_us/fwd_bwd_us/fwd_bwd_gpu_ms": brief,
                          "fwd_bwd_host_vs_sdpa_flash": ratios}), file=sys.stderr, flush=True)
        write_report(report, args.out)  # after every cell: a run stopped by its time limit keeps what it finished
    if args.leaderboard or args.leaderboard_only:
        report["leaderboard"] = leaderboard(args.rounds, args.leaderboard_rep_ms, args.leaderboard_inputs,
                                            dict(args.leaderboard_variant))
        print(json.dumps(report["leaderboard"]["median_ms"]), file=sys.stderr, flush=True)
        write_report(report, args.out)
    if args.leaderboard_profile:
        report["leaderboard_profile"] = leaderboard_profile(args.leaderboard_profile, args.leaderboard_inputs,
                                                            args.rounds)
        print(json.dumps({n: {k: r[k] for k in ("span_us_median", "kernel_us_median", "idle_us_median")}
                          for n, r in report["leaderboard_profile"]["impls"].items()}), file=sys.stderr, flush=True)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
