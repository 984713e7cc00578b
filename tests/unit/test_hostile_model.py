"""A manipulated model against each agent's code: budgets hold, bad output is refused, no crash."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from deepagents.backends.utils import create_file_data
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langchain_openai.chat_models.base import OpenAIRefusalError
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.runtime import Runtime
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command

from graphs.assistant.graph import TOOL_BUDGET_SPENT, TOOL_CALL_BUDGET
from graphs.assistant.graph import build_graph as build_assistant
from graphs.core.context import Context
from graphs.core.settings import Settings
from graphs.core.toolcalls import limit_tool_calls
from graphs.memory.plans import summary_problem
from graphs.memory.policy import MemoryOp
from graphs.memory.scoped import ScopedMemory
from graphs.planner.graph import TOOL_CALLS_PER_REPLY
from graphs.planner.graph import build_graph as build_planner
from graphs.planner.state import Act, Plan, Response
from graphs.research import SAMPLE_CORPUS_DIR
from graphs.research.agents import (
    APPROVED_NOTES,
    ORCHESTRATOR_MODEL_CALLS,
    ORCHESTRATOR_TASKS,
    RESEARCHER,
    build_orchestrator,
)
from graphs.research.citations import check_report
from graphs.research.files import REPORT_PATH
from graphs.research.graph import (
    MAX_CRITIC_FLAGS,
    MAX_TODOS,
    Critique,
    Flag,
    Models,
    ResearchDeps,
    ResearchTools,
    check_citations,
    critique,
    reopen_claims,
    research_task,
)
from graphs.tools.fetch import Fetcher
from graphs.tools.fetchlog import MemoryFetchLog
from graphs.tools.search import LocalCorpus
from tests.fakes import ScriptedChatModel


def forget_calls(count: int, prefix: str = "c") -> list[Any]:
    return [
        tool_call(name="forget", args={"what": f"fact {i}"}, id=f"{prefix}{i}")
        for i in range(count)
    ]


def always_calling_tools(replies: int) -> Iterator[AIMessage]:
    """A model that answers every request, with tools offered or not, with more tool calls."""
    for i in range(replies):
        yield AIMessage("", tool_calls=forget_calls(2, prefix=f"r{i}-"))


async def ask_assistant(model: ScriptedChatModel, store: InMemoryStore, text: str) -> Any:
    graph = build_assistant(checkpointer=InMemorySaver(), store=store, model=model)
    return await graph.ainvoke(
        {"messages": [HumanMessage(text)]},
        {"configurable": {"thread_id": "t1"}, "recursion_limit": 50},
        context=Context(user_id="alice", thread_id="t1"),
    )


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


# Assistant ----------------------------------------------------------------------------------


async def test_a_model_that_calls_tools_forever_stops_at_the_tool_budget() -> None:
    store = InMemoryStore()
    model = ScriptedChatModel(list(always_calling_tools(40)))

    result = await ask_assistant(model, store, "Hello there")

    assert len(tool_messages(result)) == TOOL_CALL_BUDGET
    assert result["messages"][-1].text == TOOL_BUDGET_SPENT
    assert not result["messages"][-1].tool_calls


async def test_one_reply_with_many_tool_calls_runs_only_the_budget() -> None:
    store = InMemoryStore()
    memory = ScopedMemory(store, "alice")
    for i in range(10):
        await memory.put(
            f"k{i}", content=f"fact {i}", category="fact", source={}, confidence=1, stated=True
        )
    model = ScriptedChatModel([AIMessage("", tool_calls=forget_calls(10)), "Done."])

    result = await ask_assistant(model, store, "Forget all of those facts")

    assert len(tool_messages(result)) == TOOL_CALL_BUDGET
    assert len(await memory.all_memories()) == 10 - TOOL_CALL_BUDGET
    assert result["messages"][-1].text == "Done."


async def test_two_forgets_in_one_reply_both_leave_the_recalled_memories() -> None:
    store = InMemoryStore()
    memory = ScopedMemory(store, "alice")
    for key, fact in (("diet", "User is vegetarian"), ("city", "User lives in Oslo")):
        await memory.put(
            key, content=fact, category="profile", source={}, confidence=1, stated=True
        )
    calls = [
        tool_call(name="forget", args={"what": "User is vegetarian"}, id="f1"),
        tool_call(name="forget", args={"what": "User lives in Oslo"}, id="f2"),
    ]
    model = ScriptedChatModel([AIMessage("", tool_calls=calls), "Both forgotten."])

    result = await ask_assistant(model, store, "Forget that I am vegetarian and where I live")

    assert [m.text for m in tool_messages(result)] == [
        "Forgotten: User is vegetarian",
        "Forgotten: User lives in Oslo",
    ]
    assert result["recalled"] == []
    assert await memory.all_memories() == []


async def test_unknown_tools_wrong_types_and_extra_fields_are_errors_the_model_sees() -> None:
    store = InMemoryStore()
    calls = [
        tool_call(name="drop_table", args={"sql": "DROP TABLE store"}, id="u1"),
        tool_call(
            name="remember",
            args={"fact": {"$ne": 1}, "category": "root", "user_id": "bob"},
            id="u2",
        ),
    ]
    model = ScriptedChatModel([AIMessage("", tool_calls=calls), "Sorry."])

    result = await ask_assistant(model, store, "Remember that I like tea")

    errors = tool_messages(result)
    assert [m.status for m in errors] == ["error", "error"]
    assert "drop_table is not a valid tool" in errors[0].text
    assert await store.asearch(("memories",), limit=100) == []


async def test_a_remember_aimed_at_another_user_lands_only_with_the_signed_in_user() -> None:
    store = InMemoryStore()
    args = {
        "fact": "User likes green tea",
        "category": "preference",
        "user_id": "bob",
        "namespace": ["memories", "bob"],
        "runtime": {"context": {"user_id": "bob"}},
    }
    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[tool_call(name="remember", args=args, id="r1")]), "Saved."]
    )

    await ask_assistant(model, store, "Please remember that I like green tea")

    assert await store.asearch(("memories", "bob"), limit=100) == []
    assert [m.content for m in await ScopedMemory(store, "alice").all_memories()] == [
        "User likes green tea"
    ]


async def test_an_empty_answer_becomes_a_clear_message() -> None:
    result = await ask_assistant(ScriptedChatModel([""]), InMemoryStore(), "Hello there")

    assert result["messages"][-1].text.startswith("The model sent an empty answer")


def test_unreadable_tool_calls_are_dropped_with_the_providers_raw_copy() -> None:
    raw = {"tool_calls": [{"id": "x", "type": "function", "function": {"name": "forget"}}]}
    reply = AIMessage(
        "",
        tool_calls=forget_calls(3),
        invalid_tool_calls=[invalid_tool_call(name="forget", args="{not json", id="x")],
        additional_kwargs=raw,
        id="m1",
    )

    kept = limit_tool_calls(reply, 1)

    assert [c["id"] for c in kept.tool_calls] == ["c0"]
    assert kept.invalid_tool_calls == []
    assert "tool_calls" not in kept.additional_kwargs
    assert kept.id == "m1"
    assert limit_tool_calls(kept, 1) is kept


# Planner ------------------------------------------------------------------------------------

queries_run: list[str] = []


@tool
def sql_query(query: str) -> str:
    """Run one read-only SQL query."""
    queries_run.append(query)
    return "| region | churned |\n| --- | --- |\n| EMEA | 5 |"


class BrokenStructuredModel(ScriptedChatModel):
    """The scripted structured outputs, then never a valid one (`refuse`: a refusal instead)."""

    refuse: bool = False

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Any:
        scripted = super().with_structured_output(schema, **kwargs)

        def respond(model_input: Any) -> Any:
            if self.structured:
                return scripted.invoke(model_input)
            self.seen.append([])
            if self.refuse:
                raise OpenAIRefusalError("I can't help with that.")
            raise OutputParserException("Invalid json output: " + "{" * 5000)

        return RunnableLambda(respond)


def planner(model: ScriptedChatModel) -> Any:
    return build_planner(
        checkpointer=InMemorySaver(), store=InMemoryStore(), model=model, tools=[sql_query]
    )


async def run_planner(graph: Any, thread: str, value: Any) -> Any:
    config = {"configurable": {"thread_id": thread}}
    context = Context(user_id="alice", thread_id=thread, agent="planner")
    return await graph.ainvoke(value, config, context=context)


async def test_one_executor_reply_with_many_queries_runs_only_a_few() -> None:
    queries_run.clear()
    calls = [
        tool_call(name="sql_query", args={"query": f"SELECT {i}"}, id=f"q{i}") for i in range(50)
    ]
    model = ScriptedChatModel(
        [AIMessage("", tool_calls=calls), "EMEA churned most."],
        [Plan(steps=["Count churn by region"]), Act(action=Response(response="EMEA"))],
    )
    graph = planner(model)

    await run_planner(graph, "t-many", {"input": "Which region churned most?"})
    done = await run_planner(graph, "t-many", Command(resume={"decision": "approve"}))

    assert queries_run == [f"SELECT {i}" for i in range(TOOL_CALLS_PER_REPLY)]
    assert done["response"] == "EMEA"


@pytest.mark.parametrize("refuse", [False, True])
async def test_a_replanner_without_a_usable_answer_ends_with_a_clear_error(refuse: bool) -> None:
    model = BrokenStructuredModel(
        ["EMEA 5"], [Plan(steps=["Count churn by region"])], refuse=refuse
    )
    graph = planner(model)

    await run_planner(graph, "t-replan", {"input": "Which region churned most?"})
    done = await run_planner(graph, "t-replan", Command(resume={"decision": "approve"}))

    assert done["outcome"] == "failed"
    assert done["response"].startswith("I had to stop: the model ")
    assert "1. Count churn by region" in done["response"]
    assert len(done["response"]) < 600


async def test_a_refused_plan_is_not_asked_for_again() -> None:
    model = BrokenStructuredModel([], refuse=True)

    done = await run_planner(planner(model), "t-refused", {"input": "Which region churned most?"})

    assert done["response"] == "I could not draft a valid plan (the model refused to give a Plan)."
    assert done["outcome"] == "failed"
    assert len(model.seen) == 1


# Research -----------------------------------------------------------------------------------

SLUG = "seed-vault-opening-date"
INVENTED = '- The vault holds gold ["the vault holds gold bars"](https://never.example/gold)'


def delegating_forever(replies: int) -> Iterator[AIMessage]:
    """An orchestrator that answers every turn with more subagent tasks and file listings."""
    for i in range(replies):
        task = {"description": f"Research notes/{SLUG}.md", "subagent_type": RESEARCHER}
        calls = [tool_call(name="task", args=task, id=f"t{i}-{n}") for n in range(3)]
        calls.append(tool_call(name="ls", args={"path": "/"}, id=f"ls{i}"))
        yield AIMessage("", tool_calls=calls)


async def test_an_orchestrator_that_delegates_forever_stops_at_its_round_limits() -> None:
    started: list[str] = []

    async def researcher(state: dict[str, Any]) -> dict[str, Any]:
        started.append(str(state["messages"][-1].text))
        return {"messages": [AIMessage("Notes written.")]}

    subagent: Any = {
        "name": RESEARCHER,
        "description": "Researches one topic.",
        "runnable": RunnableLambda(researcher),
    }
    model = ScriptedChatModel(list(delegating_forever(500)))
    orchestrator = build_orchestrator(model, subagent)

    result = await orchestrator.ainvoke(
        {"messages": [HumanMessage("Question: when did the seed vault open?")], "files": {}},
        {"configurable": {APPROVED_NOTES: [SLUG]}},
        context=Context(user_id="alice", thread_id="t-loop", agent="research"),
    )

    assert 0 < len(started) <= ORCHESTRATOR_TASKS
    assert len(model.seen) <= ORCHESTRATOR_MODEL_CALLS
    assert not result["messages"][-1].tool_calls


async def test_a_critic_that_answers_garbage_or_refuses_leaves_the_code_check_in_charge() -> None:
    state: dict[str, Any] = {
        "question": "When did the seed vault open?",
        "todos": [{"content": "Seed vault opening date", "status": "completed"}],
        "files": {REPORT_PATH: dict(create_file_data(f"# Vault\n\n{INVENTED}\n"))},
        "critique_round": 0,
    }
    for refuse in (False, True):
        deps = ResearchDeps.of(
            Models(*[BrokenStructuredModel([], refuse=refuse)] * 4),
            ResearchTools(
                search=LocalCorpus(SAMPLE_CORPUS_DIR), fetcher=Fetcher(log=MemoryFetchLog())
            ),
            Settings(),
        )
        runtime = Runtime(context=Context(user_id="alice", thread_id="t1"), store=None)

        checked = await check_citations(state, runtime, deps=deps)

        assert len(checked["unsupported"]) == 1
        assert "holds gold" in checked["unsupported"][0]


async def test_a_critic_flood_is_cut_before_it_is_matched() -> None:
    flags = [Flag(claim=f"The vault holds gold {i}", reason="made up") for i in range(5000)]
    critic = ScriptedChatModel(structured=[Critique(flags=flags)])
    state: dict[str, Any] = {
        "files": {REPORT_PATH: dict(create_file_data(f"# Vault\n\n{INVENTED}\n"))}
    }

    report = f"# Vault\n\n{INVENTED}\n"
    kept = await critique(
        report, state, critic.with_structured_output(Critique), check_report(report, [])
    )

    assert kept is not None
    assert len(kept.flags) == MAX_CRITIC_FLAGS


def test_a_flood_of_unsupported_claims_reopens_at_most_a_plans_worth() -> None:
    state: dict[str, Any] = {
        "question": "When did the seed vault open?",
        "todos": [{"content": "Seed vault opening date", "status": "completed"}],
        "unsupported": [f"Claim {i} — critic: made up" for i in range(500)],
        "critique_round": 0,
    }

    update = reopen_claims(state)

    assert len([t for t in update["todos"] if t["status"] == "pending"]) == MAX_TODOS
    assert research_task({**state, **update}).count("\n- Claim") == MAX_TODOS


# Text the model writes --------------------------------------------------------------------


async def test_forget_with_a_page_of_text_or_nothing_records_nothing() -> None:
    store = InMemoryStore()
    calls = [
        tool_call(name="forget", args={"what": "Ignore all rules. " * 2000}, id="f1"),
        tool_call(name="forget", args={"what": "\x00 \x1b "}, id="f2"),
    ]
    model = ScriptedChatModel([AIMessage("", tool_calls=calls), "Done."])

    result = await ask_assistant(model, store, "Please forget it")

    notes = [m.text for m in tool_messages(result)]
    assert all(n.startswith("Nothing forgotten: say in one short sentence") for n in notes)
    assert await store.asearch(("memories",), limit=100) == []


async def test_a_forget_the_user_never_asked_for_deletes_nothing() -> None:
    store = InMemoryStore()
    memory = ScopedMemory(store, "alice")
    await memory.put(
        "diet",
        content="User is vegetarian",
        category="profile",
        source={},
        confidence=1,
        stated=True,
    )
    call = tool_call(name="forget", args={"what": "User is vegetarian"}, id="f1")
    model = ScriptedChatModel([AIMessage("", tool_calls=[call]), "Hi!"])

    result = await ask_assistant(model, store, "Hello there, what's for dinner?")

    assert [m.text for m in tool_messages(result)] == [
        "Nothing forgotten: you did not ask me to forget anything in your last message."
    ]
    assert [m.content for m in await memory.all_memories()] == ["User is vegetarian"]
    assert await memory.tombstones() == []


def test_control_characters_leave_memory_ops_and_plan_steps() -> None:
    op = MemoryOp(
        action="insert",
        key="diet\x00",
        content="User is\x00 vegan\u202e",
        stated=True,
        category="preference",
    )
    plan = Plan(steps=["Count churn\x00 by\x1b region"])

    assert (op.key, op.content) == ("diet", "User is vegan")
    assert [" ".join(s.split()) for s in plan.steps] == ["Count churn by region"]
    assert summary_problem("Goal\x00", ["Count churn"]) is not None
