"""Named API tokens (`benchlab token ...`, /api/tokens): created with a scope, stored as a hash,
revocable, their last use recorded. The single BENCHLAB_API_TOKEN keeps working beside them, with
the admin scope.

Scopes: read (GET), write (read, plus creating, retrying, cancelling sweeps and uploading
artifacts), admin (write, plus managing tokens). A secret is `bl_` and 32 random bytes in URL-safe
base64; the database keeps its SHA-256 and its first 8 characters.
"""
from __future__ import annotations

import hashlib
import re
import secrets
import time

from sqlmodel import Session, select

from backend.models import TOKEN_SCOPES, ApiToken

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
LAST_USED_EVERY_S = 60.0  # last_used_at is written at most once a minute per token: no write per request


class TokenError(ValueError):
    """A token operation the caller asked for that cannot be done (bad name or scope, duplicate, unknown)."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def scope_allows(scope: str, needed: str) -> bool:
    return TOKEN_SCOPES.index(scope) >= TOKEN_SCOPES.index(needed)


def create(db: Session, name: str, scope: str) -> tuple[ApiToken, str]:
    """A new token (row, secret). The secret is returned once and never stored."""
    if not re.fullmatch(NAME_PATTERN, name):
        raise TokenError("token names are 1-100 letters, digits, '_', '.', '-', starting with a letter or digit")
    if scope not in TOKEN_SCOPES:
        raise TokenError(f"unknown scope {scope!r}; choose from {', '.join(TOKEN_SCOPES)}")
    if db.exec(select(ApiToken).where(ApiToken.name == name)).first() is not None:
        raise TokenError(f"a token named {name!r} exists (revoked tokens keep their name)")
    secret = "bl_" + secrets.token_urlsafe(32)
    row = ApiToken(name=name, scope=scope, token_hash=hash_secret(secret), prefix=secret[:8])
    db.add(row)
    db.commit()
    db.refresh(row)
    return row, secret


def revoke(db: Session, name: str) -> ApiToken:
    row = db.exec(select(ApiToken).where(ApiToken.name == name)).first()
    if row is None:
        raise TokenError(f"no token named {name!r}")
    if row.revoked_at is None:
        row.revoked_at = time.time()
        db.add(row)
        db.commit()
        db.refresh(row)
    return row


def list_tokens(db: Session) -> list[ApiToken]:
    return list(db.exec(select(ApiToken).order_by(ApiToken.id)).all())


def live_by_name(db: Session, name: str) -> ApiToken | None:
    """The token called `name` if it exists and is not revoked."""
    row = db.exec(select(ApiToken).where(ApiToken.name == name)).first()
    return row if row is not None and row.revoked_at is None else None


def lookup(db: Session, secret: str) -> ApiToken | None:
    """The live token with this secret (its last use noted), or None."""
    row = db.exec(select(ApiToken).where(ApiToken.token_hash == hash_secret(secret))).first()
    if row is None or row.revoked_at is not None:
        return None
    now = time.time()
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY_S:
        row.last_used_at = now
        db.add(row)
        db.commit()
        db.refresh(row)
    return row
