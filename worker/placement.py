"""Placing jobs on GPUs, torch-free: which queue a job goes to, and which GPUs of a host it may use.

Routing (the API, when it sends a job). A cell that asks for GPUs explicitly (`device=cuda`) needs
N of them: `world_size` for the distributed suites, 1 otherwise (`gpus` for noop). It is sent to the
queue `<queue>.gpus<N>`; every other cell to `<queue>`. A worker with G GPUs consumes `<queue>` and
`<queue>.gpus1` .. `<queue>.gpus<G>` (worker_queues), so a job needing N GPUs reaches only a worker
with at least N, and one needing more than any worker has waits in its queue (the API says why).
`device=auto` cells go to `<queue>`: they use the worker's GPUs when it has enough, its CPU otherwise.

Leases (the worker, before it runs a job). One lock file per GPU in a folder every worker of the
host shares (`flock`, released by the kernel when the holder dies): a job takes N GPUs no other job
holds and runs with CUDA_VISIBLE_DEVICES set to them, so two workers on one host never run two jobs
on one GPU at once.
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any, Callable

GPU_QUEUE = "{queue}.gpus{n}"
DISTRIBUTED_SUITES = ("ddp", "allreduce", "leaderboard")


def gpus_asked(suite: str, params: dict[str, Any]) -> int:
    """GPUs a cell asks for explicitly (device=cuda); 0 when it may run without them."""
    if suite == "noop":
        return int(params.get("gpus") or 0)
    if not str(params.get("device", "auto")).startswith("cuda"):
        return 0
    return int(params.get("world_size") or 1) if suite in DISTRIBUTED_SUITES else 1


def gpus_used(suite: str, params: dict[str, Any], visible: int) -> int:
    """GPUs a cell will use on a worker with `visible` GPUs (device=auto included)."""
    asked = gpus_asked(suite, params)
    if asked or suite == "noop" or str(params.get("device", "auto")) == "cpu":
        return asked
    n = int(params.get("world_size") or 1) if suite in DISTRIBUTED_SUITES else 1
    return n if visible >= n else 0  # auto: GPUs when there are enough of them, else the CPU


def route(queue: str, suite: str, params: dict[str, Any]) -> str:
    n = gpus_asked(suite, params)
    return GPU_QUEUE.format(queue=queue, n=n) if n else queue


def worker_queues(queues: list[str], gpu_count: int) -> list[str]:
    """The queues a worker with `gpu_count` GPUs consumes for the configured `queues`."""
    out = []
    for q in queues:
        out += [q] + [GPU_QUEUE.format(queue=q, n=n) for n in range(1, gpu_count + 1)]
    return out


def gpu_ids(count: int) -> list[str]:
    """The host-wide ids of this worker's GPUs: CUDA_VISIBLE_DEVICES's entries when set (indices or
    UUIDs), else 0 .. count-1. Two workers that see the same GPU lock the same file."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        if len(ids) >= count:
            return ids[:count]
    return [str(i) for i in range(count)]


class GpuLease:
    """Hold `n` of this worker's GPUs (host-wide ids, see gpu_ids) for one job.

        with GpuLease(2, ["0", "1", "2", "3"], lock_dir) as ids:   # e.g. ["1", "3"]
            run the job with CUDA_VISIBLE_DEVICES=",".join(ids)
    """

    def __init__(self, n: int, ids: list[str], lock_dir: Path, poll_s: float = 0.5,
                 on_wait: Callable[[str], None] | None = None, cancelled: Callable[[], bool] | None = None):
        if n > len(ids):
            raise ValueError(f"the job needs {n} GPUs; this worker has {len(ids)}")
        self.n, self.ids, self.lock_dir, self.poll_s = n, ids, lock_dir, poll_s
        self.on_wait, self.cancelled = on_wait, cancelled
        self.held: list[tuple[str, int]] = []  # (gpu id, fd)

    def _try_take(self) -> bool:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        for gpu in self.ids:
            if len(self.held) == self.n:
                break
            fd = os.open(self.lock_dir / f"gpu-{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self.held.append((gpu, fd))
        if len(self.held) == self.n:
            return True
        self.release()  # all or nothing: holding some while waiting could deadlock two jobs
        return False

    def acquire(self) -> list[str]:
        said = False
        while not self._try_take():
            if self.cancelled is not None and self.cancelled():
                raise InterruptedError("cancelled while waiting for GPUs")
            if not said and self.on_wait is not None:
                self.on_wait(f"waiting for {self.n} free GPU(s) of {len(self.ids)}: other jobs on this host hold them")
                said = True
            time.sleep(self.poll_s)
        return [gpu for gpu, _ in self.held]

    def release(self) -> None:
        for _, fd in self.held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self.held = []

    def __enter__(self) -> list[str]:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
