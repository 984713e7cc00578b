"""Per-user serialisation of memory mutations, so a forget and a job write never interleave."""

from __future__ import annotations

import asyncio
import weakref
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from psycopg_pool import AsyncConnectionPool

from graphs.core.pool import open_lock_pool
from graphs.core.runlock import watched_lock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from langgraph.store.base import BaseStore

    from graphs.core.pool import Pool


class UserLocks(Protocol):
    def hold(self, user_id: str) -> AbstractAsyncContextManager[None]: ...


class LocalUserLocks:
    """One asyncio lock per user: enough for a single process (tests, in-memory stores)."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @asynccontextmanager
    async def hold(self, user_id: str) -> AsyncIterator[None]:
        lock = self._locks.get(user_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[user_id] = lock
        async with lock:
            yield


class PgUserLocks:
    """A Postgres advisory lock per user: serialises mutations across every app worker.

    Lock connections come from their own small pool: a holder also needs connections from the
    app's pool for its store calls, and taking both from one pool deadlocks once as many users
    hold locks as the pool has connections. A process-local lock in front means a user waiting
    in this process does not occupy a lock connection either. A lock lost with a Postgres
    restart is taken again, or its holder stops (graphs.core.runlock.watched_lock).
    """

    def __init__(self, pool: Pool, *, max_connections: int = 16) -> None:
        self._app_pool = pool
        self._max = max_connections
        self._lock_pool: AsyncConnectionPool[Any] | None = None
        self._local = LocalUserLocks()

    async def _pool(self) -> AsyncConnectionPool[Any]:
        if self._lock_pool is None:
            self._lock_pool = await open_lock_pool(self._app_pool, max_size=self._max)
        return self._lock_pool

    @asynccontextmanager
    async def hold(self, user_id: str) -> AsyncIterator[None]:
        key = f"cairn-memory:{user_id}"
        async with self._local.hold(user_id):
            pool = await self._pool()
            # Watched: a lock lost with a Postgres restart is taken again, or, if a forget on
            # another worker got it first, this holder stops (LockLost) instead of writing
            # beside it.
            async with watched_lock(pool, key, wait=True):
                yield

    async def close(self) -> None:
        if self._lock_pool is not None:
            await self._lock_pool.close()


_local = LocalUserLocks()
_pg_locks: weakref.WeakKeyDictionary[Any, PgUserLocks] = weakref.WeakKeyDictionary()


def user_locks_for(store: BaseStore) -> UserLocks:
    """Postgres locks for the Postgres store (shared by all workers), process locks otherwise."""
    from langgraph.store.postgres.aio import AsyncPostgresStore

    if not isinstance(store, AsyncPostgresStore):
        return _local
    locks = _pg_locks.get(store)
    if locks is None:
        locks = _pg_locks[store] = PgUserLocks(store.conn)  # type: ignore[arg-type]
    return locks
