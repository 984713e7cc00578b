"""Per-user serialisation of memory mutations, so a forget and a job write never interleave."""

from __future__ import annotations

import asyncio
import weakref
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from langgraph.store.base import BaseStore

    from graphs.core.persistence import Pool


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
    """A Postgres advisory lock per user: serialises mutations across every app worker."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @asynccontextmanager
    async def hold(self, user_id: str) -> AsyncIterator[None]:
        key = f"cairn-memory:{user_id}"
        async with self._pool.connection() as conn:
            await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
            try:
                yield
            finally:
                await conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


_local = LocalUserLocks()


def user_locks_for(store: BaseStore) -> UserLocks:
    """Postgres locks for the Postgres store (shared by all workers), process locks otherwise."""
    from langgraph.store.postgres.aio import AsyncPostgresStore

    if isinstance(store, AsyncPostgresStore):
        return PgUserLocks(store.conn)  # type: ignore[arg-type]
    return _local
