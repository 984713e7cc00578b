"""The wipe's cut-off, enforced in Postgres before every write of a user's data, on every worker.

Each write of a user's data carries the authority it is made under: the user and the time that
authority was granted (the session's sign-in for anything a signed-in session does; a run, a
memory job and their after-work inherit it). An account wipe records a cut-off for the user
(cairn_session_revocations) while holding the user's advisory lock exclusively. Every fenced
write takes the same lock shared, in its own transaction, and checks the cut-off there before
writing (a write of several statements: `fenced`, `check`; a write that is one statement: the
check inside it, `STATEMENT_CTE`, its implicit transaction holding the lock until it commits):

- a write that held the lock before the wipe committed has committed too, so the wipe's deletes
  (which start after) see it and remove it;
- a write that takes the lock after sees the cut-off and is refused (`WriteRefused`).

So after the cut-off is recorded no write authorised before it lands, whichever worker makes it,
and no per-worker cache is involved. The authority travels in a context variable (set by the
request guard for a session, by the runner for a run, by the job runner for a job), so library
code in between (LangGraph's saver and store) needs no new arguments.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

SESSION_ENDED = "This session has ended. Please sign in again."


class WriteRefused(PermissionError):
    """A write under an authority the user's cut-off has ended (their data was wiped)."""


@dataclass(frozen=True)
class Fence:
    """Who a write is for and since when it is authorised (seconds since the epoch)."""

    user_id: str
    since: float

    @classmethod
    def now(cls, user_id: str) -> Fence:
        """Authority granted now (a run resumed by the server, an old queued job)."""
        return cls(user_id, time.time())


_current: ContextVar[Fence | None] = ContextVar("cairn_write_fence", default=None)


def current() -> Fence | None:
    """The authority writes in this context are made under, if any."""
    return _current.get()


@contextmanager
def acting_for(fence: Fence) -> Iterator[Fence]:
    """Every fenced write in this context (and tasks started from it) uses `fence`."""
    token = _current.set(fence)
    try:
        yield fence
    finally:
        _current.reset(token)


def adopt(fence: Fence) -> None:
    """`acting_for` for the rest of the current task (a chat event's handler runs in a task
    of its own, so the setting ends with it)."""
    _current.set(fence)


def lock_key(user_id: str) -> str:
    return f"cairn-user:{user_id}"


# One statement (migration 0103_fence_check): the lock taken shared until commit, then the
# cut-off read by a query of its own inside the function, so with a fresh snapshot (a statement's
# snapshot is taken before a lock wait inside it, and could miss the cut-off it waited for).
# Whole seconds, as session tokens carry: a session issued in the second of the cut-off counts
# as issued before it (auth.sessions.SessionRevocations.is_revoked, the same rule).
_ENDED = "SELECT cairn_fence_ended(%s, %s::float8) AS ended"


async def check(conn: AsyncConnection[Any], fence: Fence) -> None:
    """Inside an open transaction on conn: take the user's lock shared (until commit) and refuse
    when the cut-off ended the fence's authority. In pipeline mode (as the callers here use it)
    BEGIN and the check go in one round trip."""
    cur = await conn.execute(_ENDED, (fence.user_id, fence.since))
    row = await cur.fetchone()
    ended = row["ended"] if isinstance(row, dict) else row[0] if row else None
    if ended:
        raise WriteRefused(SESSION_ENDED)


REFUSED_SQLSTATE = "CRN01"
"""What cairn_fence raises in a statement whose authority the cut-off ended."""

_CTE = "fence AS (SELECT cairn_fence({user}::text, {since}::float8) AS ok)"

STATEMENT_CTE = _CTE.format(user="%(fence_user)s", since="%(fence_since)s")
"""The check inside one write statement (migration 0103_fence_check), for a write that is a single
statement: no transaction block, no separate check. The statement must read `fence` (a CTE that
is not read is not run): `INSERT ... SELECT ... FROM fence`, or `WHERE (SELECT ok FROM fence)` in
a data-modifying CTE. Taken there, the lock is held until the statement's implicit transaction
commits; refused, the statement raises and nothing of it stays. Run it through `statement`."""


def statement_args(fence: Fence | None = None) -> dict[str, Any]:
    """STATEMENT_CTE's parameters for `fence` (default: the current authority; none: no check)."""
    fence = fence or current()
    return {
        "fence_user": fence.user_id if fence else None,
        "fence_since": fence.since if fence else 0.0,
    }


