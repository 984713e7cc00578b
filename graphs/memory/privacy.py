"""Making things go away, with promises the code keeps: a conversation, everything learned
from it, conversations past their retention window, or the whole account.

Every workflow here is idempotent (each step deletes "whatever is left"), so a run that
crashed part-way is finished by running it again.

Domain logic below the UI: the memory page and Chainlit's delete (ui/) call it, and it
imports neither Chainlit nor auth (the session revoker is handed in).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from graphs.core.errors import ThreadNotFound
from graphs.core.fence import fenced
from graphs.core.runlock import ThreadBusy
from graphs.memory.gallery import TEAM_ROOT, anonymise_author, forget_thread_entries
from graphs.memory.manage import forget_thread_memories
from graphs.memory.plans import PlanMemory
from graphs.memory.research import ResearchMemory
from graphs.memory.scoped import ROOT, ScopedMemory, user_label
from graphs.memory.team_sources import anonymise_source_author, forget_thread_sources

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.store.base import BaseStore

    from graphs.core.pool import Pool
    from graphs.memory.jobs import MemoryJobs

log = logging.getLogger("cairn.privacy")

WIPE_PASSES = 20
"""A wipe re-runs its steps until its own check finds nothing: a memory job running on another
worker when it began keeps its row until it ends (its writes are refused)."""
WIPE_SWEEP_S = 10.0
"""How often every worker looks for wipes a stopped worker left unfinished."""
WIPE_WAIT_S = 15.0
"""How long a wipe waits for such jobs before it reports itself unverified."""
WIPE_RETRY_S = 0.5

LEFTOVERS_SQL = """
SELECT
  (SELECT count(*) FROM cairn_threads WHERE owner_id = %(u)s) AS owned,
  (SELECT count(*) FROM cairn_runs WHERE user_id = %(u)s OR thread_id = ANY(%(t)s)) AS runs,
  (SELECT count(*) FROM "User" WHERE identifier = %(u)s) AS chainlit_user,
  (SELECT count(*) FROM "Thread" t LEFT JOIN "User" u ON u.id = t."userId"
    WHERE u.identifier = %(u)s OR t.id = ANY(%(t)s)) AS chainlit_threads,
  (SELECT count(*) FROM "Step" WHERE "threadId" = ANY(%(t)s)) AS chainlit_steps,
  (SELECT count(*) FROM "Element" WHERE "threadId" = ANY(%(t)s)) AS chainlit_elements,
  (SELECT count(*) FROM "Feedback" f JOIN "Step" s ON s.id = f."stepId"
    WHERE s."threadId" = ANY(%(t)s)) AS chainlit_feedback,
  (SELECT count(*) FROM cairn_element_files
    WHERE user_id = %(u)s OR thread_id = ANY(%(t)s)) AS element_files,
  (SELECT count(*) FROM procrastinate_jobs WHERE args->>'user_id' = %(u)s) AS jobs,
  (SELECT count(*) FROM memory_dead_letters WHERE user_id = %(u)s) AS dead,
  (SELECT count(*) FROM cairn_retention WHERE user_id = %(u)s) AS retention,
  (SELECT count(*) FROM cairn_access_tokens WHERE user_id = %(u)s)
  + (SELECT count(*) FROM cairn_token_calls WHERE user_id = %(u)s) AS tokens,
  (SELECT count(*) FROM checkpoints WHERE thread_id = ANY(%(t)s))
  + (SELECT count(*) FROM checkpoint_writes WHERE thread_id = ANY(%(t)s))
  + (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = ANY(%(t)s)) AS checkpoints,
  (SELECT count(*) FROM research_fetch_log WHERE thread_id = ANY(%(t)s)) AS fetched_pages,
  (SELECT count(*) FROM cairn_message_checkpoints WHERE thread_id = ANY(%(t)s))
    AS message_checkpoints,
  (SELECT count(*) FROM cairn_support_audit WHERE owner_id = %(u)s OR thread_id = ANY(%(t)s))
    AS support_audit,
  (SELECT count(*) FROM cairn_thread_shares WHERE owner_id = %(u)s OR thread_id = ANY(%(t)s))
  + (SELECT count(*) FROM cairn_thread_share_members WHERE user_id = %(u)s) AS shares,
  (SELECT count(*) FROM cairn_workspace_members WHERE user_id = %(u)s)
  + (SELECT count(*) FROM cairn_active_workspace WHERE user_id = %(u)s)
  + (SELECT count(*) FROM cairn_workspaces WHERE personal_of = %(u)s OR created_by = %(u)s)
  + (SELECT count(*) FROM cairn_workspace_invites WHERE created_by = %(u)s OR used_by = %(u)s)
  + (SELECT count(*) FROM cairn_workspace_audit WHERE actor_id = %(u)s OR subject_id = %(u)s)
  + (SELECT count(*) FROM cairn_reviews WHERE requester_id = %(u)s OR decided_by = %(u)s)
    AS workspaces,
  (SELECT count(*) FROM store s, unnest(%(roots)s::text[]) r
    WHERE s.prefix = r OR left(s.prefix, length(r) + 1) = r || '.') AS store_items,
  (SELECT count(*) FROM store_vectors v, unnest(%(roots)s::text[]) r
    WHERE v.prefix = r OR left(v.prefix, length(r) + 1) = r || '.') AS store_vectors,
  (SELECT count(*) FROM store WHERE left(prefix, length(%(team)s) + 1) = %(team)s || '.'
    AND value->>'author' = %(u)s) AS team_gallery_authored
