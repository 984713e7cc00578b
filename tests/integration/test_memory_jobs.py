"""Debounced memory jobs on procrastinate and a real Postgres: one run per idle thread, durable."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableLambda

from auth.ownership import claim_thread
from graphs.assistant.offline import offline_assistant
from graphs.core.metrics import REGISTRY
from graphs.core.persistence import Persistence, make_pool, open_persistence
from graphs.core.settings import Settings
from graphs.memory.jobs import MemoryJobs
from graphs.memory.scoped import ScopedMemory
from tests.conftest import create_database

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
async def db(pg_server_url: str, embedding: Any) -> AsyncIterator[Persistence]:
    """A fresh database with the app's schema (procrastinate's and the dead-letter table in it)."""
    url = create_database(pg_server_url)
    persistence = await open_persistence(
        Settings(data_dir=Path(tempfile.mkdtemp())),
        pool=make_pool(url),
        embedding=embedding,
    )
    yield persistence
    await persistence.close()


# --- helpers ----------------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4()}"


class Conversations:
    """What load_messages reads, plus a record of every load (one per job run)."""

    def __init__(self) -> None:
        self.messages: dict[str, list[BaseMessage]] = {}
        self.loads: list[tuple[str, float]] = []

    def add(self, thread_id: str, *texts: str) -> None:
        thread = self.messages.setdefault(thread_id, [])
        for text in texts:
            thread.append(HumanMessage(text, id=new_id("msg")))
            thread.append(AIMessage("Noted.", id=new_id("msg")))

    async def load(self, thread_id: str) -> list[BaseMessage]:
        self.loads.append((thread_id, time.time()))
        return list(self.messages.get(thread_id, []))

    def loads_of(self, thread_id: str) -> list[float]:
        return [at for thread, at in self.loads if thread == thread_id]


async def eventually(
    check: Callable[[], Awaitable[Any]], *, timeout: float = 30.0, what: str = "condition"
) -> Any:
    """Poll until check() is truthy; fail after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if result := await check():
            return result
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what}"
            raise AssertionError(msg)
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def memory_jobs_running(
    db: Persistence, *, worker: bool = True, pool: Any = None, **kwargs: Any
) -> AsyncIterator[MemoryJobs]:
    options: dict[str, Any] = {
        "model": offline_assistant(),
        "idle_seconds": 0.2,
        "retry_wait_s": 0,
        **kwargs,
    }
    jobs = MemoryJobs(pool=pool or db.pool, store=db.store, **options)
    await jobs.open()
    if worker:
        jobs.start_worker()
    try:
        yield jobs
    finally:
        await jobs.stop()


async def no_pending_jobs(jobs: MemoryJobs, *users: str) -> bool:
    for user in users:
        if await jobs.pending(user_id=user):
            return False
    return True


async def contents(db: Persistence, user: str) -> list[str]:
    return sorted(m.content for m in await ScopedMemory(db.store, user).all_memories())


async def owned_thread(db: Persistence, user: str) -> str:
    thread = new_id("thread")
    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")
    return thread


# --- tests ------------------------------------------------------------------------------------


async def test_messages_in_quick_succession_make_one_job_run_after_the_quiet_period(
    db: Persistence,
) -> None:
    user = new_id("user")
    thread = await owned_thread(db, user)
    talk = Conversations()
    idle = 1.0
    done_before = job_runs("done")
    async with memory_jobs_running(db, load_messages=talk.load, idle_seconds=idle) as jobs:
        for i, text in enumerate(["I'm vegetarian", "My manager is Priya", "I live in Pune"]):
            if i:
                await asyncio.sleep(0.3)
            talk.add(thread, text)
            last_message_at = time.time()
            await jobs.message_arrived(user_id=user, thread_id=thread)

        await eventually(lambda: contents(db, user), what="the memory job")
        await eventually(lambda: no_pending_jobs(jobs, user), what="the queue to drain")

    [ran_at] = talk.loads_of(thread)
    # Not before the thread went quiet (the job allows itself 50 ms of clock slack) ...
    assert ran_at >= last_message_at + idle - 0.05
    # ... so the one run saw the whole conversation.
    assert await contents(db, user) == [
        "User is vegetarian",
        "User lives in Pune",
        "User's manager is Priya",
    ]
    marker = await ScopedMemory(db.store, user).marker(thread)
    assert marker["last_message_id"] == talk.messages[thread][-1].id
    assert job_runs("done") == done_before + 1, "one run, counted once"


