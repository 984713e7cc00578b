"""Runs in progress, recorded in Postgres with their worker's heartbeat, so a dead worker's runs
are found and resumed by a live one (the design notes: "the run resumes from the last
checkpoint rather than redoing earlier searches")."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from graphs.core import fence

if TYPE_CHECKING:
    from psycopg import AsyncConnection

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
class EditedMessage:
    """An edit's run: what a live worker needs to carry it out if the one that accepted it dies.
    Recorded with the run before the conversation shows the edit."""

    message_id: str
    text: str
    """The message's new text, as the graph gets it."""
    checkpoint: str | None
    """The checkpoint the message was sent on, which the fork starts from (None: a new thread)."""
    head: str | None
    """The thread's newest checkpoint when the edit was accepted: while it is still the newest,
    the fork has written nothing and runs again from `checkpoint`."""

    def to_json(self) -> str:
        return json.dumps(
            {"message_id": self.message_id, "text": self.text}
            | {"checkpoint": self.checkpoint, "head": self.head}
        )

    @classmethod
    def from_row(cls, value: Any) -> EditedMessage | None:
        if not isinstance(value, dict):
            return None
        return cls(
            message_id=str(value["message_id"]),
            text=str(value["text"]),
            checkpoint=value.get("checkpoint"),
            head=value.get("head"),
        )


@dataclass(frozen=True)
class StrandedRun:
    thread_id: str
    user_id: str
    agent: str
    attempts: int
    edit: EditedMessage | None = None
    """The run was an edit's (None: a message, an answer, a retry)."""


_STARTED = (
    f"WITH {fence.STATEMENT_CTE} "  # noqa: S608 (constants only)
    "INSERT INTO cairn_runs (thread_id, user_id, agent, worker_id, edit) "
    "SELECT %(thread)s, %(user)s, %(agent)s, %(worker)s, %(edit)s::jsonb FROM fence "
    "WHERE fence.ok ON CONFLICT (thread_id) DO UPDATE SET "
    "worker_id = EXCLUDED.worker_id, status = 'running', heartbeat_at = now(), "
    "edit = EXCLUDED.edit, "
    "started_at = CASE WHEN cairn_runs.worker_id = EXCLUDED.worker_id "
    "THEN now() ELSE cairn_runs.started_at END"
)
"""One statement, the wipe's check included (graphs.core.fence.STATEMENT_CTE)."""


_BEAT = (
    "WITH lease AS (INSERT INTO cairn_workers (worker_id) VALUES (%(worker)s) "
    "ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now()) "
    "UPDATE cairn_runs SET heartbeat_at = now(), worker_id = %(worker)s "
    "WHERE thread_id = ANY(%(threads)s) AND status = 'running'"
)

_HAND_OVER = (
    "WITH lease AS (DELETE FROM cairn_workers WHERE worker_id = %(worker)s) "
    "UPDATE cairn_runs SET heartbeat_at = now() - interval '1 day' "
    "WHERE thread_id = ANY(%(threads)s) AND worker_id = %(worker)s AND status = 'running'"
)

_STALE = "now() - make_interval(secs => %(stale)s)"
_RECENT_START = f"pg_postmaster_start_time() < {_STALE}"
"""Postgres has been up longer than the stale period: every live worker could beat since."""

_TAKE_STRANDED = (
    "UPDATE cairn_runs SET worker_id = %(worker)s, heartbeat_at = now(), "  # noqa: S608
    "attempts = attempts + 1 WHERE thread_id IN ("
    " SELECT thread_id FROM cairn_runs WHERE status = 'running' "
    f" AND heartbeat_at < {_STALE} AND {_RECENT_START}"
    " ORDER BY heartbeat_at LIMIT 20 FOR UPDATE SKIP LOCKED) "
    "RETURNING thread_id, user_id, agent, attempts, edit"
)

CALL_LAPSED = (
    "The worker running this call stopped. A run it had started is resumed by a live worker, "
    "and its answer is in the conversation."
)
"""What a token call closed by a sweep says in its owner's call log (auth/tokens.py)."""

