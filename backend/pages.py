"""HTML pages: `/` (sweeps and the new-sweep form), `/sweeps/{id}`, `/compare?a=&b=`, `/history`,
`/planner`, `/login`, and the error page a browser gets for a bad page address (`error_page`).

JSON reaches page script only through Jinja's `tojson` (script-safe: `<`, `>`, `&` and `'` are
escaped), and every inline script carries the request's CSP nonce (backend/security.py).
"""
from __future__ import annotations

import json
import secrets
from collections import OrderedDict
from http import HTTPStatus
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, HTTPException, Path, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from backend import service, tokens
from backend.compare import ENV_KEYS
from backend.compare import compare as compare_cells  # `compare` is the page below
from backend.deps import PageAuth, ReadAuth, SessionDep, SettingsDep
from backend.models import Sweep
from backend.routes.compare import check_ignore, load_sweeps
from backend.routes.history import load_history
from backend.routes.plan import PlanQuery, make_plan
from backend.routes.suites import suite_info
from backend.security import CSRF_COOKIE, SESSION_COOKIE, named_session_value, session_value
from frontend import STATIC_DIR, TEMPLATE_DIR, plotly_js_path
from frontend.charts import compare_figure, history_figure, planner_figure, sweep_figures
from worker.suites import suite_names

router = APIRouter(tags=["pages"], include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATE_DIR))


def four_digits(x: float) -> str:
    """A time for a table: four significant digits, trailing zeros kept so a column reads alike
    (5.000, 12.30, 0.01234), whole numbers from 1000 up (7420, 12346)."""
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:#.4g}".rstrip(".")  # 999.96 rounds to "1000."


templates.env.filters["four_digits"] = four_digits
DbId = Annotated[int, Path(ge=1, le=2**63 - 1)]


def _render(request: Request, name: str, context: dict, status_code: int = 200) -> HTMLResponse:
    settings = request.app.state.settings
    context = {**context, "csp_nonce": request.scope.get("state", {}).get("csp_nonce", ""),
               "auth_enabled": settings.auth_required}
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def error_page(request: Request, status_code: int, messages: list[str], headers: dict) -> HTMLResponse:
    """An error for a browser's navigation (backend/errors.py picks when): the status, what was wrong, and
    a way back. The messages echo the request's own input, which the template escapes."""
    try:
        reason = HTTPStatus(status_code).phrase
    except ValueError:
        reason = "Error"
    answer = _render(request, "error.html", {"status_code": status_code, "reason": reason, "messages": messages},
                     status_code=status_code)
    answer.headers.update(headers)
    return answer


@router.get("/", response_class=HTMLResponse, dependencies=[PageAuth])
def index(request: Request, db: SessionDep):
    suites = [suite_info(n) for n in suite_names()]
    from backend.presets import PRESETS

    presets = [{"name": n, "description": d} for n, (d, _) in PRESETS.items()]
    return _render(request, "index.html", {"sweeps": service.list_sweeps(db, limit=200), "suites": suites,
                                           "presets": presets})


def _sweep_or_404(db, sweep_id: int) -> Sweep:
    sweep = db.get(Sweep, sweep_id)
    if sweep is None:
        raise HTTPException(404, detail=f"sweep {sweep_id} not found")
    return sweep


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse, dependencies=[PageAuth])
def sweep_page(sweep_id: DbId, request: Request, db: SessionDep):
    sweep = _sweep_or_404(db, sweep_id)
    return _render(request, "sweep.html", {"sweep": sweep, "summary": service.get_summary(db, sweep)})


# the last figures built per sweep, keyed by the sweep's version: a poll that finds nothing new
# costs three small queries, and a page opened twice builds its figures once
_DATA_CACHE: OrderedDict[tuple[str, int], tuple[str, str]] = OrderedDict()
_DATA_CACHE_SIZE = 16


@router.get("/sweeps/{sweep_id}/data", dependencies=[ReadAuth])
def sweep_data(sweep_id: DbId, db: SessionDep,
               key: str | None = Query(None, max_length=200, description="the `key` of the last answer: when "
                                                                         "nothing changed since, no rows or figures")):
    """What the sweep page polls: summary, rows (with progress lines), figures, environments, and `key`."""
    sweep = _sweep_or_404(db, sweep_id)
    summary = service.get_summary(db, sweep)
    version = service.sweep_version(db, sweep_id, summary["counts"], sweep.suite)
    if key == version:
        return Response(json.dumps({"summary": summary, "key": version, "unchanged": True}),
                        media_type="application/json")
    cache_key = (str(db.get_bind().url), sweep_id)
    cached = _DATA_CACHE.get(cache_key)
    if cached is None or cached[0] != version:
        rows = service.result_rows(db, sweep_id)
        progress = service.progress_lines(db, sweep_id)
        for r in rows:
            r["progress"] = progress.get(r["job_id"])
        envs = sorted({r["env_id"] for r in rows if r["env_id"]})
        model = service.comm_model(db, sweep, rows)
        body = json.dumps({"rows": rows, "figures": sweep_figures(sweep.suite, rows, model), "environments": envs,
                           "comm_model": model})
        cached = (version, body)
        _DATA_CACHE[cache_key] = cached
        _DATA_CACHE.move_to_end(cache_key)
        while len(_DATA_CACHE) > _DATA_CACHE_SIZE:
            _DATA_CACHE.popitem(last=False)
    head = json.dumps({"summary": summary, "key": version, "unchanged": False})
    return Response(head[:-1] + "," + cached[1][1:], media_type="application/json")


