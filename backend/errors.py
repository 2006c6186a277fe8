"""Error answers: one body shape (`{"detail": ...}`), declared in OpenAPI, and the handlers that map
benchlab's own exceptions to status codes. A browser's navigation to a page (not /api) gets the same
error as an HTML page instead (`page_error`), so a mistyped sweep id is not answered with raw JSON."""
from __future__ import annotations

import math
from typing import Any, Callable

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from backend.models import SURROGATE, ErrorPublic
from backend.service import BrokerUnavailable

COMMON_ERRORS: dict[int | str, dict] = {
    400: {"model": ErrorPublic, "description": "Host not in BENCHLAB_ALLOWED_HOSTS"},
    401: {"model": ErrorPublic, "description": "Missing or wrong API token"},
    403: {"model": ErrorPublic, "description": "A write from another site, or a failed CSRF check"},
    413: {"model": ErrorPublic, "description": "Body over BENCHLAB_MAX_BODY_KB"},
}
NOT_FOUND = {404: {"model": ErrorPublic, "description": "No such sweep, job or artifact"}}
BROKER_DOWN = {503: {"model": ErrorPublic, "description": "The broker is unreachable; nothing was changed"}}
TOO_MANY_WAITERS = {429: {"model": ErrorPublic, "description": "Too many held waits (BENCHLAB_MAX_WAITERS)"}}
CONFLICT = {409: {"model": ErrorPublic, "description": "The artifact exists already"}}


def invalid_query(name: str, msg: str) -> HTTPException:
    """A 422 for a query parameter the route itself rejects, shaped like FastAPI's own validation
    errors (`detail` a list of {loc, msg, type}), so one schema describes every 422."""
    return HTTPException(422, detail=[{"loc": ["query", name], "msg": msg, "type": "value_error"}])


def _printable(value: Any) -> Any:
    """Echoed input that JSON can carry: lone surrogates replaced (U+FFFD), which UTF-8 cannot encode, and
    a NaN or infinity (which Python's JSON parser takes from a body) as its name: 'nan', 'inf'."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8") if SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    return value


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette names none: the 405 comes from the first
    route whose path matched). Asked of each route through its public `matches`, which also looks
    inside included routers."""
    allowed = []
    for method in METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


API_PATHS = ("/api/", "/openapi.json", "/docs", "/redoc", "/static/")
PageError = Callable[[Request, int, list[str], dict], Response]  # (request, status, messages, headers)


def wants_page(request: Request) -> bool:
    """A browser navigating to a page: it names text/html in Accept (script fetches and API clients send
    */* or JSON) and the path is not the API's."""
    return "text/html" in request.headers.get("accept", "") and not request.url.path.startswith(API_PATHS)


def error_messages(detail: Any) -> list[str]:
    """An error's detail as lines for a person: FastAPI's validation entries become
    "query parameter 'limit': Input should be greater than or equal to 2 (got '1')"."""
    if not isinstance(detail, list):
        return [str(detail)]
    lines = []
    for entry in detail:
        if not isinstance(entry, dict):
            lines.append(str(entry))
            continue
        loc = [str(part) for part in entry.get("loc", ())]
        where = f"{loc[0]} parameter '{'.'.join(loc[1:])}'" if len(loc) > 1 else ".".join(loc) or "request"
        got = f" (got {entry['input']!r})" if isinstance(entry.get("input"), (str, int, float)) else ""
        lines.append(f"{where}: {entry.get('msg', 'invalid')}{got}")
    return lines


def install_error_handlers(app: FastAPI, page_error: PageError | None = None) -> None:
    """`page_error`, when given, renders the error for a browser's navigation to a page (wants_page)."""
    def answer(request: Request, status_code: int, detail: Any, headers: dict | None = None) -> Response:
        if page_error is not None and status_code >= 400 and wants_page(request):  # a redirect stays one
            if status_code == 404 and detail == "Not Found":  # no route matched: say which path
                detail = f"nothing is at {request.url.path}"
            return page_error(request, status_code, error_messages(detail), headers or {})
        return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        if exc.status_code in (204, 304):
            return JSONResponse(None, status_code=exc.status_code, headers=headers)
        return answer(request, exc.status_code, exc.detail, headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return answer(request, 422, _printable(jsonable_encoder(exc.errors())))

    @app.exception_handler(BrokerUnavailable)
    async def _broker_down(request: Request, exc: BrokerUnavailable) -> JSONResponse:
        return JSONResponse({"detail": f"{exc}; nothing was changed, try again later"}, status_code=503,
                            headers={"Retry-After": "5"})
