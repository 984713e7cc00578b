"""Thread ownership: recorded when a thread is created, checked before any graph or data-layer access."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import HTTPException

from graphs.core import fence

# Defined below auth so graphs code can raise it too; importers keep naming it from here.
from graphs.core.errors import NOT_FOUND, ThreadNotFound
from graphs.core.fence import fenced

if TYPE_CHECKING:
    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")


@dataclass(frozen=True)
class OwnedThread:
    agent: str
    """The agent the thread was started with; it wins over whatever profile is asked for now."""
    temporary: bool
    """A temporary chat: long-term memory is neither read nor written for it."""
    workspace_id: str | None = None
    """The team workspace it belongs to (auth/workspaces.py); None: the owner's personal one."""


LIVE_TEAM = (
    "EXISTS (SELECT 1 FROM cairn_workspace_members m WHERE m.workspace_id = {ws} "
    "AND m.user_id = {user} AND m.disabled_at IS NULL)"
)
"""A thread (or an access token) of a team workspace is usable only while its owner is a live
member there. Format in the SQL naming the workspace and the user."""


@dataclass(frozen=True)
class InWorkspace:
    """Where a new thread goes instead of the user's active workspace (an access token's)."""

    workspace_id: str | None
    """A team workspace, or None: the owner's personal one."""


def team_thread_usable(thread_id_sql: str) -> str:
    """SQL true unless the thread named by the expression thread_id_sql belongs to a team its
    owner is no longer a live member of: for queries that read the chat's own tables."""
    return (
        "NOT EXISTS (SELECT 1 FROM cairn_threads c WHERE c.thread_id = "  # noqa: S608
        f"{thread_id_sql} AND c.workspace_id IS NOT NULL AND NOT "
        + LIVE_TEAM.format(ws="c.workspace_id", user="c.owner_id")
        + ")"
    )


_CLAIM = (
    f"WITH {fence.STATEMENT_CTE}, "  # noqa: S608 (constants only)
    # A new thread goes to the workspace the user has active, if it is a team they are a live
    # member of (else the personal one: NULL); when pinned (an access token's workspace), to
    # that one, and only while the user is a live member of it.
    "active AS (SELECT a.workspace_id FROM cairn_active_workspace a "
    "JOIN cairn_workspaces w ON w.id = a.workspace_id AND w.personal_of IS NULL "
    "WHERE NOT %(pinned)s AND a.user_id = %(user)s AND "
    + LIVE_TEAM.format(ws="a.workspace_id", user="a.user_id")
    + " UNION ALL SELECT w.id FROM cairn_workspaces w "
    "WHERE %(pinned)s AND w.id = %(ws)s::text AND w.personal_of IS NULL AND "
    + LIVE_TEAM.format(ws="w.id", user="%(user)s")
    + ") "
    "INSERT INTO cairn_threads (thread_id, owner_id, agent, temporary, workspace_id) "
    "SELECT %(thread)s, %(user)s, %(agent)s, %(temporary)s, (SELECT workspace_id FROM active) "
    "FROM fence WHERE fence.ok "
    "AND (NOT %(pinned)s OR %(ws)s::text IS NULL OR EXISTS (SELECT 1 FROM active)) "
    "ON CONFLICT (thread_id) DO UPDATE SET last_active_at = now(), "
    "temporary = cairn_threads.temporary OR EXCLUDED.temporary "
    "WHERE cairn_threads.owner_id = EXCLUDED.owner_id AND (cairn_threads.workspace_id IS NULL "
    "OR "
    + LIVE_TEAM.format(ws="cairn_threads.workspace_id", user="cairn_threads.owner_id")
    + ") AND (NOT %(pinned)s OR cairn_threads.workspace_id IS NOT DISTINCT FROM %(ws)s::text) "
    "RETURNING agent, temporary, workspace_id"
)

_RECORD = (
    "SELECT t.owner_id, t.agent, t.temporary, t.workspace_id, (t.workspace_id IS NULL OR "  # noqa: S608
    + LIVE_TEAM.format(ws="t.workspace_id", user="t.owner_id")
    + ") AS usable FROM cairn_threads t WHERE t.thread_id = %s"
)


def _owned(row: dict[str, object]) -> OwnedThread:
    workspace = row["workspace_id"]
    return OwnedThread(
        agent=str(row["agent"]),
        temporary=bool(row["temporary"]),
        workspace_id=str(workspace) if workspace is not None else None,
    )


async def claim_thread(
    pool: Pool,
    *,
    thread_id: str,
    user_id: str,
    agent: str,
    temporary: bool = False,
    workspace: InWorkspace | None = None,
) -> OwnedThread:
    """Record user_id as the owner of a new thread, or check they own an existing one.

    One statement, the wipe's check included (graphs.core.fence.STATEMENT_CTE): the insert
    either creates the row or, for the owner only, marks the thread active now and hands back
    the existing row. `temporary` only ever turns on.
    A new thread goes to the user's active workspace, or to `workspace` when given (an access
    token acts in its own); with `workspace` given, an existing thread of another workspace,
    or a team the user is no longer a live member of, is refused like a foreign one.
    Refused (graphs.core.fence.WriteRefused) once the user's data was wiped after the
    session or run it is made for began: a wiped account's thread never comes back.
    """
    async with fence.statement(pool) as conn:
        cur = await conn.execute(
            _CLAIM,
            {
                "thread": thread_id,
                "user": user_id,
                "agent": agent,
                "temporary": temporary,
                "pinned": workspace is not None,
                "ws": workspace.workspace_id if workspace is not None else None,
            }
            | fence.statement_args(),
        )
        row = await cur.fetchone()
    if row is None:
        log.warning("refused: user %s tried to use thread %s owned by another", user_id, thread_id)
        raise ThreadNotFound
    return _owned(row)


async def require_owner(pool: Pool, *, thread_id: str, user_id: str) -> OwnedThread:
    """Check user_id owns thread_id. Unknown and foreign threads look alike."""
    async with pool.connection() as conn:
        cur = await conn.execute(_RECORD, (thread_id,))
        row = await cur.fetchone()
    if row is None or row["owner_id"] != user_id or not row["usable"]:
        if row is not None:
            log.warning("refused: user %s asked for thread %s they may not use", user_id, thread_id)
        raise ThreadNotFound
    return _owned(row)


async def mark_temporary(pool: Pool, *, thread_id: str, user_id: str) -> bool:
    """Make an existing thread of the user temporary (one-way). False: no such thread yet."""
    async with fenced(pool) as conn:
        cur = await conn.execute(
            "UPDATE cairn_threads SET temporary = true WHERE thread_id = %s AND owner_id = %s",
            (thread_id, user_id),
        )
        return cur.rowcount > 0


async def owned_thread_ids(pool: Pool, *, user_id: str) -> list[str]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT thread_id FROM cairn_threads WHERE owner_id = %s ORDER BY created_at",
            (user_id,),
        )
        return [row["thread_id"] for row in await cur.fetchall()]


def http_refusal() -> HTTPException:
    return HTTPException(status_code=404, detail=NOT_FOUND)


async def thread_record(pool: Pool, *, thread_id: str) -> tuple[str, OwnedThread] | None:
    """A thread's owner and record, for the support role and for background jobs that have
    checked ownership themselves (everyone else: require_owner)."""
    async with pool.connection() as conn:
        cur = await conn.execute(_RECORD, (thread_id,))
        row = await cur.fetchone()
    if row is None:
        return None
    return str(row["owner_id"]), _owned(row)
