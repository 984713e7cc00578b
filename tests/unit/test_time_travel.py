"""Time travel through the runner: edit-and-resend forks from the edited message's checkpoint,
a support fork resumes from an edited checkpoint, and neither touches the original history."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph
from langgraph.runtime import Runtime
from langgraph.store.memory import InMemoryStore

from auth.ownership import NOT_FOUND
from graphs.core.context import Context
from graphs.core.timetravel import (
    ForkRefused,
    checkpoint_id,
    fork_update,
    history,
    latest_checkpoint_id,
    snapshot_at,
    state_digest,
    summarise,
    visible,
    writer_node,
)
from tests.fakes import ScriptedChatModel
from tests.unit.test_runner import (
    MemoryLocks,
    MemoryThreads,
    RecordingSurface,
    assistant_spec,
    send,
)
from ui.runner import AgentSpec, Runner

THREAD = {"configurable": {"thread_id": "t1"}}


class MemoryForkPoints:
    """cairn_message_checkpoints in a dict (the head read through the saver)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], str | None] = {}
        self.graph: Any = None

    async def record(self, thread_id: str, message_id: str, checkpoint: str | None) -> None:
        if checkpoint is None:
            checkpoint = await latest_checkpoint_id(self.graph, thread_id)
        self.rows.setdefault((thread_id, message_id), checkpoint)

    async def point(self, thread_id: str, message_id: str) -> tuple[bool, str | None]:
        key = (thread_id, message_id)
        return (key in self.rows, self.rows.get(key))


def runner_for(*specs: AgentSpec, model: Any = None, services: Any = None) -> Runner:
    saver = InMemorySaver()
    graphs = {s.key: s.build(checkpointer=saver, store=InMemoryStore(), model=model) for s in specs}
    points = MemoryForkPoints()
    points.graph = next(iter(graphs.values()))
    return Runner(
        agents=specs,
        graphs=graphs,
        threads=MemoryThreads(),
        locks=MemoryLocks(),
        services=services,
        fork_points=points,
    )


def human_texts(messages: list[Any]) -> list[str]:
    return [m.text for m in messages if isinstance(m, HumanMessage)]


async def three_turns(runner: Runner) -> None:
    for i, text in enumerate(["one", "two", "three"], start=1):
        outcome = await send(runner, RecordingSurface(), text, message_id=f"m{i}")
        assert outcome.status == "done"


async def test_editing_a_message_forks_from_before_it_and_the_model_never_sees_the_old_branch():
    model = ScriptedChatModel(["r1", "r2", "r3", "edited reply"])
    runner = runner_for(assistant_spec(), model=model)
    await three_turns(runner)
    surface, forked = RecordingSurface(), []

    async def on_fork() -> None:
        forked.append(True)

    outcome = await runner.edit(
        surface,
        user_id="alice",
        thread_id="t1",
        message_id="m2",
        text="TWO, edited",
        on_fork=on_fork,
    )

    assert outcome.status == "done"
    assert outcome.reply == "edited reply"
    assert forked == [True]
    assert human_texts(model.seen[-1]) == ["one", "TWO, edited"]
    graph = runner.graphs["assistant"]
    live = (await graph.aget_state(THREAD)).values["messages"]
    assert [m.text for m in live] == ["one", "r1", "TWO, edited", "edited reply"]
    # The old branch is still in the thread's history, untouched.
    old = [s async for s in graph.aget_state_history(THREAD)]
    assert any(human_texts(s.values.get("messages", [])) == ["one", "two", "three"] for s in old)


async def test_editing_the_first_message_starts_the_conversation_afresh():
    model = ScriptedChatModel(["r1", "r2", "r3", "fresh"])
    runner = runner_for(assistant_spec(), model=model)
    await three_turns(runner)

    outcome = await runner.edit(
        RecordingSurface(), user_id="alice", thread_id="t1", message_id="m1", text="ONE"
    )

    assert outcome.status == "done"
    assert human_texts(model.seen[-1]) == ["ONE"]
    live = (await runner.graphs["assistant"].aget_state(THREAD)).values["messages"]
    assert [m.text for m in live] == ["ONE", "fresh"]


async def test_a_later_message_on_the_new_branch_can_be_edited_too():
    model = ScriptedChatModel(["r1", "r2", "r3", "e2", "r4", "e4"])
    runner = runner_for(assistant_spec(), model=model)
    await three_turns(runner)
    await runner.edit(
        RecordingSurface(), user_id="alice", thread_id="t1", message_id="m2", text="TWO"
    )
    await send(runner, RecordingSurface(), "four", message_id="m4")

    await runner.edit(
        RecordingSurface(), user_id="alice", thread_id="t1", message_id="m4", text="FOUR"
    )

    assert human_texts(model.seen[-1]) == ["one", "TWO", "FOUR"]


