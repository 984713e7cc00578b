"""A run outlives its worker: kill -9 mid-Planner run, mid-Research run (a subagent at work), and a
live worker resumes it from the last checkpoint with no completed step or subagent task run again
(real Postgres, real processes)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableLambda
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from auth.ownership import claim_thread
from auth.tokens import AccessTokens, LimitExceeded, TokenLimits
from graphs.assistant.graph import build_graph as build_assistant
from graphs.assistant.offline import offline_assistant
from graphs.core.metrics import REGISTRY
from graphs.core.persistence import make_pool, open_persistence
from graphs.core.runlock import ThreadRunLocks
from graphs.core.runs import CALL_LAPSED, RunJournal, StrandedRun, heartbeat_forever
from graphs.core.settings import Settings
from graphs.planner.graph import build_graph
from graphs.planner.offline import offline_planner
from graphs.planner.sql import AnalyticsDatabase, analyst_url
from graphs.planner.state import step_parts
from graphs.planner.tools import make_tools
from graphs.research import SAMPLE_CORPUS_DIR
from graphs.research.graph import ResearchTools, file_text, slug
from graphs.research.graph import build_graph as build_research
from graphs.research.offline import FETCHES_PER_TOPIC, OfflineResearchModel
from graphs.tools.fetch import Fetcher
from graphs.tools.fetchlog import PostgresFetchLog
from graphs.tools.search import LocalCorpus
from ui.agents import AGENTS
from ui.agents import assistant as assistant_agent
from ui.agents import planner as planner_agent
from ui.agents import research as research_agent
from ui.chainlit.adapter import ChainlitChat
from ui.chainlit.agents import discover
from ui.recovery import recover_forever, recover_once
from ui.runner import PostgresThreads, Runner
from ui.surface import HeadlessSurface, HeadlessView

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GOAL = "Which region had the highest churn last quarter?"
SLOW_CALL_S = 1.5
"""Each model call of the doomed worker takes this long, so the test can kill it mid-run."""


class SlowModel(BaseChatModel):
    """The offline planner, each call delayed: a model that takes its time."""

    inner: Any
    delay_s: float

    @property
    def _llm_type(self) -> str:
        return "slow-offline"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        time.sleep(self.delay_s)
        return self.inner._generate(messages, stop=stop, run_manager=run_manager, **kw)

    async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        await asyncio.sleep(self.delay_s)
        return await self.inner._agenerate(messages, stop=stop, run_manager=run_manager, **kw)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        bound = self.inner.bind_tools(tools, **kwargs)
        return RunnableLambda(self._slow(bound))

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Any:
        structured = self.inner.with_structured_output(schema, **kwargs)
        return RunnableLambda(self._slow(structured))

    def _slow(self, runnable: Any) -> Callable[[Any], Awaitable[Any]]:
        async def call(value: Any) -> Any:
            await asyncio.sleep(self.delay_s)
            return await runnable.ainvoke(value)

        return call


ASSISTANT_MESSAGE = "What is a good way to plan a week of meals?"
RESEARCH_QUESTION = "When did the seed vault open and how do honeybees share the location of food?"


async def make_runner(
    url: str, *, worker: str, slow_s: float = 0.0, agent: str = "planner"
) -> tuple[Runner, Callable[[], Awaitable[None]]]:
    """A worker's runner for the Planner or Research, as ui/runtime.py builds it, on the given
    database (the offline models; `slow_s` delays each model call)."""
    from graphs.core.embeddings import LOCAL_MODEL_DIMS, EmbeddingSpec

    settings = Settings(data_dir=Path(tempfile.mkdtemp()))
    embedding = EmbeddingSpec("test:fixed", LOCAL_MODEL_DIMS, FixedEmbeddings())
    persistence = await open_persistence(
        settings, pool=make_pool(url, max_size=5), embedding=embedding
    )
    model: BaseChatModel
    if agent == "assistant":
        model = offline_assistant()
        if slow_s:
            model = SlowModel(inner=model, delay_s=slow_s)
        graph = build_assistant(
            checkpointer=persistence.checkpointer, store=persistence.store, model=model
        )
        spec = assistant_agent.SPEC
    elif agent == "research":
        model = OfflineResearchModel()
        if slow_s:
            model = SlowModel(inner=model, delay_s=slow_s)
        corpus = LocalCorpus(SAMPLE_CORPUS_DIR, store=persistence.store)
        fetcher = Fetcher(log=PostgresFetchLog(persistence.pool), openers={"corpus": corpus.open})
        graph = build_research(
            checkpointer=persistence.checkpointer,
            store=persistence.store,
            model=model,
            tools=ResearchTools(search=corpus, fetcher=fetcher),
            # One subagent at a time: when the second topic is fetching, the first is done.
            settings=Settings(research_critique_rounds=1, research_max_subagents=1),
        )
        spec = research_agent.SPEC
    else:
        model = offline_planner()
        if slow_s:
            model = SlowModel(inner=model, delay_s=slow_s)
        tools = make_tools(AnalyticsDatabase(analyst_url(url), timeout_ms=3000))
        graph = build_graph(
            checkpointer=persistence.checkpointer, store=persistence.store, model=model, tools=tools
        )
        spec = planner_agent.SPEC
    locks = ThreadRunLocks(persistence.pool)
    runner = Runner(
        agents=[spec],
        graphs={spec.key: graph},
        threads=PostgresThreads(persistence.pool),
        locks=locks,
        journal=RunJournal(persistence.pool, worker=worker),
        stale_s=1.0,
    )

    async def close() -> None:
        await locks.close()
        await persistence.close()

    return runner, close


class FixedEmbeddings(Embeddings):
    """Deterministic vectors (the test is about runs, not recall)."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return self.embed_query(text)

    def _vector(self, text: str) -> list[float]:
        from graphs.core.embeddings import LOCAL_MODEL_DIMS

        seed = sum(map(ord, text)) or 1
        return [((seed * (i + 1)) % 97) / 97.0 for i in range(LOCAL_MODEL_DIMS)]


