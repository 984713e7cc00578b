"""Research steps say what each subagent fetched, and the task list says why a run stopped."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph, add_messages
from langgraph.prebuilt import ToolNode
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command
from typing_extensions import TypedDict

from graphs.core import fence
from graphs.core.context import Context
from graphs.core.settings import Settings
from graphs.research import SAMPLE_CORPUS_DIR
from graphs.research.graph import ResearchTools, build_graph
from graphs.research.offline import OfflineResearchModel
from graphs.research.state import merge_files
from graphs.tools.fetch import Fetcher
from graphs.tools.fetchlog import MemoryFetchLog
from graphs.tools.search import LocalCorpus, SearchResult
from tests.fakes import FakeStep, FakeTaskList, fake_steps_and_task_lists
from tests.unit.test_runner import MemoryLocks, MemoryThreads, RecordingSurface
from ui.chainlit.agents import research
from ui.chainlit.agents.research import ResearchRun, restore
from ui.runner import Runner

QUESTION = "When did the seed vault open and how do honeybees share the location of food?"
VAULT = "Research: seed vault. Write notes to notes/seed-vault.md"
BEES = "Research: bee dances. Write notes to notes/bee-dances.md"


@pytest.fixture(autouse=True)
def fake_chat(monkeypatch):
    fake_steps_and_task_lists(monkeypatch)


def notes(*urls: str) -> dict[str, str]:
    findings = [
        f'## Finding {i}\n- claim: c\n- quote: "q"\n- source_url: {url}\n'
        for i, url in enumerate(urls, 1)
    ]
    return {"content": "# Notes: topic\n\n" + "\n".join(findings)}


NOTES = {
    "seed-vault": notes("corpus://sample/vault.md"),
    "bee-dances": notes(
        "corpus://sample/bees.md", "corpus://sample/dance.md", "corpus://sample/bees.md"
    ),
}


class Orchestrator(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    files: Annotated[dict[str, Any], merge_files]


@tool
def task(description: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Like deepagents' task tool: the subagent's files and its summary, as one Command."""
    key = re.search(r"notes/([a-z-]+)\.md", description)
    assert key is not None
    return Command(
        update={
            "files": {f"/notes/{key[1]}.md": NOTES[key[1]]},
            "messages": [ToolMessage(f"Wrote notes/{key[1]}.md", tool_call_id=tool_call_id)],
        }
    )


def delegate(_state: Orchestrator) -> dict[str, Any]:
    calls = [
        {"name": "task", "args": {"description": d}, "id": f"call-{i}"}
        for i, d in enumerate((VAULT, BEES))
    ]
    return {"messages": [AIMessage("", tool_calls=calls)]}


def parallel_tasks_graph() -> Any:
    """An outer `research` node running an orchestrator whose one tools task runs both `task`
    calls: LangGraph streams that task's update as a list, one dict per write."""
    inner = StateGraph(Orchestrator)
    inner.add_node(delegate)
    inner.add_node("tools", ToolNode([task]))
    inner.add_edge(START, "delegate")
    inner.add_edge("delegate", "tools")
    inner.add_edge("tools", END)
    orchestrator = inner.compile()

    async def research(state: Orchestrator) -> dict[str, Any]:
        await orchestrator.ainvoke({"messages": state["messages"], "files": {}})
        return {}

    outer = StateGraph(Orchestrator)
    outer.add_node("research", research)
    outer.add_edge(START, "research")
    outer.add_edge("research", END)
    return outer.compile()


def research_steps() -> dict[str, FakeStep]:
    return {s.name: s for s in FakeStep.shown if s.name.startswith("Researching")}


async def test_parallel_task_results_streamed_as_a_list_end_each_step_with_its_own_sources():
    run = ResearchRun()
    shapes = []
    async for namespace, chunk in parallel_tasks_graph().astream(
        {"messages": [HumanMessage(QUESTION)]}, stream_mode="updates", subgraphs=True
    ):
        for node, delta in chunk.items():
            if namespace and node == "tools":
                shapes.append(type(delta))
            await run.update(namespace, node, delta)
    await run.view.finish("done")
    assert shapes == [list]  # the shape the view must read, as this LangGraph streams it
    steps = research_steps()
    vault, bees = steps["Researching: seed vault"], steps["Researching: bee dances"]
    assert not vault.is_error
    assert not bees.is_error
    assert vault.output.startswith("Fetched 1 source(s), wrote 1 finding(s).")
    assert bees.output.startswith("Fetched 2 source(s), wrote 3 finding(s).")


