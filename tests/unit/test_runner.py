"""The turn runner without a browser: a scripted model, an in-memory saver, a recording surface."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph
from langgraph.store.memory import InMemoryStore
from langgraph.types import interrupt
from psycopg_pool import PoolTimeout

from auth.ownership import NOT_FOUND, OwnedThread, ThreadNotFound
from graphs.assistant.graph import build_graph as build_assistant
from graphs.core.runlock import ThreadBusy
from tests.fakes import ScriptedChatModel
from ui.runner import (
    ANSWERED,
    DATABASE_DOWN,
    MALFORMED_ANSWER,
    MODEL_FAILED,
    AgentSpec,
    AnswerRejected,
    InterruptKind,
    Runner,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ui.runner import LoadState, Status


@dataclass
class RecordingView:
    """Everything the runner told the view, in order."""

    events: list[tuple[str, Any]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)

    async def begin(self, load_state: LoadState) -> None:
        self.events.append(("begin", None))

    async def token(self, namespace: tuple[str, ...], token: Any, meta: dict[str, Any]) -> None:
        if meta.get("langgraph_node") == "assistant" and isinstance(token.content, str):
            self.tokens.append(token.content)

    async def update(self, namespace: tuple[str, ...], node: str, delta: Any) -> None:
        self.events.append(("update", node))

    async def task(self, namespace: tuple[str, ...], event: dict[str, Any]) -> None:
        if "result" not in event:
            self.events.append(("task", event["name"]))

    async def end(self, status: Status, load_state: LoadState) -> str | None:
        self.events.append(("end", status))
        return "".join(self.tokens) or None


@dataclass
class RecordingSurface:
    views: list[RecordingView] = field(default_factory=list)
    said: list[tuple[str, str]] = field(default_factory=list)
    questions: list[tuple[str, str]] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    retry_for: list[str | None] = field(default_factory=list)
    """The message each Retry would send again (None: resume from the checkpoint)."""

    def view(self, spec: AgentSpec, context: Any) -> RecordingView:
        self.views.append(RecordingView())
        return self.views[-1]

    async def notice(self, text: str) -> None:
        self.said.append(("notice", text))

    async def refuse(self, text: str) -> None:
        self.said.append(("refuse", text))

    async def failed(self, text: str, *, thread_id: str, message_id: str | None = None) -> None:
        self.said.append(("failed", text))
        self.retry_for.append(message_id)

    async def show_interrupt(self, kind: InterruptKind | None, item: Any, thread_id: str) -> None:
        self.questions.append((kind.name if kind else "?", item.id))

    async def clear_prompt(self, interrupt_id: str) -> None:
        self.cleared.append(interrupt_id)

    async def restore(self, spec: AgentSpec, state: Any) -> None:
        self.restored.append(spec.key)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        yield


class MemoryThreads:
    """Ownership as auth/ownership.py keeps it, in a dict."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, str, bool]] = {}

    async def claim(
        self, *, thread_id: str, user_id: str, agent: str, temporary: bool, workspace: Any = None
    ):
        owner, kept, temp = self.rows.setdefault(thread_id, (user_id, agent, temporary))
        if owner != user_id:
            raise ThreadNotFound
        return OwnedThread(agent=kept, temporary=temp or temporary)

    async def require(self, *, thread_id: str, user_id: str):
        row = self.rows.get(thread_id)
        if row is None or row[0] != user_id:
            raise ThreadNotFound
        return OwnedThread(agent=row[1], temporary=row[2])


class MemoryLocks:
    def __init__(self) -> None:
        self.held: set[str] = set()

    @asynccontextmanager
    async def hold(self, thread_id: str) -> AsyncIterator[None]:
        if thread_id in self.held:
            raise ThreadBusy
        self.held.add(thread_id)
        try:
            yield
        finally:
            self.held.discard(thread_id)

    def lost(self, thread_id: str) -> bool:
        return False


class AskState(TypedDict, total=False):
    answer: Any


def build_asking(*, checkpointer: Any, store: Any = None, model: Any = None) -> Any:
    """A graph that pauses on one question and records the answer it was resumed with."""

    def ask(state: AskState) -> dict[str, Any]:
        return {"answer": interrupt({"kind": "confirm_memory", "content": "I have asthma"})}

    builder = StateGraph(AskState)
    builder.add_node(ask)
    builder.add_edge("__start__", "ask")
    return builder.compile(checkpointer=checkpointer, name="asking")


