"""Runs in progress, recorded in Postgres with their worker's heartbeat, so a dead worker's runs
are found and resumed by a live one (the design notes: "the run resumes from the last
checkpoint rather than redoing earlier searches")."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from graphs.core import fence

if TYPE_CHECKING:
    from graphs.core.pool import Pool

log = logging.getLogger("cairn.runs")

DURABILITY: Literal["async"] = "async"
"""Every agent checkpoints after every super-step (design notes): a crash loses at most the
step in flight, and the thread's history shows every step."""
HEARTBEAT_S = 5.0
"""How often a worker says its runs are alive (one UPDATE for all of them)."""
STALE_S = 15.0
"""A run whose heartbeat is older than this belongs to a dead worker."""
MAX_ATTEMPTS = 3
"""Take-overs of one run before it is marked failed and left for the user to retry."""


def worker_id() -> str:
    """Unique per process: host, pid and a random part (pids repeat across restarts)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class StrandedRun:
    thread_id: str
    user_id: str
    agent: str
    attempts: int


_STARTED = (
    f"WITH {fence.STATEMENT_CTE} "  # noqa: S608 (constants only)
    "INSERT INTO cairn_runs (thread_id, user_id, agent, worker_id) "
    "SELECT %(thread)s, %(user)s, %(agent)s, %(worker)s FROM fence WHERE fence.ok "
    "ON CONFLICT (thread_id) DO UPDATE SET "
    "worker_id = EXCLUDED.worker_id, status = 'running', heartbeat_at = now(), "
    "started_at = CASE WHEN cairn_runs.worker_id = EXCLUDED.worker_id "
    "THEN now() ELSE cairn_runs.started_at END"
)
"""One statement, the wipe's check included (graphs.core.fence.STATEMENT_CTE)."""


class RunJournal:
    """The cairn_runs table: a row per thread while a run works on it."""

    def __init__(self, pool: Pool, *, worker: str | None = None) -> None:
        self.pool = pool
        self.worker = worker or worker_id()
        self._running: set[str] = set()
        """Threads whose runs this process is executing now: the only rows it beats. A row is
        beaten by the worker that runs it, not by whoever last took it: a sweep that took a
        live worker's run and found it busy must not keep it alive once that worker dies."""

    async def started(self, *, thread_id: str, user_id: str, agent: str) -> None:
        """Called under the thread's run lock: this worker now runs the thread (refused once
        the user's data was wiped: graphs.core.fence)."""
        async with fence.statement(self.pool) as conn:
            await conn.execute(
                _STARTED,
                {"thread": thread_id, "user": user_id, "agent": agent, "worker": self.worker}
                | fence.statement_args(),
            )
        self._running.add(thread_id)

    def released(self, thread_id: str) -> None:
        """The run in this process ended, however it ended (always called, even when
        `finished` could not clear the row): a row left behind is no longer beaten, so a sweep
        resumes it once its heartbeat is stale."""
        self._running.discard(thread_id)

    async def finished(self, thread_id: str) -> None:
        """The run ended (answered, paused, failed with Retry offered): nothing to resume.
        Called under the thread's run lock, so no other run of the thread is in progress."""
        await self.forget(thread_id)

    async def beat(self) -> int:
        """The runs this process executes are alive, and its own (a sweep that took one while
        the beats could not reach Postgres gives it back here)."""
        if not self._running:
            return 0
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE cairn_runs SET heartbeat_at = now(), worker_id = %s "
                "WHERE thread_id = ANY(%s) AND status = 'running'",
                (self.worker, list(self._running)),
            )
            return cur.rowcount

    async def take_stranded(self, *, stale_s: float = STALE_S) -> list[StrandedRun]:
        """Runs whose worker stopped beating, now this worker's: one UPDATE, so of several
        live workers exactly one takes each run.

        Not within `stale_s` of Postgres (re)starting: after an outage every worker's beats
        are old, and a sweep that came first would take live workers' runs from them."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE cairn_runs SET worker_id = %(worker)s, heartbeat_at = now(), "
                "attempts = attempts + 1 WHERE thread_id IN ("
                " SELECT thread_id FROM cairn_runs WHERE status = 'running' "
                " AND heartbeat_at < now() - make_interval(secs => %(stale)s) "
                " AND pg_postmaster_start_time() < now() - make_interval(secs => %(stale)s) "
                " ORDER BY heartbeat_at LIMIT 20 FOR UPDATE SKIP LOCKED) "
                "RETURNING thread_id, user_id, agent, attempts",
                {"worker": self.worker, "stale": stale_s},
            )
            rows = await cur.fetchall()
        return [
            StrandedRun(
                thread_id=r["thread_id"],
                user_id=r["user_id"],
                agent=r["agent"],
                attempts=r["attempts"],
            )
            for r in rows
        ]

    async def give_up(self, thread_id: str) -> None:
        """Could not be continued: kept as failed, so the conversation says so and offers Retry."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE cairn_runs SET status = 'failed' WHERE thread_id = %s", (thread_id,)
            )

    async def failed_run(self, thread_id: str) -> bool:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM cairn_runs WHERE thread_id = %s AND status = 'failed'", (thread_id,)
            )
            return await cur.fetchone() is not None

    async def forget(self, thread_id: str) -> None:
        """A run that will never be resumed (its thread is gone, or the user retries it)."""
        async with self.pool.connection() as conn:
            await conn.execute("DELETE FROM cairn_runs WHERE thread_id = %s", (thread_id,))


async def heartbeat_forever(journal: RunJournal, *, every_s: float = HEARTBEAT_S) -> None:
    """Until cancelled; a failed beat (Postgres away) is logged and tried again."""
    while True:
        try:
            await journal.beat()
        except Exception as exc:
            log.warning("run heartbeat failed: %s", exc)
        await asyncio.sleep(every_s)