"""
"""Every table that holds a user's data. `roots`: the user's namespace roots in the store
(`memories.<user>` for the assistant, `<user>` for research and planner memories); `team`:
the root of every workspace's plan gallery and source memory, where no row may still name the
user as its `author`."""


class SessionRevoker(Protocol):
    """Ends every session of an account (auth.sessions.SessionRevocations)."""

    async def revoke(self, user_id: str) -> None: ...


class RunLocks(Protocol):
    """One run at a time per thread (graphs.core.runlock.ThreadRunLocks)."""

    def hold(self, thread_id: str) -> AbstractAsyncContextManager[None]: ...


@dataclass(frozen=True)
class ConversationDeleted:
    thread_id: str
    forgotten: int


@dataclass
class WipeReport:
    wipe_id: int
    counts: dict[str, int] = field(default_factory=dict)
    thread_ids: set[str] = field(default_factory=set)
    leftovers: dict[str, int] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return not any(self.leftovers.values())


TEAM_RETENTION = "retention_days"
"""cairn_workspaces.settings: days after which the team's inactive conversations are deleted
(at most a member's own window; null: each member's own)."""


class Privacy:
    def __init__(
        self,
        *,
        pool: Pool,
        store: BaseStore,
        checkpointer: BaseCheckpointSaver[Any],
        memory_jobs: MemoryJobs | None,
        revocations: SessionRevoker,
        default_retention_days: int,
        run_locks: RunLocks | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.checkpointer = checkpointer
        self.memory_jobs = memory_jobs
        self.revocations = revocations
        self.default_retention_days = default_retention_days
        self.run_locks = run_locks
        """The runs' per-thread locks: a conversation is deleted only while none runs on it."""

    # One conversation ----------------------------------------------------------------------

    async def owner_of(self, thread_id: str) -> str | None:
        """The thread's owner from Cairn's record, else Chainlit's (a conversation whose only
        message was refused has no graph thread)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT owner_id FROM cairn_threads WHERE thread_id = %s "
                'UNION ALL SELECT u.identifier FROM "Thread" t JOIN "User" u ON u.id = t."userId" '
                "WHERE t.id = %s LIMIT 1",
                (thread_id, thread_id),
            )
            row = await cur.fetchone()
        return str(row["owner_id"]) if row else None

    async def delete_conversation(
        self, *, user_id: str, thread_id: str, forget: bool
    ) -> ConversationDeleted:
        """The user deletes one of their conversations (unknown and foreign look alike)."""
        if await self.owner_of(thread_id) != user_id:
            log.warning("refused: user %s tried to delete thread %s", user_id, thread_id)
            raise ThreadNotFound
        forgotten = await self.purge_thread(user_id, thread_id, forget=forget, chainlit=True)
        log.info(
            "conversation deleted user=%s thread=%s forgot=%d memories",
            user_id,
            thread_id,
            forgotten,
        )
        return ConversationDeleted(thread_id=thread_id, forgotten=forgotten)

    async def purge_thread(
        self, owner_id: str, thread_id: str, *, forget: bool, chainlit: bool
    ) -> int:
        """Checkpoints and writes, queued memory job and marker, Chainlit's thread, steps and
        elements, then (under the user's memory lock) what it taught and its owner record.

        The owner record goes last: until then the thread can be found and the delete
        retried; a memory job that is mid-way re-checks that record under the same lock.

        Done holding the thread's run lock (graphs.core.runlock.ThreadBusy while a run is in
        progress, and nothing is deleted): a run writes checkpoints until it ends, and they
        came back after a delete made under it.
        """
        if self.run_locks is None:
            return await self._purge_thread(owner_id, thread_id, forget=forget, chainlit=chainlit)
        async with self.run_locks.hold(thread_id):
            return await self._purge_thread(owner_id, thread_id, forget=forget, chainlit=chainlit)

    async def _purge_thread(
        self, owner_id: str, thread_id: str, *, forget: bool, chainlit: bool
    ) -> int:
        await self._remember_deleted([thread_id])
        if self.memory_jobs is not None:
            await self.memory_jobs.forget_thread(user_id=owner_id, thread_id=thread_id)
        await self.checkpointer.adelete_thread(thread_id)
        async with self.pool.connection() as conn:
            await conn.execute("DELETE FROM research_fetch_log WHERE thread_id = %s", (thread_id,))
            await _delete_time_travel(conn, [thread_id])
            if chainlit:
                await conn.execute('DELETE FROM "Thread" WHERE id = %s', (thread_id,))
        memory = ScopedMemory(self.store, owner_id)
        forgotten = 0
        async with memory.locked():
            if forget:
                forgotten = await forget_thread_memories(memory, thread_id)
            async with self.pool.connection() as conn:
                await conn.execute(
                    "DELETE FROM cairn_threads WHERE thread_id = %s AND owner_id = %s",
                    (thread_id, owner_id),
                )
        await memory.drop_marker(thread_id)
        await PlanMemory(self.store, owner_id).forget_thread(thread_id)
        await forget_thread_entries(self.store, thread_id)  # and from a team's plan gallery
        # Its source ratings: gone with what it taught, else kept without naming it (the
        # user's own, or its team's).
        await ResearchMemory(self.store, owner_id).forget_thread(thread_id, forget=forget)
        await forget_thread_sources(self.store, thread_id, forget=forget)
        return forgotten

    # Retention -----------------------------------------------------------------------------

    async def retention_days(self, user_id: str) -> int | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT days FROM cairn_retention WHERE user_id = %s", (user_id,)
            )
            row = await cur.fetchone()
        return int(row["days"]) if row and row["days"] is not None else None

    async def set_retention_days(self, user_id: str, days: int | None) -> None:
        async with fenced(self.pool) as conn:
            await conn.execute(
                "INSERT INTO cairn_retention (user_id, days) VALUES (%s, %s) "
                "ON CONFLICT (user_id) DO UPDATE SET days = EXCLUDED.days",
                (user_id, days),
            )

    async def apply_retention(self) -> int:
        """Delete every conversation inactive for longer than its window: its owner's, or in a
        team the shorter of that and the team's (TEAM_RETENTION, set by the team's managers;
        a malformed value counts as none)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT t.thread_id, t.owner_id FROM cairn_threads t "
                "LEFT JOIN cairn_retention r ON r.user_id = t.owner_id "
                "LEFT JOIN cairn_workspaces w ON w.id = t.workspace_id "
                "WHERE t.last_active_at < now() - make_interval(days => LEAST("
                "COALESCE(r.days, %(days)s), CASE WHEN w.settings ->> %(key)s ~ '^[0-9]{1,4}$' "
                "THEN (w.settings ->> %(key)s)::int END)) "
                "ORDER BY t.last_active_at LIMIT 500",
                {"days": self.default_retention_days, "key": TEAM_RETENTION},
            )
            expired = [(row["thread_id"], row["owner_id"]) for row in await cur.fetchall()]
        deleted = 0
        for thread_id, owner_id in expired:
            try:
                await self.purge_thread(owner_id, thread_id, forget=False, chainlit=True)
            except ThreadBusy:  # active after all: its run updates last_active_at
                continue
            deleted += 1
            log.info("retention: deleted inactive conversation %s of %s", thread_id, owner_id)
        return deleted

    # The whole account ---------------------------------------------------------------------

    async def wipe_account(self, user_id: str) -> WipeReport:
        """Delete all my data: sessions ended first, then memories, every conversation with
        its checkpoints, runs, queued jobs, Chainlit rows, dead letters and settings, tokens,
        workspace memberships (leave_workspaces: team audit logs keep no trace of the user's
        id); tombstones last. Logged in cairn_wipes and checked at the end; safe to run again.

        Ending the sessions records the user's cut-off under the user's lock held
        exclusively (graphs.core.fence): from then on every write authorised before it, on
        any worker (a chat turn, a run in flight, a memory job), is refused in Postgres, and
        every one made before has committed, so the deletes below see it. The login account
        itself stays: the user may sign in again, as a fresh account.
        """
        async with await _lease_connection(self.pool) as lease:
            # Logged and leased in one transaction: no sweep sees the wipe without its lease.
            async with lease.transaction():
                cur = await lease.execute(
                    "INSERT INTO cairn_wipes (user_id) VALUES (%s) RETURNING id", (user_id,)
                )
                row = await cur.fetchone()
                assert row is not None
                await lease.execute(
                    "SELECT pg_advisory_lock(hashtextextended(%s, 0))", (_wipe_key(row["id"]),)
                )
            report = WipeReport(wipe_id=int(row["id"]))
            log.info("wipe %d started for user %s", report.wipe_id, user_id)
            await self.revocations.revoke(user_id)
            await self._step(report, "sessions_ended")
            return await self._finish_wipe(user_id, report)

    async def resume_unfinished_wipes(self) -> list[WipeReport]:
        """Wipes left unfinished by a worker that stopped mid-way (kill -9, a crash): finished
        here. A wipe's lease is a session advisory lock held by its worker for the whole wipe,
        so it is free only once that worker is gone; a wipe still running is left alone."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, user_id, step FROM cairn_wipes WHERE finished_at IS NULL "
                "ORDER BY id LIMIT 20"
            )
            rows = await cur.fetchall()
        reports = []
        for row in rows:
            async with await _lease_connection(self.pool) as lease:
                cur = await lease.execute(
                    "SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS leased, "
                    "(SELECT finished_at IS NULL FROM cairn_wipes WHERE id = %s) AS unfinished",
                    (_wipe_key(row["id"]), row["id"]),
                )
                leased = await cur.fetchone()
                if not (leased and leased["leased"] and leased["unfinished"]):
                    continue  # its worker is alive, another finishes it, or it is done
                report = WipeReport(wipe_id=int(row["id"]))
                user_id = str(row["user_id"])
                log.warning(
                    "wipe %d of user %s was left at %r by a stopped worker: finishing it",
                    report.wipe_id,
                    user_id,
                    row["step"],
                )
                if row["step"] == "started":  # stopped before the user's sessions were ended
                    await self.revocations.revoke(user_id)
                    await self._step(report, "sessions_ended")
                reports.append(await self._finish_wipe(user_id, report))
        return reports

    async def _finish_wipe(self, user_id: str, report: WipeReport) -> WipeReport:
        """Everything after the cut-off: delete passes until the check finds nothing left."""
        deadline = time.monotonic() + WIPE_WAIT_S
        for _ in range(WIPE_PASSES):
            await self._wipe_pass(user_id, report)
            report.leftovers = await self.leftovers(user_id, report.thread_ids)
            if report.verified or time.monotonic() > deadline:
                break
            # A memory job still running elsewhere has its writes refused and ends soon.
            log.warning("wipe %d: leftovers %s, running again", report.wipe_id, report.leftovers)
            await asyncio.sleep(WIPE_RETRY_S)
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE cairn_wipes SET step = 'done', finished_at = now(), counts = %s, "
                "verified = %s WHERE id = %s",
                (Jsonb(report.counts), report.verified, report.wipe_id),
            )
        log.log(
            logging.INFO if report.verified else logging.ERROR,
            "wipe %d finished for user %s: %s (verified: %s, leftovers: %s)",
            report.wipe_id,
            user_id,
            report.counts,
            report.verified,
            {k: v for k, v in report.leftovers.items() if v},
        )
        return report

    async def _wipe_pass(self, user_id: str, report: WipeReport) -> None:
        counts = report.counts
        if self.memory_jobs is not None:
            counts["jobs"] = counts.get("jobs", 0) + await self.memory_jobs.cancel_user(
                user_id=user_id
            )
        async with self.pool.connection() as conn:
            # Failed and cancelled ones too (their arguments name the user); a running one is
            # left to finish: its writes are refused, and the next pass takes its row.
            await conn.execute(
                "DELETE FROM procrastinate_jobs WHERE args->>'user_id' = %s AND status <> 'doing'",
                (user_id,),
            )
        await self._step(report, "jobs_cancelled")
        threads = await self._thread_ids(user_id)
        report.thread_ids.update(threads)
        await self._remember_deleted(threads)
        for thread_id in threads:
            await self.checkpointer.adelete_thread(thread_id)
        async with self.pool.connection() as conn:
            await conn.execute(
                "DELETE FROM research_fetch_log WHERE thread_id = ANY(%s)", (threads,)
            )
            await conn.execute("DELETE FROM cairn_runs WHERE user_id = %s", (user_id,))
            await _delete_time_travel(conn, threads)
            await conn.execute("DELETE FROM cairn_support_audit WHERE owner_id = %s", (user_id,))
        counts["conversations"] = counts.get("conversations", 0) + len(threads)
        await self._step(report, "checkpoints_deleted")
        memory = ScopedMemory(self.store, user_id)
        async with memory.locked():
            # Owner records go under the lock: a memory job that is mid-way sees them gone.
            async with self.pool.connection() as conn:
                await conn.execute("DELETE FROM cairn_threads WHERE owner_id = %s", (user_id,))
            counts["memories"] = counts.get("memories", 0) + await memory.erase_locked(
                include_tombstones=False
            )
        # Their approved plans stay in team galleries only as steps (graphs.memory.gallery).
        counts["gallery_anonymised"] = counts.get("gallery_anonymised", 0) + (
            await anonymise_author(self.store, user_id)
        )
        # Their conversations' counts stay in team source memories only unnamed.
        counts["sources_anonymised"] = counts.get("sources_anonymised", 0) + (
            await anonymise_source_author(self.store, user_id)
        )
        await self._step(report, "memories_deleted")
        async with self.pool.connection() as conn:
            # ON DELETE CASCADE takes the user's threads, steps, elements (and their bytes) and
            # feedback; a thread Chainlit created without an owner yet (a late step) goes by its
            # id, and so do bytes the user stored in a thread of no one's.
            await conn.execute('DELETE FROM "User" WHERE identifier = %s', (user_id,))
            await conn.execute('DELETE FROM "Thread" WHERE id = ANY(%s)', (threads,))
            await conn.execute("DELETE FROM cairn_element_files WHERE user_id = %s", (user_id,))
            await conn.execute("DELETE FROM memory_dead_letters WHERE user_id = %s", (user_id,))
            await conn.execute("DELETE FROM cairn_retention WHERE user_id = %s", (user_id,))
            # Personal access tokens (auth/tokens.py) and their call log: already refused by
            # the session cut-off above, now gone.
            await conn.execute("DELETE FROM cairn_access_tokens WHERE user_id = %s", (user_id,))
            await conn.execute("DELETE FROM cairn_token_calls WHERE user_id = %s", (user_id,))
            # Shares of the user's conversations went with them (the foreign key); being named
            # in a teammate's share goes too: an account made again starts with none.
            await conn.execute(
                "DELETE FROM cairn_thread_share_members WHERE user_id = %s", (user_id,)
            )
        await self._step(report, "conversations_deleted")
        async with self.pool.connection() as conn, conn.transaction():
            await leave_workspaces(conn, user_id)
        await self._step(report, "workspaces_left")
        # No job can run for this user any more, so the forget records can go too.
        async with memory.locked():
            counts["tombstones"] = counts.get("tombstones", 0) + await memory.erase_locked(
                include_tombstones=True
            )
        await self._step(report, "tombstones_deleted")

    async def _remember_deleted(self, thread_ids: list[str]) -> None:
        """Keep deleted ids a day (see cairn_deleted_threads); older ones are dropped here."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "DELETE FROM cairn_deleted_threads WHERE deleted_at < now() - interval '1 day'"
            )
            if thread_ids:
                await conn.execute(
                    "INSERT INTO cairn_deleted_threads (thread_id) SELECT unnest(%s::text[]) "
                    "ON CONFLICT (thread_id) DO UPDATE SET deleted_at = now()",
                    (thread_ids,),
                )

    async def _thread_ids(self, user_id: str) -> list[str]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT thread_id FROM cairn_threads WHERE owner_id = %s "
                'UNION SELECT t.id FROM "Thread" t JOIN "User" u ON u.id = t."userId" '
                "WHERE u.identifier = %s "
                "UNION SELECT thread_id FROM cairn_runs WHERE user_id = %s",
                (user_id, user_id, user_id),
            )
            return [row["thread_id"] for row in await cur.fetchall()]

    async def leftovers(self, user_id: str, thread_ids: set[str]) -> dict[str, int]:
        """What of the user is still stored, counted in every table that holds user data;
        all zeros after a finished wipe. Only the login account (so the user can sign in
        again), the session cut-off (so old sessions stay ended) and the wipe's own log keep
        the user's id.

        Threads are those the wipe found plus any the user still has; the store is counted
        in SQL under both of the user's namespace roots, not through the scoped wrapper.
        """
        threads = sorted(thread_ids | set(await self._thread_ids(user_id)))
        label = user_label(user_id)
        roots = [f"{ROOT}.{label}", label]
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                LEFTOVERS_SQL, {"u": user_id, "t": threads, "roots": roots, "team": TEAM_ROOT}
            )
            row = await cur.fetchone()
        assert row is not None
        return {key: int(value) for key, value in row.items()}

    async def _step(self, report: WipeReport, step: str) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE cairn_wipes SET step = %s, counts = %s WHERE id = %s",
                (step, Jsonb(report.counts), report.wipe_id),
            )


