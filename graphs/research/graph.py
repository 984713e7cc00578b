"""Research graph: write_plan -> review_plan (interrupt) -> research <-> check_citations/reopen_claims -> finalize."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from langchain_core.exceptions import ModelRefusalError, OutputParserException
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from graphs.core.context import Context
from graphs.core.nodes import bind, declare_subgraph, on_loop
from graphs.core.ratelimit import Bucket
from graphs.core.settings import Settings, get_settings
from graphs.memory.scoped import ScopedMemory
from graphs.memory.team_sources import ratings_for
from graphs.research.agents import (
    APPROVED_NOTES,
    Slots,
    SubagentSlots,
    build_orchestrator,
    build_researcher,
    shared_slots,
    usage_of,
)
from graphs.research.citations import NOTICES, check_report, normalise_text, remove_failing
from graphs.research.files import REPORT_PATH
from graphs.research.metrics import run_metrics
from graphs.research.prompts import CRITIC_PROMPT, PLANNER_PROMPT
from graphs.research.relevance import (
    Verdict,
    claims_block,
    judge,
    not_answered_report,
    off_topic,
    relevance_checked,
    relevant_passing,
    split_removed,
    unsupported_off_topic,
)
from graphs.research.state import State, Todo
from graphs.tools.fetch import Fetcher, make_fetch_tool
from graphs.tools.fetchlog import FetchLog, FetchRecord
from graphs.tools.search import (
    LocalCorpus,
    SearchProvider,
    make_search_tool,
)
from graphs.tools.web import web_tools

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.store.base import BaseStore

log = logging.getLogger("cairn.research")

MAX_TODOS = 8
MAX_PLAN_REJECTIONS = 2
MAX_CRITIC_FLAGS = 50
"""Critic flags read per round; more than a report has claims worth doubting is noise."""
TodoText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=3, max_length=200)]
"""Stripped before the length check: a topic of blanks is no topic."""


class PlanItem(BaseModel):
    content: TodoText = Field(description="One research topic, one short line.")
    status: Literal["pending", "in_progress", "completed"] = "pending"


class Plan(BaseModel):
    todos: list[PlanItem] = Field(min_length=1, max_length=MAX_TODOS)


class PlanDecision(BaseModel):
    """The user's answer to the plan review, as the UI sends it back."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "edit", "reject"]
    todos: list[TodoText] | None = Field(default=None, max_length=MAX_TODOS)
    """The edited topics (decision "edit" only)."""
    reason: Annotated[str, Field(max_length=500)] | None = None
    """Why the plan was rejected (decision "reject"); a reason asks for a new plan."""


class Flag(BaseModel):
    claim: str = Field(description="The flagged claim, exactly as it appears in the report.")
    reason: str = Field(description="One line: why its quote does not support it.")


class Critique(BaseModel):
    flags: list[Flag] = Field(
        default_factory=list, description="Claims whose quote does not support them."
    )
    verdicts: list[Verdict] = Field(
        default_factory=list,
        description="One verdict per numbered claim: does its passage answer the question?",
    )


@tool
def write_todos(todos: list[PlanItem]) -> str:
    """Record the research plan: one todo per independent topic, status "pending"."""
    return "Plan recorded."


@dataclass(frozen=True)
class Models:
    planner: BaseChatModel
    orchestrator: BaseChatModel
    researcher: BaseChatModel
    critic: BaseChatModel


@dataclass(frozen=True)
class ResearchTools:
    """The web tools of one graph: a search provider, the SSRF-safe fetcher and its fetch log."""

    search: SearchProvider
    fetcher: Fetcher
    limiter: Bucket | None = None
    """The search provider's rate limit (None: this process's bucket for it)."""
    slots: Slots | None = None
    """Caps on subagents running at once (None: counted in this process only)."""

    @property
    def fetch_log(self) -> FetchLog:
        return self.fetcher.log

    @property
    def searched(self) -> str:
        """Where searches went, as the report names it."""
        if isinstance(self.search, LocalCorpus):
            return f"the {self.search.name} corpus"
        return self.search.name