async def test_a_queued_job_survives_a_restart(db: Persistence) -> None:
    user = new_id("user")
    thread = await owned_thread(db, user)
    talk = Conversations()
    talk.add(thread, "I'm vegan and my manager is Ines")
    crashed_pool = make_pool(db.pool.conninfo, max_size=2)
    await crashed_pool.open(wait=True)
    async with memory_jobs_running(
        db, worker=False, pool=crashed_pool, load_messages=talk.load
    ) as crashed:
        await crashed.message_arrived(user_id=user, thread_id=thread)
        assert len(await crashed.pending(user_id=user)) == 1
    await crashed_pool.close()  # the process dies with the job still queued
    assert talk.loads == []

    async with memory_jobs_running(db, load_messages=talk.load) as restarted:
        await eventually(lambda: contents(db, user), what="the job queued before the restart")
        await eventually(lambda: no_pending_jobs(restarted, user), what="the queue to drain")

    assert await contents(db, user) == ["User is vegan", "User's manager is Ines"]
    assert len(talk.loads_of(thread)) == 1


class BrokenModel:
    """A memory-writer model whose server is down."""

    def __init__(self) -> None:
        self.calls = 0

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Runnable[Any, Any]:
        async def respond(_input: Any) -> Any:
            self.calls += 1
            msg = "model server unavailable"
            raise RuntimeError(msg)

        return RunnableLambda(respond)


async def dead_letters(db: Persistence, user: str) -> list[dict[str, Any]]:
    async with db.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT user_id, thread_id, attempts, error FROM memory_dead_letters WHERE user_id = %s",
            (user,),
        )
        return [dict(row) for row in await cur.fetchall()]


async def job_statuses(db: Persistence, user: str) -> list[str]:
    async with db.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status FROM procrastinate_jobs WHERE args->>'user_id' = %s", (user,)
        )
        return [str(row["status"]) for row in await cur.fetchall()]


async def test_a_failing_job_is_retried_then_dead_lettered(db: Persistence) -> None:
    user = new_id("user")
    thread = await owned_thread(db, user)
    talk = Conversations()
    talk.add(thread, "I'm vegetarian")
    model = BrokenModel()
    runs = {o: job_runs(o) for o in ("retried", "dead_lettered", "done")}

    async with memory_jobs_running(
        db, model=model, load_messages=talk.load, max_attempts=2, retry_wait_s=0
    ) as jobs:
        await jobs.message_arrived(user_id=user, thread_id=thread)
        [letter] = await eventually(lambda: dead_letters(db, user), what="a dead letter")
        await eventually(lambda: no_pending_jobs(jobs, user), what="the retries to stop")

    assert letter["thread_id"] == thread
    assert letter["attempts"] == 2
    assert "RuntimeError" in letter["error"]
    assert model.calls == 2
    assert await job_statuses(db, user) == ["failed"]
    assert await contents(db, user) == []
    assert "last_message_id" not in await ScopedMemory(db.store, user).marker(thread)
    # What /metrics reports for this worker: one retry, then the dead letter, nothing done.
    assert job_runs("retried") == runs["retried"] + 1
    assert job_runs("dead_lettered") == runs["dead_lettered"] + 1
    assert job_runs("done") == runs["done"]


def job_runs(outcome: str) -> float:
    value = REGISTRY.get_sample_value("cairn_memory_job_runs_total", {"outcome": outcome})
    return value or 0.0


class OverlapModel:
    """The offline writer, but each call waits (briefly) until `expected` calls are in flight."""

    def __init__(self, expected: int) -> None:
        self.inner = offline_assistant()
        self.expected = expected
        self.in_flight = 0
        self.most_in_flight = 0
        self.all_in = asyncio.Event()

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Runnable[Any, Any]:
        inner = self.inner.with_structured_output(schema, **kwargs)

        async def respond(model_input: Any) -> Any:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            if self.in_flight >= self.expected:
                self.all_in.set()
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.all_in.wait(), timeout=10)
                return await inner.ainvoke(model_input)
            finally:
                self.in_flight -= 1

        return RunnableLambda(respond)


async def test_jobs_of_different_users_run_concurrently_and_stay_isolated(
    db: Persistence,
) -> None:
    people = {
        new_id("user"): ("I live in Oslo. My name is Astrid", "Astrid", "Oslo"),
        new_id("user"): ("I live in Accra. My name is Kofi", "Kofi", "Accra"),
    }
    talk = Conversations()
    threads = {user: await owned_thread(db, user) for user in people}
    for user, (text, _, _) in people.items():
        talk.add(threads[user], text)
    model = OverlapModel(expected=2)

    async with memory_jobs_running(db, model=model, load_messages=talk.load) as jobs:
        await asyncio.gather(
            *(jobs.message_arrived(user_id=u, thread_id=t) for u, t in threads.items())
        )
        for user in people:
            await eventually(lambda user=user: contents(db, user), what=f"{user}'s job")
        await eventually(lambda: no_pending_jobs(jobs, *people), what="the queue to drain")

    assert model.most_in_flight == 2
    for user, (_, name, city) in people.items():
        assert await contents(db, user) == [f"User lives in {city}", f"User's name is {name}"]


