"""The Research profile in the chat: plan review buttons, a live task list, subagent steps, the checked report."""

from __future__ import annotations

import asyncio
import os
import re
from typing import TYPE_CHECKING, Any, cast

import chainlit as cl
from langchain_core.messages import AIMessage, ToolMessage

from graphs.core.settings import get_settings
from graphs.research.agents import refusal_reason, task_refusal
from graphs.research.files import NOTES_DIR
from graphs.research.graph import slug
from graphs.research.relevance import check_summary
from ui.agents.research import cited_urls, served_links
from ui.chainlit.agents import Presentation
from ui.chainlit.surface import ask_question, new_reply
from ui.output_guard import TRUSTED_LINKS_KEY, sanitise_report
from ui.report_pdf import report_pdf

if TYPE_CHECKING:
    from langgraph.types import StateSnapshot

    from ui.runner import LoadState, Status

CHECK_STEP = "Checking citations"


def _status(status: str) -> cl.TaskStatus:
    return {
        "completed": cl.TaskStatus.DONE,
        "in_progress": cl.TaskStatus.RUNNING,
    }.get(status, cl.TaskStatus.READY)


HIDDEN_TASK = "Refused: a research task"


def _topic(description: str) -> str:
    return description.removeprefix("Research: ").split(". Write notes to")[0][:80]


_NOTES_FILE = re.compile(r"notes/([a-z0-9][a-z0-9_-]*)\.md")
_SOURCE_LINE = re.compile(r"^- source_url: (\S+)$", re.M)


def _notes_slug(description: str) -> str | None:
    """The topic slug of the notes file a task names (notes/<slug>.md), if it names one."""
    match = _NOTES_FILE.search(description)
    return match[1] if match else None


def _file_content(data: Any) -> str:
    """A virtual file's text; deepagents stores it as one string or as a list of lines."""
    content = data.get("content", "") if isinstance(data, dict) else ""
    return "\n".join(content) if isinstance(content, list) else str(content)


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
        # Only this task's own notes file: parallel tasks' files arrive in the same update.
        key = _notes_slug(description)
        notes = _file_content(files.get(f"{NOTES_DIR}{key}.md")) if key else ""
        sources = set(_SOURCE_LINE.findall(notes))
        findings = notes.count("## Finding")
        step.output = (
            f"Fetched {len(sources)} source(s), wrote {findings} finding(s).\n\n{message.text}"
        )
        await step.update()
        if (task := self._task_for(description)) is not None:
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
        key = _notes_slug(description)
        return self.by_slug.get(key) if key else None

    async def _show(self) -> None:
        if self.sent:
            await self.tasks.update()
        else:
            await self.tasks.send()
            self.sent = True

    async def finish(self, status: Status) -> None:
        self.tasks.status = live_status(status)
        for step in self.steps.values():
            step.is_error = True
            step.output = f"Not finished. {self.tasks.status}"
            await step.update()
        if self.sent:
            await self.tasks.update()


LIVE_STATUS = {
    "done": "Done",
    "paused": "Done",
    "stopped": "Stopped at the step limit, before the report",
    "refused": "Stopped: your data was deleted while it ran",
    "unavailable": "Failed: the database could not be reached",
}


def live_status(status: Status) -> str:
    """The task list's final status for a run seen live, saying why it stopped if it did."""
    task = asyncio.current_task()
    if status == "failed" and task is not None and task.cancelling():
        # Chainlit's Stop cancels the handler's task: the runner sees no error, only "failed".
        return "Stopped: you stopped the run"
    return LIVE_STATUS.get(status, "Failed: an error stopped the run")


class ResearchRun:
    """The runner's view of one research run: updates (subgraphs included) drive the view."""

    def __init__(self) -> None:
        self.view = ResearchView()

    async def begin(self, load_state: LoadState) -> None:
        return None

    async def token(self, namespace: tuple[str, ...], token: Any, meta: dict[str, Any]) -> None:
        return None

    async def task(self, namespace: tuple[str, ...], event: dict[str, Any]) -> None:
        return None

    async def update(self, namespace: tuple[str, ...], node: str, delta: Any) -> None:
        await _show_update(self.view, namespace, node, delta)

    async def end(self, status: Status, load_state: LoadState) -> str | None:
        await self.view.finish(status)
        if status != "done":
            return None
        state = await load_state()
        if state.next or state.values.get("report") is None:
            return None
        return (await deliver(state.values)).content


