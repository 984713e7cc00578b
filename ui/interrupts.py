"""Paused runs in the chat: an interrupt becomes buttons; a press resumes it with Command(resume=...)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import chainlit as cl
from pydantic import BaseModel, ConfigDict

log = logging.getLogger("cairn")

RESUME_ACTION = "resume"
_shown_later: set[asyncio.Task[None]] = set()
MAX_TRACKED_PROMPTS = 1000
_prompts: dict[str, cl.Message] = {}
"""The live question message of each pending interrupt (ids are unique across threads), in
this worker; kept outside the user session, which Chainlit replaces on every resume."""


class ResumePayload(BaseModel):
    """A button press answering one pending interrupt of the session's thread."""

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    interrupt_id: str
    decision: Literal["confirm", "reject"]


def _buttons(thread_id: str, interrupt_id: str, labels: dict[str, str]) -> list[cl.Action]:
    return [
        cl.Action(
            name=RESUME_ACTION,
            label=label,
            payload={"thread_id": thread_id, "interrupt_id": interrupt_id, "decision": decision},
        )
        for decision, label in labels.items()
    ]


async def show_interrupt(interrupt: Any, *, thread_id: str) -> None:
    """Render a pending interrupt as a question with buttons (again after a restart too)."""
    value = interrupt.value if isinstance(interrupt.value, dict) else {}
    if value.get("kind") == "review_plan":
        from ui.research import show_plan_review

        await show_plan_review(interrupt, thread_id=thread_id)
        return
    if value.get("kind") == "planner_review":
        from ui.planner import show_plan_review as show_planner_review

        await show_planner_review(interrupt, thread_id=thread_id)
        return
    if value.get("kind") == "confirm_memory":
        text = (
            "You asked me to remember something sensitive. Should I store it?\n\n"
            f"> {value.get('content', '')}\n\n"
            f"Category: {value.get('category', 'unknown')}. You can delete it any time."
        )
        labels = {"confirm": "Remember it", "reject": "Don't store it"}
    else:
        text = "The assistant is waiting for your answer."
        labels = {"confirm": "Continue", "reject": "Cancel"}
    message = cl.Message(
        content=text, author="Cairn", actions=_buttons(thread_id, interrupt.id, labels)
    )
    await message.send()
    await remember_prompt(interrupt.id, message)


async def remember_prompt(interrupt_id: str, message: cl.Message) -> None:
    """Keep the message whose buttons answer interrupt_id, so they can be cleared once used.

    A question shown again (the browser may resume a thread twice, and Chainlit replaces the
    user session on each resume) replaces its earlier copy instead of leaving two sets of
    live buttons.
    """
    previous = _prompts.pop(interrupt_id, None)
    if previous is not None and previous.id != message.id:
        await previous.remove()
    _prompts[interrupt_id] = message
    while len(_prompts) > MAX_TRACKED_PROMPTS:
        _prompts.pop(next(iter(_prompts)))


async def clear_prompt(interrupt_id: str) -> None:
    """Take the buttons off an answered question. Callers have checked that the session's
    user owns the thread and that interrupt_id is pending on it."""
    if (message := _prompts.pop(interrupt_id, None)) is not None:
        await message.remove_actions()


def show_after_resume(interrupts: list[Any], *, thread_id: str) -> None:
    """Re-show pending questions once Chainlit has sent the resumed thread to the browser.

    Chainlit replaces the chat with the stored thread right after on_chat_resume returns, so
    prompts sent from inside the hook would be wiped; this waits for the hook's own task.
    """
    if not interrupts:
        return
    resuming = asyncio.current_task()

    async def show() -> None:
        if resuming is not None:
            await asyncio.wait({resuming})
        for interrupt in interrupts:
            await show_interrupt(interrupt, thread_id=thread_id)

    task = asyncio.create_task(show())
    _shown_later.add(task)
    task.add_done_callback(_done)


def _done(task: asyncio.Task[None]) -> None:
    _shown_later.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("re-showing a pending question failed", exc_info=exc)
