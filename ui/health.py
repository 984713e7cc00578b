"""Health endpoints for load balancers and supervisors: /healthz (process up), /readyz (can serve)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fastapi import APIRouter
from fastapi.responses import JSONResponse

if TYPE_CHECKING:
    from graphs.core.pool import Pool

log = logging.getLogger("cairn.health")

DATABASE_TIMEOUT_S = 2.0
"""How long the readiness check waits for a connection and `SELECT 1`: far below a load
balancer's probe interval, so a stalled Postgres makes the probe fail, not hang."""

_NO_STORE = {"Cache-Control": "no-store"}


class Jobs(Protocol):
    @property
    def running(self) -> bool: ...


class Serving(Protocol):
    """What readiness reads of the app runtime (ui/runtime.py AppRuntime)."""

    pool: Pool

    @property
    def started(self) -> bool: ...

    @property
    def memory_jobs(self) -> Jobs | None: ...

    @property
    def draining(self) -> bool: ...


async def failing_checks(runtime: Serving | None) -> list[str]:
    """The names of the checks that fail: 'starting', 'draining', 'database', 'jobs'; empty
    when ready. A stopping worker is not ready at once, before anything else is asked."""
    if runtime is None or not runtime.started:
        return ["starting"]
    if runtime.draining:
        return ["draining"]
    failing = []
    if not await database_answers(runtime.pool):
        failing.append("database")
    jobs = runtime.memory_jobs
    if jobs is None or not jobs.running:
        failing.append("jobs")
    return failing


async def database_answers(pool: Pool, *, timeout_s: float = DATABASE_TIMEOUT_S) -> bool:
    """A pooled connection answers `SELECT 1` within the timeout (the pool checks it first)."""
    try:
        async with asyncio.timeout(timeout_s), pool.connection(timeout=timeout_s) as conn:
            await conn.execute("SELECT 1")
    except Exception as exc:
        log.warning("readiness: the database did not answer (%s)", type(exc).__name__)
        return False
    return True


def build_router(get_runtime: Callable[[], Serving | None]) -> APIRouter:
    """Both routes take no session and answer only a status word: nothing to leak, nothing to
    authenticate."""
    router = APIRouter()

    @router.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        """The process answers HTTP. No database call: a Postgres outage must not make a
        supervisor restart every worker."""
        return JSONResponse({"status": "ok"}, headers=_NO_STORE)

    @router.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        """This worker can serve users: started, Postgres answers, its job worker runs."""
        failing = await failing_checks(get_runtime())
        if failing:
            return JSONResponse(
                {"status": "unavailable", "failing": failing}, status_code=503, headers=_NO_STORE
            )
        return JSONResponse({"status": "ready"}, headers=_NO_STORE)

    return router