def default_tools(store: BaseStore | None, settings: Settings) -> ResearchTools:
    shared = web_tools(store, settings)
    return ResearchTools(
        search=shared.search,
        fetcher=shared.fetcher,
        limiter=shared.limiter,
        slots=shared_slots(store, settings.research_max_subagents),
    )


def research_models(settings: Settings) -> Models:
    from graphs.core.models import chat_model
    from graphs.research.offline import offline_research_model

    if settings.offline:
        offline = offline_research_model()
        return Models(offline, offline, offline, offline)
    return Models(
        planner=chat_model("planner", settings),
        orchestrator=chat_model("planner", settings),
        researcher=chat_model("researcher", settings),
        critic=chat_model("critic", settings),
    )


@dataclass(frozen=True)
class ResearchDeps:
    """What the research nodes need, bound once when the graph is built."""

    planner: Runnable[Any, Any]
    """The planning model, made to call write_todos."""
    orchestrator: CompiledStateGraph[Any, Any, Any, Any]
    """The deep agent that delegates todos to researcher subagents and writes the report."""
    critic: Runnable[Any, Any]
    """The critic model, answering with a Critique."""
    tools: ResearchTools
    settings: Settings

    @classmethod
    def of(cls, models: Models, tools: ResearchTools, settings: Settings) -> ResearchDeps:
        researcher = build_researcher(
            models.researcher,
            [make_search_tool(tools.search, tools.limiter), make_fetch_tool(tools.fetcher)],
            settings,
            tools.slots or SubagentSlots(settings.research_max_subagents),
        )
        return cls(
            planner=models.planner.bind_tools([write_todos], tool_choice="write_todos"),
            orchestrator=build_orchestrator(models.orchestrator, researcher),
            critic=models.critic.with_structured_output(Critique),
            tools=tools,
            settings=settings,
        )