STATEMENT_CTE_POSITIONAL = _CTE.format(user="%s", since="%s")
"""STATEMENT_CTE for SQL with positional parameters (the checkpointer's): the fence's two first."""


@functools.lru_cache(maxsize=64)
def fenced_insert(sql: str) -> str:
    """A library's single-row `INSERT INTO t (...) VALUES (...) ON CONFLICT ...` as one statement
    that also passes the wipe's check: `WITH fence ... INSERT INTO t (...) SELECT ... FROM fence
    WHERE fence.ok ON CONFLICT ...`. Its parameters are the fence's two (positional_args), then
    the library's. SQL of another shape (several rows, no VALUES) raises RuntimeError: the
    checkpointer's is rewritten at import, so a library upgrade that changes it fails there."""
    head, keyword, rest = sql.partition("VALUES (")
    depth, end = 1, -1
    for i, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            end = i
            break
    values, tail = rest[:end], rest[end + 1 :]
    if not keyword or end < 0 or "INSERT INTO" not in head or "%s" not in values:
        msg = f"unexpected INSERT shape for a fenced write: {sql!r}"
        raise RuntimeError(msg)
    if tail.lstrip().startswith(","):
        msg = f"a fenced write must insert one row: {sql!r}"
        raise RuntimeError(msg)
    return f"WITH {STATEMENT_CTE_POSITIONAL} {head.strip()} SELECT {values} FROM fence WHERE fence.ok {tail.strip()}"  # noqa: S608 (the library's constants)


def positional_args(fence: Fence | None) -> tuple[str | None, float]:
    """STATEMENT_CTE_POSITIONAL's two parameters for `fence` (none: no check)."""
    return (fence.user_id, fence.since) if fence else (None, 0.0)


@contextmanager
def refusals() -> Iterator[None]:
    """A STATEMENT_CTE write refused by the cut-off raises WriteRefused, as `check` does."""
    try:
        yield
    except psycopg.Error as exc:
        if exc.sqlstate == REFUSED_SQLSTATE:
            raise WriteRefused(SESSION_ENDED) from None
        raise


@asynccontextmanager
async def statement(
    pool: AsyncConnectionPool[Any],
) -> AsyncIterator[AsyncConnection[Any]]:
    """An autocommit connection for one STATEMENT_CTE write; its refusal is WriteRefused."""
    async with pool.connection() as conn:
        with refusals():
            yield conn


@asynccontextmanager
async def fenced(
    pool: AsyncConnectionPool[Any], fence: Fence | None = None
) -> AsyncIterator[AsyncConnection[Any]]:
    """A connection in a transaction that passed the check: write on it, then it commits.

    Without a fence (given or current) it is a plain connection: callers outside any session
    (maintenance, tests, deletes) are not fenced.
    """
    fence = fence or current()
    async with pool.connection() as conn:
        if fence is None:
            yield conn
            return
        async with conn.pipeline(), conn.transaction():
            await check(conn, fence)
            yield conn


@asynccontextmanager
async def held(
    lock_pool: AsyncConnectionPool[Any], fence: Fence | None = None
) -> AsyncIterator[None]:
    """The check on a connection of its own, held until the block ends: for a write made on
    another connection by library code (procrastinate's defer). The lock pool must not be the
    app's pool (the writer takes an app connection while this one is held), and nothing inside
    may take this user's fence again (a waiting cut-off would queue it: a deadlock)."""
    fence = fence or current()
    if fence is None:
        yield
        return
    async with lock_pool.connection() as conn, conn.transaction():
        await check(conn, fence)
        yield


ENDED_CHANNEL = "cairn_session_ended"
"""Postgres NOTIFY channel: a user's cut-off was recorded (payload: the user id)."""


async def cut_off(pool: AsyncConnectionPool[Any], user_id: str) -> None:
    """Record the user's cut-off under the user's lock held exclusively: when this returns,
    every write authorised before now has committed or will be refused. Every worker
    listening on ENDED_CHANNEL hears of it when it commits (to end its live connections)."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key(user_id),)
        )
        await conn.execute(
            # clock_timestamp(), not now() (the transaction's start): the time the lock was
            # taken, so nothing authorised while this waited for it slips in after the cut-off.
            "INSERT INTO cairn_session_revocations (user_id, revoked_at) "
            "VALUES (%s, clock_timestamp()) "
            "ON CONFLICT (user_id) DO UPDATE SET revoked_at = EXCLUDED.revoked_at",
            (user_id,),
        )
        await conn.execute("SELECT pg_notify(%s, %s)", (ENDED_CHANNEL, user_id))
