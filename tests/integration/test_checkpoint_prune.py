"""Checkpoint pruning on a real Postgres: what stays reads as before, edits, questions, history and
resume after kill -9 work on pruned threads, and two workers, a live run or a wipe do not break it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from auth.ownership import claim_thread
from auth.sessions import SessionRevocations
from graphs.assistant.offline import offline_assistant
from graphs.core.persistence import Persistence, make_pool
from graphs.core.prune import CheckpointPruner, Plan, delta_channels
from graphs.core.runlock import ThreadRunLocks
from graphs.core.runs import RunJournal
from graphs.core.timetravel import MessageCheckpoints, checkpoint_id, history, snapshot_at
from graphs.memory.privacy import Privacy
from tests.integration.test_durable_runs import (
    ASSISTANT_MESSAGE,
    chainlit_thread,
    kill_when,
    make_runner,
    recover,
    spawn_doomed,
)
from tests.integration.test_memory_jobs import db
from ui.agents.assistant import SPEC as ASSISTANT
from ui.agents.planner import SPEC as PLANNER
from ui.runner import PostgresThreads, Runner
from ui.surface import HeadlessSurface

pytestmark = pytest.mark.integration

__all__ = ["db"]


@dataclass
class Rig:
    db: Persistence
    runner: Runner
    locks: ThreadRunLocks
    pruner: CheckpointPruner

    @property
    def assistant(self) -> Any:
        return self.runner.graphs["assistant"]


@pytest.fixture(scope="module")
async def rig(db: Persistence) -> AsyncIterator[Rig]:
    graphs = {
        "assistant": ASSISTANT.build(
            checkpointer=db.checkpointer, store=db.store, model=offline_assistant()
        ),
        "planner": PLANNER.build(checkpointer=db.checkpointer, store=db.store),
    }
    locks = ThreadRunLocks(db.pool)
    runner = Runner(
        agents=(ASSISTANT, PLANNER),
        graphs=graphs,
        threads=PostgresThreads(db.pool),
        locks=locks,
        journal=RunJournal(db.pool),
        fork_points=MessageCheckpoints(db.pool),
    )
    pruner = pruner_for(db.pool, locks, graphs)
    yield Rig(db=db, runner=runner, locks=locks, pruner=pruner)
    await runner.drain()
    await locks.close()


def pruner_for(pool: Any, locks: Any, graphs: dict[str, Any]) -> CheckpointPruner:
    """Every checkpoint counts as old (a cut-off in the future), no quiet period."""
    return CheckpointPruner(
        pool=pool,
        locks=locks,
        delta={k: delta_channels(g) for k, g in graphs.items()},
        after=timedelta(hours=-1),
        quiet=timedelta(0),
    )


def future() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


def new_user() -> str:
    return f"cairn:{uuid.uuid4()}"


async def chat(rig: Rig, user: str, *texts: str, thread: str | None = None, start: int = 0) -> str:
    thread = thread or str(uuid.uuid4())
    for i, text in enumerate(texts, start=start):
        outcome = await rig.runner.message(
            HeadlessSurface(),
            user_id=user,
            thread_id=thread,
            profile="Assistant",
            text=text,
            message_id=f"{thread}-m{i}",
            temporary=False,
        )
        assert outcome.status == "done", outcome
    return thread


def texts(values: dict[str, Any]) -> list[str]:
    return [m.text for m in values.get("messages", [])]


async def states(graph: Any, thread: str) -> dict[str, tuple[Any, ...]]:
    """Every checkpoint of the thread as LangGraph reads it: values, next, tasks' writes."""
    found = {}
    async for s in graph.aget_state_history({"configurable": {"thread_id": thread}}):
        values = {k: texts(s.values) if k == "messages" else repr(v) for k, v in s.values.items()}
        found[str(checkpoint_id(s.config))] = (values, s.next, s.metadata["step"])
    return found


