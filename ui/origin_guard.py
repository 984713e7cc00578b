"""Requests that act for the signed-in user come only from the app's own pages.

The session cookie is sent by the browser with any request to this host, whichever page makes
it: a foreign site, or a page of the same host on another port or subdomain (the browser counts
those as the same site). So every websocket handshake (the chat socket) and every
state-changing HTTP request must name an allowed origin (`CAIRN_ALLOW_ORIGINS`, default the
public URL). A request without an Origin header is a browser's only for same-origin
navigation-like requests, which do not change state: a state-changing one carrying the session
cookie must then show an allowed Referer; one without a cookie (an MCP client with a bearer
token, a health probe) acts for nobody and passes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

if TYPE_CHECKING:
    from collections.abc import Iterable

    from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("cairn.security")

REFUSED = "This request did not come from Cairn's own pages and was refused."
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SESSION_COOKIE = "access_token"
"""The session cookie's name (and the prefix of its chunks)."""
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def normalise_origin(value: str) -> str | None:
    """`scheme://host[:port]` lowercased, the default port dropped; None for anything else
    (`null`, a path, userinfo, no host)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host or parts.username or parts.password:
        return None
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


class OriginGuard:
    """ASGI middleware: refuses cross-origin websocket handshakes and state-changing requests."""

    def __init__(self, app: ASGIApp, *, origins: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(o for o in map(normalise_origin, origins) if o is not None)
        if not self.allowed:
            msg = "OriginGuard needs at least one allowed origin"
            raise ValueError(msg)

    def allows(self, scope: Scope) -> bool:
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is not None:
            return normalise_origin(origin) in self.allowed
        if scope["type"] == "websocket":
            return False  # every browser sends Origin with a websocket handshake
        if scope.get("method", "GET") in SAFE_METHODS:
            return True  # changes nothing; a cross-origin fetch of it carries an Origin
        if SESSION_COOKIE not in headers.get("cookie", ""):
            return True
        referer = headers.get("referer")
        return referer is not None and normalise_origin(referer) in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allows(scope):
            await self.app(scope, receive, send)
            return
        origin = Headers(scope=scope).get("origin")
        log.warning(
            "refused: %s %s from origin %r",
            scope.get("method", "WEBSOCKET"),
            scope.get("path"),
            (origin or "")[:200],
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4403})
            return
        await JSONResponse({"detail": REFUSED}, status_code=403)(scope, receive, send)