async def past_steps(runner: Runner, thread_id: str) -> list[Any]:
    state = await runner.graphs["planner"].aget_state({"configurable": {"thread_id": thread_id}})
    return list(state.values.get("past_steps", []))


async def send_goal(runner: Runner, thread_id: str, surface: Any = None) -> Any:
    """Alice's new Planner thread, sent GOAL (it pauses on the plan's review)."""
    pool = runner.threads.pool  # type: ignore[attr-defined]
    await claim_thread(pool, thread_id=thread_id, user_id="alice", agent="planner")
    return await runner.message(
        surface or HeadlessSurface(),
        user_id="alice",
        thread_id=thread_id,
        profile="Planner",
        text=GOAL,
        message_id="m1",
        temporary=False,
    )


async def test_a_planner_run_killed_mid_run_is_resumed_by_a_live_worker(database_url):
    runner, close = await make_runner(database_url, worker="survivor")
    thread_id = "durable-planner-1"
    paused = await send_goal(runner, thread_id)
    assert paused.status == "paused"
    [review] = paused.interrupts

    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.stranded_worker",
            database_url,
            thread_id,
            review.id,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60
        while not await past_steps(runner, thread_id):
            assert worker.poll() is None, "the worker ended before the test could stop it"
            assert time.monotonic() < deadline, "the worker never finished a step"
            await asyncio.sleep(0.1)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
    before = await past_steps(runner, thread_id)
    assert 1 <= len(before) < 3, "killed mid-run: some steps done, not all"

    # The dead worker's run is found by its stopped heartbeat and resumed here.
    killed_at = time.monotonic()
    stranded = []
    while not stranded:
        assert time.monotonic() - killed_at < 30, "the stranded run was never found"
        stranded = await runner.stranded()
        await asyncio.sleep(0.2)
    [run] = stranded
    assert (run.thread_id, run.user_id, run.agent) == (thread_id, "alice", "planner")
    outcome = await runner.resume_stranded(run, HeadlessSurface())
    recovered_in = time.monotonic() - killed_at

    assert outcome.status == "done", outcome
    assert outcome.reply is not None
    assert "Here is what the plan found" in outcome.reply
    after = await past_steps(runner, thread_id)
    indices = [step_parts(r)[0] for r in after]
    assert indices == list(range(1, len(after) + 1)), "no step index twice, none missing"
    assert after[: len(before)] == before, "completed steps were not run again"
    assert await runner.stranded() == []  # finished: nothing left to resume
    print(f"recovered in {recovered_in:.1f} s after the kill")
    await close()