@pytest.mark.parametrize(
    ("user_id", "message_id"),
    [("alice", "not-a-message-of-this-thread"), ("mallory", "m2")],
)
async def test_an_edit_of_a_message_not_in_the_users_thread_is_refused_like_a_missing_thread(
    user_id: str, message_id: str
):
    model = ScriptedChatModel(["r1", "r2", "r3", "never"])
    runner = runner_for(assistant_spec(), model=model)
    await three_turns(runner)
    calls = len(model.seen)
    surface = RecordingSurface()

    outcome = await runner.edit(
        surface, user_id=user_id, thread_id="t1", message_id=message_id, text="x"
    )

    assert outcome.status == "not_found"
    assert surface.said == [("refuse", NOT_FOUND)]
    assert len(model.seen) == calls
    live = (await runner.graphs["assistant"].aget_state(THREAD)).values["messages"]
    assert human_texts(live) == ["one", "two", "three"]


async def test_an_edit_while_the_thread_runs_is_refused_and_nothing_is_removed():
    runner = runner_for(assistant_spec(), model=ScriptedChatModel(["r1", "r2", "r3"]))
    await three_turns(runner)
    assert isinstance(runner.locks, MemoryLocks)
    runner.locks.held.add("t1")
    forked: list[bool] = []

    async def on_fork() -> None:
        forked.append(True)

    outcome = await runner.edit(
        RecordingSurface(),
        user_id="alice",
        thread_id="t1",
        message_id="m2",
        text="x",
        on_fork=on_fork,
    )

    assert outcome.status == "busy"
    assert forked == []


# -- a support fork -------------------------------------------------------------------------


class PlanState(TypedDict, total=False):
    input: str
    plan: list[str]
    response: str
    recalled: list[Any]


def build_planish(*, checkpointer: Any, store: Any = None, model: Any = None) -> Any:
    """plan -> execute: enough of the Planner's shape to fork with an edited plan."""

    def write_plan(state: PlanState) -> dict[str, Any]:
        return {"plan": ["count rows", "sum revenue"], "recalled": [{"key": "k", "content": "x"}]}

    def execute(state: PlanState, runtime: Runtime[Context]) -> dict[str, Any]:
        memory = "memory on" if runtime.context.memory else "memory off"
        return {"response": f"ran {' + '.join(state['plan'])} ({memory})"}

    builder = StateGraph(PlanState, context_schema=Context)
    builder.add_node(write_plan)
    builder.add_node(execute)
    builder.add_edge("__start__", "write_plan")
    builder.add_edge("write_plan", "execute")
    return builder.compile(checkpointer=checkpointer, name="planish")


def planish_spec(after: list[Context]) -> AgentSpec:
    async def after_turn(services: Any, context: Context) -> None:
        after.append(context)

    return AgentSpec(
        key="planner",
        profile="Planner",
        description="",
        build=build_planish,
        inputs=lambda text, mid: {"input": text},
        reply_text=lambda values: values.get("response"),
        after_turn=after_turn,
    )


async def test_a_support_fork_resumes_from_an_edited_plan_and_leaves_the_original_intact():
    after: list[Context] = []
    runner = runner_for(planish_spec(after))
    await send(runner, RecordingSurface(), "revenue by region", message_id="m1")
    graph = runner.graphs["planner"]
    original = [s async for s in graph.aget_state_history(THREAD)]
    planned = next(s for s in original if s.next == ("execute",))
    parent = next(
        s for s in original if checkpoint_id(s.config) == checkpoint_id(planned.parent_config)
    )
    made: list[str] = []

    async def start(g: Any) -> Any:
        new = await g.aupdate_state(
            planned.config, {"plan": ["count customers"]}, as_node=writer_node(planned, parent)
        )
        made.append(checkpoint_id(new))
        return new

    outcome = await runner.fork(RecordingSurface(), owner_id="alice", thread_id="t1", start=start)
    await runner.drain()

    assert outcome.status == "done"
    head = await graph.aget_state(THREAD)
    assert head.values["response"] == "ran count customers (memory off)"
    # Every original checkpoint is still there, unchanged.
    for snapshot in original:
        again = await snapshot_at(graph, "t1", str(checkpoint_id(snapshot.config)))
        assert again is not None
        assert state_digest(again.values) == state_digest(snapshot.values)
    assert original[0].values["response"] == "ran count rows + sum revenue (memory on)"
    # The fork is a branch of the planned checkpoint.
    forked = await snapshot_at(graph, "t1", made[0])
    assert forked is not None
    assert checkpoint_id(forked.parent_config) == checkpoint_id(planned.config)
    assert after[-1].memory is False
    listed = await history(graph, "t1")
    assert any(c.node == "fork (update_state)" for c in listed)
    assert any(c.node == "write_plan" and c.summary.get("plan") for c in listed)