def assistant_spec(**overrides: Any) -> AgentSpec:
    fields: dict[str, Any] = {
        "key": "assistant",
        "profile": "Assistant",
        "description": "",
        "build": build_assistant,
        "inputs": lambda text, mid: {"messages": [HumanMessage(text, id=mid)]},
        "stream_modes": ("messages", "tasks"),
    }
    return AgentSpec(**{**fields, **overrides})


def asking_spec() -> AgentSpec:
    async def edit_or_not(decision: str, value: dict[str, Any], ask: Any) -> Any:
        if decision == "edit":
            text = await ask("What instead?", 5)
            if not text:
                msg = "No edit arrived."
                raise AnswerRejected(msg)
            return {"decision": "edit", "text": text}
        return {"decision": decision}

    return AgentSpec(
        key="asking",
        profile="Asking",
        description="",
        build=build_asking,
        inputs=lambda text, mid: {},
        interrupts=(
            InterruptKind(
                name="confirm_memory",
                decisions=frozenset({"confirm", "reject", "edit"}),
                resume_value=edit_or_not,
            ),
        ),
    )


def make_runner(*specs: AgentSpec, model: Any = None, services: Any = None) -> Runner:
    saver = InMemorySaver()
    graphs = {s.key: s.build(checkpointer=saver, store=InMemoryStore(), model=model) for s in specs}
    return Runner(
        agents=specs, graphs=graphs, threads=MemoryThreads(), locks=MemoryLocks(), services=services
    )


async def send(runner: Runner, surface: RecordingSurface, text: str, **kw: Any):
    args = {
        "user_id": "alice",
        "thread_id": "t1",
        "profile": None,
        "text": text,
        "message_id": "m1",
        "temporary": False,
        **kw,
    }
    return await runner.message(surface, **args)


async def test_a_message_streams_through_the_view_and_checkpoints_every_step():
    model = ScriptedChatModel(["Hello Alice"])
    runner = make_runner(assistant_spec(), model=model)
    surface = RecordingSurface()

    outcome = await send(runner, surface, "hi")

    assert outcome.status == "done"
    assert outcome.reply == "Hello Alice"
    [view] = surface.views
    assert view.events[0] == ("begin", None)
    assert ("task", "recall_memories") in view.events
    assert ("task", "assistant") in view.events
    assert view.events[-1] == ("end", "done")
    assert surface.said == []
    # Async durability: a checkpoint per super-step, not one at the end of the run.
    graph = runner.graphs["assistant"]
    history = [c async for c in graph.aget_state_history({"configurable": {"thread_id": "t1"}})]
    assert len(history) >= 4  # input, recall, assistant, and the initial empty one


async def test_a_foreign_thread_is_refused_before_the_graph_runs():
    model = ScriptedChatModel(["for alice", "for mallory"])
    runner = make_runner(assistant_spec(), model=model)
    await send(runner, RecordingSurface(), "hi")
    seen = len(model.seen)
    surface = RecordingSurface()

    outcome = await send(runner, surface, "what did alice say?", user_id="mallory")

    assert outcome.status == "not_found"
    assert surface.said == [("refuse", NOT_FOUND)]
    assert surface.views == []
    assert len(model.seen) == seen
    assert (await runner.retry(surface, user_id="mallory", thread_id="t1")).status == "not_found"


async def test_a_second_run_on_a_busy_thread_is_refused():
    runner = make_runner(assistant_spec(), model=ScriptedChatModel(["one"]))
    locks = runner.locks
    assert isinstance(locks, MemoryLocks)
    locks.held.add("t1")
    surface = RecordingSurface()

    outcome = await send(runner, surface, "hi")

    assert outcome.status == "busy"
    assert surface.said == [("refuse", str(ThreadBusy()))]


async def test_a_failing_model_offers_retry_and_retry_resumes_from_the_checkpoint():
    model = ScriptedChatModel([])  # runs out at once: the model "fails"
    runner = make_runner(assistant_spec(), model=model)
    surface = RecordingSurface()

    failed = await send(runner, surface, "hi")

    assert failed.status == "failed"
    assert surface.said == [("failed", MODEL_FAILED)]
    assert surface.views[0].events[-1] == ("end", "failed")
    model.messages = iter(["Back again"])
    retried = await runner.retry(surface, user_id="alice", thread_id="t1")
    assert retried.status == "done"
    state = await runner.graphs["assistant"].aget_state({"configurable": {"thread_id": "t1"}})
    humans = [m for m in state.values["messages"] if m.type == "human"]
    assert len(humans) == 1  # the retry did not add the message twice


