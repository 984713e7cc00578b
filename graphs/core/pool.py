"""The app's connection pool type, its idle check, and the small pool advisory locks use.

Below everything else in graphs.core (it imports none of it), so any module can name `Pool`
without importing persistence, which imports them.
"""

from __future__ import annotations

import select
import time
import weakref
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.pool_async import AddConnection

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]
"""The one pool type of the app: autocommit connections returning dict rows."""

# A connection handed back less than this long ago is lent again without a ping. Pinging on
# every checkout cost ~24 extra round trips per chat turn; a connection idle for longer (the
# only kind a Postgres restart can have broken unnoticed) is still checked before use.
CHECK_IDLE_AFTER_S = 1.0
_returned_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

RECONNECT_EVERY_S = 1.0
"""Longest wait between two attempts to replace a lost connection. psycopg_pool doubles the
wait after each failure (1, 2, 4 … s): after a 40 s outage the next attempt came up to 30 s
after Postgres was back, and every request waited for it. Capped, it comes within a second."""
POOL_TIMEOUT_S = 10.0
"""How long a request waits for a connection before it fails (psycopg_pool's default, 30 s,
left a user with no answer for half a minute while Postgres was away)."""


class StampingPool(AsyncConnectionPool[Any]):
    """A pool that notes when each connection came back, for `check_if_idle`.

    Stamped in putconn rather than with the pool's `reset` callback: a pool with a reset
    callback hands every returned connection to a worker task, ~6 extra task switches a turn.
    """

    async def putconn(self, conn: Any) -> None:
        _returned_at[conn] = time.monotonic()
        await super().putconn(conn)

    async def schedule_task(self, task: Any, delay: float) -> None:
        if isinstance(task, AddConnection):
            delay = min(delay, RECONNECT_EVERY_S)
        await super().schedule_task(task, delay)


async def check_if_idle(conn: AsyncConnection[DictRow]) -> None:
    """Ping connections that sat idle, or whose socket has something to say (a terminated
    backend sends its farewell, so the socket turns readable): both cost a round trip only
    when there is a reason to doubt the connection."""
    idle = time.monotonic() - _returned_at.get(conn, 0.0) > CHECK_IDLE_AFTER_S
    if idle or conn.closed or _socket_readable(conn):
        await AsyncConnectionPool.check_connection(conn)


def connection_lost(conn: Any) -> bool:
    """Whether a connection looks dead without a round trip: closed, marked broken, or its
    socket readable while no query runs (a terminated backend's farewell, or end of file)."""
    return bool(conn.closed or conn.broken or _socket_readable(conn))


def _socket_readable(conn: AsyncConnection[DictRow]) -> bool:
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


async def open_lock_pool(app_pool: Pool, *, max_size: int) -> AsyncConnectionPool[Any]:
    """A small autocommit pool for session-level advisory locks, beside the app's pool: a lock
    holder also needs app connections, and taking both from one pool can deadlock.

    Used by the per-thread run locks (graphs.core.runlock) and the per-user memory locks
    (graphs.memory.locks)."""
    pool: AsyncConnectionPool[Any] = StampingPool(
        app_pool.conninfo,
        min_size=1,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True},
        timeout=app_pool.timeout,
        # As the app's pool: a round trip only for a connection that sat idle or looks dead,
        # not before every lock (each chat turn and memory job takes one).
        check=check_if_idle,
    )
    await pool.open()
    return pool
