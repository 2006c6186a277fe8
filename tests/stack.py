"""Start real benchlab processes (API + recorder, Celery worker) on this machine: for end-to-end
tests and for the queue-overhead benchmark."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from backend.models import UNFINISHED_STATUSES

ROOT = Path(__file__).resolve().parent.parent


def exit_on_sigterm() -> None:
    """Turn SIGTERM (what `timeout` and most supervisors send) into SystemExit, so `finally` blocks
    run and a Stack started by this process is stopped instead of left running."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """An API process and a worker process sharing a data dir and a broker."""

    def __init__(self, data_dir: Path, broker_url: str | None = None, queue: str = "default",
                 extra_env: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.queue = queue
        self.env = {**os.environ, "BENCHLAB_DATA_DIR": str(data_dir), "BENCHLAB_PORT": str(self.port),
                    "BENCHLAB_HOST": "127.0.0.1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        if broker_url:
            self.env["BENCHLAB_BROKER_URL"] = broker_url
        self.api_proc: subprocess.Popen | None = None
        self.worker_proc: subprocess.Popen | None = None
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def _spawn(self, *args: str, log: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "backend.cli", *args], cwd=ROOT, env=self.env,
                                stdout=open(self.data_dir / log, "ab"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    def start_api(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.api_proc = self._spawn("api", log="api.log")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if self.client.get("/api/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.api_proc.poll() is not None:
                raise RuntimeError("api exited: " + (self.data_dir / "api.log").read_text()[-3000:])
            time.sleep(0.2)
        raise RuntimeError("api did not start")

    def start_worker(self) -> None:
        self.worker_proc = self._spawn("worker", "--queues", self.queue, log="worker.log")

    def start(self) -> "Stack":
        self.start_api()
        self.start_worker()
        return self

    @staticmethod
    def _stop(proc: subprocess.Popen | None) -> None:
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop_api(self) -> None:
        self._stop(self.api_proc)

    def stop(self) -> None:
        self._stop(self.worker_proc)
        self._stop(self.api_proc)
        self.client.close()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.data_dir.glob("*.log"))

    def submit(self, body: dict) -> dict:
        r = self.client.post("/api/sweeps", json={"queue": self.queue, **body})
        assert r.status_code == 201, r.text
        return r.json()

    def wait(self, sweep_id: int, timeout: float = 120.0, until=("done", "cancelled")) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hold = min(5.0, max(0.0, deadline - time.monotonic()))
            s = self.client.get(f"/api/sweeps/{sweep_id}", params={"wait_s": hold}).json()
            if s["status"] in until:
                return s
            if s["status"] not in UNFINISHED_STATUSES:
                time.sleep(0.1)  # finished in a state the caller does not wait for: no hold, poll
        raise AssertionError(f"sweep {sweep_id} not finished: {s}\n{self.logs()}")

    def results(self, sweep_id: int) -> list[dict]:
        return self.client.get(f"/api/sweeps/{sweep_id}/results").json()


# -- processes, for fault-injection tests and benchmarks ---------------------------------------
def _parents() -> dict[int, int]:
    """{pid: parent pid} of every process, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return parents


def children_of(pid: int) -> set[int]:
    """Every descendant of `pid`, from /proc."""
    parents = _parents()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def child_running(pid: int, word: str) -> int | None:
    """The child of `pid` (a direct one) whose command line holds `word` as an argument, or None."""
    for child, parent in _parents().items():
        if parent != pid:
            continue
        try:
            if word.encode() in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                return child
        except OSError:
            continue
    return None


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def wait_until(cond, timeout: float = 20.0, what: str = "condition", interval: float = 0.05):
    """cond()'s first true value, asked every `interval` until `timeout` s pass (then AssertionError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout} s")
