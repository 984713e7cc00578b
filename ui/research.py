"""The Research profile in the chat: plan review buttons, a live task list, subagent steps, the checked report."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import chainlit as cl
from chainlit.auth import get_current_user
from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import PlainTextResponse
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graphs.research.agents import refusal_reason, task_refusal
from graphs.research.citations import CITATION, claim_lines
from graphs.research.graph import MAX_TODOS, PlanDecision, slug
from graphs.tools.search import LocalCorpus
from ui.output_guard import TRUSTED_LINKS_KEY, sanitise_report
from ui.report_pdf import report_pdf
from ui.streaming import TurnResult

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from langchain_core.runnables import RunnableConfig
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.types import Durability

    from graphs.core.context import Context
    from graphs.core.settings import Settings

PLAN_ACTION = "research_plan"
RECURSION_LIMIT = 200
"""Outer phases plus the orchestrator's and subagents' own loops, which inherit the limit."""
EDIT_TIMEOUT_S = 600
CHECK_STEP = "Checking citations"


def _status(status: str) -> cl.TaskStatus:
    return {
        "completed": cl.TaskStatus.DONE,
        "in_progress": cl.TaskStatus.RUNNING,
    }.get(status, cl.TaskStatus.READY)


HIDDEN_TASK = "Refused: a research task"


def _topic(description: str) -> str:
    return description.removeprefix("Research: ").split(". Write notes to")[0][:80]


class PlanReviewPayload(BaseModel):
    """A plan-review button: which paused run of the session's thread, and what the user chose."""

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    interrupt_id: str
    decision: Literal["approve", "edit", "reject"]


class ResearchView:
    """What one research turn shows: the task list, one step per subagent, the report."""

    def __init__(self) -> None:
        self.tasks = cl.TaskList(status="Researching")
        self.by_slug: dict[str, cl.Task] = {}
        self.steps: dict[str, cl.Step] = {}
        self.descriptions: dict[str, str] = {}
        self.sent = False

    async def set_todos(self, todos: list[dict[str, Any]]) -> None:
        for todo in todos:
            key = slug(todo["content"])
            if key not in self.by_slug:
                task = cl.Task(title=todo["content"], status=_status(todo["status"]))
                self.by_slug[key] = task
                await self.tasks.add_task(task)
            elif todo["status"] == "completed":
                self.by_slug[key].status = cl.TaskStatus.DONE
        await self._show()

    async def task_started(self, call: dict[str, Any]) -> None:
        description = str(call["args"].get("description", ""))
        step = cl.Step(name=f"Researching: {_topic(description)}", type="tool", default_open=False)
        step.input = description
        if task_refusal(description, None) is not None:
            # Hostile or oversized text is never echoed, not even as the step's title.
            step.name, step.input = HIDDEN_TASK, ""
        await step.send()
        self.steps[call["id"]] = step
        self.descriptions[call["id"]] = description
        if (task := self._task_for(description)) is not None:
            task.status = cl.TaskStatus.RUNNING
            await self._show()

    async def task_finished(self, message: ToolMessage, files: dict[str, Any]) -> None:
        step = self.steps.pop(message.tool_call_id, None)
        description = self.descriptions.pop(message.tool_call_id, "")
        if step is None:
            return
        if (why := refusal_reason(str(message.text))) is not None:
            await self._refused(step, description, why)
            return
        notes = {p: d for p, d in files.items() if p.startswith("/notes/")}
        findings = sum(str(d.get("content", "")).count("## Finding") for d in notes.values())
        sources = {
            url
            for d in notes.values()
            for url in re.findall(r"^- source_url: (\S+)$", str(d.get("content", "")), re.M)
        }
        step.output = (
            f"Fetched {len(sources)} source(s), wrote {findings} finding(s).\n\n{message.text}"
        )
        await step.update()
        if (task := self._task_for(str(step.input))) is not None:
            task.status = cl.TaskStatus.DONE
            await self._show()

    async def _refused(self, step: cl.Step, description: str, why: str) -> None:
        """A task code refused: shown as refused, with why, never as research that ran."""
        if step.name != HIDDEN_TASK:
            step.name = f"Refused: {_topic(description)}"
        step.output = f"Not run: {why}"
        step.is_error = True
        await step.update()
        if (task := self._task_for(description)) is not None:
            task.status = cl.TaskStatus.FAILED
            await self._show()

    def _task_for(self, description: str) -> cl.Task | None:
        match = re.search(r"notes/([a-z0-9_-]+)\.md", description)
        return self.by_slug.get(match[1]) if match else None

    async def _show(self) -> None:
        if self.sent:
            await self.tasks.update()
        else:
            await self.tasks.send()
            self.sent = True

    async def finish(self, failed: bool) -> None:
        self.tasks.status = "Failed" if failed else "Done"
        for step in self.steps.values():
            step.is_error = True
            step.output = "stopped"
            await step.update()
        if self.sent:
            await self.tasks.update()


