"""GET /metrics for Prometheus, behind a bearer token (CAIRN_METRICS_TOKEN); not served without one."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from graphs.core.metrics import SlowFigures, exposition

if TYPE_CHECKING:
    from collections.abc import Callable

    from graphs.core.pool import Pool


def authorized(header: str | None, token: str) -> bool:
    """`Authorization: Bearer <token>`, compared in constant time."""
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def build_router(token: str | None, pool: Callable[[], Pool]) -> APIRouter:
    """`pool` is read per scrape (the worker's pool, once it has started)."""
    router = APIRouter()
    slow = SlowFigures()

    @router.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        if not token:
            return PlainTextResponse("Not Found", status_code=404)
        if not authorized(request.headers.get("authorization"), token):
            return PlainTextResponse(
                "Unauthorized", status_code=401, headers={"WWW-Authenticate": "Bearer"}
            )
        return Response(await exposition(pool(), slow), media_type=CONTENT_TYPE_LATEST)

    return router
