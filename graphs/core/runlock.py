"""One run at a time per thread, across every app worker (double texting is refused)."""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from graphs.core.errors import DatabaseUnavailable
from graphs.core.pool import open_lock_pool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from graphs.core.pool import Pool


class ThreadBusy(RuntimeError):
    """Another run (in this worker or another) is working on this thread right now."""

    def __init__(self) -> None:
        super().__init__(
            "I'm still working on your previous message in this conversation. "
            "Wait for it to finish, then send this again."
        )


class ThreadRunLocks:
    """A session-level Postgres advisory lock per thread, held for the whole run.

    Taken with pg_try_advisory_lock: a second message never waits behind the first (it is
    refused with a notice), and a worker that dies releases its locks with its connection.
    Lock connections come from their own pool so a long run does not hold an app connection.
    """

    def __init__(self, pool: Pool, *, max_connections: int = 32) -> None:
        self._app_pool = pool
        self._max = max_connections
        self._lock_pool: AsyncConnectionPool[Any] | None = None
        self._running: set[str] = set()

    async def _pool(self) -> AsyncConnectionPool[Any]:
        if self._lock_pool is None:
            self._lock_pool = await open_lock_pool(self._app_pool, max_size=self._max)
        return self._lock_pool

    @asynccontextmanager
    async def hold(self, thread_id: str) -> AsyncIterator[None]:
        """Run the block as the thread's only run, or raise ThreadBusy at once."""
        if thread_id in self._running:
            raise ThreadBusy
        self._running.add(thread_id)
        key = f"cairn-run:{thread_id}"
        try:
            pool = await self._pool()
            async with AsyncExitStack() as stack:
                try:
                    conn = await stack.enter_async_context(pool.connection())
                except PoolTimeout as exc:
                    # No connection for the lock means Postgres is away, not that the
                    # thread is busy: "busy" only ever means a run holds the lock.
                    msg = "no database connection for the run lock"
                    raise DatabaseUnavailable(msg) from exc
                cur = await conn.execute(
                    "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)
                )
                row = await cur.fetchone()
                if not (row and row[0]):
                    raise ThreadBusy
                try:
                    yield
                finally:
                    # A lost connection took the lock with it.
                    with suppress(psycopg.OperationalError):
                        await conn.execute(
                            "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,)
                        )
        finally:
            self._running.discard(thread_id)

    async def close(self) -> None:
        if self._lock_pool is not None:
            await self._lock_pool.close()
            self._lock_pool = None