async def test_a_support_fork_of_a_thread_that_is_not_there_is_refused():
    runner = runner_for(planish_spec([]))
    surface = RecordingSurface()

    async def start(g: Any) -> Any:
        raise AssertionError("must not be reached")

    outcome = await runner.fork(surface, owner_id="alice", thread_id="nope", start=start)

    assert outcome.status == "not_found"
    assert surface.said == [("refuse", NOT_FOUND)]


# -- what support sees ----------------------------------------------------------------------


def test_support_never_sees_recalled_memories_or_memory_files():
    values = {
        "messages": [HumanMessage("hi"), AIMessage("hello")],
        "recalled": [{"key": "k", "content": "has asthma"}],
        "files": {"notes/a.md": {"content": "x"}, "/memories/p.md": {"content": "secret"}},
    }

    shown = visible(values)

    assert "recalled" not in shown
    assert list(shown["files"]) == ["notes/a.md"]
    # The digest covers only what is visible: a memory change does not alter it.
    assert state_digest(values) == state_digest({**values, "recalled": []})
    assert state_digest(values) != state_digest({**values, "messages": []})


def test_a_summary_names_messages_todos_files_plan_and_past_steps():
    summary = summarise(
        {
            "messages": [HumanMessage("question"), AIMessage("answer " * 100)],
            "todos": [
                {"content": "a", "status": "completed"},
                {"content": "b", "status": "pending"},
            ],
            "files": {"notes/a.md": {}, "final_report.md": {}},
            "plan": ["step one"],
            "past_steps": [(1, "s", "r")],
        }
    )

    assert summary["messages"] == 2
    assert summary["last_message"].startswith("ai: answer")
    assert len(summary["last_message"]) <= len("ai: ") + 160
    assert summary["todos"] == "1/2 done"
    assert summary["files"] == ["final_report.md", "notes/a.md"]
    assert summary["plan"] == ["step one"]
    assert summary["past_steps"] == 1


def test_fork_edits_are_checked():
    values = {
        "plan": ["a"],
        "todos": [{"content": "keep", "status": "completed"}],
        "files": {"notes/a.md": {"content": "old", "created_at": "then"}},
    }

    assert fork_update(values, "plan", "x\n\n y ") == {"plan": ["x", "y"]}
    assert fork_update(values, "todos", "keep\nnew") == {
        "todos": [
            {"content": "keep", "status": "completed"},
            {"content": "new", "status": "pending"},
        ]
    }
    edited = fork_update(values, "file", "new notes", "notes/a.md")["files"]["notes/a.md"]
    assert (edited["content"], edited["created_at"]) == ("new notes", "then")
    assert fork_update(values, "none", "") == {}
    for what, text, path in [
        ("plan", "", ""),
        ("plan", "x" * 501, ""),
        ("plan", "\n".join("s" * 13), ""),
        ("file", "x", "/memories/profile.md"),
        ("file", "x", "../etc/passwd"),
        ("file", "x", "other.md"),
    ]:
        with pytest.raises(ForkRefused):
            fork_update(values, what, text, path)  # type: ignore[arg-type]
    with pytest.raises(ForkRefused):
        fork_update({"messages": []}, "plan", "x")


@pytest.mark.parametrize(("edited", "seen"), [("m2", ["one", "TWO"]), ("m1", ["TWO"])])
async def test_a_message_sent_before_fork_points_were_kept_is_found_in_the_state(edited, seen):
    model = ScriptedChatModel(["r1", "r2", "r3", "again"])
    runner = runner_for(assistant_spec(), model=model)
    await three_turns(runner)
    assert isinstance(runner.fork_points, MemoryForkPoints)
    runner.fork_points.rows.clear()  # as in a conversation from before they were recorded

    outcome = await runner.edit(
        RecordingSurface(), user_id="alice", thread_id="t1", message_id=edited, text="TWO"
    )

    assert outcome.status == "done"
    assert human_texts(model.seen[-1]) == seen


async def test_editing_a_planner_goal_forks_from_before_it():
    runner = runner_for(planish_spec([]))
    await send(runner, RecordingSurface(), "goal one", message_id="m1")
    await send(runner, RecordingSurface(), "goal two", message_id="m2")

    outcome = await runner.edit(
        RecordingSurface(), user_id="alice", thread_id="t1", message_id="m2", text="goal TWO"
    )

    assert outcome.status == "done"
    graph = runner.graphs["planner"]
    head = await graph.aget_state(THREAD)
    assert head.values["input"] == "goal TWO"
    inputs = {s.values.get("input") async for s in graph.aget_state_history(THREAD)}
    assert {"goal one", "goal two", "goal TWO"} <= inputs
    # The fork's parent chain never passes through the discarded goal.
    snapshot = head
    while snapshot.parent_config is not None:
        snapshot = await graph.aget_state(snapshot.parent_config)
        assert snapshot.values.get("input") != "goal two"
