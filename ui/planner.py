"""The Planner in the chat: its plan as a task list with Approve/Edit/Reject, live progress,
each step's result in a collapsible step, and answers with tables and charts."""

from __future__ import annotations

import logging
import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, cast

import chainlit as cl
from langchain_core.messages import AIMessageChunk
from langchain_core.utils.json import parse_partial_json
from langgraph.errors import GraphRecursionError
from pydantic import BaseModel, ConfigDict

from graphs.planner.sql import Table, markdown_tables
from graphs.planner.state import step_failed, step_parts
from ui.interrupts import remember_prompt
from ui.streaming import TurnResult

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from langchain_core.runnables import RunnableConfig
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.types import Command

    from graphs.core.context import Context

log = logging.getLogger("cairn.planner")

PLAN_REVIEW_ACTION = "plan_review"
EDIT_TIMEOUT_S = 900
STREAM_MODES: list[Any] = ["updates", "messages"]
ANSWER_NODES = frozenset({"finalize"})
"""Nodes whose tokens are the answer itself."""
REPLAN_NODE = "replan"
"""Its tokens are Act JSON; the answer streams out of its `response` field as it arrives."""
RECURSION_BACKSTOP = (
    "The plan went round in circles and hit its safety limit, so I stopped it. Nothing was "
    "changed anywhere; send the goal again, perhaps narrower, to start a fresh plan."
)
_BULLET = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+")


class PlanReviewPayload(BaseModel):
    """A press of Approve, Edit or Reject under a pending plan of the session's thread."""

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    interrupt_id: str
    decision: Literal["approve", "edit", "reject"]


def goal_inputs(text: str) -> dict[str, Any]:
    """A chat message to the Planner is a new goal."""
    return {"input": text}


def recursion_limit() -> int:
    """Generous for the step budget and review rounds: a backstop, not the budget."""
    from graphs.core.settings import get_settings

    settings = get_settings()
    return 4 * settings.planner_step_budget + 3 * settings.planner_review_rounds + 12


async def show_plan_review(interrupt: Any, *, thread_id: str) -> None:
    """The pending plan as a task list plus buttons (again after a reload or a restart)."""
    value: dict[str, Any] = interrupt.value if isinstance(interrupt.value, dict) else {}
    plan = [str(s) for s in value.get("plan", [])]
    completed = [str(s) for s in value.get("completed", [])]
    progress = PlanProgress(completed=completed, remaining=plan)
    await progress.show(status="Waiting for your review")
    message = cl.Message(
        content=review_text(value), author="Planner", actions=_buttons(thread_id, interrupt.id)
    )
    await message.send()
    await remember_prompt(interrupt.id, message)


def review_text(value: dict[str, Any]) -> str:
    plan = [str(s) for s in value.get("plan", [])]
    lines = []
    if value.get("error"):
        lines.append(f"⚠️ {value['error']}\n")
    if value.get("replanned"):
        lines.append(
            "While working, the planner added steps that were not in the plan you approved. "
            "Please review them before anything else runs.\n"
        )
    lines.append(f"**Proposed plan** for: {value.get('goal', '')}\n")
    lines += [f"{i}. {step}" for i, step in enumerate(plan, 1)]
    lines.append(
        f"\nStep budget: {value.get('step_budget', '?')} steps · about "
        f"{value.get('estimated_model_calls', '?')} model calls · "
        f"{value.get('edits_left', 0)} edits left. Nothing runs until you approve."
    )
    return "\n".join(lines)


def _buttons(thread_id: str, interrupt_id: str) -> list[cl.Action]:
    labels = {"approve": "Approve", "edit": "Edit", "reject": "Reject"}
    return [
        cl.Action(
            name=PLAN_REVIEW_ACTION,
            label=label,
            payload={"thread_id": thread_id, "interrupt_id": interrupt_id, "decision": decision},
        )
        for decision, label in labels.items()
    ]


async def review_answer(payload: PlanReviewPayload) -> dict[str, Any] | None:
    """The resume value for a checked button press; Edit first asks for the new steps."""
    if payload.decision != "edit":
        return {"decision": payload.decision}
    asked = await cl.AskUserMessage(
        content="Send the plan as you want it, one step per line (you can copy the steps "
        "above and change them), or describe what to change.",
        author="Planner",
        timeout=EDIT_TIMEOUT_S,
    ).send()
    text = str((asked or {}).get("output", "")).strip()
    if not text:
        await cl.Message(
            content="No edit arrived, so the plan is still waiting for your review.",
            author="Planner",
        ).send()
        return None
    return edit_value(text)


