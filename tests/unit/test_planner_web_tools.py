"""The Planner's share of the web tools: search and fetch, logged per thread, and no way to
carry data it read out in a URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from graphs.core.context import Context
from graphs.core.settings import Settings
from graphs.tools.web import step_tool_set, web_tools


async def run_tools(tools: list[Any], *calls: tuple[str, dict[str, Any]]) -> list[str]:
    graph = StateGraph(MessagesState, context_schema=Context)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    message = AIMessage(
        "",
        tool_calls=[{"name": n, "args": a, "id": f"call-{i}"} for i, (n, a) in enumerate(calls)],
    )
    result = await graph.compile().ainvoke(
        {"messages": [message]}, context=Context(user_id="alice", thread_id="thread-1")
    )
    return [str(m.content) for m in result["messages"] if isinstance(m, ToolMessage)]


async def test_planner_fetch_refuses_urls_that_could_carry_data_out(tmp_path: Path) -> None:
    shared = web_tools(None, Settings(data_dir=tmp_path))
    tools = step_tool_set(shared)
    assert [t.name for t in tools] == ["web_search", "fetch_url"]

    refused = await run_tools(
        tools,
        ("fetch_url", {"url": "https://example.com/collect?churn=0.42"}),
        ("fetch_url", {"url": "https://example.com/page#rows=1,2,3"}),
        ("fetch_url", {"url": "https://user:secret@example.com/"}),
    )

    assert all("plain page addresses only" in text for text in refused)
    assert await shared.fetcher.log.for_thread("thread-1") == []


async def test_planner_search_and_fetch_use_the_corpus_and_the_fetch_log(tmp_path: Path) -> None:
    shared = web_tools(None, Settings(data_dir=tmp_path))
    tools = step_tool_set(shared)
    [found] = await run_tools(tools, ("web_search", {"query": "seed vault"}))
    url = next(word for word in found.split() if word.startswith("corpus://"))

    [page] = await run_tools(tools, ("fetch_url", {"url": url}))

    assert "<untrusted_page" in page
    logged = await shared.fetcher.log.for_thread("thread-1")
    assert [r.url for r in logged] == [url]
