"""Checkpoint pruning: old intermediate super-step checkpoints go; what resume, questions, edits and support read stays.

A thread keeps, whatever their age: its roots, every leaf (the head, each branch's end, and so
every pending question: a paused run waits on a checkpoint nothing followed), each user message's
fork point (cairn_message_checkpoints), the children of a branch point, the checkpoints holding
a DeltaChannel snapshot, and everything younger than the age. Threads with a run journal row
(running, stranded for a live worker to resume, failed with Retry offered) are left whole.

A kept checkpoint whose parent goes is re-parented to its nearest kept ancestor (the anchor), so
history stays one tree and every kept checkpoint loads as before. A DeltaChannel (the
Assistant's messages) is rebuilt by replaying the writes of a checkpoint's ancestors, so the
delta writes of the checkpoints removed move onto the anchor, keyed as LangGraph's own exit
durability stores a run's writes there (`exit_delta_late_task_id`, task path `~~<step>`): a pruned
stretch then reads exactly as a run made with `durability="exit"`. That is only sound when one
stretch hangs below an anchor, hence the kept children of branch points. Blobs go only when no
remaining checkpoint references them. Subgraph namespaces are left alone.

Safety: each thread is pruned holding its run lock (a busy thread is skipped: no prune races a
run, an edit or a support fork) in one transaction that first locks the thread's checkpoint rows.
A wipe or delete does not take run locks: its DELETE of the rows waits for the prune to commit
and then removes what the prune left (its later deletes see the moved writes), or it came first
and the prune finds nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from langgraph.channels.delta import DeltaChannel
from langgraph.pregel._checkpoint import exit_delta_late_task_id

from graphs.core import metrics
from graphs.core.runlock import ThreadBusy

if TYPE_CHECKING:
    from graphs.core.pool import Pool

log = logging.getLogger("cairn.prune")

QUIET = timedelta(minutes=15)
"""A thread active more recently than this waits for a later round: holding its run lock
even for a moment would turn away a message sent just then."""
BATCH = 200
"""Threads read per query."""
MAX_THREADS = 2000
"""Threads pruned per job run; the next tick takes the rest."""
LATE_PATH = "~~"
"""The task-path prefix of exit-durability writes: sorts after every real task path."""


class RunLocks(Protocol):
    """One run at a time per thread (graphs.core.runlock.ThreadRunLocks): ThreadBusy if taken."""

    def hold(self, thread_id: str) -> AbstractAsyncContextManager[None]: ...


def delta_channels(graph: Any) -> frozenset[str]:
    """The graph's DeltaChannel-backed state keys (their history is replayed from writes)."""
    return frozenset(k for k, ch in graph.channels.items() if isinstance(ch, DeltaChannel))


# -- the plan (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One checkpoint of a thread's root namespace, as the plan needs it."""

    id: str
    parent: str | None
    ts: datetime
    step: int
    versions: Mapping[str, str]


