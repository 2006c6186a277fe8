"""Measurement harness: timers, peak memory, OOM classification and the environment fingerprint.

Rules (docs/architecture.md, "Measuring"): warm up first, synchronise at the timing boundaries (CUDA events
on GPU, a monotonic clock on CPU), repeat, report the median with p20/p80 and the sample count.
torch is imported inside the functions so that the torch-free parts of the worker stay light.
"""
from __future__ import annotations

import functools
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Timing:
    """Summary of repeated timings, milliseconds, with the raw samples in the order they were taken
    (kept in every result, so intervals and comparisons can be computed afterwards)."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    samples: int
    samples_ms: list[float]
    # the host's own time per sample: wall clock of issuing fn, no synchronisation (CUDA only)
    host_median_ms: float | None = None
    host_samples_ms: list[float] | None = None

    @classmethod
    def from_samples(cls, samples_ms: list[float], host_samples_ms: list[float] | None = None) -> "Timing":
        if not samples_ms:
            raise ValueError("no timing samples")
        xs = sorted(samples_ms)
        return cls(
            median_ms=statistics.median(xs),
            p20_ms=quantile(xs, 0.2),
            p80_ms=quantile(xs, 0.8),
            mean_ms=statistics.fmean(xs),
            std_ms=statistics.pstdev(xs) if len(xs) > 1 else 0.0,
            min_ms=xs[0],
            samples=len(xs),
            samples_ms=[float(x) for x in samples_ms],
            host_median_ms=statistics.median(host_samples_ms) if host_samples_ms else None,
            host_samples_ms=[float(x) for x in host_samples_ms] if host_samples_ms else None,
        )

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}

    @classmethod
    def pooled(cls, parts: list["Timing"]) -> "Timing":
        """One Timing of several runs' samples, in the order the runs were taken."""
        host = [x for t in parts for x in (t.host_samples_ms or [])]
        return cls.from_samples([x for t in parts for x in t.samples_ms], host or None)


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


class L2Flusher:
    """Writes a buffer larger than the L2 between CUDA samples so each starts cold, as do_bench does."""

    def __init__(self, device):
        import torch

        self.buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()

    @staticmethod
    def is_flush_kernel(name: str) -> bool:
        """Whether a profiled GPU kernel is this flush: ATen's fill of an int32 buffer (FillFunctor<int>),
        which no attention step launches."""
        return "FillFunctor<int>" in name


HOST_BOUND = 0.8  # GPU busy below this fraction of the measured time: the cell is host-bound
HEAD_START_MIN_MS = 1.0  # the shortest sleep a head-start sample queues before its work
_SLEEP_CYCLES_PER_MS = 2_000_000  # torch.cuda._sleep spins this many clock cycles a ms at 2 GHz (longer when slower)