@asynccontextmanager
async def busy() -> AsyncIterator[None]:
    """Show the run as busy, and idle again afterwards. Action callbacks run without Chainlit's
    task signals, and an AskUserMessage (Edit) ends the task early: without this the input and
    the next plan's buttons stay disabled."""
    await cl.context.emitter.task_start()
    try:
        yield
    finally:
        await cl.context.emitter.task_end()


def edit_value(text: str) -> dict[str, Any]:
    """Several lines or a numbered/bulleted list are the new steps; one sentence is feedback."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1 or any(_BULLET.match(line) for line in lines):
        return {"decision": "edit", "steps": [_BULLET.sub("", line).strip() for line in lines]}
    return {"decision": "edit", "feedback": text}


class PlanProgress:
    """The plan's task list: done steps, the running one, the remaining ones."""

    def __init__(self, *, completed: list[str], remaining: list[str]) -> None:
        self.done: list[tuple[str, bool]] = [(step, True) for step in completed]
        self.remaining = list(remaining)
        self.running = False
        self.task_list = cl.TaskList(name="plan")

    async def show(self, *, status: str) -> None:
        tasks = [
            cl.Task(title=step, status=cl.TaskStatus.DONE if ok else cl.TaskStatus.FAILED)
            for step, ok in self.done
        ]
        for i, step in enumerate(self.remaining):
            running = self.running and i == 0
            tasks.append(
                cl.Task(
                    title=step, status=cl.TaskStatus.RUNNING if running else cl.TaskStatus.READY
                )
            )
        self.task_list.tasks = tasks
        self.task_list.status = status
        await self.task_list.send()

    async def step_done(self, step: str, ok: bool) -> None:
        self.done.append((step, ok))
        if self.remaining and self.remaining[0] == step:
            self.remaining.pop(0)
        await self.show(status="Running")


async def run_planner(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    inputs: dict[str, Any] | Command[Any] | None,
    *,
    context: Context,
) -> TurnResult:
    """Stream a Planner run: updates drive the task list and steps; the answer streams."""
    config: RunnableConfig = {
        "configurable": {"thread_id": context.thread_id},
        "recursion_limit": recursion_limit(),
    }
    before = await graph.aget_state(config)
    values = before.values if inputs is None or not isinstance(inputs, dict) else {}
    progress = PlanProgress(
        completed=[step_parts(r)[1] for r in values.get("past_steps", [])],
        remaining=list(values.get("plan", [])),
    )
    streamed: cl.Message | None = None
    answer = AnswerStream()
    response = ""
    interrupts: list[Any] = []
    try:
        stream = graph.astream(inputs, config, context=context, stream_mode=STREAM_MODES)
        async for mode, chunk in cast("AsyncIterator[tuple[str, Any]]", stream):
            if mode == "messages":
                streamed = await _stream_token(chunk, streamed, answer)
                continue
            for node, update in chunk.items():
                if node == "__interrupt__":
                    interrupts.extend(update)
                elif isinstance(update, dict):
                    response = await _apply_update(node, update, progress) or response
    except GraphRecursionError:
        log.warning("planner run hit the recursion backstop (thread %s)", context.thread_id)
        await cl.Message(content=RECURSION_BACKSTOP, author="Planner").send()
        return TurnResult(reply=None)
    reply = await _send_answer(graph, config, response, streamed) if response else None
    if interrupts:
        interrupts = list((await graph.aget_state(config)).interrupts)
    return TurnResult(reply=reply, interrupts=interrupts)


class AnswerStream:
    """The `response` text inside the replanner's structured (JSON) output, as it streams."""

    def __init__(self) -> None:
        self.message_id: str | None = None
        self.buffer = ""
        self.sent = 0

    def feed(self, message_id: str | None, text: str) -> str:
        """Add one JSON token; returns the answer text that became readable with it."""
        if message_id != self.message_id:  # a new model call (e.g. the Plan branch's retry)
            self.message_id, self.buffer, self.sent = message_id, "", 0
        self.buffer += text
        try:
            parsed = parse_partial_json(self.buffer)
        except ValueError:
            return ""
        action = parsed.get("action") if isinstance(parsed, dict) else None
        answer = action.get("response") if isinstance(action, dict) else None
        if not isinstance(answer, str) or len(answer) <= self.sent:
            return ""
        new, self.sent = answer[self.sent :], len(answer)
        return new


