"""Shared FastAPI dependencies as Annotated aliases.

They are `async def` although none of them awaits: FastAPI runs a plain `def` dependency in its
thread pool, one thread hop each (and one more for a generator's teardown), which cost more than
the work itself on a small host. None of them blocks: a Session opens its connection only when the
endpoint, which runs in the pool, first uses it.
"""
from __future__ import annotations

import secrets
from typing import Annotated, AsyncIterator

from fastapi import Depends, Header, HTTPException, Request
from sqlmodel import Session

from backend.changes import ChangeFeed
from backend.db import session
from backend.dispatch import Dispatcher
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


def _check_token(settings: BackendSettings, authorization: str | None) -> None:
    if not settings.api_token:
        return
    expected = f"Bearer {settings.api_token}"
    if not authorization or not secrets.compare_digest(authorization.encode(), expected.encode()):
        raise HTTPException(401, detail="missing or wrong API token: send Authorization: Bearer <token>",
                            headers={"WWW-Authenticate": "Bearer"})


async def require_write(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    _check_token(request.app.state.settings, authorization)


async def require_read(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    if request.app.state.settings.protect_reads:
        _check_token(request.app.state.settings, authorization)


SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[BackendSettings, Depends(get_app_settings)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]
ChangesDep = Annotated[ChangeFeed, Depends(get_changes)]
WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)
