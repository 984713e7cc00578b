"""A manipulated model's text on a real Postgres: control characters never fail a write."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain_core.tools import tool
from langchain_openai.chat_models.base import OpenAIRefusalError
from langgraph.types import Command

from graphs.core.context import Context
from graphs.memory.scoped import ScopedMemory
from graphs.memory.writer import InvalidModelOutput
from graphs.planner.graph import build_graph
from graphs.planner.state import Act, Plan, Response
from tests.fakes import ScriptedChatModel
from tests.integration.test_memory import StructuredStandIn, assistant, run_job, say

pytestmark = pytest.mark.integration


@tool
def sql_query(query: str) -> str:
    """Run one read-only SQL query."""
    return "| region | churned |\n| --- | --- |\n| EMEA | 5 |"


async def test_a_plan_step_with_control_characters_is_cleaned_before_review_and_kept(
    persistence: Any,
) -> None:
    thread, user = f"t-{uuid.uuid4()}", f"u-{uuid.uuid4()}"
    hostile = "Count churn\x00 by\x1b[31m region\u202e"
    model = ScriptedChatModel(
        ["EMEA churned most."],
        [Plan(steps=[hostile]), Act(action=Response(response="EMEA\x00 churned most."))],
    )
    graph = build_graph(
        checkpointer=persistence.checkpointer,
        store=persistence.store,
        model=model,
        tools=[sql_query],
    )
    config = {"configurable": {"thread_id": thread}}
    context = Context(user_id=user, thread_id=thread, agent="planner")

    paused = await graph.ainvoke({"input": "Which region churned most?"}, config, context=context)
    done = await graph.ainvoke(Command(resume={"decision": "approve"}), config, context=context)

    assert paused["__interrupt__"][0].value["plan"] == ["Count churn by [31m region"]
    assert done["response"] == "EMEA  churned most."
    [summary] = await persistence.store.asearch((user, "plans"))
    assert summary.value["steps"] == ["Count churn by [31m region"]


async def test_a_nul_in_a_plain_string_channel_does_not_fail_the_checkpoint(
    persistence: Any,
) -> None:
    thread, user = f"t-{uuid.uuid4()}", f"u-{uuid.uuid4()}"
    model = ScriptedChatModel([], [Plan(steps=["Count churn by region"])])
    graph = build_graph(
        checkpointer=persistence.checkpointer, store=persistence.store, model=model, tools=[]
    )
    config = {"configurable": {"thread_id": thread}}
    context = Context(user_id=user, thread_id=thread, agent="planner")

    paused = await graph.ainvoke(
        {"input": "Which region\x00 churned most?"}, config, context=context
    )

    assert paused["__interrupt__"][0].value["plan"] == ["Count churn by region"]
    state = await graph.aget_state(config)
    assert state.values["input"] == "Which region churned most?"


async def test_a_memory_writer_that_refuses_is_skipped_at_once_and_changes_nothing(
    persistence: Any,
) -> None:
    user, thread = f"u-{uuid.uuid4()}", f"t-{uuid.uuid4()}"
    graph = assistant(persistence)
    memory = ScopedMemory(persistence.store, user)
    await say(graph, "I live in Chennai", user=user, thread=thread)

    async def refuse(_input: Any) -> Any:
        raise OpenAIRefusalError("I can't help with that.")

    model = StructuredStandIn(refuse)
    with pytest.raises(InvalidModelOutput, match="refused"):
        await run_job(persistence, graph, user=user, thread=thread, model=model)

    assert model.calls == 1
    assert await memory.all_memories() == []
    assert not await memory.marker(thread)