async def test_a_single_task_result_streamed_as_a_dict_still_ends_its_step():
    run = ResearchRun()
    namespace = ("research:1",)
    call = {"name": "task", "args": {"description": BEES}, "id": "c1"}
    await run.update(namespace, "model", {"messages": [AIMessage("", tool_calls=[call])]})
    update = {
        # Another topic's notes in the same update are not this task's sources.
        "files": {
            "/notes/bee-dances.md": NOTES["bee-dances"],
            "/notes/seed-vault.md": NOTES["seed-vault"],
        },
        "messages": [ToolMessage("Wrote notes/bee-dances.md", tool_call_id="c1")],
    }
    await run.update(namespace, "tools", update)
    [step] = FakeStep.shown
    assert not step.is_error
    assert step.output.startswith("Fetched 2 source(s), wrote 3 finding(s).")


def corpus_tools(corpus: LocalCorpus | None = None) -> ResearchTools:
    corpus = corpus or LocalCorpus(SAMPLE_CORPUS_DIR)
    return ResearchTools(
        search=corpus, fetcher=Fetcher(log=MemoryFetchLog(), openers={"corpus": corpus.open})
    )


def research_graph(model: OfflineResearchModel, corpus: LocalCorpus | None = None) -> Any:
    return build_graph(
        checkpointer=InMemorySaver(),
        store=InMemoryStore(),
        model=model,
        tools=corpus_tools(corpus),
        settings=Settings(openai_api_key=None, research_critique_rounds=0),
    )


CONFIG: Any = {"configurable": {"thread_id": "t-steps"}, "recursion_limit": 150}
CONTEXT = Context(user_id="alice", thread_id="t-steps", agent="research")


async def planned(graph: Any) -> None:
    await graph.ainvoke({"messages": [HumanMessage(QUESTION)]}, CONFIG, context=CONTEXT)


async def approve_and_show(graph: Any, run: ResearchRun) -> None:
    """Approve the plan and hand every update (subgraphs included) to the view, as the runner does."""
    async for namespace, chunk in graph.astream(
        Command(resume={"decision": "approve"}),
        CONFIG,
        context=CONTEXT,
        stream_mode="updates",
        subgraphs=True,
    ):
        for node, delta in chunk.items():
            await run.update(namespace, node, delta)


async def _no_state() -> Any:
    raise AssertionError("a run that did not finish reads no report")


async def test_the_offline_research_run_ends_every_step_with_its_own_notes_sources():
    graph = research_graph(OfflineResearchModel())
    await planned(graph)
    run = ResearchRun()
    await approve_and_show(graph, run)
    await run.view.finish("done")
    files = (await graph.aget_state(CONFIG)).values["files"]
    steps = research_steps()
    assert len(steps) == 2
    for step in steps.values():
        path = re.search(r"notes/[a-z0-9-]+\.md", step.input)
        assert path is not None
        sources = set(re.findall(r"^- source_url: (\S+)$", files[f"/{path[0]}"]["content"], re.M))
        assert sources
        assert not step.is_error
        assert step.output.startswith(f"Fetched {len(sources)} source(s)")
    assert run.view.tasks.status == "Done"


async def restored(graph: Any) -> str:
    await restore(await graph.aget_state(CONFIG))
    return FakeTaskList.made[-1].status


async def test_a_reopened_run_says_it_is_done_or_that_the_plan_was_rejected():
    graph = research_graph(OfflineResearchModel())
    await planned(graph)
    await graph.ainvoke(Command(resume={"decision": "approve"}), CONFIG, context=CONTEXT)
    assert await restored(graph) == "Done"

    rejected = research_graph(OfflineResearchModel())
    await planned(rejected)
    await rejected.ainvoke(Command(resume={"decision": "reject"}), CONFIG, context=CONTEXT)
    assert await restored(rejected) == "Cancelled: you rejected the plan"


class BrokenOrchestrator(OfflineResearchModel):
    def respond(self, turn: Any) -> AIMessage | None:
        if "task" in turn.tools:
            msg = "the model provider answered 500"
            raise RuntimeError(msg)
        return super().respond(turn)


async def test_a_reopened_run_says_it_failed_and_where_without_the_error_text():
    graph = research_graph(BrokenOrchestrator())
    await planned(graph)
    with pytest.raises(RuntimeError):
        await graph.ainvoke(Command(resume={"decision": "approve"}), CONFIG, context=CONTEXT)
    assert await restored(graph) == "Failed during research"


class Count(TypedDict):
    todos: list[dict[str, str]]
    n: int


def endless_orchestrator() -> Any:
    loop = StateGraph(Count)
    loop.add_node("model", lambda state: {"n": state["n"] + 1})
    loop.add_edge(START, "model")
    loop.add_edge("model", "model")
    return loop.compile()