async def run_research_turn(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    inputs: dict[str, Any] | Command[Any] | None,
    *,
    context: Context,
    reply_node: str = "finalize",
    recursion_limit: int = RECURSION_LIMIT,
    durability: Durability = "async",
) -> TurnResult:
    """Stream a research run's updates (subgraphs included) into the task list and steps."""
    config: RunnableConfig = {
        "configurable": {"thread_id": context.thread_id},
        "recursion_limit": max(recursion_limit, RECURSION_LIMIT),
    }
    view = ResearchView()
    stream = graph.astream(
        inputs,
        config,
        context=context,
        stream_mode="updates",
        subgraphs=True,
        durability=durability,
    )
    failed = True
    try:
        async for namespace, update in cast("AsyncIterator[tuple[tuple[str, ...], Any]]", stream):
            for node, delta in (update or {}).items():
                await _show_update(view, namespace, node, delta)
        failed = False
    finally:
        await view.finish(failed)
    state = await graph.aget_state(config)
    reply = None
    if not state.next and state.values.get("report") is not None:
        reply = await deliver(state.values)
    return TurnResult(reply=reply, interrupts=list(state.interrupts))


async def _show_update(
    view: ResearchView, namespace: tuple[str, ...], node: str, delta: Any
) -> None:
    if not isinstance(delta, dict):
        return
    if not namespace:
        if "todos" in delta and node in ("research", "reopen_claims"):
            await view.set_todos(delta["todos"])
        if node == "check_citations" and delta.get("verifications"):
            await _show_check(delta["verifications"][-1])
        return
    if namespace[0].startswith("research:") and len(namespace) == 1:
        for message in _messages(delta):
            if isinstance(message, AIMessage):
                for call in message.tool_calls:
                    if call["name"] == "task":
                        await view.task_started(cast("dict[str, Any]", call))
            elif isinstance(message, ToolMessage):
                await view.task_finished(message, delta.get("files") or {})


def _messages(delta: dict[str, Any]) -> list[Any]:
    messages = delta.get("messages") or []
    return list(messages) if isinstance(messages, list) else []


async def _show_check(verification: dict[str, Any]) -> None:
    step = cl.Step(name=CHECK_STEP, type="run", default_open=False)
    passing, total = verification["passing"], verification["citations"]
    lines = [f"Round {verification['round']}: {passing} of {total} citations pass the check."]
    lines += [f"- failed: {claim}" for claim in verification["failing_claims"]]
    lines += [f"- critic: {claim}" for claim in verification["critic_flags"]]
    step.output = "\n".join(lines)
    await step.send()


async def deliver(values: dict[str, Any]) -> cl.Message:
    """The checked report streamed into the chat, attached as Markdown; the not-verified list apart."""
    report = str(values.get("report") or "")
    if not report:
        message = cl.Message(
            content=str(values["messages"][-1].text) if values.get("messages") else "No report."
        )
        await message.send()
        return message
    report = served_links(report, _public_url())
    cited = cited_urls(report)
    # The user's copies (inline, .md, .pdf) are the sanitised text; cited pages keep their links.
    report = sanitise_report(report, cited)
    message = cl.Message(content="", metadata={TRUSTED_LINKS_KEY: cited})
    for chunk in re.findall(r"\S+\s*|\s+", report):
        await message.stream_token(chunk)
    title = next((ln.lstrip("# ") for ln in report.splitlines() if ln.startswith("# ")), "")
    attachments: list[Any] = [
        cl.File(
            name="final_report.md", content=report.encode(), mime="text/markdown", display="inline"
        ),
        cl.File(
            name="final_report.pdf",
            content=report_pdf(report, title=title or "Research report"),
            mime="application/pdf",
            display="inline",
        ),
    ]
    message.elements = attachments
    await message.send()
    if not_verified := values.get("not_verified"):
        listing = "\n".join(f"- {item}" for item in not_verified)
        await cl.Message(
            content=f"**Not verified** — removed from the report because no fetched source supports them:\n\n{listing}",
            author="Cairn",
        ).send()
    if metrics := values.get("metrics"):
        step = cl.Step(name="Run metrics", type="run", default_open=False)
        step.output = "\n".join(f"- {k}: {v}" for k, v in metrics.items())
        await step.send()
    return message