@dataclass
class Plan:
    kept: set[str] = field(default_factory=set)
    deleted: list[str] = field(default_factory=list)
    parents: dict[str, str | None] = field(default_factory=dict)
    """Kept checkpoints whose parent changes: id -> nearest kept ancestor."""
    anchors: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Deleted checkpoint -> (the anchor its delta writes move to, the step they are keyed by)."""
    moves: list[tuple[Any, ...]] = field(default_factory=list)
    """The delta writes to store on the anchors (_MOVE_WRITE's parameters)."""


def plan_prune(
    rows: list[Row],
    *,
    cutoff: datetime,
    fork_points: set[str],
    snapshots: set[tuple[str, str]],
) -> Plan:
    """What to keep, delete and re-parent in one thread (see the module doc for the rules).

    `snapshots`: (channel, version) of the DeltaChannel snapshot blobs the thread holds."""
    by_id = {r.id: r for r in rows}
    children: dict[str, list[str]] = {}
    for r in rows:
        if r.parent in by_id:
            children.setdefault(r.parent, []).append(r.id)
    kept = {
        r.id
        for r in rows
        if r.parent not in by_id
        or r.id not in children
        or r.id in fork_points
        or r.ts >= cutoff
        or len(children[r.parent]) > 1
    }
    kept |= _snapshot_holders(rows, kept, snapshots)
    plan = Plan(kept=kept)

    def anchor(r: Row) -> str | None:
        parent = r.parent
        while parent is not None and parent in by_id and parent not in kept:
            parent = by_id[parent].parent
        return parent

    for r in rows:
        if r.id in kept:
            if (new := anchor(r)) != r.parent:
                plan.parents[r.id] = new
            continue
        plan.deleted.append(r.id)
        found = anchor(r)
        assert found is not None  # roots are kept
        plan.anchors[r.id] = (found, r.step + 1)
    return plan


def _snapshot_holders(rows: list[Row], kept: set[str], snapshots: set[tuple[str, str]]) -> set[str]:
    """For each snapshot no kept checkpoint reads, the oldest checkpoint holding it: without
    them a kept checkpoint would replay its whole thread's writes back to the root."""
    covered = {(ch, v) for r in rows if r.id in kept for ch, v in r.versions.items()}
    holders: dict[tuple[str, str], str] = {}
    for r in sorted(rows, key=lambda r: r.id):
        for ch, v in r.versions.items():
            if (ch, v) in snapshots and (ch, v) not in covered:
                holders.setdefault((ch, v), r.id)
    return set(holders.values())


# -- the job ------------------------------------------------------------------------------


@dataclass
class PruneReport:
    threads: int = 0
    busy: int = 0
    checkpoints: int = 0
    writes: int = 0
    blobs: int = 0


_CANDIDATES = """
SELECT t.thread_id, t.agent FROM cairn_threads t
WHERE t.created_at < %(cutoff)s
  AND t.last_active_at < now() - make_interval(secs => %(quiet)s)
  AND (t.checkpoints_pruned_before IS NULL OR t.last_active_at > t.checkpoints_pruned_before)
  AND t.agent = ANY(%(agents)s)
  AND NOT EXISTS (SELECT 1 FROM cairn_runs r WHERE r.thread_id = t.thread_id)
  AND t.thread_id > %(after)s
ORDER BY t.thread_id LIMIT %(limit)s
"""

_ROWS = """
SELECT checkpoint_id, parent_checkpoint_id, checkpoint ->> 'ts' AS ts,
       coalesce((metadata ->> 'step')::int, -1) AS step,
       checkpoint -> 'channel_versions' AS versions,
       metadata -> 'counters_since_delta_snapshot' AS counters
FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''
ORDER BY checkpoint_id FOR UPDATE
"""

_SNAPSHOTS = """
SELECT channel, version FROM checkpoint_blobs
WHERE thread_id = %s AND checkpoint_ns = '' AND channel = ANY(%s) AND type <> 'empty'
"""

_DELTA_WRITES = """
SELECT checkpoint_id, task_id, task_path, idx, channel, type, blob FROM checkpoint_writes
WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = ANY(%s) AND channel = ANY(%s)
"""

_MOVE_WRITE = """
INSERT INTO checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
VALUES (%s, '', %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
"""

_REPARENT = """
UPDATE checkpoints c SET parent_checkpoint_id = v.parent
FROM unnest(%s::text[], %s::text[]) AS v(id, parent)
WHERE c.thread_id = %s AND c.checkpoint_ns = '' AND c.checkpoint_id = v.id
"""

_DELETE_CHECKPOINTS = """
WITH deleted AS (
    DELETE FROM checkpoints
    WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = ANY(%s)
    RETURNING checkpoint -> 'channel_versions' AS versions
)
SELECT DISTINCT v.key AS channel, v.value AS version
FROM deleted CROSS JOIN LATERAL jsonb_each_text(deleted.versions) AS v
"""

_REFERENCED = """
SELECT DISTINCT v.key AS channel, v.value AS version FROM checkpoints c
CROSS JOIN LATERAL jsonb_each_text(c.checkpoint -> 'channel_versions') AS v
WHERE c.thread_id = %s AND c.checkpoint_ns = ''
"""

_DELETE_BLOBS = """
DELETE FROM checkpoint_blobs b USING unnest(%s::text[], %s::text[]) AS g(channel, version)
WHERE b.thread_id = %s AND b.checkpoint_ns = '' AND b.channel = g.channel
  AND b.version = g.version
"""


class CheckpointPruner:
    """The periodic job (graphs.memory.jobs.MemoryJobs.add_periodic) and its per-thread step."""

    def __init__(
        self,
        *,
        pool: Pool,
        locks: RunLocks,
        delta: Mapping[str, frozenset[str]],
        after: timedelta,
        quiet: timedelta = QUIET,
        max_threads: int = MAX_THREADS,
    ) -> None:
        self.pool = pool
        self.locks = locks
        self.delta = dict(delta)
        """Each agent's DeltaChannel keys; threads of an agent not listed are never pruned."""
        self.after = after
        self.quiet = quiet
        self.max_threads = max_threads

    @classmethod
    def for_graphs(
        cls, *, pool: Pool, locks: RunLocks, graphs: Mapping[str, Any], after_hours: float
    ) -> CheckpointPruner:
        """For the app's compiled graphs, by agent key."""
        delta = {key: delta_channels(graph) for key, graph in graphs.items()}
        return cls(pool=pool, locks=locks, delta=delta, after=timedelta(hours=after_hours))

    async def run(self) -> PruneReport:
        """Every thread with checkpoints past the age not yet pruned, up to max_threads."""
        report = PruneReport()
        try:
            await self._run(report)
        except Exception:
            metrics.observe_prune_run("failed", threads=report.threads, busy=report.busy)
            raise
        metrics.observe_prune_run("done", threads=report.threads, busy=report.busy)
        return report

    async def _run(self, report: PruneReport) -> None:
        cutoff = datetime.now(UTC) - self.after
        after = ""
        while report.threads + report.busy < self.max_threads:
            batch = await self._candidates(cutoff, after)
            if not batch:
                break
            for thread_id, agent in batch:
                await self._prune_one(thread_id, agent, cutoff, report)
            after = batch[-1][0]
        if report.checkpoints:
            log.info("checkpoint pruning: %s", report)

    async def _candidates(self, cutoff: datetime, after: str) -> list[tuple[str, str]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _CANDIDATES,
                {
                    "cutoff": cutoff,
                    "quiet": self.quiet.total_seconds(),
                    "agents": list(self.delta),
                    "after": after,
                    "limit": BATCH,
                },
            )
            return [(r["thread_id"], r["agent"]) for r in await cur.fetchall()]

    async def _prune_one(
        self, thread_id: str, agent: str, cutoff: datetime, report: PruneReport
    ) -> None:
        try:
            async with self.locks.hold(thread_id):
                removed = await self.prune_thread(thread_id, agent=agent, cutoff=cutoff)
        except ThreadBusy:
            report.busy += 1
            return
        report.threads += 1
        report.checkpoints += removed.checkpoints
        report.writes += removed.writes
        report.blobs += removed.blobs

    async def prune_thread(self, thread_id: str, *, agent: str, cutoff: datetime) -> PruneReport:
        """One thread, in one transaction; the caller holds its run lock. Nothing is done for a
        thread a run journal row names, or whose checkpoints show delta channels its agent's
        graph does not declare (its writes could not be carried over)."""
        delta = self.delta.get(agent)
        if delta is None:
            return PruneReport()
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_ROWS, (thread_id,), prepare=False)
            raw = await cur.fetchall()
            if not raw or await _has_run(conn, thread_id):
                return PruneReport()
            if undeclared := _undeclared_delta(raw, delta):
                log.warning(
                    "not pruning %s: delta channels %s not in its graph", thread_id, undeclared
                )
                return PruneReport()
            plan = await self._plan(conn, thread_id, raw, delta, cutoff)
            removed = await _apply(conn, thread_id, plan) if plan.deleted else PruneReport()
            await conn.execute(
                "UPDATE cairn_threads SET checkpoints_pruned_before = %s WHERE thread_id = %s",
                (cutoff, thread_id),
            )
        metrics.observe_prune(removed.checkpoints, removed.writes, removed.blobs)
        return removed

    async def _plan(
        self,
        conn: Any,
        thread_id: str,
        raw: Sequence[Mapping[str, Any]],
        delta: frozenset[str],
        cutoff: datetime,
    ) -> Plan:
        """Under the rows' locks: what goes, from the rows, fork points and snapshots, and the
        delta writes that move."""
        plan = plan_prune(
            [_row(r) for r in raw],
            cutoff=cutoff,
            fork_points=await _fork_points(conn, thread_id),
            snapshots=await _snapshots(conn, thread_id, delta),
        )
        if plan.deleted and delta:
            plan.moves = await _moves(conn, thread_id, plan, delta)
        return plan