def measure(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 10, device: str = "cpu",
            setup: Callable[[], Any] | None = None, flush_l2: bool = True, head_start: bool = False) -> Timing:
    """Time `fn` `repeats` times after `warmup` untimed calls. `setup` runs before each call, untimed.

    On CUDA each sample is the CUDA-event time around `fn`, issued back to back as a training loop
    (or triton's do_bench) issues them: when the host takes longer to issue `fn` than the GPU takes to
    run it, the GPU waits and the sample reads the host's pace. The host's own time per sample (wall
    clock of issuing `fn`) is kept beside it. `head_start=True` queues a sleep kernel before each sample,
    longer than the warm-up calls took to issue, so the host is done issuing before the GPU reaches the
    work: the samples are then the GPU's time alone (`gpu_busy` below compares the two).
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if not (head_start and str(device).startswith("cuda")):  # back to back: one callable timed in turns alone
        return measure_turns([fn], warmup=warmup, repeats=repeats, device=device, setup=setup, flush_l2=flush_l2)[0]
    import torch

    warm_host_ms = []
    for _ in range(max(warmup, 0)):
        if setup is not None:
            setup()
        t0 = time.perf_counter_ns()
        fn()
        warm_host_ms.append((time.perf_counter_ns() - t0) / 1e6)
    torch.cuda.synchronize()
    flush = L2Flusher(device) if flush_l2 else None
    # 2x the slowest warm-up call but the first (which may compile), and at least HEAD_START_MIN_MS
    sleep_ms = max([HEAD_START_MIN_MS, *(2 * x for x in warm_host_ms[1:])])
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    held = torch.cuda.Event()
    host = []
    for i in range(repeats):
        for _attempt in range(4):
            if setup is not None:
                setup()
            torch.cuda._sleep(int(sleep_ms * _SLEEP_CYCLES_PER_MS))
            held.record()
            if flush is not None:
                flush()
            starts[i].record()
            t0 = time.perf_counter_ns()
            fn()
            host_ms = (time.perf_counter_ns() - t0) / 1e6
            ends[i].record()
            if not held.query():
                break
            sleep_ms *= 2  # the GPU woke before the host had issued the work: take the sample again
        host.append(host_ms)
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return Timing.from_samples(samples, host)


def turn_order(items: list, i: int) -> list:
    """Turn `i` of a rotation: the same cycle, starting one later each turn (A B C, B C A, C A B, ...), so
    none of the items always goes first (on a cooler chip, a quieter host) or last."""
    k = i % len(items)
    return items[k:] + items[:k]


def _sample(fn: Callable[[], Any], setup: Callable[[], Any] | None, flush: L2Flusher | None,
            start=None, end=None) -> float:
    """One sample as the harness takes it: `setup` (untimed), the L2 flush, then `fn` between the CUDA
    events `start` and `end` where given. Returns the host's time to issue `fn`, ms."""
    if setup is not None:
        setup()
    if flush is not None:
        flush()
    if start is not None:
        start.record()
    t0 = time.perf_counter_ns()
    fn()
    host_ms = (time.perf_counter_ns() - t0) / 1e6
    if end is not None:
        end.record()
    return host_ms


def measure_turns(fns: list[Callable[[], Any]], *, warmup: int = 3, repeats: int = 10, device: str = "cpu",
                  setup: Callable[[], Any] | None = None, flush_l2: bool = True) -> list[Timing]:
    """Time several callables in turns: sample i of every one is taken before sample i + 1 of any, and
    the one that goes first rotates (with A and B: AB, BA, AB, ...). Returns one Timing per callable.

    An A/B comparison measured cell after cell reads the drift between the cells as a difference: a
    host-bound cell's time is the host's, and the host's pace moves by tens of % over seconds. Taken in
    turns, both see the same drift. Each sample is taken as measure() takes one (setup, the L2 flush,
    CUDA events around the call issued back to back, the host's issue time kept beside it).
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if not fns:
        raise ValueError("no callables to time")
    import torch

    is_cuda = str(device).startswith("cuda")
    n = len(fns)
    for i in range(max(warmup, 0)):
        for fn in turn_order(fns, i):
            if setup is not None:
                setup()
            fn()
    flush = None
    if is_cuda:
        torch.cuda.synchronize()
        flush = L2Flusher(device) if flush_l2 else None
    events, host = [[] for _ in fns], [[] for _ in fns]
    for i in range(repeats):
        for j in turn_order(list(range(n)), i):
            start = end = None
            if is_cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                events[j].append((start, end))
            host[j].append(_sample(fns[j], setup, flush, start, end))
    if not is_cuda:  # off CUDA the host's wall clock is the sample
        return [Timing.from_samples(h) for h in host]
    torch.cuda.synchronize()
    return [Timing.from_samples([s.elapsed_time(e) for s, e in ev], h) for ev, h in zip(events, host, strict=True)]


def measure_rounds(fns: dict[str, Callable[[], Any]], *, rounds: int, repeats: int, warmup: int = 3,
                   device: str = "cpu", head_start: bool = False,
                   host: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Each callable's median per round, ms, in short bursts: a round measures every callable in turn
    (measure: `warmup` untimed calls, then `repeats` samples back to back), so clock drift falls on all
    of them, and each round starts one callable later than the round before (turn_order), so none always
    runs first, on a chip that has cooled through the compiles, or always behind the same heavy one.

    `host`, if given, gets each callable's median host time (the wall clock of issuing it) per round.
    `head_start` is measure's: a sleep kernel before each sample, so the samples are the GPU's time alone."""
    names = list(fns)
    ms: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in turn_order(names, r):
            timing = measure(fns[name], warmup=warmup, repeats=repeats, device=device, head_start=head_start)
            ms[name].append(timing.median_ms)
            if host is not None:
                host.setdefault(name, []).append(timing.host_median_ms)
    return ms