async def _stream_token(
    chunk: Any, streamed: cl.Message | None, answer: AnswerStream
) -> cl.Message | None:
    token, meta = chunk
    if not isinstance(token, AIMessageChunk) or not isinstance(token.content, str):
        return streamed
    node = meta.get("langgraph_node")
    if node == REPLAN_NODE:
        text = answer.feed(token.id, token.content)
    elif node in ANSWER_NODES:
        text = token.content
    else:
        return streamed
    if not text:
        return streamed
    if streamed is None:
        streamed = cl.Message(content="", author="Planner")
    await streamed.stream_token(text)
    return streamed


async def _apply_update(node: str, update: dict[str, Any], progress: PlanProgress) -> str:
    """One node's state delta in the chat; returns the answer when the update carries it."""
    if node == "start_goal":
        progress.done, progress.remaining, progress.running = [], [], False
    elif node == "plan" and update.get("plan"):
        progress.remaining = list(update["plan"])
    elif node == "review_plan" and "approved_plan" in update:
        progress.running = True
        await progress.show(status="Running")
    elif node == "execute_step":
        for record in update.get("past_steps", []):
            await show_step(record, progress)
    elif node == "replan" and "plan" in update and not update.get("response"):
        progress.remaining = list(update["plan"])
        progress.running = not update.get("needs_review")
        await progress.show(status="Running")
    if update.get("response"):
        progress.running = False
        status = {"answered": "Done", "partial": "Stopped at the budget"}.get(
            str(update.get("outcome")), "Stopped"
        )
        if progress.done or progress.remaining:
            await progress.show(status=status)
        return str(update["response"])
    return ""


async def show_step(record: Any, progress: PlanProgress) -> None:
    """One executed step as a collapsible step; a failed one says so in its title too."""
    index, step, result = step_parts(record)
    ok = not step_failed(result)
    name = f"Step {index}: {step}" if ok else f"Step {index} failed: {step}"
    async with cl.Step(name=name, type="tool") as shown:
        shown.output = result
        shown.is_error = not ok
    await progress.step_done(step, ok)


async def _send_answer(
    graph: Any, config: RunnableConfig, response: str, streamed: cl.Message | None
) -> cl.Message:
    """The answer, with the data table it rests on and a chart when the data has that shape."""
    state = await graph.aget_state(config)
    tables = [
        t for r in state.values.get("past_steps", []) for t in markdown_tables(step_parts(r)[2])
    ]
    content = response
    if tables and not markdown_tables(response):
        content += "\n\n**Data**\n\n" + table_markdown(tables[-1])
    shown = markdown_tables(content)
    table = shown[-1] if shown else None
    message = streamed or cl.Message(content="", author="Planner")
    message.content = content
    if table is not None and (chart := chart_element(table)) is not None:
        message.elements = [chart]  # type: ignore[list-item]
    if streamed is None:
        await message.send()
    else:
        await message.update()
        if message.elements:
            await message.elements[0].send(for_id=message.id)
    return message


def table_markdown(table: Table) -> str:
    lines = ["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in table.rows])


def chart_element(table: Table) -> cl.Plotly | None:
    figure = bar_chart(table)
    if figure is None:
        return None
    return cl.Plotly(name=figure.layout.title.text, figure=figure, display="inline")


def plain(text: str) -> str:
    """Chart text without angle brackets, so no tag Plotly understands can be formed."""
    return text.replace("<", "‹").replace(">", "›")


def bar_chart(table: Table) -> Any:
    """A bar chart of one number per category (e.g. churned customers by region), or None."""
    shape = table.numeric_by_category()
    if shape is None:
        return None
    from plotly import graph_objects as go

    # Plotly renders <a href> (and other tags) inside its texts: query data is shown as text only.
    label_column, value_column = plain(shape[0]), plain(shape[1])
    labels, values = [plain(str(label)) for label in shape[2]], shape[3]
    figure = go.Figure(go.Bar(x=labels, y=values, marker_color="#3b6e8f"))
    figure.update_layout(
        title=f"{value_column} by {label_column}",
        xaxis_title=label_column,
        yaxis_title=value_column,
        margin={"l": 40, "r": 20, "t": 50, "b": 40},
    )
    return figure
