"""The sweep page's poll on a large sweep: what `GET /sweeps/{id}/data` costs.

    PYTHONPATH=. python benchmarks/sweep_page_data.py --cells 2000 --out page.json

Fills a sweep of `--cells` finished attention cells (rows written straight to the database, one
result each), then times, in-process through the ASGI app, `--reps` times each:
- `first`: a poll with no key (what a page load costs: rows, figures, summary);
- `unchanged`: a poll that sends the key of the previous answer while nothing changed (what the
  page's 1 s poll costs on a running sweep between results); a tree without keys answers in full;
- `after_change`: a poll after one job's state changed.
Runs against whatever `backend` is on PYTHONPATH, so two trees can be compared.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def fill(app, cells: int) -> int:
    from backend.db import session
    from backend.models import Job, Result, Sweep

    with session(app.state.engine) as db:
        sweep = Sweep(suite="attention", params={})
        db.add(sweep)
        db.flush()
        impls = ["naive", "sdpa", "flash_pytorch", "flash_triton"]
        jobs = [Job(sweep_id=sweep.id, cell_index=i, state="done",
                    params={"impl": impls[i % 4], "seq_len": 128 * (1 + i // 4), "batch": 4, "heads": 8, "d_head": 64,
                            "dtype": "bf16", "causal": True, "pass": "fwd_bwd", "device": "cuda", "warmup": 3,
                            "repeats": 10})
                for i in range(cells)]
        db.add_all(jobs)
        db.flush()
        db.add_all(Result(job_id=j.id, state="done", metrics={"median_ms": 1.0 + j.cell_index / 100, "p20_ms": 1.0,
                                                                 "p80_ms": 2.0, "tflops": 100.0, "samples": 10,
                                                                 "peak_mem_bytes": 1e9})
                   for j in jobs)
        db.commit()
        return sweep.id, jobs[0].id


def timed(client, url: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = client.get(url)
    ms = (time.perf_counter() - t0) * 1e3
    assert r.status_code == 200, r.text
    return ms, r.json()


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median_ms": statistics.median(xs), "p20_ms": xs[len(xs) // 5], "p80_ms": xs[4 * len(xs) // 5],
            "min_ms": xs[0], "max_ms": xs[-1], "samples": xs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    from fastapi.testclient import TestClient

    from backend.db import session
    from backend.main import create_app
    from backend.models import Job
    from backend.settings import BackendSettings
    from worker.harness import fingerprint
    from worker.settings import WorkerSettings

    out: dict = {"env": fingerprint(WorkerSettings().commit), "label": args.label, "cells": args.cells}
    with tempfile.TemporaryDirectory() as d:
        app = create_app(BackendSettings(data_dir=Path(d), max_grid_cells=args.cells), with_recorder=False)
        sid, first_job = fill(app, args.cells)
        first, unchanged, changed = [], [], []
        with TestClient(app) as c:
            for i in range(args.reps):
                ms, body = timed(c, f"/sweeps/{sid}/data")
                first.append(ms)
                key = body.get("key", "")
                ms, body = timed(c, f"/sweeps/{sid}/data?key={key}")
                unchanged.append(ms)
                out["unchanged_answer_has_rows"] = "rows" in body
                with session(app.state.engine) as db:  # one job's state changes
                    job = db.get(Job, first_job)
                    job.state = "done" if i % 2 else "failed"
                    db.add(job)
                    db.commit()
                ms, body = timed(c, f"/sweeps/{sid}/data?key={key}")
                changed.append(ms)
        out.update(first=summary(first), unchanged=summary(unchanged), after_change=summary(changed))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: (v["median_ms"] if isinstance(v, dict) and "median_ms" in v else v)
                      for k, v in out.items() if k != "env"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
