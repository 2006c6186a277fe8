"""HTML pages: `/` (sweeps and the new-sweep form), `/sweeps/{id}`, `/compare?a=&b=`."""
from __future__ import annotations

import json

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.templating import Jinja2Templates

from backend import service
from backend.deps import ReadAuth, SessionDep
from backend.models import Environment, Sweep
from backend.routes.suites import suite_info
from frontend import STATIC_DIR, TEMPLATE_DIR, plotly_js_path
from frontend.charts import compare_figure, compare_rows, sweep_figures
from worker.suites import suite_names

router = APIRouter(tags=["pages"], include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATE_DIR))


@router.get("/", response_class=HTMLResponse)
def index(request: Request, db: SessionDep):
    suites = [suite_info(n) for n in suite_names()]
    return templates.TemplateResponse(request, "index.html", {
        "sweeps": service.list_sweeps(db, limit=200), "suites": suites, "suites_json": json.dumps(suites)})


def _sweep_or_404(db, sweep_id: int) -> Sweep:
    sweep = db.get(Sweep, sweep_id)
    if sweep is None:
        raise HTTPException(404, detail=f"sweep {sweep_id} not found")
    return sweep


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(sweep_id: int, request: Request, db: SessionDep):
    sweep = _sweep_or_404(db, sweep_id)
    return templates.TemplateResponse(request, "sweep.html", {"sweep": sweep, "summary": service.get_summary(db, sweep)})


@router.get("/sweeps/{sweep_id}/data", dependencies=[ReadAuth])
def sweep_data(sweep_id: int, db: SessionDep) -> dict:
    """What the sweep page polls: summary, rows (with progress lines), figures, environments."""
    sweep = _sweep_or_404(db, sweep_id)
    rows = service.result_rows(db, sweep_id)
    progress = service.progress_lines(db, sweep_id)
    for r in rows:
        r["progress"] = progress.get(r["job_id"])
    envs = sorted({r["env_id"] for r in rows if r["env_id"]})
    return {"summary": service.get_summary(db, sweep), "rows": rows, "figures": sweep_figures(sweep.suite, rows),
            "environments": envs, "progress_key": hash(tuple(sorted(progress.items())))}


def _env_diff(db, rows_a, rows_b) -> list[tuple[str, str, str]]:
    def envs(rows):
        ids = {r["env_id"] for r in rows if r["env_id"]}
        return [db.get(Environment, i).data for i in ids]

    ea, eb = envs(rows_a), envs(rows_b)
    if not ea or not eb:
        return []
    keys = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "triton", "python", "git_commit", "host")
    out = []
    for k in keys:
        va, vb = sorted({str(e.get(k)) for e in ea}), sorted({str(e.get(k)) for e in eb})
        if va != vb:
            out.append((k, ", ".join(va), ", ".join(vb)))
    return out


@router.get("/compare", response_class=HTMLResponse)
def compare(request: Request, db: SessionDep, a: int, b: int):
    sa, sb = _sweep_or_404(db, a), _sweep_or_404(db, b)
    rows_a, rows_b = service.result_rows(db, a), service.result_rows(db, b)
    matched = compare_rows(rows_a, rows_b)
    keys = sorted({k for m in matched for k in m["params"]
                   if len({json.dumps(x["params"].get(k)) for x in matched}) > 1}) or sorted(
        matched[0]["params"])[:4] if matched else []
    return templates.TemplateResponse(request, "compare.html", {
        "a": sa, "b": sb, "matched": matched, "keys": keys, "env_diff": _env_diff(db, rows_a, rows_b),
        "figure_json": json.dumps(compare_figure(matched))})


@router.get("/static/plotly.min.js")
def plotly_js():
    return FileResponse(plotly_js_path(), media_type="application/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/static/{name}")
def static_file(name: str):
    path = STATIC_DIR / name
    if "/" in name or not path.is_file():
        raise HTTPException(404, detail=f"no static file {name!r}")
    return FileResponse(path)
