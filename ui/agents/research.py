"""Research: deep research whose report's citations are checked against fetched pages (graphs/research/)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import PlainTextResponse
from langchain_core.messages import HumanMessage
from pydantic import BaseModel, Field, ValidationError

from auth.identity import CurrentUserId
from graphs.research.citations import CITATION, claim_lines
from graphs.research.graph import MAX_TODOS, PlanDecision, build_graph
from graphs.tools.search import LocalCorpus
from ui.output_guard import sanitise_report
from ui.runner import AgentSpec, AnswerRejected, InterruptKind, McpTool, Starter

if TYPE_CHECKING:
    from graphs.core.settings import Settings
    from graphs.core.usage import RunUsage
    from ui.runner import Ask


RECURSION_LIMIT = 200
"""Steps of the Research graph's own phases (plan, approval, research rounds, citation checks,
critique). The orchestrator and its subagents run as graphs inside the research node with
their own step limits; what bounds them is time (settings `research_run_timeout_s` for a
round, `research_subagent_timeout_s` for each subagent) and each subagent's tool-call and token
budgets (`research_subagent_tool_calls`, `research_subagent_tokens`)."""


EDIT_TIMEOUT_S = 600


class EditedTopics(BaseModel):
    todos: list[str] = Field(min_length=1, max_length=MAX_TODOS)


def parse_topics(text: str) -> list[str]:
    """One topic per line (list markers allowed); empty lines dropped."""
    topics = [re.sub(r"^\s*(?:[-*+]|\d+[.)])\s*", "", line).strip() for line in text.splitlines()]
    return [t for t in topics if t]


async def plan_answer(decision: str, _value: dict[str, Any], ask: Ask) -> dict[str, Any]:
    """Approve and Reject as they are; Edit first asks for the topics, checked like the plan."""
    answer: dict[str, Any] = {"decision": decision}
    if decision != "edit":
        return answer
    topics = parse_topics(
        await ask("Send the topics to research, one per line.", EDIT_TIMEOUT_S) or ""
    )
    try:
        answer["todos"] = EditedTopics(todos=topics).todos
        PlanDecision.model_validate(answer)
    except ValidationError:
        msg = (
            f"Topics need 1 to {MAX_TODOS} lines of 3 to 200 characters. The plan is unchanged; "
            "press Edit topics again."
        )
        raise AnswerRejected(msg) from None
    return answer


CORPUS_LINK = re.compile(r"\]\(corpus://([a-z0-9_-]+)/([A-Za-z0-9._-]+)\)")


CORPUS_ROUTE = "/research/corpus"


def served_links(report: str, base_url: str) -> str:
    """The user's copy of a checked report: corpus:// sources as links to where the app serves them."""
    return CORPUS_LINK.sub(lambda m: f"]({base_url}{CORPUS_ROUTE}/{m[1]}/{m[2]})", report)


def cited_urls(report: str) -> list[str]:
    """URLs cited on the checked report's claim lines: each one was fetched by this thread."""
    return list(
        dict.fromkeys(m["url"] for _, line in claim_lines(report) for m in CITATION.finditer(line))
    )


def corpus_router(settings: Settings) -> APIRouter:
    """Signed-in users can open the local corpus documents that research reports cite."""
    corpus = LocalCorpus(settings.research_corpus_dir)
    router = APIRouter()

    @router.get(f"{CORPUS_ROUTE}/{{name}}/{{filename}}", response_class=PlainTextResponse)
    async def corpus_document(
        name: str, filename: str, user_id: CurrentUserId
    ) -> PlainTextResponse:
        try:
            _title, text = await corpus.open(f"corpus://{name}/{filename}")
        except LookupError:
            raise HTTPException(status_code=404, detail="No such document") from None
        return PlainTextResponse(text)

    return router


def research_result(values: dict[str, Any], public_url: str) -> dict[str, Any]:
    """The checked report with its citations as links the caller can open, and the claims
    removed because no fetched page supports them."""
    report = served_links(str(values.get("report") or ""), public_url)
    cited = cited_urls(report)
    report = sanitise_report(report, cited)
    citations = [
        {"quote": m["quote"], "url": m["url"]}
        for _, line in claim_lines(report)
        for m in CITATION.finditer(line)
    ]
    return {
        "report": report,
        "citations": citations,
        "sources": cited,
        "not_verified": list(values.get("not_verified") or []),
        "off_topic": list(values.get("off_topic") or []),
        "answered": bool(values.get("answered", True)),
    }


def mcp_result(values: dict[str, Any], public_url: str) -> dict[str, Any] | None:
    """A finished run over MCP: the reply is the checked report, with its citations."""
    if not values.get("report"):
        return None
    result = research_result(values, public_url)
    return {"reply": result["report"], **result}


def describe_plan_review(value: dict[str, Any]) -> dict[str, Any]:
    return {
        "question": value.get("question"),
        "topics": value.get("todos", []),
        "edit": "the topics to research, one per line",
    }


def research_signals(values: dict[str, Any], usage: RunUsage) -> dict[str, float]:
    """The first draft's citations, checked and passing, when this run wrote the report."""
    if not usage.nodes["finalize"]:
        return {}
    figures = values.get("metrics") or {}
    return {
        "reports": 1,
        "citations_checked": int(figures.get("citations_first_draft", 0)),
        "citations_passed": int(figures.get("citations_passing_first_draft", 0)),
        "claims_removed": int(figures.get("claims_removed", 0)),
    }


SPEC = AgentSpec(
    key="research",
    profile="Research",
    description="Deep research with sources you can check: you approve the topics, every "
    "citation in the report is checked against a page Cairn actually fetched.",
    build=build_graph,
    inputs=lambda text, message_id: {"messages": [HumanMessage(text, id=message_id)]},
    interrupts=(
        InterruptKind(
            name="review_plan",
            decisions=frozenset({"approve", "edit", "reject"}),
            resume_value=plan_answer,
            describe=describe_plan_review,
            reviewable=True,
        ),
    ),
    subgraphs=True,
    recursion_limit=lambda: RECURSION_LIMIT,
    reply_text=lambda values: str(values.get("report") or "") or None,
    signals=research_signals,
    order=10,
    # The bundled sample corpus covers honeybees and seed banks only (README, Research).
    starters=(
        Starter(label="The waggle dance", message="How do honeybees use the waggle dance?"),
        Starter(label="Colony collapse", message="What causes honeybee colony collapse disorder?"),
        Starter(
            label="The Svalbard seed vault",
            message="How is the Svalbard Global Seed Vault kept cold?",
        ),
    ),
    mcp=McpTool(
        name="research",
        title="Research a question",
        description=(
            "Research a question. The run first pauses with the proposed topics (status\n"
            "'paused'); approve, edit or reject them with answer_approval. The finished report\n"
            "comes back with its citations, each checked against a page Cairn fetched, and a\n"
            "list of claims removed as not verified."
        ),
        summary="answers a question with a report whose citations were checked against "
        "fetched pages",
        text_arg="question",
        pauses=True,
        result=mcp_result,
    ),
    routes=corpus_router,
)