def spawn_doomed(database_url: str, thread_id: str, interrupt_id: str, agent: str):
    """The worker that approves the pause and runs slowly, in its own process."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.stranded_worker",
            database_url,
            thread_id,
            interrupt_id,
            agent,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def kill_when(worker: subprocess.Popen[bytes], ready: Callable[[], Awaitable[bool]]) -> None:
    """SIGKILL the worker as soon as `ready()` says the run is where the test wants it."""
    try:
        deadline = time.monotonic() + 90
        while not await ready():
            assert worker.poll() is None, "the worker ended before the test could stop it"
            assert time.monotonic() < deadline, "the worker never got there"
            await asyncio.sleep(0.1)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()


def resumed_count(agent: str) -> float:
    labels = {"agent": agent, "outcome": "done"}
    return REGISTRY.get_sample_value("cairn_runs_resumed_total", labels) or 0.0


async def recover(runner: Runner, killed_at: float) -> Any:
    """What every worker's sweep does (ui/recovery.py): nobody is connected to this worker, so
    the resumed run's reply goes into the stored conversation."""
    pool = runner.threads.pool  # type: ignore[attr-defined]
    outcomes: list[Any] = []
    while not outcomes:
        assert time.monotonic() - killed_at < 30, "the stranded run was never found"
        outcomes = await recover_once(runner, chat_of(pool))
        await asyncio.sleep(0.2)
    [outcome] = outcomes
    return outcome


async def stored_replies(runner: Runner, thread_id: str) -> list[str]:
    """The conversation as its owner sees it when they open it (Chainlit's Step rows)."""
    pool = runner.threads.pool  # type: ignore[attr-defined]
    async with pool.connection() as conn:
        cur = await conn.execute(
            'SELECT output FROM "Step" WHERE "threadId" = %s AND type = %s ORDER BY "createdAt"',
            (thread_id, "assistant_message"),
        )
        return [row["output"] for row in await cur.fetchall()]


async def chainlit_thread(runner: Runner, thread_id: str) -> None:
    """The conversation's row in Chainlit's tables, as a chat session creates it."""
    pool = runner.threads.pool  # type: ignore[attr-defined]
    async with pool.connection() as conn:
        await conn.execute('INSERT INTO "Thread" (id, name) VALUES (%s, %s)', (thread_id, "t"))


FETCH_LOG_ID = re.compile(r"fetch[_ -]log[_ -]id:\s*(\d+)", re.IGNORECASE)


