"""Caps on work running at once, counted in Postgres so every worker shares them (a slot per holder, leased)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from graphs.core.errors import is_database_outage

if TYPE_CHECKING:
    from graphs.core.pool import Pool

log = logging.getLogger("cairn.slots")

POLL_S = 0.2
"""How often a waiter looks again for a free slot."""


class PgSlots:
    """At most `limit` holders per key at once, across workers (cairn_slots). A holder takes a
    slot of every key it names or none; a slot is leased for `lease_s`, so one whose worker
    died frees itself (the work it guards is stopped by its own timeout before then)."""

    def __init__(self, pool: Pool, *, limit: int, lease_s: float) -> None:
        if limit < 1:
            msg = "a slot cap needs a limit of at least 1"
            raise ValueError(msg)
        self.pool = pool
        self.limit = limit
        self.lease_s = lease_s

    @asynccontextmanager
    async def hold(self, keys: Sequence[str]) -> AsyncIterator[None]:
        holder = uuid.uuid4()
        wanted = sorted(set(keys))
        while not await self._take(wanted, holder):  # noqa: ASYNC110 (the slot is freed on another worker: nothing here to wait on)
            await asyncio.sleep(POLL_S)
        try:
            yield
        finally:
            await self._give_back(holder)

    async def _take(self, keys: list[str], holder: uuid.UUID) -> bool:
        async with self.pool.connection() as conn, conn.transaction():
            # Keys in one order, so two holders of the same keys never deadlock.
            for key in keys:
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
            await conn.execute(
                "DELETE FROM cairn_slots WHERE key = ANY(%s) AND expires_at < now()", (keys,)
            )
            cur = await conn.execute(
                "SELECT count(*) AS held FROM cairn_slots WHERE key = ANY(%s) GROUP BY key"
                " ORDER BY held DESC LIMIT 1",
                (keys,),
            )
            row = await cur.fetchone()
            if row is not None and row["held"] >= self.limit:
                return False
            await conn.execute(
                "INSERT INTO cairn_slots (key, holder, expires_at)"
                " SELECT k, %s, now() + make_interval(secs => %s) FROM unnest(%s::text[]) k",
                (holder, self.lease_s, keys),
            )
        return True

    async def _give_back(self, holder: uuid.UUID) -> None:
        try:
            async with self.pool.connection() as conn:
                await conn.execute("DELETE FROM cairn_slots WHERE holder = %s", (holder,))
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning("slot %s not given back (its lease frees it): %s", holder, exc)
