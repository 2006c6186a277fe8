"""What stands between the API and hostile input: auth, sessions, CSRF, origins, hosts, sizes, headers.

Auth. With `BENCHLAB_API_TOKEN` set, writes need the token; with `BENCHLAB_PROTECT_READS` too,
so does every read, pages and downloads included. A client sends `Authorization: Bearer <token>`.
A browser signs in once at /login: the answer sets an HttpOnly, SameSite=Strict session cookie
(an HMAC of the token, so changing the token signs everyone out) that page script cannot read,
and a `benchlab_csrf` cookie that it can. A named token (backend/tokens.py) signs in too: its
cookie is `t.<name>.<HMAC of its stored hash>`, checked against the live row on every request, so
revoking the token signs its sessions out and the session has the token's scope. A write
authenticated by the session cookie must echo that value in `X-CSRF-Token` (double submit).

Every write whose `Origin` (or `Sec-Fetch-Site: cross-site`) names another site is refused,
token or not. `BENCHLAB_ALLOWED_HOSTS` limits the Host header (DNS rebinding). Bodies above
`BENCHLAB_MAX_BODY_KB` are refused with 413 (artifact uploads have their own cap). HTML answers
carry a Content-Security-Policy with a per-request script nonce; every answer carries nosniff, a
referrer policy and frame denial.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.settings import BackendSettings

SESSION_COOKIE = "benchlab_session"
CSRF_COOKIE = "benchlab_csrf"
CSRF_HEADER = "x-csrf-token"
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
_ARTIFACT_PUT = re.compile(r"^/api/jobs/[^/]+/artifacts/[^/]+$")


def session_value(token: str) -> str:
    return hmac.new(token.encode(), b"benchlab-session-v1", hashlib.sha256).hexdigest()


NAMED_SESSION_PREFIX = "t."


def named_session_value(name: str, token_hash: str) -> str:
    """The session cookie of a browser signed in with the named token `name` (stored hash `token_hash`)."""
    mac = hmac.new(token_hash.encode(), b"benchlab-named-session-v1", hashlib.sha256).hexdigest()
    return f"{NAMED_SESSION_PREFIX}{name}.{mac}"


def named_session_parts(cookie: str | None) -> tuple[str, str] | None:
    """(token name, mac) of a named-token session cookie, or None for any other value."""
    if not cookie or not cookie.startswith(NAMED_SESSION_PREFIX):
        return None
    name, _, mac = cookie[len(NAMED_SESSION_PREFIX):].rpartition(".")
    return (name, mac) if name and mac else None


def valid_bearer(settings: BackendSettings, authorization: str | None) -> bool:
    if not settings.api_token or not authorization:
        return False
    return secrets.compare_digest(authorization.encode(), f"Bearer {settings.api_token}".encode())


def valid_session(settings: BackendSettings, cookie: str | None) -> bool:
    if not settings.api_token or not cookie:
        return False
    return secrets.compare_digest(cookie.encode(), session_value(settings.api_token).encode())


def csp(nonce: str) -> str:
    return ("default-src 'self'; "
            f"script-src 'self' 'nonce-{nonce}'; "
            "style-src 'self' 'unsafe-inline'; "  # plotly.js styles its own elements
            "img-src 'self' data: blob:; connect-src 'self'; font-src 'self' data:; "
            "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


class GuardMiddleware:
    """Host allow-list, foreign-origin writes, body cap, security headers. Pure ASGI: it sees every
    request before routing, and counts streamed bodies without buffering them."""

    def __init__(self, app: ASGIApp, settings: BackendSettings):
        self.app = app
        self.settings = settings
        hosts = [h.strip().lower() for h in settings.allowed_hosts.split(",") if h.strip()]
        self.allowed_hosts = None if "*" in hosts or not hosts else set(hosts)
        self.max_body = settings.max_body_kb * 1024

    def _host_ok(self, headers: Headers) -> bool:
        if self.allowed_hosts is None:
            return True
        host = headers.get("host", "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return host in self.allowed_hosts or name.strip("[]") in self.allowed_hosts

    @staticmethod
    def _foreign_origin(headers: Headers) -> str | None:
        """Why a write comes from another site, or None. Ports are compared after dropping the scheme's
        default, the scheme not at all (a TLS proxy in front makes the app see http)."""
        if headers.get("sec-fetch-site") == "cross-site":
            return "a cross-site request (Sec-Fetch-Site)"
        origin = headers.get("origin")
        if origin is None:
            return None
        o = urlsplit(origin)
        if origin == "null" or not o.netloc:
            return f"Origin {origin}"

        def norm(netloc: str) -> str:
            netloc = netloc.lower()
            default = {"http": ":80", "https": ":443"}.get(o.scheme, "")
            return netloc[: -len(default)] if default and netloc.endswith(default) else netloc

        return None if norm(o.netloc) == norm(headers.get("host", "")) else f"Origin {origin}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self._host_ok(headers):
            await _error(400, f"host {headers.get('host')!r} is not in BENCHLAB_ALLOWED_HOSTS")(scope, receive, send)
            return
        method = scope["method"]
        if method in UNSAFE_METHODS:
            foreign = self._foreign_origin(headers)
            if foreign:
                await _error(403, f"refused: writes from another site ({foreign}) are not accepted")(
                    scope, receive, send)
                return
        limit = None if _ARTIFACT_PUT.match(scope["path"]) else self.max_body
        if limit is not None:
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > limit):
                await _error(413, f"request body over the limit of {self.settings.max_body_kb} KiB "
                                  f"(BENCHLAB_MAX_BODY_KB)")(scope, receive, send)
                return
        nonce = secrets.token_urlsafe(16)
        scope.setdefault("state", {})["csp_nonce"] = nonce
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if limit is not None and message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"request body over the limit of {self.settings.max_body_kb} KiB "
                                             f"(BENCHLAB_MAX_BODY_KB)")
            return message

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers", []))
                names = {k.lower() for k, _ in raw}
                extra = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin"),
                         (b"x-frame-options", b"DENY")]
                ctype = dict((k.lower(), v) for k, v in raw).get(b"content-type", b"")
                if ctype.startswith(b"text/html"):
                    extra.append((b"content-security-policy", csp(nonce).encode()))
                else:
                    extra.append((b"content-security-policy", b"frame-ancestors 'none'"))
                raw += [(k, v) for k, v in extra if k not in names]
                message = {**message, "headers": raw}
            await send(message)

        await self.app(scope, limited_receive, send_with_headers)
