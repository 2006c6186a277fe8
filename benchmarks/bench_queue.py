"""Queue overhead: what benchlab itself costs around a job (issue 2's performance figures).

    PYTHONPATH=. python benchmarks/bench_queue.py --out docs/results/cpu/queue_overhead.json
    PYTHONPATH=. python benchmarks/bench_queue.py --database-url postgresql://postgres@127.0.0.1:5432/bench ...

- submit-to-done of a job that does nothing (noop suite), one at a time, embedded broker and Redis:
  the time from POST /api/sweeps to the API answering `done` for it, from the same 2-core machine
  that runs the API, the worker and the broker; measured twice: polling GET /api/sweeps/{id} every
  5 ms, and with one GET ?wait_s=30 that the API holds until the sweep finishes (with the median
  time of each stage, from the database's timestamps);
- a 1,000-cell no-op sweep through the embedded broker, wall time to all done;
- GET /api/sweeps/{id}/results on a 10,000-row sweep (rows written straight to the database).

With --database-url the API (and these queries) use that database instead of SQLite; give it an
empty database. (Until the fault-tolerance work this script was `python -m backend.bench_queue`.)
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def _engine(stack, database_url: str | None):
    from sqlalchemy import create_engine

    from backend.db import normalize_url

    return create_engine(normalize_url(database_url) if database_url
                         else f"sqlite:///{stack.data_dir / 'benchlab.db'}")


def submit_to_done(stack, n: int, held: bool = False, stages: list | None = None,
                   database_url: str | None = None) -> list[float]:
    """Submit-to-done times in ms. `stages`, if given, gets one dict per job: where the time went,
    from the client's clock and the timestamps the database holds (all processes share the clock)."""
    from sqlalchemy import text

    engine = _engine(stack, database_url) if stages is not None else None
    out = []
    for i in range(n):
        t0 = time.time()
        sid = stack.submit({"suite": "noop", "params": {"x": i}})["id"]
        t1 = time.time()
        if held:
            status = stack.client.get(f"/api/sweeps/{sid}", params={"wait_s": 30}).json()["status"]
            assert status == "done", status
        else:
            while stack.client.get(f"/api/sweeps/{sid}").json()["status"] != "done":
                time.sleep(0.005)
        t2 = time.time()
        out.append((t2 - t0) * 1e3)
        if stages is not None:
            with engine.connect() as con:
                created, started, finished, recorded = con.execute(text(
                    "SELECT job.created_at, job.started_at, job.finished_at, MAX(result.created_at) FROM job "
                    "JOIN result ON result.job_id = job.id WHERE job.sweep_id = :s "
                    "GROUP BY job.created_at, job.started_at, job.finished_at"), {"s": sid}).one()
            stages.append({"post_ms": (t1 - t0) * 1e3, "queued_to_started_ms": (started - created) * 1e3,
                           "job_ms": (finished - started) * 1e3, "result_to_recorded_ms": (recorded - finished) * 1e3,
                           "recorded_to_client_ms": (t2 - recorded) * 1e3})
    return out


def big_sweep(stack, cells: int) -> float:
    t0 = time.perf_counter()
    sid = stack.submit({"suite": "noop", "params": {"x": list(range(cells))}})["id"]
    stack.wait(sid, timeout=1800)
    return time.perf_counter() - t0


def results_latency(data_dir: Path, rows: int, reps: int = 10, database_url: str | None = None) -> dict:
    """Fill a sweep of `rows` finished jobs, then time GET /results (JSON and CSV) in-process."""
    from fastapi.testclient import TestClient

    from backend.db import session
    from backend.main import create_app
    from backend.models import Job, Result, Sweep
    from backend.settings import BackendSettings

    app = create_app(BackendSettings(data_dir=data_dir, max_grid_cells=rows, database_url=database_url),
                     with_recorder=False)
    with session(app.state.engine) as db:
        sweep = Sweep(suite="attention", params={})
        db.add(sweep)
        db.flush()
        jobs = [Job(sweep_id=sweep.id, cell_index=i, state="done",
                    params={"impl": "naive", "seq_len": i, "batch": 4, "heads": 8, "d_head": 64, "dtype": "bf16",
                            "causal": True, "pass": "fwd_bwd", "device": "cuda", "warmup": 3, "repeats": 10})
                for i in range(rows)]
        db.add_all(jobs)
        db.flush()
        db.add_all(Result(job_id=j.id, state="done", metrics={"median_ms": 1.0 + j.cell_index, "p20_ms": 1.0,
                                                                 "p80_ms": 2.0, "tflops": 100.0, "samples": 10})
                   for j in jobs)
        db.commit()
        sid = sweep.id
    out = {}
    with TestClient(app) as c:
        for fmt in ("json", "csv"):
            c.get(f"/api/sweeps/{sid}/results?format={fmt}")  # warm
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                r = c.get(f"/api/sweeps/{sid}/results?format={fmt}")
                ts.append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200
            out[fmt] = {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts), "samples": reps}
    return out


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median_ms": statistics.median(xs), "p20_ms": xs[len(xs) // 5], "p80_ms": xs[4 * len(xs) // 5],
            "min_ms": xs[0], "samples": len(xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=50, help="submit-to-done samples per broker")
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/8")
    ap.add_argument("--database-url", default=None, help="an empty database for the API (default: SQLite)")
    args = ap.parse_args()

    from tests.stack import Stack, exit_on_sigterm
    from worker.harness import fingerprint

    exit_on_sigterm()  # a run killed by `timeout` still stops the API and worker it started

    from worker.settings import WorkerSettings

    result: dict = {"env": fingerprint(WorkerSettings().commit), "database": (args.database_url or "sqlite").split("://")[0].split("+")[0]}
    extra = {"BENCHLAB_DATABASE_URL": args.database_url} if args.database_url else {}
    for broker in ("embedded", "redis"):
        with tempfile.TemporaryDirectory() as d:
            stack = Stack(Path(d), broker_url=args.redis if broker == "redis" else None,
                          queue=f"bench-{int(time.time())}" if broker == "redis" else "default",
                          extra_env=extra).start()
            try:
                submit_to_done(stack, 3)  # the runner's first start (torch import) stays out
                result[f"submit_to_done_{broker}"] = summary(submit_to_done(stack, args.jobs))
                stages: list[dict] = []
                result[f"submit_to_done_{broker}_held"] = summary(submit_to_done(stack, args.jobs, held=True,
                                                                                 stages=stages,
                                                                                 database_url=args.database_url))
                result[f"submit_to_done_{broker}_held_stages_median_ms"] = {
                    k: statistics.median(st[k] for st in stages) for k in stages[0]}
                if broker == "embedded":
                    result[f"sweep_{args.cells}_cells_embedded_s"] = big_sweep(stack, args.cells)
            finally:
                stack.stop()
        print(json.dumps({k: v for k, v in result.items() if k != "env"}, indent=1), flush=True)
    with tempfile.TemporaryDirectory() as d:
        result[f"results_endpoint_{args.rows}_rows"] = results_latency(Path(d), args.rows,
                                                                       database_url=args.database_url)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