async def test_a_job_for_a_thread_the_user_does_not_own_writes_nothing(db: Persistence) -> None:
    user, other = new_id("user"), new_id("user")
    mine = await owned_thread(db, user)
    foreign = await owned_thread(db, other)
    unknown = new_id("thread")
    talk = Conversations()
    talk.add(mine, "I live in Kyoto")
    talk.add(foreign, "I'm vegan and my manager is Mallory")
    talk.add(unknown, "My name is Eve")

    async with memory_jobs_running(db, load_messages=talk.load) as jobs:
        for thread in (foreign, unknown, mine):
            await jobs.message_arrived(user_id=user, thread_id=thread)
        await eventually(lambda: contents(db, user), what="the owned thread's job")
        await eventually(lambda: no_pending_jobs(jobs, user), what="the queue to drain")

    assert await contents(db, user) == ["User lives in Kyoto"]
    assert await contents(db, other) == []
    assert talk.loads_of(foreign) == []
    assert talk.loads_of(unknown) == []


async def test_a_job_left_doing_by_a_killed_worker_is_retried_by_another(db: Persistence) -> None:
    user = new_id("user")
    thread = await owned_thread(db, user)
    talk = Conversations()
    talk.add(thread, "I live in Kyoto")
    async with memory_jobs_running(db, worker=False, load_messages=talk.load) as queue:
        await queue.message_arrived(user_id=user, thread_id=thread)

    doomed = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.stalled_job_worker", db.pool.conninfo],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:

        async def taken() -> bool:
            assert doomed.poll() is None, "the worker process ended before it was killed"
            return await job_statuses(db, user) == ["doing"]

        await eventually(taken, timeout=60, what="the doomed worker to take the job")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=10)
    finally:
        if doomed.poll() is None:
            doomed.kill()
    assert await job_statuses(db, user) == ["doing"], "killed mid-job: left running"

    async with memory_jobs_running(
        db, load_messages=talk.load, heartbeat_s=0.5, stalled_after_s=2.0, sweep_every_s=0.5
    ) as survivor:
        await eventually(lambda: contents(db, user), what="the stalled job to be retried")
        await eventually(lambda: no_pending_jobs(survivor, user), what="the queue to drain")

    assert await contents(db, user) == ["User lives in Kyoto"]
    assert len(talk.loads_of(thread)) == 1, "run once here (the killed worker used its own)"


async def stall(db: Persistence, user: str, *, attempts: int = 0) -> int:
    """Make the user's queued job look taken by a worker that died an hour ago."""
    async with db.pool.connection() as conn:
        cur = await conn.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) "
            "VALUES (now() - interval '1 hour') RETURNING id"
        )
        worker = (await cur.fetchone())["id"]  # type: ignore[index]
        cur = await conn.execute(
            "UPDATE procrastinate_jobs SET status = 'doing', worker_id = %s, attempts = %s "
            "WHERE args->>'user_id' = %s AND status = 'todo' RETURNING id",
            (worker, attempts, user),
        )
        return int((await cur.fetchone())["id"])  # type: ignore[index]


async def test_stalled_jobs_are_retried_once_however_many_workers_sweep(db: Persistence) -> None:
    user = new_id("user")
    thread = await owned_thread(db, user)
    talk = Conversations()
    async with (
        memory_jobs_running(db, worker=False, load_messages=talk.load) as one,
        memory_jobs_running(db, worker=False, load_messages=talk.load) as two,
        memory_jobs_running(db, worker=False, load_messages=talk.load) as three,
    ):
        await one.message_arrived(user_id=user, thread_id=thread)
        job = await stall(db, user)
        sweeps = await asyncio.gather(*(w.retry_stalled() for w in (one, two, three)))
        assert sorted(job_id for ids in sweeps for job_id in ids) == [job]
        assert await job_statuses(db, user) == ["todo"]
        assert [await w.retry_stalled() for w in (one, two, three)] == [[], [], []]