async def rows(db: Persistence, sql: str, *args: Any) -> list[dict[str, Any]]:
    async with db.pool.connection() as conn:
        cur = await conn.execute(sql, args)
        return list(await cur.fetchall())


async def count(db: Persistence, table: str, thread: str) -> int:
    [row] = await rows(db, f"SELECT count(*) AS n FROM {table} WHERE thread_id = %s", thread)
    return int(row["n"])


async def assert_consistent(db: Persistence, thread: str) -> None:
    """No dangling parent, no writes of a missing checkpoint, no blob nothing references."""
    dangling = await rows(
        db,
        "SELECT c.checkpoint_id FROM checkpoints c WHERE c.thread_id = %s "
        "AND c.parent_checkpoint_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM checkpoints p "
        "WHERE p.thread_id = c.thread_id AND p.checkpoint_ns = c.checkpoint_ns "
        "AND p.checkpoint_id = c.parent_checkpoint_id)",
        thread,
    )
    orphan_writes = await rows(
        db,
        "SELECT 1 FROM checkpoint_writes w WHERE w.thread_id = %s AND NOT EXISTS (SELECT 1 "
        "FROM checkpoints c WHERE c.thread_id = w.thread_id AND c.checkpoint_id = w.checkpoint_id)",
        thread,
    )
    orphan_blobs = await rows(
        db,
        "SELECT b.channel, b.version FROM checkpoint_blobs b WHERE b.thread_id = %s "
        "AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = b.thread_id "
        "AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)",
        thread,
    )
    assert (dangling, orphan_writes, orphan_blobs) == ([], [], [])


async def fork_points(db: Persistence, thread: str) -> set[str]:
    found = await rows(
        db,
        "SELECT checkpoint_id FROM cairn_message_checkpoints WHERE thread_id = %s "
        "AND checkpoint_id IS NOT NULL",
        thread,
    )
    return {r["checkpoint_id"] for r in found}


# -- what stays, what goes ------------------------------------------------------------------


async def test_a_pruned_conversation_reads_as_before_with_its_heads_and_fork_points(rig: Rig):
    user = new_user()
    thread = await chat(rig, user, *[f"message {n}" for n in range(12)])
    before = await states(rig.assistant, thread)
    points = await fork_points(rig.db, thread)

    removed = await rig.pruner.prune_thread(thread, agent="assistant", cutoff=future())

    after = await states(rig.assistant, thread)
    assert removed.checkpoints == len(before) - len(after) > 0
    # Every checkpoint left reads exactly as before, head included.
    assert {cid: before[cid] for cid in after} == after
    assert next(iter(after)) == next(iter(before)), "the head stays"
    assert points <= set(after), "each message's fork point stays"
    # Per turn: its last checkpoint (the next message's fork point); besides, the root and the
    # DeltaChannel snapshots (every 10 message updates: 5 turns): no mid-run super-step.
    assert len(after) <= 12 + 1 + 12 * 2 // 10
    assert len(before) >= 4 * 12
    assert all(nxt == () for _values, nxt, step in after.values() if step >= 0)
    await assert_consistent(rig.db, thread)
    # The conversation goes on from the pruned head.
    await chat(rig, user, "thirteen", thread=thread, start=12)
    head = await rig.assistant.aget_state({"configurable": {"thread_id": thread}})
    assert texts(head.values)[-2:] == ["thirteen", "(offline model) You said: thirteen"]
    assert len(texts(head.values)) == 26


