"""Each graph's nodes called alone, with a scripted model: no graph run, no network, no Postgres."""

from __future__ import annotations

from typing import Any

from deepagents.backends.utils import create_file_data
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.runtime import Runtime
from langgraph.store.memory import InMemoryStore

from graphs.assistant.graph import TOOL_CALL_BUDGET, AssistantDeps, assistant, recall_memories
from graphs.assistant.prompts import TOOL_BUDGET_NOTE
from graphs.core.context import Context
from graphs.core.settings import Settings
from graphs.memory.scoped import ScopedMemory
from graphs.planner.graph import (
    PlannerDeps,
    build_executor,
    execute_step,
    plan,
    replan,
    start_goal,
)
from graphs.planner.graph import (
    finalize as planner_finalize,
)
from graphs.planner.state import Act, Plan, Response
from graphs.research import SAMPLE_CORPUS_DIR
from graphs.research.files import REPORT_PATH
from graphs.research.graph import (
    Critique,
    Models,
    ResearchDeps,
    ResearchTools,
    check_citations,
    reopen_claims,
    route_after_check,
    write_plan,
)
from graphs.research.graph import (
    finalize as research_finalize,
)
from graphs.research.relevance import Verdict
from graphs.tools.fetch import Fetcher
from graphs.tools.fetchlog import MemoryFetchLog, new_record
from graphs.tools.search import LocalCorpus
from tests.fakes import ScriptedChatModel


def runtime(*, store: Any = None, memory: bool = True, thread: str = "t1") -> Runtime[Context]:
    context = Context(user_id="alice", thread_id=thread, memory=memory)
    return Runtime(context=context, store=store)


# Assistant ----------------------------------------------------------------------------------


async def test_recall_memories_returns_the_users_pinned_fact() -> None:
    store = InMemoryStore()
    memory = ScopedMemory(store, "alice")
    await memory.put(
        "country",
        content="Lives in Norway",
        category="profile",
        source={},
        confidence=1,
        stated=True,
    )

    found = await recall_memories(
        {"messages": [HumanMessage("Where do I live?")]}, runtime(store=store)
    )
    temporary = await recall_memories(
        {"messages": [HumanMessage("Where do I live?")]}, runtime(store=store, memory=False)
    )

    assert found == {"recalled": [{"key": "country", "content": "Lives in Norway"}]}
    assert temporary == {"recalled": []}


async def test_assistant_shows_recalled_facts_and_answers() -> None:
    model = ScriptedChatModel(["You live in Oslo."])
    state = {
        "messages": [HumanMessage("Where do I live?")],
        "recalled": [{"key": "city", "content": "Lives in Oslo"}],
    }

    update = await assistant(state, deps=AssistantDeps.of(model))

    assert [m.text for m in update["messages"]] == ["You live in Oslo."]
    system = model.seen[0][0]
    assert isinstance(system, SystemMessage)
    assert "Lives in Oslo" in system.text
    assert TOOL_BUDGET_NOTE not in system.text


async def test_assistant_over_the_tool_budget_is_told_to_answer_without_tools() -> None:
    with_tools = ScriptedChatModel([])  # must not be called
    plain = ScriptedChatModel(["Here is what I have."])
    messages: list[Any] = [HumanMessage("Remember lots of things")]
    for i in range(TOOL_CALL_BUDGET):
        call = {"name": "remember", "args": {}, "id": f"c{i}"}
        messages += [AIMessage("", tool_calls=[call]), ToolMessage("saved", tool_call_id=f"c{i}")]

    deps = AssistantDeps(model=plain, with_tools=with_tools)
    update = await assistant({"messages": messages, "recalled": []}, deps=deps)

    assert update["messages"][0].text == "Here is what I have."
    assert with_tools.seen == []
    assert plain.seen[0][0].text.endswith(TOOL_BUDGET_NOTE)


# Research -----------------------------------------------------------------------------------

VAULT = "https://example.org/vault"
PAGE = "The Svalbard Global Seed Vault opened on 26 February 2008."
GOOD = f'- The vault opened in 2008 ["{PAGE}"]({VAULT})'
INVENTED = '- The vault holds gold ["the vault holds gold bars"](https://never.example/gold)'


def research_deps(model: ScriptedChatModel, log: MemoryFetchLog | None = None) -> ResearchDeps:
    corpus = LocalCorpus(SAMPLE_CORPUS_DIR)
    fetcher = Fetcher(log=log or MemoryFetchLog(), openers={"corpus": corpus.open})
    tools = ResearchTools(search=corpus, fetcher=fetcher)
    return ResearchDeps.of(Models(model, model, model, model), tools, Settings())


def report_state(report: str) -> dict[str, Any]:
    return {
        "question": "When did the seed vault open?",
        "todos": [{"content": "Seed vault opening date", "status": "completed"}],
        "files": {REPORT_PATH: dict(create_file_data(report))},
        "critique_round": 0,
    }


async def test_write_plan_takes_the_topics_of_the_write_todos_call() -> None:
    todos = [{"content": "Seed vault opening date"}, {"content": "Seed vault location"}]
    call = {"name": "write_todos", "args": {"todos": todos}, "id": "p1"}
    model = ScriptedChatModel([AIMessage("", tool_calls=[call])])
    state = {"messages": [HumanMessage("Tell me about the seed vault")], "plan_feedback": "shorter"}

    update = await write_plan(state, deps=research_deps(model))

    assert update["question"] == "Tell me about the seed vault"
    assert [t["content"] for t in update["todos"]] == [
        "Seed vault opening date",
        "Seed vault location",
    ]
    assert "The user rejected the previous plan: shorter" in model.seen[0][0].text