async def test_a_reopened_run_says_it_stopped_at_the_step_limit():
    orchestrator = endless_orchestrator()

    async def research(state: Count) -> dict[str, Any]:
        await orchestrator.ainvoke(state)
        return {}

    builder = StateGraph(Count)
    builder.add_node("research", research)
    builder.add_edge(START, "research")
    builder.add_edge("research", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    config: Any = {**CONFIG, "recursion_limit": 10}
    todos = [{"content": "seed vault", "status": "pending"}]
    with pytest.raises(Exception, match="Recursion limit"):
        await graph.ainvoke({"todos": todos, "n": 0}, config)
    assert await restored(graph) == "Stopped at the step limit during research"


async def test_a_run_cut_off_between_phases_says_where_and_invents_no_cause():
    graph = research_graph(OfflineResearchModel())
    await planned(graph)
    with pytest.raises(Exception, match="Recursion limit"):
        await graph.ainvoke(
            Command(resume={"decision": "approve"}),
            {**CONFIG, "recursion_limit": 1},
            context=CONTEXT,
        )
    assert await restored(graph) == "Stopped during the final check, before the report"


class StuckCorpus(LocalCorpus):
    """Search that never answers, so the run is in research when it is stopped."""

    entered: asyncio.Event

    async def search(self, query: str, *, max_results: int = 5) -> list[SearchResult]:
        self.entered.set()
        await asyncio.Event().wait()
        return []


async def test_a_run_the_user_stops_says_so_live_and_when_reopened():
    corpus = StuckCorpus(SAMPLE_CORPUS_DIR)
    corpus.entered = asyncio.Event()
    graph = research_graph(OfflineResearchModel(), corpus)
    await planned(graph)
    run = ResearchRun()

    async def turn() -> None:
        # What the runner does: stream, and end the view in `finally` with status "failed".
        try:
            await approve_and_show(graph, run)
        finally:
            await run.end("failed", _no_state)

    running = asyncio.ensure_future(turn())
    await corpus.entered.wait()
    running.cancel()  # Chainlit's Stop button
    with pytest.raises(asyncio.CancelledError):
        await running
    assert run.view.tasks.status == "Stopped: you stopped the run"
    steps = research_steps()
    assert steps
    assert all(s.output == "Not finished. Stopped: you stopped the run" for s in steps.values())
    assert await restored(graph) == "Stopped: cancelled during research"


async def test_a_live_run_that_failed_says_so():
    run = ResearchRun()
    await run.end("failed", _no_state)
    assert run.view.tasks.status == "Failed: an error stopped the run"
    await run.end("unavailable", _no_state)
    assert run.view.tasks.status == "Failed: the database could not be reached"


@dataclass
class ResearchSurface(RecordingSurface):
    """The runner's surface with the Research spec's own view of each run."""

    runs: list[Any] = field(default_factory=list)

    def view(self, spec: Any, context: Any) -> Any:
        self.runs.append(research.PRESENTATION.view(context))
        return self.runs[-1]


class WipedLater(InMemorySaver):
    """A saver whose user's data is wiped once `wiped` is set: every later write is refused,
    as CairnSaver does in Postgres (an Event, so copies LangGraph makes of the saver share it)."""

    def __init__(self) -> None:
        super().__init__()
        self.wiped = asyncio.Event()

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if self.wiped.is_set():
            raise fence.WriteRefused(fence.SESSION_ENDED)
        return await super().aput(config, checkpoint, metadata, new_versions)


async def approved_through_the_runner(saver: Any, *, step_limit: int) -> tuple[str, str]:
    """Plan, then approve, as the chat does; the approved run's status and its task list's."""
    from ui.agents.research import SPEC

    limit = [150]  # the plan's run; then the approved one's
    spec = replace(SPEC, recursion_limit=lambda: limit[0])
    graph = build_graph(
        checkpointer=saver,
        store=InMemoryStore(),
        model=OfflineResearchModel(),
        tools=corpus_tools(),
        settings=Settings(openai_api_key=None, research_critique_rounds=0),
    )
    runner = Runner(
        agents=[spec], graphs={"research": graph}, threads=MemoryThreads(), locks=MemoryLocks()
    )
    surface = ResearchSurface()
    asked = {"user_id": "alice", "thread_id": "t-runner"}
    planned = await runner.message(
        surface, **asked, profile="Research", text=QUESTION, message_id="m1", temporary=False
    )
    assert planned.status == "paused"
    if isinstance(saver, WipedLater):
        saver.wiped.set()  # the user's data is wiped (on any worker) while the run goes on
    [pending] = planned.interrupts
    limit[0] = step_limit
    outcome = await runner.answer(surface, **asked, interrupt_id=pending.id, decision="approve")
    return outcome.status, surface.runs[-1].view.tasks.status


async def test_a_live_run_says_whether_the_step_limit_or_a_wipe_stopped_it():
    at_the_limit = await approved_through_the_runner(InMemorySaver(), step_limit=2)
    assert at_the_limit == ("stopped", "Stopped at the step limit, before the report")

    wiped = await approved_through_the_runner(WipedLater(), step_limit=150)
    assert wiped == ("refused", "Stopped: your data was deleted while it ran")
