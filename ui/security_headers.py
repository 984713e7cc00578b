"""Content-Security-Policy and friends on every response: the browser fetches only from the app itself."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import TYPE_CHECKING

from starlette.datastructures import MutableHeaders

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from starlette.types import ASGIApp, Message, Receive, Scope, Send

_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def script_hashes(page: str) -> list[str]:
    """CSP sources for the inline scripts of a page the server itself generates."""
    return [
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(page)
    ]


def content_security_policy(
    public_url: str, *, image_origins: Iterable[str] = (), script_sources: Iterable[str] = ()
) -> str:
    """The policy: own origin only, plus listed image origins and hashed inline scripts.

    Chainlit's React UI and Plotly set inline styles, images may be data:/blob: (avatars,
    charts), and the chat runs over socket.io on the app's own origin.
    """
    origin = public_url.rstrip("/")
    sockets = re.sub(r"^http", "ws", origin)
    directives = {
        "default-src": ["'self'"],
        "script-src": ["'self'", *script_sources],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:", "blob:", *image_origins],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'", origin, sockets],
        "media-src": ["'self'", "blob:"],
        "frame-src": ["'self'", "blob:"],
        "worker-src": ["'self'", "blob:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        # The bundled sign-in form posts to this origin and redirects back to it.
        "form-action": ["'self'", origin],
        "frame-ancestors": ["'none'"],
    }
    return "; ".join(f"{name} {' '.join(dict.fromkeys(v))}" for name, v in directives.items())


class SecurityHeaders:
    """ASGI middleware: every HTTP response gets the policy unless it already carries its own
    (the bundled sign-in pages have a stricter one), plus nosniff and no referrer."""

    def __init__(self, app: ASGIApp, *, policy: Callable[[], str]) -> None:
        self.app = app
        self.policy = policy
        self._value: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if "content-security-policy" not in headers:
                    if self._value is None:
                        self._value = self.policy()
                    headers["Content-Security-Policy"] = self._value
                headers.setdefault("X-Content-Type-Options", "nosniff")
                # Not no-referrer: under it a browser sends `Origin: null` with the app's own
                # form posts and fetches, which the origin check (ui/origin_guard.py) refuses.
                headers.setdefault("Referrer-Policy", "same-origin")
            await send(message)

        await self.app(scope, receive, with_headers)
