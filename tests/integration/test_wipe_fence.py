"""A wipe's cut-off holds for every write path, on a real Postgres: a write authorised before
the wipe (a session, a run, a job that began earlier, here or on another worker) is refused
once the cut-off is recorded, and a write already under way is in the database before the
wipe's deletes start. The wipe's own check counts every table and can fail."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, TypedDict

import chainlit.data
import psycopg
import pytest
from chainlit.context import init_http_context
from chainlit.user import User
from langgraph.graph import END, START, StateGraph

from auth.ownership import claim_thread, mark_temporary
from auth.sessions import SessionRevocations
from graphs.core import fence
from graphs.core.fence import Fence, WriteRefused
from graphs.core.persistence import Persistence
from graphs.core.runs import RunJournal
from graphs.memory import privacy as privacy_module
from graphs.memory.jobs import MemoryJobs
from graphs.memory.plans import PlanMemory
from graphs.memory.privacy import Privacy
from graphs.memory.scoped import ScopedMemory
from graphs.tools.fetchlog import FetchRecord, PostgresFetchLog
from tests.integration.test_memory_jobs import db, memory_jobs_running
from tests.integration.test_privacy import chainlit_thread, learned, new_id, scalar
from ui.chainlit.data_layer import PostgresDataLayer, append_message

pytestmark = pytest.mark.integration

__all__ = ["db"]


@pytest.fixture
async def wiper(db: Persistence) -> AsyncIterator[tuple[Privacy, MemoryJobs]]:
    async def load(thread_id: str) -> list[Any]:
        return []

    async with memory_jobs_running(db, load_messages=load, idle_seconds=600) as jobs:
        yield (
            Privacy(
                pool=db.pool,
                store=db.store,
                checkpointer=db.checkpointer,
                memory_jobs=jobs,
                revocations=SessionRevocations(db.pool),
                default_retention_days=365,
            ),
            jobs,
        )


async def signed_in_before_wipe(db: Persistence, wiper: Privacy) -> tuple[str, Fence]:
    """A user with a session issued before their data is wiped (and the wipe done)."""
    user = new_id("user")
    before = float(await scalar(db, "SELECT extract(epoch FROM now())")) - 2
    await wiper.wipe_account(user)
    return user, Fence(user, before)


async def after_wipe(wiper: Privacy, user: str) -> Fence:
    """A fresh sign-in after the wipe (tokens carry whole seconds)."""
    cut_off = await wiper.revocations.cut_off(user, cached=False)  # type: ignore[attr-defined]
    assert cut_off is not None
    return Fence(user, cut_off + 1)


async def test_thread_ownership_refuses_an_ended_session_and_takes_a_fresh_one(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs]
) -> None:
    user, old = await signed_in_before_wipe(db, wiper[0])
    thread = new_id("thread")
    with fence.acting_for(old), pytest.raises(WriteRefused):
        await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")
    with fence.acting_for(old), pytest.raises(WriteRefused):
        await mark_temporary(db.pool, thread_id=thread, user_id=user)
    assert await scalar(db, "SELECT count(*) FROM cairn_threads WHERE owner_id = %s", user) == 0

    # The same person signs in again: a fresh account that works.
    with fence.acting_for(await after_wipe(wiper[0], user)):
        await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")
    assert await scalar(db, "SELECT count(*) FROM cairn_threads WHERE owner_id = %s", user) == 1


async def test_run_journal_fetch_log_retention_and_dead_letters_refuse_an_ended_session(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs]
) -> None:
    service, jobs = wiper
    user, old = await signed_in_before_wipe(db, service)
    thread = new_id("thread")
    record = FetchRecord(
        id=0, thread_id=thread, url="https://a.test/", final_url="https://a.test/",
        fetched_at="", status=200, content_hash="x", title="t", content="c",
    )  # fmt: skip
    with fence.acting_for(old):
        with pytest.raises(WriteRefused):
            await RunJournal(db.pool).started(thread_id=thread, user_id=user, agent="assistant")
        with pytest.raises(WriteRefused):
            await PostgresFetchLog(db.pool).record(record)
        with pytest.raises(WriteRefused):
            await service.set_retention_days(user, 30)
        with pytest.raises(WriteRefused):
            await jobs._dead_letter(user, thread, 1, 4, RuntimeError("model down"))
    assert await scalar(db, "SELECT count(*) FROM cairn_runs WHERE user_id = %s", user) == 0
    assert (
        await scalar(db, "SELECT count(*) FROM research_fetch_log WHERE thread_id = %s", thread)
        == 0
    )
    assert await scalar(db, "SELECT count(*) FROM cairn_retention WHERE user_id = %s", user) == 0
    assert (
        await scalar(db, "SELECT count(*) FROM memory_dead_letters WHERE user_id = %s", user) == 0
    )

    # Without an authority (maintenance, tests) nothing is fenced; with a fresh one it works.
    with fence.acting_for(await after_wipe(service, user)):
        await PostgresFetchLog(db.pool).record(record)
    assert (
        await scalar(db, "SELECT count(*) FROM research_fetch_log WHERE thread_id = %s", thread)
        == 1
    )


async def test_memories_and_plan_memories_refuse_an_ended_session_but_deletes_go_through(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs]
) -> None:
    user, old = await signed_in_before_wipe(db, wiper[0])
    thread = new_id("thread")
    with fence.acting_for(old):
        with pytest.raises(WriteRefused):
            await learned(db, user, thread, "User prefers green")
        with pytest.raises(WriteRefused):
            await PlanMemory(db.store, user).record(
                key=thread, thread_id=thread, goal="g", steps=["a"], outcome="answered"
            )
        with pytest.raises(WriteRefused):
            await ScopedMemory(db.store, user).set_marker(thread, due_at=1.0)
    assert await ScopedMemory(db.store, user).items(include_tombstones=True) == []

    key = await learned(db, user, thread, "User prefers blue")  # unfenced: maintenance
    with fence.acting_for(old):
        await ScopedMemory(db.store, user).delete(key)  # forgetting is never refused
    assert await ScopedMemory(db.store, user).items(include_tombstones=True) == []


async def test_chainlit_rows_refuse_an_ended_session(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs]
) -> None:
    user, old = await signed_in_before_wipe(db, wiper[0])
    saved = (chainlit.data._data_layer, chainlit.data._data_layer_initialized)
    layer = PostgresDataLayer(db.pool)
    chainlit.data._data_layer, chainlit.data._data_layer_initialized = layer, True
    thread = str(uuid.uuid4())
    try:
        init_http_context(thread_id=thread)
        with fence.acting_for(old):
            with pytest.raises(WriteRefused):
                await layer.create_user(User(identifier=user))
            with pytest.raises(WriteRefused):
                await layer.update_thread(thread, name="chat")
            step = {"id": str(uuid.uuid4()), "threadId": thread, "type": "user_message",
                    "name": "user", "output": "hello"}  # fmt: skip
            await layer.create_step(step)  # type: ignore[arg-type]  # dropped, logged
            with pytest.raises(WriteRefused):
                await append_message(db.pool, thread, "a late reply")
    finally:
        chainlit.data._data_layer, chainlit.data._data_layer_initialized = saved
    assert await scalar(db, 'SELECT count(*) FROM "User" WHERE identifier = %s', user) == 0
    assert await scalar(db, 'SELECT count(*) FROM "Thread" WHERE id = %s', thread) == 0
    assert await scalar(db, 'SELECT count(*) FROM "Step" WHERE "threadId" = %s', thread) == 0


async def test_memory_jobs_are_not_queued_and_a_queued_one_writes_nothing_after_a_wipe(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs]
) -> None:
    service, jobs = wiper
    user, old = await signed_in_before_wipe(db, service)
    thread = new_id("thread")
    with fence.acting_for(old), pytest.raises(WriteRefused):
        await jobs._defer(user, thread, delay_s=600)
    assert not await jobs.pending(user_id=user)

    # A job queued before the wipe and running after it: its authority travels in its
    # arguments, so what it writes is refused and the job ends quietly.
    class Job:
        id, attempts = 1, 0

    class JobContext:
        job = Job()

    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")  # maintenance
    await jobs._run(JobContext(), user_id=user, thread_id=thread, since=old.since)  # type: ignore[arg-type]
    assert await ScopedMemory(db.store, user).items(include_tombstones=True) == []


class Steps(TypedDict):
    done: list[str]


async def test_a_run_in_flight_when_the_wipe_starts_writes_no_checkpoint_after_it(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs]
) -> None:
    """The run is on "another worker" (another task, its own session): it is between two steps
    when the wipe runs; its next checkpoint is refused, and nothing of it is left."""
    service, _ = wiper
    user = new_id("user")
    thread = new_id("thread")
    first_step_done, release = asyncio.Event(), asyncio.Event()

    async def first(state: Steps) -> Steps:
        return {"done": [*state["done"], "first"]}

    async def second(state: Steps) -> Steps:
        first_step_done.set()
        await release.wait()
        return {"done": [*state["done"], "second"]}

    builder = StateGraph(Steps)
    builder.add_node(first)
    builder.add_node(second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    graph = builder.compile(checkpointer=db.checkpointer)

    session = Fence(user, float(await scalar(db, "SELECT extract(epoch FROM now())")) - 2)

    async def run() -> Any:
        with fence.acting_for(session):
            await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")
            await chainlit_thread(db, user, thread)
            return await graph.ainvoke(
                {"done": []}, {"configurable": {"thread_id": thread}}, durability="sync"
            )

    running = asyncio.create_task(run())
    await asyncio.wait_for(first_step_done.wait(), 20)
    assert await scalar(db, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread) > 0

    report = await service.wipe_account(user)
    release.set()
    with pytest.raises(WriteRefused):
        await running

    assert report.verified, report.leftovers
    assert await service.leftovers(user, {thread}) == dict.fromkeys(report.leftovers, 0)


async def test_the_wipes_check_counts_every_table_and_fails_when_something_is_left(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _ = wiper
    user = new_id("user")
    thread = new_id("thread")
    report = await service.wipe_account(user)
    assert report.verified
    assert set(report.leftovers) >= {
        "owned", "runs", "chainlit_user", "chainlit_threads", "chainlit_steps", "jobs",
        "dead", "retention", "checkpoints", "fetched_pages", "store_items", "store_vectors",
    }  # fmt: skip

    # Rows written behind the fences' back (no authority: as a buggy path would) are found.
    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")
    await chainlit_thread(db, user, thread)
    await learned(db, user, thread, "User prefers green")
    await PlanMemory(db.store, user).record(
        key=thread, thread_id=thread, goal="g", steps=["a"], outcome="answered"
    )
    await RunJournal(db.pool).started(thread_id=thread, user_id=user, agent="assistant")
    await service.set_retention_days(user, 30)
    async with db.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args, status) "
            "VALUES ('memory', 'cairn.write_memory', %s, 'failed')",
            (f'{{"user_id": "{user}", "thread_id": "{thread}"}}',),
        )
    found = await service.leftovers(user, set())
    for table in ("owned", "runs", "chainlit_user", "chainlit_threads", "chainlit_steps",
                  "jobs", "retention", "store_items", "store_vectors"):  # fmt: skip
        assert found[table] > 0, table

    # A writer that ignores the cut-off and keeps writing between the wipe's passes: the wipe
    # says it is not verified, in its report and in its log.
    monkeypatch.setattr(privacy_module, "WIPE_WAIT_S", 0.0)
    original = Privacy._wipe_pass

    async def pass_then_sneak_a_write(self: Privacy, user_id: str, report: Any) -> None:
        await original(self, user_id, report)
        await learned(db, user_id, thread, "User prefers red")

    monkeypatch.setattr(Privacy, "_wipe_pass", pass_then_sneak_a_write)
    failed = await service.wipe_account(user)
    assert not failed.verified
    assert failed.leftovers["store_items"] == 1
    verified = await scalar(db, "SELECT verified FROM cairn_wipes WHERE id = %s", failed.wipe_id)
    assert verified is False


async def test_writers_hammering_during_a_wipe_leave_nothing(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs]
) -> None:
    """Several sessions of one user (as on other workers) write memories, threads and Chainlit
    rows in a loop while the wipe runs: whatever landed before the cut-off is deleted, and
    nothing after it lands."""
    service, _ = wiper
    user = new_id("user")
    session = Fence(user, float(await scalar(db, "SELECT extract(epoch FROM now())")) - 2)
    refused: list[int] = []

    async def writer(n: int) -> None:
        with fence.acting_for(session):
            for i in range(200):
                thread = new_id(f"t{n}-{i}")
                try:
                    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")
                    await learned(db, user, thread, f"User prefers colour {n}-{i}")
                except WriteRefused:
                    refused.append(n)
                    return
                await asyncio.sleep(0.01)

    writers = [asyncio.create_task(writer(n)) for n in range(4)]
    await asyncio.sleep(0.5)
    report = await service.wipe_account(user)
    await asyncio.wait_for(asyncio.gather(*writers), 30)

    assert sorted(refused) == [0, 1, 2, 3]  # every writer was stopped by the cut-off
    assert report.verified, report.leftovers
    assert report.counts["memories"] > 0
    assert await service.leftovers(user, report.thread_ids) == dict.fromkeys(report.leftovers, 0)


async def test_every_worker_hears_a_cut_off_at_once_and_forgets_its_cached_look(
    db: Persistence,
) -> None:
    """Worker 2 looked at the user a moment ago (cached: not ended); worker 1 wipes. Worker 2
    hears it through Postgres and refuses the old session straight away, not 2 s later, and
    ends its own live connections of the user."""
    here, there = SessionRevocations(db.pool), SessionRevocations(db.pool)
    user = new_id("user")
    issued = float(await scalar(db, "SELECT extract(epoch FROM now())")) - 2
    assert not await there.is_revoked(user, issued)  # cached for 2 s on that worker
    ended: asyncio.Queue[str] = asyncio.Queue()

    async def on_ended(user_id: str) -> None:
        await ended.put(user_id)

    listening = asyncio.create_task(there.listen(on_ended))
    try:
        for _ in range(100):  # until the LISTEN is in place (bounded: 10 s)
            if await scalar(
                db,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN %%'",
            ):
                break
            await asyncio.sleep(0.1)
        await here.revoke(user)
        assert await asyncio.wait_for(ended.get(), 10) == user
        assert await there.is_revoked(user, issued)  # the cache was dropped
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


@pytest.mark.parametrize("path", ["transaction", "statement", "store"])
async def test_a_write_waiting_for_the_lock_sees_the_cut_off_it_waited_for(
    db: Persistence, path: str
) -> None:
    """Both checks read the cut-off after taking the lock: a write (in a transaction with
    fence.check, or one statement with fence.STATEMENT_CTE, as a thread claim is) that queued
    behind a cut-off in progress is refused, not let through by a snapshot from before. A store
    put of one row without vectors (a marker) takes the statement's path too."""
    user = new_id("user")
    session = Fence(user, float(await scalar(db, "SELECT extract(epoch FROM now())")) - 2)
    marked = new_id("thread")

    async def write(authority: Fence) -> None:
        if path == "statement":
            await claim_thread(db.pool, thread_id=new_id("thread"), user_id=user, agent="a")
            return
        if path == "store":  # a one-row put without vectors: the check inside the statement
            await ScopedMemory(db.store, user).set_marker(marked, due_at=1.0)
            return
        async with fence.fenced(db.pool, authority) as conn:
            await conn.execute(
                "INSERT INTO cairn_threads (thread_id, owner_id, agent) VALUES (%s, %s, 'a')",
                (new_id("thread"), user),
            )

    async def written() -> int:
        if path == "store":
            return int(bool(await ScopedMemory(db.store, user).marker(marked)))
        return int(await scalar(db, "SELECT count(*) FROM cairn_threads WHERE owner_id = %s", user))

    async with db.pool.connection() as wipe, wipe.transaction():
        await wipe.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (fence.lock_key(user),)
        )
        await wipe.execute(
            "INSERT INTO cairn_session_revocations (user_id, revoked_at) "
            "VALUES (%s, clock_timestamp())",
            (user,),
        )
        with fence.acting_for(session):
            waiting = asyncio.create_task(write(session))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # held behind the cut-off's exclusive lock
    with pytest.raises(WriteRefused):
        await asyncio.wait_for(waiting, 10)
    assert await written() == 0

    # A session that began after the cut-off writes.
    cut = float(
        await scalar(
            db,
            "SELECT extract(epoch FROM revoked_at) FROM cairn_session_revocations "
            "WHERE user_id = %s",
            user,
        )
    )
    with fence.acting_for(Fence(user, cut + 1)):
        await write(Fence(user, cut + 1))
    assert await written() == 1


