"""Request-size limit in front of Chainlit, which reads a whole upload into memory before checking it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import JSONResponse

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

UPLOAD_PATH_SUFFIX = "/project/file"
# Multipart framing around the file itself.
_OVERHEAD_BYTES = 64 * 1024


class UploadSizeLimit:
    """Refuse uploads whose body is larger than the configured limit, before reading them."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes + _OVERHEAD_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith(UPLOAD_PATH_SUFFIX):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is None or not length.isdigit() or int(length) > self.max_bytes:
            response = JSONResponse({"detail": "File too large or size unknown"}, status_code=413)
            await response(scope, receive, send)
            return
        await self.app(scope, self._capped(receive), send)

    def _capped(self, receive: Receive) -> Receive:
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                msg = "request body larger than its Content-Length"
                raise ValueError(msg)
            return message

        return capped