async def test_a_research_run_killed_while_a_subagent_works_is_resumed_without_redoing_done_topics(
    database_url,
):
    runner, close = await make_runner(database_url, worker="survivor", agent="research")
    thread_id = "durable-research-1"
    pool = runner.threads.pool  # type: ignore[attr-defined]
    fetch_log = PostgresFetchLog(pool)
    await claim_thread(pool, thread_id=thread_id, user_id="alice", agent="research")
    await chainlit_thread(runner, thread_id)
    paused = await runner.message(
        HeadlessSurface(),
        user_id="alice",
        thread_id=thread_id,
        profile="Research",
        text=RESEARCH_QUESTION,
        message_id="m1",
        temporary=False,
    )
    assert paused.status == "paused"
    [review] = paused.interrupts
    topics = review.value["todos"]
    assert len(topics) == 2

    async def second_topic_fetching() -> bool:
        # One subagent at a time: a fetch past the first topic's means the first is done.
        return len(await fetch_log.for_thread(thread_id)) > FETCHES_PER_TOPIC

    worker = spawn_doomed(database_url, thread_id, review.id, "research")
    await kill_when(worker, second_topic_fetching)
    killed_at = time.monotonic()
    before = await fetch_log.for_thread(thread_id)
    first_topic_ids = {r.id for r in before[:FETCHES_PER_TOPIC]}

    resumed = resumed_count("research")
    outcome = await recover(runner, killed_at)
    recovered_in = time.monotonic() - killed_at
    assert resumed_count("research") == resumed + 1, "counted for /metrics"

    assert outcome.status == "done", outcome
    assert outcome.reply, "the report was delivered"
    after = await fetch_log.for_thread(thread_id)
    assert [r.id for r in after[: len(before)]] == [r.id for r in before]
    # Only the topic in flight ran again: at most its fetches are new, none of the finished one's.
    assert len(after) - len(before) <= FETCHES_PER_TOPIC, [r.url for r in after]
    state = await runner.graphs["research"].aget_state({"configurable": {"thread_id": thread_id}})
    files = state.values.get("files") or {}
    notes = {p: file_text(state.values, p) for p in files if p.startswith("/notes/")}
    assert len(notes) == len(topics), sorted(files)
    first_notes = next(text for path, text in notes.items() if slug(topics[0]) in path)
    cited = {int(i) for i in FETCH_LOG_ID.findall(first_notes)}
    assert cited, first_notes
    assert cited <= first_topic_ids, (
        "the finished topic's notes are the ones written before the kill"
    )
    for text in notes.values():
        assert text.count("## ") == len(set(re.findall(r"^## .*$", text, re.M))), "no duplicate"
    report = str(state.values.get("report") or "")
    assert report
    assert await stored_replies(runner, thread_id) == [outcome.reply], "in the conversation"
    assert await runner.stranded() == []
    print(f"research run recovered in {recovered_in:.1f} s after the kill")
    await close()


async def test_an_assistant_turn_killed_mid_reply_is_answered_once_by_a_live_worker(database_url):
    runner, close = await make_runner(database_url, worker="survivor", agent="assistant")
    thread_id = "durable-assistant-1"
    pool = runner.threads.pool  # type: ignore[attr-defined]
    await claim_thread(pool, thread_id=thread_id, user_id="alice", agent="assistant")
    await chainlit_thread(runner, thread_id)
    graph = runner.graphs["assistant"]
    config = {"configurable": {"thread_id": thread_id}}

    async def waiting_for_the_model() -> bool:
        # Recall is checkpointed; the (slow) model is working on the reply.
        return (await graph.aget_state(config)).next == ("assistant",)

    worker = spawn_doomed(database_url, thread_id, "-", "assistant")
    await kill_when(worker, waiting_for_the_model)
    killed_at = time.monotonic()

    resumed = resumed_count("assistant")
    outcome = await recover(runner, killed_at)
    recovered_in = time.monotonic() - killed_at
    assert resumed_count("assistant") == resumed + 1, "counted for /metrics"

    assert outcome.status == "done", outcome
    assert outcome.reply
    messages = (await graph.aget_state(config)).values["messages"]
    assert [m.type for m in messages] == ["human", "ai"], "the message once, one reply"
    assert messages[0].text == ASSISTANT_MESSAGE
    assert messages[1].text == outcome.reply
    assert await stored_replies(runner, thread_id) == [outcome.reply], "in the conversation"
    assert await runner.stranded() == []
    print(f"assistant turn recovered in {recovered_in:.1f} s after the kill")
    await close()