async def test_checkpoints_younger_than_the_age_are_kept(rig: Rig):
    user = new_user()
    thread = await chat(rig, user, "one", "two", "three")
    await asyncio.sleep(0.01)
    cutoff = datetime.now(UTC)
    await chat(rig, user, "four", "five", thread=thread, start=3)
    before = await states(rig.assistant, thread)
    young = {
        cid
        for cid, in_db in [
            (r["checkpoint_id"], datetime.fromisoformat(r["ts"]))
            for r in await rows(
                rig.db,
                "SELECT checkpoint_id, checkpoint->>'ts' AS ts FROM checkpoints WHERE thread_id = %s",
                thread,
            )
        ]
        if in_db >= cutoff
    }

    removed = await rig.pruner.prune_thread(thread, agent="assistant", cutoff=cutoff)

    after = await states(rig.assistant, thread)
    assert removed.checkpoints > 0
    assert young <= set(after), "nothing younger than the age goes"
    assert len(young) >= 8, "two turns of super-steps"
    assert {cid: before[cid] for cid in after} == after
    await assert_consistent(rig.db, thread)


async def edit(rig: Rig, user: str, thread: str, n: int, text: str) -> list[str]:
    outcome = await rig.runner.edit(
        HeadlessSurface(), user_id=user, thread_id=thread, message_id=f"{thread}-m{n}", text=text
    )
    assert outcome.status == "done", outcome
    return texts((await rig.assistant.aget_state({"configurable": {"thread_id": thread}})).values)


async def prune_keeps_reading(rig: Rig, thread: str) -> dict[str, tuple[Any, ...]]:
    before = await states(rig.assistant, thread)
    await rig.pruner.prune_thread(thread, agent="assistant", cutoff=future())
    after = await states(rig.assistant, thread)
    assert len(after) < len(before)
    assert {cid: before[cid] for cid in after} == after
    await assert_consistent(rig.db, thread)
    return after


def said(*texts: str) -> list[str]:
    return [m for t in texts for m in (t, f"(offline model) You said: {t}")]


async def test_edit_and_resend_forks_pruned_threads_and_every_branch_still_reads(rig: Rig):
    user = new_user()
    thread = await chat(rig, user, "one", "two", "three", "four")
    # A branch made before any pruning: two stretches hang below the fork point.
    assert await edit(rig, user, thread, 2, "THREE") == said("one", "two", "THREE")

    after = await prune_keeps_reading(rig, thread)

    ends = [values["messages"] for values, _next, _step in after.values()]
    assert said("one", "two", "three", "four") in ends
    assert said("one", "two", "THREE") in ends
    # On the pruned thread: an edit forks from the fork point as before.
    assert await edit(rig, user, thread, 1, "TWO") == said("one", "TWO")
    await prune_keeps_reading(rig, thread)
    assert await edit(rig, user, thread, 3, "FOUR") == said("one", "two", "three", "FOUR")
    # The first message too, from the thread's root.
    assert await edit(rig, user, thread, 0, "ONE") == said("ONE")
    await prune_keeps_reading(rig, thread)


async def test_the_support_view_lists_and_opens_a_pruned_threads_checkpoints(rig: Rig):
    thread = await chat(rig, new_user(), "one", "two", "three")
    await rig.pruner.prune_thread(thread, agent="assistant", cutoff=future())

    listed = await history(rig.assistant, thread)

    ids = {c.checkpoint_id for c in listed}
    assert len(listed) >= 4
    assert all(c.parent_id in ids for c in listed if c.parent_id is not None)
    assert listed[0].summary.get("messages") == 6
    for c in listed:
        snapshot = await snapshot_at(rig.assistant, thread, c.checkpoint_id)
        assert snapshot is not None
        assert checkpoint_id(snapshot.parent_config) == c.parent_id


async def test_a_pending_question_survives_pruning_and_is_answered(rig: Rig):
    user, thread = new_user(), str(uuid.uuid4())
    paused = await rig.runner.message(
        HeadlessSurface(),
        user_id=user,
        thread_id=thread,
        profile="Planner",
        text="Which region had the most revenue?",
        message_id=f"{thread}-m0",
        temporary=False,
    )
    assert paused.status == "paused"
    graph = rig.runner.graphs["planner"]
    before = await states(graph, thread)
    [question] = paused.interrupts

    removed = await rig.pruner.prune_thread(thread, agent="planner", cutoff=future())

    assert removed.checkpoints > 0
    after = await states(graph, thread)
    assert {cid: before[cid] for cid in after} == after
    assert [i.id for i in await rig.runner.pending(user_id=user, thread_id=thread)] == [question.id]
    answered = await rig.runner.answer(
        HeadlessSurface(),
        user_id=user,
        thread_id=thread,
        interrupt_id=question.id,
        decision="approve",
    )
    assert answered.status == "done", answered
    await assert_consistent(rig.db, thread)


