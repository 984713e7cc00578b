"""Paused runs in the chat: an interrupt becomes buttons; a press resumes it with Command(resume=...)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import chainlit as cl
from pydantic import BaseModel, ConfigDict

from ui.planner import show_plan_review

log = logging.getLogger("cairn")

RESUME_ACTION = "resume"
_shown_later: set[asyncio.Task[None]] = set()


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
        await show_plan_review(interrupt, thread_id=thread_id)
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
    # A new dict: the one in the session may be shared with the thread's metadata on resume,
    # and a Message in there breaks Chainlit's resume_thread event (not JSON).
    prompts = {**(cl.user_session.get("interrupt_prompts") or {}), interrupt.id: message}
    cl.user_session.set("interrupt_prompts", prompts)


async def clear_prompt(interrupt_id: str) -> None:
    prompts: dict[str, cl.Message] = dict(cl.user_session.get("interrupt_prompts") or {})
    message = prompts.pop(interrupt_id, None)
    cl.user_session.set("interrupt_prompts", prompts)
    if isinstance(message, cl.Message):
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