async def test_a_run_the_user_stopped_is_not_resumed_by_another_worker(database_url):
    """Chainlit's Stop cancels the chat's task mid-run. Only a worker that dies leaves its run
    for a live one; a stopped run is over, so its record goes with it (it stayed, beaten by its
    worker, and the next worker to start after that one ended ran the stopped turn to the end)."""
    stopping, close_stopping = await make_runner(
        database_url, worker="stopping", slow_s=1.0, agent="assistant"
    )
    live, close_live = await make_runner(database_url, worker="live", agent="assistant")
    thread_id = "stopped-assistant-1"
    pool = stopping.threads.pool  # type: ignore[attr-defined]
    await claim_thread(pool, thread_id=thread_id, user_id="alice", agent="assistant")
    graph = stopping.graphs["assistant"]
    config = {"configurable": {"thread_id": thread_id}}
    turn = asyncio.create_task(
        stopping.message(
            HeadlessSurface(),
            user_id="alice",
            thread_id=thread_id,
            profile=None,
            text=ASSISTANT_MESSAGE,
            message_id="m-stopped",
            temporary=False,
        )
    )
    async with asyncio.timeout(30):
        while (await graph.aget_state(config)).next != ("assistant",):
            await asyncio.sleep(0.05)
    turn.cancel()  # the user pressed Stop
    with pytest.raises(asyncio.CancelledError):
        await turn

    await asyncio.sleep(1.5)  # longer than stale_s: a left record would look stranded now
    assert await live.stranded() == []
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM cairn_runs WHERE thread_id = %s", (thread_id,)
        )
        assert (await cur.fetchone())["n"] == 0
    # The thread is free again: the user's next message is answered.
    outcome = await live.message(
        HeadlessSurface(),
        user_id="alice",
        thread_id=thread_id,
        profile=None,
        text="And for two people?",
        message_id="m-next",
        temporary=False,
    )
    assert outcome.status == "done"
    await close_stopping()
    await close_live()


async def run_row(pool: Any, thread_id: str) -> dict[str, Any] | None:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT worker_id, status, attempts FROM cairn_runs WHERE thread_id = %s", (thread_id,)
        )
        return await cur.fetchone()


async def test_a_live_workers_run_taken_by_mistake_stays_its_and_is_resumed_once_it_dies(
    database_url,
):
    """A worker whose beats stopped for a while (Postgres away longer than STALE_S) is alive:
    another's sweep takes its run, finds it busy (the run lock), and must leave the lease to
    the worker running it; once that one dies, the run is found and resumed."""
    runner, close = await make_runner(database_url, worker="survivor")
    assert runner.journal is not None
    beats = asyncio.create_task(heartbeat_forever(runner.journal, every_s=0.2))
    thread_id = "durable-planner-lease"
    pool = runner.threads.pool  # type: ignore[attr-defined]
    paused = await send_goal(runner, thread_id)
    [review] = paused.interrupts
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.stranded_worker",
            database_url,
            thread_id,
            review.id,
            "planner",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CAIRN_TEST_BEAT_S": "0.2"},
    )
    try:

        async def running_there() -> bool:
            row = await run_row(pool, thread_id)
            return row is not None and row["worker_id"] == "doomed"

        deadline = time.monotonic() + 60
        while not await running_there():
            assert worker.poll() is None, "the worker ended before the test could stop it"
            assert time.monotonic() < deadline, "the worker never started its run"
            await asyncio.sleep(0.05)
        # Its beats did not reach Postgres for a while: the sweep here takes the run...
        async with pool.connection() as conn:
            await conn.execute(
                "UPDATE cairn_runs SET heartbeat_at = now() - interval '1 hour' "
                "WHERE thread_id = %s",
                (thread_id,),
            )
        [outcome] = await recover_once(runner, chat_of(pool))
        assert outcome.status == "busy", "its worker is alive and holds the run lock"
        # ... and the live worker, beating again, keeps it.
        await asyncio.sleep(1.0)
        row = await run_row(pool, thread_id)
        assert row is not None
        assert row["worker_id"] == "doomed", "the lease is the running worker's again"
        assert len(await past_steps(runner, thread_id)) < 3, "still running when killed"
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
    before = await past_steps(runner, thread_id)
    killed_at = time.monotonic()
    outcome = await recover(runner, killed_at)
    assert outcome.status == "done", outcome
    after = await past_steps(runner, thread_id)
    indices = [step_parts(r)[0] for r in after]
    assert indices == list(range(1, len(after) + 1)), "no step index twice, none missing"
    assert after[: len(before)] == before, "completed steps were not run again"
    assert await run_row(pool, thread_id) is None, "finished: no lease left behind"
    beats.cancel()
    await close()