async def show_plan_review(interrupt: Any, *, thread_id: str) -> None:
    """The proposed topics with Approve / Edit / Reject (shown again after a restart too)."""
    value = interrupt.value if isinstance(interrupt.value, dict) else {}
    todos = [str(t) for t in value.get("todos", [])]
    task_list = cl.TaskList(status="Waiting for your approval")
    for todo in todos:
        await task_list.add_task(cl.Task(title=todo))
    await task_list.send()
    listing = "\n".join(f"{i}. {t}" for i, t in enumerate(todos, 1))
    labels = {"approve": "Approve", "edit": "Edit topics", "reject": "Reject"}
    actions = [
        cl.Action(
            name=PLAN_ACTION,
            label=label,
            payload={"thread_id": thread_id, "interrupt_id": interrupt.id, "decision": decision},
        )
        for decision, label in labels.items()
    ]
    message = cl.Message(
        content=f"I plan to research these topics:\n\n{listing}\n\nApprove, edit or reject the plan.",
        author="Cairn",
        actions=actions,
    )
    await message.send()
    from ui.interrupts import remember_prompt

    await remember_prompt(interrupt.id, message)


class EditedTopics(BaseModel):
    todos: list[str] = Field(min_length=1, max_length=MAX_TODOS)


def parse_topics(text: str) -> list[str]:
    """One topic per line (list markers allowed); empty lines dropped."""
    topics = [re.sub(r"^\s*(?:[-*+]|\d+[.)])\s*", "", line).strip() for line in text.splitlines()]
    return [t for t in topics if t]


async def review_plan_action(action: cl.Action) -> None:
    """Approve / Edit / Reject: checked like every button, then the paused run is resumed."""
    from ui.chat import _check_action, _pending_interrupts, _run, refuse
    from ui.interrupts import clear_prompt
    from ui.planner import busy
    from ui.runtime import get_runtime

    if (checked := await _check_action(action, PlanReviewPayload)) is None:
        return
    payload, thread_id = checked.payload, checked.context.thread_id
    graph = get_runtime().graphs.get(checked.agent.key)
    pending = await _pending_interrupts(graph, thread_id) if graph is not None else []
    if payload.interrupt_id not in {i.id for i in pending}:
        await refuse("That plan has already been answered.")
        return
    answer: dict[str, Any] = {"decision": payload.decision}
    if payload.decision == "edit":
        reply = await cl.AskUserMessage(
            content="Send the topics to research, one per line.", timeout=EDIT_TIMEOUT_S
        ).send()
        topics = parse_topics(str((reply or {}).get("output", "")))
        try:
            answer["todos"] = EditedTopics(todos=topics).todos
            PlanDecision.model_validate(answer)
        except ValidationError:
            await refuse(
                f"Topics need 1 to {MAX_TODOS} lines of 3 to 200 characters. The plan is unchanged; "
                "press Edit topics again."
            )
            return
    await clear_prompt(payload.interrupt_id)
    # As for the Planner: an Edit's question ends Chainlit's task early, so the run marks
    # itself busy and idle again (otherwise the input stays disabled afterwards).
    async with busy():
        await _run(checked.agent, Command(resume={payload.interrupt_id: answer}), checked.context)


CORPUS_LINK = re.compile(r"\]\(corpus://([a-z0-9_-]+)/([A-Za-z0-9._-]+)\)")
CORPUS_ROUTE = "/research/corpus"
CurrentUser = Annotated[Any, Depends(get_current_user)]


def served_links(report: str, base_url: str) -> str:
    """The user's copy of a checked report: corpus:// sources as links to where the app serves them."""
    return CORPUS_LINK.sub(lambda m: f"]({base_url}{CORPUS_ROUTE}/{m[1]}/{m[2]})", report)


def cited_urls(report: str) -> list[str]:
    """URLs cited on the checked report's claim lines: each one was fetched by this thread."""
    return list(
        dict.fromkeys(m["url"] for _, line in claim_lines(report) for m in CITATION.finditer(line))
    )


def _public_url() -> str:
    from ui.runtime import get_runtime

    return get_runtime().public_url


def corpus_router(settings: Settings) -> APIRouter:
    """Signed-in users can open the local corpus documents that research reports cite."""
    corpus = LocalCorpus(settings.research_corpus_dir)
    router = APIRouter()

    @router.get(f"{CORPUS_ROUTE}/{{name}}/{{filename}}", response_class=PlainTextResponse)
    async def corpus_document(name: str, filename: str, user: CurrentUser) -> PlainTextResponse:
        try:
            _title, text = await corpus.open(f"corpus://{name}/{filename}")
        except LookupError:
            raise HTTPException(status_code=404, detail="No such document") from None
        return PlainTextResponse(text)

    return router