# -- what is left alone ---------------------------------------------------------------------


async def test_a_thread_with_a_journal_row_or_a_run_in_progress_is_left_whole(rig: Rig):
    user = new_user()
    journaled = await chat(rig, user, "one", "two")
    busy = await chat(rig, user, "one", "two")
    async with rig.db.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO cairn_runs (thread_id, user_id, agent, worker_id, status) "
            "VALUES (%s, %s, 'assistant', 'gone', 'failed')",
            (journaled, user),
        )
        await conn.execute(
            "UPDATE cairn_threads SET created_at = now() - interval '1 day' "
            "WHERE thread_id = ANY(%s)",
            ([journaled, busy],),
        )
    counts = {t: await count(rig.db, "checkpoints", t) for t in (journaled, busy)}

    assert (
        await rig.pruner.prune_thread(journaled, agent="assistant", cutoff=future())
    ).checkpoints == 0
    async with rig.locks.hold(busy):  # a run of the thread, on this worker or another
        report = await rig.pruner.run()

    assert report.busy >= 1
    assert {t: await count(rig.db, "checkpoints", t) for t in (journaled, busy)} == counts
    await rig.runner.journal.forget(journaled)  # type: ignore[union-attr]
    await rig.pruner.run()
    assert await count(rig.db, "checkpoints", busy) < counts[busy]
    assert await count(rig.db, "checkpoints", journaled) < counts[journaled]


async def test_a_pruned_thread_is_not_pruned_again_until_it_was_active(rig: Rig):
    thread = await chat(rig, new_user(), "one", "two")
    async with rig.db.pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_threads SET created_at = now() - interval '1 day' WHERE thread_id = %s",
            (thread,),
        )
    await rig.pruner.run()
    [row] = await rows(
        rig.db,
        "SELECT checkpoints_pruned_before AS b FROM cairn_threads WHERE thread_id = %s",
        thread,
    )
    assert row["b"] is not None
    candidates = await rig.pruner._candidates(datetime.now(UTC) + timedelta(hours=1), "")
    assert thread not in {t for t, _agent in candidates}


# -- several workers, wipes -----------------------------------------------------------------


async def test_two_workers_pruning_at_once_do_not_conflict(rig: Rig):
    user = new_user()
    threads = [await chat(rig, user, "one", "two", "three") for _ in range(4)]
    async with rig.db.pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_threads SET created_at = now() - interval '1 day' "
            "WHERE thread_id = ANY(%s)",
            (threads,),
        )
    before = {t: await states(rig.assistant, t) for t in threads}
    conninfo = await rig.db.pool._resolve_conninfo()
    other_pool = make_pool(conninfo, max_size=4)
    await other_pool.open()
    other_locks = ThreadRunLocks(other_pool)
    other = pruner_for(other_pool, other_locks, rig.runner.graphs)
    try:
        first, second = await asyncio.gather(rig.pruner.run(), other.run())
    finally:
        await other_locks.close()
        await other_pool.close()

    assert first.threads + second.threads + first.busy + second.busy >= len(threads)
    for t in threads:
        after = await states(rig.assistant, t)
        assert len(after) < len(before[t])
        assert {cid: before[t][cid] for cid in after} == after
        await assert_consistent(rig.db, t)
    again = [await rig.pruner.prune_thread(t, agent="assistant", cutoff=future()) for t in threads]
    assert [r.checkpoints for r in again] == [0] * len(threads), "nothing left to prune"