WIPED = {"actor": "actor_wiped", "subject": "subject_wiped"}
"""The detail key set to true in an audit entry whose actor or subject wiped their account."""


async def leave_workspaces(conn: psycopg.AsyncConnection[DictRow], user_id: str) -> None:
    """A wipe takes the user out of every workspace (auth/workspaces.py).

    Gone: their memberships, their active-workspace choice, the invitations they made that
    nobody used, and their personal workspace with everything in it (its audit log included).
    Teams keep their audit logs, which are the team's record (who changed a role, who made a
    token, when support opened a conversation), but no entry names the user any more: their id
    as actor or subject becomes NULL, with `actor_wiped`/`subject_wiped` set in the detail so
    the entry reads "an account since wiped", not "the system". NULL rather than a marker id:
    no marker can ever be a real user's id and pull strangers' entries into their export. A
    token's name (free text they chose) leaves its entries too. Used invitations and the teams
    they created stay with their creator and user set to NULL.
    """
    await conn.execute("DELETE FROM cairn_active_workspace WHERE user_id = %s", (user_id,))
    await conn.execute(
        "DELETE FROM cairn_workspace_invites WHERE created_by = %s AND used_at IS NULL",
        (user_id,),
    )
    await conn.execute(
        "UPDATE cairn_workspace_invites SET created_by = NULLIF(created_by, %(u)s), "
        "used_by = NULLIF(used_by, %(u)s) WHERE created_by = %(u)s OR used_by = %(u)s",
        {"u": user_id},
    )
    await conn.execute("DELETE FROM cairn_workspace_members WHERE user_id = %s", (user_id,))
    await conn.execute("DELETE FROM cairn_workspaces WHERE personal_of = %s", (user_id,))
    await conn.execute(
        "UPDATE cairn_workspaces SET created_by = NULL WHERE created_by = %s", (user_id,)
    )
    # Their own plans' reviews go with their conversations (the foreign key); a decision they
    # made on a teammate's plan stays, by "a reviewer since wiped".
    await conn.execute(
        "UPDATE cairn_reviews SET decided_by = NULL WHERE decided_by = %s", (user_id,)
    )
    for role, flag in WIPED.items():
        # Constant column names only.
        await conn.execute(
            f"UPDATE cairn_workspace_audit SET {role}_id = NULL, "  # noqa: S608
            "detail = CASE WHEN action LIKE 'token.%%' THEN detail - 'name' ELSE detail END "
            f"|| jsonb_build_object('{flag}', true) WHERE {role}_id = %s",
            (user_id,),
        )