async def user_with_data(db: Persistence) -> tuple[str, str]:
    user, thread = new_id("user"), new_id("thread")
    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")
    await chainlit_thread(db, user, thread)
    await learned(db, user, thread, "User likes green tea")
    return user, thread


async def wipe_row(db: Persistence, user: str, step: str) -> int:
    """A wipe as its worker left it when it was killed at `step` (its lease went with it)."""
    return int(
        await scalar(
            db, "INSERT INTO cairn_wipes (user_id, step) VALUES (%s, %s) RETURNING id", user, step
        )
    )


async def test_a_wipe_whose_worker_was_killed_mid_way_is_finished_by_a_live_one(
    db: Persistence, wiper: tuple[Privacy, MemoryJobs]
) -> None:
    """kill -9 during "delete all my data": half the user's data gone, half left, and nobody
    finished it. A live worker finds the unfinished wipe (its lease free) and completes it; a
    wipe still running on a live worker is left alone."""
    service, _jobs = wiper
    killed_user, _ = await user_with_data(db)
    killed_wipe = await wipe_row(db, killed_user, "sessions_ended")
    never_cut_user, _ = await user_with_data(db)
    never_cut = await wipe_row(db, never_cut_user, "started")  # killed before the cut-off
    busy_user, _ = await user_with_data(db)
    busy_wipe = await wipe_row(db, busy_user, "sessions_ended")

    async with await psycopg.AsyncConnection.connect(db.pool.conninfo, autocommit=True) as alive:
        await alive.execute(
            "SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"cairn-wipe:{busy_wipe}",)
        )
        reports = await service.resume_unfinished_wipes()
        assert sorted(r.wipe_id for r in reports) == sorted([killed_wipe, never_cut])
        assert all(r.verified for r in reports)
        for user, wipe in ((killed_user, killed_wipe), (never_cut_user, never_cut)):
            assert not any((await service.leftovers(user, set())).values())
            assert await scalar(
                db, "SELECT finished_at IS NOT NULL AND verified FROM cairn_wipes WHERE id = %s",
                wipe,
            )  # fmt: skip
        # Its sessions were ended too, as the wipe would have done first.
        assert await service.revocations.cut_off(never_cut_user, cached=False) is not None  # type: ignore[attr-defined]
        # The one a live worker runs is its own.
        assert await scalar(db, "SELECT count(*) FROM cairn_threads WHERE owner_id = %s", busy_user)
        assert await service.resume_unfinished_wipes() == []
    [report] = await service.resume_unfinished_wipes()  # ... until that worker dies
    assert report.wipe_id == busy_wipe
    assert report.verified