class PausingPruner(CheckpointPruner):
    """Stops with its plan made (the writes to move read) until the test lets it go on."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inside = asyncio.Event()
        self.go_on = asyncio.Event()

    async def _plan(self, conn: Any, *args: Any) -> Plan:
        plan = await super()._plan(conn, *args)
        self.inside.set()
        await self.go_on.wait()
        return plan


async def waiting_on_a_lock(db: Persistence) -> bool:
    [row] = await rows(
        db, "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    )
    return int(row["n"]) > 0


async def test_a_wipe_while_a_thread_is_pruned_leaves_nothing_behind(rig: Rig):
    user = new_user()
    thread = await chat(rig, user, *[f"message {n}" for n in range(6)])
    pruner = PausingPruner(
        pool=rig.db.pool,
        locks=rig.locks,
        delta={"assistant": delta_channels(rig.assistant)},
        after=timedelta(hours=-1),
    )
    privacy = Privacy(
        pool=rig.db.pool,
        store=rig.db.store,
        checkpointer=rig.db.checkpointer,
        memory_jobs=None,
        revocations=SessionRevocations(rig.db.pool),
        default_retention_days=365,
    )
    pruning = asyncio.create_task(pruner.prune_thread(thread, agent="assistant", cutoff=future()))
    await asyncio.wait_for(pruner.inside.wait(), 10)
    wiping = asyncio.create_task(privacy.wipe_account(user))
    deadline = time.monotonic() + 10
    # The wipe's delete waits for the prune's row locks (were they not taken, it would finish).
    while not (await waiting_on_a_lock(rig.db) or wiping.done()):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    pruner.go_on.set()
    removed = await pruning
    report = await wiping

    assert removed.checkpoints > 0, "the prune went first, the wipe after it"
    assert report.verified, report.leftovers
    for table in ("checkpoints", "checkpoint_writes", "checkpoint_blobs"):
        assert await count(rig.db, table, thread) == 0
    # Wiped first, pruned after: nothing to prune, nothing written.
    assert (
        await rig.pruner.prune_thread(thread, agent="assistant", cutoff=future())
    ).checkpoints == 0
    assert await count(rig.db, "checkpoint_writes", thread) == 0


# -- resume after kill -9 -------------------------------------------------------------------


async def test_a_pruned_thread_killed_mid_turn_is_resumed_once(database_url: str):
    runner, close = await make_runner(database_url, worker="survivor", agent="assistant")
    pool = runner.threads.pool  # type: ignore[attr-defined]
    thread = "prune-durable-1"
    await claim_thread(pool, thread_id=thread, user_id="alice", agent="assistant")
    await chainlit_thread(runner, thread)
    for n in range(6):
        outcome = await runner.message(
            HeadlessSurface(),
            user_id="alice",
            thread_id=thread,
            profile="Assistant",
            text=f"message {n}",
            message_id=f"m{n}",
            temporary=False,
        )
        assert outcome.status == "done"
    graph = runner.graphs["assistant"]
    config = {"configurable": {"thread_id": thread}}
    pruner = pruner_for(pool, runner.locks, runner.graphs)
    assert (await pruner.prune_thread(thread, agent="assistant", cutoff=future())).checkpoints > 0

    async def waiting_for_the_model() -> bool:
        return (await graph.aget_state(config)).next == ("assistant",)

    worker = spawn_doomed(database_url, thread, "-", "assistant")
    await kill_when(worker, waiting_for_the_model)
    outcome = await recover(runner, time.monotonic())

    assert outcome.status == "done", outcome
    messages = texts((await graph.aget_state(config)).values)
    assert messages[:12:2] == [f"message {n}" for n in range(6)]
    assert messages[12:] == [ASSISTANT_MESSAGE, outcome.reply], "the message once, one reply"
    await close()
