"""A stopping worker refuses new chat connections with a 503 the load balancer retries elsewhere."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

SOCKET_PATH = "/ws/"
"""Chainlit's socket.io endpoint (its websocket and its polling transport)."""

_BODY = b'{"status": "unavailable", "failing": ["draining"]}'
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"cache-control", b"no-store"),
    (b"retry-after", b"1"),
    (b"content-length", str(len(_BODY)).encode()),
]


class DrainGuard:
    """Once the worker drains, a new chat connection (a websocket handshake or a polling
    request) gets 503 before any socket code sees it: nginx passes it to another worker
    (deploy/nginx.conf.template), and a browser reconnecting lands there. Other requests are
    still served until the server closes."""

    def __init__(self, app: ASGIApp, *, draining: Callable[[], bool]) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self._refused(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # Before accept: the handshake's own HTTP answer (the ASGI websocket.http.response
            # extension, which uvicorn serves).
            await send(
                {"type": "websocket.http.response.start", "status": 503, "headers": _HEADERS}
            )
            await send({"type": "websocket.http.response.body", "body": _BODY})
            return
        await send({"type": "http.response.start", "status": 503, "headers": _HEADERS})
        await send({"type": "http.response.body", "body": _BODY})

    def _refused(self, scope: Scope) -> bool:
        return self.draining() and str(scope.get("path", "")).startswith(SOCKET_PATH)