class AwayThreads(MemoryThreads):
    """Ownership whose database is away until `back` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.back = False

    async def claim(self, **kw: Any):
        if not self.back:
            raise PoolTimeout("couldn't get a connection after 10.00 sec")
        return await super().claim(**kw)


async def test_a_message_sent_while_postgres_is_away_fails_with_retry_of_that_message():
    model = ScriptedChatModel(["Here now"])
    runner = make_runner(assistant_spec(), model=model)
    runner.threads = threads = AwayThreads()
    surface = RecordingSurface()

    outcome = await send(runner, surface, "hi", message_id="m-away")

    assert outcome.status == "unavailable"  # not "busy": nothing is running
    assert surface.said == [("failed", DATABASE_DOWN)]
    assert surface.retry_for == ["m-away"]
    threads.back = True
    retried = await runner.resend(
        surface,
        user_id="alice",
        thread_id="t1",
        profile=None,
        text="hi",
        message_id="m-away",
        temporary=False,
    )
    assert retried.status == "done"
    assert retried.reply == "Here now"
    state = await runner.graphs["assistant"].aget_state({"configurable": {"thread_id": "t1"}})
    assert [m.id for m in state.values["messages"] if m.type == "human"] == ["m-away"]


class LostLocks(MemoryLocks):
    @asynccontextmanager
    async def hold(self, thread_id: str) -> AsyncIterator[None]:
        raise psycopg.OperationalError("server closed the connection unexpectedly")
        yield


async def test_a_lost_database_connection_is_not_reported_as_a_busy_thread():
    runner = make_runner(assistant_spec(), model=ScriptedChatModel(["one"]))
    runner.locks = LostLocks()
    surface = RecordingSurface()

    outcome = await send(runner, surface, "hi")

    assert outcome.status == "unavailable"
    assert surface.said == [("failed", DATABASE_DOWN)]
    assert str(ThreadBusy()) not in str(surface.said)


async def test_the_recursion_limit_is_a_notice_not_a_crash():
    from langchain_core.messages import AIMessage
    from langchain_core.messages.tool import tool_call

    loop = [
        AIMessage("", tool_calls=[tool_call(name="forget", args={"query": "x"}, id=f"c{i}")])
        for i in range(10)
    ]
    spec = assistant_spec(recursion_limit=lambda: 3, recursion_notice="went round")
    runner = make_runner(spec, model=ScriptedChatModel(loop))
    surface = RecordingSurface()

    outcome = await send(runner, surface, "forget x")

    assert outcome.status == "stopped"
    assert surface.said == [("notice", "went round")]


async def test_a_pause_comes_from_the_stream_and_only_its_own_answers_resume_it():
    runner = make_runner(asking_spec())
    surface = RecordingSurface()

    paused = await send(runner, surface, "go", profile="Asking")

    assert paused.status == "paused"
    [pending] = paused.interrupts
    assert surface.questions == [("confirm_memory", pending.id)]
    answer = {"user_id": "alice", "thread_id": "t1", "interrupt_id": pending.id}

    bad = await runner.answer(surface, decision="run-anything", **answer)
    assert bad.status == "refused"
    assert surface.said[-1] == ("refuse", MALFORMED_ANSWER)

    foreign = await runner.answer(surface, decision="confirm", **{**answer, "user_id": "bob"})
    assert foreign.status == "not_found"

    unknown = await runner.answer(surface, decision="confirm", **{**answer, "interrupt_id": "x"})
    assert unknown.status == "refused"
    assert surface.said[-1] == ("refuse", ANSWERED)

    done = await runner.answer(surface, decision="confirm", **answer)
    assert done.status == "done"
    assert surface.cleared == [pending.id]
    state = await runner.graphs["asking"].aget_state({"configurable": {"thread_id": "t1"}})
    assert state.values["answer"] == {"decision": "confirm"}

    again = await runner.answer(surface, decision="reject", **answer)
    assert again.status == "refused"
    assert surface.said[-1] == ("refuse", ANSWERED)


async def test_an_edit_that_never_arrives_keeps_the_question_pending():
    runner = make_runner(asking_spec())
    surface = RecordingSurface()
    paused = await send(runner, surface, "go", profile="Asking")
    [pending] = paused.interrupts

    async def no_reply(question: str, seconds: int) -> str | None:
        return None

    outcome = await runner.answer(
        surface,
        user_id="alice",
        thread_id="t1",
        interrupt_id=pending.id,
        decision="edit",
        ask=no_reply,
    )

    assert outcome.status == "paused"
    assert surface.said[-1] == ("refuse", "No edit arrived.")
    assert [i.id for i in await runner.pending(user_id="alice", thread_id="t1")] == [pending.id]
    # The buttons went while the edit was asked for, and came back when none arrived.
    assert surface.cleared == [pending.id]
    assert surface.questions == [("confirm_memory", pending.id)] * 2


async def test_while_an_edit_is_typed_the_questions_buttons_are_off() -> None:
    runner = make_runner(asking_spec())
    surface = RecordingSurface()
    paused = await send(runner, surface, "go", profile="Asking")
    [pending] = paused.interrupts
    seen: list[list[str]] = []

    async def reply(question: str, seconds: int) -> str | None:
        seen.append(list(surface.cleared))
        return "something else"

    outcome = await runner.answer(
        surface,
        user_id="alice",
        thread_id="t1",
        interrupt_id=pending.id,
        decision="edit",
        ask=reply,
    )

    assert outcome.status == "done"
    assert seen == [[pending.id]]  # off before the question was asked


async def test_a_thread_keeps_its_agent_whatever_profile_the_client_reports():
    model = ScriptedChatModel(["hi"])
    runner = make_runner(asking_spec(), assistant_spec(), model=model)
    surface = RecordingSurface()
    await send(runner, surface, "go", profile="Asking")

    outcome = await send(runner, surface, "hi", profile="Assistant")

    assert outcome.owned is not None
    assert outcome.owned.agent == "asking"
    assert model.seen == []  # the Assistant never ran on the Asking thread


async def test_the_after_turn_hook_runs_off_the_reply_path_with_the_services():
    seen: list[tuple[Any, str]] = []

    async def hook(services: Any, context: Any) -> None:
        seen.append((services, context.thread_id))

    services = object()
    runner = make_runner(
        assistant_spec(after_turn=hook), model=ScriptedChatModel(["hi"]), services=services
    )
    await send(runner, RecordingSurface(), "hi")
    await runner.drain()

    assert seen == [(services, "t1")]


@dataclass
class RecordingJobs:
    arrived: list[tuple[str, str]] = field(default_factory=list)

    async def message_arrived(self, *, user_id: str, thread_id: str) -> None:
        self.arrived.append((user_id, thread_id))


async def test_a_memory_job_is_scheduled_for_the_agents_that_declare_it_only():
    jobs = RecordingJobs()
    services = type("Services", (), {"memory_jobs": jobs})()
    notes = assistant_spec(key="notes", profile="Notes", memory_jobs=True)
    runner = make_runner(
        assistant_spec(), notes, model=ScriptedChatModel(["hi"] * 3), services=services
    )
    await send(runner, RecordingSurface(), "hi", profile="Assistant", thread_id="plain")
    await send(runner, RecordingSurface(), "hi", profile="Notes", thread_id="learning")
    await send(
        runner, RecordingSurface(), "hi", profile="Notes", thread_id="kept-out", temporary=True
    )
    await runner.drain()

    assert jobs.arrived == [("alice", "learning")]


async def test_reopening_shows_a_pending_question_again_for_its_owner_only():
    runner = make_runner(asking_spec())
    await send(runner, RecordingSurface(), "go", profile="Asking")
    surface = RecordingSurface()

    reopened = await runner.reopen(surface, user_id="alice", thread_id="t1")

    assert reopened.status == "paused"
    assert [q[0] for q in surface.questions] == ["confirm_memory"]
    with pytest.raises(ThreadNotFound):
        await runner.pending(user_id="bob", thread_id="t1")


class RefusingSaver(InMemorySaver):
    """A saver whose user's data was wiped after the run began (graphs.core.fence): the first
    checkpoint is kept, every later write is refused, as CairnSaver does in Postgres."""

    def __init__(self) -> None:
        super().__init__()
        self.authorities: list[Any] = []
        self.wiped = True
        self.kept = 0

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        from graphs.core import fence

        self.authorities.append(fence.current())
        if self.wiped and self.kept:
            raise fence.WriteRefused(fence.SESSION_ENDED)
        self.kept += 1
        return await super().aput(config, checkpoint, metadata, new_versions)


async def test_a_run_whose_writes_are_refused_stops_with_the_session_notice_and_no_after_turn():
    from graphs.core import fence

    seen: list[str] = []

    async def hook(services: Any, context: Any) -> None:
        seen.append(context.thread_id)

    spec = assistant_spec(after_turn=hook)
    saver = RefusingSaver()
    runner = Runner(
        agents=[spec],
        graphs={"assistant": spec.build(checkpointer=saver, store=InMemoryStore(),
                                        model=ScriptedChatModel(["hi", "again"]))},
        threads=MemoryThreads(),
        locks=MemoryLocks(),
    )  # fmt: skip
    surface = RecordingSurface()
    session = fence.Fence("alice", 1000.0)

    with fence.acting_for(session):
        outcome = await send(runner, surface, "hi")
    await runner.drain()

    assert outcome.status == "refused"  # not "stopped", as a run at the step limit is
    assert surface.said == [("refuse", fence.SESSION_ENDED)]
    assert seen == []
    # Every write carried the session's authority.
    assert saver.authorities
    assert all(a == session for a in saver.authorities)


async def test_a_run_outside_any_session_writes_under_an_authority_of_its_own():
    """A run the server resumes has no session: it is authorised from when it starts."""
    import time

    from graphs.core import fence

    spec = assistant_spec()
    saver = RefusingSaver()
    saver.wiped = False
    runner = Runner(
        agents=[spec],
        graphs={"assistant": spec.build(checkpointer=saver, store=InMemoryStore(),
                                        model=ScriptedChatModel(["hi"]))},
        threads=MemoryThreads(),
        locks=MemoryLocks(),
    )  # fmt: skip
    started = time.time()
    outcome = await send(runner, RecordingSurface(), "hi")

    assert outcome.status == "done"
    [own] = set(saver.authorities)
    assert isinstance(own, fence.Fence)
    assert own.user_id == "alice"
    assert own.since >= started
    assert fence.current() is None  # nothing leaks out of the run


async def test_the_run_lock_reports_a_missing_connection_as_an_outage_not_busy():
    from graphs.core.errors import DatabaseUnavailable, is_database_outage
    from graphs.core.runlock import ThreadRunLocks

    class NoConnections:
        @asynccontextmanager
        async def connection(self, timeout: float | None = None) -> AsyncIterator[Any]:
            raise PoolTimeout("couldn't get a connection after 10.00 sec")
            yield

        async def getconn(self, timeout: float | None = None) -> Any:
            raise PoolTimeout("couldn't get a connection after 10.00 sec")

    locks = ThreadRunLocks(pool=None)  # type: ignore[arg-type]
    locks._lock_pool = NoConnections()  # type: ignore[assignment]
    with pytest.raises(DatabaseUnavailable) as raised:
        async with locks.hold("t1"):
            pass
    assert is_database_outage(raised.value)
    assert not isinstance(raised.value, ThreadBusy)


class ForgettingJournal:
    """The run journal's side of resuming: which runs were dropped from it."""

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    async def forget(self, thread_id: str) -> None:
        self.forgotten.append(thread_id)

    async def give_up(self, thread_id: str) -> None:
        raise AssertionError("a finished run is not given up")


async def test_a_stranded_run_found_finished_hands_back_its_reply():
    """Its worker died after the graph's last step but before the reply reached anyone."""
    from graphs.core.runs import StrandedRun

    runner = make_runner(assistant_spec(), model=ScriptedChatModel(["Lisbon it is"]))
    assert (await send(runner, RecordingSurface(), "where do I live?")).status == "done"
    journal = ForgettingJournal()
    runner.journal = journal  # type: ignore[assignment]

    outcome = await runner.resume_stranded(
        StrandedRun(thread_id="t1", user_id="alice", agent="assistant", attempts=1),
        RecordingSurface(),
    )

    assert outcome.status == "done"
    assert outcome.reply == "Lisbon it is"
    assert journal.forgotten == ["t1"]
