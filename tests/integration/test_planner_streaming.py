"""The replanner's answer streams: ChatOpenAI's structured-output tokens reach the UI's parser."""

from __future__ import annotations

import json
from typing import Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph

from graphs.core.models import chat_model
from graphs.planner.graph import structured
from graphs.planner.state import Act, Response
from tests.integration.test_openai_client import FakeOpenAI, _settings, server  # noqa: F401
from ui.chainlit.agents.planner import AnswerStream

pytestmark = pytest.mark.integration

ANSWER = "EMEA had the most churned customers (212) in 2026-Q3."


class S(TypedDict, total=False):
    answer: str


# langchain-openai keeps the parsed pydantic object in a field typed None while streaming
# structured output; pydantic warns when that message is serialised. Not our code.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_the_answer_streams_token_by_token_from_the_replan_node(server: FakeOpenAI):  # noqa: F811
    body = json.dumps({"action": {"response": ANSWER}})
    server.deltas = [{"role": "assistant", "content": ""}] + [
        {"content": body[i : i + 7]} for i in range(0, len(body), 7)
    ]
    model = chat_model("planner", _settings(server))

    async def replan(state: S) -> dict[str, Any]:
        act = await structured(model, Act, [("user", "decide")])
        assert isinstance(act.action, Response)
        return {"answer": act.action.response}

    graph = StateGraph(S)
    graph.add_node("replan", replan)
    graph.add_edge(START, "replan")
    stream = AnswerStream()
    pieces = []
    async for token, meta in graph.compile().astream({}, stream_mode="messages"):
        if meta["langgraph_node"] == "replan":
            pieces.append(stream.feed(token.id, str(token.content)))
    assert "".join(pieces) == ANSWER
    assert len([p for p in pieces if p]) > 3  # it arrived in pieces, not at the end
