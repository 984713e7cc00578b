"""The MCP endpoint's pieces without a server: what may be pre-approved, how a pause and a
research report are shown to a caller, and the per-run model-call budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableLambda
from langgraph.types import Interrupt
from pydantic import BaseModel

from auth.tokens import TokenInfo, TokenLimits
from graphs.core.offline import OfflineChatModel
from ui.agents import AGENTS
from ui.agents.planner import low_risk
from ui.agents.research import research_result
from ui.mcp_server import BudgetExceeded, ModelCallBudget, approval, counted

PLANNER = next(a for a in AGENTS if a.key == "planner")
RESEARCH = next(a for a in AGENTS if a.key == "research")


def token(max_model_calls: int = 30) -> TokenInfo:
    now = datetime.now(UTC)
    return TokenInfo(
        id="tok_1",
        user_id="alice",
        name="t",
        hint="abcd",
        scopes=frozenset({"planner"}),
        pre_approve=True,
        limits=TokenLimits(max_concurrent=1, max_runs_per_hour=1, max_model_calls=max_model_calls),
        created_at=now,
        expires_at=now + timedelta(days=1),
        last_used_at=None,
        revoked_at=None,
    )


def review(**changes: Any) -> dict[str, Any]:
    value = {
        "kind": "planner_review",
        "goal": "churn by region",
        "plan": ["Count churn by region"],
        "completed": [],
        "replanned": False,
        "step_budget": 6,
        "estimated_model_calls": 5,
        "edits_left": 3,
    }
    return {**value, **changes}


def test_a_first_plan_within_both_budgets_is_low_risk() -> None:
    assert low_risk(review(), token().limits.max_model_calls) is None


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"kind": "review_plan"}, "only Planner"),
        ({"replanned": True}, "a person must review"),
        ({"completed": ["Describe the tables"]}, "a person must review"),
        ({"error": "That edit was not accepted"}, "problem"),
        ({"plan": []}, "empty"),
        ({"plan": ["a"] * 7}, "longer than the step budget"),
        ({"estimated_model_calls": 31}, "model calls"),
    ],
)
def test_anything_else_needs_a_person(changes: dict[str, Any], why: str) -> None:
    reason = low_risk(review(**changes), token().limits.max_model_calls)
    assert reason is not None
    assert why in reason


def test_a_paused_plan_is_shown_with_how_to_answer_it() -> None:
    shown = approval(Interrupt(value=review(), id="i-1"), PLANNER)
    assert shown["interrupt_id"] == "i-1"
    assert shown["plan"] == ["Count churn by region"]
    assert shown["decisions"] == ["approve", "edit", "reject"]
    topics = approval(
        Interrupt(value={"kind": "review_plan", "question": "q", "todos": ["a", "b"]}, id="i-2"),
        RESEARCH,
    )
    assert topics["topics"] == ["a", "b"]
    assert "one per line" in topics["edit"]


def test_a_research_result_keeps_its_citations_and_the_not_verified_list() -> None:
    quote = "The vault opened on 26 February 2008 in Svalbard"
    report = f'# Seeds\n\nThe vault opened in 2008 ["{quote}"](corpus://seeds/vault.md).\n'
    result = research_result(
        {"report": report, "not_verified": ["Bees vote by dancing"]}, "https://cairn.example"
    )
    url = "https://cairn.example/research/corpus/seeds/vault.md"
    assert result["citations"] == [{"quote": quote, "url": url}]
    assert f"]({url})" in result["report"]
    assert result["sources"] == [url]
    assert result["not_verified"] == ["Bees vote by dancing"]


class Answer(BaseModel):
    text: str


async def test_the_budget_counts_every_model_call_in_the_run_and_stops_past_it() -> None:
    model = OfflineChatModel()

    async def node(_: Any) -> Any:  # a graph node calling the model twice, one structured
        await model.ainvoke([HumanMessage("hi")])
        return await model.with_structured_output(Answer).ainvoke([HumanMessage("hi")])

    budget = ModelCallBudget(2)
    with counted(budget):
        await RunnableLambda(node).ainvoke({})
        assert budget.calls == 2
        assert not budget.exceeded
        with pytest.raises(BudgetExceeded):
            await RunnableLambda(node).ainvoke({})
    assert budget.exceeded
    # Outside an MCP call nothing is counted.
    await RunnableLambda(node).ainvoke({})
    assert budget.calls == 3


class FakeTokens:
    """The token store's call log, in memory (the real one is tested on Postgres)."""

    def __init__(self) -> None:
        self.finished: list[str] = []

    async def begin_call(self, token: TokenInfo, tool: str, thread_id: str | None, **_: Any) -> int:
        return 1

    async def finish_call(self, call_id: int, *, status: str, **_: Any) -> None:
        self.finished.append(status)


class FakeContext:
    def __init__(self) -> None:
        self.said: list[str] = []

    async def info(self, text: str) -> None:
        self.said.append(text)


def endpoint(tokens: FakeTokens | None = None, *, agents: Any = AGENTS) -> Any:
    from graphs.core.settings import Settings
    from ui.mcp_server import McpEndpoint

    return McpEndpoint(
        settings=Settings(),
        public_url="http://localhost:8000",
        pool=None,  # type: ignore[arg-type]
        agents=agents,
        runner=lambda: None,  # type: ignore[arg-type,return-value]
        tokens=lambda: tokens,  # type: ignore[arg-type,return-value]
        chat=lambda: None,  # type: ignore[arg-type,return-value]
    )


async def test_a_run_outlives_a_caller_that_went_away_and_is_still_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from ui import mcp_server
    from ui.runner import RunOutcome

    monkeypatch.setattr(mcp_server, "KEEP_ALIVE_S", 0.01)
    tokens, ctx, release = FakeTokens(), FakeContext(), asyncio.Event()
    mcp = endpoint(tokens)

    async def run(_surface: Any) -> RunOutcome:
        await release.wait()
        return RunOutcome("done")

    call = mcp_server.Call(token(), "ask_assistant", "thread-1")
    caller = asyncio.create_task(mcp._tracked(ctx, call, PLANNER, run))
    while len(ctx.said) < 2:  # the caller hears that the run is still going
        await asyncio.sleep(0.01)
    assert "still running" in ctx.said[0]
    caller.cancel()  # the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await caller
    said = len(ctx.said)
    release.set()
    while not tokens.finished:
        await asyncio.sleep(0.01)
    assert tokens.finished == ["done"]  # the run finished and was logged
    await asyncio.sleep(0.05)
    assert len(ctx.said) == said  # nobody is told any more