def _wipe_key(wipe_id: int) -> str:
    return f"cairn-wipe:{wipe_id}"


async def _lease_connection(pool: Pool) -> psycopg.AsyncConnection[DictRow]:
    """A connection of its own for a wipe's lease: the lock lives as long as it does (as long
    as the worker does), and holds no app connection meanwhile."""
    conninfo: str = await pool._resolve_conninfo()
    return await psycopg.AsyncConnection.connect(conninfo, autocommit=True, row_factory=dict_row)


async def finish_wipes_forever(privacy: Privacy, *, every_s: float = WIPE_SWEEP_S) -> None:
    """Every worker, until cancelled: unfinished wipes of stopped workers are finished."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await privacy.resume_unfinished_wipes()
        except Exception as exc:
            log.warning("finishing interrupted wipes failed: %s", exc)


async def _delete_time_travel(conn: Any, thread_ids: list[str]) -> None:
    """Every branch goes with the conversation: its checkpoints are all under its thread_id
    (adelete_thread), and so are the message fork points and the support audit of it.

    Policy (README, "Time travel"): the audit exists for the owner, so it goes with their
    conversation; the server log keeps a line per support access for the operator's log
    retention. A wiped support account's rows about other users' conversations stay: those
    are the other owners' records."""
    await conn.execute(
        "DELETE FROM cairn_message_checkpoints WHERE thread_id = ANY(%s)", (thread_ids,)
    )
    await conn.execute("DELETE FROM cairn_support_audit WHERE thread_id = ANY(%s)", (thread_ids,))
    # Usage rows are the month's budget (counts only) and stay; which conversation they were
    # spent in goes with the conversation.
    await conn.execute(
        "UPDATE cairn_usage SET thread_id = '' WHERE thread_id = ANY(%s)", (thread_ids,)
    )