def _row(r: Mapping[str, Any]) -> Row:
    return Row(
        id=r["checkpoint_id"],
        parent=r["parent_checkpoint_id"],
        ts=datetime.fromisoformat(r["ts"]),
        step=int(r["step"]),
        versions={k: str(v) for k, v in (r["versions"] or {}).items()},
    )


def _undeclared_delta(raw: Sequence[Mapping[str, Any]], delta: frozenset[str]) -> set[str]:
    """Channels the checkpoints count delta-snapshot updates for that the graph does not know."""
    seen = {ch for r in raw for ch in (r["counters"] or {})}
    return seen - delta


async def _has_run(conn: Any, thread_id: str) -> bool:
    cur = await conn.execute("SELECT 1 FROM cairn_runs WHERE thread_id = %s", (thread_id,))
    return await cur.fetchone() is not None


async def _fork_points(conn: Any, thread_id: str) -> set[str]:
    cur = await conn.execute(
        "SELECT checkpoint_id FROM cairn_message_checkpoints "
        "WHERE thread_id = %s AND checkpoint_id IS NOT NULL",
        (thread_id,),
    )
    return {r["checkpoint_id"] for r in await cur.fetchall()}


async def _snapshots(conn: Any, thread_id: str, delta: frozenset[str]) -> set[tuple[str, str]]:
    if not delta:
        return set()
    cur = await conn.execute(_SNAPSHOTS, (thread_id, list(delta)))
    return {(r["channel"], r["version"]) for r in await cur.fetchall()}


