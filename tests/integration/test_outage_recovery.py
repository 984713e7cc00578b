"""Postgres restarted under a running app: the pool, the job worker and the turn runner come back
by themselves, and no message is lost (a dedicated embedded Postgres, stopped with pg_ctl)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from graphs.assistant.offline import offline_assistant
from graphs.core.context import Context
from graphs.core.embeddings import LOCAL_MODEL_DIMS, EmbeddingSpec
from graphs.core.persistence import Persistence, make_pool, open_persistence
from graphs.core.runlock import ThreadRunLocks
from graphs.core.runs import RunJournal
from graphs.core.settings import Settings
from graphs.memory.jobs import MemoryJobs
from graphs.memory.scoped import ScopedMemory
from tests.conftest import create_database
from tests.integration.test_durable_runs import FixedEmbeddings
from tests.pg_restart import RestartablePostgres
from ui.agents import assistant as assistant_agent
from ui.chainlit.data_layer import PendingWrites, append_message
from ui.runner import DATABASE_DOWN, PostgresThreads, Runner, RunOutcome
from ui.surface import HeadlessSurface

pytestmark = pytest.mark.integration

POOL_TIMEOUT_S = 3.0
"""A request waits this long for a connection while Postgres is away (the app's default: 10 s)."""


@pytest.fixture(scope="module")
def postgres() -> Iterator[RestartablePostgres]:
    """This module's own server: the session's is shared by every other test."""
    server = RestartablePostgres()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
async def db(postgres: RestartablePostgres) -> AsyncIterator[Persistence]:
    persistence = await open_persistence(
        Settings(data_dir=Path(tempfile.mkdtemp())),
        pool=make_pool(create_database(postgres.url), max_size=8, timeout=POOL_TIMEOUT_S),
        embedding=EmbeddingSpec("test:fixed", LOCAL_MODEL_DIMS, FixedEmbeddings()),
    )
    yield persistence
    await persistence.close()


@pytest.fixture
async def back_up(postgres: RestartablePostgres) -> AsyncIterator[None]:
    """Whatever a test did, the next one finds Postgres running."""
    yield
    if not postgres.reachable():
        await asyncio.to_thread(postgres.start)


async def restart(postgres: RestartablePostgres, *, down_s: float) -> None:
    await asyncio.to_thread(postgres.stop)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(postgres.start)


async def eventually(check: Any, *, timeout: float = 60.0, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what}"
            raise AssertionError(msg)
        await asyncio.sleep(0.1)


async def assistant_turn(db: Persistence, text: str) -> tuple[Any, str, str]:
    """A new user's Assistant conversation with one answered message: (graph, user, thread)."""
    from auth.ownership import claim_thread

    graph = assistant_agent.SPEC.build(
        checkpointer=db.checkpointer, store=db.store, model=offline_assistant()
    )
    user, thread = f"user-{uuid.uuid4()}", f"thread-{uuid.uuid4()}"
    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")
    await graph.ainvoke(
        {"messages": [("user", text)]},
        {"configurable": {"thread_id": thread}},
        context=Context(user_id=user, thread_id=thread),
    )
    return graph, user, thread


async def select_one(db: Persistence) -> bool:
    async with db.pool.connection() as conn:
        await conn.execute("SELECT 1")
    return True


@contextlib.asynccontextmanager
async def memory_jobs(
    db: Persistence,
    runner_graph: Any = None,
    *,
    before_start: Callable[[MemoryJobs], None] | None = None,
) -> AsyncIterator[MemoryJobs]:
    async def load_messages(thread_id: str) -> list[Any]:
        if runner_graph is None:
            return []
        state = await runner_graph.aget_state({"configurable": {"thread_id": thread_id}})
        return list(state.values.get("messages", []))

    jobs = MemoryJobs(
        pool=db.pool,
        store=db.store,
        model=offline_assistant(),
        load_messages=load_messages,
        idle_seconds=0.2,
        retry_wait_s=0,
        heartbeat_s=0.5,
        stalled_after_s=3.0,
        sweep_every_s=0.5,
        restart_backoff_s=(0.2, 1.0),
    )
    await jobs.open()
    if before_start is not None:
        before_start(jobs)
    jobs.start_worker()
    try:
        yield jobs
    finally:
        await jobs.stop()


async def test_the_pool_serves_again_after_postgres_restarts(db, postgres, back_up) -> None:
    assert await select_one(db)
    await asyncio.to_thread(postgres.stop)
    with pytest.raises((PoolTimeout, psycopg.OperationalError)):
        await select_one(db)
    await asyncio.to_thread(postgres.start)
    await eventually(lambda: select_one(db), timeout=30, what="the pool to serve again")
    assert postgres.started_at is not None
    print(f"pool serving {time.monotonic() - postgres.started_at:.2f} s after Postgres is back")


async def test_a_memory_job_deferred_after_a_restart_runs_without_an_app_restart(
    db, postgres, back_up
) -> None:
    graph, user, thread = await assistant_turn(db, "I live in Lisbon")
    async with memory_jobs(db, graph) as jobs:
        await asyncio.sleep(1.5)  # the worker and its LISTEN connection are up
        assert jobs.worker_starts == 1
        await restart(postgres, down_s=3.0)
        await eventually(lambda: select_one(db), what="the pool")
        back_at = time.monotonic()
        await jobs.message_arrived(user_id=user, thread_id=thread)
        memories = await eventually(
            lambda: ScopedMemory(db.store, user).all_memories(), what="the memory job"
        )
        print(f"memory job ran {time.monotonic() - back_at:.2f} s after it was deferred")
        # procrastinate's listener reconnects by itself when Postgres is back before it
        # notices; when it fails instead, the worker stops and the supervisor starts it again
        # (the next test). Either way the worker is up and the job ran.
        assert jobs.running
    assert [m.content for m in memories] == ["User lives in Lisbon"]


async def test_a_job_worker_that_stops_is_started_again_and_runs_jobs(db, back_up) -> None:
    """procrastinate's worker returns when a side task (its LISTEN) fails: "Side task listener
    failed ... stopping worker". Here the first run stops that way at once."""
    graph, user, thread = await assistant_turn(db, "I live in Porto")
    stopped: list[float] = []

    def stop_the_first_run(jobs: MemoryJobs) -> None:
        real = jobs.app.run_worker_async

        async def stops_once(**kwargs: Any) -> None:
            if not stopped:
                stopped.append(time.monotonic())
                raise RuntimeError("Side task listener failed, stopping worker")
            await real(**kwargs)

        jobs.app.run_worker_async = stops_once  # type: ignore[method-assign]

    async with memory_jobs(db, graph, before_start=stop_the_first_run) as jobs:
        await eventually(lambda: jobs.worker_starts >= 2, what="the worker's restart")
        await eventually(lambda: jobs.running, what="the restarted worker")
        await jobs.message_arrived(user_id=user, thread_id=thread)
        memories = await eventually(
            lambda: ScopedMemory(db.store, user).all_memories(), what="the memory job"
        )
    assert stopped
    assert [m.content for m in memories] == ["User lives in Porto"]


async def test_writes_to_the_conversation_during_an_outage_are_kept_until_it_ends(
    db, postgres, back_up
) -> None:
    from auth.ownership import claim_thread

    thread = f"thread-{uuid.uuid4()}"
    await claim_thread(db.pool, thread_id=thread, user_id="alice", agent="assistant")
    async with db.pool.connection() as conn:
        await conn.execute(
            'INSERT INTO "Thread" (id, metadata, "updatedAt") VALUES (%s, %s, now())',
            (thread, "{}"),
        )
    pending = PendingWrites()
    await asyncio.to_thread(postgres.stop)
    try:
        await pending.write("first", lambda: append_message(db.pool, thread, "first"))
        await pending.write("second", lambda: append_message(db.pool, thread, "second"))
        assert len(pending) == 2
    finally:
        await asyncio.to_thread(postgres.start)

    async def stored() -> list[str]:
        async with db.pool.connection() as conn:
            cur = await conn.execute(
                'SELECT output FROM "Step" WHERE "threadId" = %s ORDER BY "createdAt"', (thread,)
            )
            return [row["output"] for row in await cur.fetchall()]

    await eventually(lambda: len(pending) == 0, what="the held writes to be replayed")
    assert await stored() == ["first", "second"]


# --- the runner under load while Postgres is away ---------------------------------------------


@dataclass
class Sent:
    user: str
    thread: str
    message_id: str
    text: str
    sent_at: float
    outcome: RunOutcome | None = None
    done_at: float = 0.0


class RecordingSurface(HeadlessSurface):
    """What the user would see: errors with Retry (and for which message), refusals."""

    def __init__(self) -> None:
        super().__init__()
        self.retry_offers: list[tuple[str, str | None]] = []
        self.refusals: list[str] = []

    async def failed(self, text: str, *, thread_id: str, message_id: str | None = None) -> None:
        await super().failed(text, thread_id=thread_id, message_id=message_id)
        self.retry_offers.append((text, message_id))

    async def refuse(self, text: str) -> None:
        await super().refuse(text)
        self.refusals.append(text)


@dataclass
class Load:
    runner: Runner
    users: dict[str, str]
    """user -> thread"""
    sent: list[Sent] = field(default_factory=list)
    surfaces: dict[str, RecordingSurface] = field(default_factory=dict)

    async def chat(self, user: str, stop: asyncio.Event) -> None:
        surface = self.surfaces.setdefault(user, RecordingSurface())
        for i in range(400):  # bounded; stopped long before
            if stop.is_set():
                return
            item = Sent(user, self.users[user], str(uuid.uuid4()), f"Hello, message {i}", 0.0)
            item.sent_at = time.monotonic()
            self.sent.append(item)
            item.outcome = await self.send(surface, item)
            item.done_at = time.monotonic()
            await asyncio.sleep(0.3)

    async def send(self, surface: RecordingSurface, item: Sent) -> RunOutcome:
        return await self.runner.message(
            surface,
            user_id=item.user,
            thread_id=item.thread,
            profile="Assistant",
            text=item.text,
            message_id=item.message_id,
            temporary=False,
        )

    def answered_after(self, at: float) -> dict[str, Sent]:
        return {
            s.user: s
            for s in self.sent
            if s.outcome is not None and s.outcome.status == "done" and s.sent_at > at
        }


async def message_ids(runner: Runner, thread: str) -> list[str]:
    state = await runner.graphs["assistant"].aget_state({"configurable": {"thread_id": thread}})
    return [m.id for m in state.values.get("messages", []) if m.type == "human"]


@pytest.mark.parametrize("down_s", [10, 40])
async def test_postgres_away_under_load_loses_no_message(db, postgres, back_up, down_s) -> None:
    graph = assistant_agent.SPEC.build(
        checkpointer=db.checkpointer, store=db.store, model=offline_assistant()
    )
    locks = ThreadRunLocks(db.pool)
    async with memory_jobs(db, graph) as jobs:
        runner = Runner(
            agents=[assistant_agent.SPEC],
            graphs={"assistant": graph},
            threads=PostgresThreads(db.pool),
            locks=locks,
            services=SimpleNamespace(memory_jobs=jobs),
            journal=RunJournal(db.pool),
        )
        load = Load(runner, {f"user-{uuid.uuid4()}": f"thread-{uuid.uuid4()}" for _ in range(3)})
        stop = asyncio.Event()
        chats = [asyncio.create_task(load.chat(user, stop)) for user in load.users]
        try:
            await asyncio.sleep(2.0)
            await restart(postgres, down_s=down_s)
            assert postgres.started_at is not None
            back_at = postgres.started_at
            # Every user is answered again, by the same runner, pool and job worker.
            await eventually(
                lambda: len(load.answered_after(back_at)) == len(load.users),
                timeout=90,
                what="every user to be answered after the restart",
            )
        finally:
            stop.set()
            await asyncio.gather(*chats)
        first_reply = min(
            s.done_at
            for s in load.sent
            if s.outcome and s.outcome.status == "done" and s.done_at > back_at
        )

        statuses = [s.outcome.status if s.outcome else None for s in load.sent]
        failed = [s for s in load.sent if s.outcome and s.outcome.status == "unavailable"]
        assert set(statuses) <= {"done", "unavailable"}, statuses
        assert failed, "some messages were sent while Postgres was away"
        # "Busy" only ever means a run that is really running: none here.
        assert not any(surface.refusals for surface in load.surfaces.values())
        for item in failed:  # each failure was shown with a Retry for that very message
            assert (DATABASE_DOWN, item.message_id) in load.surfaces[item.user].retry_offers

        # Retry sends each failed message again: then every message is in its conversation once.
        for item in failed:
            outcome = await runner.resend(
                load.surfaces[item.user],
                user_id=item.user,
                thread_id=item.thread,
                profile="Assistant",
                text=item.text,
                message_id=item.message_id,
                temporary=False,
            )
            assert outcome.status == "done", outcome
        for user, thread in load.users.items():
            stored = await message_ids(runner, thread)
            mine = [s.message_id for s in load.sent if s.user == user]
            assert sorted(stored) == sorted(mine), "every message answered exactly once"

        # Facts told after the recovery are remembered: the job worker came back by itself.
        names = dict(zip(load.users, ("Astrid", "Kofi", "Ines"), strict=True))
        told_at = time.monotonic()
        for user, name in names.items():
            surface = RecordingSurface()
            item = Sent(user, load.users[user], str(uuid.uuid4()), f"My name is {name}", 0.0)
            assert (await load.send(surface, item)).status == "done"
        for user, name in names.items():

            async def remembered(user: str = user, name: str = name) -> bool:
                memories = await ScopedMemory(db.store, user).all_memories()
                return f"User's name is {name}" in [m.content for m in memories]

            await eventually(remembered, what=f"{name}'s memory job")
        assert jobs.worker_starts >= 2
        await runner.drain()
    await locks.close()
    print(
        f"down {down_s} s: {len(failed)} of {len(load.sent)} messages failed with Retry; "
        f"first reply {first_reply - back_at:.2f} s after Postgres was back; "
        f"memory facts stored {time.monotonic() - told_at:.2f} s after they were told"
    )


async def test_a_conversation_ending_on_an_outage_error_names_the_message_to_retry(db) -> None:
    from ui.chainlit.data_layer import stored_user_message, unanswered_message

    thread = f"thread-{uuid.uuid4()}"
    step = (
        'INSERT INTO "Step" (id, "threadId", type, output, metadata, "startTime", "endTime") '
        "VALUES (%s, %s, %s, %s, %s, now() + make_interval(secs => %s), now())"
    )
    async with db.pool.connection() as conn:
        await conn.execute(
            'INSERT INTO "Thread" (id, metadata, "updatedAt") VALUES (%s, %s, now())',
            (thread, "{}"),
        )
        await conn.execute(step, ("m1", thread, "user_message", "I live in Oslo", "{}", 0))
        await conn.execute(
            step,
            (
                str(uuid.uuid4()),
                thread,
                "assistant_message",
                DATABASE_DOWN,
                '{"retry_message_id": "m1"}',
                1,
            ),
        )
    assert await unanswered_message(db.pool, thread) == "m1"
    assert await stored_user_message(db.pool, thread, "m1") == "I live in Oslo"
    assert await stored_user_message(db.pool, "another-thread", "m1") is None

    async with db.pool.connection() as conn:  # retried: the answer comes after the error
        await conn.execute(step, (str(uuid.uuid4()), thread, "assistant_message", "Noted", "{}", 2))
    assert await unanswered_message(db.pool, thread) is None


async def test_a_turn_answered_just_before_an_outage_still_reaches_memory(
    db, postgres, back_up
) -> None:
    graph, user, thread = await assistant_turn(db, "My manager is Priya")
    async with memory_jobs(db, graph) as jobs:
        await asyncio.to_thread(postgres.stop)  # the turn's job is not queued yet

        async def back_in_3_s() -> None:
            await asyncio.sleep(3.0)
            await asyncio.to_thread(postgres.start)

        coming_back = asyncio.create_task(back_in_3_s())
        await jobs.message_arrived(user_id=user, thread_id=thread)  # waits out the outage
        await coming_back
        memories = await eventually(
            lambda: ScopedMemory(db.store, user).all_memories(), what="the memory job"
        )
    assert [m.content for m in memories] == ["User's manager is Priya"]


# --- run locks across a restart ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def another_worker(db: Persistence) -> AsyncIterator[Any]:
    """A second app worker's pool on the same Postgres."""
    pool = make_pool(db.pool.conninfo, max_size=2, timeout=POOL_TIMEOUT_S)
    await pool.open()
    try:
        yield pool
    finally:
        await pool.close()


async def test_a_run_lock_held_across_a_postgres_restart_still_keeps_other_workers_out(
    db, postgres, back_up
) -> None:
    """A session-level advisory lock dies with its connection when Postgres restarts, without
    telling its holder: the run it guards goes on (its model call did not touch Postgres) while
    another worker could start a second run of the same thread. The holder takes it again."""
    from graphs.core.runlock import ThreadBusy

    await eventually(lambda: select_one(db), what="the pool, after the previous test")
    here, there = ThreadRunLocks(db.pool, watch_s=0.2), None
    thread = f"thread-{uuid.uuid4()}"
    release = asyncio.Event()
    holding = asyncio.Event()

    async def run() -> None:
        async with here.hold(thread):
            holding.set()
            await release.wait()

    task = asyncio.create_task(run())
    await holding.wait()
    await restart(postgres, down_s=1.0)
    async with another_worker(db) as pool:
        there = ThreadRunLocks(pool)
        await eventually(lambda: select_one(db), what="the pool")
        await asyncio.sleep(2.0)  # the holder has noticed and taken its lock again
        with pytest.raises(ThreadBusy):
            async with there.hold(thread):
                pass
        release.set()
        await task  # the run was not interrupted: nobody else holds its lock
        async with there.hold(thread):  # released at the end of the run
            pass
        await there.close()
    await here.close()


async def test_a_run_whose_lock_another_worker_took_during_a_restart_stops(
    db, postgres, back_up
) -> None:
    """The other worker came first (it resumed the run, or the user sent again there): the run
    here stops at once rather than run beside it."""
    from graphs.core.runlock import RunLockLost

    await eventually(lambda: select_one(db), what="the pool, after the previous test")
    here = ThreadRunLocks(db.pool, watch_s=3.0)
    thread = f"thread-{uuid.uuid4()}"
    holding = asyncio.Event()

    async def run() -> None:
        async with here.hold(thread):
            holding.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(run())
    await holding.wait()
    await restart(postgres, down_s=0.5)
    async with another_worker(db) as pool:
        there = ThreadRunLocks(pool)

        async def taken_there() -> bool:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(there.hold(thread))
            taken.append(stack)
            return True

        taken: list[contextlib.AsyncExitStack] = []
        await eventually(taken_there, what="the other worker to take the lock")
        with pytest.raises(RunLockLost):
            await asyncio.wait_for(task, timeout=10)
        await taken[0].aclose()
        await there.close()
    await here.close()


async def test_runs_are_not_taken_as_stranded_until_their_workers_could_beat_after_a_restart(
    db, postgres, back_up
) -> None:
    """Postgres away longer than STALE_S: every live worker's heartbeats are old when it comes
    back. A sweep that ran first would take live workers' runs (and race them for their run
    locks); a run counts as stranded only once its worker had STALE_S to beat again."""
    from auth.ownership import claim_thread

    await eventually(lambda: select_one(db), what="the pool, after the previous test")
    # Wide enough for the pool to come back on a loaded machine (7.3 s seen in CI) before the
    # first sweep, which must find the run's worker still within its grace.
    stale_s = 20.0
    thread = f"thread-{uuid.uuid4()}"
    await claim_thread(db.pool, thread_id=thread, user_id="alice", agent="assistant")
    running_here = RunJournal(db.pool, worker="live")
    await running_here.started(thread_id=thread, user_id="alice", agent="assistant")
    sweeper = RunJournal(db.pool, worker="sweeper")

    async def postgres_up_for() -> float:
        async with db.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT extract(epoch FROM now() - pg_postmaster_start_time()) AS s"
            )
            row = await cur.fetchone()
        assert row is not None
        return float(row["s"])

    try:
        await restart(postgres, down_s=0.5)
        await eventually(lambda: select_one(db), what="the pool")
        async with db.pool.connection() as conn:  # as an outage longer than stale_s leaves it
            await conn.execute(
                "UPDATE cairn_runs SET heartbeat_at = now() - make_interval(secs => %s) "
                "WHERE thread_id = %s",
                (stale_s * 2, thread),
            )
        assert await postgres_up_for() < stale_s - 1, "the pool took too long to come back"
        assert await sweeper.take_stranded(stale_s=stale_s) == [], "its worker may be alive"
        await running_here.beat()  # ... and it is
        await asyncio.sleep(stale_s - await postgres_up_for() + 0.5)
        async with db.pool.connection() as conn:  # now its worker stopped beating for good
            await conn.execute(
                "UPDATE cairn_runs SET heartbeat_at = now() - make_interval(secs => %s) "
                "WHERE thread_id = %s",
                (stale_s * 2, thread),
            )
        [taken] = await sweeper.take_stranded(stale_s=stale_s)
        assert taken.thread_id == thread
    finally:
        await sweeper.forget(thread)
