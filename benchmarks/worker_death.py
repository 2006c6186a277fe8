"""From `kill -9` of a worker mid-job to that job's final state.

    PYTHONPATH=. python benchmarks/worker_death.py --samples 3 --out death.json
    PYTHONPATH=. python benchmarks/worker_death.py --brokers embedded --lost-after-s 5 \
        --job '{"suite": "ddp", "params": {"world_size": 2, "device": "cuda", "steps": 100000}}' --out gpu.json

Each sample starts a fresh stack (API + recorder + one worker, embedded broker or Redis) with the
default heartbeat, reaper and lost-worker settings unless given, submits a noop job that sleeps
for ten minutes, waits until it runs, kills the worker with SIGKILL and polls the job every 0.1 s
until it is final. No replacement worker is started, so the figure is the reaper's path. Also
recorded: the worker's descendants when it was killed (runner, and rank processes for a multi-rank
job) and whether any of them was left alive 10 s later. `--job` replaces the noop job with any
sweep body (one cell), e.g. a 2-rank NCCL job on a GPU host.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path

NOOP_JOB = {"suite": "noop", "params": {"sleep_ms": 600_000}}


def one(broker: str, redis_url: str, env: dict, job_body: dict = NOOP_JOB) -> dict:
    from tests.stack import Stack, alive, children_of

    with tempfile.TemporaryDirectory() as d:
        kw = {"extra_env": env}
        if broker == "redis":
            kw.update(broker_url=redis_url, queue=f"death-{uuid.uuid4().hex[:8]}")
        s = Stack(Path(d), **kw).start()
        try:
            sid = s.submit({**job_body, "timeout_s": 1200})["id"]
            job = s.results(sid)[0]["job_id"]
            deadline = time.monotonic() + 300
            while s.client.get(f"/api/jobs/{job}").json()["state"] != "running":
                assert time.monotonic() < deadline, s.logs()
                time.sleep(0.1)
            world = int(job_body.get("params", {}).get("world_size", 0))
            deadline = time.monotonic() + 120  # for a multi-rank job: until its ranks exist
            while len(tree := children_of(s.worker_proc.pid)) < 2 + world and time.monotonic() < deadline:
                time.sleep(0.2)
            os.kill(s.worker_proc.pid, signal.SIGKILL)
            t0 = time.monotonic()
            s.worker_proc.wait(10)
            gone_by = time.monotonic() + 10
            while any(alive(p) for p in tree) and time.monotonic() < gone_by:
                time.sleep(0.1)
            left = sorted(p for p in tree if alive(p))
            while True:
                j = s.client.get(f"/api/jobs/{job}").json()
                if j["state"] not in ("queued", "running"):
                    break
                assert time.monotonic() - t0 < 600, "job not final after 600 s"
                time.sleep(0.1)
            return {"broker": broker, "job": job_body, "seconds": time.monotonic() - t0, "state": j["state"],
                    "error": j["error"], "descendants_at_kill": len(tree), "left_alive_after_10s": left}
        finally:
            s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    ap.add_argument("--brokers", default="embedded,redis")
    ap.add_argument("--job", type=json.loads, default=NOOP_JOB, help="a sweep body of one cell (JSON)")
    ap.add_argument("--lost-after-s", type=float, default=None,
                    help="BENCHLAB_WORKER_LOST_AFTER_S (default: its default)")
    args = ap.parse_args()

    from backend.settings import BackendSettings
    from tests.stack import exit_on_sigterm
    from worker.harness import fingerprint
    from worker.settings import WorkerSettings

    exit_on_sigterm()
    env = {} if args.lost_after_s is None else {"BENCHLAB_WORKER_LOST_AFTER_S": str(args.lost_after_s),
                                                "BENCHLAB_REAP_INTERVAL_S": "0.5", "BENCHLAB_HEARTBEAT_S": "1"}
    brokers = args.brokers.split(",")
    b = BackendSettings(**({"worker_lost_after_s": args.lost_after_s, "reap_interval_s": 0.5}
                           if args.lost_after_s else {}))
    w = WorkerSettings(**({"heartbeat_s": 1.0} if args.lost_after_s else {}))
    out = {"env": fingerprint(WorkerSettings().commit), "settings": {"worker_lost_after_s": b.worker_lost_after_s,
                                              "reap_interval_s": b.reap_interval_s, "heartbeat_s": w.heartbeat_s},
           "samples": []}
    for _ in range(args.samples):
        for broker in brokers:  # interleaved
            r = one(broker, args.redis, env, args.job)
            print(json.dumps(r), flush=True)
            out["samples"].append(r)
    for broker in brokers:
        xs = [r["seconds"] for r in out["samples"] if r["broker"] == broker]
        out[f"{broker}_median_s"] = statistics.median(xs)
        out[f"{broker}_range_s"] = [min(xs), max(xs)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
