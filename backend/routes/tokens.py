"""/api/tokens: named API tokens (backend/tokens.py). Every route needs the admin scope."""
from __future__ import annotations

from fastapi import APIRouter, HTTPException, Path

from backend import tokens
from backend.deps import AdminAuth, SessionDep
from backend.errors import ErrorPublic
from backend.models import ApiTokenCreate, ApiTokenCreated, ApiTokenPublic

router = APIRouter(prefix="/api/tokens", tags=["tokens"], dependencies=[AdminAuth])


@router.get("", response_model=list[ApiTokenPublic])
def list_tokens(db: SessionDep) -> list:
    return tokens.list_tokens(db)


@router.post("", status_code=201, response_model=ApiTokenCreated,
             responses={409: {"model": ErrorPublic, "description": "A token of that name exists"}})
def create_token(body: ApiTokenCreate, db: SessionDep) -> dict:
    """A new token; the answer holds its secret, shown this once."""
    try:
        row, secret = tokens.create(db, body.name, body.scope)
    except tokens.TokenError as exc:
        raise HTTPException(409, detail=str(exc)) from exc
    return {**row.model_dump(), "token": secret}


@router.delete("/{name}", response_model=ApiTokenPublic,
               responses={404: {"model": ErrorPublic, "description": "No such token"}})
def revoke_token(db: SessionDep, name: str = Path(max_length=100)):
    """Revoke a token: it stops working at once; its row (and name) stays, for the record."""
    try:
        return tokens.revoke(db, name)
    except tokens.TokenError as exc:
        raise HTTPException(404, detail=str(exc)) from exc
