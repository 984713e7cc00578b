"""Thread ownership: recorded when a thread is created, checked before any graph or data-layer access."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import HTTPException

if TYPE_CHECKING:
    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")

NOT_FOUND = "Conversation not found"


class ThreadNotFound(LookupError):
    """Unknown or someone else's thread: the same refusal, so existence is never revealed."""

    def __init__(self) -> None:
        super().__init__(NOT_FOUND)


async def claim_thread(pool: Pool, *, thread_id: str, user_id: str, agent: str) -> str:
    """Record user_id as the owner of a new thread, or check they own an existing one.

    Returns the agent the thread was started with, which wins over the one asked for now.
    One statement: the insert either creates the row or hands back the existing one.
    """
    async with pool.connection() as conn:
        cur = await conn.execute(
            "INSERT INTO cairn_threads (thread_id, owner_id, agent) VALUES (%s, %s, %s) "
            "ON CONFLICT (thread_id) DO UPDATE SET thread_id = EXCLUDED.thread_id "
            "RETURNING owner_id, agent",
            (thread_id, user_id, agent),
        )
        row = await cur.fetchone()
    if row is None or row["owner_id"] != user_id:
        log.warning("refused: user %s tried to use thread %s owned by another", user_id, thread_id)
        raise ThreadNotFound
    return str(row["agent"])


async def require_owner(pool: Pool, *, thread_id: str, user_id: str) -> str:
    """Check user_id owns thread_id; returns the thread's agent. Unknown and foreign look alike."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT owner_id, agent FROM cairn_threads WHERE thread_id = %s", (thread_id,)
        )
        row = await cur.fetchone()
    if row is None or row["owner_id"] != user_id:
        if row is not None:
            log.warning("refused: user %s asked for thread %s of another user", user_id, thread_id)
        raise ThreadNotFound
    return str(row["agent"])


async def owned_thread_ids(pool: Pool, *, user_id: str) -> list[str]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT thread_id FROM cairn_threads WHERE owner_id = %s ORDER BY created_at",
            (user_id,),
        )
        return [row["thread_id"] for row in await cur.fetchall()]


def http_refusal() -> HTTPException:
    return HTTPException(status_code=404, detail=NOT_FOUND)
