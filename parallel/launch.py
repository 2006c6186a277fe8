"""Run a function on N ranks of one host.

    results = launch(fn, world_size=2, args=(...))   # fn(rank, world_size, *args) on every rank

Backend by device: NCCL when a GPU exists for every rank (each rank pinned to GPU `rank`), gloo
otherwise. A fresh free TCP port per launch. If any rank raises, the others are killed and
RankError carries that rank's traceback, so a failure never turns into a hang.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Callable


def die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies, even by SIGKILL (prctl
    PR_SET_PDEATHSIG). The runner (worker/runner.py) and every rank process call it, so a
    killed worker leaves no runner or rank behind. If the parent is already gone, exit now."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent_pid:
        os._exit(1)


class RankError(RuntimeError):
    """A rank raised (or died); the message holds its traceback."""

    def __init__(self, rank: int, detail: str):
        self.rank = rank
        self.detail = detail
        super().__init__(f"rank {rank} failed:\n{detail}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_backend(world_size: int, device: str = "auto") -> str:
    import torch

    if device == "cpu":
        return "gloo"
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    if device == "cuda":
        raise RuntimeError(f"{world_size} ranks on cuda need {world_size} GPUs; "
                           f"{torch.cuda.device_count()} visible")
    return "gloo"


def _rank_main(rank: int, world_size: int, port: int, backend: str, fn: Callable, args: tuple,
               results: "mp.Queue", timeout_s: float, parent_pid: int | None = None) -> None:
    if parent_pid is not None:
        die_with_parent(parent_pid)
    import torch
    import torch.distributed as dist

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        out = fn(rank, world_size, *args)
        results.put(("ok", rank, out))
    except BaseException:  # noqa: BLE001 - report every failure with its traceback
        results.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 (best effort: the process group is torn down anyway)
                pass


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), device: str = "auto",
           timeout_s: float = 600.0) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` ranks; return each rank's result, by rank.

    `fn` must be importable (a module-level function): ranks are started with the spawn method.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    backend = pick_backend(world_size, device)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    parent = os.getpid()
    procs = [ctx.Process(target=_rank_main, args=(r, world_size, port, backend, fn, args, results, timeout_s, parent),
                         name=f"benchlab-rank{r}", daemon=False) for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world_size:
            try:
                status, rank, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                for r, p in enumerate(procs):
                    if r not in out and p.exitcode not in (None, 0):
                        # died without a word (killed, segfault): give its queue a moment, then report
                        try:
                            status, rank, payload = results.get(timeout=1.0)
                        except queue_mod.Empty:
                            raise RankError(r, f"process exited with code {p.exitcode} and no traceback") from None
                        break
                else:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"ranks did not finish within {timeout_s:g} s")
                    continue
            if status == "error":
                raise RankError(rank, payload)
            out[rank] = payload
        for p in procs:
            p.join(30)
        return [out[r] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