def _env_diff(rows_a, rows_b, envs: dict[int, dict], keys: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(key, A's values, B's values) for each fingerprint key among `keys` on which the sweeps differ."""
    ea = [envs[i] for i in {r["env_id"] for r in rows_a if r["env_id"]}]
    eb = [envs[i] for i in {r["env_id"] for r in rows_b if r["env_id"]}]
    if not ea or not eb:
        return []
    out = []
    for k in keys:
        va, vb = sorted({str(e.get(k)) for e in ea}), sorted({str(e.get(k)) for e in eb})
        if va != vb:
            out.append((k, ", ".join(va), ", ".join(vb)))
    return out


@router.get("/compare", response_class=HTMLResponse, dependencies=[PageAuth])
def compare(request: Request, db: SessionDep, a: Annotated[int, Query(ge=1, le=2**63 - 1)],
            b: Annotated[int, Query(ge=1, le=2**63 - 1)],
            threshold: Annotated[float, Query(gt=0, lt=1)] = 0.05,
            ignore: Annotated[str, Query(max_length=1000)] = "",
            allow_env_mismatch: bool = False):
    sa, sb = _sweep_or_404(db, a), _sweep_or_404(db, b)
    loaded = load_sweeps(db, a, b)
    # a name no cell has: say so above the form, and compare on the names that exist (the API refuses)
    names, error = check_ignore(ignore, a, b, loaded[0] + loaded[1])
    result = compare_cells(*loaded, threshold=threshold, ignore=names, allow_env_mismatch=allow_env_mismatch)
    cells = result["cells"]
    keys = sorted({k for c in cells for k in c["params"]
                   if len({json.dumps(x["params"].get(k)) for x in cells}) > 1}) or (
        sorted(cells[0]["params"])[:4] if cells else [])
    return _render(request, "compare.html", {
        # the fingerprint keys the verdicts depend on (a difference makes them inconclusive), apart
        # from what differs as a matter of course when two commits are compared
        "a": sa, "b": sb, "result": result, "keys": keys, "env_diff": _env_diff(*loaded, ENV_KEYS),
        "run_diff": _env_diff(*loaded, ("git_commit", "python", "host")), "allow_env_mismatch": allow_env_mismatch,
        "ignore": ignore, "threshold": threshold, "figure": compare_figure(result), "error": error},
        status_code=422 if error else 200)


@router.get("/history", response_class=HTMLResponse, dependencies=[PageAuth])
def history_page(request: Request, db: SessionDep, suite: Annotated[str, Query(max_length=100)],
                 params: Annotated[str, Query(max_length=4000)] = "{}",
                 threshold: Annotated[float, Query(gt=0, lt=1)] = 0.05,
                 limit: Annotated[int, Query(ge=2, le=500)] = 50,
                 branch: Annotated[str | None, Query(max_length=200)] = None,
                 ignore: Annotated[str, Query(max_length=1000)] = ""):
    result = load_history(db, suite, params, threshold, limit, branch, ignore)
    return _render(request, "history.html", {"result": result, "branch": branch, "figure": history_figure(result)})


@router.get("/planner", response_class=HTMLResponse, dependencies=[PageAuth])
def planner_page(request: Request, db: SessionDep):
    """The planner's form and answer; an empty field means: the model size's, or measured, or the default.
    The fields are checked as /api/plan checks them (PlanQuery)."""
    fields = dict(request.query_params)
    result = make_plan(db, PlanQuery.from_form(fields))
    form = {name: fields.get(name, "" if f.default is None else str(f.default))
            for name, f in PlanQuery.model_fields.items() if f.annotation is not bool}  # the text fields
    return _render(request, "planner.html", {"result": result, "form": form, "figure": planner_figure(result)})


# -- signing in (browsers) ---------------------------------------------------------------------------
def _safe_next(target: str | None) -> str:
    """Only a path on this site: no scheme, no host, no `//` (an open redirect otherwise)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    parts = urlsplit(target)
    return "/" if parts.scheme or parts.netloc else target


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str | None = Query(None, max_length=2000)):
    return _render(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login")
def login(request: Request, settings: SettingsDep, db: SessionDep, token: Annotated[str, Form(max_length=1000)],
          next: Annotated[str | None, Form(max_length=2000)] = None):
    if not settings.auth_required:
        return RedirectResponse(_safe_next(next), status_code=303)
    if settings.api_token and secrets.compare_digest(token.encode(), settings.api_token.encode()):
        value = session_value(settings.api_token)
    else:
        row = tokens.lookup(db, token) if token.startswith("bl_") else None
        if row is None:
            return _render(request, "login.html", {"next": _safe_next(next), "error": "wrong token"},
                           status_code=401)
        value = named_session_value(row.name, row.token_hash)
    resp = RedirectResponse(_safe_next(next), status_code=303)
    secure = request.url.scheme == "https"
    resp.set_cookie(SESSION_COOKIE, value, httponly=True, samesite="strict", secure=secure, max_age=30 * 24 * 3600)
    resp.set_cookie(CSRF_COOKIE, secrets.token_urlsafe(24), httponly=False, samesite="strict", secure=secure,
                    max_age=30 * 24 * 3600)
    return resp


@router.post("/logout")
def logout():
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(SESSION_COOKIE)
    resp.delete_cookie(CSRF_COOKIE)
    return resp


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