class OutageSurface(HeadlessSurface):
    """Postgres goes away as the run begins (its first read fails)."""

    def view(self, spec: Any, context: Any) -> Any:
        class Broken(HeadlessView):
            async def begin(self, load_state: Any) -> None:
                raise psycopg.OperationalError("the server closed the connection")

        return Broken(spec)


class StillAwayJournal(RunJournal):
    """... and is still away when the run ends: its row cannot be cleared."""

    async def finished(self, thread_id: str) -> None:
        raise psycopg.OperationalError("the server closed the connection")


async def test_a_run_that_ends_in_an_outage_is_not_beaten_forever_but_left_for_a_sweep(
    database_url,
):
    """The run failed on the outage and its row could not be cleared: this worker no longer
    runs it, so it must stop beating it, or no live worker ever resumes it once Postgres is
    back (the row stayed 'running', fresh, for as long as this worker lived)."""
    runner, close = await make_runner(database_url, worker="survivor-2")
    pool = runner.threads.pool  # type: ignore[attr-defined]
    runner.journal = StillAwayJournal(pool, worker="survivor-2")
    thread_id = "durable-planner-outage"
    outcome = await send_goal(runner, thread_id, OutageSurface())
    assert outcome.status == "unavailable"
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_runs SET heartbeat_at = now() - interval '1 hour' WHERE thread_id = %s",
            (thread_id,),
        )
    await runner.journal.beat()
    taken = await runner.stranded()
    assert [r.thread_id for r in taken] == [thread_id], "left for a sweep, not beaten"
    await RunJournal(pool).forget(thread_id)
    await close()


async def test_a_run_whose_lock_is_cut_off_and_taken_elsewhere_stops_and_leaves_its_row(
    database_url,
):
    """The run lock's session ended under a live run (a Postgres restart, or an operator's
    pg_terminate_backend) and another worker took the thread's lock first: the run here stops
    before it writes its reply, says so, and leaves the journal row to the other worker."""
    runner, close = await make_runner(
        database_url, worker="cut-off", slow_s=SLOW_CALL_S, agent="assistant"
    )
    pool = runner.threads.pool  # type: ignore[attr-defined]
    thread_id = "durable-assistant-cut-off"
    await claim_thread(pool, thread_id=thread_id, user_id="alice", agent="assistant")
    graph = runner.graphs["assistant"]
    config = {"configurable": {"thread_id": thread_id}}
    surface = HeadlessSurface()
    turn = asyncio.create_task(
        runner.message(
            surface,
            user_id="alice",
            thread_id=thread_id,
            profile="Assistant",
            text=ASSISTANT_MESSAGE,
            message_id="m-cut",
            temporary=False,
        )
    )
    deadline = time.monotonic() + 30
    while (await graph.aget_state(config)).next != ("assistant",):
        assert time.monotonic() < deadline, "the model never started"
        await asyncio.sleep(0.05)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND granted AND ((classid::bigint << 32) | objid::bigint) "
            "= hashtextextended(%s, 0)",
            (f"cairn-run:{thread_id}",),
        )
        assert len(await cur.fetchall()) == 1, "the run's lock session was found"
    other = ThreadRunLocks(pool)
    try:
        async with other.hold(thread_id):  # another worker's run of the thread
            outcome = await asyncio.wait_for(turn, timeout=10)
            assert outcome.status == "busy", outcome
            assert surface.errors, "the user is told where the reply went"
            await asyncio.sleep(SLOW_CALL_S + 0.5)  # the model call would have ended by now
            messages = (await graph.aget_state(config)).values["messages"]
            assert [m.type for m in messages] == ["human"], "no reply beside the other run"
            row = await run_row(pool, thread_id)
            assert row is not None, "the row is left for the worker that runs the thread now"
    finally:
        if not turn.done():
            turn.cancel()
        await asyncio.gather(turn, return_exceptions=True)
        await other.close()
        await RunJournal(pool).forget(thread_id)
        await close()