async def _apply(conn: Any, thread_id: str, plan: Plan) -> PruneReport:
    if plan.moves:
        async with conn.cursor() as cur:
            await cur.executemany(_MOVE_WRITE, plan.moves)
    cur = await conn.execute(
        "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_ns = '' "
        "AND checkpoint_id = ANY(%s)",
        (thread_id, plan.deleted),
        prepare=False,
    )
    writes = max(cur.rowcount - len(plan.moves), 0)
    if plan.parents:
        ids = list(plan.parents)
        await conn.execute(
            _REPARENT, (ids, [plan.parents[i] for i in ids], thread_id), prepare=False
        )
    cur = await conn.execute(_DELETE_CHECKPOINTS, (thread_id, plan.deleted), prepare=False)
    freed = {(r["channel"], r["version"]) for r in await cur.fetchall()}
    cur = await conn.execute(_REFERENCED, (thread_id,), prepare=False)
    garbage = sorted(freed - {(r["channel"], r["version"]) for r in await cur.fetchall()})
    blobs = 0
    if garbage:
        cur = await conn.execute(
            _DELETE_BLOBS,
            ([c for c, _ in garbage], [v for _, v in garbage], thread_id),
            prepare=False,
        )
        blobs = cur.rowcount
    return PruneReport(checkpoints=len(plan.deleted), writes=writes, blobs=blobs)


async def _moves(
    conn: Any, thread_id: str, plan: Plan, delta: frozenset[str]
) -> list[tuple[Any, ...]]:
    """The delta writes of the checkpoints deleted, keyed for their anchors as exit durability
    keys a run's later super-steps: after every real write there, in step order."""
    cur = await conn.execute(_DELTA_WRITES, (thread_id, plan.deleted, list(delta)), prepare=False)
    moves = []
    for w in await cur.fetchall():
        anchor, step = plan.anchors[w["checkpoint_id"]]
        moves.append(
            (
                thread_id,
                anchor,
                exit_delta_late_task_id(step, str(w["task_id"])),
                f"{LATE_PATH}{step:010d}{w['task_path']}",
                w["idx"],
                w["channel"],
                w["type"],
                w["blob"],
            )
        )
    return moves
