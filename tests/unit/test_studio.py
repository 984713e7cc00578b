"""langgraph.json's graphs, loaded the way `langgraph dev` loads them, and one offline turn."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables.config import run_in_executor
from langgraph._internal._runnable import RunnableCallable
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.pregel import Pregel
from langgraph.store.memory import InMemoryStore

from graphs.core.context import Context

ROOT = Path(__file__).resolve().parents[2]
CONFIG = json.loads((ROOT / "langgraph.json").read_text())
NODES = {
    "assistant": {"recall_memories", "assistant", "tools"},
    "research": {
        "write_plan",
        "review_plan",
        "research",
        "check_citations",
        "reopen_claims",
        "finalize",
    },
    "planner": {"start_goal", "plan", "review_plan", "execute_step", "replan", "finalize"},
}


def load(graph_id: str) -> tuple[ModuleType, Any]:
    """As langgraph-api's _graph_from_spec: exec the file as its own module, take the attribute
    (a compiled graph, or a factory the server calls before each run)."""
    path, _, attr = CONFIG["graphs"][graph_id].rpartition(":")
    modname = path.replace("/", "__").replace(".py", "").lstrip(".")
    spec = importlib.util.spec_from_file_location(modname, ROOT / path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    return module, module.__dict__[attr]


async def resolve(value: Any) -> Any:
    """As the server does per run: call a factory (awaiting a coroutine), compile a builder."""
    if not isinstance(value, Pregel) and callable(value):
        value = value()
        if inspect.isawaitable(value):
            value = await value
    if hasattr(value, "compile"):
        value = value.compile()
    return value


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No model key: the graphs build with the offline models, as on a fresh install."""
    from graphs.core.settings import get_settings

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("CAIRN_OPENAI_API_KEY", raising=False)
    get_settings.cache_clear()
    assert get_settings().offline
    yield
    get_settings.cache_clear()


def test_langgraph_json_names_the_three_agents() -> None:
    assert set(CONFIG["graphs"]) == set(NODES)
    assert "." in CONFIG["dependencies"]


@pytest.mark.parametrize("graph_id", sorted(NODES))
async def test_each_graph_loads_as_the_cli_loads_it(
    graph_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, value = load(graph_id)
    prepared: list[bool] = []

    async def prepare_analytics() -> None:  # the real one migrates Postgres: integration only
        prepared.append(True)

    monkeypatch.setattr(module, "prepare_analytics", prepare_analytics)
    graph = await resolve(value)
    await resolve(value)

    assert isinstance(graph, Pregel)
    assert graph.name == graph_id
    assert NODES[graph_id] <= set(graph.nodes)
    # `langgraph dev` refuses a graph that brings its own persistence: the server supplies it.
    assert graph.checkpointer is None
    assert graph.store is None
    graph.get_graph(xray=1)  # Studio draws it
    # The Planner's factory sets up the database its SQL tools read, once.
    assert prepared == ([True] if graph_id == "planner" else [])


def thread_hops(graph: Pregel, path: str = "") -> list[str]:
    """Nodes and routers, in `graph` and its subgraphs, that LangGraph would call in a worker
    thread: a synchronous function, which an async run hands to `run_in_executor`."""

    def hops(runnable: Any) -> bool:
        return (
            isinstance(runnable, RunnableCallable)
            and isinstance(runnable.afunc, functools.partial)
            and runnable.afunc.func is run_in_executor
        )

    builder = graph.builder  # type: ignore[attr-defined]
    found = [f"{path}{name}" for name, node in builder.nodes.items() if hops(node.runnable)]
    found += [
        f"{path}{source} -> {name}"
        for source, branches in builder.branches.items()
        for name, branch in branches.items()
        if hops(branch.path)
    ]
    for name, subgraph in graph.get_subgraphs():
        found += thread_hops(subgraph, f"{path}{name}/")
    return found


@pytest.mark.parametrize("graph_id", sorted(NODES))
def test_no_node_or_router_runs_in_a_worker_thread(graph_id: str) -> None:
    # A synchronous router costs a thread hop per call, ~0.8 ms of CPU (bench.turn_cpu):
    # graphs.core.nodes.on_loop keeps such functions on the event loop.
    module, value = load(graph_id)
    graph = module.__dict__["_planner"] if graph_id == "planner" else value

    assert thread_hops(graph) == []


def test_thread_hops_finds_a_synchronous_router() -> None:
    builder = StateGraph(MessagesState)
    builder.add_node("a", lambda state: {})
    builder.add_edge(START, "a")
    builder.add_conditional_edges("a", lambda state: END)

    assert thread_hops(builder.compile()) == ["a", "a -> condition"]


async def test_the_studio_assistant_answers_one_offline_turn() -> None:
    _, value = load("assistant")
    graph = (await resolve(value)).copy(
        update={"checkpointer": InMemorySaver(), "store": InMemoryStore()}
    )
    config = {"configurable": {"thread_id": "studio-1"}}
    context = Context(user_id="studio-user", thread_id="studio-1")

    steps = [
        node
        async for update in graph.astream(
            {"messages": [HumanMessage("Hello from Studio")]},
            config,
            context=context,
            stream_mode="updates",
        )
        for node in update
    ]

    assert steps == ["recall_memories", "assistant"]
    state = await graph.aget_state(config)
    reply = state.values["messages"][-1]
    assert isinstance(reply, AIMessage)
    assert reply.text.strip()