async def _show_update(
    view: ResearchView, namespace: tuple[str, ...], node: str, delta: Any
) -> None:
    parts = _parts(delta)
    if not namespace:
        for part in parts:
            if "todos" in part and node in ("research", "reopen_claims"):
                await view.set_todos(part["todos"])
            if node == "check_citations" and part.get("verifications"):
                await _show_check(part["verifications"][-1])
        return
    if namespace[0].startswith("research:") and len(namespace) == 1:
        files = {
            path: data
            for part in parts
            if isinstance(part.get("files"), dict)
            for path, data in part["files"].items()
        }
        for message in (m for part in parts for m in _messages(part)):
            if isinstance(message, AIMessage):
                for call in message.tool_calls:
                    if call["name"] == "task":
                        await view.task_started(cast("dict[str, Any]", call))
            elif isinstance(message, ToolMessage):
                await view.task_finished(message, files)


def _parts(delta: Any) -> list[dict[str, Any]]:
    """A node's update as dicts: LangGraph streams a list, one dict per write, when one task
    writes a channel more than once (several Commands from one tools task)."""
    parts = delta if isinstance(delta, list) else [delta]
    return [part for part in parts if isinstance(part, dict)]


def _messages(delta: dict[str, Any]) -> list[Any]:
    messages = delta.get("messages") or []
    return list(messages) if isinstance(messages, list) else []


async def _show_check(verification: dict[str, Any]) -> None:
    step = cl.Step(name=CHECK_STEP, type="run", default_open=False)
    step.output = "\n".join(check_summary(verification))
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
    if (metrics := values.get("metrics")) and get_settings().show_run_metrics:
        step = cl.Step(name="Run metrics", type="run", default_open=False)
        step.output = "\n".join(f"- {k}: {v}" for k, v in metrics.items())
        await step.send()
    message = new_reply()
    message.metadata = {TRUSTED_LINKS_KEY: cited}
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
    if off_topic := values.get("off_topic"):
        listing = "\n".join(f"- {item}" for item in off_topic)
        await cl.Message(
            content=f"**Not about your question** — found, but their passages do not answer it:\n\n{listing}",
            author="Cairn",
        ).send()
    return message


async def show_plan_review(interrupt: Any, thread_id: str) -> None:
    """The proposed topics with Approve / Edit / Reject (shown again after a restart too)."""
    value = interrupt.value if isinstance(interrupt.value, dict) else {}
    todos = [str(t) for t in value.get("todos", [])]
    task_list = cl.TaskList(status="Waiting for your approval")
    for todo in todos:
        await task_list.add_task(cl.Task(title=todo))
    await task_list.send()
    listing = "\n".join(f"{i}. {t}" for i, t in enumerate(todos, 1))
    await ask_question(
        interrupt.id,
        thread_id,
        f"I plan to research these topics:\n\n{listing}\n\nApprove, edit or reject the plan.",
        {"approve": "Approve", "edit": "Edit topics", "reject": "Reject"},
    )


async def restore(state: StateSnapshot) -> None:
    """A reopened research conversation shows its topics and how the run ended."""
    todos = state.values.get("todos") or []
    if not todos or state.interrupts:
        return  # a pending plan shows its own list with its buttons
    tasks = cl.TaskList(status=restored_status(state))
    for todo in todos:
        if isinstance(todo, dict):
            await tasks.add_task(
                cl.Task(title=str(todo.get("content", "")), status=_status(str(todo.get("status"))))
            )
    await tasks.send()


PHASES = {
    "write_plan": "planning",
    "research": "research",
    "check_citations": "the citation check",
    "reopen_claims": "the citation check",
    "finalize": "the final check",
}


def restored_status(state: StateSnapshot) -> str:
    """How a reopened run ended, from what its checkpoint holds: the report, the node it was in
    and the error LangGraph stored for that node (its repr, e.g. "CancelledError()")."""
    values = state.values
    if values.get("report"):
        return "Done"
    if not state.next:
        if values.get("metrics"):  # finalize ran: nothing passed the check
            return "Done: no claim could be verified, so there is no report"
        return "Cancelled: you rejected the plan"
    phase = PHASES.get(state.next[0], "the run")
    errors = {_error_name(task.error) for task in state.tasks if task.error is not None}
    if "CancelledError" in errors:
        return f"Stopped: cancelled during {phase}"
    if "GraphRecursionError" in errors:
        return f"Stopped at the step limit during {phase}"
    if errors:
        return f"Failed during {phase}"
    return f"Stopped during {phase}, before the report"


def _error_name(error: Any) -> str:
    """The exception's class name; a stored error is its repr, a live one the exception."""
    if isinstance(error, BaseException):
        return type(error).__name__
    return str(error).split("(", 1)[0]


def _public_url() -> str:
    """The app's public address, which start-up gives Chainlit as CHAINLIT_URL."""
    return os.environ.get("CHAINLIT_URL", "").rstrip("/")


PRESENTATION = Presentation(
    key="research",
    view=lambda _context: ResearchRun(),
    questions={"review_plan": show_plan_review},
    restore=restore,
)
