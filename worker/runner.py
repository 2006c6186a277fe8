"""The job runner: a warm child process that measures one cell at a time.

Why a child: a segfaulting kernel, a CUDA error that poisons the context, an OOM or a hung kernel
must cost one job, not the worker. Importing torch costs seconds, so the child is started once
(torch imported), reused, cleaned between jobs (caches emptied, peak counters reset) and replaced
when it dies, times out, has run `max_jobs` jobs, or a job asks for a fresh process.

Parent <-> child talk over a Pipe: the child says ("ready", None) once its imports are done; then
the parent sends a job dict and the child answers with any number of ("progress", text) and one
("result", outcome dict). A job's timeout starts when the job is sent to a ready child, so a slow
start (torch's import takes seconds on a busy host) never eats into the job's own time.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from parallel.launch import die_with_parent


@dataclass
class Outcome:
    """How one cell ended: the state, its metrics or error, artifacts written, and where it ran."""

    state: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    env: dict[str, Any] | None = None
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "metrics": self.metrics, "error": self.error, "env": self.env,
                "artifacts": self.artifacts, "duration_s": self.duration_s}


def list_artifacts(folder: Path) -> list[dict[str, Any]]:
    if not folder.is_dir():
        return []
    return [{"name": p.name, "size": p.stat().st_size} for p in sorted(folder.iterdir()) if p.is_file()]


def _child_main(conn, commit: str | None, prepare: Callable[[], Any] | None = None,
                parent_pid: int | None = None, devices: str | None = None) -> None:
    """Runner process: import the GPU stack once, say ready, then serve jobs until told to stop."""
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices  # before torch: CUDA reads it once, at initialisation
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.setsid()  # own process group: a kill takes the ranks this job spawned with it
    if parent_pid is not None:
        die_with_parent(parent_pid)  # a worker killed with SIGKILL takes its runner with it
    import torch  # noqa: F401  (the warm-up this process exists for)

    from worker.harness import SkipCell, fingerprint, is_oom
    from worker.suites import CellContext, get_suite, validate_cell

    env = fingerprint(commit)
    if prepare is not None:
        prepare()
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        t0 = time.monotonic()
        suite = params = metrics = None
        artifact_dir = Path(job["artifact_dir"])
        ctx = CellContext(artifact_dir, progress=lambda msg: conn.send(("progress", str(msg))))
        try:
            suite = get_suite(job["suite"])
            params = validate_cell(job["suite"], job["params"])
            metrics = suite.run(params, ctx)
            outcome = Outcome("done", metrics=metrics)
        except SkipCell as exc:
            outcome = Outcome("skipped", error=str(exc))
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a recorded result
            state = "oom" if is_oom(exc) else "failed"
            outcome = Outcome(state, error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
        outcome.env = env
        outcome.duration_s = time.monotonic() - t0
        outcome.artifacts = list_artifacts(artifact_dir)
        conn.send(("result", outcome.as_dict()))
        del suite, params, metrics, outcome, ctx
        _clean_between_jobs()  # after the answer: cleaning overlaps the parent reporting the result


def _clean_between_jobs() -> None:
    import gc

    import torch

    if not torch.cuda.is_initialized():
        gc.collect(1)  # young generations only: a full pass over torch's objects costs ~90 ms on CPU
        return
    gc.collect()  # cycles can hold device memory: free them before emptying the cache
    if torch.cuda.is_available():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        except RuntimeError:
            pass  # a broken CUDA context: the next job in this process will fail and replace it


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in process group `pgid` (the runner and the ranks it
    started), from /proc/<pid>/stat: field 5 is the group, field 24 the resident pages. 0 where
    /proc cannot be read."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # gone since the listing, or not ours to read
        fields = stat[stat.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
        if len(fields) > 21 and int(fields[2]) == pgid:  # fields[0] is field 3 (state)
            total += int(fields[21]) * page
    return total


class RunnerStartError(RuntimeError):
    """The child died or stayed silent before it was ready for a job."""


class Runner:
    """Owns the warm child. `run(job, timeout_s)` always returns an Outcome, whatever the child does.

    `startup_timeout_s` bounds the child's start (imports) apart from any job's timeout; `prepare`,
    a picklable callable, runs in the child before it reports ready (tests use it to slow a start).

    `memory_limit_gb`: host memory (resident, the child and every rank it started) a job may hold;
    it is read every half second, and a job past it is killed and recorded `oom`. Without it a cell
    sized past the host's RAM meets the kernel's OOM killer, which takes the runner with signal 9.
    """

    def __init__(self, max_jobs: int = 100, commit: str | None = None, startup_timeout_s: float = 300.0,
                 prepare: Callable[[], Any] | None = None, memory_limit_gb: float | None = None):
        if startup_timeout_s <= 0:
            raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s}")
        if memory_limit_gb is not None and not memory_limit_gb > 0:
            raise ValueError(f"memory_limit_gb must be > 0, got {memory_limit_gb}")
        self.memory_limit_gb = memory_limit_gb
        self.max_jobs = max_jobs
        self.commit = commit
        self.startup_timeout_s = startup_timeout_s
        self.prepare = prepare
        self._ctx = mp.get_context("spawn")
        self._proc: mp.Process | None = None
        self._conn = None
        self.jobs_run = 0
        self.starts = 0
        self.devices: str | None = None  # the CUDA_VISIBLE_DEVICES of the current child (None: inherited)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_child_main,
                                       args=(child, self.commit, self.prepare, os.getpid(), self.devices),
                                       daemon=False, name="benchlab-runner")
        self._proc.start()
        child.close()
        self._conn = parent
        self.jobs_run = 0
        self.starts += 1
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Block until the new child says ready; kill it and raise RunnerStartError if it cannot."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                message = self._next_message(deadline)
            except (EOFError, OSError):
                raise RunnerStartError(f"runner process exited before it was ready ({self._reap()})") from None
            if message is None:
                self.kill()
                raise RunnerStartError(f"runner process did not start within {self.startup_timeout_s:g} s")
            if message[0] == "ready":
                return

    def _next_message(self, deadline: float, tick: bool = False) -> tuple[str, Any] | None:
        """The child's next message, or None once `deadline` (monotonic) passes (with `tick`, also
        after each half second of silence). EOFError: the child is gone."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if self._conn.poll(min(remaining, 0.5)):
                return self._conn.recv()
            if not self._proc.is_alive():
                raise EOFError
            if tick:
                return None

    def _reap(self) -> str:
        """After the child went away: collect its exit status, drop it, and say how it ended."""
        self._proc.join(1)
        code = self._proc.exitcode
        self.kill()
        if code == -signal.SIGKILL:
            return ("signal 9: killed from outside, as the kernel's OOM killer does when host memory runs out; "
                    "BENCHLAB_RUNNER_MEMORY_GB records such a cell as oom")
        return f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"

    def _over_memory(self) -> float | None:
        """The job's resident host memory in GB when it is past memory_limit_gb, else None."""
        if self.memory_limit_gb is None or self._proc is None:
            return None
        held = group_rss_bytes(self._proc.pid) / 1e9
        return held if held > self.memory_limit_gb else None

    def _ensure(self, fresh: bool, devices: str | None = None) -> None:
        alive = self._proc is not None and self._proc.is_alive()
        moved = devices is not None and devices != self.devices  # a CUDA context cannot change its GPUs
        if alive and (fresh or moved or self.jobs_run >= self.max_jobs):
            self.stop()
            alive = False
        if devices is not None:
            self.devices = devices
        if not alive:
            self._start()

    def kill(self) -> None:
        """Kill the child at once (timeout, or the worker shutting down)."""
        if self._proc is not None and self._proc.is_alive():
            pid = self._proc.pid
            try:
                if os.getpgid(pid) == pid:  # setsid done: the group is the child's alone
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.join(5)
        self._proc = None
        self._conn = None

    def stop(self) -> None:
        """Ask the child to exit; kill it if it does not."""
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            self._proc.join(5)
        self.kill()

    def run(self, job: dict[str, Any], timeout_s: float, fresh: bool = False,
            on_progress: Callable[[str], None] | None = None,
            cancelled: Callable[[], bool] | None = None, devices: str | None = None) -> Outcome:
        """Run one job in the child. The job dict needs suite, params and artifact_dir.

        `devices`: the GPUs the job may use, as CUDA_VISIBLE_DEVICES (worker/placement.py leases
        them); a child started with other GPUs is replaced first.

        `cancelled`, asked about every half second while the job runs: when it says yes, the child
        (and every process of its group) is killed and the job ends `cancelled`.
        """
        try:
            self._ensure(fresh, devices)
        except RunnerStartError as exc:
            return Outcome("failed", error=f"{exc}; the job did not run")
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        try:
            self._conn.send(job)
        except (OSError, BrokenPipeError):
            self.kill()
            return Outcome("failed", error="runner process was not reachable; it has been replaced")
        self.jobs_run += 1
        tick = cancelled is not None or self.memory_limit_gb is not None
        while True:
            try:
                message = self._next_message(deadline, tick=tick)
            except (EOFError, OSError):
                how = self._reap()
                return Outcome("failed", error=f"runner process died during the job ({how}); it has been replaced",
                               duration_s=time.monotonic() - t0,
                               artifacts=list_artifacts(Path(job["artifact_dir"])))
            held = self._over_memory() if message is None else None
            if held is not None:
                self.kill()
                return Outcome("oom", error=f"the job held {held:.2f} GB of host memory, past the runner's limit of "
                                            f"{self.memory_limit_gb:g} GB (BENCHLAB_RUNNER_MEMORY_GB); it was killed",
                               duration_s=time.monotonic() - t0,
                               artifacts=list_artifacts(Path(job["artifact_dir"])))
            if message is None and cancelled is not None and time.monotonic() < deadline and cancelled():
                self.kill()
                return Outcome("cancelled", error="cancelled while running; the cell was killed",
                               duration_s=time.monotonic() - t0,
                               artifacts=list_artifacts(Path(job["artifact_dir"])))
            if message is None and time.monotonic() < deadline:
                continue
            if message is None:
                self.kill()
                return Outcome("timeout", error=f"job exceeded its timeout of {timeout_s:g} s; the runner was killed",
                               duration_s=time.monotonic() - t0,
                               artifacts=list_artifacts(Path(job["artifact_dir"])))
            kind, payload = message
            if kind == "progress":
                if on_progress is not None:
                    on_progress(payload)
                continue
            outcome = Outcome(**payload)
            if outcome.state == "failed" and "CUDA error" in (outcome.error or ""):
                self.kill()  # a CUDA error poisons the context: start clean next time
            return outcome
