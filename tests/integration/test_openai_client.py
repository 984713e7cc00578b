"""ChatOpenAI as configured by chat_model(), against a local OpenAI-compatible server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command
from pydantic import SecretStr

from graphs.assistant.graph import TOOL_BUDGET_SPENT, TOOL_CALL_BUDGET
from graphs.assistant.graph import build_graph as build_assistant
from graphs.core.context import Context
from graphs.core.models import chat_model
from graphs.core.settings import Settings
from graphs.research.agents import ORCHESTRATOR_MODEL_CALLS
from graphs.research.graph import build_graph as build_research

pytestmark = pytest.mark.integration

TEXT_DELTAS: list[dict[str, Any]] = [{"role": "assistant", "content": ""}] + [
    {"content": word} for word in ["Cairn ", "streams ", "tokens ", "from ", "Oslo."]
]
TOOL_CALL_DELTAS: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "index": 0,
                "id": "call_abc",
                "type": "function",
                "function": {"name": "lookup", "arguments": ""},
            }
        ],
    },
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"query": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"weather in'}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": ' Oslo"}'}}]},
]


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return query


class FakeOpenAI:
    """Answers Chat Completions with scripted deltas and records every request."""

    def __init__(self) -> None:
        self.base_url = ""
        self.deltas: list[dict[str, Any]] = TEXT_DELTAS
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        self.requests.append((request.path, dict(request.headers), body))
        if request.path != "/v1/chat/completions":
            return web.json_response({"error": {"message": "not found"}}, status=404)
        if not body.get("stream"):
            return web.json_response(self._completion(body["model"]))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in self._events(body):
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    def _events(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        finish = "tool_calls" if any("tool_calls" in d for d in self.deltas) else "stop"
        choices = [
            [{"index": 0, "delta": delta, "finish_reason": None}] for delta in self.deltas
        ] + [[{"index": 0, "delta": {}, "finish_reason": finish}]]
        events = [self._chunk(body["model"], choices=c) for c in choices]
        if body.get("stream_options", {}).get("include_usage"):
            events.append(self._chunk(body["model"], choices=[], usage=self._usage()))
        return events

    def _chunk(self, model: str, **fields: Any) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                "model": model, **fields}  # fmt: skip

    def _completion(self, model: str) -> dict[str, Any]:
        text = "".join(d.get("content") or "" for d in self.deltas)
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return {"id": "chatcmpl-2", "object": "chat.completion", "created": 0, "model": model,
                "choices": [choice], "usage": self._usage()}  # fmt: skip

    def _usage(self) -> dict[str, int]:
        return {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAI]:
    for name in ("NO_PROXY", "no_proxy"):  # a proxy configured on the host must not intercept
        monkeypatch.setenv(name, "127.0.0.1")
    fake = FakeOpenAI()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    yield fake
    await runner.cleanup()


def _settings(server: FakeOpenAI) -> Settings:
    return Settings(
        _env_file=None,
        openai_api_key=SecretStr("sk-test"),
        openai_base_url=server.base_url,
        model_chat="local-chat-model",
        model_max_retries=0,
    )


async def _stream(model: Any, prompt: str) -> tuple[list[AIMessageChunk], AIMessageChunk]:
    chunks = [chunk async for chunk in model.astream(prompt)]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    return chunks, merged


async def test_streams_tokens_over_chat_completions(server: FakeOpenAI) -> None:
    chunks, merged = await _stream(chat_model("chat", _settings(server)), "hello")
    tokens = [str(chunk.content) for chunk in chunks if chunk.content]
    assert tokens == ["Cairn ", "streams ", "tokens ", "from ", "Oslo."]
    assert merged.content == "Cairn streams tokens from Oslo."
    assert merged.usage_metadata is not None
    assert merged.usage_metadata["total_tokens"] == 12


async def test_assembles_a_streamed_tool_call(server: FakeOpenAI) -> None:
    server.deltas = TOOL_CALL_DELTAS
    model = chat_model("chat", _settings(server)).bind_tools([lookup])
    _, merged = await _stream(model, "What's the weather in Oslo?")
    assert [(c["name"], c["args"], c["id"]) for c in merged.tool_calls] == [
        ("lookup", {"query": "weather in Oslo"}, "call_abc")
    ]
    _, _, body = server.requests[-1]
    assert [t["function"]["name"] for t in body["tools"]] == ["lookup"]


async def test_request_is_a_streamed_chat_completion_for_the_role_model(
    server: FakeOpenAI,
) -> None:
    await _stream(chat_model("chat", _settings(server)), "hello")
    [(path, headers, body)] = server.requests
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "local-chat-model"
    assert body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "hello"}]


async def test_non_streaming_model_gets_one_json_completion(server: FakeOpenAI) -> None:
    reply = await chat_model("chat", _settings(server), streaming=False).ainvoke("hello")
    assert reply.content == "Cairn streams tokens from Oslo."
    [(path, _, body)] = server.requests
    assert path == "/v1/chat/completions"
    assert not body.get("stream")


# A hostile server: the same tool call in answer to every request ----------------------------


def same_call(name: str, arguments: str) -> list[dict[str, Any]]:
    call = {"index": 0, "id": "c1", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip
    return [{"role": "assistant", "content": None, "tool_calls": [call]}]


async def test_the_assistant_stops_a_server_that_always_calls_tools(server: FakeOpenAI) -> None:
    server.deltas = same_call("forget", '{"what": "everything"}')
    store = InMemoryStore()
    graph = build_assistant(
        checkpointer=InMemorySaver(), store=store, model=chat_model("chat", _settings(server))
    )

    done = await graph.ainvoke(
        {"messages": [HumanMessage("hello")]},
        {"configurable": {"thread_id": "t"}},
        context=Context(user_id="alice", thread_id="t"),
    )

    assert len(server.requests) == TOOL_CALL_BUDGET + 1
    assert done["messages"][-1].text == TOOL_BUDGET_SPENT
    assert await store.asearch(("memories",), limit=10) == []  # the user never asked to forget


async def test_research_stops_a_server_that_always_calls_tools(server: FakeOpenAI) -> None:
    server.deltas = same_call("write_todos", '{"todos": [{"content": "Seed vault opening date"}]}')
    settings = _settings(server)
    graph = build_research(
        checkpointer=InMemorySaver(),
        store=InMemoryStore(),
        model=chat_model("chat", settings),
        settings=settings,
    )
    config: Any = {"configurable": {"thread_id": "r"}, "recursion_limit": 200}
    context = Context(user_id="alice", thread_id="r", agent="research")

    await graph.ainvoke(
        {"messages": [HumanMessage("When did the vault open?")]}, config, context=context
    )
    done = await graph.ainvoke(Command(resume={"decision": "approve"}), config, context=context)

    assert len(server.requests) <= 1 + ORCHESTRATOR_MODEL_CALLS  # the plan, then one round
    assert done["report"] == ""
    assert done["messages"][-1].text.startswith("I could not verify any claim")