async def strand(runner: Runner, thread_id: str) -> None:
    """An Assistant run left as a killed worker leaves it: its message checkpointed, the model
    at work, its journal row in place with a heartbeat nobody renews."""
    pool = runner.threads.pool  # type: ignore[attr-defined]
    await claim_thread(pool, thread_id=thread_id, user_id="alice", agent="assistant")
    graph = runner.graphs["assistant"]
    turn = asyncio.create_task(
        runner.message(
            HeadlessSurface(),
            user_id="alice",
            thread_id=thread_id,
            profile="Assistant",
            text=ASSISTANT_MESSAGE,
            message_id=f"m-{thread_id}",
            temporary=False,
        )
    )
    config = {"configurable": {"thread_id": thread_id}}
    while (await graph.aget_state(config)).next != ("assistant",):
        assert not turn.done(), turn
        await asyncio.sleep(0.02)
    turn.cancel()  # as a kill would stop it; but a cancel is the user's Stop, which forgets
    await asyncio.gather(turn, return_exceptions=True)
    journal = runner.journal
    assert journal is not None
    # ... so the row a killed worker leaves is put back, with a heartbeat nobody renews.
    await journal.started(thread_id=thread_id, user_id="alice", agent="assistant")
    journal.released(thread_id)
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_runs SET heartbeat_at = now() - interval '1 hour' WHERE thread_id = %s",
            (thread_id,),
        )


async def test_a_long_resumed_run_does_not_hold_up_the_next_sweep(database_url):
    """A worker resuming a dead worker's long run (a Research run takes minutes) still sweeps:
    a run stranded meanwhile is taken and resumed at once, not after the long one ends."""
    runner, close = await make_runner(database_url, worker="sweeper", slow_s=3.0, agent="assistant")
    pool = runner.threads.pool  # type: ignore[attr-defined]
    sweeps = None
    try:
        await strand(runner, "durable-sweep-long")
        sweeps = asyncio.create_task(recover_forever(runner, chat_of(pool), every_s=0.2))
        deadline = time.monotonic() + 10
        while (row := await run_row(pool, "durable-sweep-long")) and row["attempts"] == 0:
            assert time.monotonic() < deadline, "the first run was never taken"
            await asyncio.sleep(0.05)
        await strand(runner, "durable-sweep-next")
        while (row := await run_row(pool, "durable-sweep-next")) and row["attempts"] == 0:
            assert await run_row(pool, "durable-sweep-long") is not None, (
                "the second run waited for the first to finish"
            )
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 30
        for thread_id in ("durable-sweep-long", "durable-sweep-next"):
            while await run_row(pool, thread_id) is not None:
                assert time.monotonic() < deadline, f"{thread_id} was never finished"
                await asyncio.sleep(0.1)
            messages = (
                await runner.graphs["assistant"].aget_state(
                    {"configurable": {"thread_id": thread_id}}
                )
            ).values["messages"]
            assert [m.type for m in messages] == ["human", "ai"], "answered once"
    finally:
        if sweeps is not None:
            sweeps.cancel()
            await asyncio.gather(sweeps, return_exceptions=True)
        await close()


async def test_a_sweep_leaves_a_run_its_worker_has_just_taken_up(database_url):
    """A worker that has just taken up an answered question holds the run lock and has written
    its row, but not yet its first checkpoint: the state still shows the question. A sweep
    reading that state without the lock took the run for one waiting on the user and dropped
    the row, so the run was lost if that worker then died."""
    runner, close = await make_runner(database_url, worker="sweeper")
    pool = runner.threads.pool  # type: ignore[attr-defined]
    thread_id = "durable-planner-just-taken"
    paused = await send_goal(runner, thread_id)
    assert paused.status == "paused"
    other_worker = RunJournal(pool, worker="answering")
    other_locks = ThreadRunLocks(pool)
    try:
        async with other_locks.hold(thread_id):  # the answering worker, before its checkpoint
            await other_worker.started(thread_id=thread_id, user_id="alice", agent="planner")
            stranded = StrandedRun(
                thread_id=thread_id, user_id="alice", agent="planner", attempts=1
            )
            outcome = await runner.resume_stranded(stranded, HeadlessSurface())
            assert outcome.status == "busy", outcome
            row = await run_row(pool, thread_id)
            assert row is not None, "the row stays with the worker running the thread"
        # Once nobody holds the lock, the question is the user's to answer: the row goes.
        outcome = await runner.resume_stranded(stranded, HeadlessSurface())
        assert outcome.status == "paused"
        assert await run_row(pool, thread_id) is None
    finally:
        await other_locks.close()
        await RunJournal(pool).forget(thread_id)
        await close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def ask_over_mcp(port: int, secret: str, text: str) -> Any:
    """An MCP client calling ask_assistant on the doomed worker (its answer never comes)."""
    headers = {"Authorization": f"Bearer {secret}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(120)) as http,
        streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (r, w, _),
        ClientSession(r, w) as session,
    ):
        await session.initialize()
        return await session.call_tool("ask_assistant", {"message": text})