def build_graph(
    *,
    checkpointer: BaseCheckpointSaver | None,
    store: BaseStore | None,
    model: BaseChatModel | None = None,
    tools: ResearchTools | None = None,
    settings: Settings | None = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    settings = settings or get_settings()
    models = Models(model, model, model, model) if model is not None else research_models(settings)
    deps = ResearchDeps.of(models, tools or default_tools(store, settings), settings)
    builder = StateGraph(State, context_schema=Context)
    builder.add_node(bind(write_plan, deps=deps))
    builder.add_node(
        on_loop(review_plan), destinations=("research", "write_plan", "review_plan", END)
    )
    builder.add_node(bind(research, deps=deps))
    builder.add_node(bind(check_citations, deps=deps))
    builder.add_node(on_loop(reopen_claims))
    builder.add_node(bind(finalize, deps=deps))
    builder.add_edge(START, "write_plan")
    builder.add_edge("write_plan", "review_plan")
    builder.add_edge("research", "check_citations")
    builder.add_conditional_edges("check_citations", on_loop(bind(route_after_check, deps=deps)))
    builder.add_edge("reopen_claims", "research")
    builder.add_edge("finalize", END)
    graph = builder.compile(checkpointer=checkpointer, store=store, name="research")
    return declare_subgraph(graph, "research", deps.orchestrator)


async def write_plan(state: State, *, deps: ResearchDeps) -> dict[str, Any]:
    """Turn the question into topics with write_todos. Cheap, and before the approval pause."""
    question = _latest_question(state)
    prompt = PLANNER_PROMPT
    if feedback := state.get("plan_feedback"):
        prompt += f"\nThe user rejected the previous plan: {feedback}\n"
    reply = await deps.planner.ainvoke([SystemMessage(prompt), HumanMessage(question)])
    return {
        "question": question,
        "todos": plan_from(reply, question),
        "files": {path: None for path in state.get("files") or {}},
        "critique_round": 0,
        "unsupported": [],
        "report": "",
        "not_verified": [],
        "off_topic": [],
        "answered": False,
        "metrics": {},
        "verifications": None,
        "usage": None,
        "started_at": 0.0,
    }


def review_plan(state: State) -> Command[Any]:
    """Pause for the user's Approve / Edit / Reject; nothing before interrupt() has effects."""
    answer = interrupt(
        {
            "kind": "review_plan",
            "question": state["question"],
            "todos": [t["content"] for t in state["todos"]],
        }
    )
    try:
        decision = PlanDecision.model_validate(answer)
    except ValidationError:
        return Command(goto="review_plan")  # ask again; a malformed answer changes nothing
    if decision.decision == "approve":
        return Command(goto="research")
    if decision.decision == "edit":
        if not decision.todos:
            return Command(goto="review_plan")
        todos: list[Todo] = [{"content": t.strip(), "status": "pending"} for t in decision.todos]
        return Command(goto="research", update={"todos": todos})
    rejections = state.get("plan_rejections", 0) + 1
    if decision.reason and rejections <= MAX_PLAN_REJECTIONS:
        update = {"plan_feedback": decision.reason, "plan_rejections": rejections}
        return Command(goto="write_plan", update=update)
    stop = AIMessage("Research cancelled: nothing was searched or fetched.")
    return Command(goto=END, update={"messages": [stop], "plan_rejections": rejections})


async def research(
    state: State, runtime: Runtime[Context], *, deps: ResearchDeps
) -> dict[str, Any]:
    """The orchestrator delegates each open todo to a research subagent and writes the report."""
    started = state.get("started_at") if state.get("critique_round") else time.time()
    task = research_task(state)
    before = dict(state.get("files") or {})
    inputs = {"messages": [HumanMessage(task)], "todos": state["todos"], "files": before}
    result: dict[str, Any] = {"messages": [], "files": before}
    timeout_s = deps.settings.research_run_timeout_s
    try:
        # Values are streamed so a run stopped by the time limit keeps what it wrote so far.
        async with asyncio.timeout(timeout_s):
            async for values in deps.orchestrator.astream(
                inputs, approved_config(state), stream_mode="values", context=runtime.context
            ):
                result = values
    except TimeoutError:
        log.warning("research round stopped at %ss", timeout_s)
    files = result.get("files") or {}
    return {
        "files": {p: d for p, d in files.items() if before.get(p) != d},
        "todos": [{**t, "status": "completed"} for t in state["todos"]],
        "usage": [*result.get("usage", []), usage_of("orchestrator", result["messages"])],
        "started_at": started,
    }


async def check_citations(
    state: State, runtime: Runtime[Context], *, deps: ResearchDeps
) -> dict[str, Any]:
    """The deterministic check plus the critic's reading; failures become `unsupported`."""
    report = file_text(state, REPORT_PATH)
    records = await deps.tools.fetch_log.for_thread(runtime.context.thread_id)
    result = check_report(report, records)
    reading = await critique(report, state, deps.critic, result)
    relevance = judge(result.claims, reading.verdicts if reading else None)
    unsupported = [f"{c.plain} — {c.reason}" for c in result.failing]
    flagged = flagged_lines(result, reading.flags if reading else [])
    unsupported += [f"{text} — critic: {why}" for text, why in flagged.values()]
    flagged_text = {text for text, _ in flagged.values()}
    unsupported += [
        u for u in unsupported_off_topic(relevance) if u.split(" — ")[0] not in flagged_text
    ]
    verification = {
        "round": state.get("critique_round", 0),
        "citations": len(result.citations),
        "passing": sum(c.passed for c in result.citations),
        "relevant_passing": relevant_passing(result, relevance),
        "relevance_checked": reading is not None,
        "relevance": relevance,
        "failing_claims": [c.plain for c in result.failing],
        "critic_flags": [text for text, _ in flagged.values()],
    }
    return {"unsupported": unsupported, "verifications": [verification]}


async def critique(
    report: str, state: State, critic: Runnable[Any, Any], result: Any
) -> Critique | None:
    """The critic's reading of the report against the notes and the question; None when its
    answer is unusable. An empty report has nothing to read: an empty reading."""
    if not report.strip():
        return Critique()
    try:
        answer = await critic.ainvoke(
            [SystemMessage(CRITIC_PROMPT), HumanMessage(critic_input(report, state, result))]
        )
        reading = Critique.model_validate(answer)
    except (ValidationError, OutputParserException, ModelRefusalError, ValueError) as exc:
        # Without the critic's reading the code's check of every citation against the fetch
        # log still decides what is true, and no claim counts as answering the question.
        log.warning("the critic's answer was unusable: %s", " ".join(str(exc).split())[:200])
        return None
    # Each flag is matched against every claim: a flood of them is cut, not worked through.
    return reading.model_copy(update={"flags": reading.flags[:MAX_CRITIC_FLAGS]})


def critic_input(report: str, state: State, result: Any) -> str:
    """What the critic reads: the question and its topics, the notes, the report and its
    claims numbered (a verdict names a number, so code matches it to exactly one claim)."""
    notes = "\n\n".join(
        f"<notes path={p!r}>\n{file_text(state, p)}\n</notes>"
        for p in sorted(state.get("files") or {})
        if p.startswith("/notes/")
    )
    topics = "\n".join(f"- {t['content']}" for t in state.get("todos") or [])
    return (
        f"<question>\n{state.get('question', '')}\n</question>\n\n<topics>\n{topics}\n</topics>"
        f"\n\n{notes}\n\n<report>\n{report}\n</report>\n\n"
        f"<claims>\n{claims_block(result.claims)}\n</claims>"
    )


def route_after_check(state: State, *, deps: ResearchDeps) -> Literal["reopen_claims", "finalize"]:
    if (
        state.get("unsupported")
        and state.get("critique_round", 0) < deps.settings.research_critique_rounds
    ):
        return "reopen_claims"
    return "finalize"


def reopen_claims(state: State) -> dict[str, Any]:
    """Each unsupported claim becomes a todo: re-research it with a source, or remove it."""
    new: list[Todo] = []
    # The critic's flags come from a model: however many there are, a round re-researches at
    # most a plan's worth, and finalize removes whatever still fails.
    for item in state["unsupported"][:MAX_TODOS]:
        claim, _, reason = item.rpartition(" — ")
        text = f"Re-research or remove ({reason[:60]}): {claim or item}"
        new.append({"content": text[:200], "status": "pending"})
    done = [t for t in state["todos"] if t["status"] == "completed"]
    return {"todos": done + new, "critique_round": state.get("critique_round", 0) + 1}


async def finalize(
    state: State, runtime: Runtime[Context], *, deps: ResearchDeps
) -> dict[str, Any]:
    """At the end (or the cap): remove what still fails, so the report has only checked claims."""
    report = file_text(state, REPORT_PATH)
    records = await deps.tools.fetch_log.for_thread(runtime.context.thread_id)
    result = check_report(report, records)
    verifications = state.get("verifications") or []
    last = verifications[-1] if verifications else None
    critic_flags = set(last["critic_flags"]) if last else set()
    flagged = {
        c.line: "critic: quote does not support the claim"
        for c in result.claims
        if c.plain in critic_flags
    }
    unanswering = {n: why for n, why in off_topic(result, last).items() if n not in flagged}
    removal = remove_failing(report, result, flagged={**unanswering, **flagged})
    checked = check_report(removal.report, records)
    if not checked.ok:  # removal drops every failing line, so this is a broken invariant
        msg = "a report with a failing citation would have been delivered"
        raise AssertionError(msg)
    not_verified, off = split_removed(removal, set(unanswering), verifications, checked)
    answered = bool(checked.claims)
    final = delivered_report(removal.report, state, records, deps, answered=answered, last=last)
    await remember_sources(result, records, runtime)
    metrics = run_metrics(state, removed=len(not_verified), off_topic=len(off), answered=answered)
    return {
        "report": final,
        "not_verified": not_verified,
        "off_topic": off,
        "answered": answered,
        # The thread's final_report.md is the checked one, or none: never the raw draft.
        "files": {REPORT_PATH: _file(final, state) if final else None},
        "metrics": metrics,
        "messages": final_messages(final, not_verified, off),
    }


def final_messages(final: str, not_verified: list[str], off: list[str]) -> list[AIMessage]:
    """The report (or why there is none), then what was removed from it and why, apart."""
    reply = final or "I could not verify any claim for this question, so there is no report."
    messages = [AIMessage(reply)]
    for items, heading in (
        (not_verified, "Not verified (removed from the report)"),
        (off, "Not about the question (removed from the report)"),
    ):
        if items:
            listing = "\n".join(f"- {item}" for item in items)
            messages.append(AIMessage(f"{heading}:\n{listing}"))
    return messages


def delivered_report(
    checked: str,
    state: State,
    records: list[FetchRecord],
    deps: ResearchDeps,
    *,
    answered: bool,
    last: Any,
) -> str:
    """The checked report when a claim answers the question. When none does but a draft was
    written, the honest report: it says so first and lists what was searched. No draft (the
    round stopped before it): no report."""
    if answered:
        lines = [ln for ln in checked.splitlines() if ln.strip() not in NOTICES]
        return "\n".join(lines).strip() + "\n"
    if not file_text(state, REPORT_PATH).strip():
        return ""
    return not_answered_report(
        state.get("question", ""),
        state.get("todos") or [],
        records,
        deps.tools.searched,
        checked=relevance_checked(last),
    )


async def remember_sources(
    result: Any, records: list[FetchRecord], runtime: Runtime[Context]
) -> None:
    """After the check: how each source this thread fetched held up, for later research, in
    the conversation's workspace's source memory (a team's, or the user's own). A user who
    turned their memory off has nothing recorded from their runs, in either."""
    context = runtime.context
    if runtime.store is None or context is None or not context.memory:
        return
    if not (await ScopedMemory(runtime.store, context.user_id).settings()).enabled:
        return
    memory = ratings_for(runtime.store, context)
    await memory.record_check(result, records, thread_id=context.thread_id)


def plan_from(reply: Any, question: str) -> list[Todo]:
    """The planner's write_todos call, validated; a missing or invalid plan is the question itself."""
    for call in getattr(reply, "tool_calls", None) or []:
        if call["name"] != "write_todos":
            continue
        try:
            plan = Plan.model_validate(call["args"])
        except ValidationError:
            continue
        return [{"content": item.content.strip(), "status": "pending"} for item in plan.todos]
    return [{"content": question[:200] or "The question", "status": "pending"}]


def research_task(state: State) -> str:
    """The orchestrator's instructions for this round: the open todos and any claims to fix."""
    open_todos = [t for t in state["todos"] if t["status"] != "completed"]
    lines = [f"Question: {state['question']}", "", "Approved todos:"]
    lines += [
        f"{i}. {t['content']} (notes/{slug(t['content'])}.md)" for i, t in enumerate(open_todos, 1)
    ]
    if state.get("unsupported"):
        lines += ["", "Unsupported claims in final_report.md (re-research or remove each):"]
        lines += [f"- {claim}" for claim in state["unsupported"][:MAX_TODOS]]
    return "\n".join(lines)


def approved_config(state: State) -> RunnableConfig:
    """The round's approved topics, for the subagent to refuse a task that names none of them."""
    open_todos = [t for t in state["todos"] if t["status"] != "completed"]
    return {"configurable": {APPROVED_NOTES: [slug(t["content"]) for t in open_todos]}}


def slug(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words[:6])[:60] or "topic"


def file_text(state: State, path: str) -> str:
    data = (state.get("files") or {}).get(path)
    if not data:
        return ""
    content = data.get("content", "")
    return "\n".join(content) if isinstance(content, list) else str(content)


def flagged_lines(result: Any, flags: list[Flag]) -> dict[int, tuple[str, str]]:
    """Critic flags matched to real claim lines; flags naming no claim of the report are dropped."""
    found: dict[int, tuple[str, str]] = {}
    for flag in flags:
        wanted = normalise_text(flag.claim)
        if len(wanted) < 10:
            continue
        for claim in result.claims:
            if claim.passed and wanted in normalise_text(claim.plain):
                found[claim.line] = (claim.plain, flag.reason[:200])
    return found


def _file(content: str, state: State) -> dict[str, Any]:
    from deepagents.backends.utils import create_file_data

    old = (state.get("files") or {}).get(REPORT_PATH) or {}
    return dict(create_file_data(content, created_at=old.get("created_at")))


def _latest_question(state: State) -> str:
    for message in reversed(state.get("messages") or []):
        if isinstance(message, HumanMessage):
            return str(message.text).strip()
    return ""
