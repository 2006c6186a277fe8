"""Shared FastAPI dependencies as Annotated aliases.

They are `async def` although none of them awaits: FastAPI runs a plain `def` dependency in its
thread pool, one thread hop each (and one more for a generator's teardown), which cost more than
the work itself on a small host. None of them blocks: a Session opens its connection only when the
endpoint, which runs in the pool, first uses it.
"""
from __future__ import annotations

import secrets
from typing import Annotated, AsyncIterator
from urllib.parse import quote

from fastapi import Depends, Header, HTTPException, Request
from sqlmodel import Session

from backend import tokens
from backend.changes import ChangeFeed
from backend.db import session
from backend.dispatch import Dispatcher
from backend.security import (
    CSRF_COOKIE,
    CSRF_HEADER,
    SESSION_COOKIE,
    named_session_parts,
    named_session_value,
    valid_bearer,
    valid_session,
)
from backend.settings import BackendSettings


async def get_db(request: Request) -> AsyncIterator[Session]:
    with session(request.app.state.engine) as db:
        yield db


async def get_app_settings(request: Request) -> BackendSettings:
    return request.app.state.settings


async def get_dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


async def get_changes(request: Request) -> ChangeFeed:
    return request.app.state.changes


def _named_token(request: Request, authorization: str | None, needed: str) -> bool:
    """Whether the bearer is a live named token (backend/tokens.py); 403 if its scope is too small."""
    if not authorization or not authorization.startswith("Bearer bl_"):
        return False
    with session(request.app.state.engine) as db:
        row = tokens.lookup(db, authorization.removeprefix("Bearer "))
        if row is None:
            return False
        if not tokens.scope_allows(row.scope, needed):
            raise HTTPException(403, detail=f"token {row.name!r} has scope {row.scope}; this needs {needed}")
    return True


def _named_session(request: Request, cookie: str | None, needed: str) -> bool:
    """Whether the session cookie is a live named token's (signed in at /login); 403 if its scope is too small."""
    parts = named_session_parts(cookie)
    if parts is None:
        return False
    with session(request.app.state.engine) as db:
        row = tokens.live_by_name(db, parts[0])
    expected = named_session_value(row.name, row.token_hash) if row is not None else ""
    if row is None or not secrets.compare_digest(cookie.encode(), expected.encode()):
        return False
    if not tokens.scope_allows(row.scope, needed):
        raise HTTPException(403, detail=f"signed in with token {row.name!r}, scope {row.scope}; this needs {needed}")
    return True


def _authorize(request: Request, authorization: str | None, write: bool, needed: str | None = None) -> None:
    """Token in the Authorization header (BENCHLAB_API_TOKEN, with every scope, or a named token of
    enough scope), or (browsers) the session cookie plus, for writes, the CSRF echo."""
    settings = request.app.state.settings
    needed = needed or ("write" if write else "read")
    if not settings.auth_required or valid_bearer(settings, authorization):
        return
    if _named_token(request, authorization, needed):
        return
    cookie = request.cookies.get(SESSION_COOKIE)
    if valid_session(settings, cookie) or _named_session(request, cookie, needed):
        if write:
            cookie, echo = request.cookies.get(CSRF_COOKIE), request.headers.get(CSRF_HEADER)
            if not cookie or not echo or not secrets.compare_digest(cookie.encode(), echo.encode()):
                raise HTTPException(403, detail="CSRF check failed: a write signed in by cookie must send the "
                                                "benchlab_csrf cookie's value in X-CSRF-Token")
        return
    raise HTTPException(401, detail="missing or wrong API token: send Authorization: Bearer <token> "
                                    "(or sign in at /login)", headers={"WWW-Authenticate": "Bearer"})


async def require_write(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    _authorize(request, authorization, write=True)


async def require_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    _authorize(request, authorization, write=True, needed="admin")


async def require_read(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    if request.app.state.settings.protect_reads:
        _authorize(request, authorization, write=False)


async def require_page_read(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """Pages under BENCHLAB_PROTECT_READS: a browser that is not signed in is sent to /login."""
    if not request.app.state.settings.protect_reads:
        return
    try:
        _authorize(request, authorization, write=False)
    except HTTPException:
        target = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""), safe="")
        raise HTTPException(303, detail="sign in first", headers={"Location": f"/login?next={target}"}) from None


SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[BackendSettings, Depends(get_app_settings)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]
ChangesDep = Annotated[ChangeFeed, Depends(get_changes)]
WriteAuth = Depends(require_write)
AdminAuth = Depends(require_admin)
ReadAuth = Depends(require_read)
PageAuth = Depends(require_page_read)
