"""Error answers: one body shape (`{"detail": ...}`), declared in OpenAPI, and the handlers that map
benchlab's own exceptions to status codes."""
from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from backend.models import ErrorPublic
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
_SURROGATE = re.compile("[\ud800-\udfff]")
CONFLICT = {409: {"model": ErrorPublic, "description": "The artifact exists already"}}


def invalid_query(name: str, msg: str) -> HTTPException:
    """A 422 for a query parameter the route itself rejects, shaped like FastAPI's own validation
    errors (`detail` a list of {loc, msg, type}), so one schema describes every 422."""
    return HTTPException(422, detail=[{"loc": ["query", name], "msg": msg, "type": "value_error"}])


def _printable(value: Any) -> Any:
    """Echoed input with lone surrogates replaced (U+FFFD): they cannot be encoded as UTF-8."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8") if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    return value


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        regex = getattr(route, "path_regex", None)
        if regex is not None and regex.match(request.url.path) and getattr(route, "methods", None):
            methods |= set(route.methods)
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        if exc.status_code in (204, 304):
            return JSONResponse(None, status_code=exc.status_code, headers=headers)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _printable(jsonable_encoder(exc.errors()))}, status_code=422)

    @app.exception_handler(BrokerUnavailable)
    async def _broker_down(request: Request, exc: BrokerUnavailable) -> JSONResponse:
        return JSONResponse({"detail": f"{exc}; nothing was changed, try again later"}, status_code=503,
                            headers={"Retry-After": "5"})
