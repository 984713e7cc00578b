"""A fourth agent declared in one spec gets its MCP tool, its approvals and results shown to
callers, and a token scope, with no change to the MCP server or the token code."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
from langgraph.types import Interrupt

from auth.tokens import AccessTokens
from auth.workspaces import OWNER, Membership, personal_id
from graphs.core.settings import Settings
from tests.unit.test_mcp_server import endpoint as mcp_endpoint
from tests.unit.test_mcp_server import token
from ui.agents import AGENTS
from ui.mcp_server import Call, McpEndpoint, McpSurface, approval, instructions, token_scopes
from ui.runner import AgentSpec, InterruptKind, McpTool, RunOutcome
from ui.tokens_page import build_router


async def _no_render(_interrupt: Any, _thread_id: str) -> None:
    return None


SUMMARY = AgentSpec(
    key="summary",
    profile="Summary",
    description="Summarises a text after you approve its outline.",
    build=lambda **_: None,
    inputs=lambda text, _message_id: {"text": text},
    interrupts=(
        InterruptKind(
            name="review_outline",
            decisions=frozenset({"approve", "reject"}),
            describe=lambda value: {"outline": value.get("outline")},
        ),
    ),
    order=30,
    mcp=McpTool(
        name="summarise",
        title="Summarise a text",
        description="Summarise a text. The run pauses with an outline for answer_approval.",
        summary="summarises a text",
        text_arg="text",
        temporary=True,
        pauses=True,
        result=lambda values, public_url: {"summary": values.get("summary"), "at": public_url},
    ),
)
WITH_SUMMARY = (*AGENTS, SUMMARY)


def endpoint(agents: tuple[AgentSpec, ...]) -> McpEndpoint:
    return mcp_endpoint(agents=agents)  # type: ignore[no-any-return]


async def test_a_fourth_agent_gets_its_tool_with_its_own_arguments() -> None:
    tools = {t.name: t for t in await endpoint(WITH_SUMMARY).server.list_tools()}
    assert list(tools) == [
        "ask_assistant",
        "research",
        "run_planner",
        "summarise",
        "answer_approval",
    ]
    summarise = tools["summarise"]
    assert summarise.title == "Summarise a text"
    assert summarise.description == SUMMARY.mcp.description  # type: ignore[union-attr]
    schema = summarise.inputSchema
    assert list(schema["properties"]) == ["text", "thread_id", "temporary"]
    assert schema["required"] == ["text"]
    assert "summarise" not in {t.name for t in await endpoint(AGENTS).server.list_tools()}


async def test_answer_approval_names_the_agents_that_ask_and_takes_their_decisions() -> None:
    skipping = replace(
        SUMMARY,
        interrupts=(replace(SUMMARY.interrupts[0], decisions=frozenset({"approve", "skip"})),),
    )
    tools = {t.name: t for t in await endpoint((*AGENTS, skipping)).server.list_tools()}
    answer = tools["answer_approval"]
    assert answer.description is not None
    assert "Assistant, Research, Planner or Summary run" in answer.description
    assert not re.search(r"\bplans?\b|topics", answer.description)
    decision = answer.inputSchema["properties"]["decision"]
    assert decision["enum"] == ["approve", "confirm", "edit", "reject", "skip"]
    assert answer.inputSchema["required"] == ["thread_id", "decision"]


async def test_without_an_agent_that_asks_there_is_nothing_to_answer() -> None:
    chat_only = tuple(replace(spec, interrupts=()) for spec in AGENTS)
    tools = {t.name for t in await endpoint(chat_only).server.list_tools()}
    assert "answer_approval" not in tools
    assert "ask_assistant" in tools


def test_the_server_instructions_name_it() -> None:
    text = instructions(WITH_SUMMARY)
    assert "summarise summarises a text" in text
    assert "Research, Planner and Summary runs pause for approval" in text


async def test_its_tool_starts_a_run_of_that_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    mcp = endpoint(WITH_SUMMARY)
    started: list[tuple[Any, ...]] = []

    async def new_turn(
        _ctx: Any, agent: AgentSpec, text: str, thread_id: str | None, **options: bool
    ) -> dict[str, Any]:
        started.append((agent.key, text, thread_id, options))
        return {"status": "done"}

    monkeypatch.setattr(mcp, "_new_turn", new_turn)
    await mcp.server.call_tool("summarise", {"text": "a long text", "temporary": True})
    assert started == [("summary", "a long text", None, {"temporary": True, "pre_approve": False})]


def test_its_approvals_and_results_are_shown_as_it_declares() -> None:
    pending = Interrupt(value={"kind": "review_outline", "outline": ["intro"]}, id="i-9")
    assert approval(pending, SUMMARY) == {
        "interrupt_id": "i-9",
        "kind": "review_outline",
        "decisions": ["approve", "reject"],
        "outline": ["intro"],
    }
    surface = McpSurface()
    surface.values = {"summary": "short"}
    call = Call(token(), "summarise", "thread-1")
    result = endpoint(WITH_SUMMARY)._result(
        call, SUMMARY, RunOutcome("done", reply="short"), surface
    )
    assert result["agent"] == "summary"
    assert result["summary"] == "short"
    assert result["at"] == "http://localhost:8000"


def test_it_is_a_token_scope_labelled_with_its_profile() -> None:
    scopes = token_scopes(WITH_SUMMARY)
    assert scopes == {
        "assistant": "Assistant",
        "research": "Research",
        "planner": "Planner",
        "summary": "Summary",
    }
    tokens = AccessTokens(None, scopes=scopes)  # type: ignore[arg-type]
    assert tokens.checked_scopes(["summary", "planner"]) == {"summary", "planner"}
    with pytest.raises(ValueError, match=r"scopes must be some of assistant, research, planner$"):
        AccessTokens(None, scopes=token_scopes(AGENTS)).checked_scopes(["summary"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scopes must be"):
        tokens.checked_scopes([])


def test_an_agent_without_a_tool_is_chat_only() -> None:
    chat_only = replace(SUMMARY, key="notes", profile="Notes", mcp=None)
    assert "notes" not in token_scopes((*AGENTS, chat_only))
    assert "notes" not in instructions((*AGENTS, chat_only))


class FakeWorkspaces:
    """Every user in their personal workspace (auth/workspaces.py keeps them in Postgres)."""

    async def active(self, user_id: str) -> Membership:
        return Membership(personal_id(user_id), "Personal", OWNER, personal=True, user_id=user_id)


class FakeRuntime:
    settings = Settings()
    public_url = "http://localhost:8000"
    tokens = AccessTokens(None, scopes=token_scopes(WITH_SUMMARY))  # type: ignore[arg-type]
    workspaces = FakeWorkspaces()


async def _no_tokens(_user_id: str) -> list[Any]:
    return []


def test_the_tokens_page_offers_each_scope_and_refuses_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from auth import identity
    from ui import memory_page
    from ui.runtime import current_runtime

    monkeypatch.setattr(FakeRuntime.tokens, "owned", _no_tokens)
    app = FastAPI()
    app.include_router(build_router(WITH_SUMMARY))
    app.dependency_overrides[identity._current_user_id] = lambda: "alice"
    app.dependency_overrides[current_runtime] = FakeRuntime
    app.dependency_overrides[memory_page.same_origin] = lambda: None
    client = TestClient(app)
    overview = client.get("/api/tokens").json()
    shown = overview["agents"]
    assert shown[-1] == {"scope": "summary", "label": "Summary"}
    assert overview["workspace"]["personal"] is True  # where a token made now would act
    refused = client.post("/api/tokens", json={"name": "t", "scopes": ["payroll"]})
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("scopes must be some of")


def _tokens_page(agents: tuple[AgentSpec, ...], monkeypatch: pytest.MonkeyPatch) -> Any:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from auth import identity
    from ui.runtime import current_runtime

    monkeypatch.setattr(FakeRuntime.tokens, "owned", _no_tokens)
    app = FastAPI()
    app.include_router(build_router(agents))
    app.dependency_overrides[identity._current_user_id] = lambda: "alice"
    app.dependency_overrides[current_runtime] = FakeRuntime
    return TestClient(app)


def test_the_pre_approval_switch_names_the_agents_that_offer_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _tokens_page(WITH_SUMMARY, monkeypatch).get("/api/tokens").json()["pre_approvable"] == [
        "Planner"
    ]
    low_risk = replace(SUMMARY.mcp, pre_approve=lambda _value, _calls: None)  # type: ignore[type-var]
    offering = (*AGENTS, replace(SUMMARY, mcp=low_risk))
    assert _tokens_page(offering, monkeypatch).get("/api/tokens").json()["pre_approvable"] == [
        "Planner",
        "Summary",
    ]
    page = _tokens_page(offering, monkeypatch).get("/tokens").text
    for agent in AGENTS:
        assert agent.profile not in page
    assert "plans" not in page.lower()
