"""A research subagent stops at its tool-call, token and time budgets, and says so."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.runtime import Runtime

from graphs.core.context import Context
from graphs.core.offline import OfflineChatModel
from graphs.core.settings import Settings
from graphs.research.agents import SubagentSlots, build_researcher

_ids = itertools.count()


class Searcher(OfflineChatModel):
    """Searches forever; each reply reports `tokens_per_call` tokens used."""

    tokens_per_call: int = 10
    calls: int = 0

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(
            "",
            tool_calls=[{"name": "web_search", "args": {"query": "bees"}, "id": f"c{next(_ids)}"}],
            usage_metadata={
                "input_tokens": self.tokens_per_call,
                "output_tokens": 0,
                "total_tokens": self.tokens_per_call,
            },
        )


searches: list[str] = []


@tool
async def web_search(query: str) -> str:
    """Search."""
    searches.append(query)
    await asyncio.sleep(0)
    return "1. A (x)\n   url: corpus://sample/a.md\n   snippet"


class Outer(TypedDict):
    messages: list[Any]
    files: dict[str, Any]
    result: dict[str, Any]


async def run_subagent(settings: Settings, model: OfflineChatModel) -> dict[str, Any]:
    spec = build_researcher(model, [web_search], settings, SubagentSlots(2))

    async def call(state: Outer, runtime: Runtime[Context]) -> dict[str, Any]:
        result = await spec["runnable"].ainvoke(
            {
                "messages": [HumanMessage("Research: bees. Write notes to notes/bees.md")],
                "files": {},
            }
        )
        return {"result": result}

    graph = StateGraph(Outer, context_schema=Context)
    graph.add_node(call)
    graph.add_edge(START, "call")
    out = await graph.compile().ainvoke(
        {"messages": [], "files": {}},
        {"recursion_limit": 200},
        context=Context(user_id="u", thread_id="t"),
    )
    return out["result"]


async def test_tool_call_budget_stops_the_subagent():
    searches.clear()
    settings = Settings(openai_api_key=None, research_subagent_tool_calls=3)
    result = await run_subagent(settings, Searcher())
    assert len(searches) == 3
    blocked = [m for m in result["messages"] if getattr(m, "status", None) == "error"]
    assert blocked, "the call over budget is answered with an error, not run"
    assert "limit" in blocked[-1].text.lower()


async def test_token_budget_stops_the_subagent():
    searches.clear()
    settings = Settings(
        openai_api_key=None, research_subagent_tool_calls=50, research_subagent_tokens=1_000
    )
    result = await run_subagent(settings, Searcher(tokens_per_call=400))
    assert len(searches) == 3  # 400, 800, 1200 tokens: no fourth model call
    assert "Token budget reached" in result["messages"][-1].text


async def test_timeout_stops_the_subagent_with_a_gap_note():
    class Slow(Searcher):
        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(5)
            return await super()._agenerate(*args, **kwargs)

        async def _astream(self, *args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(5)
            for chunk in self._stream(*args, **kwargs):
                yield chunk

    settings = Settings(openai_api_key=None, research_subagent_timeout_s=0.2)
    result = await run_subagent(settings, Slow())
    assert "stopped at its 0.2s limit" in result["messages"][-1].text
    assert result["usage"][0]["tool_calls"] == 0