SUSTAIN_ESTIMATE_CALLS = 5  # calls timed together to size a sustained run, as do_bench sizes its own


def measure_sustained(fns: list[Callable[[], Any]], *, sustain_ms: float, rounds: int = 3, warmup: int = 3,
                      device: str = "cpu", setup: Callable[[], Any] | None = None, flush_l2: bool = True,
                      max_calls: int = 10_000) -> list[list[Timing]]:
    """Time several callables as triton's do_bench times one, each alone for `sustain_ms`, in rounds.

    A round gives each callable, in rotating turns (turn_order), `warmup` untimed calls, then
    SUSTAIN_ESTIMATE_CALLS calls timed together to estimate one call, then as many calls as fill
    `sustain_ms` (at least 1, at most `max_calls`), issued back to back, each its own sample taken as
    measure_turns takes one (setup, the L2 flush, CUDA events around the call, the host's issue time).
    Returns per callable one Timing per round.

    Timed in turns sample by sample, two implementations share the clock of their mixture. Run alone
    for a second, a GPU reaches its power limit, and then the implementation that spends more energy
    per call runs at a lower clock than the other: that is what do_bench, and a training loop, see
    (docs/results/h100/sustained/README.md). A round is the unit of comparison: the chip's state moves
    within one, so its samples are not independent draws.
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if not sustain_ms > 0:
        raise ValueError("sustain_ms must be > 0")
    if max_calls < 1:
        raise ValueError("max_calls must be >= 1")
    if not fns:
        raise ValueError("no callables to time")
    import torch

    is_cuda = str(device).startswith("cuda")
    flush = L2Flusher(device) if is_cuda and flush_l2 else None

    def calls_for(fn) -> int:
        """How many calls fill sustain_ms, from SUSTAIN_ESTIMATE_CALLS timed together (flushes included,
        as in the run they size)."""
        if is_cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter_ns()
        for _ in range(SUSTAIN_ESTIMATE_CALLS):
            _sample(fn, setup, flush)
        if is_cuda:
            end.record()
            torch.cuda.synchronize()
            each_ms = start.elapsed_time(end) / SUSTAIN_ESTIMATE_CALLS
        else:
            each_ms = (time.perf_counter_ns() - t0) / 1e6 / SUSTAIN_ESTIMATE_CALLS
        return max(1, min(max_calls, round(sustain_ms / max(each_ms, 1e-6))))

    out: list[list[Timing]] = [[] for _ in fns]
    for r in range(rounds):
        for j in turn_order(list(range(len(fns))), r):
            for _ in range(max(warmup, 0)):
                _sample(fns[j], setup, flush)
            n = calls_for(fns[j])
            if not is_cuda:  # off CUDA the host's wall clock is the sample
                out[j].append(Timing.from_samples([_sample(fns[j], setup, flush) for _ in range(n)]))
                continue
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            host = [_sample(fns[j], setup, flush, s, e) for s, e in zip(starts, ends, strict=True)]
            torch.cuda.synchronize()
            out[j].append(Timing.from_samples([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)], host))
    return out


def gpu_busy(paced: Timing, gpu_alone: Timing) -> float:
    """The share of a back-to-back sample's time (`paced`) that the GPU's own work fills (`gpu_alone`,
    measured with a head start), at most 1; below HOST_BOUND the host sets the pace."""
    return min(1.0, gpu_alone.median_ms / paced.median_ms)


def reset_peak_memory(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_bytes(device: str) -> int | None:
    """Peak allocated bytes since the last reset (CUDA); None on CPU, where torch does not track it."""
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return None


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error from torch (CUDA or CPU allocator) or Python's MemoryError."""
    import torch

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    markers = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed", "cannot allocate memory")
    return isinstance(exc, RuntimeError) and any(m in text.lower() for m in markers)


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is present, else 'cpu'."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SkipCell("device cuda was asked for but no GPU is visible")
    return device