async def open_calls(pool: Any, token_id: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id, thread_id, worker_id FROM cairn_token_calls "
            "WHERE token_id = %s AND finished_at IS NULL",
            (token_id,),
        )
        return list(await cur.fetchall())


async def test_an_mcp_call_killed_with_its_worker_stops_counting_once_its_run_is_taken_over(
    database_url,
):
    """A token allowing one run at a time: its call's worker is killed mid-reply, a live worker
    resumes the run and answers it, and the token may start a run again at once (the dead call
    stayed 'running' and refused every new one for an hour)."""
    runner, close = await make_runner(database_url, worker="survivor-mcp", agent="assistant")
    pool = runner.threads.pool  # type: ignore[attr-defined]
    tokens = AccessTokens(pool, scopes=("assistant",))
    one_at_a_time = TokenLimits(max_concurrent=1, max_runs_per_hour=10, max_model_calls=10)
    made = await tokens.create(
        "alice", name="t", scopes=frozenset({"assistant"}), days=1, limits=one_at_a_time
    )
    async with pool.connection() as conn:  # her chat account: MCP calls show in her sidebar
        await conn.execute(
            'INSERT INTO "User" (identifier) VALUES (%s) ON CONFLICT DO NOTHING', ("alice",)
        )
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.mcp_worker", database_url, str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    caller: asyncio.Task[Any] | None = None
    graph = runner.graphs["assistant"]

    async def mid_reply() -> bool:
        nonlocal caller
        if caller is None:  # once the worker serves: the call's run starts
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient() as http:
                    await http.get(f"http://127.0.0.1:{port}/mcp")
                caller = asyncio.create_task(ask_over_mcp(port, made.secret, ASSISTANT_MESSAGE))
            return False
        calls = await open_calls(pool, made.info.id)
        if not calls:
            return False
        config = {"configurable": {"thread_id": calls[0]["thread_id"]}}
        return (await graph.aget_state(config)).next == ("assistant",)

    try:
        await kill_when(worker, mid_reply)
    finally:
        if caller is not None:
            caller.cancel()
            with contextlib.suppress(BaseException):
                await caller
    killed_at = time.monotonic()
    [dead_call] = await open_calls(pool, made.info.id)
    assert dead_call["worker_id"] == "doomed-mcp", "the call names the worker running it"
    with pytest.raises(LimitExceeded, match="1 at once"):  # its worker may still be alive
        await tokens.begin_call(made.info, "ask_assistant", None, worker="survivor-mcp")

    outcome = await recover(runner, killed_at)
    assert outcome.status == "done", outcome
    assert outcome.reply
    assert await stored_replies(runner, dead_call["thread_id"]) == [outcome.reply]

    assert await open_calls(pool, made.info.id) == [], "closed with its worker's lease"
    logged = await tokens.calls(made.info.id, "alice")
    assert [(c["status"], c["detail"]) for c in logged] == [
        ("refused", logged[0]["detail"]),
        ("interrupted", CALL_LAPSED),
    ]
    call_id = await tokens.begin_call(made.info, "ask_assistant", None, worker="survivor-mcp")
    await tokens.finish_call(call_id, status="done", thread_id=None, model_calls=0)
    await close()


def chat_of(pool: Any) -> ChainlitChat:
    """The chat port a worker's recovery writes through (the Chainlit adapter's)."""
    return ChainlitChat(pool, discover(AGENTS))
