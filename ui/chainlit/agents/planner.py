"""The Planner in the chat: its plan as a task list with Approve/Edit/Reject, live progress,
each step's result in a collapsible step, and answers with tables and charts."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import chainlit as cl
from langchain_core.messages import AIMessageChunk
from langchain_core.utils.json import parse_partial_json

from graphs.core.settings import get_settings
from graphs.core.usage import money
from graphs.planner.sql import Table, markdown_tables
from graphs.planner.state import step_failed, step_parts
from ui.chainlit.agents import Presentation
from ui.chainlit.surface import ask_question, new_reply

if TYPE_CHECKING:
    from langgraph.types import StateSnapshot

    from ui.runner import LoadState, Status

log = logging.getLogger("cairn.planner")

ANSWER_NODES = frozenset({"finalize"})
"""Nodes whose tokens are the answer itself."""
REPLAN_NODE = "replan"
"""Its tokens are Act JSON; the answer streams out of its `response` field as it arrives."""


async def show_plan_review(interrupt: Any, thread_id: str) -> None:
    """The pending plan as a task list plus buttons (again after a reload or a restart)."""
    value: dict[str, Any] = interrupt.value if isinstance(interrupt.value, dict) else {}
    plan = [str(s) for s in value.get("plan", [])]
    completed = [str(s) for s in value.get("completed", [])]
    progress = PlanProgress(completed=completed, remaining=plan)
    await progress.show(status="Waiting for your review")
    await ask_question(
        interrupt.id,
        thread_id,
        review_text(value),
        {"approve": "Approve", "edit": "Edit", "reject": "Reject"},
        author="Planner",
    )


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
    tokens = value.get("estimated_tokens")
    cost = f", est. {money(float(value.get('estimated_cost') or 0))}" if tokens else ""
    spend = f" (≈ {int(tokens):,} tokens{cost})" if isinstance(tokens, int) and tokens > 0 else ""
    lines.append(
        f"\nStep budget: {value.get('step_budget', '?')} steps · about "
        f"{value.get('estimated_model_calls', '?')} model calls{spend} · "
        f"{value.get('edits_left', 0)} edits left. Nothing runs until you approve."
    )
    return "\n".join(lines)


class PlanProgress:
    """The plan's task list: done steps, the running one, the remaining ones."""

    def __init__(self, *, completed: list[str], remaining: list[str]) -> None:
        self.done: list[tuple[str, bool]] = [(step, True) for step in completed]
        self.remaining = list(remaining)
        self.running = False
        self.steps_taken = 0
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


class PlannerView:
    """The runner's view of a Planner run: updates drive the task list and steps; the answer
    streams out of the replanner's structured output or the partial answer."""

    def __init__(self) -> None:
        self.progress = PlanProgress(completed=[], remaining=[])
        self.answer = AnswerStream()
        self.streamed: cl.Message | None = None
        self.response = ""

    async def begin(self, load_state: LoadState) -> None:
        # A resumed run continues the plan it paused on; a new goal resets it at start_goal.
        values = (await load_state()).values
        self.progress = PlanProgress(
            completed=[step_parts(r)[1] for r in values.get("past_steps", [])],
            remaining=list(values.get("plan", [])),
        )
        self.progress.steps_taken = int(values.get("steps_taken") or 0)

    async def token(self, namespace: tuple[str, ...], token: Any, meta: dict[str, Any]) -> None:
        if not namespace:
            self.streamed = await _stream_token((token, meta), self.streamed, self.answer)

    async def task(self, namespace: tuple[str, ...], event: dict[str, Any]) -> None:
        return None

    async def update(self, namespace: tuple[str, ...], node: str, delta: Any) -> None:
        if not namespace and isinstance(delta, dict):
            self.response = await _apply_update(node, delta, self.progress) or self.response

    async def end(self, status: Status, load_state: LoadState) -> str | None:
        if status != "done" or not self.response:
            if status in ("failed", "stopped", "refused") and self.progress.running:
                self.progress.running = False
                await self.progress.show(status="Stopped by an error")
            return None
        reply = await _send_answer(load_state, self.response, self.streamed)
        return reply.content


def steps_used(steps_taken: int, budget: int) -> str:
    """The one way a step count is put, in each step and in the task list's final line."""
    return f"{steps_taken} of {budget} steps used"


def stop_status(outcome: str, steps_taken: int, budget: int) -> str:
    """The task list's final line: how the run ended and why."""
    used = steps_used(steps_taken, budget)
    if outcome == "answered":
        return f"Done · {used}"
    if outcome == "partial":
        if steps_taken >= budget:
            return f"Stopped at the step budget · {used}"
        return f"Stopped: no steps left to try · {used}"
    if outcome == "rejected":
        return "Rejected: nothing ran"
    return "Stopped: no valid plan"


async def restore(state: StateSnapshot) -> None:
    """A reopened Planner conversation shows its plan's task list with its final status."""
    values = state.values
    if state.interrupts or not (values.get("past_steps") or values.get("approved_plan")):
        return  # a pending review shows its own list with its buttons
    progress = PlanProgress(
        completed=[], remaining=[] if values.get("outcome") else list(values.get("plan", []))
    )
    progress.done = [
        (step_parts(r)[1], not step_failed(step_parts(r)[2])) for r in values["past_steps"] or []
    ]
    outcome = values.get("outcome")
    status = (
        stop_status(str(outcome), int(values.get("steps_taken") or 0), _budget())
        if outcome
        else "Stopped before the answer"
    )
    await progress.show(status=status)


def _budget() -> int:
    return get_settings().planner_step_budget


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
        streamed = new_reply(author="Planner")
    await streamed.stream_token(text)
    return streamed


async def _apply_update(node: str, update: dict[str, Any], progress: PlanProgress) -> str:
    """One node's state delta in the chat; returns the answer when the update carries it."""
    if "steps_taken" in update:
        # First: the step an execute_step update shows counts itself.
        progress.steps_taken = int(update["steps_taken"] or 0)
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
        status = stop_status(str(update.get("outcome")), progress.steps_taken, _budget())
        if progress.done or progress.remaining:
            await progress.show(status=status)
        return str(update["response"])
    return ""


async def show_step(record: Any, progress: PlanProgress) -> None:
    """One executed step as a collapsible step; a failed one says so in its title too."""
    index, step, result = step_parts(record)
    ok = not step_failed(result)
    name = f"Step {index}: {step}" if ok else f"Step {index} failed: {step}"
    rows = sum(len(t.rows) for t in markdown_tables(result))
    budget = steps_used(progress.steps_taken or index, _budget())
    summary = f"{rows} row(s) returned · {budget}" if rows else budget
    async with cl.Step(name=name, type="tool") as shown:
        shown.output = f"{summary}\n\n{result}"
        shown.is_error = not ok
    await progress.step_done(step, ok)


async def _send_answer(
    load_state: LoadState, response: str, streamed: cl.Message | None
) -> cl.Message:
    """The answer, with the data table it rests on and a chart when the data has that shape."""
    state = await load_state()
    tables = [
        t for r in state.values.get("past_steps", []) for t in markdown_tables(step_parts(r)[2])
    ]
    content = response
    if tables and not markdown_tables(response):
        content += "\n\n**Data**\n\n" + table_markdown(tables[-1])
    shown = markdown_tables(content)
    table = shown[-1] if shown else None
    message = streamed or new_reply(author="Planner")
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


PRESENTATION = Presentation(
    key="planner",
    view=lambda _context: PlannerView(),
    questions={"planner_review": show_plan_review},
    restore=restore,
)
