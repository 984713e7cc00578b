"""The offline model never reads the app's prompts: reword every prompt and each agent's offline
run gives the same result. Behaviour comes from the schema and tools offered, and from data."""

from __future__ import annotations

import string
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command

import graphs.assistant.graph
import graphs.memory.writer
import graphs.planner.graph
import graphs.research.agents
import graphs.research.graph
from graphs.assistant import prompts as assistant_prompts
from graphs.assistant.offline import OfflineAssistant
from graphs.core.context import Context
from graphs.core.settings import Settings
from graphs.memory import prompts as memory_prompts
from graphs.memory.policy import MemoryOps
from graphs.memory.scoped import ScopedMemory
from graphs.planner import prompts as planner_prompts
from graphs.planner.offline import OfflinePlannerModel
from graphs.research import SAMPLE_CORPUS_DIR
from graphs.research import prompts as research_prompts
from graphs.research.graph import ResearchTools
from graphs.research.offline import OfflineResearchModel
from graphs.tools.fetch import Fetcher
from graphs.tools.fetchlog import MemoryFetchLog
from graphs.tools.search import LocalCorpus

PROMPT_MODULES = (assistant_prompts, memory_prompts, planner_prompts, research_prompts)
PROMPTS = {
    (module.__name__, name): value
    for module in PROMPT_MODULES
    for name, value in vars(module).items()
    if name.isupper() and isinstance(value, str)
}
SEEN: list[list[BaseMessage]] = []
"""Every conversation an offline model was shown in the current run."""


def reworded(name: str, text: str) -> str:
    """Another prompt with the same fields: none of the original's words or headings survive."""
    fields = [f for _, f, _, _ in string.Formatter().parse(text) if f]
    return f"[{name}, reworded]\n" + "\n".join(f"{{{f}}}" for f in dict.fromkeys(fields))