async def test_check_citations_then_finalize_keep_only_the_fetched_quote() -> None:
    log = MemoryFetchLog()
    await log.record(
        new_record(thread_id="t1", url=VAULT, final_url=VAULT, status=200, title="v", content=PAGE)
    )
    answers = Verdict(claim=1, answers_question=True)
    model = ScriptedChatModel(structured=[Critique(flags=[], verdicts=[answers])])
    deps = research_deps(model, log)
    state: dict[str, Any] = report_state(f"# Seed vault\n\n{GOOD}\n{INVENTED}\n")

    checked = await check_citations(state, runtime(), deps=deps)

    assert len(checked["unsupported"]) == 1
    assert "holds gold" in checked["unsupported"][0]
    assert checked["verifications"][0]["passing"] == 1
    state.update(checked)
    assert route_after_check(state, deps=deps) == "reopen_claims"

    done = await research_finalize(state, runtime(), deps=deps)
    assert "opened in 2008" in done["report"]
    assert "gold" not in done["report"]
    assert any("holds gold" in item for item in done["not_verified"])


def test_reopen_claims_turns_each_unsupported_claim_into_a_todo() -> None:
    state: dict[str, Any] = {
        "todos": [{"content": "Seed vault opening date", "status": "completed"}],
        "unsupported": ["The vault holds gold — never fetched"],
        "critique_round": 0,
    }

    update = reopen_claims(state)

    assert update["critique_round"] == 1
    assert update["todos"][0]["status"] == "completed"
    assert update["todos"][1]["status"] == "pending"
    assert "The vault holds gold" in update["todos"][1]["content"]


def test_route_after_check_finalizes_at_the_critique_cap() -> None:
    deps = research_deps(ScriptedChatModel([]))
    rounds = deps.settings.research_critique_rounds
    state = {"unsupported": ["x — y"], "critique_round": rounds}
    assert route_after_check(state, deps=deps) == "finalize"
    assert route_after_check({"unsupported": [], "critique_round": 0}, deps=deps) == "finalize"


# Planner ------------------------------------------------------------------------------------

TABLE = "| region | churned |\n| --- | --- |\n| EMEA | 5 |"


@tool
def sql_query(query: str) -> str:
    """Run one read-only SQL query."""
    return TABLE


def planner_deps(model: ScriptedChatModel, *, budget: int = 4) -> PlannerDeps:
    return PlannerDeps(
        planner=model, executor=build_executor(model, [sql_query]), budget=budget, max_rounds=2
    )


def test_start_goal_clears_the_last_goal() -> None:
    update = start_goal({"input": "new goal", "plan": ["old step"], "steps_taken": 3})
    assert update["plan"] == []
    assert update["steps_taken"] == 0
    assert update["response"] == ""


async def test_plan_drafts_clean_steps_within_the_budget_prompt() -> None:
    model = ScriptedChatModel(
        structured=[Plan(steps=["Count churn by region", " Count churn by region "])]
    )

    update = await plan(
        {"input": "Which region churned most?"}, runtime(), deps=planner_deps(model)
    )

    assert update == {"plan": ["Count churn by region"]}
    assert "4" in model.seen[0][0].text  # the budget is in the planner's prompt


async def test_plan_without_a_goal_asks_for_one_and_calls_no_model() -> None:
    model = ScriptedChatModel([])
    update = await plan({"input": "  "}, runtime(), deps=planner_deps(model))
    assert update["outcome"] == "failed"
    assert model.seen == []


async def test_execute_step_runs_the_first_step_with_its_tools() -> None:
    call = {"name": "sql_query", "args": {"query": "SELECT 1"}, "id": "q1"}
    model = ScriptedChatModel([AIMessage("", tool_calls=[call]), AIMessage("EMEA churned most.")])
    state = {"input": "Which region churned most?", "plan": ["Count churn by region"]}

    update = await execute_step(state, deps=planner_deps(model))

    [(index, step, result)] = update["past_steps"]
    assert (index, step) == (1, "Count churn by region")
    assert "EMEA churned most." in result
    assert "| EMEA | 5 |" in result  # the table the answer rests on, kept verbatim
    assert update["steps_taken"] == 1


async def test_replan_answers_with_the_response() -> None:
    model = ScriptedChatModel(structured=[Act(action=Response(response="EMEA, with 5."))])
    state = {
        "input": "Which region churned most?",
        "plan": ["Count churn by region"],
        "past_steps": [(1, "Count churn by region", TABLE)],
        "steps_taken": 1,
    }

    update = await replan(state, runtime(), deps=planner_deps(model))

    assert update == {"response": "EMEA, with 5.", "plan": [], "outcome": "answered"}


async def test_finalize_at_the_budget_says_the_answer_is_partial() -> None:
    model = ScriptedChatModel(["EMEA leads so far."])
    state = {
        "input": "Which region churned most?",
        "plan": ["Compare with last year"],
        "past_steps": [(1, "Count churn by region", TABLE)],
        "steps_taken": 1,
    }

    update = await planner_finalize(state, runtime(), deps=planner_deps(model, budget=1))

    assert update["outcome"] == "partial"
    assert update["response"].startswith("**Stopped at the step budget (1 steps)")
    assert update["response"].endswith("EMEA leads so far.")