async def test_a_stalled_job_out_of_attempts_is_dead_lettered_not_retried(
    db: Persistence,
) -> None:
    user = new_id("user")
    thread = await owned_thread(db, user)
    async with memory_jobs_running(
        db, worker=False, load_messages=Conversations().load, max_attempts=2
    ) as jobs:
        await jobs.message_arrived(user_id=user, thread_id=thread)
        await stall(db, user, attempts=1)
        assert await jobs.retry_stalled() == []
    assert await job_statuses(db, user) == ["failed"]
    [letter] = await dead_letters(db, user)
    assert "stopped while running it" in letter["error"]


async def test_a_stalled_job_whose_thread_has_a_newer_job_queued_is_dropped(
    db: Persistence,
) -> None:
    user = new_id("user")
    thread = await owned_thread(db, user)
    async with memory_jobs_running(db, worker=False, load_messages=Conversations().load) as jobs:
        await jobs.message_arrived(user_id=user, thread_id=thread)
        await stall(db, user)
        # A worker takes a job when it is due: the user writes again after that (before it,
        # the waiting job would be left to pick the new deadline up: no new one is queued).
        await asyncio.sleep(0.3)
        await jobs.message_arrived(user_id=user, thread_id=thread)  # the user wrote again
        assert await jobs.retry_stalled() == []
    assert await job_statuses(db, user) == ["todo"]


async def queued_jobs(db: Persistence, user: str) -> int:
    async with db.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE args->>'user_id' = %s "
            "AND status = 'todo'",
            (user,),
        )
        row = await cur.fetchone()
    return int(row["n"]) if row else 0


async def test_later_messages_move_the_deadline_without_queueing_and_a_cancel_lets_the_next_queue(
    db: Persistence, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a job waits for the thread, messages only push its deadline (no queueing attempt);
    after the user's jobs are cancelled (memory switched off), the next message queues again."""
    user = new_id("user")
    thread = await owned_thread(db, user)
    talk = Conversations()
    async with memory_jobs_running(
        db, worker=False, load_messages=talk.load, idle_seconds=600
    ) as jobs:
        deferred: list[str] = []
        original = jobs._defer

        async def counting(user_id: str, thread_id: str, *, delay_s: float) -> None:
            deferred.append(thread_id)
            await original(user_id, thread_id, delay_s=delay_s)

        monkeypatch.setattr(jobs, "_defer", counting)
        memory = ScopedMemory(db.store, user)
        for _ in range(3):
            await jobs.message_arrived(user_id=user, thread_id=thread)
        assert deferred == [thread]
        assert await queued_jobs(db, user) == 1
        marker = await memory.marker(thread)
        assert marker["job_at"] <= marker["due_at"]
        first_due = marker["due_at"]
        await jobs.message_arrived(user_id=user, thread_id=thread)
        assert (await memory.marker(thread))["due_at"] >= first_due  # the deadline moved

        assert await jobs.cancel_user(user_id=user) == 1
        assert await queued_jobs(db, user) == 0
        await jobs.message_arrived(user_id=user, thread_id=thread)
        assert deferred == [thread, thread]
        assert await queued_jobs(db, user) == 1


async def test_a_memory_job_reads_the_thread_from_the_graph_of_an_agent_that_learns(
    db: Persistence,
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    from ui.runner import AgentSpec
    from ui.runtime import memory_loader

    def reply(_state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("Noted.")]}

    def build(**_: Any) -> Any:
        builder = StateGraph(MessagesState)
        builder.add_node(reply)
        builder.add_edge(START, "reply")
        return builder.compile(checkpointer=InMemorySaver())

    def spec(key: str, *, learns: bool) -> AgentSpec:
        return AgentSpec(
            key=key,
            profile=key.title(),
            description="",
            build=build,
            inputs=lambda text, _mid: {"messages": [HumanMessage(text)]},
            memory_jobs=learns,
        )

    agents = (spec("notes", learns=True), spec("tasks", learns=False))
    graphs = {agent.key: agent.build() for agent in agents}
    user = new_id("user")
    threads = {}
    for agent in agents:
        threads[agent.key] = new_id("thread")
        await claim_thread(db.pool, thread_id=threads[agent.key], user_id=user, agent=agent.key)
        config = {"configurable": {"thread_id": threads[agent.key]}}
        await graphs[agent.key].ainvoke({"messages": [HumanMessage("I live in Lyon")]}, config)
    load = memory_loader(db.pool, graphs, agents)

    assert [m.text for m in await load(threads["notes"])] == ["I live in Lyon", "Noted."]
    assert await load(threads["tasks"]) == []
    assert await load(new_id("thread")) == []