_CLOSE_LAPSED_CALLS = (
    "WITH lapsed AS (DELETE FROM cairn_workers WHERE worker_id IN ("  # noqa: S608 (constants)
    f" SELECT worker_id FROM cairn_workers WHERE heartbeat_at < {_STALE} AND {_RECENT_START}"
    " FOR UPDATE SKIP LOCKED)) "
    "UPDATE cairn_token_calls SET status = 'interrupted', detail = %(detail)s, "
    "finished_at = now() WHERE id IN ("
    " SELECT c.id FROM cairn_token_calls c WHERE c.finished_at IS NULL "
    " AND c.worker_id IS NOT NULL"
    # A call younger than the stale period may be its worker's first, before its first beat.
    f" AND c.started_at < {_STALE} AND {_RECENT_START}"
    " AND NOT EXISTS (SELECT 1 FROM cairn_workers w WHERE w.worker_id = c.worker_id"
    f"  AND w.heartbeat_at >= {_STALE})"
    " FOR UPDATE SKIP LOCKED)"
)
"""A token call whose worker's lease lapsed is over: its worker is dead (or was cut off from
Postgres for longer than the stale period, and its runs were taken over like a dead one's; it
beats again and records the call's real end, finish_call). Rows another sweep is closing are
skipped, not waited for. The lapsed leases go in the same statement (a revived worker makes its
row again)."""


_USER_LOCK = "SELECT pg_advisory_xact_lock(hashtext('cairn-runs-of:' || %(user)s))"
_LIVE_OF_USER = (
    "SELECT count(*) AS n FROM cairn_runs WHERE user_id = %(user)s AND status = 'running' "  # noqa: S608 (constants only)
    f"AND thread_id <> %(thread)s AND heartbeat_at >= {_STALE}"
)
"""The user's other runs going now: a dead worker's row stops counting once its heartbeat is
stale (a run resumed from it counts again, beaten by the worker that took it)."""


TEAM_RUNS = "max_runs"
"""The workspace setting (cairn_workspaces.settings) capping the runs of the team's
conversations going at once, on every worker (null or 0: no cap), set by its managers."""
_TEAM_CAP = "SELECT settings ->> %(key)s AS cap FROM cairn_workspaces WHERE id = %(ws)s"
_TEAM_LOCK = "SELECT pg_advisory_xact_lock(hashtext('cairn-runs-of-team:' || %(ws)s))"
_LIVE_OF_TEAM = (
    "SELECT count(*) AS n FROM cairn_runs r JOIN cairn_threads t ON t.thread_id = r.thread_id "  # noqa: S608 (constants only)
    "WHERE t.workspace_id = %(ws)s AND r.status = 'running' AND r.thread_id <> %(thread)s "
    f"AND r.heartbeat_at >= {_STALE}"
)
"""The team's other runs going now, whoever started them (counted like _LIVE_OF_USER)."""


class TooManyRuns(Exception):
    """A run refused before it started: its user already has the most runs going at once."""


class TeamTooManyRuns(TooManyRuns):
    """A team conversation's run refused before it started: the team already has the most runs
    going at once its managers allow (TEAM_RUNS)."""


def too_many_runs(cap: int) -> str:
    runs = "run" if cap == 1 else "runs"
    return (
        f"Not started: you already have {cap} {runs} going at once, the most allowed. "
        "Send this again when one of them has finished."
    )


def team_too_many_runs(cap: int) -> str:
    runs = "run" if cap == 1 else "runs"
    return (
        f"Not started: your team already has {cap} {runs} going at once, the most its admins "
        "allow. Send this again when one of them has finished."
    )


def team_cap(value: Any) -> int:
    """The TEAM_RUNS setting as a number (missing, null or malformed: 0, no cap)."""
    try:
        cap = int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0
    return max(cap, 0)