@pytest.fixture
def reword(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Replace every prompt constant, in prompts.py and wherever a module imported it by name."""

    def apply() -> None:
        originals = {id(v): (name, v) for (_, name), v in PROMPTS.items()}
        for module in [m for n, m in sys.modules.items() if n.startswith("graphs.")]:
            for attr, value in list(vars(module).items()):
                if isinstance(value, str) and id(value) in originals:
                    monkeypatch.setattr(module, attr, reworded(*originals[id(value)]))

    return apply


def recording(cls: type[Any]) -> type[Any]:
    class Recording(cls):  # type: ignore[misc, valid-type]
        def _reply(self, messages: list[BaseMessage]) -> AIMessage:
            SEEN.append(list(messages))
            return super()._reply(messages)

        def _structured(self, schema: Any, messages: list[BaseMessage]) -> Any:
            SEEN.append(list(messages))
            return super()._structured(schema, messages)

    return Recording


async def both_ways(run: Callable[[], Awaitable[Any]], reword: Callable[[], None]) -> Any:
    """The run's result with the real prompts, checked equal to its result with reworded ones."""
    SEEN.clear()
    plain = await run()
    assert SEEN, "the offline model was never asked"
    assert any(_has_a_prompt(c) for c in SEEN)
    SEEN.clear()
    reword()
    again = await run()
    assert SEEN
    assert not any(_has_a_prompt(c) for c in SEEN), "a prompt escaped the rewording"
    assert again == plain
    return plain


def _has_a_prompt(conversation: list[BaseMessage]) -> bool:
    text = "\n".join(str(m.text) for m in conversation)
    return any(len(p) > 40 and p[:40] in text for p in PROMPTS.values())


async def test_assistant_tools_memories_and_writer_ignore_prompts(reword):
    model = recording(OfflineAssistant)()

    async def run() -> Any:
        store = InMemoryStore()
        await ScopedMemory(store, "alice").put(
            "home_city",
            content="User lives in Lisbon",
            category="profile",
            source={"test": True},
            confidence=1.0,
            stated=True,
        )
        graph = graphs.assistant.graph.build_graph(
            checkpointer=InMemorySaver(), store=store, model=model
        )
        config = {"configurable": {"thread_id": "t"}}
        context = Context(user_id="alice", thread_id="t")
        replies = []
        for text in ("Remember that I like green tea", "Any dinner ideas?"):
            state = await graph.ainvoke({"messages": [HumanMessage(text)]}, config, context=context)
            replies.append(
                [
                    (m.type, m.text, m.tool_calls if m.type == "ai" else None)
                    for m in state["messages"]
                ]
            )
        written = await graphs.memory.writer._propose(
            model,
            [HumanMessage("My manager is Zephyrine. I'm vegetarian."), AIMessage("Noted.")],
            {"diet": type("Stored", (), {"content": "User is vegan"})()},
            [],
        )
        return replies, written

    replies, written = await both_ways(run, reword)
    first, second = replies
    assert [call["name"] for m in first if m[2] for call in m[2]] == ["remember"]
    assert "What I remember about you: User lives in Lisbon" in second[-1][1]
    assert isinstance(written, MemoryOps)
    assert sorted((op.action, op.key) for op in written.ops) == [
        ("insert", "manager"),
        ("update", "diet"),
    ]


@tool
def list_tables() -> str:
    """List the tables."""
    return (
        '<tool_output source="list_tables">\n- analytics_demo.churn_events: churn\n</tool_output>'
    )


@tool
def describe_table(table: str) -> str:
    """Describe one table."""
    return f'<tool_output source="describe_table">\n{table}:\n- region text\n</tool_output>'


@tool
def sql_query(query: str) -> str:
    """Run one read-only query."""
    table = "| region | churned_customers |\n| --- | --- |\n| EMEA | 5 |\n| APAC | 3 |"
    return f'<tool_output source="sql_query">\nQuery returned 2 rows.\n\n{table}\n</tool_output>'


@pytest.mark.parametrize("budget", [6, 2], ids=["answered", "partial-at-budget"])
async def test_planner_plan_steps_answer_and_partial_answer_ignore_prompts(reword, budget):
    model = recording(OfflinePlannerModel)()

    async def run() -> Any:
        graph = graphs.planner.graph.build_graph(
            checkpointer=InMemorySaver(),
            store=InMemoryStore(),
            model=model,
            tools=[list_tables, describe_table, sql_query],
            step_budget=budget,
        )
        config = {"configurable": {"thread_id": "p"}}
        context = Context(user_id="alice", thread_id="p", agent="planner")
        goal = {"input": "Which region had the most churn last quarter?"}
        paused = await graph.ainvoke(goal, config, context=context)
        plan = paused["__interrupt__"][0].value["plan"]
        done = await graph.ainvoke(Command(resume={"decision": "approve"}), config, context=context)
        return plan, done["past_steps"], done["response"], done["outcome"]

    plan, past, response, outcome = await both_ways(run, reword)
    assert len(plan) == 3
    if budget == 6:
        assert [r[2].split("\n")[0] for r in past][-1] == (
            "(offline model) sql_query returned the data below."
        )
        assert outcome == "answered"
        assert "Here is what the plan found" in response
        assert "| EMEA | 5 |" in response
    else:
        assert outcome == "partial"
        assert f"Not run: {plan[2]}." in response
        assert f"Established so far: {plan[0]}; {plan[1]}." in response


async def test_research_plan_subagents_and_report_ignore_prompts(reword):
    model = recording(OfflineResearchModel)()

    async def run() -> Any:
        corpus = LocalCorpus(SAMPLE_CORPUS_DIR)
        fetcher = Fetcher(log=MemoryFetchLog(), openers={"corpus": corpus.open})
        graph = graphs.research.graph.build_graph(
            checkpointer=InMemorySaver(),
            store=InMemoryStore(),
            model=model,
            tools=ResearchTools(search=corpus, fetcher=fetcher),
            settings=Settings(openai_api_key=None, research_critique_rounds=1),
        )
        config = {"configurable": {"thread_id": "r"}, "recursion_limit": 150}
        context = Context(user_id="alice", thread_id="r", agent="research")
        question = "When did the seed vault open and how do honeybees share the location of food?"
        paused = await graph.ainvoke(
            {"messages": [HumanMessage(question)]}, config, context=context
        )
        todos = paused["__interrupt__"][0].value["todos"]
        final = await graph.ainvoke(
            Command(resume={"decision": "approve"}), config, context=context
        )
        notes = sorted(p for p in final["files"] if p.startswith("/notes/"))
        return todos, notes, final["report"]

    todos, notes, report = await both_ways(run, reword)
    assert len(todos) == 2
    assert len(notes) == 2
    assert report.count("](corpus://") >= 2


def test_every_prompt_is_reworded_for_the_model_it_reaches(reword):
    """The rewording reaches the bindings the graphs use, not only prompts.py."""
    reword()
    assert graphs.assistant.graph.SYSTEM_PROMPT.startswith("[SYSTEM_PROMPT, reworded]")
    assert graphs.research.agents.ORCHESTRATOR_PROMPT.startswith("[ORCHESTRATOR_PROMPT")
    assert graphs.research.graph.PLANNER_PROMPT.startswith("[PLANNER_PROMPT")
    assert graphs.memory.writer.WRITER_PROMPT.startswith("[WRITER_PROMPT")
    assert planner_prompts.REPLANNER_PROMPT.startswith("[REPLANNER_PROMPT")
    assert "{goal}" in planner_prompts.REPLANNER_PROMPT
    assert isinstance(SystemMessage(planner_prompts.FINALIZE_PROMPT), SystemMessage)