def resolve_rank_device(device: str, world_size: int) -> str:
    """'cpu' or 'cuda' for a multi-rank cell: auto picks cuda when there is a GPU for every rank."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if gpus >= world_size else "cpu"
    device = device.split(":")[0]
    if device == "cuda" and gpus < world_size:
        raise SkipCell(f"world_size {world_size} needs {world_size} GPUs; {gpus} visible")
    cores = max(2, len(os.sched_getaffinity(0)))  # two ranks always: the CPU tests' and the course's setup
    if device == "cpu" and world_size > cores:
        raise SkipCell(f"world_size {world_size} on CPU is a process per rank, and this host gives the worker "
                       f"{cores} CPUs (at most one rank each)")
    return device


class SkipCell(Exception):
    """Raised by a suite when a cell's configuration is unsupported; the job is recorded as `skipped`."""


def require_runnable_attention(impl: str, device: str) -> None:
    """SkipCell when `impl` cannot run on `device` here (the suites that take an attention choice ask)."""
    if impl == "flash_triton" and device == "cpu":
        from kernels.flash_triton import triton_interpreted

        if not triton_interpreted():
            raise SkipCell("flash_triton on CPU needs TRITON_INTERPRET=1 set before the worker starts")
    if impl.startswith("sdpa_") and impl != "sdpa_math" and device == "cpu":
        raise SkipCell(f"{impl} is a CUDA backend of SDPA; it does not run on CPU")


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


@functools.lru_cache(maxsize=None)
def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def fingerprint(commit: str | None = None) -> dict[str, Any]:
    """Where a number was measured: host, GPU, driver, CUDA, torch, triton, Python, git commit.

    `commit`, when given (the worker's settings.commit or a benchmark's --commit), else the BENCHLAB_COMMIT
    environment variable (a benchmark run by hand), wins over what git reports: a GPU host may get a copy of
    the tree whose .git still points at an older commit.
    """
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu_name, gpu_count, cuda = None, 0, torch.version.cuda
    if torch.cuda.is_available():
        gpu_count = torch.cuda.device_count()
        gpu_name = torch.cuda.get_device_name(0)
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gpu_name": gpu_name,
        "gpu_count": gpu_count,
        "driver": _driver_version() if gpu_count else None,
        "cuda": cuda,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": sys.version.split()[0],
        "git_commit": commit or os.environ.get("BENCHLAB_COMMIT") or git_commit(),
    }


_PEAK_CACHE: dict[tuple[str, str], float] = {}  # a process's measured matmul peaks (a cache, not a knob)


def measured_peak_tflops(device: str, dtype) -> float | None:
    """Dense matmul TFLOP/s of this device in `dtype` (8192^3, median of 10), cached per process:
    the peak MFU is taken against. 2 * n^3 FLOPs per matmul."""
    import torch

    if not device.startswith("cuda"):
        return None
    key = (device, str(dtype))
    if key not in _PEAK_CACHE:
        n = 8192
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        t = measure(lambda: a @ b, warmup=3, repeats=10, device=device, flush_l2=False)
        _PEAK_CACHE[key] = 2 * n**3 / (t.median_ms * 1e-3) / 1e12
    return _PEAK_CACHE[key]
