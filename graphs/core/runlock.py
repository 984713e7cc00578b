"""One run at a time per thread, across every app worker (double texting is refused)."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from graphs.core.errors import DatabaseUnavailable
from graphs.core.pool import connection_lost, open_lock_pool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from graphs.core.pool import Pool

log = logging.getLogger("cairn.runs")

WATCH_S = 1.0
"""How often a held lock's connection is looked at (no round trip unless it looks dead)."""
RETAKE_WAIT_S = 0.5
"""Between two attempts to take a lost lock again while Postgres is still away."""


class ThreadBusy(RuntimeError):
    """Another run (in this worker or another) is working on this thread right now."""

    def __init__(
        self,
        text: str = (
            "I'm still working on your previous message in this conversation. "
            "Wait for it to finish, then send this again."
        ),
    ) -> None:
        super().__init__(text)


class LockLost(RuntimeError):
    """A held advisory lock died with its connection (Postgres restarted) and another session
    took it before it could be taken again: the work it guarded must stop."""


class RunLockLost(ThreadBusy):
    """The run's lock went with a Postgres restart and another worker took the thread's run:
    it goes on there, and stops here."""

    def __init__(self) -> None:
        super().__init__(
            "The database restarted while I worked on this conversation, and another server "
            "has taken over the reply. It continues there; reopen the conversation to see it."
        )


@dataclass
class _Held:
    conn: Any
    lost: bool = False


async def _try_lock(conn: Any, key: str) -> bool:
    cur = await conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,))
    row = await cur.fetchone()
    return bool(row and (row[0] if not isinstance(row, dict) else next(iter(row.values()))))


async def _still_held(conn: Any) -> bool:
    """The lock's session is alive. A session-level lock dies with its connection, and a
    Postgres restart ends every connection without telling the holder."""
    if not connection_lost(conn):
        return True
    try:
        await conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


async def _retake(pool: AsyncConnectionPool[Any], key: str, held: _Held) -> bool:
    """Take the lost lock again on a new connection, waiting for Postgres to be back; False:
    another session holds it now."""
    while True:
        try:
            conn = await pool.getconn()
        except PoolTimeout:
            continue  # still away: the pool waited its timeout already
        try:
            taken = await _try_lock(conn, key)
        except psycopg.Error:
            await pool.putconn(conn)
            await asyncio.sleep(RETAKE_WAIT_S)
            continue
        if not taken:
            await pool.putconn(conn)
            return False
        old, held.conn = held.conn, conn
        await pool.putconn(old)  # broken: the pool drops it
        return True


async def _watch(
    pool: AsyncConnectionPool[Any],
    key: str,
    held: _Held,
    holder: asyncio.Task[Any],
    every_s: float,
    on_lost: Callable[[], None] | None,
) -> None:
    while True:
        await asyncio.sleep(every_s)
        if await _still_held(held.conn):
            continue
        log.warning("advisory lock %s lost with its connection: taking it again", key)
        if await _retake(pool, key, held):
            log.info("advisory lock %s taken again", key)
            continue
        log.warning("advisory lock %s was taken by another session: stopping its holder", key)
        held.lost = True
        if on_lost is not None:
            on_lost()
        holder.cancel()
        return


@asynccontextmanager
async def watched_lock(
    pool: AsyncConnectionPool[Any],
    key: str,
    *,
    wait: bool,
    watch_s: float = WATCH_S,
    on_lost: Callable[[], None] | None = None,
) -> AsyncIterator[bool]:
    """A session-level advisory lock held for the block; yields False (and holds nothing) when
    `wait` is False and the lock is taken.

    While the block runs, the lock's connection is watched: lost with a Postgres restart, the
    lock is taken again as soon as Postgres is back, or, if another session got it first, the
    block is cancelled and LockLost raised, so two holders never work side by side.
    `on_lost` is called just before that cancellation, for a block that must tell it from
    any other (a user's Stop).
    """
    try:
        conn = await pool.getconn()
    except PoolTimeout as exc:
        # No connection for the lock means Postgres is away, not that the lock is taken.
        msg = "no database connection for an advisory lock"
        raise DatabaseUnavailable(msg) from exc
    held = _Held(conn)
    try:
        if wait:
            await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
        elif not await _try_lock(conn, key):
            yield False
            return
        holder = asyncio.current_task()
        assert holder is not None
        watcher = asyncio.create_task(_watch(pool, key, held, holder, watch_s, on_lost))
        try:
            yield True
        except asyncio.CancelledError:
            if held.lost and holder.uncancel() == 0:
                raise LockLost(key) from None
            raise
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            if not held.lost:
                # A lost connection took the lock with it.
                with suppress(psycopg.Error):
                    await held.conn.execute(
                        "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,)
                    )
    finally:
        await pool.putconn(held.conn)


class ThreadRunLocks:
    """A session-level Postgres advisory lock per thread, held for the whole run.

    Taken with pg_try_advisory_lock: a second message never waits behind the first (it is
    refused with a notice), and a worker that dies releases its locks with its connection.
    Lock connections come from their own pool so a long run does not hold an app connection.
    A lock lost with a Postgres restart is taken again, or the run stops (RunLockLost).
    """

    def __init__(self, pool: Pool, *, max_connections: int = 32, watch_s: float = WATCH_S) -> None:
        self._app_pool = pool
        self._max = max_connections
        self._watch_s = watch_s
        self._lock_pool: AsyncConnectionPool[Any] | None = None
        self._running: set[str] = set()
        self._lost: set[str] = set()

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
        try:
            pool = await self._pool()
            async with watched_lock(
                pool,
                f"cairn-run:{thread_id}",
                wait=False,
                watch_s=self._watch_s,
                on_lost=lambda: self._lost.add(thread_id),
            ) as taken:
                if not taken:
                    raise ThreadBusy
                yield
        except LockLost as exc:
            raise RunLockLost from exc
        finally:
            self._running.discard(thread_id)
            self._lost.discard(thread_id)

    def lost(self, thread_id: str) -> bool:
        """The run holding `thread_id`'s lock is being cancelled because the lock went to
        another session (its run, not this one, owns the thread now)."""
        return thread_id in self._lost

    async def close(self) -> None:
        if self._lock_pool is not None:
            await self._lock_pool.close()
            self._lock_pool = None