class RunJournal:
    """The cairn_runs table (a row per thread while a run works on it) and this worker's lease
    in cairn_workers."""

    def __init__(self, pool: Pool, *, worker: str | None = None) -> None:
        self.pool = pool
        self.worker = worker or worker_id()
        self._running: set[str] = set()
        """Threads whose runs this process is executing now: the only rows it beats. A row is
        beaten by the worker that runs it, not by whoever last took it: a sweep that took a
        live worker's run and found it busy must not keep it alive once that worker dies."""

    async def started(
        self,
        *,
        thread_id: str,
        user_id: str,
        agent: str,
        edit: EditedMessage | None = None,
        cap: int | None = None,
        workspace_id: str | None = None,
    ) -> None:
        """Called under the thread's run lock: this worker now runs the thread (refused once
        the user's data was wiped: graphs.core.fence). Committed when this returns, so an
        edit's fork is on record before anything shows it. With a `cap`, TooManyRuns when the
        user already has that many other runs going, on any worker: the user's runs are counted
        and this one recorded under a lock on the user, so two workers admit theirs in turn.
        With a team's `workspace_id` (a run that may be refused), TeamTooManyRuns when the team
        already has its TEAM_RUNS going, counted the same way under a lock on the team, taken
        after the user's (one order: two workers cannot deadlock)."""
        args: dict[str, Any] = {
            "thread": thread_id,
            "user": user_id,
            "agent": agent,
            "worker": self.worker,
            "edit": edit.to_json() if edit is not None else None,
            "ws": workspace_id,
            "key": TEAM_RUNS,
        }
        args |= fence.statement_args() | {"stale": STALE_S}
        if cap is None and workspace_id is None:
            async with fence.statement(self.pool) as conn:
                await conn.execute(_STARTED, args)
        else:
            async with fence.statement(self.pool) as conn, conn.transaction():
                # Separate statements: each sees what committed before the lock was taken.
                if cap is not None:
                    await conn.execute(_USER_LOCK, args)
                    cur = await conn.execute(_LIVE_OF_USER, args)
                    if (await cur.fetchone() or {"n": 0})["n"] >= cap:
                        raise TooManyRuns(too_many_runs(cap))
                if workspace_id is not None:
                    await self._within_team_cap(conn, args)
                await conn.execute(_STARTED, args)
        self._running.add(thread_id)

    @staticmethod
    async def _within_team_cap(conn: AsyncConnection[Any], args: dict[str, Any]) -> None:
        cur = await conn.execute(_TEAM_CAP, args)
        team = team_cap((await cur.fetchone() or {}).get("cap"))
        if team:
            await conn.execute(_TEAM_LOCK, args)
            cur = await conn.execute(_LIVE_OF_TEAM, args)
            if (await cur.fetchone() or {"n": 0})["n"] >= team:
                raise TeamTooManyRuns(team_too_many_runs(team))

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
        """This worker is alive (its lease in cairn_workers, beaten even with no run going: a
        token call is bound to it), and so are the runs it executes, which are its own (a sweep
        that took one while the beats could not reach Postgres gives it back here). One
        statement, so a worker's lease and its runs' heartbeats never disagree."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_BEAT, {"worker": self.worker, "threads": list(self._running)})
            return cur.rowcount

    async def hand_over(self) -> int:
        """This worker is stopping (its run locks already released): the runs it executes look
        stranded at once, so a live worker's next sweep resumes them instead of waiting out
        STALE_S, and its lease goes. How many runs were handed over."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _HAND_OVER, {"worker": self.worker, "threads": list(self._running)}
            )
            return cur.rowcount

    async def take_stranded(self, *, stale_s: float = STALE_S) -> list[StrandedRun]:
        """Runs whose worker stopped beating, now this worker's: one UPDATE, so of several
        live workers exactly one takes each run. In the same transaction the token calls of
        workers whose lease lapsed are closed (`_CLOSE_LAPSED_CALLS`): a dead worker's calls
        stop counting as running when its runs are taken over.

        Not within `stale_s` of Postgres (re)starting: after an outage every worker's beats
        are old, and a sweep that came first would take live workers' runs from them."""
        args = {"worker": self.worker, "stale": stale_s, "detail": CALL_LAPSED}
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_TAKE_STRANDED, args)
            rows = await cur.fetchall()
            closed = await conn.execute(_CLOSE_LAPSED_CALLS, args)
            if closed.rowcount:
                log.warning("closed %d token call(s) of stopped workers", closed.rowcount)
        return [
            StrandedRun(
                thread_id=r["thread_id"],
                user_id=r["user_id"],
                agent=r["agent"],
                attempts=r["attempts"],
                edit=EditedMessage.from_row(r["edit"]),
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
